// Shared helpers for the JS tests. Tests import the package exactly as a host
// does (`require('createos-execute')` → ../index.js) and talk to the real
// emulator over 127.0.0.1; nothing here mocks fetch or the binding.
import { createRequire } from 'node:module'
import { spawn } from 'node:child_process'
import { mkdirSync, readFileSync, writeFileSync, existsSync, readdirSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, basename, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'
import { isAlive, statLive } from './proc.mjs'
import assert from 'node:assert/strict'
import { before, after, beforeEach } from 'node:test'

const require = createRequire(import.meta.url)
export const lib = require('../index.js')
/** The emulator package, as a host installs it for its tests (a devDependency). */
export const emulatorLib = require('createos-execute-emulator')
export const ROOT = dirname(dirname(fileURLToPath(import.meta.url)))

export const CANCELLED = 'CreateOS command was cancelled.'
export const TERMINATION_UNCONFIRMED = 'CreateOS command cleanup failed; process termination is unconfirmed.'
export const CREATION_UNCONFIRMED = 'CreateOS process creation could not be confirmed; destroy the lease before reusing it.'
export const MARK_VAR = 'CREATEOS_EMULATOR_MARK'

/**
 * Where every test file leaves the pids and emulator instances it saw, for zz-no-survivors:
 * one directory per checkout (scripts/test-js.mjs sets it), so two runs on one machine do not
 * read or wipe each other's records.
 */
export const RECORD_DIR = process.env.CREATEOS_TEST_RECORDS || join(tmpdir(), 'createos-execute-test-records')

// ---------------------------------------------------------------------------
// Request log classification by method + path (independent of route names).

const SB = '/v1/sandboxes/[^/]+'
const KINDS = [
  ['PUT', new RegExp(`^${SB}/files$`), 'putFile'],
  ['GET', new RegExp(`^${SB}/files$`), 'getFile'],
  ['POST', new RegExp(`^${SB}/processes$`), 'createProcess'],
  ['GET', new RegExp(`^${SB}/processes$`), 'listProcesses'],
  ['GET', new RegExp(`^${SB}/processes/[^/]+/connect$`), 'connect'],
  ['GET', new RegExp(`^${SB}/processes/[^/]+/wait$`), 'wait'],
  ['POST', new RegExp(`^${SB}/processes/[^/]+/stdin/close$`), 'stdinClose'],
  ['POST', new RegExp(`^${SB}/processes/[^/]+/input$`), 'input'],
  ['POST', new RegExp(`^${SB}/processes/[^/]+/signal$`), 'signal'],
  ['DELETE', new RegExp(`^${SB}/processes/[^/]+$`), 'deleteProcess'],
  ['GET', new RegExp(`^${SB}/processes/[^/]+$`), 'getProcess'],
  ['POST', new RegExp(`^${SB}/exec$`), 'exec'],
  ['POST', new RegExp('^/v1/sandboxes$'), 'createSandbox'],
  ['DELETE', new RegExp(`^${SB}$`), 'deleteSandbox'],
  ['GET', new RegExp(`^${SB}$`), 'getSandbox'],
]

/**
 * True when the suites run in session mode (`CREATEOS_TEST_SESSION=1`: `ctx.client()` adds
 * `session: { idleMs: 60000 }`, so every `execute` of the default mode's suites runs through a
 * supervisor, see docs/session.md). A test asserts the session mode's request shape then.
 */
export function sessionMode() {
  return process.env.CREATEOS_TEST_SESSION === '1'
}

/** What `ctx.client()` adds to a client's config in session mode (`{}` otherwise): for tests
 * that build a client of their own. */
export function sessionConfig() {
  return sessionMode() ? { session: { idleMs: 60_000 } } : {}
}

export function kindOf(r) {
  for (const [method, re, kind] of KINDS) {
    if (r.method === method && re.test(r.path)) {
      if (kind === 'exec' && /(^|&)stream=true(&|$)/.test(r.query)) return 'execStream'
      return kind
    }
  }
  return `${r.method} ${r.path}`
}

export function kinds(requests) {
  return requests.map(kindOf)
}

/**
 * The kinds of a command's requests without the read of its process record that the documented
 * profile adds after an exit frame (it carries no `newest_seq`): for tests whose subject is not
 * the profile, the requests of one command are then the same under both.
 */
export function commandKinds(requests, emu) {
  const k = kinds(requests)
  return emu.profile === 'documented' ? k.filter((kind) => kind !== 'getProcess') : k
}

export function queryOf(r) {
  return new URLSearchParams(r.query)
}

/** The sandbox paths of every file the requests PUT. */
export function putPaths(requests) {
  return requests.filter((r) => kindOf(r) === 'putFile').map((r) => queryOf(r).get('path'))
}

// ---------------------------------------------------------------------------
// Emulator per test file

/**
 * Starts an emulator for one test file and tracks every pid it starts (sampled
 * from livePids()), so `close()` can prove that none of them survived.
 */
/**
 * Registers the usual hooks of a test file: an emulator started before the tests (handed to
 * `onStart`), its request log and faults reset before each test, and the emulator closed (and
 * the file's pids recorded for the final survivor check) after them.
 */
export function useEmulator(metaUrl, onStart, options = {}) {
  let ctx
  before(async () => {
    ctx = await startEmu(options)
    onStart(ctx)
  })
  after(async () => { await ctx.close(fileURLToPath(metaUrl)) })
  beforeEach(() => ctx.reset())
}

/**
 * The emulator profile a test gets when it names none: `CREATEOS_EMULATOR_PROFILE` (`full` or
 * `documented`), else the emulator's default (`full`). A misspelt name fails the test run.
 */
export function defaultProfile() {
  const p = process.env.CREATEOS_EMULATOR_PROFILE
  if (p === undefined || p === '') return undefined
  if (p !== 'full' && p !== 'documented') {
    throw new Error(`CREATEOS_EMULATOR_PROFILE=${JSON.stringify(p)} names no profile (full or documented)`)
  }
  return p
}

export async function startEmu(options = {}) {
  const profile = options.profile ?? defaultProfile()
  const emu = await emulatorLib.startEmulator({
    rateLimitPerMinute: null,
    ...options,
    ...(profile === undefined ? {} : { profile }),
  })
  const seen = new Set()
  const instances = new Set()
  const startedAt = Date.now()
  const sample = () => {
    for (const pid of emu.livePids()) {
      if (seen.has(pid)) continue
      seen.add(pid)
      const mark = markOf(pid)
      if (mark) instances.add(mark.split(':')[0])
    }
  }
  const timer = setInterval(sample, 25)
  timer.unref()

  const ctx = {
    emu,
    url: emu.url,
    apiKey: emu.apiKey,
    /** A client shaped like the host's (config + apiKey). */
    client(config = {}) {
      return { config: { apiUrl: emu.url, timeoutMs: 5000, ...sessionConfig(), ...config }, apiKey: emu.apiKey }
    },
    sandbox() {
      return emu.createSandbox()
    },
    /**
     * The sandbox test `t` runs on: `shared` in the default mode; in session mode a fresh one,
     * destroyed after the test (its supervisors ended with their proof, the faults cleared
     * first), so that the test's first command starts a new supervisor: a fault on
     * `createProcess` or `connect` then reaches that supervisor's creation or stream, where a
     * warm supervisor of the shared sandbox would never send the request.
     */
    sandboxFor(t, shared) {
      return sessionMode() ? ctx.ownSandbox(t) : shared
    },
    /**
     * A new sandbox for test `t`; in session mode it is destroyed after the test, so its idle
     * supervisor does not outlive the test (and count as a live process of a later one).
     */
    ownSandbox(t) {
      const sb = emu.createSandbox()
      if (sessionMode()) {
        t.after(async () => {
          emu.clearFaults()
          await lib.destroySandbox(ctx.client(), sb).catch(() => {})
        })
      }
      return sb
    },
    params(sandboxId, command, extra = {}) {
      return { lease: { providerLeaseId: sandboxId }, command, ...extra }
    },
    sample,
    seenPids: seen,
    /** Requests since the last `reset()`. */
    requests() {
      return emu.requests()
    },
    reset() {
      emu.clearRequests()
      emu.clearFaults()
    },
    async close(testFile) {
      clearInterval(timer)
      sample()
      await emu.close()
      const live = emu.livePids()
      assert.deepEqual(live, [], 'the emulator left processes alive after close()')
      const survivors = [...seen].filter((pid) => isMarkedAlive(pid))
      assert.deepEqual(survivors, [], 'a process started by the emulator survived close()')
      recordForFinalCheck(testFile, { startedAt, pids: [...seen], instances: [...instances] })
    },
  }
  return ctx
}

export function recordForFinalCheck(testFile, record) {
  mkdirSync(RECORD_DIR, { recursive: true })
  const name = `${basename(testFile || 'unknown')}-${process.pid}-${Date.now()}.json`
  writeFileSync(join(RECORD_DIR, name), JSON.stringify(record))
}

export function readRecords() {
  if (!existsSync(RECORD_DIR)) return []
  return readdirSync(RECORD_DIR).filter((f) => f.endsWith('.json')).map((f) => {
    try { return JSON.parse(readFileSync(join(RECORD_DIR, f), 'utf8')) } catch { return null }
  }).filter(Boolean)
}

// ---------------------------------------------------------------------------
// /proc helpers

export { isAlive, statLive }

/**
 * The tree of a live ({@link statLive}) pid that an emulator started, or null: `<instance>:<id>`, from
 * the emulator's cgroup the pid is in (`…/createos-emulator-<os pid>-<instance>/<id>`, which no
 * process of the tree can leave), else from `CREATEOS_EMULATOR_MARK` in its environment.
 */
export function markOf(pid) {
  try {
    if (!statLive(readFileSync(`/proc/${pid}/stat`, 'utf8'))) return null
    const fromCgroup = cgroupMarkOf(pid)
    if (fromCgroup) return fromCgroup
    const env = readFileSync(`/proc/${pid}/environ`)
    for (const entry of env.toString('latin1').split('\0')) {
      if (entry.startsWith(`${MARK_VAR}=`)) return entry.slice(MARK_VAR.length + 1)
    }
  } catch {
    return null
  }
  return null
}

export const CGROUP_PREFIX = 'createos-emulator-'

/** `<instance>:<id>` of the emulator cgroup pid is in, or null. */
export function cgroupMarkOf(pid) {
  let text
  try { text = readFileSync(`/proc/${pid}/cgroup`, 'utf8') } catch { return null }
  for (const line of text.split('\n')) {
    const parts = line.split(':').slice(2).join(':').split('/')
    const at = parts.findIndex((p) => p.startsWith(CGROUP_PREFIX))
    if (at < 0 || !parts[at + 1]) continue
    const rest = parts[at].slice(CGROUP_PREFIX.length)
    const dash = rest.indexOf('-')
    if (dash > 0) return `${rest.slice(dash + 1)}:${parts[at + 1]}`
  }
  return null
}

/**
 * Every emulator cgroup directory on this machine (`createos-emulator-<os pid>-<instance>`,
 * up to four levels below each cgroup mount): [{ path, instance }].
 */
export function emulatorCgroupDirs() {
  const out = []
  let mounts = ''
  try { mounts = readFileSync('/proc/self/mounts', 'utf8') } catch { return out }
  const roots = new Set(mounts.split('\n').map((l) => l.split(' ')).filter((f) => f[2] === 'cgroup' || f[2] === 'cgroup2').map((f) => f[1]))
  const walk = (dir, depth) => {
    let entries
    try { entries = readdirSync(dir, { withFileTypes: true }) } catch { return }
    for (const e of entries) {
      if (!e.isDirectory()) continue
      const path = join(dir, e.name)
      if (e.name.startsWith(CGROUP_PREFIX)) {
        const rest = e.name.slice(CGROUP_PREFIX.length)
        out.push({ path, instance: rest.slice(rest.indexOf('-') + 1) })
      } else if (depth < 4) {
        walk(path, depth + 1)
      }
    }
  }
  for (const root of roots) walk(root, 0)
  return out
}

/** True when pid is alive ({@link statLive}) and belongs to a tree an emulator started. */
export function isMarkedAlive(pid) {
  return markOf(pid) !== null
}


/** Every live process on this machine in a tree an emulator started: [{ pid, mark, startMs }]. */
export function markedProcesses() {
  const out = []
  let btime = 0
  try {
    const m = /^btime (\d+)$/m.exec(readFileSync('/proc/stat', 'utf8'))
    btime = m ? Number(m[1]) * 1000 : 0
  } catch {}
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue
    const pid = Number(name)
    const mark = markOf(pid)
    if (!mark) continue
    let startMs = 0
    let ppid = 0
    let cmdline = ''
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
      ppid = Number(fields[1])
      startMs = btime + (Number(fields[19]) / 100) * 1000 // starttime, in clock ticks (100/s)
      cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').slice(0, 200)
    } catch {}
    out.push({ pid, ppid, mark, startMs, cmdline })
  }
  return out
}

// ---------------------------------------------------------------------------
// Misc

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

/** Resolves with the rejection of `promise` (fails if it resolves). */
export async function rejection(promise) {
  try {
    const value = await promise
    assert.fail(`expected a rejection, got ${JSON.stringify(value)?.slice(0, 300)}`)
  } catch (error) {
    if (error && error.code === 'ERR_ASSERTION' && /^expected a rejection/.test(error.message)) throw error
    return error
  }
}

/** Asserts that nothing in the error (message, stack, own fields) leaks a secret. */
export function assertNoSecrets(error, secrets) {
  const text = [
    String(error && error.message),
    String(error && error.stack),
    (() => { try { return JSON.stringify(error) } catch { return '' } })(),
    (() => { try { return JSON.stringify(error && error.attempts) } catch { return '' } })(),
  ].join('\n')
  for (const secret of secrets.filter(Boolean)) {
    assert.ok(!text.includes(secret), `error text leaks ${JSON.stringify(secret.slice(0, 40))}`)
  }
}

export function bashParams(sandboxId, script, extra = {}) {
  return { lease: { providerLeaseId: sandboxId }, command: '/bin/bash', args: ['-c', script], ...extra }
}

/** Ends what a fault deliberately left alive (the emulator's faults cleared first), so later
 * tests start clean; fails when something is still alive 5 s later. */
export async function endLeftovers(emu) {
  emu.clearFaults()
  for (const pid of emu.livePids()) {
    try { process.kill(pid, 'SIGKILL') } catch {}
  }
  const end = Date.now() + 5000
  while (emu.livePids().length && Date.now() < end) await sleep(20)
  assert.deepEqual(emu.livePids(), [])
}

/**
 * Waits (up to `ms`) until no process of a call is alive; fails naming each one still alive
 * (pid, state, command line). A call may end with housekeeping of its own after its verdict
 * (the removal of staged files is one short `/exec` of `rm`, see docs/containment.md), which
 * is no process of the command: `liveOfCalls` leaves it out.
 */
export async function assertNoneAlive(emu, ms = 5000) {
  const end = Date.now() + ms
  while (liveOfCalls(emu).length && Date.now() < end) await sleep(20)
  const alive = liveOfCalls(emu).map((pid) => {
    let state = '?'
    try { const stat = readFileSync(`/proc/${pid}/stat`, 'utf8'); state = stat[stat.lastIndexOf(')') + 2] } catch {}
    return `${pid} (${state}) ${cmdline(pid)}`
  })
  assert.deepEqual(alive, [], `alive ${ms} ms later`)
}

/**
 * The live processes of calls: those of the managed processes the emulator started, less the
 * `/exec` commands (the only one a call runs is its housekeeping after the verdict, which
 * nothing waits for). The emulator tells them by marker, from the fork on, so an `rm` that has
 * not yet executed (its command line still the parent's) is told apart as well.
 */
export function liveOfCalls(emu) {
  return emu.liveProcessPids()
}

/** The command line of a live process, spaces between its arguments ('' once it is gone). */
export function cmdline(pid) {
  try { return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').trim() } catch { return '' }
}

/**
 * The saturation scenario's victim (`sh -c 'echo partial; exec sleep 30'` under a timeout of
 * `timeoutMs`, started at `started`): finds its `sleep 30` alive while it runs, then checks it
 * resolved `timedOut` with `partial\n`, settled within 5 s of its timeout, and that the process
 * is gone when it settled. `victim` resolves `{ r, at }` or `{ e, at }`.
 */
export async function assertVictimContained(emu, victim, started, timeoutMs) {
  let victimPid = null
  while (victimPid === null && Date.now() < started + timeoutMs) {
    victimPid = emu.livePids().find((pid) => cmdline(pid) === 'sleep 30') ?? null
    if (victimPid === null) await sleep(25)
  }
  assert.ok(victimPid !== null, 'the victim\'s sleep 30 was seen alive')
  const v = await victim
  assert.equal(v.e, undefined, `the victim rejected: ${v.e && v.e.stack}`)
  assert.equal(v.r.timedOut, true)
  assert.equal(v.r.stdout, 'partial\n')
  const afterTimeout = v.at - (started + timeoutMs)
  assert.ok(afterTimeout < 5000, `the victim settled ${afterTimeout} ms after its timeout`)
  assert.ok(!emu.livePids().includes(victimPid), 'the victim\'s process is gone when the call settles')
  return { victimPid, afterTimeout }
}

/** Every variable that steers proxies or trust: a child of `netChild` starts without them. */
export const PROXY_VARS = Object.freeze(['HTTP_PROXY', 'http_proxy', 'HTTPS_PROXY', 'https_proxy', 'ALL_PROXY', 'all_proxy',
  'NO_PROXY', 'no_proxy', 'NODE_USE_ENV_PROXY', 'NODE_EXTRA_CA_CERTS', 'NODE_USE_SYSTEM_CA', 'NODE_OPTIONS'])

/**
 * Runs one `execute` in a child `bin [...nodeArgs] __test__/net-child.cjs` whose environment has
 * none of PROXY_VARS but those in `env`; resolves what the child printed (JSON). The child is
 * SIGKILLed after 30 s.
 */
export function netChild(client, params, env, { bin = process.execPath, nodeArgs = [] } = {}) {
  const base = { ...process.env }
  for (const k of PROXY_VARS) delete base[k]
  return new Promise((resolve, reject) => {
    const child = spawn(bin, [...nodeArgs, join(ROOT, '__test__', 'net-child.cjs'), JSON.stringify({ client, params })], {
      env: { ...base, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    let out = ''
    let err = ''
    child.stdout.on('data', (c) => { out += c })
    child.stderr.on('data', (c) => { err += c })
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000)
    child.on('error', reject)
    child.on('exit', (code) => {
      clearTimeout(timer)
      try {
        resolve(JSON.parse(out))
      } catch {
        reject(new Error(`child exited ${code} without a result: ${err.slice(0, 2000)}`))
      }
    })
  })
}

/** A `sleep` duration no other test (of any file running in parallel) uses. */
export function uniqueSleep(base) {
  return `${base}.${process.pid}${String(process.hrtime.bigint() % 1000000n).padStart(6, '0')}`
}

/** The live pids of session supervisors among `pids` (their command line carries the
 * supervisor's marker assignment, see crates/core/src/session/supervisor.sh). */
export function supervisorPids(pids) {
  return pids.filter((pid) => cmdline(pid).includes('__cos_marker='))
}

/** Live ({@link statLive}) pids whose command line is exactly `sleep <arg>`. */
export function sleepers(arg) {
  const want = `sleep\0${arg}\0`
  const out = []
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue
    try {
      if (readFileSync(`/proc/${name}/cmdline`, 'latin1') !== want) continue
      if (statLive(readFileSync(`/proc/${name}/stat`, 'utf8'))) out.push(Number(name))
    } catch {}
  }
  return out
}
