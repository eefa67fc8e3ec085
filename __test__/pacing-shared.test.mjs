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
/** The emulator's limit, and the client's budget: the same count over a window 1000 ms longer,
 *  because a start decided in Redis reaches the emulator later (scheduling, HTTP), and the
 *  emulator stamps a request when its own process gets to it. A stall of the emulator's
 *  process longer than the margin stamps the starts decided during it together, and the
 *  window after the stall then holds more than `limit` of them. Under the parallel test legs
 *  of CI that happened with a 200 ms margin (3 × 429 once in a Node 22 leg), and one Node 22
 *  leg failed one test later with 500 ms (its name was not in the printed excerpt; this test
 *  had failed in that leg before). The contrast below (a budget per process: 79 × 429 in one
 *  run) still shows what the shared store does. */
const EMU_LIMIT = { limit: 30, windowMs: 1000 }
const PACING = { limit: 30, windowMs: 2000 }
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

/** Runs PROCESSES children; resolves their JSON results. Every child is ended by pid. */
function runChildren(opts, env) {
  const runs = []
  for (let i = 0; i < PROCESSES; i++) {
    runs.push(new Promise((resolve, reject) => {
      const sandboxes = Array.from({ length: THREADS }, () => opts.emu.sandbox())
      const arg = { url: opts.emu.url, apiKey: opts.emu.apiKey, sandboxes, ...opts.child }
      const child = spawn(process.execPath, [CHILD, JSON.stringify(arg)], { env, stdio: ['ignore', 'pipe', 'pipe'] })
      const killer = setTimeout(() => child.kill('SIGKILL'), 45_000)
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
    }))
  }
  return Promise.all(runs)
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

const baseEnv = () => {
  const env = { ...process.env }
  delete env.CREATEOS_PACING_STORE
  return env
}

test('four processes × two threads share one budget in Redis: zero 429s, no window over budget; per-process budgets for contrast', { timeout: 120_000 }, async () => {
  const redis = await startRedis()
  const ctx = await startEmu({ rateLimit: EMU_LIMIT })
  cleanups.push(() => ctx.close(fileURLToPath(import.meta.url)))

  // Shared: the store comes from CREATEOS_PACING_STORE (the default for every client).
  const t0 = Date.now()
  const shared = await runChildren(
    { emu: ctx, child: { commands: 10, concurrency: 4, deadlineMs: 40_000, pacing: PACING } },
    { ...baseEnv(), CREATEOS_PACING_STORE: redis.url },
  )
  const sharedMs = Date.now() - t0
  const reqs = ctx.requests()
  const n429 = reqs.filter((r) => r.status === 429).length
  const busiest = busiestWindow(reqs, EMU_LIMIT.windowMs)
  const ok = shared.reduce((a, r) => a + r.ok, 0)
  console.log(`shared store: ${ok} commands, ${reqs.length} requests in ${sharedMs} ms, ${n429} × 429, busiest ${EMU_LIMIT.windowMs} ms window: ${busiest} (limit ${EMU_LIMIT.limit})`)
  assert.equal(ok, PROCESSES * THREADS * 10, JSON.stringify(shared.map((r) => r.failed)))
  assert.ok(shared.every((r) => r.wrong === 0 && r.failed.length === 0))
  assert.equal(n429, 0, 'no 429 with the shared budget')
  assert.ok(busiest <= EMU_LIMIT.limit, `busiest window ${busiest}`)
  assert.ok(shared.every((r) => Object.keys(r.warnings).length === 0), 'no store warning while it answers')
  assert.ok(!shared.some((r) => r.stderr.includes(redis.url)))

  // Per process: the same load, each process with its own budget (store: false beats the env).
  await sleep(EMU_LIMIT.windowMs + 100)
  ctx.emu.clearRequests()
  const t1 = Date.now()
  const local = await runChildren(
    { emu: ctx, child: { commands: 5, concurrency: 4, deadlineMs: 40_000, pacing: { ...PACING, store: false } } },
    { ...baseEnv(), CREATEOS_PACING_STORE: redis.url },
  )
  const lreqs = ctx.requests()
  const l429 = lreqs.filter((r) => r.status === 429).length
  const lok = local.reduce((a, r) => a + r.ok, 0)
  const lfailed = local.reduce((a, r) => a + r.failed.length, 0)
  console.log(`per-process budgets (contrast): ${lok} commands ok, ${lfailed} failed, ${lreqs.length} requests in ${Date.now() - t1} ms, ${l429} × 429`)
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
