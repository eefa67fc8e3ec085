// Keep-alive under load: a real Node `http` reverse proxy in front of the emulator, with Node's
// default idle keep-alive of 5 s (announced as `Keep-Alive: timeout=5`). Waves of concurrent
// `sleep 1; echo` commands are started with idle gaps around those 5 s, so that pooled
// connections are due for reuse just as the server closes them. Every command must succeed,
// and the server must never see a connection reused after an idle time close to its timeout.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { lib, startEmu, bashParams, sleep } from './helpers.mjs'
import { fileURLToPath } from 'node:url'

const FILE = fileURLToPath(import.meta.url)
const { execute } = lib

const KEEP_ALIVE_MS = 5000
// Concurrent commands per wave, and the idle gap before each wave after the first.
const WAVE = Number(process.env.CREATEOS_KEEPALIVE_WAVE || 100)
const GAPS_MS = [4850, 4950, 5000, 5050, 5150]

let ctx
after(async () => {
  if (ctx) await ctx.close(FILE)
})

/**
 * A reverse proxy to `target` (an http://host:port origin) with the server's idle keep-alive
 * `keepAliveMs`. Per client connection it records every request and the idle time before it
 * (from the end of the previous response on that connection).
 */
async function reverseProxy(target, keepAliveMs) {
  const upstream = new URL(target)
  const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity })
  const seen = { connections: 0, requests: 0, reusedIdleMs: [], clientErrors: 0, upstreamErrors: 0 }
  const sockets = new Set()
  const server = http.createServer((req, res) => {
    const state = req.socket.__state
    seen.requests += 1
    if (state.lastEnd !== null) seen.reusedIdleMs.push(Date.now() - state.lastEnd)
    state.lastEnd = null
    res.on('finish', () => { state.lastEnd = Date.now() })
    const headers = { ...req.headers }
    delete headers.connection
    delete headers['keep-alive']
    const up = http.request({
      host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers, agent,
    }, (ures) => {
      const h = { ...ures.headers }
      delete h.connection
      delete h['keep-alive']
      delete h['transfer-encoding']
      res.writeHead(ures.statusCode, h)
      res.flushHeaders()
      ures.on('data', (c) => res.write(c))
      ures.on('end', () => res.end())
      ures.on('error', () => res.destroy())
    })
    let dropped = false
    up.on('error', () => {
      if (!dropped) seen.upstreamErrors += 1
      if (!res.headersSent) res.writeHead(502).end()
      else res.destroy()
    })
    req.pipe(up)
    // The client went away: so does the upstream request (not an upstream error).
    res.on('close', () => { if (!res.writableFinished) { dropped = true; up.destroy() } })
  })
  server.keepAliveTimeout = keepAliveMs
  server.on('connection', (sock) => {
    seen.connections += 1
    sock.__state = { lastEnd: null }
    sockets.add(sock)
    sock.on('close', () => sockets.delete(sock))
  })
  server.on('clientError', (_err, sock) => {
    seen.clientErrors += 1
    sock.destroy()
  })
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    seen,
    async close() {
      for (const s of sockets) s.destroy()
      agent.destroy()
      await new Promise((r) => server.close(r))
    },
  }
}

test(`${WAVE} concurrent commands per wave, idle gaps around the server's 5 s keep-alive: every command succeeds`, { timeout: 240_000 }, async () => {
  ctx = await startEmu()
  const proxy = await reverseProxy(ctx.url, KEEP_ALIVE_MS)
  try {
    const sb = ctx.sandbox()
    const client = { config: { apiUrl: proxy.url, timeoutMs: 60_000, pacing: 'off' }, apiKey: ctx.apiKey }
    const failures = []
    let ok = 0
    const waveMs = []
    for (let w = 0; w <= GAPS_MS.length; w++) {
      if (w > 0) await sleep(GAPS_MS[w - 1])
      const started = Date.now()
      const results = await Promise.allSettled(
        Array.from({ length: WAVE }, (_, i) => execute(client, bashParams(sb, `sleep 1; echo w${w}-${i}`))),
      )
      waveMs.push(Date.now() - started)
      results.forEach((r, i) => {
        if (r.status === 'fulfilled' && r.value.exitCode === 0 && r.value.stdout === `w${w}-${i}\n`) ok += 1
        else failures.push(r.status === 'fulfilled' ? `w${w}-${i}: ${JSON.stringify(r.value)}` : `w${w}-${i}: ${r.reason?.code} ${r.reason?.message}`)
      })
    }
    const idle = proxy.seen.reusedIdleMs
    const maxIdle = idle.length ? Math.max(...idle) : 0
    const late = idle.filter((ms) => ms >= KEEP_ALIVE_MS - 500).length
    console.log(`keep-alive load: ${ok}/${WAVE * (GAPS_MS.length + 1)} ok; waves took ${waveMs.join(', ')} ms; ` +
      `server saw ${proxy.seen.requests} requests on ${proxy.seen.connections} connections, ${idle.length} reused, ` +
      `max idle before reuse ${maxIdle} ms, ${late} reused after >= ${KEEP_ALIVE_MS - 500} ms idle; ` +
      `client errors ${proxy.seen.clientErrors}, upstream errors ${proxy.seen.upstreamErrors}`)
    assert.deepEqual(failures.slice(0, 10), [], `${failures.length} commands failed`)
    assert.equal(ok, WAVE * (GAPS_MS.length + 1))
    assert.ok(idle.length > 0, 'connections were reused at all')
    assert.equal(late, 0, `a connection was reused ${maxIdle} ms after its last response (the server closes at ${KEEP_ALIVE_MS} ms)`)
    assert.equal(proxy.seen.upstreamErrors, 0)
    assert.deepEqual(ctx.emu.livePids(), [])
  } finally {
    await proxy.close()
  }
})
