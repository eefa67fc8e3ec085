// A cleanup at a saturated request budget: a command times out while ~80 requests of new work
// wait for the budget (10 starts per 2 s). The cleanup's DELETE takes the next free slot ahead
// of them, so the killable process is ended and proven gone within a few slots, not after the
// queue (or at the cleanup deadline), and the new work still completes.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { lib, kindOf, sleep, useEmulator, assertVictimContained } from './helpers.mjs'

const { execute } = lib
let ctx
let sandbox
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() })

const PACING = { limit: 10, windowMs: 2000, key: `saturation-${process.pid}` }
const ECHOS = 30

test('a timed-out command is cleaned up ahead of queued new work at a saturated budget', async () => {
  const client = ctx.client({ timeoutMs: 8000, pacing: PACING })
  const timeoutMs = 1500
  const started = Date.now()
  const victim = execute(client,
    { lease: { providerLeaseId: sandbox }, command: 'sh', args: ['-c', 'echo partial; exec sleep 30'] },
    AbortSignal.timeout(timeoutMs))
    .then((r) => ({ r, at: Date.now() }), (e) => ({ e, at: Date.now() }))
  await sleep(300)
  const echos = []
  for (let i = 0; i < ECHOS; i++) {
    echos.push(execute(client, { lease: { providerLeaseId: sandbox }, command: 'echo', args: [`e${i}`] })
      .then((r) => ({ r }), (e) => ({ e })))
  }
  const { afterTimeout: settledAfterTimeout } = await assertVictimContained(ctx.emu, victim, started, timeoutMs)

  const results = await Promise.all(echos)
  results.forEach(({ r, e }, i) => {
    assert.equal(e, undefined, `echo ${i} rejected: ${e && e.stack}`)
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, `e${i}\n`)
  })

  // What the server saw: the victim's DELETE came before most of the echos' creations.
  const log = ctx.requests()
  const del = log.findIndex((r) => kindOf(r) === 'deleteProcess')
  assert.ok(del >= 0, 'the victim was deleted')
  const creations = log.map(kindOf).map((k, i) => [k, i]).filter(([k]) => k === 'createProcess')
  const after = creations.filter(([, i]) => i > del).length
  assert.ok(after >= ECHOS / 2, `only ${after} of ${creations.length} creations came after the DELETE`)
  console.log(`victim settled ${settledAfterTimeout} ms after its timeout; ${after} of ${creations.length} creations after its DELETE`)
})
