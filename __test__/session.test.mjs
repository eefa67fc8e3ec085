// Session mode (config.session, docs/session.md): a command is one POST …/input to a
// supervisor; every abnormal end goes through the provider's proof (DELETE of the
// supervisor's tree, confirmed), and a later command works on a new supervisor.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { lib, kinds, kindOf, bashParams, rejection, sleep, useEmulator, cmdline, CANCELLED, liveOfCalls } from './helpers.mjs'

const { execute, destroySandbox, CreateosApiError } = lib
let ctx
useEmulator(import.meta.url, (c) => { ctx = c })

const SUPERVISOR_ENDED = "CreateOS session supervisor ended before the command's exit status."
const MARKER_INVALID = 'CreateOS session marker is invalid.'
const SEQUENCE_GAP = 'CreateOS process output has a sequence gap.'

const session = (config = {}) => ctx.client({ session: { idleMs: 60_000 }, ...config })

/** Live pids of session supervisors (their command line carries the marker assignment). */
function supervisors() {
  return ctx.emu.livePids().filter((pid) => cmdline(pid).includes('__cos_marker='))
}

async function until(cond, what, ms = 10_000) {
  const end = Date.now() + ms
  while (!cond()) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`)
    await sleep(20)
  }
}

/** The sandbox's supervisors end first, with their proof; nothing of it is left alive. */
async function finish(sandbox) {
  await destroySandbox(ctx.client(), sandbox)
  await until(() => liveOfCalls(ctx.emu).length === 0, 'no live process')
}

/** A fresh sandbox for one test, destroyed after it whatever the outcome (a failed test
 * leaves no supervisor to the next one). */
function fresh(t) {
  const sandbox = ctx.sandbox()
  t.after(() => destroySandbox(ctx.client(), sandbox).catch(() => {}))
  return sandbox
}

/** After an abnormal end: the proof (a DELETE of the supervisor, confirmed) was sent, no
 * supervisor is alive, and a later command on the lease works on a new supervisor. */
async function provenThenWorks(sandbox, client) {
  const k = kinds(ctx.requests())
  assert.ok(k.includes('deleteProcess'), `the provider's proof was sent: ${k}`)
  assert.deepEqual(supervisors(), [], 'the supervisor tree is gone when the call settles')
  ctx.reset()
  const r = await execute(client, bashParams(sandbox, 'echo again'), AbortSignal.timeout(20_000))
  assert.equal(r.stdout, 'again\n')
  assert.equal(r.metadata.containment, 'supervisor')
  assert.deepEqual(kinds(ctx.requests()).sort(), ['connect', 'createProcess', 'input'])
}

test('sequential commands: one creation and one stream, then one input request each', async (t) => {
  const sandbox = fresh(t)
  const client = session()
  const results = []
  for (let i = 0; i < 5; i++) {
    results.push(await execute(client, bashParams(sandbox, `echo out ${i}; echo err ${i} >&2; exit ${i}`), AbortSignal.timeout(20_000)))
  }
  results.forEach((r, i) => {
    assert.equal(r.stdout, `out ${i}\n`)
    assert.equal(r.stderr, `err ${i}\n`)
    assert.equal(r.exitCode, i)
    assert.equal(r.signal, null)
    assert.equal(r.timedOut, false)
    assert.equal(r.metadata.containment, 'supervisor')
    assert.equal(r.metadata.treeExited, true)
    assert.equal(r.metadata.processId, results[0].metadata.processId)
  })
  // The stream is opened beside the first input (its replay from 0 misses nothing).
  assert.deepEqual(kinds(ctx.requests()).sort(), ['connect', 'createProcess', 'input', 'input', 'input', 'input', 'input'])
  assert.equal(supervisors().length, 1, 'one supervisor stays for the next command')
  // The default mode gives the same values and has no containment field.
  const plain = await execute(ctx.client(), bashParams(sandbox, 'echo out 3; echo err 3 >&2; exit 3'), AbortSignal.timeout(20_000))
  assert.equal(plain.stdout, results[3].stdout)
  assert.equal(plain.stderr, results[3].stderr)
  assert.equal(plain.exitCode, results[3].exitCode)
  assert.equal('containment' in plain.metadata, false)
  ctx.reset()
  await finish(sandbox)
  const k = kinds(ctx.requests())
  assert.ok(k.indexOf('deleteProcess') >= 0 && k.indexOf('deleteProcess') < k.indexOf('deleteSandbox'), `supervisors end before the sandbox: ${k}`)
})

test('args, env, cwd and a signal death come back as in the default mode', async (t) => {
  const sandbox = fresh(t)
  const params = { lease: { providerLeaseId: sandbox }, command: '/bin/bash', args: ['-c', 'printf "%s|" "$FOO" "$PWD" "$@"', '_', "it's", '-n'], env: { FOO: 'b a\'r' }, cwd: '/tmp' }
  const a = await execute(session(), params, AbortSignal.timeout(20_000))
  const b = await execute(ctx.client(), params, AbortSignal.timeout(20_000))
  assert.equal(a.metadata.containment, 'supervisor')
  assert.equal(a.stdout, b.stdout)
  assert.equal(a.stdout, "b a'r|/tmp|it's|-n|")
  const k = await execute(session(), bashParams(sandbox, 'kill -9 $$'), AbortSignal.timeout(20_000))
  assert.equal(k.signal, 'SIGKILL')
  assert.equal(k.exitCode, null)
  await finish(sandbox)
})

test('a command that reads stdin gets the given stdin; without one it reads EOF, never the supervisor\'s stdin', async (t) => {
  const sandbox = fresh(t)
  const client = session()
  const r = await execute(client, bashParams(sandbox, 'cat; echo; wc -c < /dev/null', { stdin: 'hello\nwörld' }), AbortSignal.timeout(20_000))
  assert.equal(r.stdout, 'hello\nwörld\n0\n')
  const e = await execute(client, bashParams(sandbox, 'cat; echo done'), AbortSignal.timeout(20_000))
  assert.equal(e.stdout, 'done\n')
  assert.equal(e.metadata.processId, r.metadata.processId)
  await finish(sandbox)
})

test('binary output arrives unchanged (NUL, marker-like bytes, no final newline), as in the default mode', async (t) => {
  const sandbox = fresh(t)
  // Every byte value, a partial marker prefix, and output that ends without a newline.
  const script = 'for i in $(seq 0 255); do printf "\\\\$(printf %03o $i)"; done; printf "\\0\\036cos-en"; head -c 3000 /dev/zero | tr "\\0" "\\036"; printf "\\0\\036"; printf "tail" >&2'
  const logged = { session: { stdout: '', stderr: '' }, plain: { stdout: '', stderr: '' } }
  const a = await execute(session(), bashParams(sandbox, script), AbortSignal.timeout(20_000), (s, t) => { logged.session[s] += t })
  const b = await execute(ctx.client(), bashParams(sandbox, script), AbortSignal.timeout(20_000), (s, t) => { logged.plain[s] += t })
  assert.equal(a.exitCode, 0)
  assert.equal(a.metadata.containment, 'supervisor')
  assert.equal(a.stdout, b.stdout)
  assert.equal(a.stderr, 'tail')
  assert.equal(a.stdout.length, b.stdout.length)
  assert.ok(a.stdout.endsWith('\0\x1e'))
  assert.deepEqual(logged.session, logged.plain)
  assert.equal(logged.session.stdout, a.stdout)
  await finish(sandbox)
})

test('a command that kills the supervisor: rejected, its tree proven gone, a later command works', async (t) => {
  const sandbox = fresh(t)
  const client = session()
  await execute(client, bashParams(sandbox, 'true'), AbortSignal.timeout(20_000))
  ctx.reset()
  const error = await rejection(execute(client, bashParams(sandbox, 'echo before; grep -q __cos_marker /proc/$PPID/cmdline && kill -9 $PPID; sleep 1'), AbortSignal.timeout(20_000)))
  assert.equal(error.message, SUPERVISOR_ENDED)
  await provenThenWorks(sandbox, client)
  await finish(sandbox)
})

test('a command that forges an end marker: rejected, proven, a later command works', async (t) => {
  const sandbox = fresh(t)
  const client = session()
  const forged = 'printf "x\\0\\036cos-end:%s:0:0\\n" ffffffffffffffffffffffffffffffff; sleep 30'
  const error = await rejection(execute(client, bashParams(sandbox, forged), AbortSignal.timeout(20_000)))
  assert.equal(error.message, MARKER_INVALID)
  await provenThenWorks(sandbox, client)
  await finish(sandbox)
})

test('a command that leaves a child, leftoverProcesses terminate: the session ends through the proof', async (t) => {
  const sandbox = fresh(t)
  const client = session({ leftoverProcesses: 'terminate' })
  const r = await execute(client, bashParams(sandbox, 'sleep 300 & echo $!'), AbortSignal.timeout(20_000))
  const child = Number(r.stdout.trim())
  assert.equal(r.exitCode, 0)
  assert.equal(r.metadata.containment, 'provider')
  assert.equal(r.metadata.treeExited, true)
  assert.ok(!ctx.emu.livePids().includes(child), 'the leftover is gone when the call settles')
  await provenThenWorks(sandbox, client)
  await finish(sandbox)
})

test('a command that leaves a child, keep: the supervisor is retired at once (a new one runs the next command), the leftover kept', async (t) => {
  const sandbox = fresh(t)
  const client = session({ session: { idleMs: 1500 } })
  const r = await execute(client, bashParams(sandbox, 'sleep 300 & echo $!'), AbortSignal.timeout(20_000))
  const child = Number(r.stdout.trim())
  t.after(() => { try { process.kill(child, 'SIGKILL') } catch {} })
  assert.equal(r.metadata.containment, 'supervisor')
  assert.equal(r.metadata.treeExited, false)
  assert.ok(ctx.emu.livePids().includes(child), 'kept')
  const next = await execute(client, bashParams(sandbox, 'echo next'), AbortSignal.timeout(20_000))
  assert.equal(next.stdout, 'next\n')
  assert.notEqual(next.metadata.processId, r.metadata.processId)
  assert.equal(kinds(ctx.requests()).filter((k) => k === 'createProcess').length, 2)
  // The retired one exits on its `end` record, proven by its exit frame (no DELETE), its
  // leftover kept as the default mode keeps it; the idle one ends after the idle time with
  // the proof.
  await until(() => supervisors().length === 0, 'both supervisors to end')
  assert.ok(ctx.emu.livePids().includes(child), 'still kept')
  assert.equal(kinds(ctx.requests()).filter((k) => k === 'deleteProcess').length, 1)
  process.kill(child, 'SIGKILL')
  await finish(sandbox)
})

test('a timeout ends the supervisor through the proof: timedOut with the output so far', async (t) => {
  const sandbox = fresh(t)
  const client = session()
  const r = await execute(client, bashParams(sandbox, 'echo ready; sleep 60'), AbortSignal.timeout(1500))
  assert.equal(r.timedOut, true)
  assert.equal(r.stdout, 'ready\n')
  assert.equal(r.metadata.containment, 'provider')
  assert.equal(r.metadata.treeExited, true)
  await provenThenWorks(sandbox, client)
  await finish(sandbox)
})

test('a cancellation ends the supervisor through the proof and rejects as in the default mode', async (t) => {
  const sandbox = fresh(t)
  const client = session()
  const ac = new AbortController()
  const p = execute(client, bashParams(sandbox, 'echo ready; sleep 60'), ac.signal, () => ac.abort())
  const error = await rejection(p)
  assert.equal(error.message, CANCELLED)
  await provenThenWorks(sandbox, client)
  await finish(sandbox)
})

test('a failed input request ends the supervisor through the proof', async (t) => {
  const sandbox = fresh(t)
  const client = session()
  await execute(client, bashParams(sandbox, 'true'), AbortSignal.timeout(20_000))
  ctx.reset()
  ctx.emu.addFault({ route: 'input', times: 1, action: { kind: 'status', status: 500 } })
  const error = await rejection(execute(client, bashParams(sandbox, 'echo never'), AbortSignal.timeout(20_000)))
  assert.ok(error instanceof CreateosApiError, String(error && error.stack))
  assert.equal(error.status, 500)
  await provenThenWorks(sandbox, client)
  await finish(sandbox)
})

test('a dropped stream is replayed from the cursor; a gap fails closed through the proof', async (t) => {
  const sandbox = fresh(t)
  const client = session()
  ctx.emu.addFault({ route: 'connect', times: 1, action: { kind: 'dropAfterFrames', frames: 3 } })
  const r = await execute(client, bashParams(sandbox, 'for i in 1 2 3 4 5 6; do echo $i; sleep 0.05; done'), AbortSignal.timeout(20_000))
  assert.equal(r.stdout, '1\n2\n3\n4\n5\n6\n')
  assert.equal(r.metadata.containment, 'supervisor')
  const connects = ctx.requests().filter((q) => kindOf(q) === 'connect')
  assert.equal(connects.length, 2)
  assert.match(connects[1].query, /after=[1-9]/)
  await finish(sandbox)
  const sandbox2 = fresh(t)
  ctx.reset()
  ctx.emu.addFault({ route: 'connect', times: 1, action: { kind: 'gapAfterFrames', frames: 2 } })
  const error = await rejection(execute(client, bashParams(sandbox2, 'for i in 1 2 3 4 5 6; do echo $i; sleep 0.05; done'), AbortSignal.timeout(20_000)))
  assert.equal(error.message, SEQUENCE_GAP)
  await provenThenWorks(sandbox2, client)
  await finish(sandbox2)
})

test('concurrent commands on one lease get supervisors of their own', async (t) => {
  const sandbox = fresh(t)
  const client = session()
  const rs = await Promise.all([1, 2, 3].map((i) => execute(client, bashParams(sandbox, `sleep 0.3; echo ${i}`), AbortSignal.timeout(20_000))))
  assert.deepEqual(rs.map((r) => r.stdout), ['1\n', '2\n', '3\n'])
  assert.equal(new Set(rs.map((r) => r.metadata.processId)).size, 3)
  assert.equal(supervisors().length, 3)
  await finish(sandbox)
})

test('an idle supervisor ends after session.idleMs with the proof', async (t) => {
  const sandbox = fresh(t)
  await execute(session({ session: { idleMs: 1000 } }), bashParams(sandbox, 'true'), AbortSignal.timeout(20_000))
  assert.equal(supervisors().length, 1)
  await until(() => supervisors().length === 0, 'the idle end')
  assert.ok(kinds(ctx.requests()).includes('deleteProcess'))
  await finish(sandbox)
})

test('session config is checked before anything is sent', async (t) => {
  const sandbox = fresh(t)
  for (const bad of ['yes', 1, { idleMs: 10 }, { idleMs: 1.5e3 + 0.5 }]) {
    const error = await rejection(execute(ctx.client({ session: bad }), bashParams(sandbox, 'true')))
    assert.equal(error.name, 'CreateosInputError', String(bad))
  }
  assert.deepEqual(ctx.requests(), [])
})

test('a host process that ends with an idle supervisor is not kept alive, and ends it with the proof on its way out', async (t) => {
  const sandbox = fresh(t)
  const { spawn } = await import('node:child_process')
  const child = `
    const lib = require(${JSON.stringify(new URL('../index.js', import.meta.url).pathname)})
    lib.execute({ config: { apiUrl: ${JSON.stringify(ctx.url)}, timeoutMs: 5000, session: { idleMs: 600000 } }, apiKey: ${JSON.stringify(ctx.apiKey)} },
      { lease: { providerLeaseId: ${JSON.stringify(sandbox)} }, command: 'echo', args: ['child'] })
      .then((r) => process.stdout.write(r.stdout + r.metadata.containment))`
  const started = Date.now()
  const proc = spawn(process.execPath, ['-e', child], { stdio: ['ignore', 'pipe', 'inherit'] })
  let out = ''
  proc.stdout.on('data', (d) => { out += d })
  const code = await new Promise((resolve) => proc.on('exit', resolve))
  assert.equal(code, 0)
  assert.equal(out, 'child\nsupervisor')
  assert.ok(Date.now() - started < 60_000, 'the idle timer did not keep the process alive')
  const k = kinds(ctx.requests())
  assert.ok(k.includes('deleteProcess'), `the supervisor was ended on the way out: ${k}`)
  await until(() => supervisors().length === 0, 'no supervisor alive')
})
