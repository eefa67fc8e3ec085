// The emulator's profiles and creation faults through the npm package: `profile: 'documented'`
// serves only what the API notes document (an unpaged process list without `pagination`, exit
// frames without `newest_seq`/`tree_exited`), `CREATEOS_EMULATOR_PROFILE` chooses the profile of
// a helper-started emulator that names none, `--profile` on the CLI, and `applyLate` applies a
// creation after the client left (the request log says when).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { startEmu } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { parseArgs } = require('../emulator/bin/createos-emulator.js')

async function api(ctx, method, path, body, signal) {
  const res = await fetch(`${ctx.url}/v1${path}`, {
    method,
    headers: { 'x-api-key': ctx.apiKey, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  })
  const text = await res.text()
  let json = null
  try { json = JSON.parse(text) } catch {}
  return { status: res.status, text, json }
}

async function until(what, cond) {
  const end = Date.now() + 20_000
  while (!(await cond())) {
    assert.ok(Date.now() < end, `timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 20))
  }
}

async function withEmu(options, body) {
  const ctx = await startEmu(options)
  try { await body(ctx) } finally { await ctx.close(import.meta.url) }
}

async function runToEnd(ctx, sb, cmd, args) {
  const created = await api(ctx, 'POST', `/sandboxes/${sb}/processes`, { cmd, args })
  assert.equal(created.status, 201, created.text)
  const id = created.json.data.process_id
  const waited = await api(ctx, 'GET', `/sandboxes/${sb}/processes/${id}/wait?scope=tree&timeout_ms=20000`)
  assert.equal(waited.status, 200, waited.text)
  return id
}

const listIds = async (ctx, sb, query = '') => {
  const r = await api(ctx, 'GET', `/sandboxes/${sb}/processes${query}`)
  assert.equal(r.status, 200, r.text)
  return r.json.data
}

test("profile 'documented': the whole list unpaged, exit frames without undocumented fields", async () => {
  await withEmu({ profile: 'documented' }, async (ctx) => {
    assert.equal(ctx.emu.profile, 'documented')
    const sb = ctx.sandbox()
    const ids = []
    for (let i = 0; i < 3; i++) ids.push(await runToEnd(ctx, sb, 'sh', ['-c', 'echo hi']))
    for (const q of ['', '?limit=1', '?limit=1&offset=1', '?offset=2&limit=2', '?offset=9']) {
      const data = await listIds(ctx, sb, q)
      assert.deepEqual(Object.keys(data), ['processes'], q)
      assert.deepEqual(data.processes.map((p) => p.process_id), ids, q)
    }
    const stream = await api(ctx, 'GET', `/sandboxes/${sb}/processes/${ids[0]}/connect`)
    const frames = stream.text.trim().split('\n').map((l) => JSON.parse(l))
    assert.deepEqual(frames.at(-1), { type: 'exit', exit_code: 0 })
  })
})

test("the default profile is 'full' and keeps pagination and newest_seq", async () => {
  await withEmu({ profile: 'full' }, async (ctx) => {
    assert.equal(ctx.emu.profile, 'full')
    const sb = ctx.sandbox()
    const id = await runToEnd(ctx, sb, 'true', [])
    await runToEnd(ctx, sb, 'true', [])
    const data = await listIds(ctx, sb, '?limit=1&offset=1')
    assert.equal(data.processes.length, 1)
    assert.equal(data.pagination.total, 2)
    const stream = await api(ctx, 'GET', `/sandboxes/${sb}/processes/${id}/connect`)
    const exit = JSON.parse(stream.text.trim().split('\n').at(-1))
    assert.equal(exit.newest_seq, 0)
    assert.equal(exit.tree_exited, true)
  })
})

test('CREATEOS_EMULATOR_PROFILE chooses the profile of a helper-started emulator that names none', async () => {
  const saved = process.env.CREATEOS_EMULATOR_PROFILE
  try {
    process.env.CREATEOS_EMULATOR_PROFILE = 'documented'
    await withEmu({}, async (ctx) => assert.equal(ctx.emu.profile, 'documented'))
    await withEmu({ profile: 'full' }, async (ctx) => assert.equal(ctx.emu.profile, 'full', 'asked for explicitly'))
    process.env.CREATEOS_EMULATOR_PROFILE = 'documentd'
    await assert.rejects(startEmu({}), /names no profile/)
    delete process.env.CREATEOS_EMULATOR_PROFILE
    await withEmu({}, async (ctx) => assert.equal(ctx.emu.profile, 'full', 'the default'))
  } finally {
    if (saved === undefined) delete process.env.CREATEOS_EMULATOR_PROFILE
    else process.env.CREATEOS_EMULATOR_PROFILE = saved
  }
})

test('the CLI takes --profile', () => {
  assert.deepEqual(parseArgs(['--profile', 'documented']), { profile: 'documented' })
  assert.deepEqual(parseArgs(['--profile=full']), { profile: 'full' })
  assert.throws(() => parseArgs(['--profile', 'minimal']), /--profile must be full or documented/)
})

test('applyLate afterList: cut, then applied right after the next list of its sandbox was sent', async () => {
  await withEmu({ profile: 'documented' }, async (ctx) => {
    const sb = ctx.sandbox()
    ctx.emu.addFault({ route: 'createProcess', times: 1, action: { kind: 'applyLate', afterList: true } })
    await assert.rejects(api(ctx, 'POST', `/sandboxes/${sb}/processes`, { cmd: 'sleep', args: ['30'] }))
    assert.deepEqual((await listIds(ctx, sb)).processes, [], 'the list answer does not have it')
    await until('the late creation', async () => (await listIds(ctx, sb)).processes.length === 1)
    const log = ctx.emu.requests()
    const create = log.find((r) => r.route === 'createProcess')
    const list = log.find((r) => r.route === 'listProcesses')
    assert.equal(create.status, 0)
    assert.ok(create.appliedMs >= list.receivedMs, JSON.stringify({ create, list }))
    assert.ok(log.filter((r) => r.route !== 'createProcess').every((r) => r.appliedMs === null))
    const [proc] = (await listIds(ctx, sb)).processes
    const del = await api(ctx, 'DELETE', `/sandboxes/${sb}/processes/${proc.process_id}?grace_ms=0`)
    assert.equal(del.json.data.tree_exited, true, del.text)
  })
})

test('applyLate ms + hold: the client that gave up still gets its creation applied later', async () => {
  await withEmu({ profile: 'documented' }, async (ctx) => {
    const sb = ctx.sandbox()
    ctx.emu.addFault({ route: 'createProcess', times: 1, action: { kind: 'applyLate', ms: 1500, hold: true } })
    await assert.rejects(api(ctx, 'POST', `/sandboxes/${sb}/processes`, { cmd: 'sleep', args: ['30'] },
      AbortSignal.timeout(300)))
    assert.deepEqual((await listIds(ctx, sb)).processes, [])
    await until('the late creation', async () => (await listIds(ctx, sb)).processes.length === 1)
    const create = ctx.emu.requests().find((r) => r.route === 'createProcess')
    assert.ok(create.appliedMs - create.receivedMs >= 1500, JSON.stringify(create))
  })
})
