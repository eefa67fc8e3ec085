// Many commands in flight at once (issue 32), against the emulator's virtual processes (scripted
// output, sleeps and exits without an OS process, so a thousand fit on a small machine; the
// emulator plays the start gate of our scripts as bash would). What a host following many long
// commands relies on: every one of them exact, each created once and followed, HTTP/2 streams
// sharing a few connections (100 streams each) while a timed-out command's cleanup still goes
// out at once, and nothing left running afterwards. Memory per command is measured by the
// bench (§14), not asserted here.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { fileURLToPath } from 'node:url'
import { lib, startEmu, kindOf, sleep, CANCELLED } from './helpers.mjs'

const FILE = fileURLToPath(import.meta.url)
const { execute, CreateosCleanupError } = lib

const contexts = []
after(async () => {
  for (const c of contexts) await c.close(FILE)
})

async function emulator(options) {
  const c = await startEmu({ heartbeatMs: 1000, virtualProcesses: true, ...options })
  contexts.push(c)
  return c
}

/** Wait until the emulator runs `n` virtual processes (all in flight at once), 60 s at most. */
async function allInFlight(emu, n, what) {
  const end = Date.now() + 60_000
  while (emu.liveVirtual() < n) {
    assert.ok(Date.now() < end, `${what}: only ${emu.liveVirtual()} of ${n} in flight after 60 s`)
    await sleep(50)
  }
}

/** Wait until no virtual process runs, 10 s at most. */
async function noneLeft(emu, what) {
  const end = Date.now() + 10_000
  while (emu.liveVirtual() > 0 && Date.now() < end) await sleep(20)
  assert.equal(emu.liveVirtual(), 0, `${what}: virtual processes still running`)
  assert.deepEqual(emu.livePids(), [], `${what}: real processes still running`)
}

/** Per sandbox: the kinds of the requests the emulator saw for it. */
function bySandbox(requests) {
  const out = new Map()
  for (const r of requests) {
    const m = /^\/v1\/sandboxes\/([^/]+)/.exec(r.path)
    if (!m) continue
    if (!out.has(m[1])) out.set(m[1], [])
    out.get(m[1]).push(kindOf(r))
  }
  return out
}

test('1,000 commands in flight (HTTP/1.1): each exact, created once and followed, nothing left', async () => {
  const N = 1000
  const c = await emulator({})
  const client = c.client({ pacing: 'off', timeoutMs: 120_000 })
  const sandboxes = Array.from({ length: N }, () => c.sandbox())
  const calls = sandboxes.map((sb, i) =>
    execute(client, c.params(sb, 'createos-virtual', {
      args: [`out:start ${i}\n`, 'sleep:4000', `err:e${i}\n`, `out:end ${i}\n`, `exit:${i % 7}`],
    })))
  const settled = Promise.allSettled(calls)
  await allInFlight(c.emu, N, 'HTTP/1.1')
  const results = await settled
  results.forEach((r, i) => {
    assert.equal(r.status, 'fulfilled', `command ${i}: ${r.reason}`)
    const v = r.value
    assert.deepEqual(
      { exitCode: v.exitCode, signal: v.signal, timedOut: v.timedOut, stdout: v.stdout, stderr: v.stderr },
      { exitCode: i % 7, signal: null, timedOut: false, stdout: `start ${i}\nend ${i}\n`, stderr: `e${i}\n` },
      `command ${i}`,
    )
    assert.equal(v.metadata.outputTruncated, false)
  })
  // What the server saw: per sandbox one creation and a follow, no DELETE (each ended by itself).
  const seen = bySandbox(c.requests())
  for (const sb of sandboxes) {
    const k = seen.get(sb) ?? []
    assert.equal(k.filter((x) => x === 'createProcess').length, 1, `${sb}: ${k}`)
    assert.ok(k.includes('connect'), `${sb}: not followed: ${k}`)
    assert.ok(!k.includes('deleteProcess'), `${sb}: ${k}`)
  }
  await noneLeft(c.emu, 'HTTP/1.1')
})

test('HTTP/2: 250 streams share a few connections, a timed-out command is still cleaned up at once', async (t) => {
  const N = 250
  const c = await emulator({ tls: true, http2: true })
  const config = { pacing: 'off', caCertPem: c.emu.caPem }
  const client = c.client({ ...config, timeoutMs: 120_000 })
  const before = c.emu.connections()
  const sandboxes = Array.from({ length: N }, () => c.sandbox())
  const calls = sandboxes.map((sb, i) =>
    execute(client, c.params(sb, 'createos-virtual', { args: [`out:${i}\n`, 'sleep:6000', 'out:done\n'] })))
  const settled = Promise.allSettled(calls)
  await allInFlight(c.emu, N, 'HTTP/2')
  // With all 250 streams open, one more command times out: its DELETE shares a connection of
  // its own lane, never waits behind 250 idle streams, and proves the process gone.
  const victimSb = c.sandbox()
  const victim = await execute(client,
    c.params(victimSb, 'createos-virtual', { args: ['out:victim\n', 'sleep:120000', 'out:never\n'] }),
    AbortSignal.timeout(1500))
    .catch((e) => e)
  assert.ok(!(victim instanceof CreateosCleanupError), `the victim's cleanup failed: ${victim && victim.message}`)
  assert.ok(!(victim instanceof Error), `the victim failed: ${victim && victim.message}`)
  assert.equal(victim.timedOut, true)
  assert.equal(victim.stdout, 'victim\n')
  const victimKinds = bySandbox(c.requests()).get(victimSb)
  assert.ok(victimKinds.includes('deleteProcess'), `the victim was not terminated: ${victimKinds}`)
  const results = await settled
  results.forEach((r, i) => {
    assert.equal(r.status, 'fulfilled', `command ${i}: ${r.reason}`)
    assert.deepEqual([r.value.exitCode, r.value.stdout, r.value.timedOut], [0, `${i}\ndone\n`, false], `command ${i}`)
  })
  // 251 streams at once need 3 lanes; starts (a creation, an upload and a follow each) open a
  // few more while the first lanes fill. One connection per command would be 250 or more.
  const opened = c.emu.connections() - before
  t.diagnostic(`${opened} connections for ${N + 1} commands over HTTP/2`)
  assert.ok(opened <= 25, `${opened} connections for ${N + 1} commands over HTTP/2`)
  for (const r of c.requests().filter((x) => x.route !== 'unknown')) {
    assert.equal(r.httpVersion, 'HTTP/2.0', `${r.method} ${r.path} went over ${r.httpVersion}`)
  }
  await noneLeft(c.emu, 'HTTP/2')
})

test('a virtual command ends on the signals of a cleanup, as a process that obeys them', async () => {
  const c = await emulator({})
  const sb = c.sandbox()
  const ac = new AbortController()
  const call = execute(c.client({ pacing: 'off', timeoutMs: 60_000 }),
    c.params(sb, 'createos-virtual', { args: ['out:up\n', 'sleep:60000'] }), ac.signal)
  await allInFlight(c.emu, 1, 'abort')
  ac.abort()
  const err = await call.catch((e) => e)
  assert.ok(err instanceof Error && !(err instanceof CreateosCleanupError), `${err && err.message}`)
  assert.equal(err.message, CANCELLED)
  assert.equal(err.code, 'CREATEOS_CANCELLED')
  const k = c.requests().map(kindOf)
  assert.ok(k.includes('deleteProcess'), `not terminated: ${k}`)
  await noneLeft(c.emu, 'abort')
})
