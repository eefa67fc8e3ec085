// The emulator's profiles and creation faults through the npm package: `profile: 'documented'`
// serves only what the API notes document (an unpaged process list without `pagination`, exit
// frames without `newest_seq`/`tree_exited`), `CREATEOS_EMULATOR_PROFILE` chooses the profile of
// a helper-started emulator that names none, `--profile` on the CLI, and `applyLate` applies a
// creation after the client left (the request log says when). `terminationScope` ('group' under
// 'documented', 'tree' under 'full', or as asked; CLI `--termination`): whom a process DELETE
// signals, while `tree_exited` counts every descendant either way.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { emulatorLib, isAlive, sleep, sleepers, startEmu, uniqueSleep } from './helpers.mjs'

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

async function oneSleeper(arg) {
  const end = Date.now() + 10_000
  for (;;) {
    const found = sleepers(arg)
    if (found.length === 1) return found[0]
    assert.ok(Date.now() < end, `sleep ${arg} did not start: ${JSON.stringify(found)}`)
    await sleep(20)
  }
}

const pgidOf = (pid) => {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[2])
}

// A leader whose group holds a child (`sleep member &`) and a `setsid sleep` child outside the
// group; a DELETE with a 200 ms grace; what the server said and which processes live after it.
async function deleteWithAnEscapee(ctx) {
  const member = uniqueSleep(321)
  const escapee = uniqueSleep(322)
  const sb = ctx.sandbox()
  const created = await api(ctx, 'POST', `/sandboxes/${sb}/processes`,
    { cmd: 'bash', args: ['-c', `sleep ${member} & setsid sleep ${escapee} & wait`] })
  assert.equal(created.status, 201, created.text)
  const { process_id: id, pid: leader } = created.json.data
  const pm = await oneSleeper(member)
  const pe = await oneSleeper(escapee)
  try {
    assert.equal(pgidOf(pm), leader, 'the member is in the leader\'s group')
    assert.notEqual(pgidOf(pe), leader, 'the escapee left it')
    const del = await api(ctx, 'DELETE', `/sandboxes/${sb}/processes/${id}?grace_ms=200`)
    assert.equal(del.status, 200, del.text)
    const after = { member: isAlive(pm), escapee: isAlive(pe) }
    const wait = await api(ctx, 'GET', `/sandboxes/${sb}/processes/${id}/wait?scope=tree&timeout_ms=300`)
    const record = await api(ctx, 'GET', `/sandboxes/${sb}/processes/${id}`)
    return { treeExited: del.json.data.tree_exited, after, wait: wait.status, recordTreeExited: record.json.data.tree_exited, pe, sb, id }
  } finally {
    // The survivor, by pid (whatever an assertion said).
    for (const pid of [pm, pe]) { try { process.kill(pid, 'SIGKILL') } catch {} }
  }
}

test("terminationScope: 'group' under 'documented', 'tree' under 'full', or as asked", async () => {
  await withEmu({ profile: 'documented' }, async (ctx) => assert.equal(ctx.emu.terminationScope, 'group'))
  await withEmu({ profile: 'full' }, async (ctx) => assert.equal(ctx.emu.terminationScope, 'tree'))
  await withEmu({ profile: 'documented', terminationScope: 'tree' }, async (ctx) => assert.equal(ctx.emu.terminationScope, 'tree'))
  await withEmu({ profile: 'full', terminationScope: 'group' }, async (ctx) => assert.equal(ctx.emu.terminationScope, 'group'))
  await withEmu({ profile: 'full', terminationScope: null }, async (ctx) => assert.equal(ctx.emu.terminationScope, 'tree'))
  await assert.rejects(emulatorLib.startEmulator({ terminationScope: 'pgid' }), /Invalid emulator options/)
})

test("terminationScope 'group': the DELETE ends the leader's group, a setsid child lives on and keeps the tree", async () => {
  await withEmu({ profile: 'documented' }, async (ctx) => {
    const r = await deleteWithAnEscapee(ctx)
    assert.deepEqual(r.after, { member: false, escapee: true })
    assert.equal(r.treeExited, false)
    assert.equal(r.wait, 408, 'wait?scope=tree while the escapee lives')
    assert.equal(r.recordTreeExited, false)
    // Ended by pid in deleteWithAnEscapee: now the tree is seen exited.
    const wait = await api(ctx, 'GET', `/sandboxes/${r.sb}/processes/${r.id}/wait?scope=tree&timeout_ms=10000`)
    assert.equal(wait.status, 200, wait.text)
    assert.equal(wait.json.data.tree_exited, true)
  })
})

test("terminationScope 'tree': the same DELETE ends the setsid child too", async () => {
  await withEmu({ profile: 'documented', terminationScope: 'tree' }, async (ctx) => {
    const r = await deleteWithAnEscapee(ctx)
    assert.deepEqual(r.after, { member: false, escapee: false })
    assert.equal(r.treeExited, true)
    assert.equal(r.wait, 200)
    assert.equal(r.recordTreeExited, true)
  })
})

test('the CLI takes --termination', () => {
  assert.deepEqual(parseArgs(['--termination', 'group']), { terminationScope: 'group' })
  assert.deepEqual(parseArgs(['--profile=documented', '--termination=tree']), { profile: 'documented', terminationScope: 'tree' })
  assert.throws(() => parseArgs(['--termination', 'pgid']), /--termination must be group or tree/)
})
