// Prints the containment bounds (issue 11) measured against the emulator: how long the verdict
// takes in the cases the issue reproduced. Numbers only, no assertions (the tests assert).
//   node scripts/containment-bounds.mjs            (about 45 s; --quick skips the 30 s case)
import { Worker } from 'node:worker_threads'
import { createRequire } from 'node:module'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

const require = createRequire(import.meta.url)
const ROOT = dirname(dirname(fileURLToPath(import.meta.url)))
const INDEX = join(ROOT, 'index.js')
const lib = require(INDEX)
const { startEmulator } = require('createos-execute-emulator')
const quick = process.argv.includes('--quick')

const emu = await startEmulator({ rateLimitPerMinute: null })
const client = (config = {}) => ({ config: { apiUrl: emu.url, pacing: 'off', ...config }, apiKey: emu.apiKey })
const params = (sb, script) => ({ lease: { providerLeaseId: sb }, command: '/bin/bash', args: ['-c', script] })
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const deletes = () => emu.requests().filter((r) => r.method === 'DELETE' && /\/processes\//.test(r.path))

async function settle(promise) {
  const t = Date.now()
  let outcome
  try {
    const r = await promise
    outcome = r.timedOut ? 'timedOut' : `exit ${r.exitCode}`
  } catch (e) {
    outcome = e.name === 'CreateosCleanupError' ? `CreateosCleanupError(${e.reason})` : e.message
  }
  return { ms: Date.now() - t, outcome }
}

async function killAll() {
  for (const pid of emu.livePids()) try { process.kill(pid, 'SIGKILL') } catch {}
  await sleep(100)
}

async function stubbornDefault() {
  emu.clearRequests(); emu.clearFaults()
  emu.addFault({ route: 'deleteProcess', action: { kind: 'treeExitedFalse' } })
  const { ms, outcome } = await settle(lib.execute(client({ timeoutMs: 300000 }), params(emu.createSandbox(), 'sleep 60'), AbortSignal.timeout(300)))
  console.log(`stubborn tree, timeoutMs 300000 (default cleanupDeadlineMs): ${outcome} after ${ms} ms, ${deletes().length} DELETEs`)
  await killAll()
}

async function fiveOhThrees() {
  emu.clearRequests(); emu.clearFaults()
  emu.addFault({ route: 'deleteProcess', times: 16, action: { kind: 'status', status: 503 } })
  emu.addFault({ route: 'wait', times: 16, action: { kind: 'status', status: 503 } })
  const { ms, outcome } = await settle(lib.execute(client({ timeoutMs: 30000, cleanupGraceMs: [200], confirmPollMs: 200 }), params(emu.createSandbox(), 'sleep 30'), AbortSignal.timeout(300)))
  const d = deletes()
  console.log(`16 DELETE + 16 wait 503s: ${outcome} after ${ms} ms; ${d.length} DELETEs over ${Math.round(d.at(-1).atMs - d[0].atMs)} ms (last ${d.at(-1).status})`)
}

async function hungDelete() {
  emu.clearRequests(); emu.clearFaults()
  emu.addFault({ route: 'deleteProcess', times: 1, action: { kind: 'delay', ms: 60000 } })
  const { ms, outcome } = await settle(lib.execute(client({ timeoutMs: 30000, cleanupGraceMs: [1000] }), params(emu.createSandbox(), 'sleep 30'), AbortSignal.timeout(300)))
  const d = deletes()
  console.log(`DELETE hung for 60 s: ${outcome} after ${ms} ms; second DELETE ${Math.round(d[1].atMs - d[0].atMs)} ms after the first`)
}

async function notFoundAfterAlive() {
  emu.clearRequests(); emu.clearFaults()
  emu.addFault({ route: 'deleteProcess', action: { kind: 'treeExitedFalse' } })
  emu.addFault({ route: 'wait', action: { kind: 'status', status: 404 } })
  const { ms, outcome } = await settle(lib.execute(client({ timeoutMs: 30000 }), params(emu.createSandbox(), 'sleep 30'), AbortSignal.timeout(300)))
  console.log(`wait 404 after tree_exited:false: ${outcome} after ${ms} ms (sleep 30 alive: ${emu.livePids().length > 0})`)
  await killAll()
}

async function workerTerminate() {
  emu.clearRequests(); emu.clearFaults()
  const code = `
    const { parentPort, workerData } = require('node:worker_threads')
    const lib = require(workerData.index)
    let told = false
    lib.execute(workerData.client, { lease: { providerLeaseId: workerData.sb }, command: '/bin/bash',
      args: ['-c', 'echo started; sleep 30'] }, undefined, () => { if (!told) { told = true; parentPort.postMessage('started') } })
  `
  const worker = new Worker(code, { eval: true, workerData: { index: INDEX, client: client({ timeoutMs: 60000 }), sb: emu.createSandbox() } })
  await new Promise((r) => worker.once('message', r))
  const t = Date.now()
  await worker.terminate()
  const terminated = Date.now() - t
  while (emu.livePids().length && Date.now() - t < 10000) await sleep(5)
  const d = deletes()
  console.log(`worker.terminate() mid-command: terminate() took ${terminated} ms, process gone after ${Date.now() - t} ms, ${d.length} DELETE (${d[0] && d[0].status})`)
}

if (!quick) await stubbornDefault()
await fiveOhThrees()
await hungDelete()
await notFoundAfterAlive()
await workerTerminate()
await emu.close()
