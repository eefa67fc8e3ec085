#!/usr/bin/env node
// The shared request budget through store faults (a redis-server of its own; skipped when none
// is installed). Three host processes × four lanes of `waitForRequest` share one budget
// (12 starts per window) in Redis while the store:
//   stall    answers 200 ms late (SIGSTOP, SIGCONT 200 ms later) as the second window begins;
//   restart  is killed as the second window begins and restarted empty 300 ms later, same port;
//   outage   is killed for three windows, then restarted (each process keeps to its share);
//   phantoms one process queues 1,100 waiters, the store stops, every waiter is cancelled
//            (more releases than are owed per key), and the store comes back two windows later.
// For each fault: the most starts in any window (all processes' starts, as each caller saw
// them) as a multiple of the limit, and the longest wait of a fresh caller on the idle budget
// once the store answers again (three callers, one after another, after a window of quiet).
// The processes also note when each warned CREATEOS_PACING_STORE_RESTORED after the store's
// return. Nothing here asserts: the machine may be noisy.
//
//   node benches/pacing-faults.mjs [--quick]     (also §12 of benches/run.mjs)
// --quick: a window of 1 s instead of 3 s, and fewer windows per fault.
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { createRequire } from 'node:module'
import net from 'node:net'
import os from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

const require = createRequire(import.meta.url)
const ROOT = fileURLToPath(new URL('..', import.meta.url))
const SELF = fileURLToPath(import.meta.url)
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const wall = () => performance.timeOrigin + performance.now()
const LIMIT = 12
const PROCESSES = 3
const LANES = 4
const PHANTOM_WAITERS = 1100
/** Starts are stamped by each process's own clock (performance.timeOrigin + now): windows are
 *  counted this much shorter, so a few ms between two processes' clocks do not merge a window's
 *  burst with the next one's (the pacer lets a full window go at once, a window apart). The
 *  exact window is in the note. */
const CLOCKS_MS = 10

/** Sets the budget of `origin` (mode and store) without a request: `execute` with an aborted
 *  signal creates the client and sends nothing. */
async function configure(lib, origin, pacing) {
  await lib.execute({ config: { apiUrl: origin, timeoutMs: 30_000, pacing }, apiKey: 'k' },
    { lease: { providerLeaseId: 'sb' }, command: 'true' }, AbortSignal.abort()).catch(() => {})
}

// ---------------------------------------------------------------------------
// A host process: LANES lanes of waitForRequest until told to stop (stdin closes).

async function child(arg) {
  const lib = require(join(ROOT, 'index.js'))
  const { origin, pacing } = JSON.parse(arg)
  const warnings = []
  process.on('warning', (w) => { if (w.code) warnings.push([w.code, wall()]) })
  await configure(lib, origin, pacing)
  const stop = new AbortController()
  process.stdin.on('close', () => stop.abort())
  process.stdin.resume()
  const starts = []
  const lane = async () => {
    for (;;) {
      try {
        await lib.waitForRequest(origin, stop.signal)
      } catch {
        return
      }
      starts.push(wall())
    }
  }
  process.stdout.write('ready\n')
  await Promise.all(Array.from({ length: LANES }, lane))
  await new Promise((r) => setImmediate(r))
  process.stdout.write(`${JSON.stringify({ starts, warnings })}\n`)
}

function startChild(origin, pacing) {
  const env = { ...process.env }
  delete env.CREATEOS_PACING_STORE
  const proc = spawn(process.execPath, [SELF, '--child', JSON.stringify({ origin, pacing })], { env, stdio: ['pipe', 'pipe', 'inherit'] })
  let out = ''
  const ready = new Promise((resolve, reject) => {
    proc.stdout.on('data', (d) => {
      out += d
      if (out.includes('ready\n')) resolve()
    })
    proc.once('exit', (code) => reject(new Error(`bench child exited ${code}`)))
  })
  const done = new Promise((resolve, reject) => {
    proc.once('exit', (code) => {
      const last = out.trim().split('\n').pop()
      try {
        resolve(JSON.parse(last))
      } catch {
        reject(new Error(`bench child exited ${code} without its starts`))
      }
    })
  })
  done.catch(() => {})
  const killer = setTimeout(() => proc.kill('SIGKILL'), 120_000)
  return {
    ready,
    async finish() {
      proc.stdin.end()
      try {
        return await done
      } finally {
        clearTimeout(killer)
      }
    },
    kill() { if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL') },
  }
}

// ---------------------------------------------------------------------------
// The store: a redis-server of this bench, on a port that stays the same across restarts.

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer()
    s.once('error', reject)
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)) })
  })
}

async function redisServer() {
  const port = await freePort()
  const dir = mkdtempSync(join(os.tmpdir(), 'createos-bench-faults-'))
  const r = { url: `redis://127.0.0.1:${port}/0`, proc: null }
  r.start = async () => {
    const proc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir], { stdio: 'ignore' })
    await new Promise((resolve, reject) => { proc.once('spawn', resolve); proc.once('error', reject) })
    r.proc = proc
    for (let i = 0; i < 400; i++) {
      const up = await new Promise((resolve) => {
        const c = net.connect(port, '127.0.0.1', () => { c.end(); resolve(true) })
        c.once('error', () => resolve(false))
      })
      if (up) return
      await sleep(25)
    }
    throw new Error('redis-server did not start')
  }
  r.kill = async () => {
    const p = r.proc
    if (!p || p.exitCode !== null || p.signalCode !== null) return
    const gone = new Promise((resolve) => p.once('exit', resolve))
    process.kill(p.pid, 'SIGKILL')
    await gone
  }
  r.signal = (sig) => { if (r.proc) process.kill(r.proc.pid, sig) }
  r.close = async () => {
    try { r.signal('SIGCONT') } catch {}
    await r.kill()
    rmSync(dir, { recursive: true, force: true })
  }
  try {
    await r.start()
  } catch {
    rmSync(dir, { recursive: true, force: true })
    return null
  }
  return r
}

// ---------------------------------------------------------------------------
// Measures

function mostInWindow(starts, windowMs) {
  const at = [...starts].sort((a, b) => a - b)
  let best = 0
  let lo = 0
  for (let hi = 0; hi < at.length; hi++) {
    while (at[hi] - at[lo] >= windowMs) lo++
    best = Math.max(best, hi - lo + 1)
  }
  return best
}

/** A window of quiet, then three fresh callers one after another: the longest wait (ms). */
async function freshWait(lib, origin, windowMs) {
  await sleep(windowMs + 100)
  let longest = 0
  for (let i = 0; i < 3; i++) {
    const t = performance.now()
    await lib.waitForRequest(origin, AbortSignal.timeout(Math.max(30_000, windowMs * 20))).catch(() => {})
    longest = Math.max(longest, performance.now() - t)
  }
  return longest
}

async function fleetFault(lib, redis, name, windowMs, windows, fault) {
  const origin = `http://127.0.0.1:${await freePort()}`
  const pacing = { limit: LIMIT, windowMs, store: redis.url }
  const children = Array.from({ length: PROCESSES }, () => startChild(origin, pacing))
  try {
    await Promise.all(children.map((c) => c.ready))
    const t0 = wall()
    const returned = await fault(t0)
    await sleep(Math.max(0, t0 + windows * windowMs - wall()))
    const results = await Promise.all(children.map((c) => c.finish()))
    const starts = results.flatMap((r) => r.starts)
    if (process.env.FAULTS_DEBUG) {
      process.stderr.write(`${name}: returned at ${returned === undefined ? '-' : Math.round(returned - t0)} ms; starts (ms after the first window began) per process:\n`)
      for (const r of results) process.stderr.write(`  ${JSON.stringify(r.starts.map((x) => Math.round(x - t0)))}\n`)
    }
    const restored = results.map((r) => r.warnings.find(([code, at]) => code === 'CREATEOS_PACING_STORE_RESTORED' && at >= returned))
    const restoredMs = returned === undefined ? [] : restored.filter(Boolean).map(([, at]) => at - returned)
    await configure(lib, origin, pacing)
    const fresh = await freshWait(lib, origin, windowMs)
    return { name, starts: starts.length, most: mostInWindow(starts, windowMs - CLOCKS_MS), exact: mostInWindow(starts, windowMs), fresh, restoredMs, restoredOf: returned === undefined ? 0 : restored.length }
  } finally {
    for (const c of children) c.kill()
  }
}

async function phantomFault(lib, redis, windowMs) {
  const origin = `http://127.0.0.1:${await freePort()}`
  const pacing = { limit: 10, windowMs, store: redis.url }
  await configure(lib, origin, pacing)
  const starts = []
  const controllers = Array.from({ length: PHANTOM_WAITERS }, () => new AbortController())
  const waiters = []
  for (const c of controllers) {
    waiters.push(lib.waitForRequest(origin, c.signal).then(() => starts.push(wall()), () => {}))
    // Made a few at a time: a start is seen when it happens, not after the last call is made.
    if (waiters.length % 20 === 0) await new Promise((r) => setImmediate(r))
  }
  // Let every waiter reserve its slot in the store (ten per window, out to 110 windows).
  await sleep(1500)
  redis.signal('SIGSTOP')
  for (const c of controllers) c.abort()
  await Promise.all(waiters)
  await sleep(2 * windowMs)
  redis.signal('SIGCONT')
  const returned = wall()
  // The probe sees the store's return within about a second (its timer, at most 400 ms, and
  // a connection to a server that was stopped); the fresh callers come after that.
  await sleep(2000)
  const fresh = await freshWait(lib, origin, 0)
  return { name: `phantoms (${PHANTOM_WAITERS} waiters cancelled in an outage; limit 10)`, starts: starts.length, most: mostInWindow(starts, windowMs - CLOCKS_MS), exact: mostInWindow(starts, windowMs), fresh, restoredMs: [], restoredOf: 0, limit: 10, returned }
}

/** Runs every fault; returns bench rows ({ section, metric, median, unit, note, digits }). */
export async function pacingFaults({ quick = false, section = '12', log = () => {} } = {}) {
  const rows = []
  const redis = await redisServer()
  if (!redis) {
    rows.push({ section, metric: 'pacing through store faults', unit: '', note: 'redis-server not found: skipped' })
    return { rows, results: { skipped: 'redis-server not found' } }
  }
  const lib = require(join(ROOT, 'index.js'))
  const windowMs = quick ? 1000 : 3000
  const windows = quick ? 3 : 4
  const at = (t0, k) => sleep(Math.max(0, t0 + k * windowMs - 50 - wall()))
  const results = []
  try {
    log(`faults: stall 200 ms, window ${windowMs} ms`)
    results.push(await fleetFault(lib, redis, 'stall 200 ms (SIGSTOP/SIGCONT)', windowMs, windows, async (t0) => {
      await at(t0, 1)
      redis.signal('SIGSTOP')
      await sleep(200)
      redis.signal('SIGCONT')
      return undefined
    }))
    log('faults: restart 300 ms')
    results.push(await fleetFault(lib, redis, 'restart 300 ms (killed, same port, empty)', windowMs, windows, async (t0) => {
      await at(t0, 1)
      await redis.kill()
      await sleep(300)
      await redis.start()
      return wall()
    }))
    log('faults: outage of 3 windows')
    results.push(await fleetFault(lib, redis, `outage ${3 * windowMs} ms (killed, restarted empty)`, windowMs, windows + 3, async (t0) => {
      await at(t0, 1)
      await redis.kill()
      await sleep(3 * windowMs)
      await redis.start()
      return wall()
    }))
    log('faults: phantoms')
    results.push(await phantomFault(lib, redis, windowMs))
  } finally {
    await redis.close()
  }
  for (const r of results) {
    const limit = r.limit ?? LIMIT
    const who = r.limit ? '1 process' : `${PROCESSES} processes × ${LANES} lanes`
    rows.push({ section, metric: `${r.name}: most starts in any window`, median: r.most / limit, unit: '× limit', digits: 2,
      note: `${r.most} of ${limit} per ${windowMs} ms less ${CLOCKS_MS} ms for the clocks (${r.exact} in an exact window); ${r.starts} starts, ${who}; target ≤ ${((limit + 2) / limit).toFixed(2)}` })
    rows.push({ section, metric: `${r.name}: fresh caller's longest wait after`, median: r.fresh, unit: 'ms', digits: 0,
      note: `3 callers on the idle budget; target < ${windowMs} ms (one window)` })
    if (r.restoredOf) {
      rows.push({ section, metric: `${r.name}: STORE_RESTORED after the store's return`, median: r.restoredMs.length ? Math.max(...r.restoredMs) : null, unit: 'ms', digits: 0,
        note: `the latest of ${r.restoredMs.length} of ${r.restoredOf} processes, as the host sees it: the warning rides on the next call that settles (a lane waits up to a window for its slot); the probe's own time (≤ 2 s) is tested in pacing_redis.rs` })
    }
  }
  return { rows, results }
}

if (process.argv[2] === '--child') {
  await child(process.argv[3])
  process.exit(0)
} else if (process.argv[1] === SELF) {
  const quick = process.argv.includes('--quick')
  const t = Date.now()
  const { rows } = await pacingFaults({ quick, log: (m) => process.stderr.write(`[faults ${((Date.now() - t) / 1000).toFixed(1)}s] ${m}\n`) })
  for (const r of rows) {
    const v = r.median === null || r.median === undefined ? 'n/a' : r.median.toFixed(r.digits ?? 2)
    process.stdout.write(`${r.metric}: ${v} ${r.unit}  (${r.note})\n`)
  }
  process.stdout.write(`${((Date.now() - t) / 1000).toFixed(0)} s\n`)
  setTimeout(() => process.exit(0), 100).unref()
}
