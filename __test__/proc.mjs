// What the tests read of /proc, with no other dependency: partition-child.mjs, a plain script
// run in its own network namespace, imports it as well as helpers.mjs.

/**
 * Whether the text of `/proc/<pid>/stat` is that of a process that may still run: not a zombie
 * (Z, X) and not on its way out (PF_EXITING, 0x4, in the flags field). A SIGKILLed process lingers
 * a moment in `exit` (R or D) after it left its cgroup's `cgroup.procs`; the emulator's scan
 * counts it gone, and so do the tests (crates/emulator/src/procfs.rs, `Stat::live`).
 */
export function statLive(stat) {
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  if (fields[0] === 'Z' || fields[0] === 'X') return false
  return (Number(fields[6]) & 0x4) === 0
}
