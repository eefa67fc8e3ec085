// Issue 12: one request budget for every process, in a real Redis (redis-server started by
// this file on a free loopback port in a temp dir, ended by pid). Four Node processes × two
// worker threads run commands against one emulator whose own limiter enforces the budget.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import net from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { startEmu } from './helpers.mjs'

const CHILD = fileURLToPath(new URL('./pacing-child.mjs', import.meta.url))
const PROCESSES = 4
const THREADS = 2
/** The client's budget (30 starts per 2 s, shared) and the emulator's limit (90 per 3 s: twice
 *  the budget's rate). The pacer decides a start when it releases it; the emulator stamps it when its
 *  head arrives. A start released late (a starved child, scheduling, HTTP) arrives closer to
 *  the next window's starts. Starts in any 3 s of arrivals were released within 3 s + D, where
 *  D is the longest delay from release to arrival; the budget allows at most 30 × ⌈(3 + D) / 2⌉
 *  there, which is ≤ 90 for any D ≤ 3 s. The pacer lets a full window go at once, so the
 *  emulator's log is bursts of 30 every 2 s (30 within 60 ms on an idle machine, spread over
 *  ~800 ms in a cgroup of 0.3 CPU shared with a busy loop). With 30 per 1 s the tolerance was
 *  D ≤ 1 s, and CI's legs failed with 3 × 429 (200 ms margin) and 1 × 429 (1000 ms margin).
 *  The rule itself (no 2 s window of decisions over 30) is checked exactly, against a real
 *  Redis, in crates/core/tests/pacing_redis.rs. The contrast below (a budget per process,
 *  120 per 2 s against 90 per 3 s) shows what the shared store does. */
const PACING = { limit: 30, windowMs: 2000 }
const EMU_LIMIT = { limit: 90, windowMs: 3000 }
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

const cleanups = []
after(async () => {
  for (const c of cleanups.reverse()) await c()
})

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer()
    s.once('error', reject)
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address()
      s.close(() => resolve(port))
    })
  })
}

async function startRedis() {
  const dir = mkdtempSync(join(tmpdir(), 'createos-redis-'))
  const port = await freePort()
  const r = { port, dir, proc: null, url: `redis://127.0.0.1:${port}/0` }
  r.start = async () => {
    r.proc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir],
      { stdio: 'ignore' })
    const deadline = Date.now() + 10_000
    for (;;) {
      try {
        if (execFileSync('redis-cli', ['-p', String(port), 'PING'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim() === 'PONG') return
      } catch {}
      if (Date.now() > deadline) throw new Error('redis-server did not start')
      await sleep(25)
    }
  }
  r.kill = async () => {
    const p = r.proc
    if (!p || p.exitCode !== null || p.signalCode !== null) return
    const gone = new Promise((resolve) => p.once('exit', resolve))
    process.kill(p.pid, 'SIGKILL')
    await gone
  }
  r.cli = (...args) => execFileSync('redis-cli', ['-p', String(port), ...args], { encoding: 'utf8' }).trim()
  await r.start()
  cleanups.push(async () => { await r.kill(); rmSync(dir, { recursive: true, force: true }) })
  return r
}

/** Runs `node ...args`; resolves its last stdout line as JSON, with its stderr. The child is
 *  ended by pid after `limitMs`, or by the file's cleanups. */
function runNode(args, env, limitMs) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, { env, stdio: ['ignore', 'pipe', 'pipe'] })
    const killer = setTimeout(() => child.kill('SIGKILL'), limitMs)
    cleanups.push(async () => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
    let out = ''
    let err = ''
    child.stdout.on('data', (d) => { out += d })
    child.stderr.on('data', (d) => { err += d })
    child.once('exit', (code) => {
      clearTimeout(killer)
      if (code !== 0) return reject(new Error(`child exited ${code}: ${err.slice(-2000)}`))
      resolve({ ...JSON.parse(out.trim().split('\n').pop()), stderr: err })
    })
  })
}

/** Runs PROCESSES children; resolves their JSON results. */
function runChildren(opts, env) {
  return Promise.all(Array.from({ length: PROCESSES }, () => {
    const sandboxes = Array.from({ length: THREADS }, () => opts.emu.sandbox())
    const arg = { url: opts.emu.url, apiKey: opts.emu.apiKey, sandboxes, ...opts.child }
    return runNode([CHILD, JSON.stringify(arg)], env, 45_000)
  }))
}

/** Requests the emulator accepted (not 429) in the busiest window of `windowMs`. */
function busiestWindow(requests, windowMs) {
  const at = requests.filter((r) => r.status !== 429).map((r) => r.atMs).sort((a, b) => a - b)
  let best = 0
  let lo = 0
  for (let hi = 0; hi < at.length; hi++) {
    while (at[hi] - at[lo] >= windowMs) lo++
    best = Math.max(best, hi - lo + 1)
  }
  return best
}

/** The emulator's log as bursts (arrivals less than 300 ms apart): [first atMs, span ms,
 *  requests, 429s] each, for a failure message. */
function bursts(requests) {
  const rs = [...requests].sort((a, b) => a.atMs - b.atMs)
  const out = []
  for (const r of rs) {
    const last = out[out.length - 1]
    if (last && r.atMs - last.end < 300) {
      last.end = r.atMs
      last.n++
    } else {
      out.push({ start: r.atMs, end: r.atMs, n: 1, n429: 0 })
    }
    if (r.status === 429) out[out.length - 1].n429++
  }
  return out.map((b) => [Math.round(b.start), Math.round(b.end - b.start), b.n, b.n429])
}

const baseEnv = () => {
  const env = { ...process.env }
  delete env.CREATEOS_PACING_STORE
  return env
}

test('four processes × two threads share one budget in Redis: zero 429s, no window over budget; per-process budgets for contrast', { timeout: 180_000 }, async () => {
  const redis = await startRedis()
  const ctx = await startEmu({ rateLimit: EMU_LIMIT })
  cleanups.push(() => ctx.close(fileURLToPath(import.meta.url)))

  // Shared: the store comes from CREATEOS_PACING_STORE (the default for every client). A run
  // counts when the store answered every decision within its bound (250 ms); a child that
  // warned CREATEOS_PACING_STORE_DOWN had its own budget for a while, by design, and then the
  // emulator may see more than the shared budget. Such a run is said, and the phase runs
  // again, at most ATTEMPTS times. In a cgroup of 0.2 CPU shared with a busy loop, 6 of 7 runs
  // had such a child while a new connection had only a decision's bound, 2 of 7 after.
  const ATTEMPTS = 3
  let counted = null
  for (let attempt = 1; attempt <= ATTEMPTS && !counted; attempt++) {
    if (attempt > 1) {
      redis.cli('FLUSHALL')
      await sleep(EMU_LIMIT.windowMs + 100)
      ctx.emu.clearRequests()
    }
    const t0 = Date.now()
    const shared = await runChildren(
      { emu: ctx, child: { commands: 10, concurrency: 4, deadlineMs: 40_000, pacing: PACING } },
      { ...baseEnv(), CREATEOS_PACING_STORE: redis.url },
    )
    const reqs = ctx.requests()
    const run = { shared, reqs, ms: Date.now() - t0, n429: reqs.filter((r) => r.status === 429).length, busiest: busiestWindow(reqs, EMU_LIMIT.windowMs) }
    const ok = shared.reduce((a, r) => a + r.ok, 0)
    const warned = shared.filter((r) => Object.keys(r.warnings).length > 0).length
    console.log(`shared store, run ${attempt}: ${ok} commands, ${reqs.length} requests in ${run.ms} ms, ${run.n429} × 429, busiest ${EMU_LIMIT.windowMs} ms window: ${run.busiest} (limit ${EMU_LIMIT.limit}), ${warned} of ${PROCESSES} processes saw the store miss its bound`)
    // Whatever the store did: every command ran, exactly, and no URL was printed.
    assert.equal(ok, PROCESSES * THREADS * 10, JSON.stringify(shared.map((r) => r.failed)))
    assert.ok(shared.every((r) => r.wrong === 0 && r.failed.length === 0))
    assert.ok(!shared.some((r) => r.stderr.includes(redis.url)))
    for (const r of shared) {
      for (const code of Object.keys(r.warnings)) assert.ok(['CREATEOS_PACING_STORE_DOWN', 'CREATEOS_PACING_STORE_RESTORED'].includes(code), code)
    }
    if (warned === 0) counted = run
  }
  assert.ok(counted, `the store missed its decision bound in all ${ATTEMPTS} runs`)
  // The arrivals as bursts, for the message: how late each window's starts came.
  const timeline = `arrivals [first atMs, span ms, requests, 429s]: ${JSON.stringify(bursts(counted.reqs))}`
  assert.equal(counted.n429, 0, `no 429 with the shared budget; ${timeline}`)
  assert.ok(counted.busiest <= EMU_LIMIT.limit, `busiest window ${counted.busiest}; ${timeline}`)

  // Per process: the same load, each process with its own budget (store: false beats the env).
  await sleep(EMU_LIMIT.windowMs + 100)
  ctx.emu.clearRequests()
  const t1 = Date.now()
  const local = await runChildren(
    { emu: ctx, child: { commands: 10, concurrency: 4, deadlineMs: 40_000, pacing: { ...PACING, store: false } } },
    { ...baseEnv(), CREATEOS_PACING_STORE: redis.url },
  )
  const lreqs = ctx.requests()
  const l429 = lreqs.filter((r) => r.status === 429).length
  const lok = local.reduce((a, r) => a + r.ok, 0)
  const lfailed = local.reduce((a, r) => a + r.failed.length, 0)
  console.log(`per-process budgets (contrast): ${lok} commands ok, ${lfailed} failed, ${lreqs.length} requests in ${Date.now() - t1} ms, ${l429} × 429`)
  // The emulator's limit bites without the shared store, so the zero above means something.
  assert.ok(l429 > 0, 'per-process budgets run into the emulator limit')
})

// napi-rs ends its async runtime with the last Node environment that loaded the addon and
// starts a new one for the next (here: worker A exits before worker B loads it). The store's
// connection lived on the old runtime; B's first decision finds it gone. Before B's decision
// got a new connection, that was a CREATEOS_PACING_STORE_DOWN warning and a local budget: in
// about 1 of 10 runs of the test above, and in 10 of 100 children whose first worker exited
// after two commands.
test('the async runtime replaced between two workers: the next decision is still shared, no warning', { timeout: 60_000 }, async () => {
  const redis = await startRedis()
  const origin = 'http://127.0.0.1:9'
  const index = fileURLToPath(new URL('../index.js', import.meta.url))
  const worker = `
    const { parentPort } = require('node:worker_threads')
    const lib = require(${JSON.stringify(index)})
    const fs = require('node:fs')
    // The async runtime's threads, as this process has them now.
    const threads = () => fs.readdirSync('/proc/self/task')
      .filter((t) => { try { return fs.readFileSync('/proc/self/task/' + t + '/comm', 'utf8').startsWith('tokio') } catch { return false } })
    const warnings = []
    process.on('warning', (w) => { if (w.code) warnings.push(w.code) })
    lib.waitForRequest(${JSON.stringify(origin)})
      .then(() => new Promise((r) => setImmediate(r)))
      .then(() => parentPort.postMessage({ warnings, threads: threads() }), (e) => parentPort.postMessage({ error: String(e && e.message) }))
  `
  const script = `
    const { Worker } = require('node:worker_threads')
    const run = () => new Promise((resolve, reject) => {
      const w = new Worker(${JSON.stringify(worker)}, { eval: true })
      let msg
      w.once('message', (m) => { msg = m })
      w.once('error', reject)
      w.once('exit', () => resolve(msg))
    })
    run().then(async (a) => { const b = await run(); console.log(JSON.stringify({ a, b })) })
  `
  const { a, b } = await runNode(['-e', script], { ...baseEnv(), CREATEOS_PACING_STORE: redis.url }, 30_000)
  console.log(`runtime threads: worker A ${a.threads.join(',')}, worker B ${b.threads.join(',')}; warnings A ${JSON.stringify(a.warnings)}, B ${JSON.stringify(b.warnings)}`)
  assert.ok(a.threads.length > 0 && b.threads.length > 0 && !b.threads.some((t) => a.threads.includes(t)), 'the runtime was replaced')
  assert.deepEqual(a, { warnings: [], threads: a.threads })
  assert.deepEqual(b, { warnings: [], threads: b.threads }, 'no store warning after the runtime was replaced')
  assert.equal(redis.cli('ZCARD', `createos-execute:pacing:v1:{${origin}}:starts`), '2', 'both decisions were made in the store')
})

test('the store URL (and its password) never appears in an error', async () => {
  const { lib } = await import('./helpers.mjs')
  for (const [pacing, env] of [[{ limit: 5, store: 'rediz://:hunter2-pw@h:1' }, undefined], ['window', 'memcached://:hunter2-pw@h:1']]) {
    const saved = process.env.CREATEOS_PACING_STORE
    if (env) process.env.CREATEOS_PACING_STORE = env
    try {
      await assert.rejects(
        lib.execute({ config: { apiUrl: 'http://127.0.0.1:1', pacing }, apiKey: 'k' }, { lease: { providerLeaseId: 'sb' }, command: 'true' }),
        (e) => e.code === 'CREATEOS_INVALID_INPUT' && !String(e.message).includes('hunter2') && !String(e.stack).includes('hunter2'),
      )
    } finally {
      if (saved === undefined) delete process.env.CREATEOS_PACING_STORE
      else process.env.CREATEOS_PACING_STORE = saved
    }
  }
})

test('a redis:// password to a host that is not loopback is refused (names rediss://), unless opted in', async () => {
  const { lib } = await import('./helpers.mjs')
  const url = 'redis://:hunter2-pw@redis.internal:6379/0'
  const run = (pacing) => lib.execute({ config: { apiUrl: 'http://127.0.0.1:1', timeoutMs: 2000, pacing }, apiKey: 'k' },
    { lease: { providerLeaseId: 'sb' }, command: 'true' })
  for (const [pacing, env, names] of [[{ store: url }, undefined, 'pacing.store'], ['window', url, 'CREATEOS_PACING_STORE']]) {
    const saved = process.env.CREATEOS_PACING_STORE
    if (env) process.env.CREATEOS_PACING_STORE = env
    try {
      await assert.rejects(run(pacing), (e) => e.code === 'CREATEOS_INVALID_INPUT' && e.message.startsWith(names) &&
        e.message.includes('rediss://') && !String(e.stack).includes('hunter2') && !String(e.stack).includes('redis.internal'))
    } finally {
      if (saved === undefined) delete process.env.CREATEOS_PACING_STORE
      else process.env.CREATEOS_PACING_STORE = saved
    }
  }
  // Opted in, the configuration is accepted: the call gets as far as the (closed) API port.
  await assert.rejects(run({ store: url, allowPlaintextPassword: true, key: `opt-in-${process.pid}` }),
    (e) => e.code !== 'CREATEOS_INVALID_INPUT')
})

test('Redis killed mid-run: the local budget takes over with one warning per process; restarted: shared again; nothing lost or hung', { timeout: 120_000 }, async () => {
  const redis = await startRedis()
  // No emulator limit here: while the store is down each process has its own budget, by design.
  const ctx = await startEmu({ rateLimitPerMinute: null })
  cleanups.push(() => ctx.close(fileURLToPath(import.meta.url)))
  const key = `kill-test-${process.pid}`
  const pacing = { limit: 20, windowMs: 500, store: redis.url, key }
  const deadlineMs = 15_000
  const t0 = Date.now()
  const children = runChildren({ emu: ctx, child: { durationMs: 6000, concurrency: 3, deadlineMs, pacing } }, baseEnv())

  await sleep(1500)
  const before = redis.cli('ZCARD', `createos-execute:pacing:v1:{${key}}:starts`)
  await redis.kill()
  const killedAt = Date.now() - t0
  await sleep(2000)
  await redis.start()
  const restartedAt = Date.now() - t0
  // Shared again: the restarted (empty) server gets reservations while the children run.
  let after = 0
  for (let i = 0; i < 60 && after === 0; i++) {
    after = Number(redis.cli('ZCARD', `createos-execute:pacing:v1:{${key}}:starts`))
    if (after === 0) await sleep(50)
  }
  const results = await children
  const total = Date.now() - t0
  const reqs = ctx.requests()
  const during = reqs.filter((r) => r.atMs > 0).length
  const ok = results.reduce((a, r) => a + r.ok, 0)
  console.log(`kill test: killed at ${killedAt} ms (ZCARD ${before}), restarted at ${restartedAt} ms, ZCARD after restart ${after}; ${ok} commands ok, ${during} requests, ${total} ms`)
  console.log(`warnings per process: ${JSON.stringify(results.map((r) => r.warnings))}`)
  assert.ok(Number(before) > 0, 'the store was used before the kill')
  assert.ok(after > 0, 'the store was used again after the restart')
  for (const r of results) {
    assert.deepEqual(r.failed, [], 'no command failed')
    assert.equal(r.wrong, 0)
    assert.equal(r.warnings.CREATEOS_PACING_STORE_DOWN, 1, 'exactly one down warning per process')
    assert.equal(r.warnings.CREATEOS_PACING_STORE_RESTORED, 1, 'one notice when it answers again')
    assert.ok(!r.stderr.includes(redis.url), 'the URL never appears')
  }
  assert.ok(total < 6000 + deadlineMs, 'nothing hung past its deadline')
})

test('a cleanup in one process goes ahead of the new work other processes queued in the shared store', { timeout: 120_000 }, async () => {
  const { lib, kindOf, assertVictimContained } = await import('./helpers.mjs')
  const redis = await startRedis()
  const ctx = await startEmu({ rateLimitPerMinute: null })
  cleanups.push(() => ctx.close(fileURLToPath(import.meta.url)))
  const pacing = { limit: 10, windowMs: 2000, store: redis.url, key: `saturation-shared-${process.pid}` }
  const timeoutMs = 1500
  const started = Date.now()
  // The victim, in this process: its child is alive when its timeout fires.
  const victim = lib.execute({ config: { apiUrl: ctx.url, timeoutMs: 8000, pacing }, apiKey: ctx.apiKey },
    { lease: { providerLeaseId: ctx.sandbox() }, command: 'sh', args: ['-c', 'echo partial; exec sleep 30'] },
    AbortSignal.timeout(timeoutMs)).then((r) => ({ r, at: Date.now() }), (e) => ({ e, at: Date.now() }))
  await sleep(300)
  // Three other processes queue 30 echos (about 90 requests: 18 s of this budget).
  const others = Array.from({ length: 3 }, () => runNode([CHILD, JSON.stringify({
    url: ctx.url, apiKey: ctx.apiKey, sandboxes: [ctx.sandbox()], commands: 10, concurrency: 10, deadlineMs: 60_000, pacing,
  })], baseEnv(), 90_000))
  const { afterTimeout } = await assertVictimContained(ctx.emu, victim, started, timeoutMs)
  const rs = await Promise.all(others)
  assert.deepEqual(rs.map((r) => [r.ok, r.failed, r.wrong]), [[10, [], 0], [10, [], 0], [10, [], 0]])
  const log = ctx.requests().slice().sort((a, b) => a.atMs - b.atMs)
  const del = log.findIndex((r) => kindOf(r) === 'deleteProcess')
  assert.ok(del >= 0, 'the victim was deleted')
  const creations = log.map((r, i) => [kindOf(r), i]).filter(([k]) => k === 'createProcess')
  const later = creations.filter(([, i]) => i > del).length
  assert.ok(later >= 15, `only ${later} of ${creations.length} creations came after the DELETE`)
  console.log(`shared store: victim settled ${afterTimeout} ms after its timeout; ${later} of ${creations.length} creations after its DELETE`)
})

// The store's return is noticed by the pacer's own probe timer; the host hears of it then, with
// no call in flight (a warning delivered only with the next call that settles could come
// minutes later, or never).
test('STORE_RESTORED reaches the host within 2 s of the store\'s return, with no call in flight', { timeout: 60_000 }, async () => {
  const redis = await startRedis()
  const origin = 'http://127.0.0.1:9'
  const index = fileURLToPath(new URL('../index.js', import.meta.url))
  // The child: one decision in the store, then (store killed by the parent) one decided
  // locally, then nothing in flight while it waits for the restored notice.
  const script = `
    const lib = require(${JSON.stringify(index)})
    const seen = []
    process.on('warning', (w) => { if (w.code) seen.push({ code: w.code, at: Date.now() }) })
    const say = (m) => process.stdout.write(JSON.stringify(m) + '\\n')
    process.stdin.setEncoding('utf8')
    let step = 0
    process.stdin.on('data', async () => {
      step += 1
      if (step === 1) { await lib.waitForRequest(${JSON.stringify(origin)}); await new Promise((r) => setImmediate(r)); say({ step, seen }) }
      if (step === 2) { setTimeout(() => { say({ step, seen }); process.exit(0) }, 4000) }
    })
    lib.waitForRequest(${JSON.stringify(origin)}).then(() => say({ step: 0, seen }))
  `
  const child = spawn(process.execPath, ['-e', script], { env: { ...baseEnv(), CREATEOS_PACING_STORE: redis.url }, stdio: ['pipe', 'pipe', 'pipe'] })
  cleanups.push(async () => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
  const lines = []
  let buf = ''
  let wake = () => {}
  child.stdout.on('data', (d) => {
    buf += d
    let i
    while ((i = buf.indexOf('\n')) >= 0) { lines.push(JSON.parse(buf.slice(0, i))); buf = buf.slice(i + 1); wake() }
  })
  const next = async (n) => {
    const deadline = Date.now() + 20_000
    while (lines.length < n) {
      assert.ok(Date.now() < deadline, 'the child answered')
      await new Promise((r) => { wake = r; setTimeout(r, 200) })
    }
    return lines[n - 1]
  }
  assert.deepEqual((await next(1)).seen, [], 'the store answered the first decision')
  await redis.kill()
  child.stdin.write('x\n')
  const down = await next(2)
  assert.deepEqual(down.seen.map((w) => w.code), ['CREATEOS_PACING_STORE_DOWN'])
  await sleep(500)
  await redis.start()
  const back = Date.now()
  child.stdin.write('x\n')
  const after = await next(3)
  const restored = after.seen.find((w) => w.code === 'CREATEOS_PACING_STORE_RESTORED')
  console.log(`STORE_RESTORED ${restored ? `${restored.at - back} ms after the store's return` : 'never came'}`)
  assert.ok(restored, 'the restored notice came without another call')
  assert.ok(restored.at - back <= 2000, `within 2 s (${restored.at - back} ms)`)
})
