// One "host process" of __test__/pacing-shared.test.mjs: two worker threads, each running
// commands against the emulator through `execute`, with the pacing the parent chose.
//   node __test__/pacing-child.mjs '<json>'
//   json: { url, apiKey, sandboxes: [id, id], commands | durationMs, concurrency, pacing?, deadlineMs }
// Prints one JSON line: { ok, failed: [message], wrong, warnings: { code: n } }.
import { createRequire } from 'node:module'
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads'

if (isMainThread) {
  const opts = JSON.parse(process.argv[2])
  const results = await Promise.all(opts.sandboxes.map((sandbox, i) => new Promise((resolve, reject) => {
    const w = new Worker(new URL(import.meta.url), { workerData: { ...opts, sandbox, thread: i } })
    w.once('message', resolve)
    w.once('error', reject)
  })))
  const out = { ok: 0, failed: [], wrong: 0, warnings: {} }
  for (const r of results) {
    out.ok += r.ok
    out.wrong += r.wrong
    out.failed.push(...r.failed)
    for (const [code, n] of Object.entries(r.warnings)) out.warnings[code] = (out.warnings[code] || 0) + n
  }
  process.stdout.write(`${JSON.stringify(out)}\n`)
} else {
  const require = createRequire(import.meta.url)
  const lib = require('../index.js')
  const o = workerData
  const warnings = {}
  process.on('warning', (w) => { if (w.code) warnings[w.code] = (warnings[w.code] || 0) + 1 })
  const config = { apiUrl: o.url, timeoutMs: 10_000 }
  if (o.pacing !== undefined) config.pacing = o.pacing
  const client = { config, apiKey: o.apiKey }
  const r = { ok: 0, failed: [], wrong: 0 }
  const started = Date.now()
  let n = 0
  const more = () => (o.durationMs ? Date.now() - started < o.durationMs : n < o.commands)
  const lane = async () => {
    while (more()) {
      const tag = `p${process.pid}-t${o.thread}-${n++}`
      try {
        const res = await lib.execute(client, { lease: { providerLeaseId: o.sandbox }, command: 'echo', args: [tag] },
          AbortSignal.timeout(o.deadlineMs))
        if (res.exitCode === 0 && res.stdout === `${tag}\n`) r.ok++
        else r.wrong++
      } catch (e) {
        r.failed.push(String(e && e.message))
      }
    }
  }
  await Promise.all(Array.from({ length: o.concurrency }, lane))
  // Warnings are emitted on the next tick after the outcome that carried them.
  await new Promise((resolve) => setImmediate(resolve))
  parentPort.postMessage({ ...r, warnings })
}
