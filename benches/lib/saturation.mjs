// One host's share of the saturation bench (benches/run.mjs §10): `victims` commands that time
// out while their child is alive (`sh -c 'echo partial; exec sleep 30'`, AbortSignal timeout),
// then, `echoDelayMs` later, `echos` plain `echo` commands, all at once on one client whose
// budget is saturated. Used in the bench's own process, and as a child process:
//   node benches/lib/saturation.mjs '<json>'   (prints one JSON line)
//   json: { url, apiKey, sandbox, victims, echos, pacing, timeoutMs, victimTimeoutMs, echoDelayMs }
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'

const require = createRequire(import.meta.url)
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

export async function runSaturation(o) {
  const lib = require('../../index.js')
  const client = { config: { apiUrl: o.url, timeoutMs: o.timeoutMs, pacing: o.pacing }, apiKey: o.apiKey }
  const lease = { providerLeaseId: o.sandbox }
  const started = Date.now()
  const victims = Array.from({ length: o.victims }, () => {
    const t = Date.now()
    return lib.execute(client, { lease, command: 'sh', args: ['-c', 'echo partial; exec sleep 30'] },
      AbortSignal.timeout(o.victimTimeoutMs))
      .then((r) => ({ kind: r.timedOut ? 'timedOut' : 'finished', stdout: r.stdout }),
        (e) => ({ kind: lib.isCreateosCleanupError(e) ? 'cleanupError' : 'error', message: String(e && e.message) }))
      .then((v) => ({ ...v, verdictMs: Date.now() - (t + o.victimTimeoutMs) }))
  })
  await sleep(o.echoDelayMs)
  const echoStart = Date.now()
  const echos = Array.from({ length: o.echos }, (_, i) =>
    lib.execute(client, { lease, command: 'echo', args: [`e${i}`] })
      .then((r) => (r.exitCode === 0 && r.stdout === `e${i}\n` ? 'ok' : 'wrong'), (e) => `error: ${e && e.message}`))
  const [v, e] = await Promise.all([Promise.all(victims), Promise.all(echos)])
  const echoEnd = Date.now()
  return {
    victims: v,
    echosOk: e.filter((x) => x === 'ok').length,
    echoFailures: e.filter((x) => x !== 'ok'),
    echoMs: echoEnd - echoStart,
    totalMs: echoEnd - started,
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const out = await runSaturation(JSON.parse(process.argv[2]))
  process.stdout.write(`${JSON.stringify(out)}\n`)
  setTimeout(() => process.exit(0), 50).unref()
}
