// execute(): the managed-process path, seen from the host. Issue 2 §3 (output,
// input round trip, log) against the emulator, asserting on the result and on
// the emulator's request log.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync } from 'node:fs'
import {
  lib, kinds, commandKinds, putPaths, queryOf, bashParams, kindOf, useEmulator, liveOfCalls, sessionMode, sessionConfig } from './helpers.mjs'

const { execute } = lib
let ctx
let sandbox

// A journal large enough that the multi-MiB output tests never race eviction.
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() }, { journalBytes: 32 * 1024 * 1024 })

test('runs a command and returns stdout, stderr and the exit code', async (t) => {
  const sb = ctx.sandboxFor(t, sandbox)
  const r = await execute(ctx.client(), bashParams(sb, 'echo out; echo err >&2; exit 7'))
  assert.equal(r.exitCode, 7)
  assert.equal(r.signal, null)
  assert.equal(r.timedOut, false)
  assert.equal(r.stdout, 'out\n')
  assert.equal(r.stderr, 'err\n')
  assert.equal(typeof r.metadata.processId, 'string')
  assert.match(r.metadata.processId, /^[A-Za-z0-9_-]{1,200}$/)
  assert.equal(r.metadata.outputTruncated, false)
  assert.equal(r.metadata.treeExited, true)

  const k = kinds(ctx.requests())
  if (sessionMode()) {
    // A new supervisor: created once, its stream attached from the start (beside the
    // command's one input record), and no DELETE for a command that completed.
    assert.deepEqual([...k].sort(), ['connect', 'createProcess', 'input'], k.join(','))
    assert.equal(queryOf(ctx.requests()[k.indexOf('connect')]).get('after'), '0')
    assert.equal(r.metadata.containment, 'supervisor')
    // The next command on the lease is one input to the same supervisor.
    ctx.reset()
    const r2 = await execute(ctx.client(), bashParams(sb, 'echo out2; exit 3'))
    assert.equal(r2.exitCode, 3)
    assert.equal(r2.stdout, 'out2\n')
    assert.equal(r2.metadata.processId, r.metadata.processId)
    assert.deepEqual(kinds(ctx.requests()), ['input'])
    return
  }
  // create → connect → (gate) → … and no DELETE for a command that completed.
  assert.ok(k.indexOf('createProcess') >= 0, k.join(','))
  assert.ok(k.indexOf('connect') > k.indexOf('createProcess'), k.join(','))
  assert.equal(k.filter((x) => x === 'createProcess').length, 1)
  assert.equal(k.includes('deleteProcess'), false, k.join(','))
  // The process was created as /bin/bash -lc <script> and the output stream was
  // attached (connect) before the start gate was opened (the gate file PUT).
  const firstConnect = k.indexOf('connect')
  const gatePut = ctx.requests().findIndex((r, i) => i > firstConnect && kindOf(r) === 'putFile')
  assert.ok(gatePut > firstConnect, `gate after connect: ${k.join(',')}`)
  assert.equal(queryOf(ctx.requests()[firstConnect]).get('after'), '0')
})

test('cwd goes in the creation body as the TypeScript module sent it; a missing directory is still the script\'s exit', async () => {
  const r = await execute(ctx.client(), { lease: { providerLeaseId: sandbox }, command: 'pwd', cwd: '/tmp' })
  assert.equal(r.stdout, '/tmp\n')
  // Session mode creates no process per command: the script's `cd` is all there is.
  if (sessionMode()) {
    const missing = await execute(ctx.client(), { lease: { providerLeaseId: sandbox }, command: 'true', cwd: '/nonexistent-createos-cwd' })
    assert.equal(missing.exitCode, 1)
    return
  }
  // The emulator's process record echoes the body's cwd.
  const c = ctx.client()
  const url = `${c.config.apiUrl}/v1/sandboxes/${sandbox}/processes/${r.metadata.processId}`
  const record = await (await fetch(url, { headers: { 'X-Api-Key': c.apiKey } })).json()
  assert.equal(record.data.cwd, '/tmp')
  // A directory that does not exist: the process still starts, and the script's `cd` reports it.
  const missing = await execute(ctx.client(), { lease: { providerLeaseId: sandbox }, command: 'true', cwd: '/nonexistent-createos-cwd' })
  assert.equal(missing.exitCode, 1)
  assert.match(missing.stderr, /nonexistent-createos-cwd: No such file or directory/)
})

test('a command killed by a signal reports the signal name', async () => {
  const r = await execute(ctx.client(), bashParams(sandbox, 'kill -KILL $$'))
  assert.equal(r.exitCode, null)
  assert.equal(r.signal, 'SIGKILL')
  assert.equal(r.timedOut, false)
})

test('args, env, cwd and stdin round trip; staged files are removed', async () => {
  const weird = "it's \"quoted\" $HOME `x` \\ ; | & * ? [a] ~ \n newline é 🎉"
  const r = await execute(ctx.client(), {
    lease: { providerLeaseId: sandbox },
    command: '/bin/bash',
    args: ['-c', 'printf "%s|" "$@"; printf "\\n%s\\n%s\\n" "$MY_VAR" "$PWD"; cat', 'bash', weird, '', 'two words'],
    cwd: '/tmp',
    env: { MY_VAR: weird, _UNDERSCORE_1: 'x' },
    stdin: 'line one\nline two é\n',
  })
  assert.equal(r.exitCode, 0, r.stderr)
  assert.equal(r.stderr, '')
  assert.equal(r.stdout, `${weird}||two words|\n${weird}\n/tmp\nline one\nline two é\n`)

  const reqs = ctx.requests()
  const k = commandKinds(reqs, ctx.emu)
  if (sessionMode()) {
    // The stdin travels in the command's input record: nothing is staged by the client and
    // nothing is left to remove (a new supervisor adds its creation and its stream).
    assert.deepEqual(k.filter((x) => x !== 'createProcess' && x !== 'connect'), ['input'], k.join(','))
    // The supervisor's staged copy is open and already unlinked when the command starts.
    const s = await execute(ctx.client(), bashParams(sandbox, 'readlink /proc/self/fd/0', { stdin: 'x' }))
    assert.match(s.stdout, /^\/.+ \(deleted\)\n$/, s.stdout)
    assert.equal(existsSync(s.stdout.slice(0, -' (deleted)\n'.length)), false)
    return
  }
  // stdin is staged while the process is created (either may arrive first); files are
  // cleaned up afterwards.
  assert.deepEqual([...k.slice(0, 2)].sort(), ['createProcess', 'putFile'], k.join(','))
  const paths = putPaths(reqs)
  assert.ok(paths.length >= 2, `stdin and gate files: ${paths}`)
  for (const path of paths) {
    assert.match(path, /^\/tmp\//)
    assert.equal(existsSync(path), false, `staged file ${path} still exists`)
  }
  // The script removes both files itself: a successful command needs no extra
  // request for that, and none to close stdin.
  assert.deepEqual(k.slice(2), ['connect', 'putFile'])
  assert.equal(k.length, 4)
})

test('stdin null and empty string', async () => {
  const a = await execute(ctx.client(), bashParams(sandbox, 'cat; echo end', { stdin: null }))
  assert.equal(a.stdout, 'end\n')
  if (sessionMode()) assert.equal(kinds(ctx.requests()).includes('putFile'), false, 'nothing is staged for stdin: null')
  else assert.equal(kinds(ctx.requests())[0], 'createProcess', 'nothing is staged for stdin: null')
  ctx.reset()
  const b = await execute(ctx.client(), bashParams(sandbox, 'cat; echo end', { stdin: '' }))
  assert.equal(b.stdout, 'end\n')
  if (sessionMode()) assert.equal(kinds(ctx.requests()).includes('putFile'), false, 'the session mode stages nothing')
  for (const path of putPaths(ctx.requests())) assert.equal(existsSync(path), false)
})

test('UTF-8 split across frames is decoded', async () => {
  // € = e2 82 ac and 🎉 = f0 9f 8e 89, each written in two pieces with a pause,
  // so the emulator journals them in separate frames.
  const r = await execute(ctx.client(), bashParams(sandbox,
    "printf '\\xe2\\x82'; sleep 0.15; printf '\\xac|'; printf '\\xf0\\x9f' >&2; sleep 0.15; printf '\\x8e\\x89' >&2; sleep 0.15; printf '\\xf0\\x9f\\x8e'; sleep 0.15; printf '\\x89\\n'"))
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, '€|🎉\n')
  assert.equal(r.stderr, '🎉')
})

test('invalid UTF-8 becomes U+FFFD, like the TypeScript module', async () => {
  const r = await execute(ctx.client(), bashParams(sandbox, "printf 'a\\xffb'"))
  assert.equal(r.stdout, 'a\ufffdb')
})

test('log gets every chunk in order, all delivered before the promise settles', async () => {
  const chunks = { stdout: [], stderr: [] }
  const order = []
  const r = await execute(ctx.client(), bashParams(sandbox,
    'for i in $(seq 1 60); do echo "o$i"; echo "e$i" >&2; [ $((i % 10)) = 0 ] && sleep 0.02; done; head -c 300000 /dev/zero | tr "\\0" z'),
  undefined, (stream, text) => {
    assert.equal(typeof text, 'string')
    chunks[stream].push(text)
    order.push(stream)
  })
  // Checked synchronously at settle time: nothing may arrive later.
  const stdoutLog = chunks.stdout.join('')
  const stderrLog = chunks.stderr.join('')
  assert.equal(stdoutLog, r.stdout)
  assert.equal(stderrLog, r.stderr)
  assert.ok(r.stdout.startsWith('o1\no2\n'))
  assert.ok(r.stdout.endsWith('z'.repeat(1000)))
  let expected = ''
  for (let i = 1; i <= 60; i++) expected += `o${i}\n`
  assert.equal(r.stdout, expected + 'z'.repeat(300000))
  assert.ok(order.length >= 2)
  const before = chunks.stdout.length
  await new Promise((resolve) => setTimeout(resolve, 100))
  assert.equal(chunks.stdout.length, before, 'a log call arrived after the promise settled')
})

test('a throwing log does not crash, output is still captured and reported once', async () => {
  const warnings = []
  const onWarning = (w) => warnings.push(w)
  process.on('warning', onWarning)
  try {
    let calls = 0
    const r = await execute(ctx.client(), bashParams(sandbox, 'echo secret-output-1; sleep 0.05; echo two; echo three >&2'),
      undefined, () => { calls++; throw new Error('log exploded secret-output-1') })
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'secret-output-1\ntwo\n')
    assert.equal(r.stderr, 'three\n')
    assert.ok(calls >= 2, 'log keeps being called after it threw')
    await new Promise((resolve) => setImmediate(resolve))
    const ours = warnings.filter((w) => w.code === 'CREATEOS_LOG_THREW')
    assert.equal(ours.length, 1, 'reported exactly once')
    assert.ok(!String(ours[0].message).includes('secret-output-1'), 'the warning carries no output')
    // An async log that rejects is no different.
    const r2 = await execute(ctx.client(), bashParams(sandbox, 'echo x'), undefined, async () => { throw new Error('nope') })
    assert.equal(r2.stdout, 'x\n')
  } finally {
    process.off('warning', onWarning)
  }
})

test('a throwing log does not skip the cleanup of a timed-out command', async () => {
  const onWarning = () => {}
  process.on('warning', onWarning)
  try {
    const r = await execute(ctx.client(), bashParams(sandbox, 'echo started; sleep 60'),
      AbortSignal.timeout(800), () => { throw new Error('boom') })
    assert.equal(r.timedOut, true)
    assert.equal(r.stdout, 'started\n')
    const del = ctx.requests().filter((x) => kindOf(x) === 'deleteProcess')
    assert.equal(del.length >= 1, true)
    assert.equal(queryOf(del[0]).get('grace_ms'), '1000')
    assert.deepEqual(liveOfCalls(ctx.emu), [])
  } finally {
    process.off('warning', onWarning)
  }
})

test('output over 4 Mi characters keeps the last 4,194,304 and says so', async () => {
  const r = await execute(ctx.client(), bashParams(sandbox,
    'head -c 4194400 /dev/zero | tr "\\0" a; printf END; printf small >&2'))
  assert.equal(r.exitCode, 0)
  assert.equal(r.metadata.outputTruncated, true)
  assert.equal(r.stdout.length, 4194304)
  assert.ok(r.stdout.endsWith('aaaEND'))
  assert.equal(r.stderr, 'small')
})

test('truncation never splits a surrogate pair', async () => {
  // 2,097,152 emoji (2 UTF-16 units each) + "z" = 4,194,305 units: the last
  // 4,194,304 would start on a low surrogate, which must be dropped.
  const r = await execute(ctx.client(), bashParams(sandbox,
    "yes '🎉' | head -n 2097152 | tr -d '\\n'; printf z"))
  assert.equal(r.exitCode, 0)
  assert.equal(r.metadata.outputTruncated, true)
  assert.ok(r.stdout.length <= 4194304)
  assert.ok(r.stdout.length >= 4194303)
  assert.ok(r.stdout.isWellFormed(), 'no lone surrogate')
  assert.ok(r.stdout.endsWith('🎉🎉z'))
})

test('output of exactly 4,194,304 characters is not marked truncated', async () => {
  const r = await execute(ctx.client(), bashParams(sandbox, 'head -c 4194304 /dev/zero | tr "\\0" b'))
  assert.equal(r.stdout.length, 4194304)
  assert.equal(r.metadata.outputTruncated, false)
})

test('a command that leaves a background child reports treeExited: false; terminate ends it and reports true', async () => {
  const r = await execute(ctx.client(), bashParams(sandbox, '(sleep 30 &) ; echo done'))
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'done\n')
  assert.equal(r.metadata.treeExited, false)
  assert.ok(ctx.emu.livePids().length >= 1, 'the background child is still alive (keep is the default)')

  ctx.reset()
  const r2 = await execute(ctx.client({ leftoverProcesses: 'terminate' }), bashParams(sandbox, '(sleep 30 &) ; echo done'))
  assert.equal(r2.exitCode, 0)
  // The leftover was ended and proven gone: the whole tree has exited.
  assert.equal(r2.metadata.treeExited, true)
  const k = kinds(ctx.requests())
  assert.ok(k.includes('deleteProcess'), k.join(','))
  // Only the second command's tree was ended; the first one's child is ours to
  // leave to close() (which must kill it).
})

test('requests start at least 300 ms apart with pacing: "spacing" (the TypeScript module\'s rule)', async (t) => {
  const sb = ctx.sandboxFor(t, sandbox)
  const r = await execute(ctx.client({ pacing: 'spacing' }), bashParams(sb, 'echo paced', { stdin: 'x' }))
  assert.equal(r.stdout, 'paced\n')
  if (sessionMode()) {
    // A new supervisor's creation, stream and input, then a second command's input: 4
    // requests through the same pacer.
    const r2 = await execute(ctx.client({ pacing: 'spacing' }), bashParams(sb, 'echo paced2'))
    assert.equal(r2.stdout, 'paced2\n')
    assert.deepEqual(kinds(ctx.requests()).sort(), ['connect', 'createProcess', 'input', 'input'])
  }
  // When each request's head arrived (the gate's goes out beside the creation and is
  // received in full only after the connect request: the log is in receipt order).
  const at = ctx.requests().map((x) => x.atMs).sort((a, b) => a - b)
  assert.ok(at.length >= 4)
  for (let i = 1; i < at.length; i++) {
    assert.ok(at[i] - at[i - 1] >= 280, `requests ${i - 1}→${i} only ${(at[i] - at[i - 1]).toFixed(1)} ms apart`)
  }
})

test('X-Api-Key is required: a wrong key gives the 401 API error and nothing runs', async () => {
  const client = { config: { apiUrl: ctx.url, timeoutMs: 5000, ...sessionConfig() }, apiKey: 'wrong-key' }
  const error = await execute(client, bashParams(sandbox, 'echo hi')).then(() => null, (e) => e)
  assert.ok(error instanceof lib.CreateosApiError, String(error))
  assert.equal(error.status, 401)
  assert.match(error.message, /^CreateOS request failed \(HTTP 401\)/)
})

test('the key may come from client.config.apiKey or CREATEOS_API_KEY', async () => {
  const r = await execute({ config: { apiUrl: ctx.url, timeoutMs: 5000, apiKey: ctx.apiKey, ...sessionConfig() } }, bashParams(sandbox, 'echo a'))
  assert.equal(r.stdout, 'a\n')
  const saved = process.env.CREATEOS_API_KEY
  process.env.CREATEOS_API_KEY = ctx.apiKey
  try {
    const r2 = await execute({ config: { apiUrl: ctx.url, timeoutMs: 5000, ...sessionConfig() } }, bashParams(sandbox, 'echo b'))
    assert.equal(r2.stdout, 'b\n')
  } finally {
    if (saved === undefined) delete process.env.CREATEOS_API_KEY
    else process.env.CREATEOS_API_KEY = saved
  }
})

test('concurrent commands on one sandbox do not mix output', async () => {
  const results = await Promise.all([1, 2, 3, 4].map((i) =>
    execute(ctx.client(), {
      lease: { providerLeaseId: sandbox },
      command: '/bin/bash',
      args: ['-c', 'for j in 1 2 3; do echo "$0-$j"; sleep 0.01; done', `c${i}`],
    })))
  results.forEach((r, i) => assert.equal(r.stdout, `c${i + 1}-1\nc${i + 1}-2\nc${i + 1}-3\n`))
})
