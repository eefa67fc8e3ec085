// `npm test`'s first step: makes sure the programs the tests start are on this machine.
//   - A tool found on PATH (or in /usr/local/sbin, /usr/sbin, /sbin, where Debian puts
//     squid, nft and ip, outside a normal user's PATH) is used as it is.
//   - Otherwise, as root on a machine with apt-get, the Debian packages of every missing tool
//     are installed: `apt-get update` once, then `apt-get install -y --no-install-recommends`,
//     quietly (the output is shown only when it fails), each step with a time bound.
//   - Failing that, it stops with one line naming the command to run.
// Nothing is started here: the tests start their servers themselves, on random ports, and end
// them by pid.
//
//   node scripts/provision.mjs [--arm64] [--dry-run]
//     --arm64     instead: what `npm run build:arm64` and `npm run test:arm64` need on an x64
//                 Linux machine (ARM64_TOOLS): Debian's Rust with the arm64 standard library,
//                 the aarch64 cross gcc and glibc, qemu-user-static, and the arm64 C and C++
//                 runtime an arm64 node loads under qemu. arm64 is added to dpkg's
//                 architectures first when it is not one of them. Opt-in: `npm test` never
//                 asks for it, and rustup's toolchain (first on PATH) is left as it is.
//     --dry-run   report what is missing and what would be run; install nothing, exit 0
// Environment (for checking this script itself):
//   CREATEOS_PROVISION_TOOLS   the tools to look for, `bin=package,bin=package` (default: TOOLS)
//   CREATEOS_PROVISION_DIRS    the directories searched besides PATH, `:`-separated
//                              (default /usr/local/sbin:/usr/sbin:/sbin; empty: PATH only)
import { spawnSync } from 'node:child_process'
import { accessSync, constants, existsSync, statSync } from 'node:fs'
import { delimiter, join } from 'node:path'
import { fileURLToPath } from 'node:url'

/** Every program a test starts that is not part of a minimal Linux system, and its Debian package. */
export const TOOLS = [
  // the addon's build on x86-64 Linux: jemalloc's C build runs configure and make (src/allocator.rs)
  { bin: 'make', pkg: 'make', linux: true },
  // crates/core/tests/pacing_redis.rs, __test__/pacing-shared.test.mjs, benches/run.mjs
  { bin: 'redis-server', pkg: 'redis-server' },
  { bin: 'redis-cli', pkg: 'redis-tools' },
  // crates/core/tests/pacing_redis.rs signals its redis-server with kill(1), not a shell builtin
  { bin: 'kill', pkg: 'procps' },
  // the proxy tests: a real squid with basic auth (its helper basic_ncsa_auth ships with it)
  { bin: 'squid', pkg: 'squid' },
  // __test__/partition.test.mjs: a private network namespace, nftables blackholes, tc tbf
  { bin: 'unshare', pkg: 'util-linux', linux: true },
  { bin: 'nft', pkg: 'nftables', linux: true },
  { bin: 'ip', pkg: 'iproute2', linux: true },
  { bin: 'tc', pkg: 'iproute2', linux: true },
]

// The arm64 route (docs/contributing.md, "Cross-building linux-arm64"). rustup cannot fetch
// another target's standard library here, so the cross build uses Debian's Rust, whose
// rustc and cargo go to /usr/bin (behind rustup's on PATH: the build names them by path).
// `file` entries are looked for at that path, `bin` entries as above; `arch: 'arm64'` marks a
// package of the foreign architecture.
export const ARM64_TOOLS = [
  { file: '/usr/bin/rustc', pkg: 'rustc-web' },
  { file: '/usr/bin/cargo', pkg: 'cargo-web' },
  { file: '/usr/lib/rustlib/aarch64-unknown-linux-gnu/lib', pkg: 'libstd-rust-web-dev:arm64', arch: 'arm64' },
  { bin: 'aarch64-linux-gnu-gcc', pkg: 'gcc-aarch64-linux-gnu' },
  { file: '/usr/aarch64-linux-gnu/lib/crt1.o', pkg: 'libc6-dev-arm64-cross' },
  { bin: 'qemu-aarch64-static', pkg: 'qemu-user-static' },
  // what the arm64 node binary links against, at the paths its loader looks in
  { file: '/lib/ld-linux-aarch64.so.1', pkg: 'libc6:arm64', arch: 'arm64' },
  { file: '/usr/lib/aarch64-linux-gnu/libstdc++.so.6', pkg: 'libstdc++6:arm64', arch: 'arm64' },
]

const APT_UPDATE_MS = 5 * 60_000
const APT_INSTALL_MS = 10 * 60_000

const ARM64 = process.argv.includes('--arm64')

function tools() {
  if (ARM64) return ARM64_TOOLS
  const spec = process.env.CREATEOS_PROVISION_TOOLS
  if (spec === undefined) return TOOLS.filter((t) => !t.linux || process.platform === 'linux')
  return spec.split(',').map((s) => s.trim()).filter(Boolean).map((s) => {
    const [bin, pkg] = s.split('=')
    return { bin, pkg: pkg || bin }
  })
}

function searchDirs() {
  const extra = process.env.CREATEOS_PROVISION_DIRS ?? '/usr/local/sbin:/usr/sbin:/sbin'
  return [...(process.env.PATH || '').split(delimiter), ...extra.split(':')].filter(Boolean)
}

/** The absolute path of `bin` (on PATH, or in an sbin directory), or null. */
export function toolPath(bin) {
  for (const dir of searchDirs()) {
    const file = join(dir, bin)
    try {
      if (!statSync(file).isFile()) continue
      accessSync(file, constants.X_OK)
      return file
    } catch {}
  }
  return null
}

/** PATH with the sbin directories appended, for the tests' child processes. */
export function pathWithTools(path = process.env.PATH || '') {
  const have = new Set(path.split(delimiter))
  const extra = ['/usr/local/sbin', '/usr/sbin', '/sbin'].filter((d) => !have.has(d))
  return [path, ...extra].filter(Boolean).join(delimiter)
}

const present = (t) => (t.file ? existsSync(t.file) : Boolean(toolPath(t.bin)))
const label = (t) => t.file ?? t.bin

function missingTools() {
  return tools().filter((t) => !present(t))
}

/** dpkg's foreign architectures, or null without dpkg. */
function foreignArchitectures() {
  const r = spawnSync('dpkg', ['--print-foreign-architectures'], { encoding: 'utf8', timeout: 30_000 })
  return r.status === 0 ? r.stdout.split('\n').filter(Boolean) : null
}

const unique = (xs) => [...new Set(xs)]

function run(cmd, args, timeoutMs) {
  const t0 = Date.now()
  const r = spawnSync(cmd, args, {
    env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
    stdio: ['ignore', 'pipe', 'pipe'],
    timeout: timeoutMs,
    killSignal: 'SIGKILL',
    maxBuffer: 64 * 1024 * 1024,
  })
  const out = `${r.stdout || ''}${r.stderr || ''}`
  const timedOut = r.error?.code === 'ETIMEDOUT'
  return { ok: !r.error && r.status === 0, out, timedOut, error: r.error, ms: Date.now() - t0 }
}

function main() {
  const dryRun = process.argv.includes('--dry-run')
  const missing = missingTools()
  if (missing.length === 0) {
    if (dryRun) process.stdout.write(`provision: all present (${tools().map(label).join(', ')})\n`)
    return 0
  }
  const names = missing.map(label).join(', ')
  const pkgs = unique(missing.map((t) => t.pkg))
  const needs = ARM64 ? 'the arm64 build' : 'the tests'
  const again = ARM64 ? '`npm run build:arm64`' : '`npm test`'
  // A package of a foreign architecture needs it among dpkg's, then a fresh package list.
  const addArch = unique(missing.map((t) => t.arch).filter(Boolean))
    .filter((arch) => !(foreignArchitectures() ?? []).includes(arch))
  const installArgs = ['install', '-y', '-qq', '--no-install-recommends', '-o', 'Dpkg::Use-Pty=0', '-o', 'DPkg::Lock::Timeout=120', ...pkgs]
  const root = typeof process.getuid === 'function' && process.getuid() === 0
  const sudo = root ? '' : 'sudo '
  const hint = `${addArch.map((a) => `${sudo}dpkg --add-architecture ${a} && `).join('')}${addArch.length ? `${sudo}apt-get update && ` : ''}${sudo}apt-get install -y --no-install-recommends ${pkgs.join(' ')}`
  const apt = toolPath('apt-get')

  if (!apt || !root) {
    const how = apt
      ? `run \`${hint}\``
      : `install them (Debian packages: ${pkgs.join(' ')}) or put them on PATH`
    process.stderr.write(`provision: ${needs} ${missing.length === 1 ? 'needs' : 'need'} ${names}, which ${missing.length === 1 ? 'is' : 'are'} not on this machine: ${how}, then ${again} again.\n`)
    return dryRun ? 0 : 1
  }

  if (dryRun) {
    const pre = addArch.map((a) => `dpkg --add-architecture ${a}; `).join('')
    process.stdout.write(`provision: missing ${names}; would run: ${pre}apt-get update -qq; apt-get ${installArgs.join(' ')}\n`)
    return 0
  }

  process.stdout.write(`provision: installing ${pkgs.join(' ')} (for ${names}) with apt-get\n`)
  for (const arch of addArch) {
    const added = run('dpkg', ['--add-architecture', arch], 30_000)
    if (!added.ok) {
      process.stderr.write(`${added.out.trim()}\nprovision: dpkg --add-architecture ${arch} failed: run \`${hint}\`, then ${again} again.\n`)
      return 1
    }
  }
  const update = run(apt, ['update', '-qq', '-o', 'DPkg::Lock::Timeout=120'], APT_UPDATE_MS)
  let install = update.ok ? run(apt, installArgs, APT_INSTALL_MS) : null
  const failed = !update.ok ? update : !install.ok ? install : null
  if (failed) {
    const tail = failed.out.trim().split('\n').slice(-15).join('\n')
    if (tail) process.stderr.write(`${tail}\n`)
    const why = failed.timedOut ? 'timed out' : failed.error ? failed.error.message : 'failed'
    process.stderr.write(`provision: apt-get ${failed === update ? 'update' : 'install'} ${why}: run \`${hint}\`, then ${again} again.\n`)
    return 1
  }
  const still = missingTools()
  if (still.length) {
    process.stderr.write(`provision: ${still.map(label).join(', ')} still not found after installing ${pkgs.join(' ')}: put ${still.length === 1 ? 'it' : 'them'} in place, then ${again} again.\n`)
    return 1
  }
  process.stdout.write(`provision: installed ${pkgs.join(' ')} in ${((update.ms + install.ms) / 1000).toFixed(1)} s\n`)
  return 0
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  process.exitCode = main()
}
