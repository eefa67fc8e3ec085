// A worker whose fetch is the host's (a wrapper) is terminated while its command runs: its JS
// can run nothing more, so the cleanup's DELETE goes natively, and the process is proven gone.
import { Worker } from 'node:worker_threads'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import { afterAll, beforeAll, expect, it } from 'vitest'

const require = createRequire(import.meta.url)
const { startEmulator } = require('createos-execute-emulator')
const INDEX = process.env.CREATEOS_EXECUTE_UNDER_TEST || fileURLToPath(new URL('../../index.js', import.meta.url))

let emu
beforeAll(async () => {
  emu = await startEmulator({ rateLimitPerMinute: null })
})
afterAll(async () => {
  await emu.close()
})

async function until(check, ms) {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    if (check()) return true
    await new Promise((r) => setTimeout(r, 50))
  }
  return check()
}

it("a terminated worker's command through the host fetch is still ended natively", async () => {
  const sandboxId = emu.createSandbox()
  const worker = new Worker(`
    const { parentPort, workerData } = require('node:worker_threads')
    const lib = require(workerData.index)
    const real = globalThis.fetch
    const seen = []
    globalThis.fetch = (url, init) => { seen.push(init.method); return real(url, init) }
    lib.execute(workerData.client, workerData.params, undefined, () => parentPort.postMessage({ output: true, seen })).catch(() => {})
  `, {
    eval: true,
    workerData: {
      index: INDEX,
      client: { config: { apiUrl: emu.url, timeoutMs: 10_000 }, apiKey: emu.apiKey },
      params: { lease: { providerLeaseId: sandboxId }, command: 'bash', args: ['-c', 'echo started; exec sleep 60'] },
    },
  })
  const first = await new Promise((resolve, reject) => {
    worker.once('message', resolve)
    worker.once('error', reject)
  })
  expect(first.seen).toContain('POST') // the creation went through the worker's fetch
  expect(emu.livePids().length).toBeGreaterThan(0)
  await worker.terminate()
  expect(await until(() => emu.livePids().length === 0, 20_000)).toBe(true)
  const deletes = emu.requests().filter((r) => r.method === 'DELETE' && /\/processes\/[^/]+$/.test(r.path))
  expect(deletes.length).toBeGreaterThan(0)
})
