// The plugin's file-sync call shape (issue 13 §6):
//   execute(client, { ...syncParams, command: "/bin/bash", args: ["-c", script], cwd },
//           AbortSignal.any([signal, AbortSignal.timeout(ms)]))
// syncParams is the host's whole PluginEnvironmentExecuteParams-like object: its extra
// fields are ignored; the timeout gives `timedOut`; the caller's abort the cancellation error.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { lib, kinds, kindOf, rejection, sleep, CANCELLED, useEmulator, liveOfCalls } from './helpers.mjs'

const { execute } = lib
let ctx
let sandbox
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() })

function syncParams() {
  return {
    driverKey: 'createos',
    companyId: 'company-secret-1',
    environmentId: 'env-secret-2',
    issueId: 'issue-secret-3',
    executionId: 'exec-secret-4',
    config: { apiUrl: 'https://elsewhere.invalid', shape: 'small', nested: { fn() {} } },
    lease: { providerLeaseId: sandbox, metadata: { region: 'eu' }, expiresAt: null },
    command: 'this-command-is-replaced',
    args: ['replaced'],
    cwd: '/replaced',
    env: { SYNC_MARK: 'from-sync-params' },
    timeoutMs: 1,
    bypassSession: true,
  }
}

function fileSync(params, signal, script, cwd, ms) {
  return execute(ctx.client(), { ...params, command: '/bin/bash', args: ['-c', script], cwd },
    AbortSignal.any([signal, AbortSignal.timeout(ms)]))
}

function assertNoExtraFieldSent() {
  const text = JSON.stringify(ctx.requests())
  for (const v of ['company-secret-1', 'env-secret-2', 'issue-secret-3', 'exec-secret-4', 'elsewhere', 'replaced', 'bypass']) {
    assert.ok(!text.includes(v), `a request carried ${v}`)
  }
}

test('the sync call runs with its own command, args and cwd; the other fields are ignored', async () => {
  const caller = new AbortController()
  const script = 'mkdir -p sync-test && printf "%s" "$SYNC_MARK" > sync-test/f && cat sync-test/f && rm -r sync-test && pwd'
  const r = await fileSync(syncParams(), caller.signal, script, '/tmp', 10_000)
  assert.equal(r.exitCode, 0, r.stderr)
  assert.equal(r.timedOut, false)
  // timeoutMs: 1 of the params did not time the command out; env came through.
  assert.equal(r.stdout, 'from-sync-params/tmp\n')
  const k = kinds(ctx.requests())
  assert.equal(k.filter((x) => x === 'createProcess').length, 1, k.join(','))
  assert.ok(k.includes('connect'))
  assertNoExtraFieldSent()
  assert.deepEqual(liveOfCalls(ctx.emu), [])
})

test('the AbortSignal.timeout half gives timedOut, and the tree is gone', async () => {
  const caller = new AbortController()
  const started = Date.now()
  const r = await fileSync(syncParams(), caller.signal, 'sleep 60 & sleep 60; echo never', '/tmp', 400)
  assert.equal(r.timedOut, true)
  assert.ok(Date.now() - started < 30_000)
  assert.equal(r.stdout.includes('never'), false)
  const k = kinds(ctx.requests())
  assert.ok(k.includes('deleteProcess'), k.join(','))
  assert.ok(k.indexOf('deleteProcess') > k.indexOf('createProcess'))
  assertNoExtraFieldSent()
  assert.deepEqual(liveOfCalls(ctx.emu), [])
})

test("the caller's abort rejects with the cancellation error, and the tree is gone", async () => {
  const caller = new AbortController()
  const pending = fileSync(syncParams(), caller.signal, 'sleep 60 & sleep 60', '/tmp', 60_000)
  // Abort once the process runs.
  for (let i = 0; i < 200 && !ctx.requests().some((r) => kindOf(r) === 'connect'); i++) await sleep(10)
  await sleep(100)
  caller.abort(new Error('host stopped the sync'))
  const error = await rejection(pending)
  assert.equal(error.message, CANCELLED)
  assert.equal(error.code, 'CREATEOS_CANCELLED')
  assert.ok(kinds(ctx.requests()).includes('deleteProcess'))
  assertNoExtraFieldSent()
  assert.deepEqual(liveOfCalls(ctx.emu), [])
})

test('an already-aborted caller signal sends nothing', async () => {
  const caller = new AbortController()
  caller.abort()
  const error = await rejection(fileSync(syncParams(), caller.signal, 'echo x', '/tmp', 10_000))
  assert.equal(error.message, CANCELLED)
  await sleep(20)
  assert.deepEqual(ctx.requests(), [])
})
