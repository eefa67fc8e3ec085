// `npm run test:vitest`: the host-style suite (__test__/vitest/, vitest as the plugin's own
// suite runs) on the node that runs this script, then one plain closing line, `N passed, N
// failed` (vitest's own summary is not one CI reads), from vitest's JSON report.
import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = dirname(dirname(fileURLToPath(import.meta.url)))
const dir = mkdtempSync(join(tmpdir(), 'createos-vitest-'))
const report = join(dir, 'report.json')
const run = spawnSync(process.execPath, [
  join(root, 'node_modules', 'vitest', 'vitest.mjs'), 'run',
  '--config', join(root, '__test__', 'vitest', 'vitest.config.mjs'),
  '--reporter=default', '--reporter=json', `--outputFile.json=${report}`,
  ...process.argv.slice(2),
], { cwd: root, stdio: 'inherit' })
let passed = 0
let failed = 0
try {
  const r = JSON.parse(readFileSync(report, 'utf8'))
  passed = r.numPassedTests
  failed = r.numFailedTests + (r.numRuntimeErrorTestSuites ?? 0)
} catch {
  failed = Math.max(failed, 1) // no report: the run itself failed
}
rmSync(dir, { recursive: true, force: true })
console.log(`${passed} passed, ${failed} failed`)
process.exitCode = run.status === 0 && failed === 0 ? 0 : 1
