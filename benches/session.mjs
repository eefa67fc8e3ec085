// §13 (session mode, docs/session.md), against the default mode in the same run:
//   - requests per command, amortised over N sequential echos (100; --quick: 20), counting
//     everything the emulator saw from the first command to the supervisor's proven end;
//   - a warm echo over TLS (h2) at 50 ms RTT: wall time and wall/RTT;
//   - commands per minute on a 300-per-minute budget: the budget scaled down in time (limit L
//     per W ms, L/W = 300 per 60 s), 4 callers issuing echos back to back for a few windows;
//   - 5 MiB of fast output with a 1 MiB journal: how many of 3 arrive complete (the tail).
// Targets (printed, never asserted): ≤ 1.2 req/cmd, ≤ 1.5 RTT, ≥ 200 commands per minute.
import { createRequire } from 'node:module'
import { startEmu } from './lib/emu.mjs'
import { fmt, stats } from './lib/stats.mjs'

const require = createRequire(import.meta.url)
// Session mode is index.js's (its config checks pass `session` on): loaded as a host does.
const lib = require('../index.js')
const now = () => performance.now()
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const echo = (sb) => ({ lease: { providerLeaseId: sb }, command: 'echo', args: ['hi'] })

const MODES = [['default', undefined], ['session', { idleMs: 2000 }]]

function clientOf(emu, session, extra = {}) {
  const config = { apiUrl: emu.url, timeoutMs: 60_000, ...extra }
  if (session) config.session = session
  return { config, apiKey: emu.apiKey }
}

/** Waits until the emulator runs nothing (the idle supervisor ended with its proof). */
async function drained(emu, ms = 20_000) {
  const end = Date.now() + ms
  while ((await emu.livePids()).length && Date.now() < end) await sleep(50)
}

export async function sessionBench(opts, { emulator, row, note, log }) {
  const out = {}
  const n = opts.quick ? 20 : 100
  // 1. Requests per command over n sequential echos.
  out.requests = {}
  for (const [mode, session] of MODES) {
    const emu = await emulator('child')
    const sb = await emu.createSandbox()
    const client = clientOf(emu, session, { pacing: 'off' })
    log(`§13 ${n} sequential echos, ${mode}`)
    await emu.clearRequests()
    for (let i = 0; i < n; i++) {
      const r = await lib.execute(client, echo(sb))
      if (r.exitCode !== 0 || r.stdout !== 'hi\n') note(`§13 ${mode}: exitCode ${r.exitCode}, stdout ${JSON.stringify(r.stdout)}`)
    }
    await drained(emu)
    await sleep(100)
    const reqs = (await emu.requests()).length
    out.requests[mode] = reqs / n
    row('13', `requests per command over ${n} sequential echos, ${mode}`, stats([reqs / n]), 'req', mode === 'session' ? `${reqs} requests in all, the supervisor's creation, stream and proven end included; target ≤ 1.2` : `${reqs} requests in all`, 2)
  }
  // 2. A warm echo over TLS (h2) at 50 ms RTT.
  out.wan = {}
  const rtt = 50
  const emu = await emulator('child', { tls: true, http2: true, rttMs: rtt })
  const sb = await emu.createSandbox()
  for (const [mode, session] of MODES) {
    const client = clientOf(emu, session && { idleMs: 60_000 }, { caCertPem: emu.caPem })
    log(`§13 warm echo over TLS at ${rtt} ms RTT, ${mode}`)
    const walls = []
    const reqs = []
    const runs = opts.quick ? 3 : 10
    for (let i = 0; i < runs + 1; i++) {
      await emu.clearRequests()
      const t = now()
      const r = await lib.execute(client, echo(sb))
      const ms = now() - t
      if (r.exitCode !== 0 || r.stdout !== 'hi\n') note(`§13 TLS ${mode}: exitCode ${r.exitCode}`)
      await sleep(20)
      if (i === 0) continue // warm-up: the connection (and, in session mode, the supervisor)
      walls.push(ms)
      reqs.push((await emu.requests()).length)
    }
    const s = stats(walls)
    out.wan[mode] = { wallMs: s, perRtt: s.median / rtt, requests: stats(reqs).median }
    row('13', `warm echo, TLS h2, RTT ${rtt} ms, ${mode}`, s, 'ms', `${fmt(s.median / rtt, 2)} RTT; ${fmt(stats(reqs).median, 0)} req/cmd${mode === 'session' ? '; target ≤ 1.5 RTT' : ''}`, 0)
  }
  await lib.destroySandbox(clientOf(emu, undefined, { caCertPem: emu.caPem }), sb)
  // 3. Commands per minute on a 300-per-minute budget, scaled in time.
  out.budget = {}
  const windowMs = opts.quick ? 2000 : 6000
  const limit = windowMs / 200 // 300 per 60 s
  const seconds = opts.quick ? 6 : 30
  for (const [mode, session] of MODES) {
    const e = await emulator('child')
    const s = await e.createSandbox()
    const client = clientOf(e, session && { idleMs: 60_000 }, { pacing: { limit, windowMs } })
    log(`§13 commands per minute at ${limit} per ${windowMs} ms, ${mode}, ${seconds} s`)
    let done = 0
    const end = now() + seconds * 1000
    const worker = async () => {
      while (now() < end) {
        const r = await lib.execute(client, echo(s), AbortSignal.timeout(Math.round(Math.max(1000, end - now() + 100)))).catch(() => null)
        if (r && !r.timedOut && r.exitCode === 0 && now() <= end) done++
      }
    }
    await Promise.all([worker(), worker(), worker(), worker()])
    const perMinute = (done * 60) / seconds
    out.budget[mode] = perMinute
    row('13', `commands per minute, budget 300/min (${limit} per ${windowMs} ms), 4 callers, ${mode}`, stats([perMinute]), 'cmd/min', mode === 'session' ? 'target ≥ 200' : 'about 75 expected', 0)
    await lib.destroySandbox(clientOf(e, undefined, { pacing: { limit, windowMs } }), s).catch((err) => note(`§13 destroy: ${err && err.message}`))
  }
  // 4. Fast output: 5 MiB from `head | tr` with the emulator's default 1 MiB journal, read
  // while it is written (evicted when the reader falls behind by a journal), 3 runs a mode.
  out.fast = {}
  const big = (sb) => ({ lease: { providerLeaseId: sb }, command: 'bash', args: ['-c', "head -c 5242880 /dev/zero | tr '\\0' a"] })
  for (const [mode, session] of MODES) {
    const e = await emulator('child')
    const s = await e.createSandbox()
    const client = clientOf(e, session && { idleMs: 60_000 }, { pacing: 'off' })
    log(`§13 5 MiB of fast output, ${mode}`)
    const runs = 3
    let complete = 0
    for (let i = 0; i < runs; i++) {
      const r = await lib.execute(client, big(s)).catch(() => null)
      if (r && r.exitCode === 0 && r.metadata.outputTruncated && r.stdout.length === 4_194_304) complete++
    }
    out.fast[mode] = complete
    row('13', `5 MiB of fast output, 1 MiB journal, ${mode}`, stats([complete]), `of ${runs}`, 'complete (the others evicted)', 0)
    await lib.destroySandbox(clientOf(e, undefined), s).catch((err) => note(`§13 destroy: ${err && err.message}`))
  }
  // 5. Abnormal ends on the documented profile (termination by process group only): a
  // timeout at 1.5 s of `echo partial; exec sleep 30`, an abort, an error frame while the
  // command runs, and a command that ignores SIGTERM; how many of N end with the default
  // mode's outcome (timedOut with `partial\n`, the cancellation, the stream error) with
  // nothing alive after, and the median time to the verdict.
  out.abnormal = {}
  const n5 = opts.quick ? 3 : 20
  const cases = {
    timeout: { script: 'echo partial; exec sleep 30', signal: () => AbortSignal.timeout(1500), ok: (r) => r && r.timedOut && r.stdout === 'partial\n' },
    abort: { script: 'echo partial; exec sleep 30', abortOnLog: true, ok: (r) => r instanceof Error && r.code === 'CREATEOS_CANCELLED' },
    errorFrame: {
      script: 'echo one; sleep 0.1; echo two; sleep 0.1; echo three; exec sleep 30',
      faults: [{ route: 'connect', times: 1, action: { kind: 'dropAfterFrames', frames: 2 } }, { route: 'connect', skip: 1, times: 1, action: { kind: 'errorFrame', error: 'boom' } }],
      ok: (r) => r instanceof Error && !lib.isCreateosCleanupError(r) && /stream reported an error/.test(r.message),
    },
    ignoresTerm: { script: "trap '' TERM; echo partial; sleep 30", signal: () => AbortSignal.timeout(1500), ok: (r) => r && r.timedOut && r.stdout === 'partial\n' },
  }
  for (const [mode, session] of MODES) {
    const e = await emulator('child', { profile: 'documented' })
    const client = clientOf(e, session && { idleMs: 60_000 }, { pacing: 'off', cleanupGraceMs: [1000, 5000] })
    for (const [name, c] of Object.entries(cases)) {
      log(`§13 documented profile, ${name}, ${mode}, ${n5} runs`)
      let good = 0
      const walls = []
      for (let i = 0; i < n5; i++) {
        const s = await e.createSandbox()
        await e.clearFaults()
        const ac = new AbortController()
        const signal = c.signal ? c.signal() : ac.signal
        // A fresh sandbox: a session's supervisor is created by this command, so the faults
        // hit its stream (the first connect breaks once output came, its reconnect answers
        // an error frame).
        for (const f of c.faults || []) await e.addFault(f)
        const t = now()
        const r = await lib.execute(client, { lease: { providerLeaseId: s }, command: 'bash', args: ['-c', c.script] }, signal,
          () => { if (c.abortOnLog) ac.abort() }).catch((err) => err)
        walls.push(now() - t)
        await e.clearFaults()
        const end = Date.now() + 1000
        let live = await e.livePids()
        while (live.length && Date.now() < end) { await sleep(20); live = await e.livePids() }
        if (c.ok(r) && live.length === 0) good++
        else note(`§13 documented ${name} ${mode}: ${r instanceof Error ? r.message : JSON.stringify(r && { timedOut: r.timedOut, stdout: r.stdout })}, ${live.length} alive`)
        await lib.destroySandbox(clientOf(e, undefined), s).catch(() => {})
      }
      out.abnormal[`${name} ${mode}`] = { good, of: n5, wallMs: stats(walls) }
      row('13', `documented profile: ${name}, ${mode}`, stats(walls), 'ms', `${good} of ${n5} with the default mode's outcome and nothing alive`, 0)
    }
  }
  return out
}
