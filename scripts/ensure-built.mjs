// Builds the native addons (release) when they cannot be loaded yet, e.g. on a
// fresh clone before `npm run demo`: the main addon and the emulator package's.
// Does nothing when both load.
import { createRequire } from 'node:module'
import { spawnSync } from 'node:child_process'
import { dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

const require = createRequire(import.meta.url)
const root = dirname(dirname(fileURLToPath(import.meta.url)))
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm'

for (const [what, script] of [['../binding.js', 'build'], ['../emulator/binding.js', 'build:emulator']]) {
  try {
    require(what)
  } catch {
    process.stderr.write(`createos-execute: a native addon is not built yet; building it (npm run ${script})…\n`)
    const r = spawnSync(npm, ['run', script], { cwd: root, stdio: 'inherit' })
    if (r.status !== 0) {
      process.exitCode = 1
      break
    }
  }
}
