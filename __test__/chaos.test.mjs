// A short chaos run (about 25 s: RUN_MS of new calls, then the last ones settle): a mix of commands on the main thread and in workers
// that are terminated mid-command, injected panics at every phase (test-hooks build), timeouts,
// cancellations and transient DELETE/wait failures. Afterwards no process survives, and every
// CreateosCleanupError was true: its process was really alive when the error came (then the
// host's answer, destroySandbox, ends it).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Worker } from 'node:worker_threads'
import { join } from 'node:path'
import { lib, useEmulator, ROOT, markedProcesses, sleep, liveOfCalls, sessionMode } from './helpers.mjs'

const INDEX = join(ROOT, 'index.js')
const RUN_MS = Number(process.env.CHAOS_MS || 20_000)
const PARALLEL = 4
let ctx
useEmulator(import.meta.url, (c) => { ctx = c })

// A seeded generator, so a failing run can be repeated (the seed is printed).
const SEED = Number(process.env.CHAOS_SEED || Date.now() % 1_000_000)
let state = SEED
function random() {
  state = (state * 1103515245 + 12345) % 2147483648
  return state / 2147483648
}
const pick = (xs) => xs[Math.floor(random() * xs.length)]

// At most ~3 s each, so the run ends soon after RUN_MS.
const SCRIPTS = ['echo hi', 'echo up; sleep 3', 'for i in 1 2 3; do echo $i; sleep 0.1; done', 'sleep 3 & echo bg; wait']

async function mainThreadCall(stats) {
  const sb = ctx.sandbox()
  const panicAt = pick([undefined, undefined, 'create', 'follow', 'cleanup'])
  const script = pick(SCRIPTS)
  const abort = pick(['none', 'timeout', 'cancel'])
  // No pacing: the emulator has no rate limit, and the process-wide budget (300 starts a minute)
  // would otherwise hold this many calls' requests, cleanups included.
  const config = { timeoutMs: 8000, cleanupGraceMs: [200, 500], confirmPollMs: 300, pacing: 'off' }
  if (panicAt) config.__panicAt = panicAt
  let signal
  if (abort === 'timeout') signal = AbortSignal.timeout(100 + Math.floor(random() * 500))
  if (abort === 'cancel') {
    const c = new AbortController()
    setTimeout(() => c.abort(), 100 + Math.floor(random() * 500))
    signal = c.signal
  }
  try {
    await lib.execute(ctx.client(config), { lease: { providerLeaseId: sb }, command: '/bin/bash', args: ['-c', script] }, signal)
    stats.ok++
  } catch (error) {
    if (lib.isCreateosCleanupError(error)) {
      stats.cleanupErrors++
      // A panic in the cleanup proves nothing either way: the error is the honest answer then.
      // Any other cleanup error must be true: a process of that command was really alive.
      if (panicAt !== 'cleanup') {
        const alive = markedProcesses().filter((p) => p.mark.endsWith(`:${error.processId}`))
        assert.ok(alive.length > 0, `a false CreateosCleanupError (seed ${SEED}, ${panicAt}, ${script}, ${abort}): ${JSON.stringify(error.attempts)}`)
      }
      const receipt = await lib.destroySandbox(ctx.client({ pacing: 'off' }), sb)
      assert.deepEqual(receipt, { providerLeaseId: sb, state: 'destroyed' })
    } else if (error.code === 'CREATEOS_CANCELLED') {
      stats.cancelled++
    } else {
      assert.equal(error.message, 'createos-execute internal error: a panic in native code.', `seed ${SEED}`)
      assert.ok(panicAt, `an internal error without an injected panic (seed ${SEED})`)
      stats.panics++
    }
  }
  // In session mode a call that settled may leave its supervisor idle (for 60 s): the host's
  // end of the lease ends it with its proof, as it would end the sandbox.
  if (sessionMode()) {
    const receipt = await lib.destroySandbox(ctx.client({ pacing: 'off' }), sb)
    assert.deepEqual(receipt, { providerLeaseId: sb, state: 'destroyed' })
  }
}

async function workerCall(stats) {
  const sb = ctx.sandbox()
  const code = `
    const { parentPort, workerData } = require('node:worker_threads')
    const lib = require(workerData.index)
    let told = false
    lib.execute(workerData.client, { lease: { providerLeaseId: workerData.sb }, command: '/bin/bash',
      args: ['-c', 'echo started; sleep 30'] }, undefined, () => {
      if (!told) { told = true; parentPort.postMessage('started') }
    }).catch(() => {})
  `
  const worker = new Worker(code, { eval: true, workerData: { index: INDEX, client: ctx.client({ timeoutMs: 8000, pacing: 'off' }), sb } })
  worker.on('error', () => {})
  await new Promise((resolve) => {
    worker.once('message', resolve)
    worker.once('exit', resolve)
    setTimeout(resolve, 5000)
  })
  await sleep(Math.floor(random() * 200))
  await worker.terminate()
  stats.workers++
}

test(`chaos: commands, worker terminations, injected panics, faults — no survivors, no false cleanup errors`, { timeout: RUN_MS + 60_000 }, async () => {
  console.log(`chaos seed ${SEED} (CHAOS_SEED=${SEED} repeats it), ${RUN_MS} ms`)
  const stats = { ok: 0, cancelled: 0, panics: 0, cleanupErrors: 0, workers: 0 }
  const until = Date.now() + RUN_MS
  const lanes = []
  for (let lane = 0; lane < PARALLEL; lane++) {
    lanes.push((async () => {
      while (Date.now() < until) {
        if (random() < 0.15) {
          // A short burst of transient failures every lane's cleanup must ride out.
          ctx.emu.addFault({ route: pick(['deleteProcess', 'wait']), times: 2, action: { kind: 'status', status: 503 } })
        }
        if (random() < 0.3) await workerCall(stats)
        else await mainThreadCall(stats)
      }
    })())
  }
  await Promise.all(lanes)
  console.log(`chaos: ${JSON.stringify(stats)}`)
  assert.ok(stats.ok + stats.cancelled + stats.panics + stats.cleanupErrors > 10, 'the run did something')
  const deadline = Date.now() + 8000
  while (ctx.emu.livePids().length && Date.now() < deadline) await sleep(50)
  assert.deepEqual(liveOfCalls(ctx.emu), [], `no survivors (seed ${SEED})`)
})
