// Containment under pressure, from the host's view: the verdict holds its deadline whatever
// the API does, what the call saw alive stays seen, a gate that may have been written is never
// "did not start", a timeout proven gone says treeExited: true, a refused destroy names its
// status, and a fault rule with an unknown route is refused.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { lib, kinds, bashParams, rejection, sleep, useEmulator, TERMINATION_UNCONFIRMED, endLeftovers, liveOfCalls, sessionMode } from './helpers.mjs'

const { execute, CreateosCleanupError, CreateosApiError, destroySandbox } = lib
let ctx
useEmulator(import.meta.url, (c) => { ctx = c })

/** Runs `promise`; resolves its outcome and how long after `abortAt` (ms since epoch) it settled. */
async function settle(promise, abortAt) {
  let outcome
  try { outcome = { value: await promise } } catch (error) { outcome = { error } }
  return { ...outcome, afterAbort: Date.now() - abortAt }
}

test('DELETE and wait answering 503 with a hanging file removal: the verdict within cleanupDeadlineMs', async () => {
  const sb = ctx.sandbox()
  ctx.emu.addFault({ route: 'deleteProcess', action: { kind: 'status', status: 503 } })
  ctx.emu.addFault({ route: 'wait', action: { kind: 'status', status: 503 } })
  ctx.emu.addFault({ route: 'exec', action: { kind: 'delay', ms: 60000 } })
  const client = ctx.client({ cleanupDeadlineMs: 2000 })
  const abortAt = Date.now() + 300
  const { error, afterAbort } = await settle(
    execute(client, bashParams(sb, 'cat >/dev/null; sleep 300', { stdin: 'x' }), AbortSignal.timeout(300)), abortAt)
  assert.ok(error instanceof CreateosCleanupError, String(error && error.stack))
  assert.equal(error.message, TERMINATION_UNCONFIRMED)
  // Deadline + slack, from the abort (it came after 4 s when the removal ran first).
  assert.ok(afterAbort < 3000, `verdict ${afterAbort} ms after the abort`)
  await sleep(200)
  assert.equal(kinds(ctx.requests()).includes('exec'), false, 'no removal while the process may still read its files')
  assert.ok(ctx.emu.livePids().length > 0, 'the error was right: the process is alive')
  await endLeftovers(ctx.emu)
})

test('a timeout whose tree was ended and proven gone reports treeExited: true', async () => {
  const sb = ctx.sandbox()
  const r = await execute(ctx.client(), bashParams(sb, 'echo up; sleep 30'), AbortSignal.timeout(500))
  assert.equal(r.timedOut, true)
  assert.equal(r.stdout, 'up\n')
  assert.equal(r.metadata.treeExited, true)
  assert.deepEqual(liveOfCalls(ctx.emu), [])
})

test('an exit frame that said alive makes a later 404 no proof (tail lost, replay evicted)', async (t) => {
  if (sessionMode()) {
    return t.skip('session mode: the command\'s end is a marker on the supervisor\'s stream, never an exit frame (the supervisor outlives it), so no exit frame can say "alive" before the DELETE')
  }
  const sb = ctx.sandbox()
  ctx.emu.addFault({ route: 'connect', times: 1, action: { kind: 'gapAfterFrames', frames: 0 } })
  ctx.emu.addFault({ route: 'connect', skip: 1, action: { kind: 'status', status: 410 } })
  ctx.emu.addFault({ route: 'deleteProcess', action: { kind: 'status', status: 404 } })
  const error = await rejection(execute(ctx.client(), bashParams(sb, 'sleep 300 & echo tag')))
  assert.ok(error instanceof CreateosCleanupError, String(error && error.stack))
  assert.equal(error.reason, 'termination-unconfirmed')
  assert.deepEqual(error.attempts.map((a) => [a.step, a.outcome]), [['delete', 'HTTP 404 after alive']])
  assert.ok(ctx.emu.livePids().length > 0, 'the error was right: sleep 300 is alive')
  await endLeftovers(ctx.emu)
})

test('a start gate written and then answered 500 is the API error, never CREATEOS_NOT_STARTED', async (t) => {
  if (sessionMode()) {
    return t.skip('session mode: no start gate (a command is one input record to a running supervisor; the start gate is the default mode\'s own mechanics)')
  }
  const sb = ctx.sandbox()
  ctx.emu.addFault({ route: 'putFile', times: 1, action: { kind: 'status', status: 500, afterHandler: true } })
  const error = await rejection(execute(ctx.client(), bashParams(sb, 'sleep 300')))
  assert.notEqual(error.code, 'CREATEOS_NOT_STARTED')
  assert.ok(error instanceof CreateosApiError, String(error && error.stack))
  assert.equal(error.status, 500)
  const k = kinds(ctx.requests())
  assert.ok(k.indexOf('deleteProcess') > k.indexOf('putFile'), k.join(','))
  assert.deepEqual(liveOfCalls(ctx.emu), [])
})

test('destroySandbox refused by a 401 names the status in its message', async () => {
  const sb = ctx.sandbox()
  ctx.emu.addFault({ route: 'deleteSandbox', action: { kind: 'status', status: 401 } })
  const error = await rejection(destroySandbox(ctx.client(), sb))
  assert.ok(error instanceof lib.CreateosDestroyError)
  assert.equal(error.message, 'CreateOS sandbox destruction could not be confirmed (HTTP 401).')
  assert.equal(error.status, 401)
  assert.equal(error.code, 'CREATEOS_DESTROY_UNCONFIRMED')
  assert.deepEqual(error.attempts.map((a) => [a.step, a.outcome]), [['destroy', 'HTTP 401']])
})

test('addFault refuses an unknown route, and takes the list faults', () => {
  assert.throws(() => ctx.emu.addFault({ route: 'createProces', action: { kind: 'delay', ms: 1 } }),
    /unknown route `createProces`/)
  ctx.emu.addFault({ route: 'listProcesses', action: { kind: 'pageSize', limit: 2, noTotal: true } })
  ctx.emu.addFault({ route: 'listProcesses', action: { kind: 'ignoreOffset' } })
  ctx.emu.clearFaults()
})
