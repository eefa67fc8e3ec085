// The README's first example (examples/first-host.ts) is type-checked and run, so it cannot
// rot: in a throwaway ESM project whose node_modules link to this checkout, with the strict
// settings a host uses (nodenext, strict, exactOptionalPropertyTypes), compiled by tsc and
// run on this Node; on Node ≥ 22.6 the .ts file is also run as is (--experimental-strip-types).
// The example times out a `sleep 30` after 2 s: the output so far, `timed out: true`, and no
// process of its emulator left (it ends them when it closes; the timeout ended the tree first).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ROOT } from './helpers.mjs'

const skip = process.platform === 'linux' ? false : 'the emulator runs on Linux only'
const EXAMPLE = join(ROOT, 'examples', 'first-host.ts')
let dir

before(() => {
  if (skip) return
  dir = mkdtempSync(join(tmpdir(), 'createos-example-'))
  mkdirSync(join(dir, 'src'))
  mkdirSync(join(dir, 'node_modules', '@types'), { recursive: true })
  symlinkSync(ROOT, join(dir, 'node_modules', 'createos-execute'))
  symlinkSync(join(ROOT, 'emulator'), join(dir, 'node_modules', 'createos-execute-emulator'))
  symlinkSync(join(ROOT, 'node_modules', '@types', 'node'), join(dir, 'node_modules', '@types', 'node'))
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'example-host', private: true, type: 'module' }))
  writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({
    compilerOptions: {
      target: 'ES2022', module: 'nodenext', moduleResolution: 'nodenext', strict: true,
      exactOptionalPropertyTypes: true, noUnusedLocals: true, outDir: 'dist', rootDir: 'src', types: ['node'],
    },
    include: ['src'],
  }))
  cpSync(EXAMPLE, join(dir, 'src', 'first-host.ts'))
})
after(() => { if (dir) rmSync(dir, { recursive: true, force: true }) })

function check(r) {
  assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`)
  assert.equal(r.stdout, 'hello\nexit null, timed out: true\n')
  assert.equal(r.stderr.replace(/^\(node:\d+\) ExperimentalWarning:.*\n(\(Use `node --trace-warnings.*\n)?/m, ''), '')
}

test('the README shows examples/first-host.ts and examples/diagnostics.ts verbatim', () => {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8')
  for (const file of ['first-host.ts', 'diagnostics.ts']) {
    const example = readFileSync(join(ROOT, 'examples', file), 'utf8')
    assert.ok(readme.includes(`\`\`\`ts\n${example}\`\`\``), `README.md holds examples/${file} in a \`\`\`ts block`)
  }
})

test('the README stays short, keeps its two quick-start commands, and every docs/ link resolves', async () => {
  const { existsSync } = await import('node:fs')
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8')
  assert.ok(readme.split('\n').length <= 250, `README.md has ${readme.split('\n').length} lines`)
  assert.ok(readme.includes('```sh\nnpm ci && npm run demo\nnpm test\n```'), 'the quick start is the two commands')
  for (const [, target] of readme.matchAll(/\]\((docs\/[^)#]+)(#[^)]*)?\)/g)) assert.ok(existsSync(join(ROOT, target)), target)
})

test('the first example type-checks under strict nodenext and runs', { skip, timeout: 120_000 }, () => {
  execFileSync(process.execPath, [join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', dir], { cwd: dir, encoding: 'utf8' })
  check(spawnSync(process.execPath, [join(dir, 'dist', 'first-host.js')], { cwd: dir, encoding: 'utf8', timeout: 60_000 }))
})

const [major, minor] = process.versions.node.split('.').map(Number)
const stripTypes = major > 22 || (major === 22 && minor >= 6)
test('the first example runs as TypeScript source (Node ≥ 22.6)', { skip: skip || (stripTypes ? false : 'needs Node ≥ 22.6'), timeout: 120_000 }, () => {
  check(spawnSync(process.execPath, ['--experimental-strip-types', join(dir, 'src', 'first-host.ts')], { cwd: dir, encoding: 'utf8', timeout: 60_000 }))
})
