// `npm run build:arm64`: both addons for linux-arm64 (glibc), cross-built on an x64 Linux
// machine with Debian's toolchain (`npm run provision:arm64` installs it; this script installs
// nothing). Writes, next to the x64 ones, as napi's loader looks for them:
//   createos-execute.linux-arm64-gnu.node
//   emulator/createos-execute-emulator.linux-arm64-gnu.node
// Release builds without `test-hooks`, as published. The committed bindings (binding.js,
// binding.d.ts) are left alone: napi's generated declarations go to target/aarch64/.
//
// Nothing of this route reaches the native build: Debian's rustc and cargo (in /usr/bin, behind
// rustup's on PATH) and the cross linker are named only in the environment of the two napi
// commands started here, and they build into target/aarch64 (CARGO_TARGET_DIR), so rustup's
// cache in target/ is not rebuilt by another compiler. Why Debian's: rustup cannot fetch
// another target's standard library on this project's machines (docs/contributing.md).
//
// Environment: CREATEOS_ARM64_RUSTC, CREATEOS_ARM64_CARGO (default /usr/bin/rustc and
// /usr/bin/cargo), for a toolchain with the aarch64-unknown-linux-gnu standard library elsewhere.
import { spawn, spawnSync } from 'node:child_process'
import { closeSync, existsSync, openSync, readSync, statSync } from 'node:fs'
import { dirname, join, relative } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)))
const TARGET = 'aarch64-unknown-linux-gnu'
const TAG = 'linux-arm64-gnu'
const TARGET_DIR = join(ROOT, 'target', 'aarch64')
const NAPI = join(ROOT, 'node_modules', '@napi-rs', 'cli', 'dist', 'cli.js')
// A cold build of both takes about 6 minutes on 2 free cores; the bound leaves room for a
// loaded machine.
const BUILD_MS = 45 * 60_000

const rustc = process.env.CREATEOS_ARM64_RUSTC || '/usr/bin/rustc'
const cargo = process.env.CREATEOS_ARM64_CARGO || '/usr/bin/cargo'

const fail = (message) => {
  process.stderr.write(`build:arm64: ${message}\n`)
  process.exit(1)
}

function onPath(bin) {
  return (process.env.PATH || '').split(':').some((dir) => dir && existsSync(join(dir, bin)))
}

/** What is missing for the cross build, as short phrases. */
function missing() {
  const out = []
  if (!existsSync(rustc) || !existsSync(cargo)) out.push(`${rustc} and ${cargo}`)
  else {
    const sysroot = spawnSync(rustc, ['--print', 'sysroot'], { encoding: 'utf8', timeout: 30_000 }).stdout?.trim()
    if (!sysroot || !existsSync(join(sysroot, 'lib', 'rustlib', TARGET, 'lib'))) out.push(`the ${TARGET} standard library of ${rustc}`)
  }
  for (const bin of ['aarch64-linux-gnu-gcc', 'aarch64-linux-gnu-ar']) if (!onPath(bin)) out.push(bin)
  if (!existsSync('/usr/aarch64-linux-gnu/lib/crt1.o')) out.push('the aarch64 glibc (libc6-dev-arm64-cross)')
  return out
}

/** true when `file` is a 64-bit little-endian ELF for aarch64 (e_machine 183). */
function isAarch64Elf(file) {
  const buf = Buffer.alloc(20)
  const fd = openSync(file, 'r')
  try {
    readSync(fd, buf, 0, 20, 0)
  } finally {
    closeSync(fd)
  }
  return buf.readUInt32BE(0) === 0x7f454c46 && buf[4] === 2 && buf[5] === 1 && buf.readUInt16LE(18) === 183
}

function napiBuild(cwd, binaryName, env) {
  const args = [NAPI, 'build', '--platform', '--release', '--target', TARGET, '--no-js',
    // napi takes --dts relative to the crate's directory, even an absolute one
    '--dts', relative(cwd, join(TARGET_DIR, `${binaryName}.d.ts`))]
  return new Promise((resolve) => {
    const child = spawn(process.execPath, args, { cwd, env, stdio: 'inherit' })
    const timer = setTimeout(() => {
      process.stderr.write(`build:arm64: ${binaryName} took longer than ${BUILD_MS / 60_000} min; stopping it\n`)
      child.kill('SIGTERM')
    }, BUILD_MS)
    child.on('exit', (code, signal) => {
      clearTimeout(timer)
      resolve(code === 0 ? null : `napi build of ${binaryName} ${signal ? `ended by ${signal}` : `exited ${code}`}`)
    })
    child.on('error', (error) => {
      clearTimeout(timer)
      resolve(error.message)
    })
  })
}

if (process.platform !== 'linux' || process.arch !== 'x64') {
  fail(`cross-builds from x64 Linux only (this is ${process.platform}-${process.arch})`)
}
const lacking = missing()
if (lacking.length) {
  fail(`missing ${lacking.join(', ')}: run \`npm run provision:arm64\` (as root; it installs Debian's packages), then \`npm run build:arm64\` again`)
}

const env = {
  ...process.env,
  RUSTC: rustc,
  CARGO: cargo,
  CARGO_TARGET_DIR: TARGET_DIR,
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER: 'aarch64-linux-gnu-gcc',
  // ring's C and assembly
  CC_aarch64_unknown_linux_gnu: 'aarch64-linux-gnu-gcc',
  AR_aarch64_unknown_linux_gnu: 'aarch64-linux-gnu-ar',
}
// A toolchain that rustup chose for this shell would not be Debian's.
delete env.RUSTUP_TOOLCHAIN

const version = spawnSync(rustc, ['--version'], { encoding: 'utf8' }).stdout.trim()
process.stdout.write(`build:arm64: ${TARGET} with ${version}, into ${relative(ROOT, TARGET_DIR)}/\n`)
const t0 = Date.now()
const built = []
for (const [dir, binaryName] of [[ROOT, 'createos-execute'], [join(ROOT, 'emulator'), 'createos-execute-emulator']]) {
  const t = Date.now()
  const error = await napiBuild(dir, binaryName, env)
  if (error) fail(error)
  const file = join(dir, `${binaryName}.${TAG}.node`)
  if (!existsSync(file) || !isAarch64Elf(file)) fail(`${relative(ROOT, file)} is missing or not an aarch64 binary after the build`)
  built.push(`  ${relative(ROOT, file)} (${(statSync(file).size / 1e6).toFixed(1)} MB, ${((Date.now() - t) / 1000).toFixed(0)} s)`)
}
process.stdout.write(`build:arm64: built in ${((Date.now() - t0) / 1000).toFixed(0)} s:\n${built.join('\n')}\n`)
