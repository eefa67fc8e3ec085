// One partition scenario, run by __test__/partition.test.mjs inside a private network namespace
// (`unshare -n` / `unshare -rn`): brings the namespace's loopback up, starts the emulator on it,
// runs one command through `execute` while nftables drops every packet to and from the
// emulator's port (a blackhole: no RST, no FIN), or while tc limits the link, and prints one
// JSON line with what happened. The parent asserts on it.
//
//   node __test__/partition-child.mjs <case>
import { execFileSync, spawn } from 'node:child_process'
import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import { isAlive } from './proc.mjs'

const require = createRequire(import.meta.url)
const { execute, isCreateosCleanupError } = require('../index.js')
const { startEmulator } = require('createos-execute-emulator')

const CASE = process.argv[2]
const TIMEOUT_MS = 8000 // the client's timeoutMs; the cleanup deadline is min(timeoutMs, 30000)
const CALLER_TIMEOUT_MS = 1500
const HEAL_AFTER_MS = 4000
const BULK_LINES = 524288 // 16-byte lines: 8 MiB
const TABLE = 'createos_partition'
const WATCHDOG_MS = CASE === 'slow-link' ? 170_000 : 60_000

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const now = () => performance.now()

function sh(cmd, args, input) {
  return execFileSync(cmd, args, { input, stdio: ['pipe', 'pipe', 'pipe'], timeout: 10_000 }).toString()
}

// ---------------------------------------------------------------------------
// The link

let port = 0
let emuReadyMs = 0
let blackholed = false
const events = []
const t0 = now()
const mark = (what) => events.push({ what, atMs: Math.round(now() - t0) })

function setupLink() {
  sh('ip', ['link', 'set', 'lo', 'up'])
  if (CASE === 'slow-link') {
    // tbf passes no packet larger than its bucket: lo's 64 KiB MTU would stall every segment.
    sh('ip', ['link', 'set', 'lo', 'mtu', '1500'])
    sh('tc', ['qdisc', 'add', 'dev', 'lo', 'root', 'tbf', 'rate', '1mbit', 'burst', '16kb', 'latency', '200ms'])
    mark('tbf 1mbit')
  }
  sh('nft', ['-f', '-'], `table inet ${TABLE} {
  chain input { type filter hook input priority 0; policy accept; }
  chain output { type filter hook output priority 0; policy accept; }
}
`)
}

/** Drops every packet to or from the emulator's port, both directions, on both hooks. */
function blackhole() {
  const rules = []
  for (const chain of ['input', 'output']) {
    for (const dir of ['dport', 'sport']) rules.push(`add rule inet ${TABLE} ${chain} tcp ${dir} ${port} drop`)
  }
  sh('nft', ['-f', '-'], `${rules.join('\n')}\n`)
  blackholed = true
  mark('blackhole')
}

function heal() {
  if (!blackholed) return
  sh('nft', ['-f', '-'], `flush chain inet ${TABLE} input\nflush chain inet ${TABLE} output\n`)
  blackholed = false
  mark('heal')
}

// ---------------------------------------------------------------------------
// Observation

const seenPids = new Set()
let emu = null
/** Each pid the emulator started, as it is first seen: the parent ends it should this process die. */
function sample() {
  if (!emu) return
  for (const pid of emu.livePids()) {
    if (seenPids.has(pid)) continue
    seenPids.add(pid)
    process.stdout.write(`${JSON.stringify({ pid })}\n`)
  }
}

function rssNow() {
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync('/proc/self/status', 'utf8'))
  return m ? Number(m[1]) * 1024 : process.memoryUsage.rss()
}

function requestLog() {
  return emu.requests().map((r) => ({
    method: r.method, route: r.route, status: r.status, atMs: Math.round(r.atMs), connection: r.connection,
  }))
}

function describe(error) {
  return {
    name: error?.name,
    message: String(error?.message ?? error),
    code: error?.code,
    cleanup: isCreateosCleanupError(error),
    reason: error?.reason,
  }
}

/** Runs execute; resolves { value } or { error }, with when it settled and what was alive then. */
async function run(params, { signal, log, config = {} } = {}) {
  const client = { config: { apiUrl: emu.url, timeoutMs: TIMEOUT_MS, ...config }, apiKey: emu.apiKey }
  const started = now()
  let outcome
  try {
    outcome = { value: await execute(client, params, signal, log) }
  } catch (error) {
    outcome = { error: describe(error) }
  }
  outcome.settledMs = Math.round(now() - t0)
  outcome.durationMs = Math.round(now() - started)
  sample()
  outcome.liveAtVerdict = emu.livePids()
  outcome.requestsAtVerdict = requestLog()
  mark('verdict')
  return outcome
}

const bash = (sandboxId, script) => ({ lease: { providerLeaseId: sandboxId }, command: '/bin/bash', args: ['-c', script] })

/** A caller's timeout, as the plugin makes it; `onFire` runs first (before execute's own listener). */
function callerTimeout(ms, onFire) {
  const signal = AbortSignal.timeout(ms)
  const fired = { atMs: null }
  signal.addEventListener('abort', () => {
    fired.atMs = Math.round(now() - t0)
    mark('caller timeout')
    if (onFire) onFire()
  }, { once: true })
  return { signal, fired }
}

/** Resolves once `log` has seen `text` (or after `ms`). */
function waitForOutput(state, text, ms = 10_000) {
  return new Promise((resolve) => {
    const end = now() + ms
    const tick = () => {
      if (state.out.includes(text) || now() > end) resolve(state.out.includes(text))
      else setTimeout(tick, 5)
    }
    tick()
  })
}

function collector() {
  const state = { out: '', err: '', chunkMs: [] }
  state.log = (stream, text) => {
    state.chunkMs.push(Math.round(now() - t0))
    if (stream === 'stdout') state.out += text
    else state.err += text
  }
  return state
}

// ---------------------------------------------------------------------------
// Cases

const CASES = {
  // A 4 s blackhole while output streams; it heals, the output is exact.
  async 'stream-heals'() {
    const sb = emu.createSandbox()
    const c = collector()
    const script = 'for i in $(seq 1 40); do echo line$i; sleep 0.1; done'
    const expected = Array.from({ length: 40 }, (_, i) => `line${i + 1}\n`).join('')
    const pending = run(bash(sb, script), { log: c.log })
    const seen = await waitForOutput(c, 'line3\n')
    blackhole()
    await sleep(HEAL_AFTER_MS)
    heal()
    const outcome = await pending
    return { outcome, expected, sawOutputFirst: seen, logged: c.out, chunkMs: c.chunkMs }
  },

  // The caller's timeout fires; the blackhole starts with it (before the first DELETE) and
  // heals 4 s later. The cleanup rides it out: timedOut, the output so far, nothing alive.
  async 'cleanup-heals'() {
    const sb = emu.createSandbox()
    const c = collector()
    let healAt = null
    const { signal, fired } = callerTimeout(CALLER_TIMEOUT_MS, () => {
      blackhole()
      healAt = setTimeout(heal, HEAL_AFTER_MS)
    })
    const outcome = await run(bash(sb, 'echo partial; exec sleep 30'), { signal, log: c.log })
    clearTimeout(healAt)
    return { outcome, expected: 'partial\n', firedMs: fired.atMs }
  },

  // The blackhole starts while the creation's answer is pending (the emulator holds the
  // POST for 1 s) and heals 4 s later: exact output, or an error that fails closed.
  async 'create-heals'() {
    const sb = emu.createSandbox()
    emu.addFault({ route: 'createProcess', times: 1, action: { kind: 'delay', ms: 1000 } })
    const c = collector()
    const pending = run(bash(sb, 'echo created'), { log: c.log })
    await sleep(300)
    blackhole()
    await sleep(HEAL_AFTER_MS)
    heal()
    const outcome = await pending
    return { outcome, expected: 'created\n' }
  },

  // A blackhole that never heals, from before the cleanup: the command runs, its output
  // arrives, then every packet is dropped; the caller's timeout fires 1.5 s after the start.
  async 'never-heals-before-cleanup'() {
    const sb = emu.createSandbox()
    const c = collector()
    const { signal, fired } = callerTimeout(CALLER_TIMEOUT_MS)
    const pending = run(bash(sb, 'echo partial; exec sleep 30'), { signal, log: c.log })
    const seen = await waitForOutput(c, 'partial\n')
    blackhole()
    const outcome = await pending
    return { outcome, expected: 'partial\n', firedMs: fired.atMs, sawOutputFirst: seen }
  },

  // A blackhole that never heals, starting with the caller's timeout (during the cleanup).
  async 'never-heals-during-cleanup'() {
    const sb = emu.createSandbox()
    const c = collector()
    const { signal, fired } = callerTimeout(CALLER_TIMEOUT_MS, blackhole)
    const outcome = await run(bash(sb, 'echo partial; exec sleep 30'), { signal, log: c.log })
    return { outcome, expected: 'partial\n', firedMs: fired.atMs }
  },

  // A blackhole that never heals, starting while the creation's answer is pending.
  async 'never-heals-create'() {
    const sb = emu.createSandbox()
    emu.addFault({ route: 'createProcess', times: 1, action: { kind: 'delay', ms: 1000 } })
    const c = collector()
    const { signal, fired } = callerTimeout(CALLER_TIMEOUT_MS)
    const pending = run(bash(sb, 'echo created; exec sleep 30'), { signal, log: c.log })
    await sleep(300)
    blackhole()
    const outcome = await pending
    return { outcome, expected: 'created\n', firedMs: fired.atMs }
  },

  // 8 MiB of output over a loopback limited to 1 Mbit/s (tc tbf): every byte reaches `log`
  // in order (hashed as it arrives, not kept), `stdout` is its exact tail, and the client's
  // resident memory stays bounded. The client runs in a process of its own (in this
  // namespace), so the emulator's copies of the output do not count.
  async 'slow-link'() {
    const sb = emu.createSandbox()
    const client = await new Promise((resolve, reject) => {
      const child = spawn(process.execPath, ['--expose-gc', fileURLToPath(import.meta.url), 'slow-link-client', emu.url, emu.apiKey, sb], {
        stdio: ['ignore', 'pipe', 'inherit'],
      })
      let out = ''
      child.stdout.on('data', (c) => { out += c })
      child.on('error', reject)
      child.on('exit', (code) => {
        try { resolve(JSON.parse(out)) } catch { reject(new Error(`the client exited ${code} without a report`)) }
      })
    })
    // The expected output, made after the run so it does not weigh on the measurement.
    const expected = createHash('sha256')
    let tail = ''
    for (let i = 1; i <= BULK_LINES; i += 4096) {
      let chunk = ''
      for (let j = i; j < i + 4096 && j <= BULK_LINES; j++) chunk += `${String(j).padStart(15, '0')}\n`
      expected.update(chunk)
      tail = (tail + chunk).slice(-4_194_304)
    }
    const { outcome } = client
    mark('verdict')
    sample()
    outcome.liveAtVerdict = emu.livePids()
    return {
      ...client,
      logExact: client.logHash === expected.digest('hex'),
      stdoutExact: outcome.value ? client.stdoutHash === createHash('sha256').update(tail).digest('hex') : null,
    }
  },
}

/** The client side of 'slow-link': one execute, its output hashed as it arrives, RSS sampled. */
async function slowLinkClient(url, apiKey, sb) {
  const hash = createHash('sha256')
  let bytes = 0
  let errChars = 0
  const log = (stream, text) => {
    if (stream === 'stdout') {
      hash.update(text)
      bytes += Buffer.byteLength(text)
    } else errChars += text.length
  }
  global.gc?.()
  const rssBefore = rssNow()
  let peak = rssBefore
  const sampler = setInterval(() => { peak = Math.max(peak, rssNow()) }, 25)
  const client = { config: { apiUrl: url, timeoutMs: TIMEOUT_MS }, apiKey }
  const started = now()
  let outcome
  try {
    outcome = { value: await execute(client, bash(sb, `seq -f '%015.0f' 1 ${BULK_LINES}`), undefined, log) }
  } catch (error) {
    outcome = { error: describe(error) }
  }
  outcome.durationMs = Math.round(now() - started)
  clearInterval(sampler)
  peak = Math.max(peak, rssNow())
  let stdoutHash = null
  if (outcome.value) {
    stdoutHash = createHash('sha256').update(outcome.value.stdout).digest('hex')
    outcome.value.stdout = `<${outcome.value.stdout.length} chars>`
  }
  process.stdout.write(`${JSON.stringify({ outcome, logBytes: bytes, logStderrChars: errChars, logHash: hash.digest('hex'), stdoutHash, rssBefore, rssPeak: peak })}\n`)
}

// ---------------------------------------------------------------------------

async function main() {
  if (CASE === 'slow-link-client') return slowLinkClient(...process.argv.slice(3))
  if (!CASES[CASE]) throw new Error(`unknown case ${CASE}; one of ${Object.keys(CASES).join(', ')}`)
  setupLink()
  // The slow link's 8 MiB outrun the default 1 MiB journal (the emulator does not slow the
  // process for a slow reader): a bigger one keeps it, so the client sees every byte.
  const journalBytes = CASE === 'slow-link' ? 16 * 1024 * 1024 : undefined
  emu = await startEmulator({ rateLimitPerMinute: null, journalBytes })
  emuReadyMs = Math.round(now() - t0)
  port = Number(new URL(emu.url).port)
  const sampler = setInterval(sample, 25)
  // A case that hangs ends here, healed and closed, before the parent's own bound.
  const watchdog = setTimeout(async () => {
    try { heal() } catch {}
    process.stdout.write(`${JSON.stringify({ case: CASE, crashed: `the case did not finish within ${WATCHDOG_MS} ms`, events })}\n`)
    await Promise.race([emu.close(), sleep(5000)]).catch(() => {})
    process.exit(2)
  }, WATCHDOG_MS)
  let report
  try {
    report = await CASES[CASE]()
  } finally {
    clearInterval(sampler)
    clearTimeout(watchdog)
    heal()
  }
  report.case = CASE
  report.emuReadyMs = emuReadyMs
  report.events = events
  report.requests = requestLog()
  sample()
  report.liveBeforeClose = emu.livePids()
  await emu.close()
  report.liveAfterClose = emu.livePids()
  report.seenPids = [...seenPids]
  // Whatever the emulator may have missed is ended here, by pid.
  const stragglers = report.seenPids.filter(isAlive)
  for (const pid of stragglers) {
    try { process.kill(pid, 'SIGKILL') } catch {}
  }
  report.stragglers = stragglers
  report.timeoutMs = TIMEOUT_MS
  report.cleanupDeadlineMs = Math.min(TIMEOUT_MS, 30_000)
  report.callerTimeoutMs = CALLER_TIMEOUT_MS
  process.stdout.write(`${JSON.stringify(report)}\n`)
}

main().then(() => process.exit(0), (error) => {
  try { heal() } catch {}
  process.stdout.write(`${JSON.stringify({ case: CASE, crashed: String(error?.stack ?? error) })}\n`)
  process.exit(1)
})
