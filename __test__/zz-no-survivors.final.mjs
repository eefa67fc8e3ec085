// Runs after every other test file (package.json runs it as a separate, last
// step, because test files run in parallel): proves that no process started by
// any emulator of this test run is still alive.
//   - every pid each test file saw (sampled from emu.livePids()) is gone, and
//   - no live process on this machine belongs to a tree of an emulator instance
//     the tests used (by its cgroup, or by its marker), or to any emulator's tree
//     and started after the test run began (this covers the CLI and demo
//     subprocesses' emulators), and
//   - no cgroup of an emulator instance the tests used is left.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { rmSync } from 'node:fs'
import { readRecords, isMarkedAlive, markedProcesses, emulatorCgroupDirs, RECORD_DIR, sleep } from './helpers.mjs'

test('no process started by the emulator survived the test run', async () => {
  const records = readRecords()
  assert.ok(records.length > 0, `no test file left a record in ${RECORD_DIR}: did the suite run?`)
  const runStart = Math.min(...records.map((r) => r.startedAt)) - 5000
  const pids = new Set(records.flatMap((r) => r.pids))
  const instances = new Set(records.flatMap((r) => r.instances))
  // A moment for any last reaping.
  await sleep(100)
  const survivors = [...pids].filter((pid) => isMarkedAlive(pid))
  assert.deepEqual(survivors, [], 'pids seen during the tests are still alive')
  const marked = markedProcesses().filter((p) => instances.has(p.mark.split(':')[0]) || p.startMs >= runStart)
  assert.deepEqual(marked, [], 'processes of an emulator tree from this run are still alive')
  const cgroups = emulatorCgroupDirs().filter((d) => instances.has(d.instance))
  assert.deepEqual(cgroups, [], 'cgroups of emulators from this run are left')
  process.stdout.write(`checked ${pids.size} pids from ${records.length} test files and ${instances.size} emulator instances\n`)
  rmSync(RECORD_DIR, { recursive: true, force: true })
})
