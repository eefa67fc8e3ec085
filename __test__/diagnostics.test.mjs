// diagnostics_channel (issue 13 §7): `createos-execute:request` per HTTP attempt and
// `createos-execute:cleanup` per cleanup step, checked against the emulator's request log.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import diagnostics from 'node:diagnostics_channel'
import { lib, kinds, bashParams, useEmulator, liveOfCalls } from './helpers.mjs'

const { execute, destroySandbox } = lib
let ctx
let sandbox
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() })

const LABELS = new Set(['file transfer', 'process creation', 'stdin close', 'output connection', 'process cleanup',
  'process status', 'workspace command', 'sandbox lifecycle'])
const OUTCOMES = new Set(['ok', 'http error', 'no response', 'redirect refused', 'untrusted certificate', 'proxy refused', 'proxy unreachable', 'aborted', 'failed'])

/** Subscribes to both channels while `run` runs; returns what each received. */
async function recording(run) {
  const seen = { request: [], cleanup: [] }
  const onRequest = (m, name) => { assert.equal(name, 'createos-execute:request'); seen.request.push(m) }
  const onCleanup = (m, name) => { assert.equal(name, 'createos-execute:cleanup'); seen.cleanup.push(m) }
  diagnostics.subscribe('createos-execute:request', onRequest)
  diagnostics.subscribe('createos-execute:cleanup', onCleanup)
  try {
    seen.result = await run()
  } finally {
    diagnostics.unsubscribe('createos-execute:request', onRequest)
    diagnostics.unsubscribe('createos-execute:cleanup', onCleanup)
  }
  return seen
}

function assertNothingSecret(events, extra = []) {
  const text = JSON.stringify(events)
  for (const secret of [ctx.apiKey, ctx.url, '127.0.0.1', sandbox, 'secret-body-token', '/v1/', 'sandboxes', ...extra]) {
    assert.ok(!text.includes(secret), `an event contains ${JSON.stringify(secret)}`)
  }
  for (const e of events) {
    for (const v of Object.values(e)) assert.ok(v === null || ['string', 'number'].includes(typeof v), `field of type ${typeof v}`)
  }
}

test('one request event per HTTP attempt, a 503 retry included, matching the request log', async () => {
  ctx.emu.addFault({ route: 'putFile', times: 1, action: { kind: 'status', status: 503 } })
  const seen = await recording(() => execute(ctx.client({ pacing: 'off' }), bashParams(sandbox, 'echo secret-output-text')))
  assert.equal(seen.result.stdout, 'secret-output-text\n')
  const log = ctx.requests()
  // Every request the emulator saw, and nothing else, in the same order per method.
  assert.equal(seen.request.length, log.length, `${kinds(log).join(',')}`)
  const byMethod = (list, m) => list.filter((r) => r.method === m).map((r) => r.status)
  for (const m of ['GET', 'POST', 'PUT', 'DELETE']) {
    assert.deepEqual(byMethod(seen.request, m), byMethod(log, m), m)
  }
  // The 503 is attempt 1 of a file transfer, and its retry is attempt 2 with 200.
  const failed = seen.request.findIndex((e) => e.status === 503)
  assert.ok(failed >= 0)
  assert.deepEqual({ ...seen.request[failed], durationMs: 0, pacingWaitMs: 0 },
    { operation: 'file transfer', method: 'PUT', status: 503, outcome: 'http error', attempt: 1, durationMs: 0, pacingWaitMs: 0 })
  const retry = seen.request.slice(failed + 1).find((e) => e.operation === 'file transfer')
  assert.equal(retry.attempt, 2)
  assert.equal(retry.status, 200)
  assert.equal(retry.outcome, 'ok')
  for (const e of seen.request) {
    assert.deepEqual(Object.keys(e).sort(), ['attempt', 'durationMs', 'method', 'operation', 'outcome', 'pacingWaitMs', 'status'])
    assert.ok(LABELS.has(e.operation), e.operation)
    assert.ok(OUTCOMES.has(e.outcome), e.outcome)
    assert.ok(e.durationMs >= 0 && e.pacingWaitMs >= 0)
  }
  assert.equal(seen.request.filter((e) => e.attempt > 1).length, 1)
  assertNothingSecret(seen.request, ['secret-output-text', seen.result.metadata.processId])
  assert.deepEqual(seen.cleanup, [])
})

test('cleanup steps are published as they happen, matching the DELETE requests', async () => {
  ctx.emu.addFault({ route: 'deleteProcess', times: 2, action: { kind: 'status', status: 503 } })
  const seen = await recording(() => execute(ctx.client(), bashParams(sandbox, 'sleep 60'), AbortSignal.timeout(300)))
  assert.equal(seen.result.timedOut, true)
  const deletes = ctx.requests().filter((r) => r.method === 'DELETE')
  const deleteSteps = seen.cleanup.filter((s) => s.step === 'delete')
  assert.ok(deleteSteps.length >= 1)
  // Each DELETE step is one DELETE round (its 503 retries are request events of that round).
  const deleteEvents = seen.request.filter((e) => e.method === 'DELETE')
  assert.deepEqual(deleteEvents.map((e) => e.status), deletes.map((d) => d.status))
  assert.deepEqual(deleteEvents.slice(0, 2).map((e) => [e.status, e.operation]), [[503, 'process cleanup'], [503, 'process cleanup']])
  for (const s of seen.cleanup) {
    assert.deepEqual(Object.keys(s).sort(), ['atMs', 'graceMs', 'outcome', 'step'])
    assert.equal(typeof s.atMs, 'number')
  }
  const atMs = seen.cleanup.map((s) => s.atMs)
  assert.deepEqual(atMs, [...atMs].sort((a, b) => a - b))
  assertNothingSecret([...seen.request, ...seen.cleanup])
  assert.deepEqual(liveOfCalls(ctx.emu), [])
})

test('the pacing wait is measured', async () => {
  const seen = await recording(() => execute(ctx.client({ pacing: { intervalMs: 150 } }), bashParams(sandbox, 'true')))
  assert.equal(seen.result.exitCode, 0)
  assert.ok(seen.request.length >= 3)
  assert.ok(seen.request.some((e) => e.pacingWaitMs >= 100), JSON.stringify(seen.request.map((e) => e.pacingWaitMs)))
})

test('destroySandbox publishes its request; nothing is published without a subscriber', async () => {
  const other = ctx.sandbox()
  const seen = await recording(() => destroySandbox(ctx.client(), other))
  // The DELETE and the confirmation that follows it, exactly as the emulator saw them.
  assert.deepEqual(seen.request.map((e) => [e.method, e.status]), ctx.requests().map((r) => [r.method, r.status]))
  assert.deepEqual(seen.request.map((e) => [e.operation, e.method, e.status, e.attempt])[0], ['sandbox lifecycle', 'DELETE', 200, 1])
  assert.ok(seen.request.every((e) => e.operation === 'sandbox lifecycle'))
  assertNothingSecret(seen.request, [other])
  // After unsubscribing: no message arrives (and native was handed no callback).
  let late = 0
  const count = () => { late++ }
  diagnostics.subscribe('createos-execute:request', count)
  diagnostics.unsubscribe('createos-execute:request', count)
  assert.equal(diagnostics.channel('createos-execute:request').hasSubscribers, false)
  await execute(ctx.client(), bashParams(sandbox, 'true'))
  assert.equal(late, 0)
})
