'use strict'

// Loads the package as a host does (../../index.js). If index.js is missing or
// unusable, falls back to the generated binding with a minimal `execute`
// adapter, so the bench still measures the native core.

const path = require('node:path')

const ROOT = path.resolve(__dirname, '..', '..')
const { startEmulator } = require('createos-execute-emulator')

function adapterOver(native) {
  const toNativeClient = (client) => {
    const config = client.config || {}
    const out = { ...config, apiKey: client.apiKey || config.apiKey }
    if (out.timeoutMs === undefined) out.timeoutMs = 300_000
    for (const k of Object.keys(out)) if (out[k] === undefined) delete out[k]
    return out
  }
  const toNativeParams = (params) => {
    const out = { sandboxId: params.lease.providerLeaseId, command: params.command }
    for (const k of ['args', 'cwd', 'env', 'stdin']) if (params[k] !== undefined) out[k] = params[k]
    return out
  }
  return {
    via: 'binding.js',
    startEmulator,
    async execute(client, params) {
      const handle = new native.CancelHandle()
      const outcome = await native.executeNative(toNativeClient(client), toNativeParams(params), handle)
      if (outcome && outcome.ok) return outcome.value
      const e = new Error((outcome && outcome.error && outcome.error.message) || 'execute failed')
      e.native = outcome && outcome.error
      throw e
    },
  }
}

let cached
function loadLib() {
  if (cached) return cached
  try {
    const lib = require(path.join(ROOT, 'index.js'))
    if (typeof lib.execute === 'function') {
      cached = { via: 'index.js', execute: lib.execute, startEmulator }
      return cached
    }
  } catch (error) {
    if (process.env.BENCH_DEBUG) process.stderr.write(`index.js unusable: ${error.message}\n`)
  }
  cached = adapterOver(require(path.join(ROOT, 'binding.js')))
  return cached
}

module.exports = { loadLib, ROOT }
