// The emulator's network options from JS (issue 10): `tls` with its own CA (`caPem`), ALPN h2
// and http/1.1 (`http2: false` for HTTP/1.1 only), `rttMs`, `holdHeaders`, `heartbeatMs`, the
// request log's `httpVersion`/`connection`, `connections()`, and `createos-emulator --tls`.
// Node's own `https`, `http2` and `tls` modules are the clients; timing checks are lower
// bounds only.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import https from 'node:https'
import http from 'node:http'
import http2 from 'node:http2'
import tls from 'node:tls'
import { spawn } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { ROOT, startEmu } from './helpers.mjs'

const FILE = fileURLToPath(import.meta.url)
const EMULATOR_BIN = join(ROOT, 'emulator', 'bin', 'createos-emulator.js')
const PEM = /^-----BEGIN CERTIFICATE-----\n[A-Za-z0-9+/=\n]+-----END CERTIFICATE-----\n?$/

/** One HTTP/1.1 request with Node's http/https module: { status, headers, body, headAtMs }. */
function request(url, { method = 'GET', apiKey, ca, body, agent = false, onResponse } = {}) {
  return new Promise((resolve, reject) => {
    const u = new URL(url)
    const mod = u.protocol === 'https:' ? https : http
    const started = Date.now()
    const req = mod.request(u, { method, ca, agent, headers: apiKey ? { 'x-api-key': apiKey } : {} }, (res) => {
      const headAtMs = Date.now() - started
      onResponse?.(res)
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString('utf8'), headAtMs }))
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end(body)
  })
}

function ndjson(text) {
  return text.split('\n').filter(Boolean).map((l) => JSON.parse(l))
}

/** One GET over an HTTP/2 session: { status, body }. */
function h2get(session, path, apiKey) {
  return new Promise((resolve, reject) => {
    const stream = session.request({ ':method': 'GET', ':path': path, 'x-api-key': apiKey })
    let status
    const chunks = []
    stream.on('response', (h) => { status = h[':status'] })
    stream.on('data', (c) => chunks.push(c))
    stream.on('end', () => resolve({ status, body: Buffer.concat(chunks).toString('utf8') }))
    stream.on('error', reject)
    stream.end()
  })
}

/** The ALPN protocol the server picks when offered h2 and http/1.1. */
function alpnOf(url, ca) {
  const u = new URL(url)
  return new Promise((resolve, reject) => {
    const socket = tls.connect({ host: u.hostname, port: Number(u.port), ca, ALPNProtocols: ['h2', 'http/1.1'] }, () => {
      const proto = socket.alpnProtocol
      socket.end()
      resolve(proto)
    })
    socket.on('error', reject)
  })
}

test('tls: an https URL, its CA as PEM; https and http2 reach it with `ca`, and only with it', async () => {
  const ctx = await startEmu({ tls: true })
  try {
    const { emu } = ctx
    assert.match(emu.url, /^https:\/\/127\.0\.0\.1:\d+$/)
    assert.match(emu.caPem, PEM)

    // Without the CA: Node refuses the certificate; no request reached the API.
    await assert.rejects(request(`${emu.url}/v1/whoami`, { apiKey: emu.apiKey }), (e) => {
      assert.match(String(e.code), /CERT|SIGNATURE|ISSUER/, String(e))
      return true
    })
    assert.equal(emu.requests().length, 0)

    const r = await request(`${emu.url}/v1/whoami`, { apiKey: emu.apiKey, ca: emu.caPem })
    assert.equal(r.status, 200)
    assert.equal(JSON.parse(r.body).data.user, 'emulator')

    const session = http2.connect(emu.url, { ca: emu.caPem })
    try {
      for (let i = 0; i < 2; i++) {
        const h = await h2get(session, '/v1/whoami', emu.apiKey)
        assert.equal(h.status, 200)
        assert.equal(JSON.parse(h.body).data.user, 'emulator')
      }
    } finally {
      session.close()
    }
    assert.equal(await alpnOf(emu.url, emu.caPem), 'h2')

    const seen = emu.requests().map((q) => [q.route, q.httpVersion, q.connection])
    assert.deepEqual(seen, [['whoami', 'HTTP/1.1', 2], ['whoami', 'HTTP/2.0', 3], ['whoami', 'HTTP/2.0', 3]])
    assert.equal(emu.connections(), 4)
  } finally {
    await ctx.close(FILE)
  }
})

test('tls with http2: false offers only http/1.1', async () => {
  const ctx = await startEmu({ tls: true, http2: false })
  try {
    const { emu } = ctx
    assert.equal(await alpnOf(emu.url, emu.caPem), 'http/1.1')
    const r = await request(`${emu.url}/v1/whoami`, { apiKey: emu.apiKey, ca: emu.caPem })
    assert.equal(r.status, 200)
    assert.deepEqual(emu.requests().map((q) => q.httpVersion), ['HTTP/1.1'])
  } finally {
    await ctx.close(FILE)
  }
})

test('plain HTTP: caPem is null, requests carry httpVersion and connection', async () => {
  const ctx = await startEmu()
  try {
    const { emu } = ctx
    assert.match(emu.url, /^http:\/\/127\.0\.0\.1:\d+$/)
    assert.equal(emu.caPem, null)
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
    try {
      for (let i = 0; i < 2; i++) assert.equal((await request(`${emu.url}/v1/whoami`, { apiKey: emu.apiKey, agent })).status, 200)
    } finally {
      agent.destroy()
    }
    assert.equal((await request(`${emu.url}/v1/whoami`, { apiKey: emu.apiKey })).status, 200)
    assert.deepEqual(emu.requests().map((q) => [q.httpVersion, q.connection]), [['HTTP/1.1', 1], ['HTTP/1.1', 1], ['HTTP/1.1', 2]])
    assert.equal(emu.connections(), 2)
  } finally {
    await ctx.close(FILE)
  }
})

test('rttMs: a request on a fresh connection costs at least two round trips', async () => {
  const rtt = 100
  const ctx = await startEmu({ rttMs: rtt })
  try {
    const { emu } = ctx
    const started = Date.now()
    const r = await request(`${emu.url}/v1/whoami`, { apiKey: emu.apiKey })
    const took = Date.now() - started
    assert.equal(r.status, 200)
    assert.ok(took >= 2 * rtt - 2, `took ${took} ms`)
    assert.equal(emu.connections(), 1)
  } finally {
    await ctx.close(FILE)
  }
})

test('holdHeaders: the connect head arrives with the first heartbeat (heartbeatMs)', async () => {
  const heartbeatMs = 300
  const ctx = await startEmu({ holdHeaders: true, heartbeatMs })
  try {
    const { emu } = ctx
    const sb = emu.createSandbox()
    const created = await request(`${emu.url}/v1/sandboxes/${sb}/processes`, {
      method: 'POST', apiKey: emu.apiKey, body: JSON.stringify({ cmd: 'bash', args: ['-c', 'sleep 0.8; echo late'] }),
    })
    assert.equal(created.status, 201)
    const pid = JSON.parse(created.body).data.process_id
    let first
    const r = await request(`${emu.url}/v1/sandboxes/${sb}/processes/${pid}/connect?after=0`, {
      apiKey: emu.apiKey,
      onResponse: (res) => res.once('data', (c) => { first = c.toString('utf8') }),
    })
    assert.equal(r.status, 200)
    assert.ok(r.headAtMs >= heartbeatMs - 2, `head after ${r.headAtMs} ms`)
    assert.deepEqual(ndjson(first)[0], { type: 'heartbeat' })
    const frames = ndjson(r.body)
    assert.equal(Buffer.from(frames.find((f) => f.type === 'data').data_base64, 'base64').toString(), 'late\n')
    assert.equal(frames.at(-1).type, 'exit')
    assert.equal(emu.requests().at(-1).route, 'connect')
  } finally {
    await ctx.close(FILE)
  }
})

test('createos-emulator --tls prints CREATEOS_CA_FILE and removes it on exit', async () => {
  const child = spawn(process.execPath, [EMULATOR_BIN, '--tls', '--rate-limit', 'off'], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  let stderr = ''
  child.stdout.setEncoding('utf8').on('data', (d) => { stdout += d })
  child.stderr.setEncoding('utf8').on('data', (d) => { stderr += d })
  const exited = new Promise((resolve) => child.on('close', (code) => resolve(code)))
  try {
    const deadline = Date.now() + 20000
    while (!/It runs real processes/.test(stdout)) {
      assert.ok(Date.now() < deadline, `no banner: ${stdout} ${stderr}`)
      await new Promise((r) => setTimeout(r, 20))
    }
    const value = (name) => stdout.match(new RegExp(`^${name}=(.*)$`, 'm'))?.[1]
    const url = value('CREATEOS_API_URL')
    const key = value('CREATEOS_API_KEY')
    const caFile = value('CREATEOS_CA_FILE')
    assert.match(url, /^https:\/\/127\.0\.0\.1:\d+$/)
    assert.ok(caFile && existsSync(caFile), stdout)
    const ca = readFileSync(caFile, 'utf8')
    assert.match(ca, PEM)
    const r = await request(`${url}/v1/whoami`, { apiKey: key, ca })
    assert.equal(r.status, 200)

    child.kill('SIGTERM')
    assert.equal(await exited, 0, stderr)
    assert.equal(existsSync(caFile), false, 'the CA file outlived the emulator')
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  }
})

test('createos-emulator without --tls prints no CA file', async () => {
  const child = spawn(process.execPath, [EMULATOR_BIN], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  child.stdout.setEncoding('utf8').on('data', (d) => { stdout += d })
  const exited = new Promise((resolve) => child.on('close', (code) => resolve(code)))
  try {
    const deadline = Date.now() + 20000
    while (!/It runs real processes/.test(stdout)) {
      assert.ok(Date.now() < deadline, `no banner: ${stdout}`)
      await new Promise((r) => setTimeout(r, 20))
    }
    assert.match(stdout, /^CREATEOS_API_URL=http:\/\/127\.0\.0\.1:\d+$/m)
    assert.doesNotMatch(stdout, /CREATEOS_CA_FILE/)
    child.kill('SIGTERM')
    assert.equal(await exited, 0)
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  }
})
