// Input validation, HTTP rules and secrets. Every caller mistake is one class,
// CreateosInputError (a TypeError) with code CREATEOS_INVALID_INPUT and a message naming
// the field, and nothing is sent.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createServer } from 'node:http'
import {
  lib, kinds, bashParams, rejection, assertNoSecrets, sleep,
  useEmulator, liveOfCalls, sessionMode, sessionConfig } from './helpers.mjs'

const { execute, executeStream, followProcess, shellQuote, destroySandbox, waitForRequest, CreateosInputError } = lib
let ctx
let sandbox
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() })

/** The one input-error contract: class, code, the field named, nothing internal. */
function assertInputError(error, field, label) {
  assert.ok(error instanceof CreateosInputError, `${label}: ${error && error.name}: ${error && error.message}`)
  assert.ok(error instanceof TypeError && error instanceof Error, label)
  assert.equal(error.name, 'CreateosInputError', label)
  assert.equal(error.code, 'CREATEOS_INVALID_INPUT', label)
  assert.ok(error.message.includes(field), `${label}: "${error.message}" names ${field}`)
  assert.doesNotMatch(error.message, /serde|InvalidArg|napi|JS functions|represented/i, label)
  assert.doesNotMatch(error.stack, /serde|InvalidArg/, label)
}

// Every kind of value that is not a string.
const NOT_STRINGS = [
  ['a Buffer', () => Buffer.from('x')],
  ['a Uint8Array', () => new Uint8Array([120])],
  ['a function', () => () => 'x'],
  ['a number', () => 5],
  ['a symbol', () => Symbol('x')],
  ['a bigint', () => 5n],
  ['an object', () => ({ toString: () => 'x' })],
  ['a boolean', () => true],
  ['an array', () => ['x']],
]

// [field named in the message, params built from a bad value]
const PARAM_FIELDS = [
  ['command', (v) => ({ ...bashParams(sandbox, 'echo'), command: v })],
  ['args[1]', (v) => ({ ...bashParams(sandbox, 'echo'), args: ['-c', v] })],
  ['args[0]', (v) => ({ ...bashParams(sandbox, 'echo'), args: [v] })],
  ['env.A', (v) => ({ ...bashParams(sandbox, 'echo'), env: { OK: 'x', A: v } })],
  ['stdin', (v) => ({ ...bashParams(sandbox, 'cat'), stdin: v })],
  ['cwd', (v) => ({ ...bashParams(sandbox, 'pwd'), cwd: v })],
  ['lease.providerLeaseId', (v) => ({ ...bashParams('x', 'echo'), lease: { providerLeaseId: v } })],
]

test('a non-string in any string field of the params: one class, one code, the field named, nothing sent', async () => {
  let cases = 0
  for (const [field, build] of PARAM_FIELDS) {
    for (const [kind, make] of NOT_STRINGS) {
      for (const [name, fn] of [['execute', execute], ['executeStream', executeStream]]) {
        const label = `${name}: ${field} is ${kind}`
        assertInputError(await rejection(fn(ctx.client(), build(make()))), field, label)
        cases++
      }
    }
  }
  assert.equal(cases, PARAM_FIELDS.length * NOT_STRINGS.length * 2)
  await sleep(20)
  assert.deepEqual(ctx.requests(), [])
})

// [field named, a bad value, how to call]
const CONTAINERS = [
  ['params', undefined, (v) => execute(ctx.client(), v)],
  ['params', 'echo hi', (v) => execute(ctx.client(), v)],
  ['params', null, (v) => executeStream(ctx.client(), v)],
  ['lease', undefined, (v) => execute(ctx.client(), { command: 'echo', lease: v })],
  ['lease', 'sb-1', (v) => execute(ctx.client(), { command: 'echo', lease: v })],
  ['args', 'echo hi', (v) => execute(ctx.client(), { ...bashParams(sandbox, 'echo'), args: v })],
  ['args', Buffer.from('x'), (v) => execute(ctx.client(), { ...bashParams(sandbox, 'echo'), args: v })],
  ['args', { 0: 'x' }, (v) => execute(ctx.client(), { ...bashParams(sandbox, 'echo'), args: v })],
  ['env', 'A=1', (v) => execute(ctx.client(), { ...bashParams(sandbox, 'echo'), env: v })],
  ['env', ['A=1'], (v) => execute(ctx.client(), { ...bashParams(sandbox, 'echo'), env: v })],
  ['env', Buffer.from('A=1'), (v) => execute(ctx.client(), { ...bashParams(sandbox, 'echo'), env: v })],
  ['command', '', (v) => execute(ctx.client(), { ...bashParams(sandbox, 'echo'), command: v })],
  ['command', undefined, (v) => execute(ctx.client(), { ...bashParams(sandbox, 'echo'), command: v })],
  ['client', undefined, (v) => execute(v, bashParams(sandbox, 'echo'))],
  ['client', 'https://api.sb.createos.sh', (v) => execute(v, bashParams(sandbox, 'echo'))],
  ['client.config', undefined, (v) => execute({ apiKey: 'k', config: v }, bashParams(sandbox, 'echo'))],
  ['client.config', 'https://x', (v) => execute({ apiKey: 'k', config: v }, bashParams(sandbox, 'echo'))],
  ['apiUrl', undefined, (v) => execute({ apiKey: 'k', config: { apiUrl: v } }, bashParams(sandbox, 'echo'))],
  ['apiUrl', () => 'http://127.0.0.1:1', (v) => execute({ apiKey: 'k', config: { apiUrl: v } }, bashParams(sandbox, 'echo'))],
  ['apiUrl', new URL('http://127.0.0.1:1'), (v) => execute({ apiKey: 'k', config: { apiUrl: v } }, bashParams(sandbox, 'echo'))],
  ['signal', 'timeout', (v) => execute(ctx.client(), bashParams(sandbox, 'echo'), v)],
  ['signal', 5000, (v) => execute(ctx.client(), bashParams(sandbox, 'echo'), v)],
  ['signal', {}, (v) => executeStream(ctx.client(), bashParams(sandbox, 'echo'), v)],
  ['log', 'stdout', (v) => execute(ctx.client(), bashParams(sandbox, 'echo'), undefined, v)],
  ['log', {}, (v) => executeStream(ctx.client(), bashParams(sandbox, 'echo'), undefined, v)],
  ['sandboxId', 5, (v) => followProcess(ctx.client(), v, 'p1', undefined, () => {})],
  ['processId', Buffer.from('p'), (v) => followProcess(ctx.client(), sandbox, v, undefined, () => {})],
  ['onData', undefined, (v) => followProcess(ctx.client(), sandbox, 'p1', undefined, v)],
  ['onConnected', 'yes', (v) => followProcess(ctx.client(), sandbox, 'p1', undefined, () => {}, v)],
  ['signal', 'x', (v) => followProcess(ctx.client(), sandbox, 'p1', v, () => {})],
  ['sandboxId', () => 'sb', (v) => destroySandbox(ctx.client(), v)],
  ['client', null, (v) => destroySandbox(v, sandbox)],
  ['apiUrl', 5, (v) => waitForRequest(v)],
  ['signal', 'x', (v) => waitForRequest(ctx.url, v)],
]

test('a missing or mistyped client, config, params, signal or callback: one class, one code, the field named', async () => {
  for (const [field, value, call] of CONTAINERS) {
    const label = `${field} = ${typeof value === 'string' ? JSON.stringify(value) : typeof value}`
    assertInputError(await rejection(call(value)), field, label)
  }
  await sleep(20)
  assert.deepEqual(ctx.requests(), [])
})

test('shellQuote: a non-string and NUL are input errors', () => {
  for (const [kind, make] of NOT_STRINGS) {
    let error
    try { shellQuote(make()) } catch (e) { error = e }
    assertInputError(error, 'value', `shellQuote(${kind})`)
  }
  let nul
  try { shellQuote('a\0b') } catch (e) { nul = e }
  assert.ok(nul instanceof CreateosInputError)
  assert.equal(nul.message, 'Sandbox command values cannot contain NUL.')
})

// [field named, config override]: every config field, with a value of the wrong type or range.
const CONFIG_FIELDS = [
  ['timeoutMs', { timeoutMs: '5000' }],
  ['timeoutMs', { timeoutMs: Buffer.from('1') }],
  ['timeoutMs', { timeoutMs: 0 }],
  ['pacing', { pacing: 'fast' }],
  ['pacing', { pacing: () => 'off' }],
  ['pacing.limit', { pacing: { limit: 0 } }],
  ['pacing.limit', { pacing: { limit: () => 5 } }],
  ['pacing.limit', { pacing: { limit: 5n } }],
  ['pacing.windowMs', { pacing: { windowMs: '1s' } }],
  ['pacing.intervalMs', { pacing: { intervalMs: -1 } }],
  ['pacing.store', { pacing: { store: true } }],
  ['pacing.store', { pacing: { store: Symbol('s') } }],
  ['pacing.key', { pacing: { key: 5 } }],
  ['cleanupGraceMs', { cleanupGraceMs: 1000 }],
  ['cleanupGraceMs', { cleanupGraceMs: [1000, Buffer.from('1')] }],
  ['cleanupDeadlineMs', { cleanupDeadlineMs: 'soon' }],
  ['confirmPollMs', { confirmPollMs: {} }],
  ['legacyCleanup', { legacyCleanup: 'yes' }],
  ['leftoverProcesses', { leftoverProcesses: true }],
  ['streamIdleTimeoutMs', { streamIdleTimeoutMs: () => 1 }],
  ['proxy', { proxy: 5 }],
  ['proxy', { proxy: Buffer.from('http://p:1') }],
  ['caCertPem', { caCertPem: Buffer.from('-----BEGIN CERTIFICATE-----') }],
  ['pacing.allowPlaintextPassword', { pacing: { allowPlaintextPassword: 'yes' } }],
  ['pacing.allowPlaintextPassword', { pacing: { store: 'redis://127.0.0.1:6379', allowPlaintextPassword: 1 } }],
  ['cleanupGraceMs[2]', { cleanupGraceMs: [1, 2, '3'] }],
  ['cleanupGraceMs', { cleanupGraceMs: new Array(17).fill(100) }],
  ['pacing.key', { pacing: { key: 'has space' } }],
]

test('a bad value in any config field: one class, one code, the field named, nothing sent', async () => {
  for (const [field, override] of CONFIG_FIELDS) {
    const label = `config ${field}: ${Object.keys(override)}`
    assertInputError(await rejection(execute(ctx.client(override), bashParams(sandbox, 'echo'))), field, label)
    assertInputError(await rejection(destroySandbox(ctx.client(override), sandbox)), field, `destroySandbox ${label}`)
  }
  await sleep(20)
  assert.deepEqual(ctx.requests(), [])
})

// A limit is stated in the message, with what was given (a number, a count, never a string's content).
const LIMITS = [
  [{ cleanupGraceMs: new Array(17).fill(100) }, 'cleanupGraceMs must be a non-empty array of at most 16 integers between 0 and 600000. (got 17 entries)'],
  [{ cleanupGraceMs: [] }, 'cleanupGraceMs must be a non-empty array of at most 16 integers between 0 and 600000. (got 0 entries)'],
  [{ cleanupGraceMs: [100, 600001] }, 'cleanupGraceMs must be a non-empty array of at most 16 integers between 0 and 600000. (cleanupGraceMs[1] is 600001)'],
  [{ timeoutMs: 86_400_001 }, 'timeoutMs must be an integer between 1 and 86400000. (got 86400001)'],
  [{ streamIdleTimeoutMs: 999 }, 'streamIdleTimeoutMs must be an integer between 1000 and 3600000. (got 999)'],
  [{ pacing: { limit: 1.5 } }, 'pacing.limit must be an integer between 1 and 1000000. (got 1.5)'],
  [{ pacing: { key: 'x'.repeat(201) } }, 'pacing.key must be 1 to 200 printable ASCII characters without spaces or braces, and must not contain the API key. (got an unsupported string)'],
  [{ pacing: { allowPlaintextPassword: 'yes' } }, 'pacing.allowPlaintextPassword must be true or false. (got a string)'],
  [{ leftoverProcesses: 'kill' }, "leftoverProcesses must be 'keep' or 'terminate'. (got an unsupported string)"],
]

test('a value out of its range: the message states the limit and what was given, nothing sent', async () => {
  for (const [override, message] of LIMITS) {
    const error = await rejection(execute(ctx.client(override), bashParams(sandbox, 'echo')))
    assert.ok(error instanceof CreateosInputError, `${JSON.stringify(Object.keys(override))}: ${error}`)
    assert.equal(error.message, message)
  }
  await sleep(20)
  assert.deepEqual(ctx.requests(), [])
})

test('a pacing key that contains the API key is refused without showing either', async () => {
  const error = await rejection(execute(ctx.client({ pacing: { key: `team-${ctx.apiKey}` } }), bashParams(sandbox, 'echo')))
  assert.ok(error instanceof CreateosInputError)
  assert.match(error.message, /^pacing\.key must be .* \(it contains the API key\)$/)
  assertNoSecrets(error, [ctx.apiKey])
  assert.deepEqual(ctx.requests(), [])
})

// Value rules: the same class and code, with the TypeScript module's text first and the field
// after it in parentheses (a host matching the old text still matches).
const BAD = [
  ['env name with a dash', { env: { 'MY-VAR': 'x' } }, 'Invalid sandbox environment variable. (env key "MY-VAR")'],
  ['env name starting with a digit', { env: { '1X': 'x' } }, 'Invalid sandbox environment variable. (env key "1X")'],
  ['env name empty', { env: { '': 'x' } }, 'Invalid sandbox environment variable. (env key "")'],
  ['env name with a newline', { env: { 'A\nB': 'x' } }, 'Invalid sandbox environment variable. (env key "A\\nB")'],
  ['env name too long to show', { env: { [`${'X'.repeat(70)}-`]: 'x' } }, `Invalid sandbox environment variable. (env key "${'X'.repeat(64)}"…)`],
  ['env value not a string', { env: { A: 1 } }, 'Invalid sandbox environment variable. (env.A must be a string; got a number)'],
  ['NUL in an env value', { env: { A: 'a\0b' } }, 'Sandbox command values cannot contain NUL. (env.A)'],
  ['NUL in the command', { command: 'ec\0ho' }, 'Sandbox command values cannot contain NUL. (command)'],
  ['NUL in an arg', { args: ['-c', 'echo \0'] }, 'Sandbox command values cannot contain NUL. (args[1])'],
  ['NUL in cwd', { cwd: '/tmp/\0' }, 'Sandbox command values cannot contain NUL. (cwd)'],
  ['empty command', { command: '' }, 'A sandbox command is required. (command must be a non-empty string; got an empty string)'],
  ['env a Map', { env: new Map([['FOO', 'bar']]) }, 'env must be a plain object whose values are strings (got a Map).'],
  ['env a class instance', { env: new (class HostEnv { constructor() { this.FOO = 'bar' } })() }, 'env must be a plain object whose values are strings (got an instance of HostEnv).'],
  ['env an array', { env: [['FOO', 'bar']] }, 'env must be a plain object whose values are strings (got an array).'],
]

for (const [name, override, message] of BAD) {
  test(`rejects ${name} before any request`, async () => {
    const params = { ...bashParams(sandbox, 'echo hi'), ...override }
    const error = await rejection(execute(ctx.client(), params))
    assert.equal(error.message, message)
    assert.ok(error instanceof CreateosInputError)
    assert.equal(error.code, 'CREATEOS_INVALID_INPUT')
    const error2 = await rejection(executeStream(ctx.client(), params))
    assert.equal(error2.message, message)
    await sleep(20)
    assert.deepEqual(ctx.requests(), [])
  })
}

test('an env name that holds the API key or a store password is named by its position, never shown', async () => {
  const key = ctx.apiKey
  const store = 'redis://:pw-9f3e1c@127.0.0.1:6379/0'
  const cases = [
    [{}, { OK: 'x', [`${key}-X`]: 'v' }, 'Invalid sandbox environment variable. (env key #2, which holds a secret of the client)'],
    [{}, { [`T_${key}`]: 'a\0b' }, 'Sandbox command values cannot contain NUL. (env key #1)'],
    [{ pacing: { store } }, { 'x-pw-9f3e1c': 'v' }, 'Invalid sandbox environment variable. (env key #1, which holds a secret of the client)'],
  ]
  for (const [config, env, message] of cases) {
    const error = await rejection(execute(ctx.client(config), { ...bashParams(sandbox, 'echo'), env }))
    assert.ok(error instanceof CreateosInputError, String(error))
    assert.equal(error.message, message)
    assertNoSecrets(error, [key, 'pw-9f3e1c'])
  }
  assert.deepEqual(ctx.requests(), [])
})

test('env as an object from another realm or with no prototype is a plain object: its variables are set', async () => {
  const { runInNewContext } = await import('node:vm')
  const bare = Object.create(null)
  bare.B = 'two'
  for (const env of [runInNewContext('({ A: "one" })'), bare]) {
    const r = await execute(ctx.client(), { ...bashParams(sandbox, 'echo "${A:-}${B:-}"'), env })
    assert.equal(r.stdout, `${env.A ?? ''}${env.B ?? ''}\n`)
  }
})

test('NUL in stdin is rejected before any request (or staged verbatim)', async () => {
  // stdin is a file, not a shell word: the TypeScript module staged it as is.
  // Either way nothing may run with a truncated value.
  const result = await execute(ctx.client(), bashParams(sandbox, 'od -An -c', { stdin: 'a\0b' })).then(
    (r) => ({ r }), (e) => ({ e }))
  if (result.e) {
    assert.equal(result.e.message, 'Sandbox command values cannot contain NUL. (stdin)')
    assert.deepEqual(ctx.requests(), [])
  } else {
    assert.match(result.r.stdout, /a\s+\\0\s+b/)
  }
})

for (const bad of ['', 'has space', 'a/b', '../x', 'x'.repeat(201), 'semi;colon', 'ü']) {
  test(`rejects sandbox id ${JSON.stringify(bad.length > 20 ? `${bad.slice(0, 5)}…(${bad.length})` : bad)} before any request`, async () => {
    const error = await rejection(execute(ctx.client(), bashParams(bad, 'echo hi')))
    assert.ok(error instanceof CreateosInputError)
    assert.equal(error.code, 'CREATEOS_INVALID_INPUT')
    assert.equal(error.message, "Invalid sandbox ID. (lease.providerLeaseId must be 1 to 200 letters, digits, '-' or '_')")
    assert.ok(!error.message.includes(bad) || bad === '', 'the message does not echo the id')
    await sleep(20)
    assert.deepEqual(ctx.requests(), [])
  })
}

test('a missing lease or providerLeaseId null is rejected before any request', async () => {
  for (const params of [{ command: 'echo' }, { lease: { providerLeaseId: null }, command: 'echo' }, { lease: null, command: 'echo' }]) {
    const error = await rejection(execute(ctx.client(), params))
    assertInputError(error, 'lease', JSON.stringify(params))
  }
  assert.deepEqual(ctx.requests(), [])
})

test('followProcess validates both ids before any request', async () => {
  for (const [sb, pid] of [['bad id', 'p1'], [sandbox, 'bad/id'], [sandbox, '']]) {
    const error = await rejection(followProcess(ctx.client(), sb, pid, undefined, () => {}))
    assert.ok(error instanceof CreateosInputError)
    assert.match(error.message, /^Invalid (sandbox ID\. \(sandboxId|process ID\. \(processId) must be 1 to 200 letters, digits, '-' or '_'\)$/)
  }
  assert.deepEqual(ctx.requests(), [])
})

test('the API URL must be HTTPS except on loopback', async () => {
  for (const apiUrl of ['http://example.com', 'ftp://127.0.0.1', 'https://user:pw@example.com', 'https://example.com/other', 'not a url', 'https://example.com/?q=1']) {
    const error = await rejection(execute({ config: { apiUrl, timeoutMs: 1000 }, apiKey: 'k' }, bashParams(sandbox, 'echo')))
    assert.equal(error.message, 'CreateOS API URL must be an HTTPS origin (optionally ending in /v1); HTTP is allowed on loopback only.')
    assert.ok(!error.message.includes('pw'))
  }
})

test('the API URL may end in /v1', async () => {
  const r = await execute(ctx.client({ apiUrl: `${ctx.url}/v1` }), bashParams(sandbox, 'echo v1'))
  assert.equal(r.stdout, 'v1\n')
})

test('a missing API key is rejected before any request', async () => {
  const saved = process.env.CREATEOS_API_KEY
  delete process.env.CREATEOS_API_KEY
  try {
    const error = await rejection(execute({ config: { apiUrl: ctx.url } }, bashParams(sandbox, 'echo')))
    assert.equal(error.message, 'CreateOS requires an API key in the environment config or CREATEOS_API_KEY.')
    assert.deepEqual(ctx.requests(), [])
  } finally {
    if (saved !== undefined) process.env.CREATEOS_API_KEY = saved
  }
})

test('a redirect is refused and never followed; the key does not reach the target', async (t) => {
  // In session mode on a sandbox of the test's own: the first request is then the creation
  // of a new supervisor, as it is the command's creation in the default mode.
  const sb = ctx.sandboxFor(t, sandbox)
  const hits = []
  const target = createServer((req, res) => {
    hits.push({ url: req.url, key: req.headers['x-api-key'] })
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end('{"status":"success","data":{}}')
  })
  await new Promise((resolve) => target.listen(0, '127.0.0.1', resolve))
  const location = `http://127.0.0.1:${target.address().port}/v1/stolen`
  try {
    ctx.emu.addFault({ action: { kind: 'redirect', location } })
    const error = await rejection(execute(ctx.client(), bashParams(sb, 'echo hi', { stdin: 'x' })))
    assert.ok(error instanceof Error)
    assert.ok(!lib.isCreateosCleanupError(error) || error.reason === 'creation-unconfirmed')
    assertNoSecrets(error, [ctx.apiKey, location, String(target.address().port)])
    assert.deepEqual(hits, [], 'no request reached the redirect target')
    const first = ctx.requests()[0]
    assert.equal(first.status, 307)
  } finally {
    ctx.emu.clearFaults()
    await new Promise((resolve) => target.close(resolve))
  }
})

test('error messages never contain the key, the URL or a response body', async (t) => {
  const secretKey = ctx.apiKey
  const cases = [
    { route: 'createProcess', action: { kind: 'status', status: 400 } },
    // The session mode uploads the stdin in the command's input record, not the files API.
    { route: sessionMode() ? 'input' : 'putFile', action: { kind: 'status', status: 500 } },
    { route: 'connect', action: { kind: 'status', status: 403 } },
    { route: 'connect', action: { kind: 'errorFrame', error: `secret-body-token ${secretKey}` } },
  ]
  for (const fault of cases) {
    ctx.reset()
    // In session mode each case on a sandbox of its own: a new supervisor, whose creation and
    // stream the faults reach.
    const sb = ctx.sandboxFor(t, sandbox)
    ctx.emu.addFault(fault)
    const error = await rejection(execute(ctx.client(), bashParams(sb, 'echo hi; sleep 5', { stdin: 'in' })))
    if (sessionMode()) assert.ok(kinds(ctx.requests()).includes(fault.route), `the fault's route was requested: ${kinds(ctx.requests())}`)
    assertNoSecrets(error, [secretKey, ctx.url, `127.0.0.1`, 'secret-body-token', '/v1/'])
    assert.match(error.message, /^(CreateOS|Sandbox)/)
  }
  ctx.reset()
  // A connection that is refused names no URL either.
  const closed = createServer()
  await new Promise((resolve) => closed.listen(0, '127.0.0.1', resolve))
  const port = closed.address().port
  await new Promise((resolve) => closed.close(resolve))
  const error = await rejection(execute({ config: { apiUrl: `http://127.0.0.1:${port}`, timeoutMs: 2000, ...sessionConfig() }, apiKey: 'k-secret-123' },
    bashParams(sandbox, 'echo')))
  assertNoSecrets(error, ['k-secret-123', String(port)])
})

test('the status in an API error is a number and the operation a fixed label', async () => {
  if (sessionMode()) {
    // The session mode stages nothing: its stdin goes in the input record. A 403 on it is
    // final, and the supervisor, whose input failed, is ended and its end confirmed.
    await execute(ctx.client(), bashParams(sandbox, 'true'))
    ctx.reset()
    ctx.emu.addFault({ route: 'input', times: 1, action: { kind: 'status', status: 403 } })
    const error = await rejection(execute(ctx.client(), bashParams(sandbox, 'echo', { stdin: 'x' })))
    assert.ok(error instanceof lib.CreateosApiError)
    assert.equal(error.status, 403)
    assert.equal(error.message, 'CreateOS request failed (HTTP 403) during process input.')
    const k = kinds(ctx.requests())
    assert.deepEqual(k.filter((x) => x === 'input'), ['input'], k.join(','))
    assert.ok(k.includes('deleteProcess'), k.join(','))
    assert.deepEqual(liveOfCalls(ctx.emu), [])
    return
  }
  // (A 503 on an idempotent PUT is retried; a 403 is final.)
  ctx.emu.addFault({ route: 'putFile', times: 1, action: { kind: 'status', status: 403 } })
  const error = await rejection(execute(ctx.client(), bashParams(sandbox, 'echo', { stdin: 'x' })))
  assert.ok(error instanceof lib.CreateosApiError)
  assert.equal(error.status, 403)
  assert.equal(error.message, 'CreateOS request failed (HTTP 403) during file transfer.')
  // stdin is staged while the process is created: the process that waited on its gate was
  // ended (and its end confirmed) before the error was returned; the gate never opened.
  const k = kinds(ctx.requests())
  assert.deepEqual(k.filter((x) => x === 'createProcess'), ['createProcess'], k.join(','))
  assert.ok(k.includes('deleteProcess'), k.join(','))
  assert.equal(k.includes('connect'), false, k.join(','))
  assert.deepEqual(liveOfCalls(ctx.emu), [])
})

test('shellQuote quotes like the TypeScript module and rejects NUL', () => {
  assert.equal(shellQuote(''), "''")
  assert.equal(shellQuote('abc'), "'abc'")
  assert.equal(shellQuote("it's"), `'it'"'"'s'`)
  assert.equal(shellQuote('$HOME `x` "y" \\ \n'), `'$HOME \`x\` "y" \\ \n'`)
  assert.equal(shellQuote('🎉é'), "'🎉é'")
  assert.throws(() => shellQuote('a\0b'), { message: 'Sandbox command values cannot contain NUL.' })
})

test('shellQuote output survives bash unchanged', async () => {
  const values = ["it's", '$(id)', '`id`', '\\', '"', "'", "''", '\n', ' a  b ', '*', '~', '!', '🎉']
  const script = `printf '%s\\0' ${values.map(shellQuote).join(' ')}`
  const r = await execute(ctx.client(), bashParams(sandbox, script))
  assert.deepEqual(r.stdout.split('\0').slice(0, -1), values)
})

// A misspelled key is reported once (it would otherwise be ignored silently); a host's own
// fields, far from every known key, are not.
test('a key within two edits of a known one warns once, naming it; host fields do not', async () => {
  const warnings = []
  const onWarning = (w) => { if (w.code === 'CREATEOS_CONFIG_UNKNOWN_FIELD') warnings.push(w.message) }
  process.on('warning', onWarning)
  try {
    const config = {
      pacnig: 'off', timeout: 5000, cleanupGraceMS: [1], region: 'eu', shape: 'small', rootfs: null,
      egressAllowlist: [], reuseLease: true, autoPauseAfterSeconds: 60, pacing: { limit: 100, interval: 5, describe() {} },
    }
    for (let i = 0; i < 2; i++) {
      const r = await execute(ctx.client(config), bashParams(sandbox, 'echo ok'))
      assert.equal(r.stdout, 'ok\n')
    }
    await sleep(20)
    assert.deepEqual(warnings.sort(), [
      'createos-execute: the config field "cleanupGraceMS" is not one this package reads (did you mean "cleanupGraceMs"?); it is ignored.',
      'createos-execute: the config field "pacing.interval" is not one this package reads (did you mean "pacing.intervalMs"?); it is ignored.',
      'createos-execute: the config field "pacnig" is not one this package reads (did you mean "pacing"?); it is ignored.',
      'createos-execute: the config field "timeout" is not one this package reads (did you mean "timeoutMs"?); it is ignored.',
    ])
  } finally {
    process.off('warning', onWarning)
  }
})
