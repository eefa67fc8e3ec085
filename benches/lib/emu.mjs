// One async interface over the emulator, whether it runs in this process
// (the native Emulator object) or in a child process (emulator-child.cjs).
import { fork } from 'node:child_process'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import { dirname, join } from 'node:path'

const require = createRequire(import.meta.url)
const { loadLib } = require('./load.cjs')
const HERE = dirname(fileURLToPath(import.meta.url))

/** In-process emulator. */
export async function startInProcess(options = {}) {
  const emu = await loadLib().startEmulator({ rateLimitPerMinute: null, ...options })
  return {
    where: 'in-process',
    url: emu.url,
    apiKey: emu.apiKey,
    pid: process.pid,
    caPem: emu.caPem ?? null,
    connections: async () => emu.connections(),
    requests: async () => emu.requests(),
    clearRequests: async () => emu.clearRequests(),
    addFault: async (rule) => emu.addFault(rule),
    clearFaults: async () => emu.clearFaults(),
    createSandbox: async () => emu.createSandbox(),
    livePids: async () => emu.livePids(),
    liveVirtual: async () => emu.liveVirtual(),
    close: () => emu.close(),
  }
}

/** Emulator in a child node process, driven over IPC. */
export async function startChild(options = {}) {
  const child = fork(join(HERE, '..', 'emulator-child.cjs'), [JSON.stringify({ rateLimitPerMinute: null, ...options })], {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  })
  const pending = new Map()
  let nextId = 1
  const ready = new Promise((resolve, reject) => {
    child.once('error', reject)
    child.once('exit', (code) => reject(new Error(`emulator child exited (${code}) before it was ready`)))
    child.on('message', (msg) => {
      if (msg && msg.ready) return resolve(msg)
      const p = pending.get(msg.id)
      if (!p) return
      pending.delete(msg.id)
      if (msg.ok) p.resolve(msg.value)
      else p.reject(new Error(msg.error))
    })
  })
  const info = await ready
  let closed = false
  const call = (op, ...args) => new Promise((resolve, reject) => {
    // A closed child answers nothing: fail at once rather than wait forever.
    if (closed && op !== 'close') return reject(new Error('emulator child closed'))
    const id = nextId++
    pending.set(id, { resolve, reject })
    child.send({ id, op, args })
  })
  return {
    where: 'child process',
    url: info.url,
    apiKey: info.apiKey,
    pid: info.pid,
    caPem: info.caPem ?? null,
    connections: () => call('connections'),
    requests: () => call('requests'),
    clearRequests: () => call('clearRequests'),
    addFault: (rule) => call('addFault', rule),
    clearFaults: () => call('clearFaults'),
    createSandbox: () => call('createSandbox'),
    livePids: () => call('livePids'),
    liveVirtual: () => call('liveVirtual'),
    async close() {
      if (closed) return
      closed = true
      const exited = new Promise((resolve) => child.once('exit', resolve))
      await call('close').catch(() => {})
      await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))])
      if (child.exitCode === null) child.kill('SIGKILL')
    },
  }
}

export function startEmu(where, options) {
  return where === 'child' ? startChild(options) : startInProcess(options)
}

/** A raw API call to the emulator (no pacing): for set-up steps that are not measured. */
export async function api(emu, method, path, body) {
  const res = await fetch(`${emu.url}/v1${path}`, {
    method,
    headers: { 'x-api-key': emu.apiKey, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
    body: body !== undefined ? JSON.stringify(body) : undefined,
  })
  const text = await res.text()
  let json
  try { json = JSON.parse(text) } catch { json = undefined }
  if (!res.ok) throw new Error(`${method} ${path} → ${res.status} ${text.slice(0, 200)}`)
  return json && json.data !== undefined ? json.data : json
}
