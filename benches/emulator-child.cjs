'use strict'

// The emulator in a process of its own, driven over the IPC channel of
// `child_process.fork` by benches/lib/emu.mjs. Used so the client under test
// (execute in the bench process, or the Rust discard client) does not share a
// process and a tokio runtime with the server it measures.
//
// argv[2]: JSON emulator options. Messages in: { id, op, args }; out:
// { id, ok, value | error }, plus one { ready, url, apiKey } at start.

const { loadLib } = require('./lib/load.cjs')

async function main() {
  const lib = loadLib()
  const options = JSON.parse(process.argv[2] || '{}')
  const emu = await lib.startEmulator(options)
  const keepAlive = setInterval(() => {}, 1 << 30)
  const ops = {
    requests: () => emu.requests(),
    clearRequests: () => emu.clearRequests(),
    addFault: (rule) => emu.addFault(rule),
    clearFaults: () => emu.clearFaults(),
    createSandbox: () => emu.createSandbox(),
    livePids: () => emu.livePids(),
    liveVirtual: () => emu.liveVirtual(),
    connections: () => emu.connections(),
    close: async () => {
      await emu.close()
      clearInterval(keepAlive)
      setTimeout(() => process.exit(0), 50)
    },
  }
  process.on('message', async (msg) => {
    const { id, op, args = [] } = msg || {}
    try {
      if (!ops[op]) throw new Error(`unknown op ${op}`)
      const value = await ops[op](...args)
      process.send({ id, ok: true, value })
    } catch (error) {
      process.send({ id, ok: false, error: String(error && error.message ? error.message : error) })
    }
  })
  // If the parent dies, do not leave the emulator (and its processes) behind.
  process.on('disconnect', async () => {
    try { await emu.close() } finally { process.exit(0) }
  })
  process.send({ ready: true, url: emu.url, apiKey: emu.apiKey, caPem: emu.caPem ?? null, pid: process.pid })
}

main().catch((error) => {
  process.stderr.write(`emulator-child: ${error && error.stack ? error.stack : error}\n`)
  process.exit(1)
})
