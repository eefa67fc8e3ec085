// The command-line tools and the demo (issue 3 §1, §5), run as separate
// processes exactly as a user runs them.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { join } from 'node:path'
import { ROOT, isMarkedAlive, sleep } from './helpers.mjs'

const EXEC = join(ROOT, 'bin', 'createos-exec.js')
const EMULATOR = join(ROOT, 'emulator', 'bin', 'createos-emulator.js')

function run(file, args, { env = {}, timeoutMs = 30000, input } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [file, ...args], {
      cwd: ROOT,
      env: { ...process.env, ...env },
      stdio: ['pipe', 'pipe', 'pipe'],
    })
    let stdout = ''
    let stderr = ''
    child.stdout.setEncoding('utf8').on('data', (d) => { stdout += d })
    child.stderr.setEncoding('utf8').on('data', (d) => { stderr += d })
    const timer = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`${file} ${args.join(' ')} hung\n${stdout}\n${stderr}`)) }, timeoutMs)
    child.on('error', reject)
    child.on('close', (code, signal) => {
      clearTimeout(timer)
      resolve({ code, signal, stdout, stderr, pid: child.pid })
    })
    if (input !== undefined) child.stdin.end(input)
    else child.stdin.end()
  })
}

test('createos-exec --local -- echo hi: prints hi, exits 0', async () => {
  const r = await run(EXEC, ['--local', '--', 'echo', 'hi'])
  assert.equal(r.stdout, 'hi\n', r.stderr)
  assert.equal(r.code, 0, r.stderr)
})

test("createos-exec --local -- bash -c 'exit 3': exits 3", async () => {
  const r = await run(EXEC, ['--local', '--', 'bash', '-c', 'echo out; echo err >&2; exit 3'])
  assert.equal(r.code, 3)
  assert.equal(r.stdout, 'out\n')
  assert.equal(r.stderr, 'err\n')
})

test('createos-exec: --env, --cwd and --stdin-file', async () => {
  const r = await run(EXEC, ['--local', '--env', 'A=one two', '--env=B=x=y', '--cwd', '/tmp', '--stdin-file', '-', '--',
    'bash', '-c', 'echo "$A|$B|$PWD"; cat'], { input: 'piped\n' })
  assert.equal(r.code, 0, r.stderr)
  assert.equal(r.stdout, 'one two|x=y|/tmp\npiped\n')
})

test('createos-exec: timeout prints one line and exits 124', async () => {
  const started = Date.now()
  const r = await run(EXEC, ['--local', '--timeout', '700', '--', 'bash', '-c', 'echo started; sleep 60'])
  assert.equal(r.code, 124)
  assert.equal(r.stdout, 'started\n')
  const lines = r.stderr.trim().split('\n')
  assert.equal(lines.length, 1, r.stderr)
  assert.match(lines[0], /timed out after 700 ms/)
  assert.ok(Date.now() - started < 15000)
})

test('createos-exec: a command killed by a signal exits 128+n', async () => {
  const r = await run(EXEC, ['--local', '--', 'bash', '-c', 'kill -TERM $$'])
  assert.equal(r.code, 128 + 15)
})

// The variables createos-exec falls back to, unset (blank counts as unset).
const NO_TARGET = { CREATEOS_API_URL: '', CREATEOS_SANDBOX_ID: '', CREATEOS_CA_FILE: '' }

/** The `NAME=value` lines createos-emulator printed, by name. */
function printedVariables(stdout) {
  return Object.fromEntries(stdout.split('\n').filter((l) => /^CREATEOS_[A-Z_]+=/.test(l)).map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]))
}

test('createos-exec reads CREATEOS_API_URL, CREATEOS_SANDBOX_ID (and CREATEOS_CA_FILE) as createos-emulator prints them', async () => {
  for (const tls of [false, true]) {
    const emu = await startEmulatorProcess(['--rate-limit', 'off', ...(tls ? ['--tls'] : [])])
    try {
      const vars = printedVariables(emu.stdout)
      assert.deepEqual(Object.keys(vars).sort(), ['CREATEOS_API_KEY', 'CREATEOS_API_URL', 'CREATEOS_SANDBOX_ID', ...(tls ? ['CREATEOS_CA_FILE'] : [])].sort())
      const r = await run(EXEC, ['--', 'bash', '-c', 'echo "in $CREATEOS_SANDBOX_ID"'], { env: { ...NO_TARGET, ...vars } })
      assert.equal(r.code, 0, r.stderr)
      assert.equal(r.stdout, `in ${vars.CREATEOS_SANDBOX_ID}\n`)
      // A flag still wins over the variable.
      const wrong = await run(EXEC, ['--sandbox', 'sb_missing', '--', 'true'], { env: { ...NO_TARGET, ...vars } })
      assert.equal(wrong.code, 1, wrong.stderr)
      assert.match(wrong.stderr, /^createos-exec: CreateOS/)
    } finally {
      await emu.stop()
    }
  }
})

test('createos-exec: usage errors exit 2', async () => {
  for (const args of [[], ['--local'], ['--local', '--api-url', 'https://x', '--', 'true'], ['--', 'true'], ['--bogus', '--', 'true'], ['--local', '--timeout', 'soon', '--', 'true'], ['--local', '--env', 'NOEQ', '--', 'true']]) {
    const r = await run(EXEC, args, { env: NO_TARGET })
    assert.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`)
    assert.match(r.stderr, /usage: createos-exec/)
  }
})

test('createos-exec: the key comes from CREATEOS_API_KEY and is never printed', async () => {
  const emu = await startEmulatorProcess(['--api-key', 'cli-secret-key-123'])
  try {
    // A wrong sandbox id and the right key: an error line without the key.
    const r = await run(EXEC, ['--api-url', emu.url, '--sandbox', 'sb_missing', '--', 'echo', 'x'],
      { env: { CREATEOS_API_KEY: 'cli-secret-key-123' } })
    assert.notEqual(r.code, 0)
    assert.ok(!r.stdout.includes('cli-secret-key-123') && !r.stderr.includes('cli-secret-key-123'))
    assert.match(r.stderr, /^createos-exec: CreateOS/)
    // No key at all: a clear error, before any request.
    const r2 = await run(EXEC, ['--api-url', emu.url, '--sandbox', 'sb_x', '--', 'echo', 'x'], { env: { CREATEOS_API_KEY: '' } })
    assert.equal(r2.code, 1)
    assert.match(r2.stderr, /API key/)
  } finally {
    await emu.stop()
  }
})

async function startEmulatorProcess(args) {
  const child = spawn(process.execPath, [EMULATOR, ...args], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  child.stdout.setEncoding('utf8').on('data', (d) => { stdout += d })
  let stderr = ''
  child.stderr.setEncoding('utf8').on('data', (d) => { stderr += d })
  const end = Date.now() + 10000
  while (!/isolates nothing.*\n/.test(stdout)) {
    if (Date.now() > end || child.exitCode !== null) throw new Error(`emulator did not start: ${stdout} ${stderr}`)
    await sleep(20)
  }
  const url = /CREATEOS_API_URL=(\S+)/.exec(stdout)[1]
  const apiKey = /CREATEOS_API_KEY=(\S+)/.exec(stdout)[1]
  const sandboxId = /CREATEOS_SANDBOX_ID=(\S+)/.exec(stdout)?.[1]
  const closed = new Promise((resolve) => child.on('close', (code, signal) => resolve({ code, signal })))
  return {
    url,
    apiKey,
    sandboxId,
    child,
    get stdout() { return stdout },
    async stop(signal = 'SIGTERM') {
      if (child.exitCode === null) child.kill(signal)
      return closed
    },
  }
}

test('createos-emulator prints its URL, key, tracking and a ready sandbox, serves, and stops on SIGINT/SIGTERM with nothing left', async () => {
  for (const signal of ['SIGINT', 'SIGTERM']) {
    const emu = await startEmulatorProcess(['--rate-limit', 'off'])
    assert.match(emu.url, /^http:\/\/127\.0\.0\.1:\d+$/)
    const lines = emu.stdout.split('\n')
    assert.match(lines[0], /^CreateOS emulator listening on http:\/\/127\.0\.0\.1:\d+ \(process tracking: (cgroup-v2|cgroup-v1|marker)\)$/)
    assert.deepEqual(lines.slice(1, 4).map((l) => l.split('=')[0]), ['CREATEOS_API_URL', 'CREATEOS_API_KEY', 'CREATEOS_SANDBOX_ID'])
    assert.match(emu.stdout, /isolates nothing/)
    // The printed sandbox is ready: a command runs in it with nothing else set up.
    const { sandboxId } = emu
    assert.match(sandboxId, /^sb-[0-9A-Z]{26}$/)
    const { execute } = await import('../index.js').then((m) => m.default || m)
    const res = await fetch(`${emu.url}/v1/sandboxes/${sandboxId}`, { headers: { 'x-api-key': emu.apiKey } })
    assert.equal(res.status, 200, 'the printed sandbox exists')
    assert.equal((await res.json()).data.status, 'running')
    const r = await execute({ config: { apiUrl: emu.url, timeoutMs: 5000, pacing: 'off' }, apiKey: emu.apiKey },
      { lease: { providerLeaseId: sandboxId }, command: 'bash', args: ['-c', 'sleep 60 & echo "$!"'] })
    const bgPid = Number(r.stdout.trim())
    assert.ok(bgPid > 1, r.stdout)
    assert.ok(isMarkedAlive(bgPid), 'the background child runs until the emulator stops')
    const { code } = await emu.stop(signal)
    assert.equal(code, 0, `${signal}`)
    assert.match(emu.stdout, /stopped/)
    assert.equal(isMarkedAlive(bgPid), false, 'the background child was ended with the emulator')
  }
})

test('createos-emulator: usage errors exit 2', async () => {
  for (const args of [['--port', 'x'], ['--what'], ['--tracking', 'cgroups'], ['--pids-max', '0'], ['--pids-max', 'many']]) {
    const r = await run(EMULATOR, args)
    assert.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`)
    assert.match(r.stderr, /usage: createos-emulator/)
  }
})

test('createos-emulator --tracking marker says so on its first line', async () => {
  const emu = await startEmulatorProcess(['--tracking', 'marker', '--pids-max', 'off'])
  try {
    assert.match(emu.stdout.split('\n')[0], /\(process tracking: marker\)$/)
  } finally {
    // Stopped at once after its first lines: the signal meets the handler,
    // never the default action (exit code null, killed by the signal).
    assert.deepEqual(await emu.stop(), { code: 0, signal: null })
  }
})

test('npm run demo: runs, shows the timeout cleanup, exits 0', async () => {
  const r = await run(join(ROOT, 'scripts', 'demo.mjs'), [], { timeoutMs: 60000 })
  assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`)
  assert.match(r.stdout, /step 3 of 3/)
  assert.match(r.stdout, /timedOut true/)
  assert.match(r.stdout, /grace_ms=1000/)
  assert.match(r.stdout, /tree_exited true/)
  assert.match(r.stdout, /still alive: none/)
  assert.match(r.stdout, /Demo OK\./)
  assert.match(r.stderr, /a warning on stderr/)
})
