// §14 in flight (issue 32): what a command costs while it waits. N concurrent commands that
// print, wait and print again (virtual processes of the emulator: scripted output and exit,
// no OS process, so 10,000 fit on one machine), pacing off, one sandbox each, 1 s heartbeats,
// the emulator in a process of its own and the commands in a fresh node process
// (benches/inflight-child.mjs). Plain HTTP (HTTP/1.1: a connection per stream) and TLS with
// ALPN h2 (streams share connections, 100 per connection). Prints the host process's RSS
// above its idle baseline per command while all N are in flight, CPU per second per 100
// idle streams, the client's open sockets, the start time of the N commands, and how many
// of the N were exact.
import { fork } from 'node:child_process'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { stats } from './lib/stats.mjs'

const HERE = dirname(fileURLToPath(import.meta.url))
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

function child() {
  const c = fork(join(HERE, 'inflight-child.mjs'), [], {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    execArgv: ['--expose-gc'],
  })
  const queue = []
  const waiting = []
  c.on('message', (m) => (waiting.length ? waiting.shift()(m) : queue.push(m)))
  const exited = new Promise((resolve) => c.once('exit', resolve))
  return {
    send: (m) => c.send(m),
    next: (ms = 600_000) => new Promise((resolve, reject) => {
      if (queue.length) return resolve(queue.shift())
      const t = setTimeout(() => reject(new Error('inflight child: no answer')), ms)
      waiting.push((m) => { clearTimeout(t); m && m.error ? reject(new Error(m.error)) : resolve(m) })
    }),
    async close() {
      if (c.exitCode === null) c.kill('SIGKILL')
      await exited
    },
  }
}

// Commands are started in waves of 1,000, 1.5 s apart (see benches/inflight-child.mjs).
const WAVE = 1000
const WAVE_GAP_MS = 1500

/** One run: N commands in flight through `proto` ('http1' | 'h2'). */
async function once(n, proto, { emulator, log }) {
  const emu = await emulator('child', {
    heartbeatMs: 1000,
    virtualProcesses: true,
    ...(proto === 'h2' ? { tls: true, http2: true } : {}),
  })
  const sandboxes = []
  for (let i = 0; i < n; i++) sandboxes.push(await emu.createSandbox())
  // Long enough for the N to start and settle and for the window; the start of 10,000
  // takes tens of seconds on 2 cores.
  const holdMs = 20_000 + n * 6 + Math.floor(n / WAVE) * WAVE_GAP_MS
  const c = child()
  try {
    c.send({
      url: emu.url, apiKey: emu.apiKey, caPem: emu.caPem, sandboxes,
      command: 'createos-virtual', args: ['out:start\n', `sleep:${holdMs}`, 'out:end\n'],
      expected: 'start\nend\n', windowMs: 5000, wave: WAVE, waveGapMs: WAVE_GAP_MS,
    })
    const { idle } = await c.next()
    const t0 = performance.now()
    c.send({ go: true })
    await c.next()
    // All created: the emulator runs N virtual processes.
    for (;;) {
      if ((await emu.liveVirtual()) >= n) break
      if (performance.now() - t0 > holdMs) throw new Error(`§14: ${n} ${proto}: not all started within the hold`)
      await sleep(100)
    }
    const startS = (performance.now() - t0) / 1000
    // Settle: the follows attach, pooled connections of the starts idle out, memory they
    // held is given back.
    await sleep(12_000)
    const inFlight = await emu.liveVirtual()
    c.send({ measure: true })
    const { measured } = await c.next()
    const { done } = await c.next()
    if (inFlight < n) log(`§14 ${n} ${proto}: only ${inFlight} of ${n} in flight when measured`)
    if (done.firstBad) log(`§14 ${n} ${proto}: first inexact: ${done.firstBad}`)
    return { idle, startS, inFlight, ...measured, ...done, live: await emu.liveVirtual() }
  } finally {
    await c.close()
    await emu.close()
  }
}

export async function inflightBench(opts, { emulator, row, note, log }) {
  const sizes = opts.quick ? [1000] : [100, 1000, 10_000]
  const runs = opts.quick ? 1 : Math.max(1, Math.min(opts.runs, 3))
  const out = {}
  for (const proto of ['http1', 'h2']) {
    for (const n of sizes) {
      const list = []
      for (let i = 0; i < (n >= 10_000 ? 1 : runs); i++) {
        log(`§14 ${n} in flight over ${proto}, run ${i + 1}`)
        list.push(await once(n, proto, { emulator, log }))
      }
      out[`${proto}-${n}`] = list
      const label = `${n} in flight, ${proto === 'h2' ? 'HTTP/2 (TLS)' : 'HTTP/1.1'}`
      row('14', `${label}: RSS above idle per command`, stats(list.map((r) => r.rssAbove / n / 1024)), 'KB', 'target ≤ 16; TS module 10–56', 1)
      row('14', `${label}: of which anonymous (not code pages)`, stats(list.map((r) => r.anonAbove / n / 1024)), 'KB', 'heap, stacks', 1)
      row('14', `${label}: of which V8 heap per command`, stats(list.map((r) => r.heapAbove / n / 1024)), 'KB', 'JS objects of the pending calls', 1)
      row('14', `${label}: CPU per 100 idle streams`, stats(list.map((r) => (r.cpuMsPerS * 100) / n)), 'ms/s', 'issue baseline 4.0 (100) – 7.2 (50) ms/s', 2)
      row('14', `${label}: start of the ${n}`, stats(list.map((r) => r.startS)), 's', n > WAVE ? `in waves of ${WAVE}, ${WAVE_GAP_MS} ms apart` : 'all at once', 1)
      row('14', `${label}: client sockets open`, stats(list.map((r) => r.sockets)), '', proto === 'h2' ? `≈ ${Math.ceil(n / 100)} expected (100 streams each)` : `≈ ${n} expected`, 0)
      row('14', `${label}: exact`, stats(list.map((r) => r.exact)), `of ${n}`, 'target: all', 0)
      for (const r of list) {
        if (r.exact !== n) note(`§14 ${label}: ${r.exact} of ${n} exact`)
        if (r.live) note(`§14 ${label}: ${r.live} virtual processes still live after the run`)
      }
    }
  }
  return out
}
