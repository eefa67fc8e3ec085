#!/usr/bin/env node
// Chaos soak (issue 6, part 3): `npm run soak` (≤ 10 min, ≥ 1,000 commands) or
// `npm run soak -- --quick` (about a minute, for CI).
//
// Runs commands through the package's public `execute` (index.js) against in-process
// emulators — one per worker, because fault rules are global to an emulator and each worker
// runs its calls one after another — with a random fault per call: disconnects, sequence
// gaps, 5xx, 429, slow answers, lost creation answers, stubborn trees, timeouts,
// cancellations, and bursts of concurrent calls on one sandbox.
//
// After every call it checks:
//   - the call settled within its deadline plus the cleanup deadline (plus a fixed slack);
//   - a result holds exactly the bytes the process wrote (emu.processOutput, decoded as
//     UTF-8), or says it truncated; a timed-out result holds a prefix of them;
//   - a failure is a named error (CreateosApiError, CreateosCleanupError, or an Error with a
//     known code and a known fixed message);
//   - CreateosCleanupError appears exactly when a process really survived (emu.livePids()
//     right after the call), never otherwise; without it, nothing survives the call.
// At the end: emu.livePids() is empty after close, the heap (after gc) and Node's open
// handles, and this process's open sockets (/proc/self/fd), are back near their baseline.
//
// Prints counts by scenario and outcome and `N passed, N failed` (passed = calls with no
// violation); exits 1 on any violation.
//
// Options: --quick | --calls N | --minutes M | --workers W | --seed S | --verbose | --session
// | --profile full|documented
// (--session: every call in session mode, checked by scripts/soak-session.mjs; --profile: the
// emulators' profile, default CREATEOS_EMULATOR_PROFILE or full: `documented` terminates by
// process group only, the least the API promises)
import { createRequire } from 'node:module'
import { spawnSync } from 'node:child_process'
import { readdirSync, readlinkSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

// The heap check needs global.gc: re-run with --expose-gc when it is missing.
if (typeof global.gc !== 'function') {
  const r = spawnSync(process.execPath, ['--expose-gc', fileURLToPath(import.meta.url), ...process.argv.slice(2)], { stdio: 'inherit' })
  process.exit(r.status ?? 1)
}

const require = createRequire(import.meta.url)
const lib = require('../index.js')
const { startEmulator } = require('createos-execute-emulator')
const { execute, CreateosApiError, CreateosCleanupError, isCreateosCleanupError } = lib
const soakSession = await import('./soak-session.mjs')

// ---------------------------------------------------------------------------
// Options

const argv = process.argv.slice(2)
const flag = (name) => argv.includes(name)
const opt = (name, dflt) => {
  const i = argv.indexOf(name)
  return i >= 0 && i + 1 < argv.length ? Number(argv[i + 1]) : dflt
}
const QUICK = flag('--quick')
const VERBOSE = flag('--verbose')
const SESSION = flag('--session')
const PROFILE = (() => {
  const i = argv.indexOf('--profile')
  const p = i >= 0 ? argv[i + 1] : (process.env.CREATEOS_EMULATOR_PROFILE || 'full')
  if (p !== 'full' && p !== 'documented') throw new Error(`--profile ${p}: full or documented`)
  return p
})()
const TARGET_CALLS = opt('--calls', QUICK ? 400 : 3000)
const MAX_MS = opt('--minutes', QUICK ? 1.5 : 9) * 60_000
const WORKERS = opt('--workers', 3)
const SEED = opt('--seed', Date.now() % 2 ** 31)

const REQUEST_TIMEOUT_MS = 4000 // client.config.timeoutMs (per request)
const CLEANUP_DEADLINE_MS = 2500 // client.config.cleanupDeadlineMs
const CALL_DEADLINE_MS = 15_000 // every call's AbortSignal.timeout unless the scenario sets a shorter one
const SLACK_MS = 2000 // scheduling, staged-file removal, reaping

// ---------------------------------------------------------------------------
// Seeded randomness (mulberry32): a failing run can be repeated with --seed.

function rng(seed) {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}
const rand = rng(SEED)
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1))
const pick = (xs) => xs[Math.floor(rand() * xs.length)]
function weighted(table) {
  const total = table.reduce((s, [w]) => s + w, 0)
  let r = rand() * total
  for (const [w, v] of table) {
    if ((r -= w) < 0) return v
  }
  return table[table.length - 1][1]
}

// ---------------------------------------------------------------------------
// Commands: bash scripts whose exact output bytes are recorded by the emulator.

const TEXTS = ['hello', 'é', '€', '😀', 'a😀b', 'x'.repeat(100), '\n', 'line\r\n', '\t', "it's", '"q"', '\\', '日本語']
const RAW = [[0xff], [0xe2, 0x82], [0xf0, 0x9f, 0x98], [0xc0, 0xaf], [0xed, 0xa0, 0x80]]

/** bash `printf` format that writes `bytes` exactly. */
function printfFormat(bytes) {
  let s = ''
  for (const b of bytes) s += '\\x' + b.toString(16).padStart(2, '0')
  return `'${s}'`
}

function randomBytes(maxParts) {
  const parts = []
  for (let i = int(1, maxParts); i > 0; i--) {
    parts.push(rand() < 0.12 ? Buffer.from(pick(RAW)) : Buffer.from(pick(TEXTS), 'utf8'))
  }
  return Buffer.concat(parts)
}

/**
 * A script writing several chunks to stdout and stderr, with short pauses so the output
 * spans several frames; sometimes one large block. `tailSleep` keeps it running after.
 */
function outputScript({ chunks = int(1, 6), big = rand() < 0.1, tailSleep = 0 } = {}) {
  const lines = []
  for (let i = 0; i < chunks; i++) {
    const fd = rand() < 0.25 ? ' >&2' : ''
    lines.push(`printf ${printfFormat(randomBytes(5))}${fd}`)
    if (rand() < 0.6) lines.push(`sleep 0.0${int(1, 3)}`)
  }
  if (big) lines.push(`head -c ${int(70_000, 300_000)} /dev/zero | tr '\\0' 'z'`)
  if (tailSleep) lines.push(`sleep ${tailSleep}`)
  return lines.join('\n')
}

// ---------------------------------------------------------------------------
// Scenarios: faults + how the call is made + what may come out of it.
//
// expect: 'ok'       a complete result with exit code 0 and exact output
//         'timedOut' a timedOut result (output a prefix)
//         'any'      a complete result, a timed-out one, or a named error
//         'cleanup'  CreateosCleanupError (a process really survives: stubborn tree)

const FAULT_ROUTES = ['putFile', 'createProcess', 'connect', 'getProcess', 'deleteProcess', 'wait', 'listProcesses', 'exec', ...(SESSION ? ['input'] : [])]

const SCENARIOS = [
  [20, 'clean', () => ({ script: outputScript(), expect: 'ok' })],
  [6, 'stdin', () => {
    const stdin = randomBytes(8).toString('utf8').replace(/\0/g, '')
    return { command: 'cat', args: [], stdin, expect: 'ok', wantStdout: stdin }
  }],
  [12, 'disconnect', () => ({
    faults: [{ route: 'connect', times: int(1, 2), action: { kind: 'dropAfterFrames', frames: int(0, 3) } }],
    script: outputScript({ chunks: int(2, 6) }),
    expect: 'ok',
  })],
  // A gap ends the follow with a named error (fail closed); a result must still be exact.
  [8, 'gap', () => ({
    faults: [{ route: 'connect', times: 1, action: { kind: 'gapAfterFrames', frames: int(0, 2) } }],
    script: outputScript({ chunks: int(2, 6) }),
    expect: 'any',
  })],
  [10, '5xx', () => ({
    faults: [{ route: pick(FAULT_ROUTES), times: int(1, 2), action: { kind: 'status', status: pick([500, 502, 503, 504]) } }],
    script: outputScript(),
    stdin: rand() < 0.3 ? 'input\n' : undefined,
    expect: 'any',
  })],
  [6, '429', () => ({
    faults: [{ route: pick(['putFile', 'createProcess', 'connect']), times: 1, action: { kind: 'status', status: 429 } }],
    script: outputScript(),
    stdin: rand() < 0.5 ? 'input\n' : undefined,
    expect: 'ok',
  })],
  [8, 'slow', () => ({
    faults: [{ route: pick(['putFile', 'createProcess', 'connect', 'getProcess']), times: int(1, 2), action: { kind: 'delay', ms: int(50, 600) } }],
    script: outputScript(),
    expect: 'ok',
  })],
  [6, 'lostCreation', () => ({
    faults: [{ route: 'createProcess', times: 1, action: { kind: 'status', status: 502, afterHandler: true } }],
    script: outputScript({ tailSleep: rand() < 0.5 ? 30 : 0 }),
    expect: 'any',
  })],
  // `treeExitedFalse` holds the tree's "not exited" answer until close() even when a later
  // DELETE kills it, so only the forever variant (nothing killed: survival is real) is used;
  // a once-stubborn tree is `treeExitsAfter`.
  [3, 'stubborn', () => ({
    faults: [{ route: 'deleteProcess', action: { kind: 'treeExitedFalse' } }],
    script: outputScript({ chunks: 1, tailSleep: 60 }),
    timeoutMs: int(200, 700),
    expect: 'cleanup',
  })],
  [4, 'treeExitsAfter', () => ({
    faults: [{ route: 'deleteProcess', times: 1, action: { kind: 'treeExitsAfter', ms: int(100, 600) } }],
    script: outputScript({ chunks: 1, tailSleep: 60 }),
    timeoutMs: int(200, 700),
    expect: 'timedOut',
  })],
  [6, 'timeout', () => ({
    script: outputScript({ chunks: int(1, 3), tailSleep: 60 }),
    timeoutMs: int(150, 1200),
    expect: 'timedOut',
  })],
  [6, 'cancel', () => ({
    script: outputScript({ chunks: int(1, 4), tailSleep: rand() < 0.5 ? 0.3 : 0 }),
    abortAfterMs: int(0, 500),
    expect: 'any',
  })],
  [5, 'concurrent', () => ({ concurrent: int(2, 5), expect: 'ok' })],
]

// ---------------------------------------------------------------------------
// Checks

// CREATEOS_NOT_STARTED: a gate upload refused (e.g. a 500 on putFile) — the command never ran,
// and its process was ended and proven gone.
const KNOWN_CODES = new Set(['CREATEOS_CANCELLED', 'CREATEOS_ERROR', 'CREATEOS_NOT_STARTED'])
const KNOWN_MESSAGES = new Set([
  'CreateOS command was cancelled.',
  'CreateOS command did not start; its start gate could not be opened.',
  'CreateOS connection failed.',
  'CreateOS answered with a redirect, which is refused.',
  'CreateOS returned invalid JSON.',
  'CreateOS returned an unsuccessful response.',
  'CreateOS returned an invalid response.',
  'CreateOS returned an invalid resource ID.',
  'CreateOS process output connection failed.',
  'CreateOS process stream ended before all output could be replayed.',
  'CreateOS process output journal is invalid.',
  'CreateOS process output has a sequence gap.',
  'CreateOS process output was evicted before it could be read.',
  'CreateOS process stream reported an error.',
  ...(SESSION ? ["CreateOS session supervisor ended before the command's exit status.", 'CreateOS session marker is invalid.'] : []),
])
const API_MESSAGE = /^CreateOS request failed \(HTTP [1-5]\d\d\) during [a-z ]+\.$/

/** null when `e` is a named error, else why not. */
function unnamed(e) {
  if (e instanceof CreateosCleanupError || isCreateosCleanupError(e)) {
    if (!['creation-unconfirmed', 'termination-unconfirmed'].includes(e.reason)) return `cleanup error with reason ${e.reason}`
    return null
  }
  if (e instanceof CreateosApiError) {
    return API_MESSAGE.test(e.message) && Number.isInteger(e.status) ? null : `odd API error: ${e.message}`
  }
  if (e instanceof Error && KNOWN_CODES.has(e.code) && KNOWN_MESSAGES.has(e.message)) return null
  return `unnamed error: ${e && e.name} ${e && e.code} ${JSON.stringify(e && e.message)}`
}

const decode = (buf) => (buf ? Buffer.from(buf).toString('utf8') : '')

async function waitNoSurvivors(emu, ms) {
  const until = Date.now() + ms
  for (;;) {
    const live = emu.livePids()
    if (live.length === 0 || Date.now() >= until) return live
    await sleep(25)
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** SIGKILLs what a stubborn-tree fault kept alive (each tree leads its own process group). */
async function killSurvivors(emu) {
  for (const pid of emu.livePids()) {
    try { process.kill(-pid, 'SIGKILL') } catch {}
    try { process.kill(pid, 'SIGKILL') } catch {}
  }
  return waitNoSurvivors(emu, 3000)
}

// ---------------------------------------------------------------------------
// One call

const counts = new Map() // "scenario outcome" → n
const bump = (k) => counts.set(k, (counts.get(k) || 0) + 1)
const violations = []
let calls = 0
let passed = 0

function outcomeOf(r) {
  if (r.error) {
    const e = r.error
    if (isCreateosCleanupError(e)) return `CreateosCleanupError(${e.reason})`
    if (e instanceof CreateosApiError) return `CreateosApiError(${e.status})`
    return `Error(${e.code || e.name})`
  }
  if (r.value.timedOut) return 'timedOut'
  return `exit ${r.value.exitCode}${r.value.metadata && r.value.metadata.outputTruncated ? ' truncated' : ''}`
}

function makeClient(emu) {
  return {
    config: {
      apiUrl: emu.url,
      timeoutMs: REQUEST_TIMEOUT_MS,
      pacing: 'off',
      cleanupGraceMs: [50, 200],
      cleanupDeadlineMs: CLEANUP_DEADLINE_MS,
      confirmPollMs: 300,
      ...(SESSION ? { session: { idleMs: 5000 } } : {}),
    },
    apiKey: emu.apiKey,
  }
}

/** Runs one execute and returns { value | error, ms, deadlineMs }. */
async function runOne(emu, sb, spec) {
  const deadlineMs = Math.min(spec.timeoutMs ?? CALL_DEADLINE_MS, spec.abortAfterMs ?? Infinity, CALL_DEADLINE_MS)
  const signals = [AbortSignal.timeout(spec.timeoutMs ?? CALL_DEADLINE_MS)]
  let timer
  if (spec.abortAfterMs !== undefined) {
    const ac = new AbortController()
    timer = setTimeout(() => ac.abort(new Error('soak cancel')), spec.abortAfterMs)
    signals.push(ac.signal)
  }
  const signal = signals.length === 1 ? signals[0] : AbortSignal.any(signals)
  const params = {
    lease: { providerLeaseId: sb },
    command: spec.command ?? '/bin/bash',
    args: spec.args ?? ['-c', spec.script],
  }
  if (spec.stdin !== undefined) params.stdin = spec.stdin
  let logged = 0
  const started = performance.now()
  const out = { deadlineMs }
  try {
    out.value = await execute(makeClient(emu), params, signal, (_stream, text) => { logged += text.length })
  } catch (e) {
    out.error = e
  } finally {
    clearTimeout(timer)
  }
  out.ms = performance.now() - started
  out.logged = logged
  return out
}

/** Checks one settled call; returns a list of violations (empty = passed). */
function checkResult(emu, sb, spec, r, expect) {
  const v = []
  const bound = r.deadlineMs + CLEANUP_DEADLINE_MS + SLACK_MS
  if (r.ms > bound) v.push(`settled after ${Math.round(r.ms)} ms > ${bound} ms`)
  if (r.error) {
    const why = unnamed(r.error)
    if (why) v.push(why)
    if (expect === 'ok' || expect === 'timedOut') v.push(`expected ${expect}, got ${outcomeOf(r)}: ${r.error.message}`)
    if (expect === 'cleanup' && !isCreateosCleanupError(r.error)) v.push(`expected CreateosCleanupError, got ${outcomeOf(r)}`)
    return v
  }
  const res = r.value
  const meta = res.metadata || {}
  if (expect === 'cleanup') v.push(`expected CreateosCleanupError, got ${outcomeOf(r)}`)
  if (expect === 'ok' && (res.timedOut || res.exitCode !== 0)) v.push(`expected exit 0, got ${outcomeOf(r)}`)
  if (expect === 'timedOut' && !res.timedOut) v.push(`expected timedOut, got ${outcomeOf(r)}`)
  if (!meta.processId) {
    // Only a call timed out before anything was created has no process id.
    if (!res.timedOut) v.push('a complete result without metadata.processId')
    else if (res.stdout !== '' || res.stderr !== '') v.push('output without a process')
    return v
  }
  const rec = emu.processOutput(sb, meta.processId)
  if (!rec) {
    v.push(`emulator has no output record for ${meta.processId}`)
    return v
  }
  if (SESSION) {
    v.push(...soakSession.checkOutput(rec, res))
    if (spec.wantStdout !== undefined && !res.timedOut && res.stdout !== spec.wantStdout) v.push('stdout differs from stdin')
    return v
  }
  for (const stream of ['stdout', 'stderr']) {
    const want = decode(rec[stream])
    const got = res[stream]
    if (typeof got !== 'string') {
      v.push(`${stream} is not a string`)
      continue
    }
    if (meta.outputTruncated) {
      if (!want.endsWith(got.replace(/^\uFFFD/, ''))) v.push(`${stream}: truncated output is not a tail of what the process wrote`)
    } else if (res.timedOut) {
      // What arrived before the timeout; a sequence cut at the end may be U+FFFD.
      const g = got.replace(/\uFFFD$/, '')
      if (!want.startsWith(g)) v.push(`${stream}: timed-out output is not a prefix (${got.length} vs ${want.length} chars)`)
    } else if (got !== want) {
      v.push(`${stream}: result differs from the bytes written (${got.length} vs ${want.length} chars)`)
    }
  }
  if (spec.wantStdout !== undefined && !res.timedOut && res.stdout !== spec.wantStdout) v.push('stdout differs from stdin')
  return v
}

async function record(emu, name, spec, results, checks) {
  // Survival: right after the call, before anything else can reap or kill. In session mode
  // idle supervisors live by design (the proof of an abnormal end is checked in scenarioCall).
  const all = emu.livePids()
  const supervisors = SESSION ? soakSession.supervisorPids(all) : []
  const liveNow = all.filter((pid) => !supervisors.includes(pid))
  const cleanupErrors = results.filter((r) => r.error && isCreateosCleanupError(r.error))
  let live = liveNow
  if (cleanupErrors.length === 0 && liveNow.length > 0) {
    // A finished tree is declared exited after two /proc scans (~50 ms): give it time.
    live = await waitNoSurvivors(emu, 1500)
    if (SESSION) live = live.filter((pid) => !soakSession.supervisorPids(live).includes(pid))
  }
  const perCall = checks.map((c) => [...c])
  if (cleanupErrors.length > 0 && liveNow.length === 0) {
    for (const [i, r] of results.entries()) {
      if (r.error && isCreateosCleanupError(r.error)) {
        perCall[i].push(`CreateosCleanupError(${r.error.reason}) but no process survived: ${JSON.stringify(r.error.attempts)}`)
      }
    }
  }
  if (cleanupErrors.length === 0 && live.length > 0) {
    perCall[0].push(`process(es) ${live.join(',')} survived without a CreateosCleanupError`)
  }
  for (const [i, r] of results.entries()) {
    calls++
    bump(`${name.padEnd(15)} ${outcomeOf(r)}`)
    if (perCall[i].length === 0) {
      passed++
    } else {
      violations.push({ scenario: name, spec: { ...spec, script: spec.script && spec.script.slice(0, 300) }, outcome: outcomeOf(r), ms: Math.round(r.ms), problems: perCall[i] })
      if (VERBOSE || violations.length <= 20) {
        console.error(`VIOLATION [${name}] ${outcomeOf(r)} in ${Math.round(r.ms)} ms: ${perCall[i].join('; ')}`)
      }
    }
  }
  if (liveNow.length > 0 || live.length > 0 || (SESSION && cleanupErrors.length > 0)) {
    emu.clearFaults()
    const left = await killSurvivors(emu)
    if (left.length) throw new Error(`could not kill survivors ${left.join(',')}`)
    return true
  }
  return false
}

async function scenarioCall(emu, sb, name, make) {
  const spec = make()
  emu.clearFaults()
  if (spec.concurrent) {
    const specs = Array.from({ length: spec.concurrent }, () => ({ script: outputScript(), stdin: rand() < 0.3 ? 'in\n' : undefined }))
    const results = await Promise.all(specs.map((s) => runOne(emu, sb, s)))
    const checks = results.map((r, i) => checkResult(emu, sb, specs[i], r, 'ok'))
    return record(emu, name, spec, results, checks)
  }
  const before = SESSION ? await soakSession.supervisorsOf(emu, sb) : null
  const from = SESSION ? emu.requests().length : 0
  for (const f of spec.faults || []) emu.addFault(f)
  const r = await runOne(emu, sb, spec)
  emu.clearFaults()
  const checks = checkResult(emu, sb, spec, r, spec.expect)
  const abnormal = r.error || r.value.timedOut || (r.value.metadata && r.value.metadata.containment === 'provider')
  if (SESSION && abnormal && !(r.error && isCreateosCleanupError(r.error))) {
    checks.push(...soakSession.checkProof(before, await soakSession.supervisorsOf(emu, sb), r.value, emu.requests().slice(from)))
  }
  return record(emu, name, spec, [r], [checks])
}

// ---------------------------------------------------------------------------
// Baselines

function socketFds() {
  let n = 0
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (readlinkSync(`/proc/self/fd/${fd}`).startsWith('socket:')) n++
    } catch {}
  }
  return n
}

function resources() {
  const m = new Map()
  for (const r of process.getActiveResourcesInfo()) m.set(r, (m.get(r) || 0) + 1)
  return m
}

async function heapUsed() {
  for (let i = 0; i < 3; i++) {
    global.gc()
    await sleep(20)
  }
  return process.memoryUsage().heapUsed
}

// ---------------------------------------------------------------------------
// Main

async function worker(id, deadline, startedAt, emus) {
  const emu = await startEmulator({ rateLimitPerMinute: null, profile: PROFILE })
  emus.push(emu)
  const sandboxes = [emu.createSandbox(), emu.createSandbox()]
  // Session mode: supervisors the harness killed are replaced with fresh sandboxes (the
  // destroy ends what the client still holds), and every sandbox is destroyed at the end.
  const renew = async () => {
    for (const [i, sb] of sandboxes.entries()) {
      await lib.destroySandbox(makeClient(emu), sb).catch(() => {})
      sandboxes[i] = emu.createSandbox()
    }
  }
  while (calls < TARGET_CALLS && Date.now() < deadline) {
    const [, name, make] = weighted(SCENARIOS.map((s) => [s[0], s]))
    try {
      const killed = await scenarioCall(emu, pick(sandboxes), name, make)
      if (SESSION && killed) await renew()
    } catch (e) {
      violations.push({ scenario: name, problems: [`soak harness: ${e && e.stack}`] })
      console.error(`HARNESS [${name}] ${e && e.stack}`)
    }
    if (id === 0 && calls > 0 && calls % 100 < 1) {
      console.log(`.. ${calls} calls, ${violations.length} violations, ${Math.round((Date.now() - startedAt) / 1000)} s`)
    }
  }
  if (SESSION) await renew()
}

async function main() {
  console.log(`soak${SESSION ? ' (session mode)' : ''}, ${PROFILE} profile: seed ${SEED}, ${WORKERS} workers, target ${TARGET_CALLS} calls, at most ${Math.round(MAX_MS / 1000)} s${QUICK ? ' (quick)' : ''}`)
  const baseSockets = socketFds()
  const baseResources = resources()
  // Warm-up (loads the addon, builds the HTTP client) before the heap baseline.
  {
    const emu = await startEmulator({ rateLimitPerMinute: null, profile: PROFILE })
    const sb = emu.createSandbox()
    for (let i = 0; i < 5; i++) await execute(makeClient(emu), { lease: { providerLeaseId: sb }, command: 'true' })
    await emu.close()
  }
  const baseHeap = await heapUsed()

  const startedAt = Date.now()
  const deadline = startedAt + MAX_MS
  const emus = []
  await Promise.all(Array.from({ length: WORKERS }, (_, i) => worker(i, deadline, startedAt, emus)))
  const elapsed = (Date.now() - startedAt) / 1000

  const endProblems = []
  for (const emu of emus) {
    await emu.close()
    const live = emu.livePids()
    if (live.length) endProblems.push(`emulator left pids ${live.join(',')} alive after close()`)
  }
  // Pooled keep-alive connections see the emulators go away; give them a moment.
  let sockets = socketFds()
  for (let i = 0; i < 40 && sockets > baseSockets; i++) {
    await sleep(100)
    sockets = socketFds()
  }
  if (sockets > baseSockets + 2) endProblems.push(`open sockets ${sockets} vs baseline ${baseSockets}`)
  await sleep(50)
  const endResources = resources()
  for (const [kind, n] of endResources) {
    const base = baseResources.get(kind) || 0
    if (n > base + (kind === 'Timeout' ? 2 : 0)) endProblems.push(`open ${kind} handles ${n} vs baseline ${base}`)
  }
  const heap = await heapUsed()
  const heapGrowthMb = (heap - baseHeap) / 2 ** 20
  if (heapGrowthMb > 16) endProblems.push(`heap grew ${heapGrowthMb.toFixed(1)} MiB (baseline ${(baseHeap / 2 ** 20).toFixed(1)} MiB)`)

  console.log('\noutcomes by scenario:')
  for (const [k, n] of [...counts].sort()) console.log(`  ${String(n).padStart(5)}  ${k}`)
  console.log(`\n${calls} calls in ${elapsed.toFixed(0)} s (${(calls / elapsed).toFixed(1)}/s); ` +
    `heap ${(baseHeap / 2 ** 20).toFixed(1)} → ${(heap / 2 ** 20).toFixed(1)} MiB; sockets ${baseSockets} → ${sockets}; ` +
    `handles ${[...endResources].map(([k, n]) => `${k}:${n}`).join(' ') || 'none'}`)
  if (endProblems.length) {
    console.log('end-of-run violations:')
    for (const p of endProblems) console.log(`  ${p}`)
  }
  if (violations.length) {
    console.log(`\n${violations.length} violation(s); first ones:`)
    for (const v of violations.slice(0, 10)) console.log('  ' + JSON.stringify(v).slice(0, 1200))
  }
  const failed = calls - passed
  console.log(`\n${passed} passed, ${failed} failed`)
  if (calls < TARGET_CALLS && !QUICK) console.log(`(only ${calls} of ${TARGET_CALLS} calls ran in the time limit)`)
  const harness = violations.filter((v) => !v.outcome).length
  if (harness) console.log(`${harness} harness error(s)`)
  process.exitCode = failed > 0 || endProblems.length > 0 || harness > 0 ? 1 : 0
}

main().catch((e) => {
  console.error(e)
  process.exitCode = 1
})
