// A cleanup at a saturated request budget: a command times out while ~80 requests of new work
// wait for the budget (10 starts per 2 s). The cleanup's DELETE takes the next free slot ahead
// of them, so the killable process is ended and proven gone within a few slots, not after the
// queue (or at the cleanup deadline), and the new work still completes.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { lib, kindOf, sleep, useEmulator } from './helpers.mjs'

const { execute } = lib
let ctx
let sandbox
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() })

const PACING = { limit: 10, windowMs: 2000, key: `saturation-${process.pid}` }
const ECHOS = 30

function cmdline(pid) {
  try { return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').trim() } catch { return '' }
}

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
  // The victim's process, as the emulator sees it, while it runs.
  let victimPid = null
  const findBy = Date.now() + timeoutMs
  while (victimPid === null && Date.now() < findBy) {
    victimPid = ctx.emu.livePids().find((pid) => cmdline(pid) === 'sleep 30') ?? null
    if (victimPid === null) await sleep(25)
  }
  assert.ok(victimPid !== null, 'the victim\'s sleep 30 was seen alive')

  const v = await victim
  assert.equal(v.e, undefined, `the victim rejected: ${v.e && v.e.stack}`)
  assert.equal(v.r.timedOut, true)
  assert.equal(v.r.stdout, 'partial\n')
  const settledAfterTimeout = v.at - (started + timeoutMs)
  assert.ok(settledAfterTimeout < 5000, `the victim settled ${settledAfterTimeout} ms after its timeout`)
  assert.ok(!ctx.emu.livePids().includes(victimPid), 'the victim\'s process is gone when the call settles')

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
