// `npm run pack:local [-- --out DIR] [--target TRIPLE] [--no-emulator] [--json]`: installable
// tarballs from a checkout, for this machine's platform, with the binaries built here
// (`npm run build`, and `npm run build:emulator` for the emulator pair); with `--target`, for
// that Rust target's platform instead (`--target aarch64-unknown-linux-gnu` packs what
// `npm run build:arm64` built: linux-arm64-gnu):
//   createos-execute-<version>.tgz                      the root package, shaped as published
//   createos-execute-<platform>-<version>.tgz           its platform package (the .node)
//   createos-execute-emulator-<version>.tgz             the emulator, likewise (Linux only)
//   createos-execute-emulator-<platform>-<version>.tgz
// The root's optionalDependencies name this platform's package at its version (a published
// root names every platform's, as `napi pre-publish` writes them). Installing the root and the
// platform tarball together satisfies that dependency from the tarball, so
//   npm install ./createos-execute-0.1.0.tgz ./createos-execute-linux-x64-gnu-0.1.0.tgz
// works offline, and so does a later `npm ci` from its lockfile (a Docker build, CI).
// DIR defaults to the current directory. The packed root manifests carry what an installed
// package uses: no `scripts`, `devDependencies` or `workspaces` (the platform packages'
// manifests, npm/<platform>/package.json, have none).
import { execFileSync } from 'node:child_process'
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { dirname, join, relative, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)))
const { platformTag } = createRequire(import.meta.url)('../lib/platform.js')

// napi's platform names of the Rust targets (the platform packages are named so).
const PLATFORM = {
  'x86_64-unknown-linux-gnu': 'linux-x64-gnu',
  'x86_64-unknown-linux-musl': 'linux-x64-musl',
  'aarch64-unknown-linux-gnu': 'linux-arm64-gnu',
  'aarch64-unknown-linux-musl': 'linux-arm64-musl',
  'x86_64-apple-darwin': 'darwin-x64',
  'aarch64-apple-darwin': 'darwin-arm64',
  'x86_64-pc-windows-msvc': 'win32-x64-msvc',
  'aarch64-pc-windows-msvc': 'win32-arm64-msvc',
}

function usage(message) {
  process.stderr.write(`pack:local: ${message}\nusage: npm run pack:local -- [--out DIR] [--target TRIPLE] [--no-emulator] [--json]\n`)
  process.exit(2)
}

const args = process.argv.slice(2)
let out = process.env.INIT_CWD || process.cwd() // npm run sets INIT_CWD to where it was called
let emulator = true
let json = false
let tag = platformTag()
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--out') {
    if (i + 1 >= args.length) usage('--out needs a directory')
    out = args[++i]
  } else if (args[i] === '--target') {
    if (i + 1 >= args.length) usage('--target needs a Rust target triple')
    const target = args[++i]
    if (!PLATFORM[target]) usage(`unknown target ${target} (one of ${Object.keys(PLATFORM).join(', ')})`)
    tag = PLATFORM[target]
  } else if (args[i] === '--no-emulator') emulator = false
  else if (args[i] === '--json') json = true
  else usage(`unknown argument ${args[i]}`)
}
out = resolve(process.env.INIT_CWD || process.cwd(), out)
mkdirSync(out, { recursive: true })

const work = mkdtempSync(join(tmpdir(), 'createos-pack-local-'))
const npm = (argv, cwd) => execFileSync('npm', [...argv, '--loglevel=error'], {
  cwd, encoding: 'utf8', env: { ...process.env, npm_config_update_notifier: 'false' },
})

/** `npm pack` of `dir` into `dest`; returns the tarball's path. */
function pack(dir, dest) {
  const [info] = JSON.parse(npm(['pack', '--json', '--pack-destination', dest], dir))
  return join(dest, info.filename)
}

/**
 * The package at `dir` (its `files` as npm packs them) with `optionalDependencies` on each
 * platform package of its `napi.targets`, at its version; and its platform package for this
 * machine: `npm/<platform>/package.json` with the built `<binaryName>.<platform>.node`.
 */
function packPair(dir) {
  const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'))
  const binary = join(dir, `${manifest.napi.binaryName}.${tag}.node`)
  const template = join(dir, 'npm', tag)
  if (!existsSync(join(template, 'package.json'))) {
    throw new Error(`${manifest.name} has no platform package for ${tag} (no ${relative(ROOT, template)}/package.json)`)
  }
  if (!existsSync(binary)) {
    const build = tag === 'linux-arm64-gnu' && platformTag() !== tag ? 'npm run build:arm64'
      : dir === ROOT ? 'npm run build' : 'npm run build:emulator'
    throw new Error(`${relative(ROOT, binary)} is missing: build it first (${build})`)
  }
  const staged = join(work, manifest.name)
  mkdirSync(staged, { recursive: true })
  execFileSync('tar', ['xzf', pack(dir, work), '-C', staged])
  const root = join(staged, 'package')
  const packed = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'))
  // Only this machine's platform package: the tarballs are for this platform, and a lockfile
  // written from them is then complete, so `npm ci` works offline too (a registry package
  // lists every platform, which an offline install cannot resolve).
  if (!packed.napi.targets.some((target) => PLATFORM[target] === tag)) {
    throw new Error(`${packed.name} is not built for ${tag} (napi.targets)`)
  }
  packed.optionalDependencies = { [`${packed.name}-${tag}`]: packed.version }
  // Workspaces and dev tooling mean nothing to an installed package: its scripts build, test
  // and bench a checkout, and none runs at install.
  delete packed.devDependencies
  delete packed.workspaces
  delete packed.scripts
  writeFileSync(join(root, 'package.json'), `${JSON.stringify(packed, null, 2)}\n`)

  const platformDir = join(work, `${manifest.name}-${tag}`)
  mkdirSync(platformDir, { recursive: true })
  cpSync(template, platformDir, { recursive: true })
  cpSync(binary, join(platformDir, `${manifest.napi.binaryName}.${tag}.node`))
  const platformManifest = JSON.parse(readFileSync(join(platformDir, 'package.json'), 'utf8'))
  if (platformManifest.version !== packed.version) {
    throw new Error(`${platformManifest.name} is at ${platformManifest.version}, ${packed.name} at ${packed.version}`)
  }
  return { root: pack(root, out), platform: pack(platformDir, out) }
}

try {
  const result = { main: packPair(ROOT) }
  if (emulator) {
    const dir = join(ROOT, 'emulator')
    if (existsSync(join(dir, 'npm', tag))) result.emulator = packPair(dir)
    else if (!json) process.stderr.write(`pack:local: the emulator has no package for ${tag}; skipped\n`)
  }
  if (json) {
    process.stdout.write(`${JSON.stringify(result)}\n`)
  } else {
    const rel = (p) => {
      const r = relative(process.env.INIT_CWD || process.cwd(), p)
      return r.startsWith('..') || r.startsWith('/') ? p : `./${r}`
    }
    process.stdout.write(`Wrote:\n${Object.values(result).flatMap((p) => [p.root, p.platform]).map((p) => `  ${rel(p)}\n`).join('')}`)
    process.stdout.write(`Install (works offline):\n  npm install ${rel(result.main.root)} ${rel(result.main.platform)}\n`)
    if (result.emulator) process.stdout.write(`  npm install --save-dev ${rel(result.emulator.root)} ${rel(result.emulator.platform)}\n`)
  }
} catch (error) {
  process.stderr.write(`pack:local: ${error.message}\n`)
  process.exitCode = 1
} finally {
  rmSync(work, { recursive: true, force: true })
}
