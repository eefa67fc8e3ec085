// client.config as hosts build it (issue 13 §4): methods, symbols, throwing getters
// and class instances on the config object are ignored; only the known fields are
// read, and each is validated with its own message.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { lib, kinds, bashParams, rejection, sleep, useEmulator } from './helpers.mjs'

const { execute } = lib
let ctx
let sandbox
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() })

class Region {
  constructor(name) { this.name = name }
  toString() { return this.name }
}

class HostConfig {
  constructor(apiUrl) {
    this.apiUrl = apiUrl
    this.timeoutMs = 5000
    this.region = new Region('eu')
    this.created = new Date()
    this.pattern = /x/g
    this.counter = 10n
    this.tags = new Map([['a', 1]])
    this[Symbol('secret')] = 'hidden'
    this.marker = Symbol('marker')
    this.onChange = () => {}
  }
  get shape() { throw new Error('not loaded') }
  describe() { return 'config' }
}

test('a config with methods, symbols, throwing getters and class instances runs', async () => {
  const config = new HostConfig(ctx.url)
  Object.defineProperty(config, 'lazy', { enumerable: true, get() { throw new Error('lazy') } })
  const client = { config, apiKey: ctx.apiKey, refresh() {} }
  const r = await execute(client, bashParams(sandbox, 'echo ok'))
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'ok\n')
  assert.ok(kinds(ctx.requests()).includes('createProcess'))
})

test('a known field is read through a getter and validated', async () => {
  const config = { get apiUrl() { return ctx.url }, get timeoutMs() { return 5000 }, pacing: 'off' }
  const r = await execute({ config, apiKey: ctx.apiKey }, bashParams(sandbox, 'echo ok'))
  assert.equal(r.stdout, 'ok\n')
})

test('a nested known object ignores extra members and methods', async () => {
  const pacing = { limit: 100, windowMs: 1000, describe() { return 'x' }, [Symbol('s')]: 1 }
  const r = await execute(ctx.client({ pacing }), bashParams(sandbox, 'echo ok'))
  assert.equal(r.stdout, 'ok\n')
})

const BAD = [
  ['timeoutMs is a function', { timeoutMs: () => 5000 }, 'timeoutMs must be an integer between 1 and 86400000. (got a function)'],
  ['timeoutMs is a symbol', { timeoutMs: Symbol('t') }, 'timeoutMs must be an integer between 1 and 86400000. (got a symbol)'],
  ['timeoutMs is a bigint', { timeoutMs: 5000n }, 'timeoutMs must be an integer between 1 and 86400000. (got a bigint)'],
  ['timeoutMs is NaN', { timeoutMs: Number.NaN }, 'timeoutMs must be an integer between 1 and 86400000. (got NaN)'],
  ['pacing is a function', { pacing: () => 'off' }, /^pacing must be 'window', 'spacing', 'off' or an object.* \(got a function\)$/],
  ['pacing.limit is a function', { pacing: { limit: () => 5 } }, 'pacing.limit must be an integer between 1 and 1000000. (got a function)'],
  ['a cleanupGraceMs entry is a function', { cleanupGraceMs: [1000, () => 1] }, 'cleanupGraceMs must be a non-empty array of at most 16 integers between 0 and 600000. (cleanupGraceMs[1] is a function)'],
  ['confirmPollMs is an object', { confirmPollMs: new Region('x') }, 'confirmPollMs must be an integer between 1 and 600000. (got an instance of Region)'],
]
for (const [name, override, message] of BAD) {
  test(`rejects a config whose ${name}, before any request`, async () => {
    const error = await rejection(execute(ctx.client(override), bashParams(sandbox, 'echo hi')))
    if (message instanceof RegExp) assert.match(error.message, message)
    else assert.equal(error.message, message)
    await sleep(20)
    assert.deepEqual(ctx.requests(), [])
  })
}

test('a throwing getter on a known field is that field being invalid', async () => {
  const config = { apiUrl: ctx.url, get timeoutMs() { throw new Error('boom') } }
  const error = await rejection(execute({ config, apiKey: ctx.apiKey }, bashParams(sandbox, 'echo hi')))
  assert.equal(error.message, 'timeoutMs must be an integer between 1 and 86400000. (got a throwing getter)')
  assert.ok(!error.message.includes('boom'))
})

test('an apiUrl that is not a string is the missing-URL error', async () => {
  for (const apiUrl of [() => ctx.url, Symbol('u'), undefined]) {
    const error = await rejection(execute({ config: { apiUrl }, apiKey: ctx.apiKey }, bashParams(sandbox, 'echo hi')))
    assert.ok(error instanceof TypeError)
    assert.match(error.message, /^CreateOS requires an API URL\. \(apiUrl must be a string; got (a function|a symbol|undefined)\)$/)
  }
  const config = { get apiUrl() { throw new Error('boom') } }
  const error = await rejection(execute({ config, apiKey: ctx.apiKey }, bashParams(sandbox, 'echo hi')))
  assert.equal(error.message, 'CreateOS requires an API URL. (apiUrl must be a string; got a throwing getter)')
})

test('a throwing apiKey getter on the client falls back to config.apiKey', async () => {
  const client = { config: { apiUrl: ctx.url, apiKey: ctx.apiKey, timeoutMs: 5000 }, get apiKey() { throw new Error('x') } }
  const r = await execute(client, bashParams(sandbox, 'echo ok'))
  assert.equal(r.stdout, 'ok\n')
})

test('CONFIG_FIELDS in lib/config.js lists every field the native config reads', async () => {
  const { readFileSync } = await import('node:fs')
  const { ROOT } = await import('./helpers.mjs')
  const rust = readFileSync(`${ROOT}/crates/core/src/config.rs`, 'utf8')
  const js = readFileSync(`${ROOT}/lib/config.js`, 'utf8')
  const listed = new Set([...js.slice(js.indexOf('const CONFIG_FIELDS'), js.indexOf('])', js.indexOf('const CONFIG_FIELDS')))
    .matchAll(/'([A-Za-z_]+)'/g)].map((m) => m[1]))
  // Top-level keys of the client object (`m`); the command's fields are parsed from params,
  // and pacingStoreDefault comes from the environment only.
  const notConfig = new Set(['args', 'command', 'cwd', 'env', 'stdin', 'bypassSession', 'pacingStoreDefault'])
  const read = [...new Set([...rust.matchAll(/opt\(m, "([A-Za-z_]+)"\)/g)].map((m) => m[1]))].filter((k) => !notConfig.has(k))
  assert.ok(read.length >= 10, read.join(','))
  assert.deepEqual(read.filter((k) => !listed.has(k)), [])
})

test('the JS checks use the native checks\' texts (one wording whichever layer refuses)', async () => {
  const { readFileSync } = await import('node:fs')
  const { createRequire } = await import('node:module')
  const { ROOT } = await import('./helpers.mjs')
  const { MESSAGES } = createRequire(import.meta.url)('../lib/config.js')
  const rust = ['config.rs', 'net.rs', 'client.rs'].map((f) => readFileSync(`${ROOT}/crates/core/src/${f}`, 'utf8')).join('\n')
  const texts = new Set([...rust.matchAll(/pub const [A-Z_]+: &str =\s*"((?:[^"\\]|\\.)*)";/g)].map((m) => m[1].replace(/\\"/g, '"')))
  // The JS text says more than the native one: the entry limit (the native check has it too).
  // `transport` is decided in JS only (lib/fetch-transport.js): no native text to match.
  const jsOnly = new Set(['apiUrl', 'cleanupGraceMs', 'pacing.allowPlaintextPassword', 'transport'])
  const missing = Object.entries(MESSAGES).filter(([field, text]) => !jsOnly.has(field) && !texts.has(text))
  assert.deepEqual(missing, [])
  assert.ok(Object.keys(MESSAGES).length >= 15)
})
