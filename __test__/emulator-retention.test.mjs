// The emulator's `retainedBytes` (the output kept for EXITED processes, all sandboxes
// together), through the npm package and the addon's execute(): the processes that exited first
// lose their journal and their processOutput capture, the newest keep theirs, a running
// process's output is never dropped, and an evicted process fails closed (a replay answers
// output_offset_expired, processOutput throws) instead of pretending it wrote nothing.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { lib, bashParams, useEmulator } from './helpers.mjs'

const { execute } = lib
const require = createRequire(import.meta.url)
const OUT = 300 * 1024
// Each exited process keeps its 300 KiB in the journal (1 MiB per process, so a live client
// never falls behind it) plus its 300 KiB capture: 600 KiB. Two fit in 1.5 MiB; a third exit
// drops the oldest.
const RETAINED = 1536 * 1024
let ctx
useEmulator(import.meta.url, (c) => { ctx = c }, { retainedBytes: RETAINED })

async function api(path) {
  const res = await fetch(`${ctx.url}/v1${path}`, { headers: { 'x-api-key': ctx.apiKey } })
  return { status: res.status, body: await res.text() }
}

async function record(sb, id) {
  const { status, body } = await api(`/sandboxes/${sb}/processes/${id}`)
  assert.equal(status, 200, body)
  return JSON.parse(body).data
}

async function assertEvicted(sb, id) {
  assert.throws(() => ctx.emu.processOutput(sb, id),
    { message: `output of process ${id} is no longer retained (retainedBytes)` })
  const rec = await record(sb, id)
  assert.ok(rec.output.newest_seq >= 1, JSON.stringify(rec.output))
  assert.deepEqual(rec.output, { oldest_seq: rec.output.newest_seq + 1, newest_seq: rec.output.newest_seq, bytes: 0 })
  const replay = await api(`/sandboxes/${sb}/processes/${id}/connect?after=0`)
  assert.equal(replay.status, 410, replay.body)
  assert.deepEqual(JSON.parse(replay.body).data,
    { error: 'output_offset_expired', oldest_available_seq: rec.output.newest_seq + 1 })
}

function assertKept(sb, id, char) {
  const out = ctx.emu.processOutput(sb, id)
  assert.equal(out.stdout.toString('latin1'), char.repeat(OUT))
  assert.equal(out.stderr.length, 0)
}

const writes = (char) => `head -c ${OUT} /dev/zero | tr '\\0' '${char}'`

test('retainedBytes drops the output of the oldest exited processes, never a running one', async () => {
  const a = ctx.sandbox()
  const b = ctx.sandbox()
  const dir = mkdtempSync(join(tmpdir(), 'emu-retention-'))
  const go = join(dir, 'go')
  let running
  try {
    // Writes its output, then waits (at most 30 s) for the test to let it finish.
    running = execute(ctx.client({ timeoutMs: 60_000 }),
      bashParams(a, `${writes('r')}; for i in $(seq 600); do [ -e '${go}' ] && exit 0; sleep 0.05; done; exit 3`))
    let rid
    for (let i = 0; i < 400 && rid === undefined; i++) {
      const { body } = await api(`/sandboxes/${a}/processes`)
      const p = JSON.parse(body).data.processes.find((x) => x.state === 'running')
      if (p) {
        const out = ctx.emu.processOutput(a, p.process_id)
        if (out && out.stdout.length === OUT) rid = p.process_id
      }
      if (rid === undefined) await new Promise((resolve) => setTimeout(resolve, 25))
    }
    assert.ok(rid, 'the running process wrote its output')

    const done = []
    for (const [sb, char] of [[a, '1'], [b, '2'], [b, '3'], [a, '4']]) {
      const r = await execute(ctx.client(), bashParams(sb, writes(char)))
      assert.equal(r.exitCode, 0)
      assert.equal(r.stdout, char.repeat(OUT))
      done.push([sb, r.metadata.processId, char])
    }
    // Four exits of 600 KiB in a 1.5 MiB budget: the first two lost their output, across sandboxes.
    await assertEvicted(done[0][0], done[0][1])
    await assertEvicted(done[1][0], done[1][1])
    assertKept(done[2][0], done[2][1], '3')
    assertKept(done[3][0], done[3][1], '4')
    // The running process started first and kept everything.
    const rec = await record(a, rid)
    assert.equal(rec.state, 'running')
    assert.equal(rec.output.oldest_seq, 1)
    assertKept(a, rid, 'r')

    // Once it exits it counts too: the oldest exit still holding output (#3) goes.
    writeFileSync(go, '')
    const r = await running
    running = undefined
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'r'.repeat(OUT))
    assert.equal(r.metadata.processId, rid)
    await assertEvicted(done[2][0], done[2][1])
    assertKept(done[3][0], done[3][1], '4')
    assertKept(a, rid, 'r')
  } finally {
    // End the waiting process even when an assertion failed.
    writeFileSync(go, '')
    await running?.catch(() => {})
    rmSync(dir, { recursive: true, force: true })
  }
  assert.deepEqual(ctx.emu.livePids(), [])
})

test('createos-emulator --retained-bytes N|off', () => {
  const { parseArgs } = require('../emulator/bin/createos-emulator.js')
  assert.deepEqual(parseArgs(['--retained-bytes', '1048576']), { retainedBytes: 1048576 })
  assert.deepEqual(parseArgs(['--retained-bytes=off']), { retainedBytes: null })
  assert.deepEqual(parseArgs(['--retained-bytes', '0']), { retainedBytes: null })
  assert.throws(() => parseArgs(['--retained-bytes', '-5']), /--retained-bytes needs a non-negative integer/)
  assert.throws(() => parseArgs(['--retained-bytes']), /--retained-bytes needs a value/)
})
