// A real proxy in front of CreateOS: squid with basic auth (its `basic_ncsa_auth` helper and
// an htpasswd file made here), one per test on a free loopback port, in a temp dir, ended by
// pid. A refusal (407, 403) and an unreachable proxy each fail with their own message and
// code, never as a cleanup error, and nothing reaches the emulator; the right credentials run
// the command through the tunnel. Then Node's proxy switch in every place Node reads it:
// `--use-env-proxy` on the command line and in NODE_OPTIONS (in child processes: the
// environment is read once per process).
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, spawnSync, execFileSync } from 'node:child_process'
import net from 'node:net'
import { mkdtempSync, writeFileSync, readFileSync, rmSync, chmodSync, existsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { lib, startEmu, kinds, rejection, assertNoSecrets, bashParams, sleep, netChild, liveOfCalls } from './helpers.mjs'

const FILE = fileURLToPath(import.meta.url)
const { execute, isCreateosCleanupError } = lib

const REFUSED_407 = 'CreateOS proxy refused the connection (HTTP 407).'
const REFUSED = 'CreateOS proxy refused the connection.'
const UNREACHABLE = 'CreateOS proxy could not be reached.'
const USER = 'proxyuser'
const PASSWORD = 'proxy-secret-9f2c'

const SQUID = ['/usr/sbin/squid', '/usr/bin/squid'].find((p) => existsSync(p))
const NCSA = ['/usr/lib/squid/basic_ncsa_auth', '/usr/lib/squid3/basic_ncsa_auth'].find((p) => existsSync(p))
if (!SQUID || !NCSA) throw new Error('squid (with basic_ncsa_auth) must be installed: apt-get install squid')

const emus = []
async function emulator(options = {}) {
  const ctx = await startEmu(options)
  emus.push(ctx)
  return ctx
}
const squids = []
after(async () => {
  for (const s of squids) await s.close()
  for (const ctx of emus) await ctx.close(FILE)
})

/** A loopback port with nothing listening on it. */
async function freePort() {
  const s = net.createServer()
  await new Promise((r) => s.listen(0, '127.0.0.1', r))
  const { port } = s.address()
  await new Promise((r) => s.close(r))
  return port
}

function canConnect(port) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1')
    sock.once('connect', () => { sock.destroy(); resolve(true) })
    sock.once('error', () => resolve(false))
  })
}

/**
 * squid on 127.0.0.1 with basic auth for USER/PASSWORD. `createos.test` and `blocked.test`
 * resolve to 127.0.0.1 (its own hosts file); CONNECTs to `blocked.test` are denied (403)
 * before authentication. `log()` is its access log (one line per request it answered).
 */
async function startSquid() {
  const dir = mkdtempSync(join(tmpdir(), 'createos-squid-'))
  // squid started as root runs as its own user: it must read and write here.
  chmodSync(dir, 0o777)
  const hash = execFileSync('openssl', ['passwd', '-apr1', PASSWORD], { encoding: 'utf8' }).trim()
  writeFileSync(join(dir, 'htpasswd'), `${USER}:${hash}\n`, { mode: 0o644 })
  writeFileSync(join(dir, 'hosts'), '127.0.0.1 createos.test blocked.test localhost\n', { mode: 0o644 })
  const port = await freePort()
  writeFileSync(join(dir, 'squid.conf'), [
    `http_port 127.0.0.1:${port}`,
    `pid_filename ${join(dir, 'squid.pid')}`,
    `cache_log ${join(dir, 'cache.log')}`,
    `access_log stdio:${join(dir, 'access.log')}`,
    `coredump_dir ${dir}`,
    `hosts_file ${join(dir, 'hosts')}`,
    // Nothing here may look anything up beyond this machine.
    'dns_nameservers 127.0.0.1',
    'cache deny all',
    'cache_mem 8 MB',
    'icp_port 0',
    'htcp_port 0',
    'pinger_enable off',
    'netdb_filename none',
    'shutdown_lifetime 0 seconds',
    'logfile_rotate 0',
    `auth_param basic program ${NCSA} ${join(dir, 'htpasswd')}`,
    'auth_param basic children 2 startup=1 idle=1',
    'auth_param basic realm createos-test',
    'acl blocked dstdomain blocked.test',
    'acl authed proxy_auth REQUIRED',
    'http_access deny blocked',
    'http_access allow authed',
    'http_access deny all',
    '',
  ].join('\n'), { mode: 0o644 })
  // Its own process group, so its helpers end with it.
  const child = spawn(SQUID, ['-N', '-f', join(dir, 'squid.conf')], { detached: true, stdio: ['ignore', 'ignore', 'pipe'] })
  let stderr = ''
  child.stderr.on('data', (c) => { stderr += c })
  const exited = new Promise((r) => child.once('exit', r))
  const squid = {
    port,
    url: `http://127.0.0.1:${port}`,
    authUrl: `http://${USER}:${PASSWORD}@127.0.0.1:${port}`,
    wrongUrl: `http://${USER}:not-the-password@127.0.0.1:${port}`,
    log: () => (existsSync(join(dir, 'access.log')) ? readFileSync(join(dir, 'access.log'), 'utf8') : ''),
    async close() {
      if (child.exitCode === null && child.signalCode === null) {
        try { process.kill(-child.pid, 'SIGTERM') } catch {}
        const done = await Promise.race([exited.then(() => true), sleep(5000).then(() => false)])
        if (!done) {
          try { process.kill(-child.pid, 'SIGKILL') } catch {}
          await exited
        }
      }
      rmSync(dir, { recursive: true, force: true })
    },
  }
  squids.push(squid)
  const deadline = Date.now() + 20_000
  while (!(await canConnect(port))) {
    if (child.exitCode !== null || Date.now() > deadline) {
      throw new Error(`squid did not start: ${stderr.slice(0, 2000)} ${existsSync(join(dir, 'cache.log')) ? readFileSync(join(dir, 'cache.log'), 'utf8').slice(-2000) : ''}`)
    }
    await sleep(50)
  }
  return squid
}

/** squid's access log lines for CONNECTs (it writes them when a tunnel ends or is refused). */
async function connectLines(squid, want) {
  const deadline = Date.now() + 5000
  for (;;) {
    const lines = squid.log().split('\n').filter((l) => l.includes(' CONNECT '))
    if (lines.length >= want || Date.now() > deadline) return lines
    await sleep(50)
  }
}

function emuClient(ctx, config = {}) {
  return { config: { apiUrl: ctx.url, timeoutMs: 8000, pacing: 'off', ...config }, apiKey: ctx.apiKey }
}

function assertProxyError(e, message, code, secrets) {
  assert.equal(e.message, message)
  assert.equal(e.code, code)
  assert.equal(isCreateosCleanupError(e), false, 'nothing reached CreateOS: no cleanup error')
  assert.equal(e.name, 'Error')
  assertNoSecrets(e, secrets)
}

test('squid with basic auth: a wrong password or none is CREATEOS_PROXY_REFUSED (HTTP 407), the right one runs the command', async () => {
  const ctx = await emulator({ tls: true })
  const squid = await startSquid()
  const sb = ctx.sandbox()
  const port = new URL(ctx.url).port
  const apiUrl = `https://localhost:${port}`
  const secrets = [PASSWORD, 'not-the-password', USER, String(squid.port), ctx.apiKey]

  for (const proxy of [squid.wrongUrl, squid.url]) {
    ctx.reset()
    const e = await rejection(execute(emuClient(ctx, { apiUrl, proxy, caCertPem: ctx.emu.caPem }), bashParams(sb, 'echo never')))
    assertProxyError(e, REFUSED_407, 'CREATEOS_PROXY_REFUSED', secrets)
    assert.deepEqual(ctx.requests(), [], 'nothing reached the emulator')
  }
  assert.equal(ctx.emu.connections(), 0, 'squid opened no connection to the emulator')
  const refused = await connectLines(squid, 2)
  assert.ok(refused.length >= 2 && refused.every((l) => l.includes('/407 ')), refused.join('\n'))

  ctx.reset()
  const r = await execute(emuClient(ctx, { apiUrl, proxy: squid.authUrl, caCertPem: ctx.emu.caPem }), bashParams(sb, 'echo through-squid; cat', { stdin: 'in\n' }))
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'through-squid\nin\n')
  const k = kinds(ctx.requests())
  assert.deepEqual([...k].sort(), ['connect', 'createProcess', 'putFile', 'putFile'])
  assert.ok(ctx.emu.connections() >= 1)
  assert.deepEqual(liveOfCalls(ctx.emu), [])
})

test('a CONNECT squid denies (403) is CREATEOS_PROXY_REFUSED without a status; nothing reaches CreateOS', async () => {
  const ctx = await emulator({ tls: true })
  const squid = await startSquid()
  const sb = ctx.sandbox()
  const port = new URL(ctx.url).port
  const e = await rejection(execute(
    emuClient(ctx, { apiUrl: `https://blocked.test:${port}`, proxy: squid.authUrl, caCertPem: ctx.emu.caPem }),
    bashParams(sb, 'echo never'),
  ))
  assertProxyError(e, REFUSED, 'CREATEOS_PROXY_REFUSED', [PASSWORD, USER, 'blocked.test', String(squid.port)])
  assert.deepEqual(ctx.requests(), [])
  assert.equal(ctx.emu.connections(), 0)
  const lines = await connectLines(squid, 1)
  assert.ok(lines.length >= 1 && lines.every((l) => l.includes('/403 ')), lines.join('\n'))
})

test('a proxy that cannot be reached is CREATEOS_PROXY_UNREACHABLE; nothing reaches CreateOS', async () => {
  const ctx = await emulator({ tls: true })
  const sb = ctx.sandbox()
  const port = new URL(ctx.url).port
  const dead = await freePort()
  const e = await rejection(execute(
    emuClient(ctx, { apiUrl: `https://localhost:${port}`, proxy: `http://${USER}:${PASSWORD}@127.0.0.1:${dead}`, caCertPem: ctx.emu.caPem }),
    bashParams(sb, 'echo never'),
  ))
  assertProxyError(e, UNREACHABLE, 'CREATEOS_PROXY_UNREACHABLE', [PASSWORD, USER, String(dead)])
  assert.deepEqual(ctx.requests(), [])
  assert.equal(ctx.emu.connections(), 0)
})

// ---------------------------------------------------------------------------
// Node's proxy switch: --use-env-proxy (command line, NODE_OPTIONS), NODE_USE_ENV_PROXY

/** A Node that accepts `--use-env-proxy` (Node ≥ 24): CREATEOS_TEST_NODE, else this one. */
function flagNode() {
  for (const bin of [process.env.CREATEOS_TEST_NODE, process.execPath]) {
    if (!bin) continue
    const r = spawnSync(bin, ['--use-env-proxy', '-e', '0'], { stdio: 'ignore', timeout: 20_000 })
    if (r.status === 0) return bin
  }
  return null
}
const FLAG_NODE = flagNode()
const NO_FLAG = FLAG_NODE ? false : `this Node (${process.version}) rejects --use-env-proxy; set CREATEOS_TEST_NODE to a Node >= 24 to run it`

/**
 * Runs `cases` ([nodeArgs, env, proxied]) against squid with `createos.test` as the API host
 * (not loopback, so the environment's proxy applies): a proxied case runs through squid, an
 * unproxied one does not touch it (createos.test does not resolve outside squid).
 */
async function switchCases(bin, cases) {
  const ctx = await emulator({ tls: true })
  const squid = await startSquid()
  const sb = ctx.sandbox()
  const port = new URL(ctx.url).port
  const tmp = mkdtempSync(join(tmpdir(), 'createos-proxy-switch-'))
  try {
    const caFile = join(tmp, 'ca.pem')
    writeFileSync(caFile, ctx.emu.caPem)
    const client = emuClient(ctx, { apiUrl: `https://createos.test:${port}` })
    let connects = 0
    for (const [nodeArgs, env, proxied] of cases) {
      ctx.reset()
      const what = `${nodeArgs.join(' ')} ${JSON.stringify(env)}`
      const out = await netChild(client, bashParams(sb, 'echo switched'), {
        HTTPS_PROXY: squid.authUrl, NODE_EXTRA_CA_CERTS: caFile, ...env,
      }, { bin, nodeArgs })
      if (proxied) {
        assert.equal(out.ok, true, `${what}: ${JSON.stringify(out)}`)
        assert.equal(out.result.stdout, 'switched\n')
        assert.deepEqual([...kinds(ctx.requests())].sort(), ['connect', 'createProcess', 'putFile'], what)
        const lines = await connectLines(squid, connects + 1)
        assert.ok(lines.length > connects, `${what}: squid saw no CONNECT`)
        assert.ok(lines.slice(connects).every((l) => l.includes(`createos.test:${port}`) && l.includes(USER)), lines.join('\n'))
        connects = lines.length
      } else {
        assert.equal(out.ok, false, what)
        assert.equal(out.message, 'CreateOS connection failed.', what)
        assert.deepEqual(ctx.requests(), [], what)
        await sleep(200)
        assert.equal((await connectLines(squid, 0)).length, connects, `${what}: squid saw a CONNECT`)
      }
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true })
  }
}

test('--use-env-proxy on the command line and in NODE_OPTIONS works like NODE_USE_ENV_PROXY=1; --no-use-env-proxy wins over it', { skip: NO_FLAG }, async () => {
  await switchCases(FLAG_NODE, [
    [['--use-env-proxy'], {}, true],
    [[], { NODE_OPTIONS: '--use-env-proxy' }, true],
    [[], { NODE_OPTIONS: '--max-old-space-size=200 --use_env_proxy' }, true],
    [['--use-env-proxy'], { NODE_USE_ENV_PROXY: '0' }, true],
    [[], {}, false],
    [['--no-use-env-proxy'], { NODE_USE_ENV_PROXY: '1' }, false],
    [['--no-use-env-proxy'], { NODE_OPTIONS: '--use-env-proxy' }, false],
    [[], { NODE_OPTIONS: '--no-use-env-proxy', NODE_USE_ENV_PROXY: '1' }, false],
  ])
})

test('the switch as this Node hands it over: process.execArgv and NODE_OPTIONS as they stand when the package loads', async () => {
  // On a Node that rejects the flag itself (before 24) a preload puts it where Node >= 24 puts
  // it, before the package loads: `process.execArgv`, or the environment's NODE_OPTIONS.
  const tmp = mkdtempSync(join(tmpdir(), 'createos-proxy-preload-'))
  try {
    const argv = join(tmp, 'argv.cjs')
    writeFileSync(argv, "process.execArgv.push(...JSON.parse(process.env.TEST_EXEC_ARGV))\n")
    const opts = join(tmp, 'opts.cjs')
    writeFileSync(opts, 'process.env.NODE_OPTIONS = process.env.TEST_NODE_OPTIONS\n')
    await switchCases(process.execPath, [
      [['-r', argv], { TEST_EXEC_ARGV: '["--use-env-proxy"]' }, true],
      [['-r', argv], { TEST_EXEC_ARGV: '["--use-env-proxy", "--no-use-env-proxy"]', NODE_USE_ENV_PROXY: '1' }, false],
      [['-r', opts], { TEST_NODE_OPTIONS: '--use-env-proxy' }, true],
      [['-r', opts], { TEST_NODE_OPTIONS: '--no-use-env-proxy', NODE_USE_ENV_PROXY: '1' }, false],
      [['-r', argv], { TEST_EXEC_ARGV: '[]', NODE_USE_ENV_PROXY: '1' }, true],
    ])
  } finally {
    rmSync(tmp, { recursive: true, force: true })
  }
})
