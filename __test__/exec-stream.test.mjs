// executeStream() (POST /exec?stream=true) and followProcess() for a process the
// host created itself.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import {
  lib, kinds, kindOf, queryOf, bashParams, rejection, sleep,
  useEmulator
} from './helpers.mjs'

const { executeStream, followProcess } = lib
let ctx
let sandbox
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() })

test('executeStream: stdout, stderr, exit code, args/env/cwd/stdin, one request', async () => {
  const logs = []
  const r = await executeStream(ctx.client(), {
    lease: { providerLeaseId: sandbox },
    command: '/bin/bash',
    args: ['-c', 'echo "$1 $FOO $PWD"; cat; echo oops >&2; exit 5', 'bash', "it's"],
    env: { FOO: 'bar baz' },
    cwd: '/tmp',
    stdin: 'from stdin\n',
  }, undefined, (stream, text) => logs.push([stream, text]))
  assert.equal(r.exitCode, 5)
  assert.equal(r.signal, null)
  assert.equal(r.timedOut, false)
  assert.equal(r.stdout, "it's bar baz /tmp\nfrom stdin\n")
  assert.equal(r.stderr, 'oops\n')
  assert.equal(r.metadata.outputTruncated, false)
  assert.equal(logs.filter(([s]) => s === 'stdout').map(([, t]) => t).join(''), r.stdout)
  assert.equal(logs.filter(([s]) => s === 'stderr').map(([, t]) => t).join(''), r.stderr)
  assert.deepEqual(kinds(ctx.requests()), ['execStream'])
  assert.equal(queryOf(ctx.requests()[0]).get('stream'), 'true')
})

test('executeStream: SSE noise (comments, event:, id:, retry:, data: prefixes, blank lines) is skipped', async () => {
  ctx.emu.addFault({ route: 'execStream', action: { kind: 'sseNoise' } })
  const r = await executeStream(ctx.client(), bashParams(sandbox, 'for i in 1 2 3; do echo "n$i"; sleep 0.02; done; echo e >&2'))
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'n1\nn2\nn3\n')
  assert.equal(r.stderr, 'e\n')
})

test('execute: SSE noise on the process stream is skipped too', async () => {
  ctx.emu.addFault({ route: 'connect', action: { kind: 'sseNoise' } })
  const r = await lib.execute(ctx.client(), bashParams(sandbox, 'echo via-process'))
  assert.equal(r.stdout, 'via-process\n')
})

test('executeStream: UTF-8 split across chunks', async () => {
  const r = await executeStream(ctx.client(), bashParams(sandbox, "printf '\\xe2\\x82'; sleep 0.1; printf '\\xac'"))
  assert.equal(r.stdout, '€')
})

test('executeStream: an API error is the ordinary API error', async () => {
  ctx.emu.addFault({ route: 'execStream', times: 1, action: { kind: 'status', status: 500 } })
  const error = await rejection(executeStream(ctx.client(), bashParams(sandbox, 'echo')))
  assert.ok(error instanceof lib.CreateosApiError)
  assert.equal(error.status, 500)
  assert.equal(error.message, 'CreateOS request failed (HTTP 500) during workspace command.')
})

async function createProcess(script) {
  const res = await fetch(`${ctx.url}/v1/sandboxes/${sandbox}/processes`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': ctx.apiKey },
    body: JSON.stringify({ cmd: '/bin/bash', args: ['-c', script] }),
  })
  assert.ok(res.ok, `create process: HTTP ${res.status}`)
  const body = await res.json()
  assert.equal(body.status, 'success')
  return body.data.process_id
}

test('followProcess: bytes per stream, onConnected, exit status', async () => {
  const pid = await createProcess('sleep 0.3; printf "a\\xffb"; echo err >&2; exit 9')
  const got = { stdout: [], stderr: [] }
  let connected = 0
  const exit = await followProcess(ctx.client(), sandbox, pid, AbortSignal.timeout(10000), (stream, bytes) => {
    assert.ok(Buffer.isBuffer(bytes))
    got[stream].push(bytes)
  }, () => { connected++ })
  assert.deepEqual(exit, { exitCode: 9, signal: null })
  assert.ok(connected >= 1)
  assert.deepEqual(Buffer.concat(got.stdout), Buffer.from([0x61, 0xff, 0x62]))
  assert.equal(Buffer.concat(got.stderr).toString(), 'err\n')
  const c = ctx.requests().filter((r) => kindOf(r) === 'connect')
  assert.equal(queryOf(c[0]).get('after'), '0')
})

test('followProcess: an abort rejects with the signal\'s reason and does not kill the process (the host owns it)', async () => {
  const pid = await createProcess('sleep 30')
  const controller = new AbortController()
  const reason = new Error('CreateOS managed process was stopped.')
  setTimeout(() => controller.abort(reason), 300)
  const t0 = performance.now()
  const error = await rejection(followProcess(ctx.client(), sandbox, pid, controller.signal, () => {}))
  assert.equal(error, reason)
  assert.ok(performance.now() - t0 < 1300)
  assert.equal(kinds(ctx.requests()).includes('deleteProcess'), false)
  // clean up our own process
  await fetch(`${ctx.url}/v1/sandboxes/${sandbox}/processes/${pid}?grace_ms=100`, {
    method: 'DELETE', headers: { 'x-api-key': ctx.apiKey },
  })
})

test('followProcess: an onData that throws ends the follow with that error', async () => {
  const pid = await createProcess('for i in 1 2 3 4 5; do echo $i; sleep 0.05; done')
  const boom = new Error('host callback failed')
  const error = await rejection(followProcess(ctx.client(), sandbox, pid, undefined, () => { throw boom }))
  assert.equal(error, boom)
  await sleep(400)
})

test('followProcess: reconnects and dedupes like execute', async () => {
  ctx.emu.addFault({ route: 'connect', times: 1, action: { kind: 'dropAfterFrames', frames: 2 } })
  ctx.emu.addFault({ route: 'connect', action: { kind: 'duplicateFrames' } })
  const pid = await createProcess('for i in 1 2 3 4 5 6; do echo $i; sleep 0.03; done')
  const chunks = []
  const exit = await followProcess(ctx.client(), sandbox, pid, undefined, (_, b) => chunks.push(b))
  assert.equal(exit.exitCode, 0)
  assert.equal(Buffer.concat(chunks).toString(), '1\n2\n3\n4\n5\n6\n')
})

test('followProcess: an already aborted signal sends nothing', async () => {
  const signal = AbortSignal.abort()
  const error = await rejection(followProcess(ctx.client(), sandbox, 'p1', signal, () => {}))
  assert.equal(error, signal.reason)
  assert.deepEqual(ctx.requests(), [])
})
