// Timeout and cancellation (issue 2 §3): the result or error, the DELETE with
// grace_ms=1000, nothing left alive, promptness, and the GC case.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import {
  lib, kinds, kindOf, queryOf, bashParams, rejection, sleep, CANCELLED,
  useEmulator, liveOfCalls,
} from './helpers.mjs'

const { execute, executeStream } = lib
setFlagsFromString('--expose-gc')
const gc = runInNewContext('gc')

let ctx
let sandbox
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() })

function deletes() {
  return ctx.requests().filter((r) => kindOf(r) === 'deleteProcess')
}

async function waitForKind(kind, timeoutMs = 5000) {
  const end = Date.now() + timeoutMs
  while (Date.now() < end) {
    if (kinds(ctx.requests()).includes(kind)) return
    await sleep(10)
  }
  throw new Error(`no ${kind} request within ${timeoutMs} ms`)
}

test('a TimeoutError abort resolves timedOut with the output so far, and terminates the tree', async () => {
  const started = Date.now()
  const r = await execute(ctx.client(), bashParams(sandbox, 'echo before; echo err >&2; sleep 60; echo after'),
    AbortSignal.timeout(1500))
  const elapsed = Date.now() - started
  assert.equal(r.timedOut, true)
  assert.equal(r.exitCode, null)
  assert.equal(r.stdout, 'before\n')
  assert.equal(r.stderr, 'err\n')
  assert.equal(typeof r.metadata.processId, 'string')
  assert.ok(elapsed < 4000, `took ${elapsed} ms`)
  const del = deletes()
  assert.equal(del.length >= 1, true, kinds(ctx.requests()).join(','))
  assert.equal(queryOf(del[0]).get('grace_ms'), '1000')
  assert.ok(del[0].path.endsWith(`/processes/${r.metadata.processId}`))
  assert.equal(del[0].status, 200)
  assert.deepEqual(liveOfCalls(ctx.emu), [])
})

// (In session mode the tests that wait for the `connect` request, or fault it, run on a sandbox
// of their own: a new supervisor, whose stream is opened for this command.)
test('any other abort rejects with "CreateOS command was cancelled." and terminates the tree', async (t) => {
  const sb = ctx.sandboxFor(t, sandbox)
  const controller = new AbortController()
  const p = execute(ctx.client(), bashParams(sb, 'echo x; sleep 60'), controller.signal)
  await waitForKind('connect')
  await sleep(200)
  controller.abort()
  const error = await rejection(p)
  assert.ok(error instanceof Error)
  assert.equal(error.message, CANCELLED)
  assert.equal(error.code, 'CREATEOS_CANCELLED')
  assert.equal(lib.isCreateosCleanupError(error), false)
  assert.equal(queryOf(deletes()[0]).get('grace_ms'), '1000')
  assert.deepEqual(liveOfCalls(ctx.emu), [])
})

test('an abort with a custom reason is a cancellation too', async (t) => {
  const sb = ctx.sandboxFor(t, sandbox)
  const controller = new AbortController()
  const p = execute(ctx.client(), bashParams(sb, 'sleep 60'), controller.signal)
  await waitForKind('connect')
  controller.abort(new Error('host shutting down'))
  const error = await rejection(p)
  assert.equal(error.message, CANCELLED)
  assert.ok(deletes().length >= 1)
})

test('an already aborted signal sends nothing', async () => {
  const error = await rejection(execute(ctx.client(), bashParams(sandbox, 'echo no', { stdin: 'x' }), AbortSignal.abort()))
  assert.equal(error.message, CANCELLED)
  const timedOut = await execute(ctx.client(), bashParams(sandbox, 'echo no'),
    AbortSignal.abort(new DOMException('The operation timed out.', 'TimeoutError')))
  assert.equal(timedOut.timedOut, true)
  assert.equal(timedOut.exitCode, null)
  assert.equal(timedOut.stdout, '')
  const error2 = await rejection(executeStream(ctx.client(), bashParams(sandbox, 'echo no'), AbortSignal.abort()))
  assert.equal(error2.message, CANCELLED)
  await sleep(100)
  assert.deepEqual(ctx.requests(), [], 'no request at all')
})

test('an abort while the stream only carries heartbeats takes effect well under a second', async (t) => {
  const sb = ctx.sandboxFor(t, sandbox)
  ctx.emu.addFault({ route: 'connect', times: 1, action: { kind: 'heartbeatsOnly', ms: 20000 } })
  const controller = new AbortController()
  const p = execute(ctx.client(), bashParams(sb, 'sleep 60'), controller.signal)
  await waitForKind('connect')
  await sleep(400) // several heartbeats have flowed
  const t0 = performance.now()
  controller.abort()
  const error = await rejection(p)
  const ms = performance.now() - t0
  assert.equal(error.message, CANCELLED)
  assert.ok(ms < 1000, `abort took ${ms.toFixed(0)} ms`)
  assert.ok(deletes().length >= 1)
  assert.deepEqual(liveOfCalls(ctx.emu), [])
})

test('an abort at any moment: before create, while staging, during connect', async () => {
  // Each abort point: N ms after the call. Every one must settle promptly and
  // leave nothing alive; the request log must end in a DELETE whenever a
  // process was created.
  for (const delay of [0, 5, 20, 60, 150]) {
    ctx.reset()
    const controller = new AbortController()
    const p = execute(ctx.client(), bashParams(sandbox, 'sleep 60', { stdin: 'x' }), controller.signal)
    await sleep(delay)
    const t0 = performance.now()
    controller.abort()
    const error = await rejection(p)
    assert.equal(error.message, CANCELLED, `delay ${delay}`)
    assert.ok(performance.now() - t0 < 1500, `delay ${delay}: slow abort`)
    const k = kinds(ctx.requests())
    if (k.includes('createProcess') && ctx.requests().find((r) => kindOf(r) === 'createProcess').status === 200) {
      assert.ok(k.includes('deleteProcess'), `delay ${delay}: ${k.join(',')}`)
    }
    assert.deepEqual(liveOfCalls(ctx.emu), [], `delay ${delay}`)
  }
})

test('a timeout fires after garbage collection (the signal is held until settle)', async () => {
  // Nothing but execute() holds this AbortSignal.timeout(): the TypeScript module
  // under Node 20 could lose it to a GC.
  const p = execute(ctx.client(), bashParams(sandbox, 'sleep 60'), AbortSignal.timeout(1200))
  for (let i = 0; i < 10; i++) {
    gc()
    await sleep(50)
  }
  const started = Date.now()
  const r = await Promise.race([p, sleep(6000).then(() => 'hung')])
  assert.notEqual(r, 'hung', 'the timeout never fired after GC')
  assert.equal(r.timedOut, true)
  assert.ok(Date.now() - started < 4000)
  assert.ok(deletes().length >= 1)
})

test('a controller abort after garbage collection', async () => {
  let controller = new AbortController()
  const p = execute(ctx.client(), bashParams(sandbox, 'sleep 60'), controller.signal)
  const abort = ((c) => () => c.abort())(controller)
  controller = null
  await waitForKind('connect')
  for (let i = 0; i < 5; i++) {
    gc()
    await sleep(20)
  }
  abort()
  const error = await Promise.race([rejection(p), sleep(3000).then(() => 'hung')])
  assert.notEqual(error, 'hung')
  assert.equal(error.message, CANCELLED)
})

test('executeStream: a timeout resolves timedOut with the output so far', async () => {
  const r = await executeStream(ctx.client(), bashParams(sandbox, 'echo early; sleep 60'), AbortSignal.timeout(1000))
  assert.equal(r.timedOut, true)
  assert.equal(r.exitCode, null)
  assert.equal(r.stdout, 'early\n')
})

test('executeStream: a cancel rejects', async () => {
  const controller = new AbortController()
  setTimeout(() => controller.abort(), 500)
  const error = await rejection(executeStream(ctx.client(), bashParams(sandbox, 'sleep 60'), controller.signal))
  assert.equal(error.message, CANCELLED)
})

test('no unhandled rejection on any abort path', async () => {
  const seen = []
  const onUnhandled = (reason) => seen.push(reason)
  process.on('unhandledRejection', onUnhandled)
  try {
    const ps = []
    for (const ms of [1, 30, 100, 300]) {
      ps.push(execute(ctx.client(), bashParams(sandbox, 'sleep 60', { stdin: 'y' }), AbortSignal.timeout(ms)).catch(() => {}))
      const c = new AbortController()
      setTimeout(() => c.abort(), ms)
      ps.push(execute(ctx.client(), bashParams(sandbox, 'sleep 60'), c.signal).catch(() => {}))
    }
    await Promise.all(ps)
    await sleep(200)
    assert.deepEqual(seen, [])
    assert.deepEqual(liveOfCalls(ctx.emu), [])
  } finally {
    process.off('unhandledRejection', onUnhandled)
  }
})
