// Installed as a host installs it from the registry, offline. The packed tarballs are given
// the shape publishing produces: the root package (and the emulator package) carry
// `optionalDependencies` on every platform package of `napi.targets`, as `napi pre-publish`
// writes them. A fresh ESM TypeScript project ("type": "module", nodenext, strict,
// exactOptionalPropertyTypes) then runs a plain `npm i` of the root tarball only; the
// linux-x64-gnu platform packages come from `file:` overrides, the other platforms' are
// skipped as npm skips optional dependencies it cannot get. npm runs with `--offline`, an
// empty cache of its own and an unreachable registry, so nothing comes from the network.
// The project type-checks, compiles and runs examples/first-host.ts and a second host file.
// Without the platform packages, loading fails with a code and the package to install, and
// `createos-exec` prints one line and exits 1.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ROOT } from './helpers.mjs'

const MAIN_NODE = join(ROOT, 'createos-execute.linux-x64-gnu.node')
const EMU_NODE = join(ROOT, 'emulator', 'createos-execute-emulator.linux-x64-gnu.node')
const supported = process.platform === 'linux' && process.arch === 'x64' && existsSync(MAIN_NODE) && existsSync(EMU_NODE)
const skip = supported ? false : 'needs linux-x64 and the built addons (npm run build:test, npm run build:emulator)'
const TSC = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc')

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

/** `npm pack` of `dir` into `work`; returns the tarball's path. */
function pack(dir) {
  const [info] = JSON.parse(npm(['pack', '--json', '--pack-destination', work], dir))
  return join(work, info.filename)
}

/**
 * The package at `dir` packed as it is published: `optionalDependencies` on each platform
 * package of its `napi.targets` at its version (each must have a manifest in `npm/`).
 */
function packPublished(dir, name) {
  const staged = join(work, `${name}-staged`)
  mkdirSync(staged, { recursive: true })
  execFileSync('tar', ['xzf', pack(dir), '-C', staged])
  const manifest = JSON.parse(readFileSync(join(staged, 'package', 'package.json'), 'utf8'))
  manifest.optionalDependencies = {}
  for (const target of manifest.napi.targets) {
    const platform = PLATFORM[target]
    assert.ok(platform, `a known target: ${target}`)
    const template = JSON.parse(readFileSync(join(dir, 'npm', platform, 'package.json'), 'utf8'))
    assert.equal(template.name, `${manifest.name}-${platform}`)
    assert.equal(template.version, manifest.version)
    manifest.optionalDependencies[template.name] = manifest.version
  }
  writeFileSync(join(staged, 'package', 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`)
  return { tarball: pack(join(staged, 'package')), manifest }
}

/** A platform package laid out as `napi artifacts` leaves it: its package.json and the .node. */
function platformPackage(templateDir, nodeFile, name) {
  const dir = join(work, name)
  mkdirSync(dir, { recursive: true })
  cpSync(join(templateDir, 'package.json'), join(dir, 'package.json'))
  cpSync(nodeFile, join(dir, nodeFile.split('/').pop()))
  return pack(dir)
}

let tarballs
let published
before(() => {
  if (skip) return
  work = mkdtempSync(join(tmpdir(), 'createos-install-'))
  cache = join(work, 'npm-cache')
  const main = packPublished(ROOT, 'main')
  const emulator = packPublished(join(ROOT, 'emulator'), 'emulator')
  published = { main: main.manifest, emulator: emulator.manifest }
  tarballs = {
    main: main.tarball,
    platform: platformPackage(join(ROOT, 'npm', 'linux-x64-gnu'), MAIN_NODE, 'platform'),
    emulator: emulator.tarball,
    emulatorPlatform: platformPackage(join(ROOT, 'emulator', 'npm', 'linux-x64-gnu'), EMU_NODE, 'emulator-platform'),
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
  assert.deepEqual(paths.filter((p) => p.startsWith('__test__') || p.startsWith('src/') || p.startsWith('crates/') || p.startsWith('examples/')), [])
})

test('every napi target has a platform package manifest, and the published root depends on each', { skip }, () => {
  const dirs = readdirSync(join(ROOT, 'npm')).sort()
  assert.deepEqual(published.main.napi.targets.map((t) => PLATFORM[t]).sort(), dirs)
  assert.deepEqual(Object.keys(published.main.optionalDependencies).sort(), dirs.map((d) => `createos-execute-${d}`))
  assert.deepEqual(Object.keys(published.emulator.optionalDependencies).sort(),
    readdirSync(join(ROOT, 'emulator', 'npm')).sort().map((d) => `createos-execute-emulator-${d}`))
})

/**
 * A fresh ESM TypeScript project. `overrides` maps platform package names to their tarballs:
 * what a registry would serve for this platform.
 */
function project(name, overrides) {
  const dir = join(work, name)
  mkdirSync(join(dir, 'src'), { recursive: true })
  const manifest = { name, version: '1.0.0', private: true, type: 'module' }
  if (overrides) manifest.overrides = Object.fromEntries(Object.entries(overrides).map(([k, v]) => [k, `file:${v}`]))
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
test('a fresh ESM TypeScript project installs the published shape offline and runs the first example', { skip, timeout: 240_000 }, () => {
  hostDir = project('host', {
    'createos-execute-linux-x64-gnu': tarballs.platform,
    'createos-execute-emulator-linux-x64-gnu': tarballs.emulatorPlatform,
  })
  npm(['install', tarballs.main], hostDir)
  npm(['install', '--save-dev', tarballs.emulator], hostDir)
  const manifest = JSON.parse(readFileSync(join(hostDir, 'package.json'), 'utf8'))
  assert.deepEqual(Object.keys(manifest.dependencies), ['createos-execute'])
  assert.deepEqual(Object.keys(manifest.devDependencies), ['createos-execute-emulator'])
  // The platform package came in as the root's optional dependency; no .node in the root.
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
