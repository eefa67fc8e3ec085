// Node-side robustness (issue 6, part 5): a throwing `log` neither crashes Node nor skips
// the cleanup; `execute` works from a worker thread; a script that only loads the package
// (or finished its calls) exits promptly; a Rust panic becomes a rejected promise.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { Worker } from 'node:worker_threads'
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { lib, startEmu, kinds, ROOT, rejection, liveOfCalls, sessionConfig } from './helpers.mjs'

const require = createRequire(import.meta.url)
const FILE = fileURLToPath(import.meta.url)
const INDEX = join(ROOT, 'index.js')

let E
before(async () => {
  E = await startEmu()
})
after(async () => {
  await E.close(FILE)
})

/** Collects process warnings while `fn` runs. */
async function withWarnings(fn) {
  const warnings = []
  const onWarning = (w) => warnings.push(w)
  process.on('warning', onWarning)
  try {
    return { value: await fn(), warnings }
  } finally {
    // Warnings are emitted on the next tick.
    await new Promise((r) => setImmediate(r))
    process.off('warning', onWarning)
  }
}

test('a throwing log callback neither crashes Node nor loses output', async (t) => {
  E.reset()
  // (In session mode destroyed after the test: its idle supervisor does not outlive it.)
  const sb = E.ownSandbox(t)
  let calls = 0
  const { value: r, warnings } = await withWarnings(() =>
    lib.execute(E.client(), E.params(sb, '/bin/bash', { args: ['-c', 'printf one; sleep 0.05; printf two >&2; printf three'] }), undefined, () => {
      calls++
      throw new Error('log callback exploded')
    }),
  )
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'onethree')
  assert.equal(r.stderr, 'two')
  assert.ok(calls >= 1, 'the log callback was called')
  const ours = warnings.filter((w) => w.code === 'CREATEOS_LOG_THREW')
  assert.ok(ours.length <= 1, 'reported at most once per call')
  for (const w of warnings) assert.ok(!String(w.message).includes('exploded'), 'the thrown error is not echoed')
})

test('a throwing log callback does not skip the cleanup of a timed-out command', async (t) => {
  E.reset()
  // (In session mode destroyed after the test: its idle supervisor does not outlive it.)
  const sb = E.ownSandbox(t)
  const r = await lib.execute(
    E.client(),
    E.params(sb, '/bin/bash', { args: ['-c', 'printf started; sleep 30'] }),
    AbortSignal.timeout(700),
    () => { throw new TypeError('boom from log') },
  )
  assert.equal(r.timedOut, true)
  const seen = kinds(E.requests())
  assert.ok(seen.includes('deleteProcess'), `cleanup DELETE was sent: ${seen.join(' ')}`)
  assert.ok(r.metadata && r.metadata.processId, 'the timed-out result names the process')
  const deadline = Date.now() + 3000
  while (liveOfCalls(E.emu).length && Date.now() < deadline) await new Promise((res) => setTimeout(res, 25))
  assert.deepEqual(liveOfCalls(E.emu), [], 'the process tree is gone')
})

test('a log callback returning a rejected promise is not an unhandled rejection', async (t) => {
  E.reset()
  // (In session mode destroyed after the test: its idle supervisor does not outlive it.)
  const sb = E.ownSandbox(t)
  const unhandled = []
  const onUnhandled = (e) => unhandled.push(e)
  process.on('unhandledRejection', onUnhandled)
  try {
    const r = await lib.execute(E.client(), E.params(sb, 'echo', { args: ['hi'] }), undefined, async () => {
      throw new Error('async log failure')
    })
    assert.equal(r.stdout, 'hi\n')
    await new Promise((res) => setTimeout(res, 50))
  } finally {
    process.off('unhandledRejection', onUnhandled)
  }
  assert.deepEqual(unhandled, [])
})

test('execute works from a worker thread', async (t) => {
  E.reset()
  // (In session mode destroyed after the test: its idle supervisor does not outlive it.)
  const sb = E.ownSandbox(t)
  const code = `
    const { parentPort, workerData } = require('node:worker_threads')
    const lib = require(workerData.index)
    lib.execute(workerData.client, { lease: { providerLeaseId: workerData.sb }, command: '/bin/bash', args: ['-c', 'printf "from %s" worker'] })
      .then((r) => parentPort.postMessage({ ok: true, stdout: r.stdout, exitCode: r.exitCode }),
            (e) => parentPort.postMessage({ ok: false, message: String(e && e.message) }))
  `
  const worker = new Worker(code, { eval: true, workerData: { index: INDEX, client: E.client(), sb } })
  try {
    const msg = await new Promise((resolve, reject) => {
      worker.once('message', resolve)
      worker.once('error', reject)
      worker.once('exit', (c) => reject(new Error(`worker exited early with ${c}`)))
    })
    assert.deepEqual(msg, { ok: true, stdout: 'from worker', exitCode: 0 })
  } finally {
    await worker.terminate()
  }
  // The main thread still works after the worker (and its addon instance) is gone.
  const r = await lib.execute(E.client(), E.params(sb, 'echo', { args: ['main'] }))
  assert.equal(r.stdout, 'main\n')
})

/** Runs `node -e script`; resolves { code, ms, stderr } or rejects when it does not exit in time. */
function runNode(script, timeoutMs) {
  return new Promise((resolve, reject) => {
    const started = Date.now()
    const child = spawn(process.execPath, ['-e', script], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
    let stderr = ''
    child.stderr.on('data', (d) => { stderr += d })
    child.stdout.resume()
    const timer = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`node -e did not exit within ${timeoutMs} ms: ${script.slice(0, 120)}`))
    }, timeoutMs)
    child.on('exit', (code, signal) => {
      clearTimeout(timer)
      resolve({ code, signal, ms: Date.now() - started, stderr })
    })
  })
}

test('a script that only loads the package exits promptly', async () => {
  const r = await runNode(`require(${JSON.stringify(INDEX)})`, 10_000)
  assert.equal(r.code, 0, r.stderr)
  assert.ok(r.ms < 5000, `took ${r.ms} ms`)
})

test('a script whose calls have settled exits promptly (nothing keeps the event loop alive)', async () => {
  const script = `
    const lib = require(${JSON.stringify(INDEX)})
    const emulatorLib = require('createos-execute-emulator')
    ;(async () => {
      const emu = await emulatorLib.startEmulator({ rateLimitPerMinute: null })
      const sb = emu.createSandbox()
      const client = { config: { apiUrl: emu.url, timeoutMs: 5000, pacing: 'off', ...${JSON.stringify(sessionConfig())} }, apiKey: emu.apiKey }
      const r = await lib.execute(client, { lease: { providerLeaseId: sb }, command: 'echo', args: ['ok'], stdin: 'x' })
      if (r.stdout !== 'ok\\n') throw new Error('bad output')
      await emu.close()
      globalThis.__done = Date.now()
    })().catch((e) => { console.error(e); process.exitCode = 3 })
  `
  const r = await runNode(script, 15_000)
  assert.equal(r.code, 0, r.stderr)
  assert.ok(r.ms < 8000, `took ${r.ms} ms`)
})

test('a Rust panic becomes a rejected promise, not an abort', async (t) => {
  const binding = require(join(ROOT, 'binding.js'))
  assert.equal(typeof binding.__panicForTest, 'function')
  const e = await rejection(binding.__panicForTest())
  assert.ok(e instanceof Error, 'rejects with an Error')
  // Node is still alive and the addon still works.
  E.reset()
  const r = await lib.execute(E.client(), E.params(E.ownSandbox(t), 'echo', { args: ['after panic'] }))
  assert.equal(r.stdout, 'after panic\n')
})

test('a panic in a child process does not abort it either', async () => {
  const script = `
    require(${JSON.stringify(join(ROOT, 'binding.js'))}).__panicForTest()
      .then(() => { process.exitCode = 2 }, () => { process.exitCode = 0 })
  `
  const r = await runNode(script, 10_000)
  assert.equal(r.signal, null, `killed by ${r.signal}: ${r.stderr.slice(0, 300)}`)
  assert.equal(r.code, 0, r.stderr.slice(0, 300))
})
