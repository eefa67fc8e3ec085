// Keep-alive under load: a real Node `http` reverse proxy in front of the emulator, with Node's
// default idle keep-alive of 5 s (announced as `Keep-Alive: timeout=5`). Waves of concurrent
// `sleep 1; echo` commands are started with idle gaps around those 5 s, so that pooled
// connections are due for reuse just as the server closes them. Every command must succeed,
// and the server must never see a connection reused after an idle time close to its timeout.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import diagnostics_channel from 'node:diagnostics_channel'
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { lib, startEmu, bashParams, sleep, liveOfCalls, sessionMode, sessionConfig } from './helpers.mjs'
import { fileURLToPath } from 'node:url'

const FILE = fileURLToPath(import.meta.url)
const { execute } = lib

const KEEP_ALIVE_MS = 5000
// Concurrent commands per wave, and the idle gap before each wave after the first.
const WAVE = Number(process.env.CREATEOS_KEEPALIVE_WAVE || 100)
const GAPS_MS = [4850, 4950, 5000, 5050, 5150]

/**
 * The sandboxes `n` concurrent commands run on: one in the default mode; in session mode one per
 * 4 commands (a lease runs at most 4 supervisors at a time, a fifth command waits), so that the
 * `n` commands of a wave still run at once, each wave after the first as `n` input requests on
 * pooled connections idle for the gap.
 */
function sandboxesFor(c, n) {
  return Array.from({ length: sessionMode() ? Math.ceil(n / 4) : 1 }, () => c.sandbox())
}

/** In session mode, the sandboxes' idle supervisors ended (with their proof) before the
 * survivor check, as a host ends its leases. */
async function endSessions(c, sbs) {
  if (!sessionMode()) return
  for (const sb of sbs) await lib.destroySandbox(c.client({ pacing: 'off' }), sb)
}

let ctx
let slowCtx
after(async () => {
  if (ctx) await ctx.close(FILE)
  if (slowCtx) await slowCtx.close(FILE)
})

/**
 * A reverse proxy to `target` (an http://host:port origin) with the server's idle keep-alive
 * `keepAliveMs`. Per client connection it records every request and the idle time before it
 * (from the end of the previous response on that connection).
 */
async function reverseProxy(target, keepAliveMs, { delayMs = 0, stall = null } = {}) {
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
    if (delayMs > 0) req.pause()
    const forward = () => {
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
    req.resume()
    // The client went away: so does the upstream request (not an upstream error).
    res.on('close', () => { if (!res.writableFinished) { dropped = true; up.destroy() } })
    }
    // A slow server: every request waits before it is handled.
    if (delayMs > 0) setTimeout(forward, delayMs)
    else forward()
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
  // A busy server: its event loop stalls for `stall.ms` every `stall.everyMs`. Timers run
  // before reads in an event-loop turn, so an idle socket whose keep-alive expires during a
  // stall is closed even when the next request had already arrived.
  const stallTimer = stall && setInterval(() => {
    const end = Date.now() + stall.ms
    while (Date.now() < end) { /* busy */ }
  }, stall.everyMs)
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    seen,
    async close() {
      if (stallTimer) clearInterval(stallTimer)
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
    const sbs = sandboxesFor(ctx, WAVE)
    const client = { config: { apiUrl: proxy.url, timeoutMs: 60_000, pacing: 'off', ...sessionConfig() }, apiKey: ctx.apiKey }
    const failures = []
    let ok = 0
    const waveMs = []
    for (let w = 0; w <= GAPS_MS.length; w++) {
      if (w > 0) await sleep(GAPS_MS[w - 1])
      const started = Date.now()
      const results = await Promise.allSettled(
        Array.from({ length: WAVE }, (_, i) => execute(client, bashParams(sbs[i % sbs.length], `sleep 1; echo w${w}-${i}`))),
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
    await endSessions(ctx, sbs)
    assert.deepEqual(liveOfCalls(ctx.emu), [])
  } finally {
    await proxy.close()
  }
})

// A server with a short keep-alive (2 s, announced as `Keep-Alive: timeout=2`): the client takes
// the hint, less its 1 s margin, for the calls made after it saw it, so no connection is reused
// after 1.5 s idle or more (with the fixed 4 s idle time it would be, and lost as it closes).
let shortCtx
after(async () => { if (shortCtx) await shortCtx.close(FILE) })
test('a server announcing a 2 s keep-alive: its hint is honoured, no connection is reused as it closes', { timeout: 120_000 }, async () => {
  shortCtx = await startEmu()
  const keepAliveMs = 2000
  const proxy = await reverseProxy(shortCtx.url, keepAliveMs)
  try {
    const n = 30
    const sbs = sandboxesFor(shortCtx, n)
    const client = { config: { apiUrl: proxy.url, timeoutMs: 60_000, pacing: 'off', ...sessionConfig() }, apiKey: shortCtx.apiKey }
    const gaps = [1200, 1500, 1800, 1950, 1950]
    const failures = []
    for (let w = 0; w <= gaps.length; w++) {
      if (w > 0) await sleep(gaps[w - 1])
      const results = await Promise.allSettled(
        Array.from({ length: n }, (_, i) => execute(client, bashParams(sbs[i % sbs.length], `echo s${w}-${i}`))),
      )
      results.forEach((r, i) => {
        if (!(r.status === 'fulfilled' && r.value.exitCode === 0 && r.value.stdout === `s${w}-${i}\n`)) {
          failures.push(r.status === 'fulfilled' ? JSON.stringify(r.value).slice(0, 200) : `${r.reason?.code} ${r.reason?.message}`)
        }
      })
    }
    const idle = proxy.seen.reusedIdleMs
    const late = idle.filter((ms) => ms >= keepAliveMs - 500)
    console.log(`short keep-alive: ${(gaps.length + 1) * n - failures.length}/${(gaps.length + 1) * n} ok; ` +
      `server saw ${proxy.seen.requests} requests on ${proxy.seen.connections} connections, ${idle.length} reused, ` +
      `max idle before reuse ${idle.length ? Math.max(...idle) : 0} ms, ${late.length} reused after >= ${keepAliveMs - 500} ms idle`)
    assert.deepEqual(failures.slice(0, 5), [], `${failures.length} commands failed`)
    assert.ok(idle.length > 0, 'connections were reused at all')
    assert.deepEqual(late, [], 'no connection reused close to the server\'s keep-alive')
    await endSessions(shortCtx, sbs)
    assert.deepEqual(liveOfCalls(shortCtx.emu), [])
  } finally {
    await proxy.close()
  }
})

// The documented API (an unpaged process list without `total`) behind a slow Node `http` front
// with its default 5 s keep-alive: 200 concurrent `sleep 1; echo`, pacing off, twice, the second
// round just under the keep-alive after the first. Every command succeeds; the numbers are
// printed (no assertion on time).
const SLOW_N = Number(process.env.CREATEOS_KEEPALIVE_SLOW_N || 200)
const SLOW_GAP_MS = Number(process.env.CREATEOS_KEEPALIVE_SLOW_GAP || 3900)
test(`${SLOW_N} concurrent commands against a slow server with a 5 s keep-alive and an unpaged list: all succeed, twice`, { timeout: 300_000 }, async () => {
  slowCtx = await startEmu({ profile: 'documented' })
  const proxy = await reverseProxy(slowCtx.url, KEEP_ALIVE_MS, { delayMs: 150, stall: { ms: 1500, everyMs: 2500 } })
  try {
    const sbs = sandboxesFor(slowCtx, SLOW_N)
    const client = { config: { apiUrl: proxy.url, timeoutMs: 60_000, pacing: 'off', ...sessionConfig() }, apiKey: slowCtx.apiKey }
    const rounds = []
    for (let round = 0; round < 2; round++) {
      if (round > 0) await sleep(SLOW_GAP_MS)
      const started = Date.now()
      const results = await Promise.allSettled(
        Array.from({ length: SLOW_N }, (_, i) => execute(client, bashParams(sbs[i % sbs.length], `sleep 1; echo r${round}-${i}`))),
      )
      const failures = []
      let ok = 0
      results.forEach((r, i) => {
        if (r.status === 'fulfilled' && r.value.exitCode === 0 && r.value.stdout === `r${round}-${i}\n`) ok += 1
        else failures.push(r.status === 'fulfilled' ? JSON.stringify(r.value).slice(0, 200) : `${r.reason?.code} ${r.reason?.message}`)
      })
      rounds.push({ ok, ms: Date.now() - started, failures })
    }
    const reqs = slowCtx.emu.requests()
    const byRoute = (route, status) => reqs.filter((r) => r.route === route && r.status === status).length
    console.log(`slow keep-alive load: ${rounds.map((r) => `${r.ok}/${SLOW_N} in ${r.ms} ms`).join(', ')}; ` +
      `server saw ${proxy.seen.requests} requests on ${proxy.seen.connections} connections; ` +
      `creations ${byRoute('createProcess', 201)} answered, ${reqs.filter((r) => r.route === 'createProcess' && r.status !== 201).length} not; ` +
      `lists ${reqs.filter((r) => r.route === 'listProcesses').length}; client errors ${proxy.seen.clientErrors}, upstream errors ${proxy.seen.upstreamErrors}`)
    for (const r of rounds) {
      assert.deepEqual(r.failures.slice(0, 5), [], `${r.failures.length} commands failed`)
      assert.equal(r.ok, SLOW_N)
    }
    const outputs = reqs.filter((r) => r.route === 'createProcess' && r.status === 201).length
    if (sessionMode()) {
      // A supervisor per command of the first round, each reused by the second round's input.
      assert.ok(outputs >= SLOW_N, `${outputs} supervisors created`)
      const inputs = reqs.filter((r) => r.route === 'input' && r.status >= 200 && r.status < 300).length
      assert.ok(inputs >= 2 * SLOW_N, `${inputs} inputs answered`)
      await endSessions(slowCtx, sbs)
    } else {
      assert.ok(outputs >= 2 * SLOW_N)
    }
    const end = Date.now() + 5000
    while (liveOfCalls(slowCtx.emu).length && Date.now() < end) await sleep(20)
    assert.deepEqual(liveOfCalls(slowCtx.emu), [], 'no process of any call is alive')
  } finally {
    await proxy.close()
  }
})

// The waves again with the machine busy (issue 32): two processes spin for the whole test, as
// many as this machine has cores, beside the emulator, the proxy and the client. Every HTTP
// attempt that got no answer is collected from the diagnostics channel (its operation and
// outcome) and printed, so a failure says which request failed and how; every command must
// succeed all the same.
const LOADED_N = Number(process.env.CREATEOS_KEEPALIVE_LOADED_N || 200)
let loadedCtx
after(async () => { if (loadedCtx) await loadedCtx.close(FILE) })
test(`${LOADED_N} concurrent commands with the machine loaded, around a 5 s keep-alive: all succeed`, { timeout: 300_000 }, async () => {
  loadedCtx = await startEmu()
  const proxy = await reverseProxy(loadedCtx.url, KEEP_ALIVE_MS)
  const hogs = Array.from({ length: 2 }, () => spawn(process.execPath, ['-e', 'for (;;) {}'], { stdio: 'ignore' }))
  const attempts = new Map()
  const onRequest = (m) => {
    const key = `${m.operation}: ${m.outcome}`
    attempts.set(key, (attempts.get(key) ?? 0) + 1)
  }
  diagnostics_channel.subscribe('createos-execute:request', onRequest)
  try {
    const sbs = sandboxesFor(loadedCtx, LOADED_N)
    const client = { config: { apiUrl: proxy.url, timeoutMs: 60_000, pacing: 'off', ...sessionConfig() }, apiKey: loadedCtx.apiKey }
    const gaps = [4900, 5000]
    const failures = []
    const roundMs = []
    for (let round = 0; round <= gaps.length; round++) {
      if (round > 0) await sleep(gaps[round - 1])
      const started = Date.now()
      const results = await Promise.allSettled(
        Array.from({ length: LOADED_N }, (_, i) => execute(client, bashParams(sbs[i % sbs.length], `sleep 1; echo l${round}-${i}`))),
      )
      roundMs.push(Date.now() - started)
      results.forEach((r, i) => {
        if (!(r.status === 'fulfilled' && r.value.exitCode === 0 && r.value.stdout === `l${round}-${i}\n`)) {
          failures.push(r.status === 'fulfilled' ? JSON.stringify(r.value).slice(0, 200) : `${r.reason?.code} ${r.reason?.message}`)
        }
      })
    }
    const unanswered = [...attempts].filter(([k]) => !/: (ok|http error)$/.test(k))
    console.log(`loaded keep-alive: ${(gaps.length + 1) * LOADED_N - failures.length}/${(gaps.length + 1) * LOADED_N} ok; ` +
      `rounds took ${roundMs.join(', ')} ms; server saw ${proxy.seen.requests} requests on ${proxy.seen.connections} connections; ` +
      `attempts without an answer: ${unanswered.length ? unanswered.map(([k, n]) => `${k} × ${n}`).join(', ') : 'none'}; ` +
      `client errors ${proxy.seen.clientErrors}, upstream errors ${proxy.seen.upstreamErrors}`)
    assert.deepEqual(failures.slice(0, 5), [], `${failures.length} commands failed`)
    assert.ok([...attempts.keys()].some((k) => k.startsWith('process creation: ok')), 'the diagnostics channel saw the creations')
    await endSessions(loadedCtx, sbs)
    const end = Date.now() + 5000
    while (liveOfCalls(loadedCtx.emu).length && Date.now() < end) await sleep(20)
    assert.deepEqual(liveOfCalls(loadedCtx.emu), [], 'no process of any call is alive')
  } finally {
    diagnostics_channel.unsubscribe('createos-execute:request', onRequest)
    for (const h of hogs) h.kill('SIGKILL')
    await Promise.all(hogs.map((h) => (h.exitCode !== null || h.signalCode !== null ? null : once(h, 'exit'))))
    await proxy.close()
  }
})
