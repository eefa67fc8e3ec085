// Installed as a host installs it (issue 13 §3): the packed tarballs of the main package,
// its linux-x64-gnu platform package and the emulator package (with its platform package)
// go into a fresh ESM TypeScript project ("type": "module", moduleResolution nodenext),
// which type-checks and compiles a file importing the package, then runs it: a command
// against the emulator. Without the platform package, loading fails with a clear error.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ROOT } from './helpers.mjs'

const MAIN_NODE = join(ROOT, 'createos-execute.linux-x64-gnu.node')
const EMU_NODE = join(ROOT, 'emulator', 'createos-execute-emulator.linux-x64-gnu.node')
const supported = process.platform === 'linux' && process.arch === 'x64' && existsSync(MAIN_NODE) && existsSync(EMU_NODE)
const skip = supported ? false : 'needs linux-x64 and the built addons (npm run build:test, npm run build:emulator)'

let work
const npm = (args, cwd) => execFileSync('npm', [...args, '--no-audit', '--no-fund', '--loglevel=error'], {
  cwd, encoding: 'utf8', env: { ...process.env, npm_config_update_notifier: 'false' },
})

/** `npm pack` of `dir` into `work`; returns the tarball's path. */
function pack(dir) {
  const [info] = JSON.parse(npm(['pack', '--json', '--pack-destination', work], dir))
  return join(work, info.filename)
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
before(() => {
  if (skip) return
  work = mkdtempSync(join(tmpdir(), 'createos-install-'))
  tarballs = {
    main: pack(ROOT),
    platform: platformPackage(join(ROOT, 'npm', 'linux-x64-gnu'), MAIN_NODE, 'platform'),
    emulator: pack(join(ROOT, 'emulator')),
    emulatorPlatform: platformPackage(join(ROOT, 'emulator', 'npm', 'linux-x64-gnu'), EMU_NODE, 'emulator-platform'),
  }
})
after(() => { if (work) rmSync(work, { recursive: true, force: true }) })

test('the main package ships no emulator file and no native binary', { skip }, () => {
  const [info] = JSON.parse(npm(['pack', '--dry-run', '--json'], ROOT))
  const paths = info.files.map((f) => f.path)
  assert.ok(paths.includes('index.js') && paths.includes('index.d.ts') && paths.includes('binding.js'), paths.join(','))
  assert.deepEqual(paths.filter((p) => /emulator/i.test(p)), [])
  assert.deepEqual(paths.filter((p) => p.endsWith('.node')), [])
  assert.deepEqual(paths.filter((p) => p.startsWith('__test__') || p.startsWith('src/') || p.startsWith('crates/')), [])
})

function project(name, packages) {
  const dir = join(work, name)
  mkdirSync(join(dir, 'src'), { recursive: true })
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name, version: '1.0.0', private: true, type: 'module' }))
  writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({
    compilerOptions: {
      target: 'ES2022', module: 'nodenext', moduleResolution: 'nodenext', strict: true,
      outDir: 'dist', rootDir: 'src', types: ['node'], typeRoots: [join(ROOT, 'node_modules', '@types')],
      skipLibCheck: false,
    },
    include: ['src'],
  }))
  npm(['install', '--offline', ...packages], dir)
  return dir
}

const HOST_FILE = `import { execute, shellQuote, CreateosCleanupError, type ExecuteResult } from "createos-execute";
import { startEmulator } from "createos-execute-emulator";

const emu = await startEmulator({ rateLimitPerMinute: null });
try {
  const sandboxId = emu.createSandbox();
  const client = { config: { apiUrl: emu.url, timeoutMs: 10_000, pacing: "off" as const }, apiKey: emu.apiKey };
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

test('a fresh ESM TypeScript project installs the tarballs, type-checks, and runs a command', { skip, timeout: 240_000 }, () => {
  const dir = project('host', Object.values(tarballs))
  writeFileSync(join(dir, 'src', 'main.ts'), HOST_FILE)
  // The repo's own TypeScript, with this test's node.
  const tsc = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc')
  execFileSync(process.execPath, [tsc, '-p', dir], { cwd: dir, encoding: 'utf8' })
  // The installed package resolves its platform package (no .node of its own).
  assert.equal(existsSync(join(dir, 'node_modules', 'createos-execute', 'createos-execute.linux-x64-gnu.node')), false)
  assert.ok(existsSync(join(dir, 'node_modules', 'createos-execute-linux-x64-gnu', 'createos-execute.linux-x64-gnu.node')))
  const out = execFileSync(process.execPath, [join(dir, 'dist', 'main.js')], { cwd: dir, encoding: 'utf8', timeout: 60_000 })
  const { result, kinds, cleanupClass, live } = JSON.parse(out.trim().split('\n').pop())
  assert.equal(result.exitCode, 0)
  assert.equal(result.stdout, "it's installed\n")
  assert.equal(result.stderr, `${process.version}\n`)
  assert.equal(result.timedOut, false)
  assert.ok(kinds.includes('POST') && kinds.includes('GET'), kinds.join(','))
  assert.equal(cleanupClass, 'function')
  assert.deepEqual(live, [])
})

test('a type error in the host file fails the type check', { skip, timeout: 120_000 }, () => {
  const dir = join(work, 'host')
  writeFileSync(join(dir, 'src', 'bad.ts'), `import { execute } from "createos-execute";
void execute({ config: { apiUrl: "x" } }, { lease: { providerLeaseId: "s" } });
`)
  const tsc = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc')
  assert.throws(() => execFileSync(process.execPath, [tsc, '-p', dir, '--noEmit'], { cwd: dir, encoding: 'utf8', stdio: 'pipe' }),
    (e) => /bad\.ts.*command/s.test(String(e.stdout)))
  rmSync(join(dir, 'src', 'bad.ts'))
})

test('without the platform package, loading names the platform and what to install', { skip, timeout: 120_000 }, () => {
  const dir = project('no-platform', [tarballs.main])
  writeFileSync(join(dir, 'load.mjs'), `try { await import("createos-execute"); console.log("loaded") } catch (e) { console.log(JSON.stringify({ message: e.message, code: e.code, cause: Boolean(e.cause) })) }`)
  const out = execFileSync(process.execPath, [join(dir, 'load.mjs')], { cwd: dir, encoding: 'utf8' }).trim()
  const { message, code, cause } = JSON.parse(out)
  assert.equal(code, 'CREATEOS_NATIVE_MISSING')
  assert.match(message, /no native binary for linux-x64-gnu/)
  assert.match(message, /createos-execute-linux-x64-gnu/)
  assert.ok(cause)
  assert.equal(readFileSync(join(dir, 'node_modules', 'createos-execute', 'package.json'), 'utf8').includes('"createos-execute"'), true)
})
