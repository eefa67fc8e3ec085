// Counts processes started by the emulator, by the marker it puts in every
// process's environment (CREATEOS_EMULATOR_MARK=<instance>:<process id>).
// Each scan lists /proc and reads the environ of pids it has not seen yet, so a
// process is counted once however long it lives. A `sleep 0.01` lives at least
// 10 ms; scanning every ~2 ms sees (nearly) all of them — the calibration row of
// §6 shows how many of a known spawn rate this scanner catches.
import { readdirSync, readFileSync } from 'node:fs'

const MARK = 'CREATEOS_EMULATOR_MARK='

function markOf(pid) {
  let env
  try {
    env = readFileSync(`/proc/${pid}/environ`, 'latin1')
  } catch {
    return { mark: null, retry: false } // gone, or not ours to read
  }
  if (env.length === 0) return { mark: null, retry: true } // mid-exec or a zombie: look again
  const i = env.indexOf(MARK)
  if (i < 0) return { mark: null, retry: false }
  const end = env.indexOf('\0', i)
  let cmd = ''
  try { cmd = readFileSync(`/proc/${pid}/cmdline`, 'latin1').split('\0').filter(Boolean).join(' ') } catch { /* gone */ }
  return { mark: env.slice(i + MARK.length, end < 0 ? undefined : end), cmd, retry: false }
}

export function startScanner(intervalMs = 2) {
  const seen = new Map() // pid → { mark, firstSeen }
  let scans = 0
  let scanMs = 0
  let running = true
  const scan = () => {
    const t = performance.now()
    let names
    try {
      names = readdirSync('/proc')
    } catch {
      return
    }
    for (const n of names) {
      const c = n.charCodeAt(0)
      if (c < 48 || c > 57 || seen.has(n)) continue
      const { mark, cmd, retry } = markOf(n)
      if (!retry) seen.set(n, { mark, cmd, firstSeen: t })
    }
    scans++
    scanMs += performance.now() - t
  }
  const loop = () => {
    if (!running) return
    scan()
    setTimeout(loop, intervalMs)
  }
  loop()
  return {
    /** Stops scanning; returns { pids: Map(pid → {mark, firstSeen}), scans, meanScanMs }. */
    stop() {
      running = false
      scan()
      return { pids: seen, scans, meanScanMs: scans ? scanMs / scans : 0 }
    },
  }
}

/** Pids whose marker names `processId` (any emulator instance). */
export function pidsOf(pids, processId) {
  const out = []
  for (const [pid, { mark, cmd, firstSeen }] of pids) {
    if (mark && mark.endsWith(`:${processId}`)) out.push({ pid: Number(pid), cmd, firstSeen })
  }
  return out
}
