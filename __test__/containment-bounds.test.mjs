// Containment you can bound and trust (issue 11), from JS: injected panics (test-hooks build),
// a worker terminated mid-command, the env teardown's DELETE, executeStream's honest contract,
// and the sandbox receipt. Each test asserts on what the caller got, on the emulator's request
// log and on which processes are alive afterwards.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Worker } from 'node:worker_threads'
import { spawn } from 'node:child_process'
import { join } from 'node:path'
import {
  lib, useEmulator, kinds, ROOT, rejection, bashParams, markedProcesses, sleep, TERMINATION_UNCONFIRMED, liveOfCalls,
  sessionMode, supervisorPids,
} from './helpers.mjs'

const INDEX = join(ROOT, 'index.js')
let ctx
useEmulator(import.meta.url, (c) => { ctx = c })

async function nothingAlive(ms = 5000) {
  const deadline = Date.now() + ms
  while (liveOfCalls(ctx.emu).length && Date.now() < deadline) await sleep(25)
  return liveOfCalls(ctx.emu)
}

function aliveWithProcessId(processId) {
  return markedProcesses().filter((p) => p.mark.endsWith(`:${processId}`))
}

// Session mode: the panic happens in the supervisor's stream reader, and the call rejects with
// 'CreateOS process output connection failed.' instead (the tree is proven gone): a product bug,
// reported; todo until fixed.
test('a panic while following becomes an error and the process is still ended', sessionMode()
  ? { todo: "session: a panic at 'follow' rejects as 'CreateOS process output connection failed.', not as the internal panic error" }
  : {}, async () => {
  const sb = ctx.sandbox()
  const error = await rejection(lib.execute(ctx.client({ __panicAt: 'follow' }), bashParams(sb, 'echo up; sleep 30')))
  assert.ok(!lib.isCreateosCleanupError(error), 'the tree was proven gone')
  const k = kinds(ctx.requests())
  // (Session mode: a new supervisor's creation, its stream and the command's input.)
  if (sessionMode()) assert.deepEqual(k.slice(0, 3).sort(), ['connect', 'createProcess', 'input'])
  else assert.deepEqual(k.slice(0, 2), ['createProcess', 'connect'])
  assert.ok(k.includes('deleteProcess'), k.join(' '))
  assert.deepEqual(await nothingAlive(), [])
  // (Last, so that in session mode the checks above still run before the known misreport.)
  assert.equal(error.code, 'CREATEOS_ERROR')
  assert.equal(error.message, 'createos-execute internal error: a panic in native code.')
})

test('a panic during the cleanup is a CreateosCleanupError, and the tree it left is really alive', async () => {
  const sb = ctx.sandbox()
  const error = await rejection(lib.execute(ctx.client({ __panicAt: 'cleanup' }), bashParams(sb, 'sleep 30'), AbortSignal.timeout(400)))
  assert.ok(lib.isCreateosCleanupError(error))
  assert.equal(error.message, TERMINATION_UNCONFIRMED)
  assert.equal(error.reason, 'termination-unconfirmed')
  assert.equal(error.sandboxId, sb)
  assert.deepEqual(error.attempts.map((a) => [a.step, a.outcome]), [['internal', 'panic']])
  assert.ok(!kinds(ctx.requests()).includes('deleteProcess'))
  assert.ok(aliveWithProcessId(error.processId).length > 0, 'the error was not false: the command runs')
  // What a host does: destroy the lease, and get a receipt.
  assert.deepEqual(await lib.destroySandbox(ctx.client(), sb), { providerLeaseId: sb, state: 'destroyed' })
  assert.deepEqual(await nothingAlive(), [])
})

test('__panicAt is checked like every other field', async () => {
  await assert.rejects(lib.execute(ctx.client({ __panicAt: 'later' }), bashParams(ctx.sandbox(), 'true')), {
    code: 'CREATEOS_INVALID_INPUT',
  })
})

/** Starts a worker running `calls` commands; resolves once each logged `started`. */
async function workerMidCommand(sb, calls) {
  const code = `
    const { parentPort, workerData } = require('node:worker_threads')
    const lib = require(workerData.index)
    for (let i = 0; i < workerData.calls; i++) {
      let told = false
      lib.execute(workerData.client, { lease: { providerLeaseId: workerData.sb }, command: '/bin/bash',
        args: ['-c', 'echo started; sleep 30; echo never'] }, undefined, () => {
        if (!told) { told = true; parentPort.postMessage('started') }
      }).then(() => parentPort.postMessage('settled'), () => parentPort.postMessage('settled'))
    }
  `
  const worker = new Worker(code, { eval: true, workerData: { index: INDEX, client: ctx.client({ timeoutMs: 60000 }), sb, calls } })
  let started = 0
  await new Promise((resolve, reject) => {
    worker.on('message', (m) => { if (m === 'started' && ++started === calls) resolve() })
    worker.once('error', reject)
    worker.once('exit', (c) => reject(new Error(`worker exited early with ${c}`)))
  })
  return worker
}

test('a worker terminated mid-command: its env teardown ends the command (DELETE in the log)', async () => {
  const sb = ctx.sandbox()
  const worker = await workerMidCommand(sb, 1)
  assert.equal(ctx.emu.livePids().length > 0, true, 'the command runs')
  await worker.terminate()
  assert.deepEqual(await nothingAlive(), [], 'the command did not outlive its worker')
  const deletes = ctx.requests().filter((r) => kinds([r])[0] === 'deleteProcess')
  assert.equal(deletes.length, 1)
  assert.equal(deletes[0].status, 200)
  // The main thread's copy of the addon is unaffected.
  const r = await lib.execute(ctx.client(), bashParams(sb, 'echo main'))
  assert.equal(r.stdout, 'main\n')
})

test('a worker terminated with several calls in flight ends every one of them', async () => {
  const sb = ctx.sandbox()
  const worker = await workerMidCommand(sb, 3)
  await worker.terminate()
  assert.deepEqual(await nothingAlive(), [])
  // Session mode: this sandbox's requests only (a worker's teardown also ends the idle
  // supervisors of other environments, here the main thread's from the test before: see the
  // todo test below).
  const k = kinds(ctx.requests().filter((r) => !sessionMode() || r.path.includes(`/${sb}/`)))
  assert.equal(k.filter((x) => x === 'createProcess').length, 3)
  assert.equal(k.filter((x) => x === 'deleteProcess').length, 3)
})

test('a worker terminated mid-command leaves the main thread\'s idle supervisor alone', sessionMode()
  ? { todo: 'session: a worker\'s env teardown ends every idle supervisor of the process (session::end_all_blocking closes all leases), the main thread\'s too' }
  : {}, async (t) => {
  if (!sessionMode()) return t.skip('session mode only (the default mode has no supervisor)')
  const main = ctx.sandbox()
  t.after(() => lib.destroySandbox(ctx.client(), main).catch(() => {}))
  const r = await lib.execute(ctx.client(), bashParams(main, 'echo main'))
  assert.equal(r.stdout, 'main\n')
  const idle = supervisorPids(ctx.emu.livePids())
  assert.equal(idle.length, 1, 'the main thread\'s supervisor is idle')
  ctx.reset()
  const sb = ctx.sandbox()
  const worker = await workerMidCommand(sb, 1)
  await worker.terminate()
  const others = ctx.requests().filter((q) => kinds([q])[0] === 'deleteProcess' && !q.path.includes(`/${sb}/`))
  assert.deepEqual(others.map((q) => q.path), [], 'no DELETE of another environment\'s supervisor')
  assert.deepEqual(supervisorPids(ctx.emu.livePids()), idle, 'the main thread\'s supervisor is still there')
  ctx.reset()
  const again = await lib.execute(ctx.client(), bashParams(main, 'echo again'))
  assert.equal(again.metadata.processId, r.metadata.processId, 'the next command reuses it')
})

test('process.exit() mid-command: the command is ended before the process goes (DELETE in the log)', async () => {
  const sb = ctx.sandbox()
  const client = ctx.client({ timeoutMs: 60000 })
  const script = `
    const lib = require(${JSON.stringify(INDEX)})
    let told = false
    lib.execute(${JSON.stringify(client)}, { lease: { providerLeaseId: ${JSON.stringify(sb)} }, command: '/bin/bash',
      args: ['-c', 'echo started; sleep 30'] }, undefined, () => {
      if (!told) { told = true; setTimeout(() => process.exit(0), 20) }
    })
  `
  const child = spawn(process.execPath, ['-e', script], { stdio: 'ignore' })
  const code = await new Promise((resolve) => child.on('exit', resolve))
  assert.equal(code, 0)
  const deletes = ctx.requests().filter((r) => kinds([r])[0] === 'deleteProcess')
  assert.equal(deletes.length, 1, 'the DELETE was sent before the process exited')
  assert.equal(deletes[0].status, 200)
  assert.deepEqual(await nothingAlive(), [])
})

test('process.exit() mid-command with a diagnostics subscriber is as prompt as without one', async () => {
  // The teardown blocks the JS thread while the call's cleanup runs; a forwarder of events that
  // waited for that thread held every exit for the teardown's whole 3 s bound.
  const exitAfterStart = async (subscribe) => {
    const sb = ctx.sandbox()
    const client = ctx.client({ timeoutMs: 60000 })
    const script = `
      const diagnostics = require('node:diagnostics_channel')
      if (${subscribe}) {
        diagnostics.subscribe('createos-execute:request', () => {})
        diagnostics.subscribe('createos-execute:cleanup', () => {})
      }
      const lib = require(${JSON.stringify(INDEX)})
      let told = false
      lib.execute(${JSON.stringify(client)}, { lease: { providerLeaseId: ${JSON.stringify(sb)} }, command: '/bin/bash',
        args: ['-c', 'echo started; sleep 30'] }, undefined, () => {
        if (!told) { told = true; setTimeout(() => { console.log(Date.now()); process.exit(0) }, 20) }
      })
    `
    const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] })
    let out = ''
    child.stdout.on('data', (d) => { out += d })
    const code = await new Promise((resolve) => child.on('exit', resolve))
    const exitMs = Date.now() - Number(out.trim())
    assert.equal(code, 0)
    return { sb, exitMs }
  }
  const plain = await exitAfterStart(false)
  const observed = await exitAfterStart(true)
  const deletes = ctx.requests().filter((r) => kinds([r])[0] === 'deleteProcess')
  assert.equal(deletes.length, 2, 'each child sent its DELETE before it exited')
  assert.ok(deletes.every((d) => d.status === 200))
  assert.deepEqual(await nothingAlive(), [])
  // The bound the teardown has is 3 s; a forwarder that waits for the JS thread uses all of it.
  assert.ok(observed.exitMs < 2000, `exit took ${observed.exitMs} ms with a subscriber (${plain.exitMs} ms without)`)
})

test('executeStream is the path without a containment proof: no process id, never a cleanup error', async () => {
  const sb = ctx.sandbox()
  const r = await lib.executeStream(ctx.client(), bashParams(sb, 'echo hi'))
  assert.equal(r.stdout, 'hi\n')
  assert.equal(r.metadata.processId, null)
  assert.equal(r.metadata.treeExited, null)
  assert.deepEqual(kinds(ctx.requests()), ['execStream'])
})

test('destroySandbox: DELETE, then the state; an unreadable state is a CreateosDestroyError within the deadline', async () => {
  const sb = ctx.sandbox()
  ctx.emu.addFault({ route: 'getSandbox', action: { kind: 'status', status: 503 } })
  const started = Date.now()
  const error = await rejection(lib.destroySandbox(ctx.client({ cleanupDeadlineMs: 1500 }), sb))
  assert.ok(Date.now() - started < 5000)
  assert.ok(error instanceof lib.CreateosDestroyError)
  assert.equal(error.sandboxId, sb)
  assert.equal(error.attempts[0].step, 'destroy')
  assert.ok(error.attempts.some((a) => a.step === 'state' && a.outcome === 'HTTP 503'))
  const k = kinds(ctx.requests())
  assert.equal(k[0], 'deleteSandbox')
  assert.ok(k.filter((x) => x === 'getSandbox').length >= 2)
})
