import { readFileSync } from 'node:fs'

// What the tests read of /proc, with no other dependency: imported by helpers.mjs and by
// partition-child.mjs, a plain script run in its own network namespace.

/**
 * Whether the text of `/proc/<pid>/stat` is that of a process that may still run: not a zombie
 * (Z, X) and not on its way out (PF_EXITING, 0x4, in the flags field). A SIGKILLed process lingers
 * in `exit` (R or D), and may leave its cgroup's `cgroup.procs` before it is a zombie; the
 * emulator counts it gone, and so do the tests (crates/emulator/src/procfs.rs, `Stat::live`).
 */
export function statLive(stat) {
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  if (fields[0] === 'Z' || fields[0] === 'X') return false
  return (Number(fields[6]) & 0x4) === 0
}

/** True when pid exists and may still run ({@link statLive}), whatever its marker. */
export function isAlive(pid) {
  try {
    process.kill(pid, 0)
  } catch (e) {
    return e.code === 'EPERM'
  }
  try {
    return statLive(readFileSync(`/proc/${pid}/stat`, 'utf8'))
  } catch {
    return false
  }
}
