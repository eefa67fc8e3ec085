// `npm run test:js`: every __test__/*.test.mjs with node's test runner (files in
// parallel), then the files in ALONE one at a time, then __test__/zz-no-survivors.final.mjs
// on its own, last, to prove that no process any emulator of the run started is still alive.
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

// Files that measure deadlines against real kernel timers (TCP retransmissions through a
// blackhole) run after the others, on their own, so the rest of the suite does not load the
// machine while they measure.
const ALONE = ['partition.test.mjs']

const all = readdirSync(testDir).filter((f) => f.endsWith('.test.mjs')).sort()
const files = only.length ? only : all.filter((f) => !ALONE.includes(f)).map((f) => join('__test__', f))
const alone = only.length ? [] : all.filter((f) => ALONE.includes(f)).map((f) => join('__test__', f))

const run = (args) => spawnSync(process.execPath, ['--test', '--test-reporter=spec', ...flags, ...args], {
  cwd: root, stdio: 'inherit',
}).status

const statuses = [run(files), ...alone.map((f) => run([f]))]
statuses.push(run([join('__test__', 'zz-no-survivors.final.mjs')]))
process.exitCode = statuses.every((s) => s === 0) ? 0 : 1
