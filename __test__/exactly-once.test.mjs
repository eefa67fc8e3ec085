// At most once, from the host's view, against the emulator's documented profile (an unpaged
// process list without `total`, exit frames without `newest_seq`): a late creation never runs
// the command, a finished command stays finished when its record cannot be read, treeExited is
// true after 'terminate' ended a leftover, and no staged stdin stays after a stream error.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs'
import { lib, bashParams, rejection, sleep, useEmulator, assertNoneAlive, liveOfCalls } from './helpers.mjs'

const { execute, CreateosApiError } = lib
let ctx
useEmulator(import.meta.url, (c) => { ctx = c }, { profile: 'documented' })

let n = 0
const ranFile = () => `/tmp/exact-js-ran-${process.pid}-${Date.now()}-${n++}`
const runs = (f) => (existsSync(f) ? readFileSync(f, 'utf8').split('\n').filter(Boolean).length : 0)
const tokenOf = (requests) => {
  for (const r of requests) {
    const m = /createos-(?:start|stdin)-([0-9a-f]+)/.exec(decodeURIComponent(r.query))
    if (r.route === 'putFile' && m) return m[1]
  }
  return null
}
// Staged data of a call left in /tmp: a staged stdin that still has content (the gate, its claim
// and the cancel file hold none of the command's data; the files API cannot delete them).
const staged = (token) => readdirSync('/tmp').filter((f) => {
  if (!f.includes(token) || !f.startsWith('createos-stdin-')) return false
  try { return statSync(`/tmp/${f}`).size > 0 } catch { return false }
})
const line = (r) => (r.route === 'putFile' && r.query.includes('.cancelled') ? 'PUT cancel' : `${r.method} ${r.route}`)

async function until(check, ms = 10_000) {
  const end = Date.now() + ms
  while (!check() && Date.now() < end) await sleep(20)
  return check()
}

test('a creation applied right after the recovery list: the command runs once, the late process runs nothing', async () => {
  const sb = ctx.sandbox()
  await execute(ctx.client(), bashParams(sb, 'echo earlier'))
  ctx.reset()
  ctx.emu.addFault({ route: 'createProcess', times: 1, action: { kind: 'applyLate', afterList: true } })
  const file = ranFile()
  const r = await execute(ctx.client({ pacing: 'off' }), bashParams(sb, `echo run >> ${file}; echo done`))
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'done\n')
  const log = ctx.requests().filter((q) => q.receivedMs !== null).map(line)
  const create = log.lastIndexOf('POST createProcess')
  // Cancelled first (a process of the lost attempt found on the list then leaves the staged
  // files to the next attempt), then listed, then sent again.
  assert.ok(log.indexOf('PUT cancel') === 1 && log.indexOf('GET listProcesses') > 1 && log.indexOf('GET listProcesses') < create, log.join(', '))
  assert.ok(await until(() => ctx.requests().some((q) => q.appliedMs != null)), 'the late creation was applied')
  assert.ok(await until(() => liveOfCalls(ctx.emu).length === 0), 'nothing of the call stays alive')
  assert.equal(runs(file), 1, 'the command ran exactly once')
  rmSync(file, { force: true })
  rmSync(`/tmp/createos-start-${tokenOf(ctx.requests())}.cancelled`, { force: true })
})

test('a finished command stays finished when its record cannot be read: treeExited null, no error', async () => {
  const sb = ctx.sandbox()
  ctx.emu.addFault({ route: 'getProcess', afterExitFrame: true, action: { kind: 'status', status: 500 } })
  const r = await execute(ctx.client(), bashParams(sb, 'echo hi'))
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hi\n')
  assert.equal(r.metadata.treeExited, null)
  assert.ok(ctx.requests().some((q) => q.route === 'getProcess' && q.status === 500))
  assert.deepEqual(liveOfCalls(ctx.emu), [])
})

test("'terminate' ends a leftover and reports treeExited: true", async () => {
  const sb = ctx.sandbox()
  const r = await execute(ctx.client({ leftoverProcesses: 'terminate' }), bashParams(sb, 'sleep 30 >/dev/null 2>&1 & echo started'))
  assert.equal(r.stdout, 'started\n')
  assert.equal(r.metadata.treeExited, true)
  const deletes = ctx.requests().filter((q) => q.route === 'deleteProcess')
  assert.deepEqual(deletes.map((q) => q.status), [200])
  await assertNoneAlive(ctx.emu, 10_000)
})

test('a creation applied then answered 502 in a used sandbox: found, ended, an ordinary error', async () => {
  const sb = ctx.sandbox()
  await execute(ctx.client(), bashParams(sb, 'echo earlier'))
  ctx.reset()
  ctx.emu.addFault({ route: 'createProcess', times: 1, action: { kind: 'status', status: 502, afterHandler: true } })
  const file = ranFile()
  const error = await rejection(execute(ctx.client(), bashParams(sb, `echo run >> ${file}`)))
  assert.ok(error instanceof CreateosApiError, String(error && error.stack))
  assert.equal(error.status, 502)
  const log = ctx.requests().filter((q) => q.receivedMs !== null).map(line)
  assert.ok(log.includes('DELETE deleteProcess'), log.join(', '))
  await assertNoneAlive(ctx.emu, 10_000)
  assert.equal(runs(file), 0)
})

test('no staged stdin stays after a stream error while the script was still starting', async () => {
  const sb = ctx.sandbox()
  // The login shell takes 1 s, so the call ends before the script reached its gate.
  await execute(ctx.client(), bashParams(sb, 'echo sleep 1 > "$HOME/.bash_profile"'))
  ctx.reset()
  ctx.emu.addFault({ route: 'connect', times: 1, action: { kind: 'errorFrame', error: 'boom' } })
  await rejection(execute(ctx.client(), bashParams(sb, 'cat', { stdin: 'secret' })))
  const token = tokenOf(ctx.requests())
  assert.ok(token)
  assert.ok(await until(() => staged(token).length === 0), `left: ${staged(token)}`)
  await assertNoneAlive(ctx.emu, 10_000)
  await execute(ctx.client(), bashParams(sb, 'rm -f "$HOME/.bash_profile"'))
})
