// §2 memory: runs in a fresh node process (VmHWM is process-lifetime), so the
// peak it reports belongs to this one streaming command only.
//
// Protocol (fork IPC): parent sends { url, apiKey, sandboxId }; the child warms
// up (one small command, so the runtime, HTTP client and threads exist), takes
// its idle RSS, answers { idle }; the parent arms the fast-stream fault and
// sends { go: true }; the child streams through execute() while sampling RSS
// every 10 ms and answers { result }.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const { loadLib } = require('./lib/load.cjs')

function status() {
  const s = readFileSync('/proc/self/status', 'utf8')
  const kb = (name) => {
    const m = s.match(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm'))
    return m ? Number(m[1]) * 1024 : null
  }
  return { vmRss: kb('VmRSS'), vmHwm: kb('VmHWM') }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

function nextMessage() {
  return new Promise((resolve) => process.once('message', resolve))
}

async function main() {
  const lib = loadLib()
  const { url, apiKey, sandboxId } = await nextMessage()
  const client = { config: { apiUrl: url, timeoutMs: 600_000, pacing: 'off' }, apiKey }
  const params = { lease: { providerLeaseId: sandboxId }, command: 'true' }
  // Warm-up: same path, small output.
  await lib.execute(client, { lease: { providerLeaseId: sandboxId }, command: 'echo', args: ['warm'] })
  if (global.gc) global.gc()
  await sleep(200)
  const idleSamples = []
  for (let i = 0; i < 10; i++) {
    idleSamples.push(process.memoryUsage().rss)
    await sleep(10)
  }
  idleSamples.sort((a, b) => a - b)
  const idle = idleSamples[idleSamples.length >> 1]
  const before = status()
  process.send({ idle, before })
  await nextMessage()

  let peak = process.memoryUsage().rss
  let samples = 0
  const timer = setInterval(() => {
    const rss = process.memoryUsage().rss
    samples++
    if (rss > peak) peak = rss
  }, 10)
  const t0 = performance.now()
  let r
  let error
  try {
    r = await lib.execute(client, params)
  } catch (e) {
    error = String(e && e.message ? e.message : e)
  }
  const ms = performance.now() - t0
  clearInterval(timer)
  const after = status()
  peak = Math.max(peak, process.memoryUsage().rss)
  process.send({
    result: {
      idle,
      peakSampled: peak,
      samples,
      hwmBefore: before.vmHwm,
      hwmAfter: after.vmHwm,
      ms,
      error,
      exitCode: r ? r.exitCode : undefined,
      stdoutLength: r ? r.stdout.length : undefined,
      truncated: r ? r.metadata.outputTruncated : undefined,
    },
  })
  // Let the message flush, then leave.
  setTimeout(() => process.exit(0), 50)
}

main().catch((e) => {
  process.send({ result: { error: String(e && e.stack ? e.stack : e) } })
  setTimeout(() => process.exit(1), 50)
})
