// `npm run demo`: the package end to end against the embedded local emulator.
//   1. start the emulator and create a sandbox,
//   2. run a real command through execute(), its output streamed live,
//   3. run a command that would take 60 s under a 1.5 s timeout, and show that
//      it timed out and that its whole process tree is confirmed gone,
//   4. print what each command cost in requests, close the emulator, exit 0.
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const { execute } = require('../index.js')
const { startEmulator } = require('createos-execute-emulator')

const out = (line = '') => process.stdout.write(`${line}\n`)

/** A log callback that prints each stream's lines with a prefix, as they arrive. */
function liveLog() {
  const atLineStart = { stdout: true, stderr: true }
  return (stream, text) => {
    const prefix = stream === 'stderr' ? '  stderr │ ' : '  stdout │ '
    let s = ''
    for (const ch of text.split(/(?<=\n)/)) {
      if (atLineStart[stream]) s += prefix
      s += ch
      atLineStart[stream] = ch.endsWith('\n')
    }
    ;(stream === 'stderr' ? process.stderr : process.stdout).write(s)
  }
}

function routeSummary(requests) {
  const counts = new Map()
  for (const r of requests) {
    const key = `${r.method} ${r.route}`
    counts.set(key, (counts.get(key) || 0) + 1)
  }
  return [...counts].map(([k, n]) => `${k}${n > 1 ? ` ×${n}` : ''}`).join(', ')
}

async function processRecord(emu, sandboxId, processId) {
  const res = await fetch(`${emu.url}/v1/sandboxes/${sandboxId}/processes/${processId}`, {
    headers: { 'X-Api-Key': emu.apiKey },
  })
  if (!res.ok) return null
  const body = await res.json()
  return body.data
}

async function main() {
  const emu = await startEmulator({})
  const summary = []
  let ok = true
  try {
    const sandboxId = emu.createSandbox()
    const client = { config: { apiUrl: emu.url, timeoutMs: 10_000 }, apiKey: emu.apiKey }
    out(`createos-execute demo: local CreateOS emulator at ${emu.url}, sandbox ${sandboxId}`)
    out('(the emulator runs real processes on this machine and isolates nothing)')
    out()

    // 1. A real command, output streamed live.
    const script = [
      'echo "hello from $(uname -s) in $PWD"',
      'for i in 1 2 3; do echo "step $i of 3"; sleep 0.3; done',
      'echo "a warning on stderr" >&2',
      'printf "UTF-8 survives: %s\\n" "héllo wörld 🎉"',
      'exit 3',
    ].join('\n')
    out('$ bash -c <prints a few lines, sleeps, exits 3>')
    emu.clearRequests()
    let t0 = performance.now()
    const first = await execute(client, {
      lease: { providerLeaseId: sandboxId }, command: '/bin/bash', args: ['-c', script],
    }, AbortSignal.timeout(30_000), liveLog())
    let ms = performance.now() - t0
    out(`→ exitCode ${first.exitCode}, timedOut ${first.timedOut}, ${first.stdout.length} stdout chars, ` +
      `${first.stderr.length} stderr chars, process ${first.metadata.processId}, tree exited: ${first.metadata.treeExited}`)
    let reqs = emu.requests()
    summary.push(['command 1 (3 lines, exit 3)', ms, reqs])
    if (first.exitCode !== 3 || first.timedOut) ok = false
    out()

    // 2. A command that would run 60 s, with a 1.5 s timeout.
    out('$ bash -c "echo started; sleep 60 & sleep 60"   (timeout: 1.5 s)')
    emu.clearRequests()
    t0 = performance.now()
    const second = await execute(client, {
      lease: { providerLeaseId: sandboxId }, command: '/bin/bash', args: ['-c', 'echo "started, pid $$"; sleep 60 & sleep 60'],
    }, AbortSignal.timeout(1500), liveLog())
    ms = performance.now() - t0
    reqs = emu.requests()
    summary.push(['command 2 (timed out)', ms, reqs])
    out(`→ timedOut ${second.timedOut}, exitCode ${second.exitCode}, after ${(ms / 1000).toFixed(2)} s`)
    const del = reqs.find((r) => r.method === 'DELETE' && r.path.includes('/processes/'))
    if (del) out(`  cleanup: DELETE …/processes/${second.metadata.processId}?${del.query} → HTTP ${del.status}`)
    const record = second.metadata.processId ? await processRecord(emu, sandboxId, second.metadata.processId) : null
    if (record) out(`  the emulator's process record: state ${record.state}, tree_exited ${record.tree_exited}, signal ${record.signal}`)
    const live = emu.livePids()
    out(`  processes of the emulator still alive: ${live.length === 0 ? 'none' : live.join(', ')}`)
    if (!second.timedOut || !del || del.status !== 200 || live.length !== 0 || (record && record.tree_exited !== true)) ok = false
    out()

    out('Summary')
    for (const [name, took, requests] of summary) {
      out(`  ${name}: ${(took / 1000).toFixed(2)} s, ${requests.length} requests: ${routeSummary(requests)}`)
    }
  } finally {
    await emu.close()
  }
  out(`Emulator closed; no process it started is left. ${ok ? 'Demo OK.' : 'Demo FAILED.'}`)
  return ok ? 0 : 1
}

main().then((code) => {
  process.exitCode = code
  setTimeout(() => process.exit(code), 1000).unref()
}, (error) => {
  process.stderr.write(`demo failed: ${error && error.stack ? error.stack : error}\n`)
  process.exitCode = 1
})
