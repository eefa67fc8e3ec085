// `npm run check:versions`: every package of this repository carries one version —
// package.json's. The platform packages (npm/*, emulator/npm/*), the emulator package,
// the main package's devDependency on it, and the Cargo workspace all follow it.
// `napi version` writes the npm ones on a release; this check keeps a hand edit from drifting.
import { readFileSync, readdirSync, existsSync } from 'node:fs'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = dirname(dirname(fileURLToPath(import.meta.url)))
const read = (p) => JSON.parse(readFileSync(join(root, p), 'utf8'))
const want = read('package.json').version
const bad = []
const check = (what, got) => { if (got !== want) bad.push(`${what}: ${got} (want ${want})`) }

for (const dir of ['npm', 'emulator/npm']) {
  for (const name of readdirSync(join(root, dir))) {
    const p = join(dir, name, 'package.json')
    if (existsSync(join(root, p))) check(p, read(p).version)
  }
}
check('emulator/package.json', read('emulator/package.json').version)
check('package.json devDependencies.createos-execute-emulator', read('package.json').devDependencies['createos-execute-emulator'])
const cargo = readFileSync(join(root, 'Cargo.toml'), 'utf8')
const m = /\[workspace\.package\][^[]*?\nversion = "([^"]+)"/.exec(cargo)
check('Cargo.toml [workspace.package] version', m && m[1])

if (bad.length) {
  console.error(`versions disagree with package.json (${want}):\n  ${bad.join('\n  ')}`)
  process.exit(1)
}
console.log(`every package is at ${want}`)
