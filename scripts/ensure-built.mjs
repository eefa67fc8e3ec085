// Builds the native addon (release) when it cannot be loaded yet, e.g. on a
// fresh clone before `npm run demo`. Does nothing when it loads.
import { createRequire } from 'node:module'
import { spawnSync } from 'node:child_process'
import { dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

const require = createRequire(import.meta.url)
const root = dirname(dirname(fileURLToPath(import.meta.url)))

try {
  require('../binding.js')
} catch {
  process.stderr.write('createos-execute: the native addon is not built yet; building it (npm run build)…\n')
  const r = spawnSync(process.platform === 'win32' ? 'npm.cmd' : 'npm', ['run', 'build'], { cwd: root, stdio: 'inherit' })
  process.exitCode = r.status === 0 ? 0 : 1
}
