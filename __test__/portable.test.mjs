// What runs on every platform, with no emulator (it is Linux only): the package loads, its
// pure functions work, and bad input is rejected before any request. The workflow's macOS
// and Windows test jobs run this file against the addon built for them.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const lib = require('../index.js')

test('the package loads and exports the module\'s names', () => {
  for (const name of ['execute', 'shellQuote', 'CreateosCleanupError', 'CreateosApiError', 'isCreateosCleanupError']) {
    assert.ok(name in lib, name)
  }
  assert.equal('startEmulator' in lib, false, 'the production package has no emulator')
  assert.equal('__panicForTest' in lib, false)
})

test('shellQuote quotes one bash word and refuses NUL', () => {
  assert.equal(lib.shellQuote("it's"), `'it'"'"'s'`)
  assert.throws(() => lib.shellQuote('a\0b'), { message: 'Sandbox command values cannot contain NUL.' })
})

test('bad input is rejected before any request (nothing listens on the port)', async () => {
  const client = { config: { apiUrl: 'http://127.0.0.1:9', timeoutMs: 1000 }, apiKey: 'k' }
  await assert.rejects(
    lib.execute(client, { lease: { providerLeaseId: 'bad id!' }, command: 'echo' }),
    { code: 'CREATEOS_INVALID_INPUT', message: /^Invalid sandbox ID\. \(lease\.providerLeaseId / },
  )
})

test('isCreateosCleanupError recognises the class by its brand', () => {
  const e = new lib.CreateosCleanupError('x', { reason: 'termination-unconfirmed' })
  assert.ok(lib.isCreateosCleanupError(e))
  assert.equal(lib.isCreateosCleanupError(new Error('x')), false)
})
