// The error classes, isCreateosCleanupError across loaded copies, and
// waitForRequest (the shared request pacer).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import { lib, startEmu, bashParams, rejection, TERMINATION_UNCONFIRMED, ROOT } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { CreateosCleanupError, CreateosApiError, isCreateosCleanupError, waitForRequest } = lib

/** A second, independent copy of index.js (as when two versions are installed). */
function loadSecondCopy() {
  const path = require.resolve('../index.js')
  const saved = require.cache[path]
  delete require.cache[path]
  try {
    return require('../index.js')
  } finally {
    require.cache[path] = saved
  }
}

let ctx
before(async () => { ctx = await startEmu() })
after(async () => { await ctx.close(fileURLToPath(import.meta.url)) })

test('CreateosCleanupError is a real Error subclass', () => {
  const e = new CreateosCleanupError('m', { reason: 'termination-unconfirmed', sandboxId: 's', processId: 'p', attempts: [] })
  assert.ok(e instanceof CreateosCleanupError)
  assert.ok(e instanceof Error)
  assert.equal(e.name, 'CreateosCleanupError')
  assert.equal(e.message, 'm')
  assert.match(e.stack, /^CreateosCleanupError: m\n\s+at /)
  assert.equal(e.reason, 'termination-unconfirmed')
  assert.equal(e.sandboxId, 's')
  assert.equal(e.processId, 'p')
  assert.deepEqual(e.attempts, [])
  assert.equal(Object.prototype.toString.call(e), '[object Error]')
  // Same constructor shape as the TypeScript module (extends Error with no fields).
  const plain = new CreateosCleanupError()
  assert.equal(plain.message, '')
  assert.ok(isCreateosCleanupError(plain))
})

test('CreateosApiError has the TypeScript module\'s constructor and message', () => {
  const e = new CreateosApiError(503, 'process cleanup')
  assert.ok(e instanceof Error)
  assert.equal(e.name, 'CreateosApiError')
  assert.equal(e.status, 503)
  assert.equal(e.message, 'CreateOS request failed (HTTP 503) during process cleanup.')
  assert.equal(new CreateosApiError(404).message, 'CreateOS request failed (HTTP 404).')
  assert.match(e.stack, /^CreateosApiError: /)
})

test('isCreateosCleanupError recognises an error from another loaded copy', async () => {
  const other = loadSecondCopy()
  assert.notEqual(other.CreateosCleanupError, CreateosCleanupError, 'really a second copy')
  const foreign = new other.CreateosCleanupError('x')
  assert.equal(foreign instanceof CreateosCleanupError, false)
  assert.equal(isCreateosCleanupError(foreign), true)
  assert.equal(other.isCreateosCleanupError(new CreateosCleanupError('y')), true)
  for (const value of [null, undefined, 'CreateosCleanupError', new Error('x'), { name: 'CreateosCleanupError' }, new CreateosApiError(500)]) {
    assert.equal(isCreateosCleanupError(value), false)
  }

  // And one thrown for real by the other copy.
  const sandbox = ctx.sandbox()
  ctx.emu.addFault({ route: 'deleteProcess', action: { kind: 'treeExitedFalse' } })
  try {
    const error = await rejection(other.execute(ctx.client({ timeoutMs: 1500, legacyCleanup: true }),
      bashParams(sandbox, 'sleep 60'), AbortSignal.timeout(300)))
    assert.equal(error.message, TERMINATION_UNCONFIRMED)
    assert.equal(error instanceof CreateosCleanupError, false)
    assert.equal(isCreateosCleanupError(error), true)
  } finally {
    ctx.emu.clearFaults()
  }
})

test('a cleanup error from a vm context is recognised too', async () => {
  const { runInNewContext } = await import('node:vm')
  const { readFileSync } = await import('node:fs')
  const { join } = await import('node:path')
  const source = readFileSync(join(ROOT, 'index.js'), 'utf8')
  const module = { exports: {} }
  const sandboxRequire = (id) => (id === './binding.js' ? require('../binding.js') : require(id))
  runInNewContext(`(function (module, exports, require, process) {${source}\n})`, {})(module, module.exports, sandboxRequire, process)
  const e = new module.exports.CreateosCleanupError('from vm')
  assert.equal(e instanceof Error, false, 'another realm')
  assert.equal(isCreateosCleanupError(e), true)
})

test('waitForRequest spaces a fresh origin\'s requests by the default budget and honours signals', async () => {
  // An origin nobody else uses; the first call passes at once.
  const origin = 'https://pacer-test.invalid'
  const t0 = performance.now()
  await waitForRequest(origin)
  assert.ok(performance.now() - t0 < 100)
  const aborted = AbortSignal.abort(new Error('why'))
  const error = await rejection(waitForRequest(origin, aborted))
  assert.equal(error, aborted.reason)
  await assert.rejects(waitForRequest('not a url'), Error)
})

test('waitForRequest shares one budget with execute for the same origin (spacing mode)', async () => {
  // With the TypeScript module's spacing rule every start is ≥ 300 ms after the
  // previous one, whoever makes it.
  const sandbox = ctx.sandbox()
  ctx.emu.clearRequests()
  await lib.execute(ctx.client({ pacing: 'spacing' }), bashParams(sandbox, 'true'))
  const t0 = performance.now()
  await waitForRequest(ctx.url)
  await waitForRequest(ctx.url)
  const elapsed = performance.now() - t0
  assert.ok(elapsed >= 280, `two waits took only ${elapsed.toFixed(0)} ms`)
})
