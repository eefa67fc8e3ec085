#!/usr/bin/env node
// `npm run bench`: the performance numbers of issue 5, measured against the
// local emulator. Prints the machine, a table (median of N runs with min/max)
// and writes bench-results/latest.json.
//
//   node benches/run.mjs [--quick] [--runs N] [--sections 1,2,3,4,5,6,7,8,9,10,11,12,13,14]
//                        [--emulator child|inproc|both] [--baseline build|auto|skip]
//                        [--out FILE]
//
// --quick      CI smoke test: small sizes, 3 runs, fewer concurrent commands; same table.
// --emulator   where the emulator runs. `child` (default for every section): a node
//              child process, so the client under test does not share its process and
//              tokio runtime with the server. `both` (default for §1 in a full run) also
//              measures §1 with the emulator inside the bench process.
// --baseline   the Rust discard client of §1 (examples/discard_client.rs). `build`
//              (full run default) runs `cargo build --release --no-default-features
//              --example discard_client` before any timing; `auto` (quick default) uses the
//              binary if it is already built; `skip` leaves the baseline out.
//
// §7 (WAN) runs echo over TLS (h2, and HTTP/1.1 only) against emulators with rttMs 0/20/50/100
// (--quick: 0/50), warm (later commands of this process) and cold (the first command of a
// fresh node process, benches/cold-child.cjs), and with holdHeaders + a 5 s heartbeat; it
// prints wall time, wall/RTT, requests per command and connections opened per command.
//
// §8 (shared pacing) starts a redis-server of its own (skipped when none is installed) and
// runs 1/2/4 host processes (__test__/pacing-child.mjs) at one budget, shared store vs per
// process; then the cost of one decision (waitForRequest) with and without the store.
// §9 (binary output) runs `cat` of ASCII, multi-byte UTF-8 and random files (64 MiB; --quick:
// 8 MiB) with and without `log`, random with `log` from a paced producer against the default
// 1 MiB journal, and the decoder alone (examples/decode_speed.rs, when built).
// §10 (saturation) runs K commands at once at a budget of 10 starts per 2 s (client timeoutMs
// 8000, so a cleanup deadline of 8 s): 3 victims (one per process in the shared run)
// `sh -c 'echo partial; exec sleep 30'` with a 1.5 s timeout (their children alive when the
// timeouts fire), the rest `echo`s started 300 ms later (K = 48, 3 rounds; --quick: 24, 1).
// In this process, and as 4 processes sharing one Redis store (redis-server of its own;
// skipped when none is installed). Prints false cleanup errors (every
// victim was killable), survivors (the emulator's live pids once all settled), the verdict
// after the timeout (p50/p99/max against the deadline) and the echos' throughput.
//
// §11 (transports, benches/transport.mjs) runs 256 MiB (--quick: 16 MiB) end to end and a warm
// echo with the native client and with the host's fetch (`transport: 'fetch'`), a fresh node
// process per run: MB/s, peak RSS above idle, echo wall time.
//
// §13 (session mode, benches/session.mjs) against the default mode in the same run: requests
// per command over 100 sequential echos (--quick: 20), a warm echo over TLS at 50 ms RTT, and
// commands per minute on a 300-per-minute budget (scaled in time).
//
// §14 (in flight, benches/inflight.mjs): 100, 1,000 and 10,000 commands in flight (--quick:
// 1,000) over HTTP/1.1 and HTTP/2, against the emulator's virtual processes, started in waves
// of 1,000: RSS above idle per command (and its anonymous part and V8's heap), CPU per 100 idle
// streams, the client's sockets, start time, and every command exact.
//
// Nothing here asserts timings: the machine may be noisy. Targets are printed beside
// the numbers for the reader.
import { execFile, execFileSync, fork, spawn } from 'node:child_process'
import { existsSync, mkdirSync, writeFileSync, unlinkSync } from 'node:fs'
import { createRequire } from 'node:module'
import os from 'node:os'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { api, startEmu } from './lib/emu.mjs'
import { pidsOf, startScanner } from './lib/procscan.mjs'
import { fmt, renderTable, stats } from './lib/stats.mjs'
import { transports } from './transport.mjs'
import { sessionBench } from './session.mjs'
import { inflightBench } from './inflight.mjs'

const require = createRequire(import.meta.url)
const { loadLib, ROOT } = require('./lib/load.cjs')
const execFileP = promisify(execFile)

const MiB = 1024 * 1024
const TAIL_CHARS = 4_194_304
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const now = () => performance.now()

// ---------------------------------------------------------------------------
// Options

function parseArgs(argv) {
  const o = { quick: false, runs: undefined, sections: undefined, emulator: undefined, baseline: undefined, out: undefined }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const val = () => {
      if (a.includes('=')) return a.slice(a.indexOf('=') + 1)
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`)
      return argv[++i]
    }
    const name = a.includes('=') ? a.slice(0, a.indexOf('=')) : a
    switch (name) {
      case '--quick': o.quick = true; break
      case '--runs': o.runs = Number(val()); break
      case '--sections': o.sections = new Set(val().split(',').map((s) => s.trim())); break
      case '--emulator': o.emulator = val(); break
      case '--baseline': o.baseline = val(); break
      case '--out': o.out = val(); break
      case '-h': case '--help':
        process.stdout.write('usage: node benches/run.mjs [--quick] [--runs N] [--sections 1,2,3,4,5,6,7,8,9,10,11,12,13,14] [--emulator child|inproc|both] [--baseline build|auto|skip] [--out FILE]\n')
        process.exit(0)
        break
      default: throw new Error(`unknown argument ${a}`)
    }
  }
  if (o.emulator && !['child', 'inproc', 'both'].includes(o.emulator)) throw new Error('--emulator must be child, inproc or both')
  if (o.baseline && !['build', 'auto', 'skip'].includes(o.baseline)) throw new Error('--baseline must be build, auto or skip')
  if (o.runs !== undefined && !(Number.isInteger(o.runs) && o.runs >= 1)) throw new Error('--runs needs a positive integer')
  const q = o.quick
  return {
    ...o,
    runs: o.runs ?? (q ? 3 : 5),
    sections: o.sections ?? new Set(['1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '11', '12', '13', '14']),
    emulator: o.emulator ?? (q ? 'child' : 'both'),
    baseline: o.baseline ?? (q ? 'auto' : 'build'),
    out: o.out ?? join(ROOT, 'bench-results', q ? 'quick.json' : 'latest.json'),
    sizesMiB: q ? [8] : [256, 1024],
    smallFrame: { mib: q ? 1 : 16, frameBytes: 1024 },
    memoryMiB: q ? 32 : 1024,
    binaryMiB: q ? 8 : 64,
    // §11: the native client and the host's fetch (benches/transport.mjs).
    transportMiB: q ? 16 : 256,
    concurrency: q ? 5 : 20,
    holdMs: q ? 1000 : 2000,
    wan: {
      rtts: q ? [0, 50] : [0, 20, 50, 100],
      warmRuns: q ? 2 : (o.runs ?? 5),
      coldRuns: q ? 1 : 3,
      holdRtts: q ? [50] : [0, 50, 100],
    },
    // §8: processes per row, seconds per row, store decisions timed.
    // The client's window is the server's plus a margin for the trip (a start decided in Redis
    // reaches the server a little later).
    pacing: {
      processes: q ? [1, 2] : [1, 2, 4],
      seconds: q ? 1.2 : 6,
      server: q ? { limit: 10, windowMs: 300 } : { limit: 30, windowMs: 1000 },
      client: q ? { limit: 10, windowMs: 400 } : { limit: 30, windowMs: 1200 },
      decisions: q ? 300 : 3000,
    },
    // §10: commands per run (every 6th a victim), processes of the shared run.
    saturation: { commands: q ? 24 : 48, processes: 4, rounds: q ? 1 : 3 },
  }
}

// ---------------------------------------------------------------------------
// Shared helpers

const lib = loadLib()

function clientFor(emu, pacing) {
  const config = { apiUrl: emu.url, timeoutMs: 600_000 }
  if (pacing !== undefined) config.pacing = pacing
  return { config, apiKey: emu.apiKey }
}

function cmd(sandboxId, command, args, extra = {}) {
  return { lease: { providerLeaseId: sandboxId }, command, args, ...extra }
}

function log(msg) {
  process.stderr.write(`[bench ${((now() - T0) / 1000).toFixed(1)}s] ${msg}\n`)
}

const T0 = now()
const rows = []
const results = {}
const anomalies = []

function row(section, metric, s, unit, note, digits) {
  rows.push({ section, metric, median: s.median, min: s.min, max: s.max, n: s.n, unit, note, digits })
}

function note(msg) {
  anomalies.push(msg)
  log(`NOTE: ${msg}`)
}

const PATH_KIND = [
  ['PUT', /\/files$/, 'putFile'],
  ['GET', /\/files$/, 'getFile'],
  ['POST', /\/sandboxes\/[^/]+\/processes$/, 'createProcess'],
  ['GET', /\/processes\/[^/]+\/connect$/, 'connect'],
  ['GET', /\/processes\/[^/]+\/wait$/, 'wait'],
  ['POST', /\/stdin\/close$/, 'stdinClose'],
  ['POST', /\/input$/, 'input'],
  ['DELETE', /\/processes\/[^/]+$/, 'deleteProcess'],
  ['GET', /\/processes\/[^/]+$/, 'getProcess'],
]
function kindOf(r) {
  for (const [m, re, k] of PATH_KIND) if (r.method === m && re.test(r.path)) return k
  return r.route || `${r.method} ${r.path}`
}

/** Every emulator started, so that the end of the run can check for survivors and close them. */
const emulators = []
async function emulator(where, options) {
  const e = await startEmu(where === 'inproc' ? 'inproc' : 'child', options)
  emulators.push(e)
  return e
}

async function closeAll() {
  const survivors = []
  for (const e of emulators) {
    try {
      const live = await e.livePids()
      if (live.length) survivors.push(...live)
    } catch { /* closed already */ }
  }
  await Promise.allSettled(emulators.map((e) => e.close()))
  emulators.length = 0
  return survivors
}

// ---------------------------------------------------------------------------
// §1 throughput

function discardBinary() {
  return join(ROOT, 'target', 'release', 'examples', 'discard_client')
}

function prepareBaseline(mode) {
  const bin = discardBinary()
  if (mode === 'skip') return { bin: null, why: 'skipped (--baseline skip)' }
  if (mode === 'build') {
    log('building examples/discard_client (cargo build --release --no-default-features --example discard_client)')
    const t = now()
    try {
      execFileSync('cargo', ['build', '--release', '--no-default-features', '--example', 'discard_client'], {
        cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'],
      })
    } catch (e) {
      return { bin: null, why: `cargo build failed: ${String(e.stderr || e.message).trim().split('\n').slice(-3).join(' | ')}` }
    }
    log(`built in ${((now() - t) / 1000).toFixed(1)} s`)
  }
  if (!existsSync(bin)) return { bin: null, why: 'not built (run without --quick, or --baseline build)' }
  return { bin, why: null }
}

async function runDiscard(bin, emu, path, mode = 'raw') {
  const { stdout } = await execFileP(bin, [emu.url, emu.apiKey, path, '1', mode], { maxBuffer: 1 << 20 })
  const line = stdout.trim().split('\n').pop()
  return JSON.parse(line)
}

/** One execute() of `true` whose connect is served by the fast-stream fault. */
async function fastExecute(emu, client, sb, mib, frameBytes) {
  await emu.addFault({ route: 'connect', times: 1, action: { kind: 'fastStream', mib, frame_bytes: frameBytes } })
  const t = now()
  const r = await lib.execute(client, cmd(sb, 'true'))
  const ms = now() - t
  const want = Math.min(mib * MiB, TAIL_CHARS)
  if (r.exitCode !== 0 || r.stdout.length !== want || (mib * MiB > TAIL_CHARS) !== r.metadata.outputTruncated) {
    note(`§1 execute of ${mib} MiB: exitCode ${r.exitCode}, stdout ${r.stdout.length} chars (want ${want}), truncated ${r.metadata.outputTruncated}`)
  }
  return ms
}

async function throughput(opts, baseline) {
  const wheres = opts.emulator === 'both' ? ['child', 'inproc'] : [opts.emulator]
  const out = {}
  for (const where of wheres) {
    const emu = await emulator(where)
    const sb = await emu.createSandbox()
    const client = clientFor(emu, 'off')
    await lib.execute(client, cmd(sb, 'echo', ['warm']))
    // A process record for the baseline's connect (the fast stream ignores the real process).
    const proc = await api(emu, 'POST', `/sandboxes/${sb}/processes`, { cmd: 'true' })
    const connectPath = `/v1/sandboxes/${sb}/processes/${proc.process_id}/connect?after=0`
    const cases = [...opts.sizesMiB.map((mib) => ({ mib, frameBytes: 65536 })), opts.smallFrame]
    out[where] = []
    for (const { mib, frameBytes } of cases) {
      // Large sizes are measured both ways only with the emulator in a child process.
      if (where === 'inproc' && wheres.length > 1 && mib > 256) continue
      const label = `${mib} MiB, ${frameBytes >= 1024 ? `${frameBytes / 1024} KiB` : `${frameBytes} B`} frames`
      log(`§1 ${label}, emulator ${emu.where}`)
      // Warm-up run of each case (not counted).
      await fastExecute(emu, client, sb, Math.min(mib, 64), frameBytes)
      const exec = []
      const base = []
      const wire = []
      for (let i = 0; i < opts.runs; i++) {
        const ms = await fastExecute(emu, client, sb, mib, frameBytes)
        exec.push((mib * MiB) / 1e6 / (ms / 1000))
        if (baseline.bin) {
          await emu.addFault({ route: 'connect', times: 1, action: { kind: 'fastStream', mib, frame_bytes: frameBytes } })
          const d = await runDiscard(baseline.bin, emu, connectPath)
          if (d.status !== 200) note(`§1 discard client got HTTP ${d.status}`)
          base.push((mib * MiB) / 1e6 / (d.ms / 1000))
          wire.push(d.bytes / 1e6 / (d.ms / 1000))
        }
      }
      await emu.clearFaults()
      const se = stats(exec)
      const sbase = stats(base)
      const ratio = stats(exec.map((x, i) => (base[i] ? x / base[i] : NaN)))
      out[where].push({ mib, frameBytes, executeMBps: se, discardMBps: sbase, discardWireMBps: stats(wire), ratio })
      const tag = `${label} [emulator: ${where === 'inproc' ? 'in-process' : 'child'}]`
      const target = frameBytes === 65536 ? 'target ≥ 400' : 'TS module: ~0.7 MB/s'
      row('1', `execute, ${tag}`, se, 'MB/s', target)
      if (baseline.bin) {
        row('1', `discard client, ${tag}`, sbase, 'MB/s', `wire ${fmt(stats(wire).median)} MB/s`)
        row('1', `execute ÷ discard, ${tag}`, ratio, '×', frameBytes === 65536 ? 'target ≥ 0.5' : '', 2)
      }
    }
  }
  if (!baseline.bin) {
    rows.push({ section: '1', metric: 'discard client', unit: '', note: baseline.why })
  } else {
    out.profile = await subSteps(opts, baseline)
  }
  return out
}

/**
 * Where the time goes: the discard client again, adding the crate's own steps one at a time
 * (examples/discard_client.rs modes), then the crate's whole `execute` from Rust (no Node).
 */
async function subSteps(opts, baseline) {
  const emu = await emulator('child')
  const sb = await emu.createSandbox()
  const proc = await api(emu, 'POST', `/sandboxes/${sb}/processes`, { cmd: 'true' })
  const connectPath = `/v1/sandboxes/${sb}/processes/${proc.process_id}/connect?after=0`
  const client = clientFor(emu, 'off')
  await lib.execute(client, cmd(sb, 'echo', ['warm']))
  const mib = opts.sizesMiB[0]
  const modes = [
    ['raw', 'read and discard'],
    ['split', '+ line splitter'],
    ['parse', '+ JSON frame parse + base64 decode'],
    ['capture', '+ UTF-8 decode into the tails'],
    ['execute', 'execute() in Rust, no Node'],
    ['node', 'execute() from Node (this process)'],
  ]
  const arm = () => emu.addFault({ route: 'connect', times: 1, action: { kind: 'fastStream', mib, frame_bytes: 65536 } })
  const samples = Object.fromEntries(modes.map(([m]) => [m, []]))
  log(`§1 sub-step profile, ${mib} MiB, 64 KiB frames`)
  for (let i = 0; i < opts.runs; i++) {
    // Interleaved, so drift in machine load spreads over every mode.
    for (const [mode] of modes) {
      let ms
      if (mode === 'node') {
        ms = await fastExecute(emu, client, sb, mib, 65536)
      } else {
        await arm()
        const d = await runDiscard(baseline.bin, emu, mode === 'execute' ? sb : connectPath, mode)
        ms = d.ms
      }
      samples[mode].push((mib * MiB) / 1e6 / (ms / 1000))
    }
  }
  await emu.clearFaults()
  const out = {}
  for (const [mode, label] of modes) {
    out[mode] = stats(samples[mode])
    row('1p', `sub-steps ${mib} MiB: ${mode} (${label})`, out[mode], 'MB/s', mode === 'raw' ? 'ceiling' : '')
  }
  // The same pipeline on in-memory lines, step by step (no network, one thread).
  log('§1 in-memory step timings (discard_client micro)')
  const micro = {}
  for (let i = 0; i < opts.runs; i++) {
    const { stdout } = await execFileP(baseline.bin, ['micro', String(mib), '65536'], { maxBuffer: 1 << 20 })
    for (const line of stdout.trim().split('\n')) {
      const { step, MBps } = JSON.parse(line)
      ;(micro[step] ||= []).push(MBps)
    }
  }
  out.micro = {}
  for (const [step, values] of Object.entries(micro)) {
    out.micro[step] = stats(values)
    row('1m', `in memory ${mib} MiB: ${step}`, out.micro[step], 'MB/s', '')
  }
  return out
}

// ---------------------------------------------------------------------------
// §2 memory (fresh node per run)

async function memoryRun(emu, sb, mib) {
  const child = fork(join(ROOT, 'benches', 'memory-child.mjs'), [], {
    execArgv: ['--expose-gc'],
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  })
  const messages = []
  let wake
  child.on('message', (m) => { messages.push(m); if (wake) wake() })
  const next = async () => {
    while (!messages.length) {
      await new Promise((r) => { wake = r; child.once('exit', r) })
      if (!messages.length && child.exitCode !== null) throw new Error(`memory child exited (${child.exitCode})`)
    }
    return messages.shift()
  }
  child.send({ url: emu.url, apiKey: emu.apiKey, sandboxId: sb })
  await next() // idle measured
  await emu.addFault({ route: 'connect', times: 1, action: { kind: 'fastStream', mib, frame_bytes: 65536 } })
  child.send({ go: true })
  const { result } = await next()
  await new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)))
  if (result.error) throw new Error(`memory child: ${result.error}`)
  return result
}

async function memory(opts) {
  const emu = await emulator('child')
  const sb = await emu.createSandbox()
  const runs = []
  log(`§2 peak RSS while streaming ${opts.memoryMiB} MiB (fresh node process per run)`)
  for (let i = 0; i < opts.runs; i++) {
    const r = await memoryRun(emu, sb, opts.memoryMiB)
    if (r.exitCode !== 0 || r.stdoutLength !== Math.min(opts.memoryMiB * MiB, TAIL_CHARS)) {
      note(`§2 run ${i}: exitCode ${r.exitCode}, stdout ${r.stdoutLength}`)
    }
    runs.push(r)
  }
  await emu.clearFaults()
  const mb = (x) => x / MiB
  row('2', 'idle RSS (after one warm-up command)', stats(runs.map((r) => mb(r.idle))), 'MiB')
  row('2', `peak RSS − idle, sampled every 10 ms, ${opts.memoryMiB} MiB`, stats(runs.map((r) => mb(r.peakSampled - r.idle))), 'MiB', 'target ≤ 100')
  row('2', `VmHWM − idle (lifetime peak), ${opts.memoryMiB} MiB`, stats(runs.map((r) => mb(r.hwmAfter - r.idle))), 'MiB', 'upper bound')
  row('2', `throughput in the fresh process, ${opts.memoryMiB} MiB`, stats(runs.map((r) => (opts.memoryMiB * MiB) / 1e6 / (r.ms / 1000))), 'MB/s', 'cold process')
  return runs
}

// ---------------------------------------------------------------------------
// §3 requests per command

async function requestsPerCommand(opts) {
  const emu = await emulator('child')
  const sb = await emu.createSandbox()
  const client = clientFor(emu) // default limiter
  const out = {}
  for (const [name, params, expect] of [
    ['no stdin: echo', cmd(sb, 'echo', ['hi']), 'hi\n'],
    ['with stdin: cat', cmd(sb, 'cat', [], { stdin: 'hello\n' }), 'hello\n'],
  ]) {
    const counts = []
    const seqs = new Set()
    for (let i = 0; i < opts.runs; i++) {
      await emu.clearRequests()
      const r = await lib.execute(client, params)
      if (r.exitCode !== 0 || r.stdout !== expect) note(`§3 ${name}: exitCode ${r.exitCode}, stdout ${JSON.stringify(r.stdout)}`)
      await sleep(50)
      const reqs = await emu.requests()
      counts.push(reqs.length)
      seqs.add(reqs.map(kindOf).join(' → '))
    }
    out[name] = { counts: stats(counts), sequences: [...seqs] }
    row('3', `requests per command, ${name}`, stats(counts), 'req', `${name.startsWith('no') ? 'target ≤ 3' : 'target ≤ 4'}; ${[...seqs].join(' | ')}`, 0)
  }
  return out
}

// ---------------------------------------------------------------------------
// §4 latency of one echo, per limiter

async function echoLatency(opts) {
  const out = {}
  for (const [label, pacing] of [['default limiter (window 300/60 s)', undefined], ['spacing 300 ms', 'spacing'], ['pacing off', 'off']]) {
    // A fresh emulator = a fresh API origin = a fresh budget of its own.
    const emu = await emulator('child')
    const sb = await emu.createSandbox()
    const client = clientFor(emu, pacing)
    log(`§4 echo, ${label}`)
    const walls = []
    const reqs = []
    for (let i = 0; i < opts.runs + 1; i++) {
      await emu.clearRequests()
      const t = now()
      const r = await lib.execute(client, cmd(sb, 'echo', ['hi']))
      const ms = now() - t
      if (r.exitCode !== 0 || r.stdout !== 'hi\n') note(`§4 ${label}: exitCode ${r.exitCode}`)
      await sleep(pacing === 'spacing' ? 350 : 50) // a command on its own, not queued behind the previous
      if (i === 0) continue // warm-up (first request on this origin's connection)
      walls.push(ms)
      reqs.push((await emu.requests()).length)
    }
    out[label] = { wallMs: stats(walls), requests: stats(reqs) }
    const target = pacing === undefined ? 'TS module ~1900 ms' : pacing === 'off' ? 'floor (gate poll ≤ 20 ms included)' : ''
    row('4', `echo wall time, ${label}`, stats(walls), 'ms', `${fmt(stats(reqs).median, 0)} req; ${target}`, 0)
  }
  return out
}

// ---------------------------------------------------------------------------
// §5 N concurrent commands on N sandboxes

async function concurrent(opts) {
  const n = opts.concurrency
  const out = {}
  const spacingEmu = await emulator('child')
  const spacingSbs = []
  for (let i = 0; i < n; i++) spacingSbs.push(await spacingEmu.createSandbox())
  const batch = async (emu, sbs, pacing) => {
    const client = clientFor(emu, pacing)
    await emu.clearRequests()
    const t = now()
    const rs = await Promise.all(sbs.map((sb, i) => lib.execute(client, cmd(sb, 'echo', [`c${i}`]))))
    const ms = now() - t
    rs.forEach((r, i) => { if (r.exitCode !== 0 || r.stdout !== `c${i}\n`) note(`§5 command ${i}: exitCode ${r.exitCode}`) })
    await sleep(50)
    return { ms, requests: (await emu.requests()).length }
  }
  for (const [label, pacing] of [['default limiter', undefined], ['spacing 300 ms', 'spacing']]) {
    log(`§5 ${n} concurrent commands, ${label}`)
    const walls = []
    const reqs = []
    for (let i = 0; i < opts.runs; i++) {
      let emu = spacingEmu
      let sbs = spacingSbs
      if (pacing === undefined) {
        // The window budget is per origin and lasts 60 s: each run gets a fresh emulator
        // (origin), i.e. the numbers are for a burst on an unused budget.
        emu = await emulator('child')
        sbs = []
        for (let k = 0; k < n; k++) sbs.push(await emu.createSandbox())
        await lib.execute(clientFor(emu, 'off'), cmd(sbs[0], 'true')) // open the connection (unpaced)
      } else {
        await sleep(350)
      }
      const r = await batch(emu, sbs, pacing)
      walls.push(r.ms)
      reqs.push(r.requests)
    }
    out[label] = { wallMs: stats(walls), requests: stats(reqs) }
    row('5', `${n} concurrent commands, total wall, ${label}`, stats(walls), 'ms', `${fmt(stats(reqs).median, 0)} req${pacing === undefined ? '; fresh budget per run' : ''}`, 0)
  }
  const d = out['default limiter'].wallMs.median
  const s = out['spacing 300 ms'].wallMs.median
  out.ratio = s / d
  rows.push({ section: '5', metric: `spacing ÷ default (medians), ${n} concurrent`, median: s / d, unit: '×', note: 'target ≥ 10', digits: 1 })
  return out
}

// ---------------------------------------------------------------------------
// §6 quiet waiting

/**
 * Runs `run` (which returns { processId, sandboxId, t0 }) while scanning /proc, and counts the
 * processes the managed process spawned: all of them, and those first seen inside the
 * steady part of the wait, [t0 + 300 ms, t0 + hold − 100 ms] (after the login shell's
 * start-up, before the gate opens).
 */
async function countSpawns(emu, hold, run) {
  const scanner = startScanner(2)
  let info
  try {
    info = await run()
  } finally {
    await sleep(30)
  }
  const { pids, scans, meanScanMs } = scanner.stop()
  const mine = pidsOf(pids, info.processId)
  let leader = null
  try { leader = (await api(emu, 'GET', `/sandboxes/${info.sandboxId}/processes/${info.processId}`)).pid } catch { /* unknown */ }
  // Spawns = marked pids other than the leader (bash, which execs the command in place).
  const others = mine.filter((p) => p.pid !== leader)
  const lo = info.t0 + 300
  const hi = info.t0 + hold - 100
  const inWait = others.filter((p) => p.firstSeen >= lo && p.firstSeen <= hi)
  // What was spawned, by program name (a fork not yet exec'd shows as bash).
  const name = (p) => (p.cmd || '?').split(' ')[0].split('/').pop()
  return {
    ...info,
    leader,
    leaderSeen: mine.some((p) => p.pid === leader),
    spawns: others.length,
    commands: others.map(name),
    waitSpawns: inWait.length,
    waitCommands: inWait.map(name),
    waitRate: inWait.length / ((hi - lo) / 1000),
    scans,
    meanScanMs,
  }
}

async function quietWaiting(opts) {
  const emu = await emulator('child')
  const sb = await emu.createSandbox()
  const client = clientFor(emu, 'off')
  const hold = opts.holdMs
  const out = { holdMs: hold }

  // Calibration: the TypeScript module's wait (`sleep 0.01` until the gate exists), run
  // directly as a managed process; the gate file is created by the bench after `hold` ms.
  const calib = []
  for (let i = 0; i < Math.max(1, Math.min(opts.runs, 3)); i++) {
    const gate = `/tmp/createos-bench-gate-${process.pid}-${i}-${Date.now()}`
    const r = await countSpawns(emu, hold, async () => {
      const t0 = now()
      const p = await api(emu, 'POST', `/sandboxes/${sb}/processes`, {
        cmd: '/bin/bash', args: ['-c', `while [ ! -e '${gate}' ]; do sleep 0.01; done; rm -f -- '${gate}'`],
      })
      await sleep(hold)
      writeFileSync(gate, '')
      for (let k = 0; k < 100; k++) {
        const s = await api(emu, 'GET', `/sandboxes/${sb}/processes/${p.process_id}`)
        if (s.leader_exited) break
        await sleep(20)
      }
      try { unlinkSync(gate) } catch { /* removed by the script */ }
      return { processId: p.process_id, sandboxId: sb, t0 }
    })
    calib.push(r.waitRate)
  }
  out.calibration = stats(calib)
  row('6', 'calibration: old `sleep 0.01` wait loop', out.calibration, 'spawns/s', 'same window and scanner; TS module ~100/s', 0)

  // execute(): the gate PUT is held `hold` ms by a delay fault, so the script waits that long.
  const withHold = []
  const noHold = []
  for (let i = 0; i < opts.runs; i++) {
    for (const held of [false, true]) {
      const r = await countSpawns(emu, hold, async () => {
        await emu.clearRequests()
        if (held) await emu.addFault({ route: 'putFile', times: 1, action: { kind: 'delay', ms: hold } })
        const t = now()
        const res = await lib.execute(client, cmd(sb, 'true'))
        const ms = now() - t
        if (res.exitCode !== 0) note(`§6 execute: exitCode ${res.exitCode}`)
        const reqs = await emu.requests()
        const c = reqs.find((q) => kindOf(q) === 'connect')
        const m = c && c.path.match(/\/processes\/([^/]+)\/connect$/)
        return { processId: m ? m[1] : '?', sandboxId: sb, ms, t0: t }
      })
      ;(held ? withHold : noHold).push(r)
    }
  }
  await emu.clearFaults()
  const spawnsNo = stats(noHold.map((r) => r.spawns))
  const spawnsHeld = stats(withHold.map((r) => r.spawns))
  const tally = (list) => {
    const t = {}
    for (const c of list) t[c] = (t[c] || 0) + 1
    return Object.entries(t).map(([c, k]) => `${c}×${k}`).join(' ') || 'none'
  }
  const rate = stats(withHold.map((r) => r.waitRate))
  out.execute = { noHold, withHold, spawnsNoHold: spawnsNo, spawnsHeld, waitRatePerS: rate }
  row('6', 'spawns of a command, gate opened at once', spawnsNo, 'procs', `all runs: ${tally(noHold.flatMap((r) => r.commands))}`, 0)
  row('6', `spawns of a command, gate held ${hold} ms`, spawnsHeld, 'procs', `all runs: ${tally(withHold.flatMap((r) => r.commands))}`, 0)
  row('6', 'gate wait: spawns per second of waiting', rate, 'spawns/s', `steady wait [+300 ms, +${hold - 100} ms]: ${tally(withHold.flatMap((r) => r.waitCommands))}; target: a few at most`, 1)
  row('6', `execute wall time, gate held ${hold} ms`, stats(withHold.map((r) => r.ms)), 'ms', `pacing off; hold ${hold} ms`, 0)
  out.scanner = { meanScanMs: stats(withHold.map((r) => r.meanScanMs)).median }
  return out
}

// ---------------------------------------------------------------------------
// §7 WAN: TLS, HTTP/2 and HTTP/1.1, round trips (issue 10)

const COLD_CHILD = join(ROOT, 'benches', 'cold-child.cjs')

/** One execute in a fresh node process (the cold first command); its own timing. */
async function coldExecute(client, params) {
  const { stdout } = await execFileP(process.execPath, [COLD_CHILD, JSON.stringify({ client, params })], { maxBuffer: 1 << 20 })
  return JSON.parse(stdout.trim().split('\n').pop())
}

async function wan(opts) {
  const out = { rows: [] }
  const { rtts, warmRuns, coldRuns, holdRtts } = opts.wan
  const echo = (sb, stdin) => (stdin ? cmd(sb, 'cat', [], { stdin: 'hi\n' }) : cmd(sb, 'echo', ['hi']))
  const configs = []
  for (const rtt of rtts) for (const http2 of [true, false]) configs.push({ rtt, http2, hold: false })
  for (const rtt of holdRtts) configs.push({ rtt, http2: true, hold: true })
  for (const { rtt, http2, hold } of configs) {
    const proto = http2 ? 'h2' : 'http/1.1'
    const emuOpts = { tls: true, http2, rttMs: rtt, ...(hold ? { holdHeaders: true, heartbeatMs: 5000 } : {}) }
    const emu = await startEmu('child', emuOpts)
    emulators.push(emu)
    const sb = await emu.createSandbox()
    const client = { config: { apiUrl: emu.url, timeoutMs: 60_000, caCertPem: emu.caPem }, apiKey: emu.apiKey }
    const label = `TLS ${proto}, RTT ${rtt} ms${hold ? ', holdHeaders + heartbeat 5 s' : ''}`
    log(`§7 ${label}`)
    const measure = async (stdin, cold) => {
      const walls = []
      const reqs = []
      const conns = []
      const runs = cold ? coldRuns : warmRuns
      for (let i = 0; i < runs + (cold ? 0 : 1); i++) {
        await emu.clearRequests()
        const c0 = await emu.connections()
        let ms
        let r
        if (cold) {
          r = await coldExecute(client, echo(sb, stdin))
          if (r.error) { note(`§7 ${label} cold: ${r.error}`); continue }
          ms = r.ms
        } else {
          const t = now()
          r = await lib.execute(client, echo(sb, stdin))
          ms = now() - t
        }
        if (r.exitCode !== 0 || r.stdout !== 'hi\n') note(`§7 ${label}: exitCode ${r.exitCode}, stdout ${JSON.stringify(r.stdout)}`)
        await sleep(20)
        const c1 = await emu.connections()
        if (!cold && i === 0) continue // warm-up: opens this client's connections
        walls.push(ms)
        reqs.push((await emu.requests()).length)
        conns.push(c1 - c0)
      }
      return { wall: stats(walls), requests: stats(reqs), connections: stats(conns) }
    }
    const variants = hold
      ? [['warm, no stdin', false, false], ['warm, stdin', true, false]]
      : [['warm, no stdin', false, false], ['warm, stdin', true, false], ['cold, no stdin', false, true], ['cold, stdin', true, true]]
    for (const [name, stdin, cold] of variants) {
      const m = await measure(stdin, cold)
      const perRtt = rtt > 0 && m.wall.median !== null ? `${fmt(m.wall.median / rtt, 1)} RTT` : 'RTT 0'
      let target = ''
      if (rtt === 50 && !cold && !hold) target = `; target ≤ 4 RTT + 30 ms = ${4 * rtt + 30} ms`
      if (rtt === 50 && !cold && hold) target = `; target ≤ 4 RTT + 300 ms = ${4 * rtt + 300} ms`
      if (rtt === 50 && cold) target = `; target ≤ 7 RTT = ${7 * rtt} ms`
      const noteText = `${perRtt}; ${fmt(m.requests.median, 0)} req/cmd; ${fmt(m.connections.median, 0)} new conn/cmd${target}`
      row('7', `echo ${name}, ${label}`, m.wall, 'ms', noteText, 0)
      out.rows.push({ rtt, proto, hold, name, ...m })
    }
    await emu.close()
  }
  return out
}

// ---------------------------------------------------------------------------
// §9 binary output: `cat` of ASCII, multi-byte UTF-8 and random bytes through the real
// emulator (its default 1 MiB journal: falling behind fails the command), with and without
// a `log` callback; and the decoder alone (examples/decode_speed.rs), when built.

async function binaryOutput(opts) {
  const bytes = opts.binaryMiB * MiB
  // `cat` of a file outruns any reader; a journal that holds the whole output measures the
  // client's speed, not the race. The default journal is used by the paced rows below.
  const emu = await startEmu('child', { journalBytes: bytes + MiB })
  emulators.push(emu)
  // Before the emulator bounded what exited processes keep (`retainedBytes`), 30 runs of
  // 64 MiB in one sandbox grew it past 3.5 GB, and the stream then stalled for 30–70 ms at a
  // time in the later rows (random with `log`, the last one, ran at half speed while the
  // client's CPU time stayed the same). Each row still gets a sandbox of its own, deleted
  // after: nothing of an earlier row is kept while a row is measured.
  let sb = await emu.createSandbox()
  const client = clientFor(emu, 'off')
  const kinds = {
    ASCII: `yes abcdefghijklmnopqrstuvwxyz0123456789 | head -c ${bytes}`,
    'multi-byte UTF-8': `yes 'é€😀ü中文' | head -c ${bytes}`,
    random: `head -c ${bytes} /dev/urandom`,
  }
  for (const [kind, make] of Object.entries(kinds)) {
    const r = await lib.execute(client, cmd(sb, '/bin/bash', ['-c', `${make} > /tmp/bench-${kind.replace(/\W/g, '')}`]))
    if (r.exitCode !== 0) note(`§9 could not write the ${kind} file: ${r.stderr.slice(0, 200)}`)
  }
  const out = {}
  const mbps = (ms) => bytes / 1e6 / (ms / 1000)
  const cases = [['ASCII', false], ['multi-byte UTF-8', false], ['random', false], ['ASCII', true], ['random', true]]
  for (const [kind, withLog] of cases) {
    const label = `cat ${opts.binaryMiB} MiB ${kind}${withLog ? ', with log' : ''}`
    log(`§9 ${label}`)
    await api(emu, 'DELETE', `/sandboxes/${sb}`)
    sb = await emu.createSandbox()
    const speeds = []
    const calls = []
    for (let i = 0; i < opts.runs + 1; i++) {
      let n = 0
      const onLog = withLog ? () => { n++ } : undefined
      const t = now()
      let r
      try {
        r = await lib.execute(client, cmd(sb, 'cat', [`/tmp/bench-${kind.replace(/\W/g, '')}`]), undefined, onLog)
      } catch (e) {
        note(`§9 ${label}: ${e.message}`)
        continue
      }
      const ms = now() - t
      if (r.exitCode !== 0) note(`§9 ${label}: exitCode ${r.exitCode}`)
      if (i === 0) continue // warm-up
      speeds.push(mbps(ms))
      calls.push(n)
    }
    const s = stats(speeds)
    out[label] = { MBps: s, logCalls: withLog ? stats(calls) : undefined }
    row('9', `execute, ${label}`, s, 'MB/s', withLog ? `${fmt(stats(calls).median, 0)} log calls` : '')
  }
  const med = (label) => out[label] && out[label].MBps.median
  const ratio = (a, b, metric, target) => {
    const x = med(a) / med(b)
    rows.push({ section: '9', metric, median: x, unit: '×', note: target, digits: 2 })
    out[metric] = x
  }
  const m = opts.binaryMiB
  ratio(`cat ${m} MiB ASCII`, `cat ${m} MiB random`, 'ASCII ÷ random speed (medians)', 'target ≤ 2')
  ratio(`cat ${m} MiB random`, `cat ${m} MiB random, with log`, 'random without log ÷ with log (medians)', 'target ≤ 1.5')
  out.paced = await pacedRandom(opts)
  out.decoder = decoderSpeed(opts)
  return out
}

/**
 * Random bytes with `log` against the emulator's default 1 MiB journal, written by a producer
 * paced at `PACED_MBPS` (a command that prints binary output fast; `cat` of a file outruns any
 * reader and overflows any bounded journal): the client must keep up (no "output was evicted").
 */
const PACED_MBPS = 25
async function pacedRandom(opts) {
  const emu = await emulator('child')
  const sb = await emu.createSandbox()
  const client = clientFor(emu, 'off')
  const rate = PACED_MBPS
  const chunks = opts.binaryMiB
  // One MiB per step, then a pause so the average is `rate` MB/s.
  const pauseS = (MiB / 1e6 / rate).toFixed(3)
  const script = `head -c ${MiB} /dev/urandom > /tmp/chunk; for i in $(seq ${chunks}); do cat /tmp/chunk; sleep ${pauseS}; done`
  let ok = 0
  const calls = []
  for (let i = 0; i < opts.runs; i++) {
    let n = 0
    try {
      const r = await lib.execute(client, cmd(sb, '/bin/bash', ['-c', script]), undefined, () => { n++ })
      if (r.exitCode === 0) ok++
      calls.push(n)
    } catch (e) {
      note(`§9 paced random with log: ${e.message}`)
    }
  }
  rows.push({ section: '9', metric: `random with log, ${chunks} MiB produced at ${rate} MB/s, default 1 MiB journal`, median: ok, unit: `of ${opts.runs} ok`, note: `${fmt(stats(calls).median, 0)} log calls; target: all ok`, digits: 0 })
  return { rate, ok, runs: opts.runs, logCalls: stats(calls) }
}

/** The decoder alone, in Rust (no HTTP, no JS), when examples/decode_speed is built. */
function decoderSpeed(opts) {
  const bin = join(ROOT, 'target', 'release', 'examples', 'decode_speed')
  if (opts.baseline === 'build') {
    try {
      execFileSync('cargo', ['build', '--release', '-p', 'createos_execute_core', '--example', 'decode_speed'], {
        cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'],
      })
    } catch (e) {
      note(`§9 decode_speed did not build: ${String(e.stderr || e.message).trim().split('\n').pop()}`)
    }
  }
  if (!existsSync(bin)) {
    rows.push({ section: '9', metric: 'decoder alone', unit: '', note: 'not built (cargo build --release -p createos_execute_core --example decode_speed)' })
    return null
  }
  const res = JSON.parse(execFileSync(bin, [String(opts.quick ? 16 : 64), String(opts.runs)]).toString().trim().split('\n').pop())
  for (const [kind, speeds] of Object.entries(res)) {
    const what = kind.includes('reference')
      ? ''
      : kind.includes('UTF-16')
        ? 'for JS, 1 MiB pieces (MB/s of the input)'
        : kind.includes('Utf8Decoder') ? 'Utf8Decoder::decode' : 'Output::write'
    row('9', `decoder alone (64 KiB reads), ${kind}`, stats(speeds), 'MB/s', what)
  }
  return res
}

// ---------------------------------------------------------------------------
// Main

function machine() {
  const cpus = os.cpus()
  let commit = null
  try { commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: ROOT, stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim() } catch { /* no git */ }
  return {
    cpus: cpus.length,
    cpuModel: cpus[0] ? cpus[0].model : null,
    memGiB: +(os.totalmem() / 2 ** 30).toFixed(1),
    node: process.version,
    os: `${os.type()} ${os.release()} ${os.arch()}`,
    loadavgStart: os.loadavg().map((x) => +x.toFixed(2)),
    commit,
    via: lib.via,
  }
}

// ---------------------------------------------------------------------------
// §8 one budget for several processes: a shared Redis store vs per-process budgets

/** A redis-server of this run on a free loopback port in a temp dir (ended by pid), or null. */
async function startRedis() {
  const { mkdtempSync, rmSync } = await import('node:fs')
  const net = await import('node:net')
  const port = await new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => { const p = srv.address().port; srv.close(() => resolve(p)) })
  })
  const dir = mkdtempSync(join(os.tmpdir(), 'createos-bench-redis-'))
  let proc
  try {
    proc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir], { stdio: 'ignore' })
    await new Promise((resolve, reject) => { proc.once('spawn', resolve); proc.once('error', reject) })
  } catch {
    rmSync(dir, { recursive: true, force: true })
    return null
  }
  for (let i = 0; i < 200; i++) {
    const up = await new Promise((resolve) => {
      const c = net.connect(port, '127.0.0.1', () => { c.end(); resolve(true) })
      c.once('error', () => resolve(false))
    })
    if (up) break
    await sleep(25)
  }
  return {
    url: `redis://127.0.0.1:${port}/0`,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        const gone = new Promise((r) => proc.once('exit', r))
        process.kill(proc.pid, 'SIGKILL')
        await gone
      }
      rmSync(dir, { recursive: true, force: true })
    },
  }
}

/** `n` host processes (one worker thread each, __test__/pacing-child.mjs) for `seconds`. */
async function pacedProcesses(emu, n, seconds, pacing) {
  const child = join(ROOT, '__test__', 'pacing-child.mjs')
  const env = { ...process.env }
  delete env.CREATEOS_PACING_STORE
  const runs = []
  for (let i = 0; i < n; i++) {
    const arg = { url: emu.url, apiKey: emu.apiKey, sandboxes: [await emu.createSandbox()], durationMs: seconds * 1000, concurrency: 4, deadlineMs: 30_000, pacing }
    runs.push(execFileP(process.execPath, [child, JSON.stringify(arg)], { env, timeout: 60_000 }).then(({ stdout }) => JSON.parse(stdout.trim().split('\n').pop())))
  }
  return Promise.all(runs)
}

async function sharedPacing(opts) {
  const redis = await startRedis()
  if (!redis) {
    rows.push({ section: '8', metric: 'shared pacing store', unit: '', note: 'redis-server not found: section skipped' })
    return { skipped: 'redis-server not found' }
  }
  const out = { rows: [] }
  try {
    const emuLimit = opts.pacing.server
    const pacing = opts.pacing.client
    // Steady state (3 requests per echo); a short run also gets the first window's burst.
    const budgetCpm = (pacing.limit / pacing.windowMs) * 60_000 / 3
    const { seconds } = opts.pacing
    for (const n of opts.pacing.processes) {
      for (const [label, store] of [['shared store', redis.url], ['per process', false]]) {
        log(`§8 ${n} process(es), ${label}, ${seconds} s`)
        const emu = await emulator('child', { rateLimit: emuLimit })
        const t = now()
        const rs = await pacedProcesses(emu, n, seconds, { ...pacing, store })
        const ms = now() - t
        const reqs = await emu.requests()
        const ok = rs.reduce((a, r) => a + r.ok, 0)
        const failed = rs.reduce((a, r) => a + r.failed.length + r.wrong, 0)
        const n429 = reqs.filter((r) => r.status === 429).length
        const cpm = ok / (ms / 60_000)
        out.rows.push({ processes: n, store: label, commands: ok, failed, requests: reqs.length, status429: n429, ms, cpm })
        row('8', `${n} process${n > 1 ? 'es' : ''}, ${label}: commands per minute`, stats([cpm]), 'cmd/min',
          `${ok} ok, ${failed} failed, ${n429} × 429 in ${fmt(ms / 1000, 1)} s; server ${emuLimit.limit}/${emuLimit.windowMs} ms, client ${pacing.limit}/${pacing.windowMs} ms ≈ ${fmt(budgetCpm, 0)} cmd/min`, 0)
        // Closed here (one emulator child per row), not left for closeAll.
        const live = await emu.livePids()
        if (live.length) note(`§8: processes still alive when the emulator closed: ${live.join(', ')}`)
        emulators.splice(emulators.indexOf(emu), 1)
        await emu.close()
      }
    }
    // The cost of one decision: `waitForRequest` on a budget that never makes anyone wait,
    // with the store and without it (the difference is the store's round trip).
    const n = opts.pacing.decisions
    const { waitForRequest } = require(join(ROOT, 'index.js'))
    const emu = await emulator('child')
    const origins = { shared: emu.url, local: emu.url.replace('127.0.0.1', 'localhost') }
    const big = { limit: 1_000_000, windowMs: 60_000 }
    const sb = await emu.createSandbox()
    for (const [label, url, store] of [['shared store', origins.shared, redis.url], ['in-process', origins.local, false]]) {
      log(`§8 one decision, ${label}, ${n} calls`)
      await lib.execute({ config: { apiUrl: url, timeoutMs: 30_000, pacing: { ...big, store } }, apiKey: emu.apiKey }, cmd(sb, 'true'))
      const saved = process.env.CREATEOS_PACING_STORE
      if (store) process.env.CREATEOS_PACING_STORE = store
      else delete process.env.CREATEOS_PACING_STORE
      const us = []
      try {
        for (let i = 0; i < n; i++) {
          const t = now()
          await waitForRequest(url)
          us.push((now() - t) * 1000)
        }
      } finally {
        if (saved === undefined) delete process.env.CREATEOS_PACING_STORE
        else process.env.CREATEOS_PACING_STORE = saved
      }
      us.sort((a, b) => a - b)
      const p99 = us[Math.min(us.length - 1, Math.floor(us.length * 0.99))]
      out[label] = { medianUs: stats(us).median, p99Us: p99 }
      row('8', `one pacing decision (waitForRequest), ${label}`, stats(us), 'µs', `p99 ${fmt(p99, 0)} µs; ${n} calls`, 0)
    }
  } finally {
    await redis.stop()
  }
  return out
}

// ---------------------------------------------------------------------------
// §10 cleanups at a saturated budget

const SATURATION = { limit: 10, windowMs: 2000 }
const SAT_TIMEOUT_MS = 8000
const SAT_VICTIM_TIMEOUT_MS = 1500

function percentile(sorted, p) {
  return sorted.length ? sorted[Math.min(sorted.length - 1, Math.ceil(sorted.length * p) - 1)] : NaN
}

async function saturationRun(label, n, total, store, rounds) {
  const { runSaturation } = await import('./lib/saturation.mjs')
  const emu = await emulator('child')
  const per = Math.floor(total / n)
  // The victims go first and fit in the first window with their creation, gate and stream
  // (3 requests each), so their children are alive when their timeouts fire.
  const victimsPer = Math.max(1, Math.floor(3 / n))
  const share = (round) => ({
    url: emu.url, apiKey: emu.apiKey, victims: victimsPer, echos: per - victimsPer,
    // One budget key for every process of a round: they share the store's window.
    pacing: { ...SATURATION, store, key: `saturation-${process.pid}-${n}-${round}` },
    timeoutMs: SAT_TIMEOUT_MS, victimTimeoutMs: SAT_VICTIM_TIMEOUT_MS, echoDelayMs: 300,
  })
  const results = []
  const survivorsSeen = []
  const roundEchoMs = []
  const t = now()
  for (let round = 0; round < rounds; round++) {
    if (n === 1) {
      results.push(await runSaturation({ ...share(round), sandbox: await emu.createSandbox() }))
    } else {
      const child = join(ROOT, 'benches', 'lib', 'saturation.mjs')
      const env = { ...process.env }
      delete env.CREATEOS_PACING_STORE
      const runs = []
      for (let i = 0; i < n; i++) {
        const arg = { ...share(round), sandbox: await emu.createSandbox() }
        runs.push(execFileP(process.execPath, [child, JSON.stringify(arg)], { env, timeout: 120_000 })
          .then(({ stdout }) => JSON.parse(stdout.trim().split('\n').pop())))
      }
      results.push(...await Promise.all(runs))
    }
    roundEchoMs.push(Math.max(...results.slice(-n).map((r) => r.echoMs)))
    // Every victim of the round has settled: whatever the emulator still runs survived.
    survivorsSeen.push(...await emu.livePids())
  }
  const ms = now() - t
  const survivors = [...new Set(survivorsSeen)]
  const victims = results.flatMap((r) => r.victims)
  const verdicts = victims.map((v) => v.verdictMs).sort((a, b) => a - b)
  const falseErrors = victims.filter((v) => v.kind === 'cleanupError').length
  const otherErrors = victims.filter((v) => v.kind === 'error' || v.kind === 'finished')
  const wrongOutput = victims.filter((v) => v.kind === 'timedOut' && v.stdout !== 'partial\n' && v.stdout !== '').length
  // A victim whose creation got no slot before its timeout ends as that timeout, nothing ran.
  const withChild = victims.filter((v) => v.stdout === 'partial\n').length
  const echosOk = results.reduce((a, r) => a + r.echosOk, 0)
  const echoFailures = results.flatMap((r) => r.echoFailures)
  const echoMs = roundEchoMs.reduce((a, x) => a + x, 0)
  const p50 = percentile(verdicts, 0.5)
  const p99 = percentile(verdicts, 0.99)
  const max = verdicts[verdicts.length - 1]
  const out = {
    label, processes: n, victims: victims.length, victimsThatRan: withChild, echos: echosOk + echoFailures.length, falseCleanupErrors: falseErrors,
    otherVictimErrors: otherErrors.map((v) => v.message || v.kind), wrongVictimOutput: wrongOutput, survivors: survivors.length,
    verdictMs: { p50, p99, max }, echosOk, echoFailures, echoMs, echoPerMin: echosOk / (echoMs / 60_000), ms,
  }
  const dl = `deadline ${SAT_TIMEOUT_MS} ms after the timeout; target p99 ≤ 5000 ms`
  row('10', `${label}: victims' verdict after their timeout`, stats(verdicts), 'ms',
    `p50 ${fmt(p50, 0)}, p99 ${fmt(p99, 0)}, max ${fmt(max, 0)} ms over ${victims.length} victims (${withChild} ran, printed 'partial'); ${dl}`, 0)
  row('10', `${label}: false cleanup errors`, stats([falseErrors]), '',
    `${falseErrors} of ${victims.length} (every victim was killable; target 0)${otherErrors.length ? `; ${otherErrors.length} other errors` : ''}`, 0)
  row('10', `${label}: survivors after every verdict`, stats([survivors.length]), 'pids', 'the emulator\'s live pids; target 0', 0)
  row('10', `${label}: new work throughput`, stats([out.echoPerMin]), 'cmd/min',
    `${echosOk} of ${out.echos} echos ok in ${fmt(echoMs / 1000, 1)} s (${rounds} round${rounds > 1 ? 's' : ''}) at ${SATURATION.limit} per ${SATURATION.windowMs} ms`, 0)
  if (survivors.length) {
    note(`§10 ${label}: processes alive after every verdict: ${survivors.join(', ')}`)
    for (const pid of survivors) { try { process.kill(pid, 'SIGKILL') } catch {} }
  }
  if (echoFailures.length) note(`§10 ${label}: echo failures: ${[...new Set(echoFailures)].slice(0, 3).join(' | ')}`)
  emulators.splice(emulators.indexOf(emu), 1)
  await emu.close()
  return out
}

async function saturation(opts) {
  const out = { runs: [] }
  const total = opts.saturation.commands
  log(`§10 saturation, in-process budget, ${total} commands`)
  out.runs.push(await saturationRun('in-process budget', 1, total, false, opts.saturation.rounds))
  const redis = await startRedis()
  if (!redis) {
    rows.push({ section: '10', metric: 'saturation, shared store', unit: '', note: 'redis-server not found: skipped' })
    return out
  }
  try {
    const n = opts.saturation.processes
    log(`§10 saturation, ${n} processes on one Redis store, ${total} commands`)
    out.runs.push(await saturationRun(`${n} processes, one Redis store`, n, total, redis.url, opts.saturation.rounds))
  } finally {
    await redis.stop()
  }
  return out
}

async function main() {
  const opts = parseArgs(process.argv.slice(2))
  const m = machine()
  process.stdout.write(
    `createos-execute bench${opts.quick ? ' (--quick)' : ''}: ${m.cpus} × ${m.cpuModel}, ${m.memGiB} GiB, node ${m.node}, ${m.os}` +
    `, load ${m.loadavgStart.join(' ')}; ${opts.runs} runs per row (median, min, max); execute via ${m.via}\n`)
  const baseline = opts.sections.has('1') ? prepareBaseline(opts.baseline) : { bin: null }
  let survivors = []
  const started = Date.now()
  try {
    if (opts.sections.has('1')) results.throughput = await throughput(opts, baseline)
    if (opts.sections.has('2')) results.memory = await memory(opts)
    if (opts.sections.has('3')) results.requests = await requestsPerCommand(opts)
    if (opts.sections.has('4')) results.latency = await echoLatency(opts)
    if (opts.sections.has('5')) results.concurrent = await concurrent(opts)
    if (opts.sections.has('6')) results.quietWaiting = await quietWaiting(opts)
    if (opts.sections.has('7')) results.wan = await wan(opts)
    if (opts.sections.has('8')) results.sharedPacing = await sharedPacing(opts)
    if (opts.sections.has('9')) results.binaryOutput = await binaryOutput(opts)
    if (opts.sections.has('10')) results.saturation = await saturation(opts)
    if (opts.sections.has('11')) results.transports = await transports(opts, { emulator, row, note, log, root: ROOT })
    if (opts.sections.has('12')) { // the shared budget through store faults (benches/pacing-faults.mjs)
      const f = await (await import('./pacing-faults.mjs')).pacingFaults({ quick: opts.quick, log: (m) => log(`§12 ${m}`) })
      rows.push(...f.rows)
      results.pacingFaults = f.results
    }
    if (opts.sections.has('13')) results.session = await sessionBench(opts, { emulator, row, note, log })
    if (opts.sections.has('14')) results.inflight = await inflightBench(opts, { emulator, row, note, log })
  } finally {
    survivors = await closeAll()
  }
  if (survivors.length) note(`processes still alive when the emulators closed: ${survivors.join(', ')}`)
  m.loadavgEnd = os.loadavg().map((x) => +x.toFixed(2))
  const table = renderTable(rows)
  process.stdout.write(`\n${table}\n\n`)
  process.stdout.write(`MB = 10^6 bytes of decoded output. Emulator: child process unless the row says in-process. Load at end: ${m.loadavgEnd.join(' ')}. ${((Date.now() - started) / 1000).toFixed(0)} s.\n`)
  if (anomalies.length) process.stdout.write(`Notes:\n${anomalies.map((a) => `  - ${a}`).join('\n')}\n`)
  mkdirSync(join(opts.out, '..'), { recursive: true })
  const json = {
    machine: m,
    options: { ...opts, sections: [...opts.sections] },
    startedAt: new Date(started).toISOString(),
    seconds: (Date.now() - started) / 1000,
    table: rows,
    results,
    notes: anomalies,
  }
  writeFileSync(opts.out, `${JSON.stringify(json, null, 2)}\n`)
  process.stdout.write(`Wrote ${opts.out}\n`)
}

main().then(() => {
  // The native runtime may keep handles; the run is over.
  setTimeout(() => process.exit(process.exitCode || 0), 100).unref()
}, async (error) => {
  process.stderr.write(`bench failed: ${error && error.stack ? error.stack : error}\n`)
  await closeAll().catch(() => {})
  process.exit(1)
})
