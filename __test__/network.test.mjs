// Real networks (issue 10), from the host's side: Node's proxy and trust conventions, HTTPS
// with the emulator's CA over HTTP/2 and HTTP/1.1, a server that holds its response headers,
// and a start gate that cannot be opened. Rules read from the environment (once per process,
// as Node does) run in child processes (`net-child.cjs`). Every test asserts on what the
// emulator saw (its request log) as well as on the result.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import net from 'node:net'
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { lib, startEmu, kinds, rejection, assertNoSecrets, bashParams, netChild, liveOfCalls } from './helpers.mjs'

const FILE = fileURLToPath(import.meta.url)
const { execute } = lib

const UNTRUSTED = 'CreateOS TLS certificate is not trusted.'
const NOT_STARTED = 'CreateOS command did not start; its start gate could not be opened.'

const emus = []
async function emulator(options = {}) {
  const ctx = await startEmu(options)
  emus.push(ctx)
  return ctx
}
after(async () => {
  for (const ctx of emus) await ctx.close(FILE)
})

const tmp = mkdtempSync(join(tmpdir(), 'createos-net-test-'))
after(() => rmSync(tmp, { recursive: true, force: true }))

/** A loopback port with nothing listening on it. */
async function closedPort() {
  const s = net.createServer()
  await new Promise((r) => s.listen(0, '127.0.0.1', r))
  const { port } = s.address()
  await new Promise((r) => s.close(r))
  return port
}

/**
 * A CONNECT proxy on loopback: `createos.test:PORT` is tunnelled to 127.0.0.1:PORT. It records
 * every CONNECT target, every plain (non-CONNECT) request, and every byte the client sent.
 */
async function connectProxy() {
  const seen = { connects: [], plain: [], bytes: [], auth: [] }
  const sockets = new Set()
  const server = http.createServer((req, res) => {
    seen.plain.push(`${req.method} ${req.url}`)
    res.writeHead(502).end()
  })
  server.on('connect', (req, client, head) => {
    seen.connects.push(req.url)
    seen.auth.push(req.headers['proxy-authorization'] ?? null)
    sockets.add(client)
    const m = /^createos\.test:(\d+)$/.exec(req.url)
    if (!m) {
      client.end('HTTP/1.1 403 Forbidden\r\n\r\n')
      return
    }
    const upstream = net.connect(Number(m[1]), '127.0.0.1', () => {
      client.write('HTTP/1.1 200 Connection Established\r\n\r\n')
      if (head.length) { seen.bytes.push(Buffer.from(head)); upstream.write(head) }
      client.on('data', (c) => { seen.bytes.push(Buffer.from(c)); upstream.write(c) })
      upstream.pipe(client)
    })
    sockets.add(upstream)
    const end = () => { client.destroy(); upstream.destroy() }
    upstream.on('error', end)
    client.on('error', end)
    upstream.on('close', end)
    client.on('close', end)
  })
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    port: server.address().port,
    seen,
    sentText: () => Buffer.concat(seen.bytes).toString('latin1'),
    async close() {
      for (const s of sockets) s.destroy()
      await new Promise((r) => server.close(r))
    },
  }
}

function emuClient(ctx, config = {}) {
  return { config: { apiUrl: ctx.url, timeoutMs: 8000, pacing: 'off', ...config }, apiKey: ctx.apiKey }
}

test('a dead proxy in every proxy variable changes nothing, with and without NODE_USE_ENV_PROXY=1', async () => {
  const ctx = await emulator()
  const sb = ctx.sandbox()
  const dead = `http://127.0.0.1:${await closedPort()}`
  const env = {
    HTTP_PROXY: dead, http_proxy: dead, HTTPS_PROXY: dead, https_proxy: dead,
    ALL_PROXY: `socks5://127.0.0.1:${await closedPort()}`, all_proxy: 'socks5://127.0.0.1:1',
  }
  for (const extra of [{}, { NODE_USE_ENV_PROXY: '1' }]) {
    ctx.reset()
    const out = await netChild(emuClient(ctx), bashParams(sb, 'echo through; cat', { stdin: 'in\n' }), { ...env, ...extra })
    assert.equal(out.ok, true, JSON.stringify(out))
    assert.equal(out.result.exitCode, 0)
    assert.equal(out.result.stdout, 'through\nin\n')
    const k = kinds(ctx.requests())
    assert.deepEqual([...k.slice(0, 2)].sort(), ['createProcess', 'putFile'], k.join(','))
    assert.deepEqual(k.slice(2), ['connect', 'putFile'])
  }
})

test('NODE_USE_ENV_PROXY=1: HTTPS goes through the proxy as CONNECT, and the key never crosses it in clear', async () => {
  const ctx = await emulator({ tls: true })
  const proxy = await connectProxy()
  try {
    const sb = ctx.sandbox()
    const port = new URL(ctx.url).port
    const caFile = join(tmp, 'ca-proxy.pem')
    writeFileSync(caFile, ctx.emu.caPem)
    const client = emuClient(ctx, { apiUrl: `https://createos.test:${port}` })
    const out = await netChild(client, bashParams(sb, 'echo proxied'), {
      NODE_USE_ENV_PROXY: '1', HTTPS_PROXY: proxy.url, NO_PROXY: 'localhost,127.0.0.1', NODE_EXTRA_CA_CERTS: caFile,
    })
    assert.equal(out.ok, true, JSON.stringify(out))
    assert.equal(out.result.stdout, 'proxied\n')
    assert.ok(proxy.seen.connects.length >= 1, 'the traffic went through the proxy')
    assert.ok(proxy.seen.connects.every((c) => c === `createos.test:${port}`), proxy.seen.connects.join(','))
    assert.deepEqual(proxy.seen.plain, [], 'nothing was sent to the proxy outside a tunnel')
    const sent = proxy.sentText()
    assert.ok(sent.length > 0)
    assert.ok(!sent.includes(ctx.apiKey), 'the key crossed the proxy in clear text')
    assert.ok(!sent.includes('/v1/sandboxes'), 'a request line crossed the proxy in clear text')
    // Through a proxy the stream's tunnel can be slower than the gate's: the gate may then open
    // on its fallback before the connect arrives (output is replayed from after=0), so either order.
    assert.deepEqual(inAnyOrderAfterCreate(kinds(ctx.requests())), ['createProcess', 'connect', 'putFile'])

    // Without NODE_USE_ENV_PROXY the same environment is ignored: createos.test does not
    // resolve, so the call fails to connect, and the proxy sees nothing more.
    ctx.reset()
    const before = proxy.seen.connects.length
    const direct = await netChild(client, bashParams(sb, 'echo x'), { HTTPS_PROXY: proxy.url, NODE_EXTRA_CA_CERTS: caFile })
    assert.equal(direct.ok, false)
    assert.equal(direct.message, 'CreateOS connection failed.')
    assert.equal(proxy.seen.connects.length, before)
    assert.deepEqual(ctx.requests(), [])
  } finally {
    await proxy.close()
  }
})

/** The request kinds with everything after the first (the create) sorted. */
function inAnyOrderAfterCreate(k) {
  return [k[0], ...k.slice(1).sort()]
}

test('config.proxy is explicit: CONNECT with its credentials, no environment needed; bad proxies are input errors', async () => {
  const ctx = await emulator({ tls: true })
  const proxy = await connectProxy()
  try {
    const sb = ctx.sandbox()
    const port = new URL(ctx.url).port
    const withCreds = proxy.url.replace('http://', 'http://proxyuser:proxy-secret@')
    const client = emuClient(ctx, { apiUrl: `https://createos.test:${port}`, proxy: withCreds, caCertPem: ctx.emu.caPem })
    const r = await execute(client, bashParams(sb, 'printf explicit'))
    assert.equal(r.stdout, 'explicit')
    assert.ok(proxy.seen.connects.length >= 1)
    assert.equal(proxy.seen.auth[0], `Basic ${Buffer.from('proxyuser:proxy-secret').toString('base64')}`)
    assert.ok(!proxy.sentText().includes(ctx.apiKey))
    // Through a proxy the stream's tunnel can be slower than the gate's: the gate may then open
    // on its fallback before the connect arrives (output is replayed from after=0), so either order.
    assert.deepEqual(inAnyOrderAfterCreate(kinds(ctx.requests())), ['createProcess', 'connect', 'putFile'])

    ctx.reset()
    for (const [config, message] of [
      [{ proxy: 'socks5://127.0.0.1:1080' }, 'proxy must be an http:// or https:// proxy URL.'],
      [{ proxy: 42 }, 'proxy must be an http:// or https:// proxy URL. (got 42)'],
      [{ apiUrl: 'http://127.0.0.1:1', proxy: proxy.url }, 'proxy requires an https:// apiUrl: the API key never crosses a proxy in clear text.'],
      [{ caCertPem: 'not a certificate' }, 'caCertPem must be a PEM string with at least one certificate.'],
    ]) {
      const e = await rejection(execute(emuClient(ctx, config), bashParams(sb, 'echo no')))
      assert.equal(e.message, message)
      assert.equal(e.code, 'CREATEOS_INVALID_INPUT')
      assertNoSecrets(e, ['proxy-secret'])
    }
    assert.deepEqual(ctx.requests(), [], 'bad input sends nothing')
  } finally {
    await proxy.close()
  }
})

test('HTTPS: an untrusted certificate is its own error; NODE_EXTRA_CA_CERTS and caCertPem make it trusted', async () => {
  const ctx = await emulator({ tls: true })
  const sb = ctx.sandbox()
  const e = await rejection(execute(emuClient(ctx), bashParams(sb, 'echo no')))
  assert.equal(e.message, UNTRUSTED)
  assert.equal(e.code, 'CREATEOS_TLS_UNTRUSTED')
  assertNoSecrets(e, [ctx.url, '127.0.0.1', ctx.apiKey])
  assert.deepEqual(ctx.requests(), [], 'no request crossed an untrusted connection')
  assert.ok(ctx.emu.connections() >= 1)

  const caFile = join(tmp, 'ca-extra.pem')
  writeFileSync(caFile, ctx.emu.caPem)
  const viaEnv = await netChild(emuClient(ctx), bashParams(sb, 'echo env-trusted'), { NODE_EXTRA_CA_CERTS: caFile })
  assert.equal(viaEnv.ok, true, JSON.stringify(viaEnv))
  assert.equal(viaEnv.result.stdout, 'env-trusted\n')
  assert.deepEqual(kinds(ctx.requests()), ['createProcess', 'connect', 'putFile'])

  // A NODE_EXTRA_CA_CERTS that cannot be read is ignored (Node warns about it itself).
  ctx.reset()
  const missing = await netChild(emuClient(ctx), bashParams(sb, 'echo no'), { NODE_EXTRA_CA_CERTS: join(tmp, 'missing.pem') })
  assert.equal(missing.ok, false)
  assert.equal(missing.message, UNTRUSTED)
  assert.deepEqual(ctx.requests(), [])

  ctx.reset()
  const r = await execute(emuClient(ctx, { caCertPem: ctx.emu.caPem }), bashParams(sb, 'echo pem-trusted'))
  assert.equal(r.stdout, 'pem-trusted\n')
  assert.deepEqual(kinds(ctx.requests()), ['createProcess', 'connect', 'putFile'])
})

for (const http2 of [true, false]) {
  test(`HTTPS over ${http2 ? 'HTTP/2 (one connection)' : 'HTTP/1.1 only'}: exact output, with and without stdin`, async () => {
    const ctx = await emulator({ tls: true, http2 })
    const sb = ctx.sandbox()
    const client = emuClient(ctx, { caCertPem: ctx.emu.caPem })
    for (const stdin of [undefined, 'é\nline\n']) {
      ctx.reset()
      const r = await execute(client, bashParams(sb, 'printf "a\\n"; cat; printf "b" >&2', stdin === undefined ? {} : { stdin }))
      assert.equal(r.exitCode, 0)
      assert.equal(r.stdout, `a\n${stdin ?? ''}`)
      assert.equal(r.stderr, 'b')
      const reqs = ctx.requests()
      assert.equal(reqs.length, stdin === undefined ? 3 : 4, kinds(reqs).join(','))
      const want = http2 ? 'HTTP/2.0' : 'HTTP/1.1'
      assert.ok(reqs.every((x) => x.httpVersion === want), reqs.map((x) => x.httpVersion).join(','))
      if (http2) assert.equal(new Set(reqs.map((x) => x.connection)).size, 1, 'every request on one connection')
      else assert.ok(new Set(reqs.map((x) => x.connection)).size >= 2, 'the stream holds one connection, the gate another')
    }
  })
}

test('holdHeaders: the command starts without waiting for a heartbeat, output exact', async () => {
  const heartbeatMs = 5000
  const ctx = await emulator({ holdHeaders: true, heartbeatMs })
  const sb = ctx.sandbox()
  const started = Date.now()
  const r = await execute(emuClient(ctx), bashParams(sb, 'printf "x\\n%.0s" 1 2 3; printf done'))
  const tookMs = Date.now() - started
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'x\nx\nx\ndone')
  const reqs = ctx.requests()
  assert.deepEqual(kinds(reqs), ['createProcess', 'connect', 'putFile'])
  const [, connect, gate] = reqs
  // The gate's request went out beside the creation; its content only after the connect
  // request, and well before the first heartbeat would have gone out: the stream's
  // headers, held until the first frame, were not waited for.
  assert.ok(gate.receivedMs >= connect.receivedMs, 'the gate\'s content went after the connect request')
  assert.ok(gate.receivedMs < connect.atMs + heartbeatMs, JSON.stringify(reqs))
  assert.ok(tookMs < heartbeatMs, `the call took ${tookMs} ms, a heartbeat interval`)
})

for (const status of [403, 429]) {
  test(`a start gate that cannot be opened (every gate upload answers ${status}) is CREATEOS_NOT_STARTED, nothing left running`, async () => {
    const ctx = await emulator()
    const sb = ctx.sandbox()
    ctx.emu.addFault({ route: 'putFile', action: { kind: 'status', status } })
    const e = await rejection(execute(emuClient(ctx), bashParams(sb, 'echo never; sleep 30')))
    assert.equal(e.message, NOT_STARTED)
    assert.equal(e.code, 'CREATEOS_NOT_STARTED')
    assert.equal('exitCode' in e, false)
    const k = kinds(ctx.requests())
    assert.deepEqual(k.slice(0, 2), ['createProcess', 'connect'])
    assert.equal(k.filter((x) => x === 'putFile').length, status === 429 ? 4 : 1, k.join(','))
    assert.ok(k.includes('deleteProcess'), `the process was ended: ${k.join(',')}`)
    assert.ok(ctx.requests().every((x) => x.route !== 'putFile' || x.status === status), 'no gate was written')
    assert.deepEqual(liveOfCalls(ctx.emu), [])
  })
}
