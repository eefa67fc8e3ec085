// The output stream of a managed process (issue 2 §2/§3): reconnect with
// resume and dedupe, and fail closed on every kind of corrupt stream. Each
// failing case must still terminate the process (DELETE) and leave nothing alive.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { fileURLToPath } from 'node:url'
import {
  lib, startEmu, kinds, kindOf, queryOf, bashParams, rejection,
  useEmulator, assertNoneAlive, sessionMode
} from './helpers.mjs'

const { execute } = lib
let ctx
let sandbox
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() })

// In session mode each test runs on a sandbox of its own (ctx.sandboxFor): its command starts a
// new supervisor, whose one stream is the one the test's faults hit (a warm supervisor's stream
// is already open and would never see them).

// Ten lines, each its own frame (the pauses make separate writes).
const TEN_LINES = 'for i in 1 2 3 4 5 6 7 8 9 10; do echo "line $i"; sleep 0.03; done'
const TEN_EXPECTED = Array.from({ length: 10 }, (_, i) => `line ${i + 1}\n`).join('')

function connects() {
  return ctx.requests().filter((r) => kindOf(r) === 'connect')
}

test('a dropped stream is resumed from the last accepted seq', async (t) => {
  const sb = ctx.sandboxFor(t, sandbox)
  ctx.emu.addFault({ route: 'connect', times: 1, action: { kind: 'dropAfterFrames', frames: 3 } })
  const r = await execute(ctx.client(), bashParams(sb, TEN_LINES))
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, TEN_EXPECTED)
  const c = connects()
  assert.ok(c.length >= 2, kinds(ctx.requests()).join(','))
  assert.equal(queryOf(c[0]).get('after'), '0')
  assert.equal(queryOf(c[1]).get('after'), '3')
  assert.equal(kinds(ctx.requests()).includes('deleteProcess'), false)
})

test('duplicated frames are skipped', async (t) => {
  const sb = ctx.sandboxFor(t, sandbox)
  ctx.emu.addFault({ route: 'connect', action: { kind: 'duplicateFrames' } })
  const r = await execute(ctx.client(), bashParams(sb, TEN_LINES))
  assert.equal(r.stdout, TEN_EXPECTED)
  assert.ok(connects().length >= 1, 'the faulted stream was read')
})

test('drops and duplicates together, three times: still exact', async (t) => {
  const sb = ctx.sandboxFor(t, sandbox)
  ctx.emu.addFault({ route: 'connect', times: 3, action: { kind: 'dropAfterFrames', frames: 2 } })
  ctx.emu.addFault({ route: 'connect', action: { kind: 'duplicateFrames' } })
  const r = await execute(ctx.client(), bashParams(sb, TEN_LINES))
  assert.equal(r.stdout, TEN_EXPECTED)
  const after = connects().map((x) => Number(queryOf(x).get('after')))
  assert.deepEqual(after.slice(0, 4), [0, 2, 4, 6])
})

test('after the reconnects are spent, the exit is recovered through wait?scope=tree', async (t) => {
  const sb = ctx.sandboxFor(t, sandbox)
  // Four dropped streams (more than the 3 reconnects), the last ones after all
  // output was delivered: the exit comes from /wait when newest_seq == cursor.
  ctx.emu.addFault({ route: 'connect', times: 6, action: { kind: 'dropAfterFrames', frames: 0 } })
  if (sessionMode()) {
    // The supervisor outlives the command, so no exit (and no wait) tells the command's
    // status: it is only in the stream's end marker. With the reconnects spent the session
    // mode fails closed (docs/session.md, "Every abnormal end goes to the provider"): the
    // supervisor's tree is ended and proven gone, and a later command works.
    const error = await rejection(execute(ctx.client(), bashParams(sb, 'echo only; exit 4')))
    assert.equal(error.message, 'CreateOS process output connection failed.')
    assert.ok(!lib.isCreateosCleanupError(error), String(error && error.stack))
    const k = kinds(ctx.requests())
    assert.ok(connects().length >= 4, k.join(','))
    assert.ok(k.includes('deleteProcess'), k.join(','))
    await assertNoneAlive(ctx.emu)
    ctx.reset()
    const r = await execute(ctx.client(), bashParams(sb, 'echo only; exit 4'))
    assert.equal(r.exitCode, 4)
    assert.equal(r.stdout, 'only\n')
    return
  }
  const r = await execute(ctx.client(), bashParams(sb, 'echo only; exit 4'))
  const k = kinds(ctx.requests())
  assert.ok(k.includes('wait'), k.join(','))
  const wait = ctx.requests().find((x) => kindOf(x) === 'wait')
  assert.equal(queryOf(wait).get('scope'), 'tree')
  assert.equal(r.exitCode, 4)
  assert.equal(r.stdout, 'only\n')
})

// Fail closed: [fault action, expected message]
const FAIL_CLOSED = [
  [{ kind: 'gapAfterFrames', frames: 2 }, 'CreateOS process output has a sequence gap.'],
  [{ kind: 'badSeq' }, 'CreateOS process sequence is invalid.'],
  [{ kind: 'invalidBase64' }, 'CreateOS process output is invalid.'],
  [{ kind: 'errorFrame', error: 'output_offset_expired' }, 'CreateOS process output was evicted before it could be read.'],
  [{ kind: 'errorFrame', error: 'something else secret-body-token' }, 'CreateOS process stream reported an error.'],
  [{ kind: 'oversizeFrame' }, 'CreateOS process frame is too large.'],
  [{ kind: 'malformedLine', afterFrames: 1 }, 'CreateOS returned an invalid process frame.'],
  [{ kind: 'status', status: 410 }, 'CreateOS process output was evicted before it could be read.'],
]

for (const [action, message] of FAIL_CLOSED) {
  test(`fails closed on ${action.kind}${action.error ? ` (${action.error.split(' ')[0]})` : ''}${action.status ? ` ${action.status}` : ''}`, async (t) => {
    const sb = ctx.sandboxFor(t, sandbox)
    ctx.emu.addFault({ route: 'connect', action })
    const error = await rejection(execute(ctx.client(), bashParams(sb, `${TEN_LINES}; sleep 30`)))
    assert.equal(error.message, message)
    assert.ok(!lib.isCreateosCleanupError(error), 'the process was terminated, so this is no cleanup error')
    assert.ok(!error.message.includes('secret-body-token'))
    const del = ctx.requests().filter((x) => kindOf(x) === 'deleteProcess')
    assert.ok(del.length >= 1, kinds(ctx.requests()).join(','))
    assert.equal(queryOf(del[0]).get('grace_ms'), '1000')
    await assertNoneAlive(ctx.emu)
  })
}

test('a journal evicted while disconnected is data loss, not silence', async () => {
  // A tiny journal and a dropped stream: by the reconnect the output is gone.
  const small = await startEmu({ journalBytes: 4096 })
  try {
    const sb = small.sandbox()
    small.emu.addFault({ route: 'connect', times: 1, action: { kind: 'dropAfterFrames', frames: 1 } })
    small.emu.addFault({ route: 'connect', skip: 1, times: 1, action: { kind: 'delay', ms: 600 } })
    const error = await rejection(execute(small.client(),
      bashParams(sb, 'echo first; sleep 0.1; for i in $(seq 1 200); do head -c 1000 /dev/zero | tr "\\0" q; echo; done; sleep 1')))
    assert.equal(error.message, 'CreateOS process output was evicted before it could be read.')
  } finally {
    await small.close(fileURLToPath(import.meta.url))
  }
})
