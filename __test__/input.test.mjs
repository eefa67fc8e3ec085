// Input validation, HTTP rules and secrets (issue 2 §3 "Input", "HTTP").
// Bad input is rejected before any request is sent.
import { test, before } from 'node:test'
import assert from 'node:assert/strict'
import { createServer } from 'node:http'
import {
  lib, kinds, bashParams, rejection, assertNoSecrets, sleep,
  useEmulator
} from './helpers.mjs'

const { execute, executeStream, followProcess, shellQuote } = lib
let ctx
let sandbox
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() })

const BAD = [
  ['env name with a dash', { env: { 'BAD-NAME': 'x' } }, 'Invalid sandbox environment variable.'],
  ['env name starting with a digit', { env: { '1X': 'x' } }, 'Invalid sandbox environment variable.'],
  ['env name empty', { env: { '': 'x' } }, 'Invalid sandbox environment variable.'],
  ['env value not a string', { env: { A: 1 } }, 'Invalid sandbox environment variable.'],
  ['NUL in an env value', { env: { A: 'a\0b' } }, 'Sandbox command values cannot contain NUL.'],
  ['NUL in the command', { command: 'ec\0ho' }, 'Sandbox command values cannot contain NUL.'],
  ['NUL in an arg', { args: ['-c', 'echo \0'] }, 'Sandbox command values cannot contain NUL.'],
  ['NUL in cwd', { cwd: '/tmp/\0' }, 'Sandbox command values cannot contain NUL.'],
  ['empty command', { command: '' }, 'A sandbox command is required.'],
]

for (const [name, override, message] of BAD) {
  test(`rejects ${name} before any request`, async () => {
    const params = { ...bashParams(sandbox, 'echo hi'), ...override }
    const error = await rejection(execute(ctx.client(), params))
    assert.equal(error.message, message)
    assert.ok(error instanceof Error)
    const error2 = await rejection(executeStream(ctx.client(), params))
    assert.equal(error2.message, message)
    await sleep(20)
    assert.deepEqual(ctx.requests(), [])
  })
}

test('NUL in stdin is rejected before any request (or staged verbatim)', async () => {
  // stdin is a file, not a shell word: the TypeScript module staged it as is.
  // Either way nothing may run with a truncated value.
  const result = await execute(ctx.client(), bashParams(sandbox, 'od -An -c', { stdin: 'a\0b' })).then(
    (r) => ({ r }), (e) => ({ e }))
  if (result.e) {
    assert.equal(result.e.message, 'Sandbox command values cannot contain NUL.')
    assert.deepEqual(ctx.requests(), [])
  } else {
    assert.match(result.r.stdout, /a\s+\\0\s+b/)
  }
})

for (const bad of ['', 'has space', 'a/b', '../x', 'x'.repeat(201), 'semi;colon', 'ü']) {
  test(`rejects sandbox id ${JSON.stringify(bad.length > 20 ? `${bad.slice(0, 5)}…(${bad.length})` : bad)} before any request`, async () => {
    const error = await rejection(execute(ctx.client(), bashParams(bad, 'echo hi')))
    assert.ok(error instanceof Error)
    assert.ok(error.message.length > 0)
    assert.ok(!error.message.includes(bad) || bad === '', 'the message does not echo the id')
    await sleep(20)
    assert.deepEqual(ctx.requests(), [])
  })
}

test('a missing lease or providerLeaseId null is rejected before any request', async () => {
  for (const params of [{ command: 'echo' }, { lease: { providerLeaseId: null }, command: 'echo' }, { lease: null, command: 'echo' }]) {
    const error = await rejection(execute(ctx.client(), params))
    assert.ok(error instanceof Error)
  }
  assert.deepEqual(ctx.requests(), [])
})

test('followProcess validates both ids before any request', async () => {
  for (const [sb, pid] of [['bad id', 'p1'], [sandbox, 'bad/id'], [sandbox, '']]) {
    const error = await rejection(followProcess(ctx.client(), sb, pid, undefined, () => {}))
    assert.ok(error instanceof Error)
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

test('a redirect is refused and never followed; the key does not reach the target', async () => {
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
    const error = await rejection(execute(ctx.client(), bashParams(sandbox, 'echo hi', { stdin: 'x' })))
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

test('error messages never contain the key, the URL or a response body', async () => {
  const secretKey = ctx.apiKey
  const cases = [
    { route: 'createProcess', action: { kind: 'status', status: 400 } },
    { route: 'putFile', action: { kind: 'status', status: 500 } },
    { route: 'connect', action: { kind: 'status', status: 403 } },
    { route: 'connect', action: { kind: 'errorFrame', error: `secret-body-token ${secretKey}` } },
  ]
  for (const fault of cases) {
    ctx.reset()
    ctx.emu.addFault(fault)
    const error = await rejection(execute(ctx.client(), bashParams(sandbox, 'echo hi; sleep 5', { stdin: 'in' })))
    assertNoSecrets(error, [secretKey, ctx.url, `127.0.0.1`, 'secret-body-token', '/v1/'])
    assert.match(error.message, /^(CreateOS|Sandbox)/)
  }
  ctx.reset()
  // A connection that is refused names no URL either.
  const closed = createServer()
  await new Promise((resolve) => closed.listen(0, '127.0.0.1', resolve))
  const port = closed.address().port
  await new Promise((resolve) => closed.close(resolve))
  const error = await rejection(execute({ config: { apiUrl: `http://127.0.0.1:${port}`, timeoutMs: 2000 }, apiKey: 'k-secret-123' },
    bashParams(sandbox, 'echo')))
  assertNoSecrets(error, ['k-secret-123', String(port)])
})

test('the status in an API error is a number and the operation a fixed label', async () => {
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
  assert.deepEqual(ctx.emu.livePids(), [])
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
