// `npm run test:js`: every __test__/*.test.mjs with node's test runner (files in
// parallel), then __test__/zz-no-survivors.final.mjs on its own, last, to prove
// that no process any emulator of the run started is still alive.
// Extra arguments are passed to `node --test` (e.g. --test-name-pattern=...).
import { spawnSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { readdirSync, rmSync } from 'node:fs'
import { join, dirname } from 'node:path'
import { tmpdir } from 'node:os'
import { fileURLToPath } from 'node:url'

const root = dirname(dirname(fileURLToPath(import.meta.url)))
const testDir = join(root, '__test__')
const extra = process.argv.slice(2)
const only = extra.filter((a) => !a.startsWith('-'))
const flags = extra.filter((a) => a.startsWith('-'))

// One record directory per checkout (see __test__/helpers.mjs RECORD_DIR).
const records = join(tmpdir(), `createos-execute-test-records-${createHash('sha256').update(root).digest('hex').slice(0, 12)}`)
process.env.CREATEOS_TEST_RECORDS = records
rmSync(records, { recursive: true, force: true })

const files = only.length
  ? only
  : readdirSync(testDir).filter((f) => f.endsWith('.test.mjs')).sort().map((f) => join('__test__', f))

const run = (args) => spawnSync(process.execPath, ['--test', '--test-reporter=spec', ...flags, ...args], {
  cwd: root, stdio: 'inherit',
}).status

const first = run(files)
const last = run([join('__test__', 'zz-no-survivors.final.mjs')])
process.exitCode = first === 0 && last === 0 ? 0 : 1
