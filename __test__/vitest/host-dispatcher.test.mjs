// A host that shapes Node's own fetch with an undici global dispatcher (fetch itself is not
// replaced): a MockAgent answers every request; a ProxyAgent the host installed carries every
// request to a real emulator, through a proxy this test runs on 127.0.0.1.
import http from 'node:http'
import net from 'node:net'
import { createRequire } from 'node:module'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { MockAgent, ProxyAgent, getGlobalDispatcher, setGlobalDispatcher } from 'undici'
import { lib, client, params, API, KEY, SANDBOX } from './host-fetch-fixture.mjs'

const require = createRequire(import.meta.url)
const { startEmulator } = require('createos-execute-emulator')

let original
beforeAll(() => {
  original = getGlobalDispatcher()
})
afterEach(() => {
  setGlobalDispatcher(original)
})

describe('an undici global dispatcher the host installed', () => {
  it('a MockAgent (setGlobalDispatcher) answers every request of executeStream and destroySandbox', async () => {
    const agent = new MockAgent()
    agent.disableNetConnect()
    const pool = agent.get(API)
    const headers = { 'x-api-key': KEY }
    pool.intercept({ path: `/v1/sandboxes/${SANDBOX}/exec?stream=true`, method: 'POST', headers })
      .reply(200, `${JSON.stringify({ stdout: 'mocked\n' })}\n${JSON.stringify({ exit_code: 3 })}\n`)
    pool.intercept({ path: `/v1/sandboxes/${SANDBOX}`, method: 'DELETE', headers })
      .reply(200, JSON.stringify({ status: 'success', data: {} }))
    pool.intercept({ path: `/v1/sandboxes/${SANDBOX}`, method: 'GET', headers }).reply(404, '{}')
    setGlobalDispatcher(agent)
    const result = await lib.executeStream(client(), params(), AbortSignal.timeout(30_000))
    expect(result).toMatchObject({ exitCode: 3, stdout: 'mocked\n' })
    await expect(lib.destroySandbox(client(), SANDBOX)).resolves.toEqual({ providerLeaseId: SANDBOX, state: 'destroyed' })
    agent.assertNoPendingInterceptors()
    await agent.close()
  })

  it('a MockAgent answers every request of execute (uploads, creation, stream, stdin close)', async () => {
    const agent = new MockAgent()
    agent.disableNetConnect()
    const pool = agent.get(API)
    const headers = { 'x-api-key': KEY }
    const sb = `/v1/sandboxes/${SANDBOX}`
    const ok = (data) => JSON.stringify({ status: 'success', data })
    const seen = []
    const path = (re) => (p) => { const hit = re.test(p); if (hit) seen.push(p.split('?')[0]); return hit }
    pool.intercept({ path: path(new RegExp(`^${sb}/files\\?path=`)), method: 'PUT', headers }).reply(200, ok({})).persist()
    pool.intercept({ path: `${sb}/processes`, method: 'POST', headers }).reply(201, ok({ process_id: 'proc-m' }))
    pool.intercept({ path: path(new RegExp(`^${sb}/processes/proc-m/connect\\?after=0$`)), method: 'GET', headers })
      .reply(200, [
        { type: 'data', seq: 1, stream: 'stdout', data_base64: Buffer.from('from-mock\n').toString('base64') },
        { type: 'exit', exit_code: 0, signal: null, tree_exited: true, newest_seq: 1 },
      ].map((f) => `${JSON.stringify(f)}\n`).join(''))
    pool.intercept({ path: path(/\/stdin\/close$/), method: 'POST', headers }).reply(200, ok({})).persist()
    pool.intercept({ path: path(new RegExp(`^${sb}/exec$`)), method: 'POST', headers }).reply(200, ok({ result: { exit_code: 0 } })).persist()
    setGlobalDispatcher(agent)
    const result = await lib.execute(client(), params({ stdin: 'typed' }), AbortSignal.timeout(30_000))
    expect(result).toMatchObject({ exitCode: 0, stdout: 'from-mock\n' })
    expect(seen).toContain(`${sb}/processes/proc-m/connect`)
    expect(seen.filter((p) => p === `${sb}/files`).length).toBeGreaterThanOrEqual(2)
    await agent.close()
  })

  describe('a ProxyAgent', () => {
    let emu
    let proxy
    const seen = []
    const sockets = new Set()
    beforeAll(async () => {
      emu = await startEmulator({ rateLimitPerMinute: null })
      proxy = http.createServer((req, res) => {
        // A forwarding proxy for plain-HTTP targets (undici may tunnel them instead).
        seen.push(`${req.method} ${req.url}`)
        const target = new URL(req.url)
        const up = http.request({ host: target.hostname, port: target.port, path: target.pathname + target.search, method: req.method, headers: req.headers }, (r) => {
          res.writeHead(r.statusCode, r.headers)
          r.pipe(res)
        })
        up.on('error', () => res.destroy())
        req.pipe(up)
      })
      proxy.on('connect', (req, socket, head) => {
        seen.push(`CONNECT ${req.url}`)
        const [host, port] = req.url.split(':')
        const up = net.connect(Number(port), host, () => {
          socket.write('HTTP/1.1 200 Connection Established\r\n\r\n')
          up.write(head)
          up.pipe(socket)
          socket.pipe(up)
        })
        sockets.add(up).add(socket)
        up.on('error', () => socket.destroy())
        socket.on('error', () => up.destroy())
      })
      await new Promise((resolve) => proxy.listen(0, '127.0.0.1', resolve))
    })
    afterAll(async () => {
      for (const s of sockets) s.destroy()
      proxy.closeAllConnections?.()
      await new Promise((resolve) => proxy.close(resolve))
      await emu.close()
    })

    it('carries every request of execute to the emulator', async () => {
      const agent = new ProxyAgent(`http://127.0.0.1:${proxy.address().port}`)
      setGlobalDispatcher(agent)
      const sandboxId = emu.createSandbox()
      const c = { config: { apiUrl: emu.url, timeoutMs: 10_000 }, apiKey: emu.apiKey }
      const result = await lib.execute(c, { lease: { providerLeaseId: sandboxId }, command: 'echo', args: ['via-proxy'] }, AbortSignal.timeout(30_000))
      expect(result).toMatchObject({ exitCode: 0, stdout: 'via-proxy\n' })
      const origin = new URL(emu.url).host
      expect(seen.length).toBeGreaterThan(0)
      for (const line of seen) expect(line).toBe(`CONNECT ${origin}`)
      // Every connection the emulator accepted is one of the proxy's tunnels.
      expect(emu.connections()).toBe(seen.length)
      // Everything the emulator saw came through the proxy's connections.
      expect(emu.requests().length).toBeGreaterThan(0)
      await agent.close()
    })
  })
})
