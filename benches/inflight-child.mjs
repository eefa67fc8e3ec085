// §14 in flight: runs in a fresh node process (its RSS baseline is this process's own), so
// the memory above idle belongs to the N commands in flight only.
//
// Protocol (fork IPC): the parent sends { url, apiKey, caPem, sandboxes, args }; the child warms
// up (WARM commands, up to N at once, see below), takes its idle RSS and answers { idle }; then
// starts N = sandboxes.length commands at once (one per sandbox, pacing off), answers { started }
// when every promise is pending; the parent tells it { measure } once the emulator holds all N in
// flight and they settled; the child samples RSS and CPU for `windowMs` and answers { measured };
// it answers { done } when all settled, with how many were exact.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const { loadLib } = require('./lib/load.cjs')

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const WARM = 200
const next = () => new Promise((resolve) => process.once('message', resolve))
const rss = () => process.memoryUsage().rss
// Anonymous resident memory (heap, stacks): RSS without the pages of the node binary and the
// addon that code paths first taken under load fault in (a one-off cost, not per command).
const anon = () => Number(/RssAnon:\s+(\d+)/.exec(readFileSync('/proc/self/status', 'utf8'))[1]) * 1024

function openSockets() {
  const { readdirSync, readlinkSync } = require('node:fs')
  let n = 0
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (readlinkSync(`/proc/self/fd/${fd}`).startsWith('socket:')) n++
    } catch { /* closed meanwhile */ }
  }
  return n
}

async function main() {
  const lib = loadLib()
  const { url, apiKey, caPem, sandboxes, command, args, expected, windowMs, wave = 0, waveGapMs = 0 } = await next()
  const config = { apiUrl: url, timeoutMs: 600_000, pacing: 'off' }
  if (caPem) config.caCertPem = caPem
  const client = { config, apiKey }
  // Warm-up: WARM short commands, up to N at once, so the idle baseline is that of a host
  // that has run commands before: the runtime, the HTTP client and its threads exist, and so
  // do the code pages of node itself that the first burst of promises faults in (V8's
  // optimizing compiler, its GC under load). With one warm-up command those pages (about
  // 4 MB of /usr/bin/node, read from /proc/self/smaps) were counted as the N commands' own
  // at 1,000 in flight. They are file pages, so the anonymous row was never affected.
  const socketsBefore = openSockets()
  for (let done = 0; done < WARM;) {
    const k = Math.min(sandboxes.length, WARM - done)
    await Promise.all(sandboxes.slice(0, k).map((sb) => lib.execute(client, { lease: { providerLeaseId: sb }, command: 'createos-virtual', args: ['out:warm\n'] })))
    done += k
  }
  // The warm-up's pooled connections close idle (4 s, and the pool's reaper runs as often):
  // idle is read without them, or the N would reuse memory the baseline counted.
  for (const t = performance.now(); openSockets() > socketsBefore && performance.now() - t < 20_000;) await sleep(250)
  global.gc?.()
  // Idle is read once the allocators gave back what the warm-up freed: jemalloc within about
  // 1 s (src/allocator.rs), glibc's heap at the next trim (every 5 s, src/trim.rs).
  await sleep(6_000)
  const idleSamples = []
  for (let i = 0; i < 9; i++) {
    idleSamples.push(rss())
    await sleep(20)
  }
  idleSamples.sort((a, b) => a - b)
  const idle = idleSamples[4]
  const idleUsage = process.memoryUsage()
  const idleAnon = anon()
  const idleSockets = openSockets()
  process.send({ idle })
  await next()

  const t0 = performance.now()
  // In waves of `wave` (all at once when it is 0): a start holds up to three connections
  // over HTTP/1.1 (the creation, the held upload, the follow), so 10,000 at once would need
  // 30,000 sockets on each side; a wave's extra connections return to the pool for the next.
  const calls = []
  for (const sb of sandboxes) {
    calls.push(lib.execute(client, { lease: { providerLeaseId: sb }, command, args }))
    if (wave && calls.length % wave === 0 && calls.length < sandboxes.length) await sleep(waveGapMs)
  }
  const settled = Promise.allSettled(calls)
  process.send({ started: performance.now() - t0 })
  await next() // { measure }
  global.gc?.()
  await sleep(200)
  const c0 = process.cpuUsage()
  const w0 = performance.now()
  const samples = []
  while (performance.now() - w0 < windowMs) {
    await sleep(250)
    samples.push(rss())
  }
  const cpu = process.cpuUsage(c0)
  const wall = (performance.now() - w0) / 1000
  samples.sort((a, b) => a - b)
  const inflightSockets = openSockets() - idleSockets
  // Where the bytes are: V8's heap (JS objects of the pending calls), memory V8 tracks outside
  // it (buffers), and the rest of RSS (the native addon's allocations, its threads, libc).
  global.gc?.()
  const usage = process.memoryUsage()
  process.send({
    measured: {
      rssAbove: samples[samples.length >> 1] - idle,
      cpuMsPerS: (cpu.user + cpu.system) / 1000 / wall,
      sockets: inflightSockets,
      heapAbove: usage.heapUsed - idleUsage.heapUsed,
      anonAbove: anon() - idleAnon,
      externalAbove: usage.external - idleUsage.external,
    },
  })
  const results = await settled
  let exact = 0
  let firstBad
  for (const r of results) {
    if (r.status === 'fulfilled' && r.value.stdout === expected && r.value.exitCode === 0 && !r.value.timedOut) exact++
    else if (!firstBad) firstBad = r.status === 'fulfilled' ? JSON.stringify({ ...r.value, stdout: r.value.stdout.slice(0, 80) }).slice(0, 300) : String(r.reason && r.reason.message)
  }
  process.send({ done: { exact, total: results.length, ms: performance.now() - t0, firstBad } })
  setTimeout(() => process.exit(0), 50)
}

main().catch((e) => {
  process.send({ error: String(e && e.stack ? e.stack : e) })
  setTimeout(() => process.exit(1), 50)
})
