// Each tree's private view where the emulator runs as root, through execute(): `cwd:
// '/workspace'` runs in the sandbox's own workspace (a file written there lands in that
// sandbox, another sandbox does not see it), and a command that writes its own pid into a root
// `cgroup.procs` does not leave its tree: execute never says `treeExited: true` while it lives,
// and `leftoverProcesses: 'terminate'` ends it, proven gone. Whether a process lives is read
// from /proc by its command line, not from the emulator.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync, existsSync, rmSync } from 'node:fs'
import { lib, bashParams, useEmulator, uniqueSleep, sleepers } from './helpers.mjs'

const { execute } = lib
let ctx
// Whole trees: a process DELETE here must reach what left the process group
// (terminationScope 'tree'), whatever profile CREATEOS_EMULATOR_PROFILE names.
useEmulator(import.meta.url, (c) => { ctx = c }, { terminationScope: 'tree' })

const inCi = !!process.env.CI && process.env.CI !== 'false' && process.env.CI !== '0'
const isRoot = typeof process.getuid === 'function' && process.getuid() === 0
const skip = isRoot ? false : (inCi ? false : 'needs root (CI runs as root)')



async function until(what, cond, ms = 10_000) {
  const end = Date.now() + ms
  while (!cond()) {
    if (Date.now() > end) return false
    await new Promise((r) => setTimeout(r, 20))
  }
  return true
}

async function getFile(sandbox, path) {
  const res = await fetch(`${ctx.url}/v1/sandboxes/${sandbox}/files?path=${encodeURIComponent(path)}`,
    { headers: { 'x-api-key': ctx.apiKey } })
  return { status: res.status, body: await res.text() }
}

test("cwd: '/workspace' is the sandbox's own workspace", { skip }, async () => {
  assert.equal(ctx.emu.workspaceMounted, true, 'as root every command sees its workspace on /workspace')
  const a = ctx.sandbox()
  const b = ctx.sandbox()
  const ra = await execute(ctx.client(), bashParams(a, 'echo from-a > made-in-a && mkdir -p sub && pwd && ls', { cwd: '/workspace' }))
  assert.equal(ra.exitCode, 0, ra.stderr)
  assert.equal(ra.stdout, '/workspace\nmade-in-a\nsub\n')
  const sub = await execute(ctx.client(), bashParams(a, 'pwd; cat ../made-in-a', { cwd: '/workspace/sub' }))
  assert.equal(sub.stdout, '/workspace/sub\nfrom-a\n', sub.stderr)
  assert.deepEqual(await getFile(a, '/workspace/made-in-a'), { status: 200, body: 'from-a\n' }, 'it landed in sandbox a')
  const rb = await execute(ctx.client(), bashParams(b, 'ls -A; echo end', { cwd: '/workspace' }))
  assert.equal(rb.exitCode, 0, rb.stderr)
  assert.equal(rb.stdout, 'end\n', "sandbox b does not see a's workspace")
  assert.equal((await getFile(b, '/workspace/made-in-a')).status, 404)
  assert.equal(existsSync('/workspace/made-in-a'), false, "nothing was written to the host's /workspace")
})

// Through the tree's own view, and through the host's hierarchy (past the view, via the
// emulator's root directory: the membership check catches that one).
for (const [name, files] of [
  ['its own view', '/sys/fs/cgroup/pids/cgroup.procs /sys/fs/cgroup/cgroup.procs'],
  ["the host's hierarchy", '/proc/$EMU/root/sys/fs/cgroup/pids/cgroup.procs /proc/$EMU/root/sys/fs/cgroup/cgroup.procs'],
]) {
  test(`a command that writes itself into a root cgroup.procs (${name}) stays in its tree`, { skip }, async () => {
    assert.notEqual(ctx.emu.tracking, 'marker', 'as root the emulator tracks trees by cgroup')
    const sandbox = ctx.sandbox()
    const arg = uniqueSleep(300)
    const arg2 = uniqueSleep(301)
    const said = `/tmp/.createos-escape-${arg}`
    const script = `EMU=$PPID setsid bash -c 'r=none; for f in ${files}; do [ -e "$f" ] || continue; ` +
      `if echo $BASHPID > "$f"; then r=moved; else r=refused; fi; break; done 2>/dev/null; ` +
      `echo $r > ${said}; exec sleep ${arg}' </dev/null >/dev/null 2>&1 & echo started`
    try {
      const r = await execute(ctx.client(), bashParams(sandbox, script))
      assert.equal(r.stdout, 'started\n', r.stderr)
      // The escape is tried before `exec sleep`; its outcome is written just before that.
      const outcome = () => { try { return readFileSync(said, 'utf8').trim() } catch { return '' } }
      assert.ok(await until('the sleeper', () => sleepers(arg).length === 1 && outcome() !== ''), 'the sleeper started')
      const [pid] = sleepers(arg)
      if (name !== 'its own view') assert.equal(outcome(), 'moved', 'the escape was made')
      assert.equal(r.metadata.treeExited, false, 'not exited while the escaper lives')
      assert.ok(ctx.emu.livePids().includes(pid), 'the emulator lists it')

      // The same command with 'terminate': the leftover is ended and proven gone.
      const r2 = await execute(ctx.client({ leftoverProcesses: 'terminate' }),
        bashParams(sandbox, script.replaceAll(arg, arg2)))
      assert.equal(r2.stdout, 'started\n', r2.stderr)
      assert.deepEqual(sleepers(arg2), [], 'the DELETE that proved the tree gone left nothing alive')
    } finally {
      rmSync(said, { force: true })
      rmSync(said.replaceAll(arg, arg2), { force: true })
    }
    // The first command's leftover is ours to end: a sandbox DELETE kills its trees.
    const del = await fetch(`${ctx.url}/v1/sandboxes/${sandbox}`, { method: 'DELETE', headers: { 'x-api-key': ctx.apiKey } })
    assert.equal(del.status, 200)
    assert.ok(await until('nothing alive', () => sleepers(arg).length === 0 && ctx.emu.livePids().length === 0),
      `alive: ${sleepers(arg)} / ${ctx.emu.livePids()}`)
  })
}
