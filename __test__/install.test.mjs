// Installed from a checkout as the README says, offline: `npm run pack:local` writes the root
// tarball and this platform's package tarball (and the emulator's pair); a fresh ESM
// TypeScript project ("type": "module", nodenext, strict, exactOptionalPropertyTypes) installs
// them, then `npm ci` reinstalls from its lockfile. npm runs with `--offline`, an empty cache
// of its own and an unreachable registry, so nothing comes from the network. The project
// type-checks, compiles and runs examples/first-host.ts and a second host file. Without the
// platform packages, loading fails with a code and the package to install, and
// `createos-exec` prints one line and exits 1.
// linux-arm64: `pack:local --target aarch64-unknown-linux-gnu` packs what `npm run build:arm64`
// built; an arm64 npm (the pinned arm64 node under qemu, so npm sees an arm64 machine) installs
// the tarballs into the same kind of host, and the arm64 node runs its first example. Skipped,
// with the reason, without the arm64 addons or qemu; CREATEOS_EXPECT_ARM64=1 (.ci/run's arm64
// leg) turns that skip into a failure.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, realpathSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ROOT } from './helpers.mjs'
import { pinnedNode } from '../scripts/test-arm64.mjs'

const MAIN_NODE = join(ROOT, 'createos-execute.linux-x64-gnu.node')
const EMU_NODE = join(ROOT, 'emulator', 'createos-execute-emulator.linux-x64-gnu.node')
const supported = process.platform === 'linux' && process.arch === 'x64' && existsSync(MAIN_NODE) && existsSync(EMU_NODE)
const skip = supported ? false : 'needs linux-x64 and the built addons (npm run build:test, npm run build:emulator)'
const TSC = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc')

const ARM64_MAIN_NODE = join(ROOT, 'createos-execute.linux-arm64-gnu.node')
const ARM64_EMU_NODE = join(ROOT, 'emulator', 'createos-execute-emulator.linux-arm64-gnu.node')
const QEMU = '/usr/bin/qemu-aarch64-static'
const arm64Reason = process.platform !== 'linux' || process.arch !== 'x64' ? 'runs arm64 under qemu on an x64 Linux machine'
  : !existsSync(ARM64_MAIN_NODE) || !existsSync(ARM64_EMU_NODE) ? 'the arm64 addons are not built (npm run build:arm64)'
    : !existsSync(QEMU) ? 'qemu-aarch64-static is missing (npm run provision:arm64)'
      : null
const expectArm64 = process.env.CREATEOS_EXPECT_ARM64 === '1'
const skipArm64 = expectArm64 ? false : arm64Reason ?? false

// napi's platform names of the Rust targets (`napi pre-publish` names the packages so).
const PLATFORM = {
  'x86_64-unknown-linux-gnu': 'linux-x64-gnu',
  'x86_64-unknown-linux-musl': 'linux-x64-musl',
  'aarch64-unknown-linux-gnu': 'linux-arm64-gnu',
  'x86_64-apple-darwin': 'darwin-x64',
  'aarch64-apple-darwin': 'darwin-arm64',
  'x86_64-pc-windows-msvc': 'win32-x64-msvc',
}

let work
let cache
const npm = (args, cwd) => execFileSync('npm', [
  ...args, '--no-audit', '--no-fund', '--loglevel=error', '--offline', `--cache=${cache}`, '--registry=http://127.0.0.1:9/',
], { cwd, encoding: 'utf8', env: { ...process.env, npm_config_update_notifier: 'false' } })

/** The package.json inside a tarball. */
const tarManifest = (tarball) => JSON.parse(execFileSync('tar', ['xzfO', tarball, 'package/package.json'], { encoding: 'utf8' }))

let tarballs
before(() => {
  if (skip) return
  work = mkdtempSync(join(tmpdir(), 'createos-install-'))
  cache = join(work, 'npm-cache')
  // The one command a user runs in a checkout (README, Install).
  const out = execFileSync('npm', ['run', '--silent', 'pack:local', '--', '--out', join(work, 'packed'), '--json'], {
    cwd: ROOT, encoding: 'utf8', env: { ...process.env, npm_config_update_notifier: 'false' },
  })
  const packed = JSON.parse(out.trim().split('\n').pop())
  tarballs = {
    main: packed.main.root,
    platform: packed.main.platform,
    emulator: packed.emulator.root,
    emulatorPlatform: packed.emulator.platform,
  }
})
after(() => { if (work) rmSync(work, { recursive: true, force: true }) })

test('the main package ships no emulator file and no native binary', { skip }, () => {
  const [info] = JSON.parse(npm(['pack', '--dry-run', '--json'], ROOT))
  const paths = info.files.map((f) => f.path)
  assert.ok(paths.includes('index.js') && paths.includes('index.d.ts') && paths.includes('binding.js'), paths.join(','))
  // index.js wires the modules under lib/: each is shipped.
  const libFiles = readdirSync(join(ROOT, 'lib')).filter((f) => f.endsWith('.js')).map((f) => `lib/${f}`)
  assert.ok(libFiles.length > 0)
  assert.deepEqual(libFiles.filter((f) => !paths.includes(f)), [])
  assert.deepEqual(paths.filter((p) => /emulator/i.test(p)), [])
  assert.deepEqual(paths.filter((p) => p.endsWith('.node')), [])
  assert.deepEqual(paths.filter((p) => p.startsWith('__test__') || p.startsWith('src/') || p.startsWith('crates/') || p.startsWith('examples/') || p.startsWith('scripts/')), [])
})

test('every napi target has a platform package manifest at the version; pack:local\'s root depends on this platform\'s', { skip }, () => {
  for (const dir of [ROOT, join(ROOT, 'emulator')]) {
    const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'))
    const dirs = readdirSync(join(dir, 'npm')).sort()
    assert.deepEqual(manifest.napi.targets.map((t) => PLATFORM[t]).sort(), dirs, manifest.name)
    for (const platform of dirs) {
      const template = JSON.parse(readFileSync(join(dir, 'npm', platform, 'package.json'), 'utf8'))
      assert.equal(template.name, `${manifest.name}-${platform}`)
      assert.equal(template.version, manifest.version)
    }
  }
  const root = tarManifest(tarballs.main)
  assert.deepEqual(root.optionalDependencies, { 'createos-execute-linux-x64-gnu': root.version })
  const emulatorRoot = tarManifest(tarballs.emulator)
  assert.deepEqual(emulatorRoot.optionalDependencies, { 'createos-execute-emulator-linux-x64-gnu': root.version })
  // What an installed package uses, nothing of the checkout's tooling.
  for (const m of [root, emulatorRoot, tarManifest(tarballs.platform), tarManifest(tarballs.emulatorPlatform)]) {
    assert.equal(m.scripts, undefined, m.name)
    assert.equal(m.devDependencies, undefined, m.name)
    assert.equal(m.workspaces, undefined, m.name)
  }
  const platform = tarManifest(tarballs.platform)
  assert.equal(platform.name, 'createos-execute-linux-x64-gnu')
  assert.equal(platform.main, 'createos-execute.linux-x64-gnu.node')
})

/** A fresh ESM TypeScript project (strict, nodenext, exactOptionalPropertyTypes). */
function project(name) {
  const dir = join(work, name)
  mkdirSync(join(dir, 'src'), { recursive: true })
  const manifest = { name, version: '1.0.0', private: true, type: 'module' }
  writeFileSync(join(dir, 'package.json'), JSON.stringify(manifest, null, 2))
  writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({
    compilerOptions: {
      target: 'ES2022', module: 'nodenext', moduleResolution: 'nodenext', strict: true,
      exactOptionalPropertyTypes: true, outDir: 'dist', rootDir: 'src', types: ['node'],
      typeRoots: [join(ROOT, 'node_modules', '@types')], skipLibCheck: false,
    },
    include: ['src'],
  }))
  return dir
}

const HOST_FILE = `import { execute, shellQuote, CreateosCleanupError, type ExecuteResult } from "createos-execute";
import { startEmulator } from "createos-execute-emulator";

const emu = await startEmulator({ rateLimitPerMinute: null });
try {
  const sandboxId = emu.createSandbox();
  const client = { config: { apiUrl: emu.url, timeoutMs: 10_000, pacing: "off" as const, region: "eu" }, apiKey: emu.apiKey };
  const result: ExecuteResult = await execute(client, {
    lease: { providerLeaseId: sandboxId },
    command: "/bin/bash",
    args: ["-c", \`echo \${shellQuote("it's installed")}; echo \${process.version} >&2\`],
  }, AbortSignal.timeout(10_000));
  const kinds = emu.requests().map((r) => r.method);
  console.log(JSON.stringify({ result, kinds, cleanupClass: typeof CreateosCleanupError, live: emu.livePids() }));
} finally {
  await emu.close();
}
`

const run = (dir, file) => spawnSync(process.execPath, [join(dir, 'dist', file)], { cwd: dir, encoding: 'utf8', timeout: 60_000 })

let hostDir
test('a fresh ESM TypeScript project installs the pack:local tarballs offline (and npm ci from its lockfile) and runs the first example', { skip, timeout: 240_000 }, () => {
  hostDir = project('host')
  npm(['install', tarballs.main, tarballs.platform], hostDir)
  npm(['install', '--save-dev', tarballs.emulator, tarballs.emulatorPlatform], hostDir)
  const manifest = JSON.parse(readFileSync(join(hostDir, 'package.json'), 'utf8'))
  assert.deepEqual(Object.keys(manifest.dependencies).sort(), ['createos-execute', 'createos-execute-linux-x64-gnu'])
  assert.deepEqual(Object.keys(manifest.devDependencies).sort(), ['createos-execute-emulator', 'createos-execute-emulator-linux-x64-gnu'])
  // A Docker build's `npm ci`: the lockfile alone, offline.
  rmSync(join(hostDir, 'node_modules'), { recursive: true, force: true })
  npm(['ci'], hostDir)
  // The binary is in the platform package, not in the root.
  assert.equal(existsSync(join(hostDir, 'node_modules', 'createos-execute', 'createos-execute.linux-x64-gnu.node')), false)
  assert.ok(existsSync(join(hostDir, 'node_modules', 'createos-execute-linux-x64-gnu', 'createos-execute.linux-x64-gnu.node')))
  assert.ok(existsSync(join(hostDir, 'node_modules', 'createos-execute-emulator-linux-x64-gnu')))
  assert.equal(existsSync(join(hostDir, 'node_modules', 'createos-execute-darwin-arm64')), false)

  cpSync(join(ROOT, 'examples', 'first-host.ts'), join(hostDir, 'src', 'first-host.ts'))
  writeFileSync(join(hostDir, 'src', 'main.ts'), HOST_FILE)
  execFileSync(process.execPath, [TSC, '-p', hostDir], { cwd: hostDir, encoding: 'utf8' })

  const example = run(hostDir, 'first-host.js')
  assert.equal(example.status, 0, example.stderr)
  assert.match(example.stdout, /^hello\n/)
  assert.match(example.stdout, /timed out: true/)

  const host = run(hostDir, 'main.js')
  assert.equal(host.status, 0, host.stderr)
  const { result, kinds, cleanupClass, live } = JSON.parse(host.stdout.trim().split('\n').pop())
  assert.equal(result.exitCode, 0)
  assert.equal(result.stdout, "it's installed\n")
  assert.equal(result.stderr, `${process.version}\n`)
  assert.equal(result.timedOut, false)
  assert.ok(kinds.includes('POST') && kinds.includes('GET'), kinds.join(','))
  assert.equal(cleanupClass, 'function')
  assert.deepEqual(live, [])
})

test('a type error in the host file fails the type check', { skip, timeout: 120_000 }, () => {
  assert.ok(hostDir, 'the install test ran')
  writeFileSync(join(hostDir, 'src', 'bad.ts'), `import { execute } from "createos-execute";
void execute({ config: { apiUrl: "x" } }, { lease: { providerLeaseId: "s" } });
`)
  assert.throws(() => execFileSync(process.execPath, [TSC, '-p', hostDir, '--noEmit'], { cwd: hostDir, encoding: 'utf8', stdio: 'pipe' }),
    (e) => /bad\.ts.*command/s.test(String(e.stdout)))
  rmSync(join(hostDir, 'src', 'bad.ts'))
})

test('without the platform packages: a code naming the package to install, and one line from createos-exec', { skip, timeout: 120_000 }, () => {
  const dir = project('no-platform')
  npm(['install', tarballs.main], dir)
  npm(['install', '--save-dev', tarballs.emulator], dir)
  assert.equal(existsSync(join(dir, 'node_modules', 'createos-execute-linux-x64-gnu')), false)
  writeFileSync(join(dir, 'load.mjs'), `const out = {};
for (const name of ["createos-execute", "createos-execute-emulator"]) {
  try { await import(name); out[name] = "loaded" } catch (e) { out[name] = { message: e.message, code: e.code, cause: Boolean(e.cause) } }
}
console.log(JSON.stringify(out))`)
  const out = JSON.parse(execFileSync(process.execPath, [join(dir, 'load.mjs')], { cwd: dir, encoding: 'utf8' }).trim())
  const main = out['createos-execute']
  assert.equal(main.code, 'CREATEOS_NATIVE_MISSING')
  assert.match(main.message, /no native binary for linux-x64-gnu/)
  assert.match(main.message, /createos-execute-linux-x64-gnu/)
  assert.ok(main.cause)
  const emu = out['createos-execute-emulator']
  assert.equal(emu.code, 'CREATEOS_NATIVE_MISSING')
  assert.match(emu.message, /createos-execute-emulator-linux-x64-gnu/)
  assert.doesNotMatch(emu.message, /npm has a bug/)

  const cli = spawnSync(join(dir, 'node_modules', '.bin', 'createos-exec'), ['--local', '--', 'echo', 'hi'], { cwd: dir, encoding: 'utf8', timeout: 30_000 })
  assert.equal(cli.status, 1, cli.stderr)
  assert.equal(cli.stdout, '')
  const lines = cli.stderr.trimEnd().split('\n')
  assert.equal(lines.length, 1, cli.stderr)
  assert.match(lines[0], /^createos-exec: createos-execute: no native binary for linux-x64-gnu .*createos-execute-linux-x64-gnu/)
})

test('linux-arm64: pack:local --target packs the arm64 pair; an arm64 npm installs them into a strict TypeScript host and the first example runs under qemu', { skip: skipArm64, timeout: 900_000 }, () => {
  if (arm64Reason) assert.fail(`CREATEOS_EXPECT_ARM64=1, but ${arm64Reason}`)
  // The x64 cases' before() made these, unless they are skipped (no x64 build).
  work ??= mkdtempSync(join(tmpdir(), 'createos-install-'))
  cache ??= join(work, 'npm-cache')
  const out = execFileSync('npm', ['run', '--silent', 'pack:local', '--', '--out', join(work, 'packed-arm64'), '--target', 'aarch64-unknown-linux-gnu', '--json'], {
    cwd: ROOT, encoding: 'utf8', env: { ...process.env, npm_config_update_notifier: 'false' },
  })
  const packed = JSON.parse(out.trim().split('\n').pop())
  const root = tarManifest(packed.main.root)
  assert.deepEqual(root.optionalDependencies, { 'createos-execute-linux-arm64-gnu': root.version })
  assert.deepEqual(tarManifest(packed.emulator.root).optionalDependencies, { 'createos-execute-emulator-linux-arm64-gnu': root.version })
  for (const [tarball, name] of [[packed.main.platform, 'createos-execute'], [packed.emulator.platform, 'createos-execute-emulator']]) {
    const m = tarManifest(tarball)
    assert.equal(m.name, `${name}-linux-arm64-gnu`)
    assert.equal(m.main, `${name}.linux-arm64-gnu.node`)
    assert.deepEqual(m.cpu, ['arm64'])
    assert.equal(m.scripts, undefined)
  }

  // npm itself on the arm64 node, so its platform checks see an arm64 machine.
  const node = pinnedNode()
  const npmCli = realpathSync(execFileSync('sh', ['-c', 'command -v npm'], { encoding: 'utf8' }).trim())
  const npmArm64 = (args, cwd) => execFileSync(QEMU, [node, npmCli,
    ...args, '--no-audit', '--no-fund', '--loglevel=error', '--offline', `--cache=${cache}`, '--registry=http://127.0.0.1:9/',
  ], { cwd, encoding: 'utf8', timeout: 300_000, env: { ...process.env, npm_config_update_notifier: 'false' } })
  const dir = project('host-arm64')
  npmArm64(['install', packed.main.root, packed.main.platform], dir)
  npmArm64(['install', '--save-dev', packed.emulator.root, packed.emulator.platform], dir)
  rmSync(join(dir, 'node_modules'), { recursive: true, force: true })
  npmArm64(['ci'], dir)
  assert.ok(existsSync(join(dir, 'node_modules', 'createos-execute-linux-arm64-gnu', 'createos-execute.linux-arm64-gnu.node')))
  assert.ok(existsSync(join(dir, 'node_modules', 'createos-execute-emulator-linux-arm64-gnu', 'createos-execute-emulator.linux-arm64-gnu.node')))
  assert.equal(existsSync(join(dir, 'node_modules', 'createos-execute-linux-x64-gnu')), false)

  cpSync(join(ROOT, 'examples', 'first-host.ts'), join(dir, 'src', 'first-host.ts'))
  execFileSync(process.execPath, [TSC, '-p', dir], { cwd: dir, encoding: 'utf8' })
  const example = spawnSync(QEMU, [node, join(dir, 'dist', 'first-host.js')], { cwd: dir, encoding: 'utf8', timeout: 180_000 })
  assert.equal(example.status, 0, `${example.stderr}${example.error ?? ''}`)
  assert.match(example.stdout, /^hello\n/)
  assert.match(example.stdout, /timed out: true/)
})
