// The emulator's tree tracking cannot be fooled: a process that clears its environment and
// leaves its session (`env -i setsid`) stays in its tree's cgroup, so the emulator reports the
// tree alive and a timeout's cleanup kills it. Whether the process lives is read from /proc by
// its command line here, not from the emulator.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { lib, kinds, bashParams, useEmulator, sleep, markOf, uniqueSleep, sleepers, liveOfCalls } from './helpers.mjs'

const { execute } = lib
let ctx
let sandbox
// Whole trees: a process DELETE here must reach what left the process group
// (terminationScope 'tree'), whatever profile CREATEOS_EMULATOR_PROFILE names.
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() }, { terminationScope: 'tree' })

const inCi = !!process.env.CI && process.env.CI !== 'false' && process.env.CI !== '0'
const isRoot = typeof process.getuid === 'function' && process.getuid() === 0



/** `sleepers(arg)` once one runs (the exec chain env → setsid → sleep takes a moment). */
async function untilSleepers(arg) {
  const end = Date.now() + 5000
  let found = sleepers(arg)
  while (found.length === 0 && Date.now() < end) {
    await sleep(10)
    found = sleepers(arg)
  }
  return found
}

function killAll(pids) {
  for (const pid of pids) {
    try { process.kill(pid, 'SIGKILL') } catch {}
  }
}

/** Collects every pid of `sleep <arg>` seen until `stop()`. */
function watch(arg) {
  const seen = new Set()
  const timer = setInterval(() => { for (const pid of sleepers(arg)) seen.add(pid) }, 20)
  return { seen, stop() { clearInterval(timer); for (const pid of sleepers(arg)) seen.add(pid) } }
}

const escape = (arg) => `env -i setsid sleep ${arg} </dev/null >/dev/null 2>&1 & echo started`

test('the emulator says how it tracks trees; CI, as root, tracks them by cgroup', () => {
  assert.ok(['cgroup-v2', 'cgroup-v1', 'marker'].includes(ctx.emu.tracking), ctx.emu.tracking)
  if (inCi && isRoot) assert.notEqual(ctx.emu.tracking, 'marker')
})

test('a 1 s timeout of a command with an env -i setsid escape: timedOut, no cleanup error, the escaped process killed', async (t) => {
  if (ctx.emu.tracking === 'marker') return t.skip('no writable cgroup hierarchy here: the marker cannot see this escape')
  const arg = uniqueSleep(306)
  const w = watch(arg)
  let r
  try {
    r = await execute(ctx.client(), bashParams(sandbox, `${escape(arg)}; sleep 60`), AbortSignal.timeout(1000))
  } finally {
    w.stop()
  }
  const left = sleepers(arg)
  killAll(left)
  assert.equal(r.timedOut, true)
  assert.equal(r.stdout, 'started\n')
  assert.equal(w.seen.size, 1, `the escaped sleeper ran: ${[...w.seen]}`)
  assert.deepEqual(left, [], 'the escaped sleeper outlived the cleanup')
  // What the server saw: the process, its stream, one DELETE that answered tree_exited true.
  const seen = kinds(ctx.requests())
  assert.ok(seen.includes('createProcess'), seen.join(' '))
  const dels = ctx.requests().filter((q) => q.method === 'DELETE')
  assert.equal(dels.length, 1, seen.join(' '))
  assert.equal(dels[0].status, 200)
  assert.deepEqual(liveOfCalls(ctx.emu), [])
})

test("a command that leaves an env -i setsid sleeper: treeExited false with 'keep', the sleeper ended with 'terminate'", async (t) => {
  if (ctx.emu.tracking === 'marker') return t.skip('no writable cgroup hierarchy here: the marker cannot see this escape')
  const kept = uniqueSleep(307)
  const r = await execute(ctx.client(), bashParams(sandbox, escape(kept)))
  const alive = await untilSleepers(kept)
  const markAlive = alive.map((pid) => markOf(pid))
  const livePids = ctx.emu.livePids()
  killAll(alive)
  assert.equal(r.exitCode, 0)
  assert.equal(r.metadata.treeExited, false, 'the sleeper keeps the tree alive')
  assert.equal(alive.length, 1)
  assert.ok(livePids.includes(alive[0]), `livePids ${livePids} misses ${alive[0]}`)
  assert.match(markAlive[0] ?? '', /^emu[0-9a-f]+:proc_[0-9a-f]+$/, 'the final survivor check sees it by its cgroup')

  ctx.reset()
  const ended = uniqueSleep(308)
  const w = watch(ended)
  let r2
  try {
    // The leader lingers a moment so the sleeper is seen running before the cleanup.
    r2 = await execute(ctx.client({ leftoverProcesses: 'terminate' }), bashParams(sandbox, `${escape(ended)}; sleep 0.3`))
  } finally {
    w.stop()
  }
  const left = sleepers(ended)
  killAll(left)
  assert.equal(r2.exitCode, 0)
  assert.equal(w.seen.size, 1)
  assert.deepEqual(left, [], "'terminate' left the sleeper alive")
  assert.ok(kinds(ctx.requests()).includes('deleteProcess'))
  await sleep(0)
  assert.deepEqual(liveOfCalls(ctx.emu), [])
})
