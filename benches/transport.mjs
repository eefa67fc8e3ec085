// §11 transports: the native client and the host's fetch (config.transport: 'fetch', Node's
// own fetch), each in a fresh process per run: N MiB end to end through execute (the
// emulator's fast stream, 64 KiB frames; MB/s and peak RSS above idle) and a warm echo.
// Beside them, the reference: the TypeScript module's read path over the same fetch
// (benches/transport-child.mjs), the target of the fetch transport.
import { fork } from 'node:child_process'
import { join } from 'node:path'
import { stats } from './lib/stats.mjs'

const MiB = 1024 * 1024

async function run(emu, sb, transport, mib, echoRuns, root) {
  const child = fork(join(root, 'benches', 'transport-child.mjs'), [], {
    execArgv: ['--expose-gc'],
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  })
  const messages = []
  let wake
  child.on('message', (m) => { messages.push(m); if (wake) wake() })
  const next = async () => {
    while (!messages.length) {
      await new Promise((r) => { wake = r; child.once('exit', r) })
      if (!messages.length && child.exitCode !== null) throw new Error(`transport child exited (${child.exitCode})`)
    }
    return messages.shift()
  }
  child.send({ url: emu.url, apiKey: emu.apiKey, sandboxId: sb, transport, echoRuns })
  await next()
  await emu.addFault({ route: 'connect', times: 1, action: { kind: 'fastStream', mib, frame_bytes: 65536 } })
  child.send({ go: true })
  const { result } = await next()
  await new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)))
  if (result.error) throw new Error(`transport child (${transport}): ${result.error}`)
  return result
}

/** Runs the section; `h` is run.mjs's helpers ({ emulator, row, note, log, root }). */
export async function transports(opts, h) {
  const emu = await h.emulator('child')
  const sb = await emu.createSandbox()
  const mib = opts.transportMiB
  const out = {}
  for (const transport of ['native', 'fetch', 'reference']) {
    h.log(`§11 ${mib} MiB and a warm echo, transport '${transport}' (fresh node process per run)`)
    const runs = []
    for (let i = 0; i < opts.runs; i++) {
      const r = await run(emu, sb, transport, mib, 5, h.root)
      if (r.exitCode !== 0) h.note(`§11 ${transport} run ${i}: exitCode ${r.exitCode}`)
      runs.push(r)
    }
    await emu.clearFaults()
    const mbps = stats(runs.map((r) => (mib * MiB) / 1e6 / (r.ms / 1000)))
    const rss = stats(runs.map((r) => (r.peak - r.idle) / MiB))
    const echo = stats(runs.flatMap((r) => r.echoes))
    const label = transport === 'reference' ? "the TypeScript module's read path over fetch (reference)" : `transport '${transport}'`
    const what = transport === 'reference' ? 'create + read' : 'execute'
    h.row('11', `${label}: ${what}, ${mib} MiB in 64 KiB frames`, mbps, 'MB/s', transport === 'fetch' ? "target ≥ the reference's" : '')
    h.row('11', `${label}: peak RSS − idle, ${mib} MiB`, rss, 'MiB', transport === 'fetch' ? "target ≤ the reference's" : '')
    h.row('11', `${label}: warm echo`, echo, 'ms', transport === 'reference' ? 'no gate, no cleanup' : '')
    out[transport] = { mbps, rss, echo }
  }
  return out
}
