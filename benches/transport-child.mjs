// The transports section (benches/transport.mjs): one fresh node process per transport and
// run, so its peak RSS belongs to this one command.
//
// Protocol (fork IPC): the parent sends { url, apiKey, sandboxId, transport, echoRuns }; the
// child warms up (one small command), takes its idle RSS and answers { idle }; the parent arms
// the emulator's fast-stream fault and sends { go: true }; the child streams one command
// through execute() sampling RSS every 10 ms, then times `echoRuns` warm echos, and answers
// { result }.
import { createRequire } from 'node:module'
import { StringDecoder } from 'node:string_decoder'

const require = createRequire(import.meta.url)
const { loadLib } = require('./lib/load.cjs')

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const TAIL_CHARS = 4_194_304

// `transport: 'reference'`: the TypeScript module's read path, done the way it does it, over
// Node's fetch: the connect stream decoded as text, split into lines, each JSON-parsed, its
// base64 decoded, then a StringDecoder, and a tail kept as `(tail + text).slice(-4 Mi)`. It
// creates the process and opens the stream itself (no gate, no cleanup): an upper bound for
// that module's speed on this output.
async function reference(url, apiKey, sandboxId, command) {
  const base = `${url}/v1/sandboxes/${sandboxId}/processes`
  const headers = { 'X-Api-Key': apiKey }
  const created = await fetch(base, { method: 'POST', redirect: 'error', headers: { ...headers, 'Content-Type': 'application/json' }, body: JSON.stringify({ cmd: command[0], args: command.slice(1) }) })
  const id = (await created.json()).data.process_id
  const response = await fetch(`${base}/${id}/connect?after=0`, { redirect: 'error', headers })
  const reader = response.body.getReader()
  const text = new TextDecoder()
  const out = new StringDecoder('utf8')
  let pending = ''
  let tail = ''
  for (;;) {
    const { value, done } = await reader.read()
    pending += done ? text.decode() : text.decode(value, { stream: true })
    let nl
    while ((nl = pending.indexOf('\n')) >= 0) {
      const line = pending.slice(0, nl)
      pending = pending.slice(nl + 1)
      if (!line.trim()) continue
      const frame = JSON.parse(line)
      if (frame.type === 'data') tail = (tail + out.write(Buffer.from(frame.data_base64, 'base64'))).slice(-TAIL_CHARS)
      if (frame.type === 'exit') return { exitCode: frame.exit_code, stdout: tail }
    }
    if (done) return { exitCode: null, stdout: tail }
  }
}
const nextMessage = () => new Promise((resolve) => process.once('message', resolve))

async function main() {
  const lib = loadLib()
  const { url, apiKey, sandboxId, transport, echoRuns } = await nextMessage()
  const client = { config: { apiUrl: url, timeoutMs: 600_000, pacing: 'off', transport }, apiKey }
  const echo = { lease: { providerLeaseId: sandboxId }, command: 'echo', args: ['hi'] }
  const ref = transport === 'reference'
  const run = (p) => (ref ? reference(url, apiKey, sandboxId, [p.command, ...(p.args || [])]) : lib.execute(client, p))
  await run(echo)
  if (global.gc) global.gc()
  await sleep(200)
  const idle = process.memoryUsage().rss
  process.send({ idle })
  await nextMessage()
  let peak = process.memoryUsage().rss
  const timer = setInterval(() => {
    peak = Math.max(peak, process.memoryUsage().rss)
  }, 10)
  const t0 = performance.now()
  const r = await run({ lease: { providerLeaseId: sandboxId }, command: 'true' })
  const ms = performance.now() - t0
  clearInterval(timer)
  peak = Math.max(peak, process.memoryUsage().rss)
  const echoes = []
  for (let i = 0; i < echoRuns; i++) {
    const t = performance.now()
    const e = await run(echo)
    echoes.push(performance.now() - t)
    if (e.stdout !== 'hi\n') throw new Error('echo: wrong output')
  }
  process.send({ result: { idle, peak, ms, exitCode: r.exitCode, stdoutLength: r.stdout.length, echoes } })
  setTimeout(() => process.exit(0), 50)
}

main().catch((e) => {
  process.send({ result: { error: String(e && e.message ? e.message : e) } })
  setTimeout(() => process.exit(1), 50)
})
