// Real network partitions: each case runs in a private network namespace (`unshare -n` as root,
// `unshare -rn` where user namespaces are allowed), where __test__/partition-child.mjs brings the
// loopback up, starts the emulator on it and has nftables drop every packet to and from the
// emulator's port in both directions — a blackhole, with no RST and no FIN, as a dead gateway,
// a NAT timeout or a partition gives — or has tc limit the link to 1 Mbit/s. The child prints
// one JSON line; this file asserts on it: exact output or failing closed, the verdict within
// the cleanup deadline (+ 1 s), nothing left alive. It prints every verdict time.
//
// Where namespaces are not allowed the cases skip, saying why; with CI set they fail instead.
// The cases run at once (each in a namespace of its own); scripts/test-js.mjs runs this file
// alone, after the others, so the deadlines are measured on a quiet machine.
import { describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { markOf, isAlive, recordForFinalCheck } from './helpers.mjs'
import { toolPath, pathWithTools } from '../scripts/provision.mjs'

const FILE = fileURLToPath(import.meta.url)
const CHILD = join(dirname(FILE), 'partition-child.mjs')
const IN_CI = Boolean(process.env.CI)
const MiB = 1024 * 1024
/** The routes a cleanup or a creation recovery uses. */
const CLEANUP_ROUTES = ['deleteProcess', 'wait', 'listProcesses', 'getProcess', 'exec']
/** What the verdict may take past the cleanup deadline. */
const VERDICT_SLACK_MS = 1000

/** How to enter a private network namespace here, or why not: { argv } or { reason }. */
function namespaceSupport() {
  if (process.platform !== 'linux') return { reason: 'network namespaces are Linux only' }
  const missing = ['unshare', 'ip', 'nft', 'tc'].filter((b) => !toolPath(b))
  if (missing.length) return { reason: `${missing.join(', ')} not installed (\`npm run provision\` installs them)` }
  const unshare = toolPath('unshare')
  const root = process.getuid() === 0
  const tries = root ? [['-n'], ['-rn']] : [['-rn']]
  const failures = []
  for (const flags of tries) {
    const probe = spawnSync(unshare, [...flags, 'sh', '-c',
      'ip link set lo up && nft add table inet createos_probe && tc qdisc add dev lo root tbf rate 1mbit burst 16kb latency 200ms'], {
      env: { ...process.env, PATH: pathWithTools() }, encoding: 'utf8', timeout: 10_000,
    })
    if (probe.status === 0) return { argv: [unshare, ...flags] }
    failures.push(`unshare ${flags.join(' ')}: ${(probe.stderr || probe.error?.message || `exit ${probe.status}`).trim().split('\n')[0]}`)
  }
  return { reason: `no private network namespace with nftables and tc here (${failures.join('; ')})` }
}

const support = namespaceSupport()

/** Runs one case in its own namespace; resolves its report (and ends its processes by pid). */
function runCase(name, boundMs) {
  return new Promise((resolve, reject) => {
    const [cmd, ...flags] = support.argv
    const child = spawn(cmd, [...flags, process.execPath, '--expose-gc', CHILD, name], {
      env: { ...process.env, PATH: pathWithTools() },
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true, // a process group of its own: the case's client process is in it too
    })
    const killGroup = () => { try { process.kill(-child.pid, 'SIGKILL') } catch {} }
    const pids = new Set()
    const instances = new Set()
    let report = null
    let buffered = ''
    let err = ''
    const startedAt = Date.now()
    child.stdout.on('data', (chunk) => {
      buffered += chunk
      let nl
      while ((nl = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, nl)
        buffered = buffered.slice(nl + 1)
        let msg
        try { msg = JSON.parse(line) } catch { err += `${line}\n`; continue }
        if (msg && typeof msg.pid === 'number' && Object.keys(msg).length === 1) {
          pids.add(msg.pid)
          const mark = markOf(msg.pid)
          if (mark) instances.add(mark.split(':')[0])
        } else report = msg
      }
    })
    child.stderr.on('data', (chunk) => { err += chunk })
    const timer = setTimeout(killGroup, boundMs)
    child.on('error', (e) => { clearTimeout(timer); reject(e) })
    child.on('exit', (code, signal) => {
      clearTimeout(timer)
      killGroup()
      // The child ends what its emulator started; anything still alive here is ended by pid.
      const survivors = [...pids].filter((pid) => markOf(pid) !== null)
      for (const pid of survivors) {
        try { process.kill(pid, 'SIGKILL') } catch {}
      }
      recordForFinalCheck(`${FILE}-${name}`, { startedAt, pids: [...pids], instances: [...instances] })
      if (!report) {
        reject(new Error(`case ${name}: no report (exit ${code ?? signal}): ${err.slice(0, 3000)}`))
        return
      }
      resolve({ ...report, exitCode: code, childStderr: err.slice(0, 3000), survivors, pids: [...pids] })
    })
  })
}

const eventAt = (r, what) => r.events.find((e) => e.what === what)?.atMs
const verdictAfter = (r, from) => r.outcome.settledMs - from

function assertClean(r) {
  assert.equal(r.crashed, undefined, `the case crashed: ${r.crashed}\n${r.childStderr}`)
  assert.deepEqual(r.liveAfterClose, [], 'the emulator left processes alive after close()')
  assert.deepEqual(r.stragglers, [], 'processes the emulator started outlived its close()')
  assert.deepEqual(r.survivors, [], 'processes outlived the case')
  assert.deepEqual(r.pids.filter(isAlive), [], 'a process the case started is alive')
}

/** Fail closed: a result or an ordinary error only when nothing of the command is alive. */
function assertFailsClosed(r) {
  if (r.outcome.liveAtVerdict.length > 0) {
    assert.ok(r.outcome.error?.cleanup,
      `processes ${r.outcome.liveAtVerdict} were alive at the verdict, which was not a CreateosCleanupError: ${JSON.stringify(r.outcome).slice(0, 500)}`)
  }
}

/** The blackhole held: none of the cleanup's requests reached the emulator before the verdict. */
function assertNothingGotThrough(r) {
  const through = r.outcome.requestsAtVerdict.filter((q) => CLEANUP_ROUTES.includes(q.route))
  assert.deepEqual(through, [], 'requests reached the emulator through the blackhole')
}

/** The creation's request reached the emulator before the blackhole (its answer was pending). */
function assertCreationPending(r) {
  const create = r.requests.find((q) => q.route === 'createProcess')
  assert.ok(create, 'the emulator saw no process creation')
  assert.ok(create.atMs + r.emuReadyMs < eventAt(r, 'blackhole'),
    `the creation arrived (${create.atMs} ms + ${r.emuReadyMs} ms) after the blackhole (${eventAt(r, 'blackhole')} ms)`)
}

function print(t, r, line) {
  t.diagnostic(`partition ${r.case}: ${line}`)
}

const cases = {
  async 'a blackhole mid-stream that heals: exact output'(t) {
    const r = await runCase('stream-heals', 60_000)
    assertClean(r)
    print(t, r, `result after ${r.outcome.durationMs} ms (blackhole at ${eventAt(r, 'blackhole')} ms, healed at ${eventAt(r, 'heal')} ms)`)
    assert.ok(r.sawOutputFirst, 'output had begun before the blackhole')
    assert.equal(r.outcome.error, undefined, JSON.stringify(r.outcome.error))
    assert.equal(r.outcome.value.exitCode, 0)
    assert.equal(r.outcome.value.stdout, r.expected)
    assert.equal(r.logged, r.expected, 'log saw every line once, in order')
    // The rules held: nothing reached `log` while every packet was dropped (after a second
    // for what was already in the socket's buffer).
    const [from, to] = [eventAt(r, 'blackhole') + 1000, eventAt(r, 'heal')]
    assert.deepEqual(r.chunkMs.filter((ms) => ms > from && ms < to), [], 'output arrived through the blackhole')
    assert.deepEqual(r.outcome.liveAtVerdict, [])
  },

  async 'a blackhole mid-cleanup that heals: timedOut with the output, the process gone'(t) {
    const r = await runCase('cleanup-heals', 60_000)
    assertClean(r)
    const after = verdictAfter(r, r.firedMs)
    print(t, r, `verdict ${after} ms after the caller's timeout (deadline ${r.cleanupDeadlineMs} ms)`)
    assert.equal(r.outcome.error, undefined, JSON.stringify(r.outcome.error))
    assert.equal(r.outcome.value.timedOut, true)
    assert.equal(r.outcome.value.stdout, r.expected)
    assert.deepEqual(r.outcome.liveAtVerdict, [], 'the process was alive at the verdict')
    // The blackhole held: no request of the cleanup reached the emulator before the heal.
    const early = r.requests.filter((q) => CLEANUP_ROUTES.includes(q.route) && q.atMs + r.emuReadyMs < eventAt(r, 'heal'))
    assert.deepEqual(early, [], 'cleanup requests reached the emulator through the blackhole')
    const del = r.requests.filter((q) => q.route === 'deleteProcess')
    assert.ok(del.some((q) => q.status === 200), `the emulator answered no DELETE: ${JSON.stringify(r.requests)}`)
    assert.ok(after <= r.cleanupDeadlineMs + VERDICT_SLACK_MS, `verdict after ${after} ms`)
  },

  async 'a blackhole while the creation answer is pending, healing: exact output or failing closed'(t) {
    const r = await runCase('create-heals', 60_000)
    assertClean(r)
    assertCreationPending(r)
    print(t, r, `${r.outcome.error ? `error ${JSON.stringify(r.outcome.error.message)}` : 'result'} after ${r.outcome.durationMs} ms (blackhole at ${eventAt(r, 'blackhole')} ms, healed at ${eventAt(r, 'heal')} ms)`)
    assertFailsClosed(r)
    if (!r.outcome.error) {
      assert.equal(r.outcome.value.exitCode, 0)
      assert.equal(r.outcome.value.stdout, r.expected)
    }
  },

  async 'a blackhole that never heals, from before the cleanup: the verdict within the deadline'(t) {
    const r = await runCase('never-heals-before-cleanup', 60_000)
    assertClean(r)
    const after = verdictAfter(r, r.firedMs)
    print(t, r, `verdict ${after} ms after the caller's timeout (deadline ${r.cleanupDeadlineMs} ms): ${r.outcome.error?.name ?? 'result'}`)
    assert.ok(r.sawOutputFirst)
    assertNothingGotThrough(r)
    assertFailsClosed(r)
    if (r.outcome.error) assert.equal(r.outcome.error.reason, 'termination-unconfirmed', JSON.stringify(r.outcome.error))
    assert.ok(after <= r.cleanupDeadlineMs + VERDICT_SLACK_MS,
      `the verdict came ${after} ms after the caller's timeout; the cleanup deadline is ${r.cleanupDeadlineMs} ms`)
  },

  async 'a blackhole that never heals, from the caller timeout on: the verdict within the deadline'(t) {
    const r = await runCase('never-heals-during-cleanup', 60_000)
    assertClean(r)
    const after = verdictAfter(r, r.firedMs)
    print(t, r, `verdict ${after} ms after the caller's timeout (deadline ${r.cleanupDeadlineMs} ms): ${r.outcome.error?.name ?? 'result'}`)
    assertNothingGotThrough(r)
    assertFailsClosed(r)
    if (r.outcome.error) assert.equal(r.outcome.error.reason, 'termination-unconfirmed', JSON.stringify(r.outcome.error))
    assert.ok(after <= r.cleanupDeadlineMs + VERDICT_SLACK_MS,
      `the verdict came ${after} ms after the caller's timeout; the cleanup deadline is ${r.cleanupDeadlineMs} ms`)
  },

  async 'a blackhole that never heals, from a pending creation answer: the verdict within the deadline'(t) {
    const r = await runCase('never-heals-create', 60_000)
    assertClean(r)
    assertCreationPending(r)
    const after = verdictAfter(r, r.firedMs)
    print(t, r, `verdict ${after} ms after the caller's timeout (deadline ${r.cleanupDeadlineMs} ms): ${r.outcome.error?.name ?? 'result'}`)
    assertNothingGotThrough(r)
    assertFailsClosed(r)
    // The creation's answer never arrived: nothing else is true.
    assert.equal(r.outcome.error?.reason, 'creation-unconfirmed', JSON.stringify(r.outcome))
    assert.ok(after <= r.cleanupDeadlineMs + VERDICT_SLACK_MS,
      `the verdict came ${after} ms after the caller's timeout; the cleanup deadline is ${r.cleanupDeadlineMs} ms`)
  },

  async 'a 1 Mbit/s link with 8 MiB of output: exact, and memory stays bounded'(t) {
    const r = await runCase('slow-link', 180_000)
    assertClean(r)
    const grew = r.rssPeak - r.rssBefore
    print(t, r, `result after ${r.outcome.durationMs} ms; the client's resident memory ${(r.rssBefore / MiB).toFixed(1)} MiB before, peak ${(r.rssPeak / MiB).toFixed(1)} MiB (+${(grew / MiB).toFixed(1)} MiB)`)
    assert.equal(r.outcome.error, undefined, JSON.stringify(r.outcome.error))
    assert.equal(r.outcome.value.exitCode, 0)
    // 8 MiB (base64 in the frames) at 1 Mbit/s cannot take less than 67 s: the limit held.
    assert.ok(r.outcome.durationMs > 30_000, `the link was not limited: ${r.outcome.durationMs} ms`)
    assert.equal(r.logBytes, 8 * MiB, 'log saw every byte')
    assert.ok(r.logExact, 'log saw the output exactly, in order')
    assert.ok(r.stdoutExact, 'stdout is the exact tail of the output')
    assert.equal(r.outcome.value.metadata.outputTruncated, true)
    // The client keeps stdout's 4 Mi-character tail (natively, then as the JS string), and
    // buffers of a few frames: far less than the 8 MiB that passed through it.
    assert.ok(grew < 24 * MiB, `the client's resident memory grew by ${(grew / MiB).toFixed(1)} MiB`)
  },
}

describe('partitions', { concurrency: true }, () => {
  for (const [name, fn] of Object.entries(cases)) {
    if (support.reason && !IN_CI) {
      test(name, { skip: `partition tests skipped: ${support.reason}` }, () => {})
      continue
    }
    test(name, async (t) => {
      if (support.reason) assert.fail(`partition tests cannot run, and CI is set: ${support.reason}`)
      await fn(t)
    })
  }
})
