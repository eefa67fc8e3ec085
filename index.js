'use strict'

// Hand-written entry point. Everything that decides anything about a command
// lives in Rust (src/); this file only
//   - turns the host's client object into the plain object the binding takes,
//   - bridges an AbortSignal to a native CancelHandle,
//   - guards the caller's callbacks (a throwing `log` is reported, never fatal),
//   - turns a native outcome into the resolved value or the right Error class.

const native = require('./binding.js')

const CLEANUP_BRAND = Symbol.for('createos-execute.CleanupError')
const API_BRAND = Symbol.for('createos-execute.ApiError')
const DESTROY_BRAND = Symbol.for('createos-execute.DestroyError')
const DEFAULT_TIMEOUT_MS = 300_000

class CreateosApiError extends Error {
  /**
   * Same call shape as the TypeScript module: `new CreateosApiError(status, operation?)`.
   * The message names only the status and a fixed operation label.
   */
  constructor(status, operation, options) {
    const message = options && typeof options.message === 'string'
      ? options.message
      : `CreateOS request failed (HTTP ${status})${operation ? ` during ${operation}` : ''}.`
    super(message, options && 'cause' in options ? { cause: options.cause } : undefined)
    this.status = status
  }
}
Object.defineProperty(CreateosApiError.prototype, 'name', {
  value: 'CreateosApiError', writable: true, configurable: true,
})
Object.defineProperty(CreateosApiError.prototype, API_BRAND, { value: true })

class CreateosCleanupError extends Error {
  /**
   * `new CreateosCleanupError(message?, options?)`; options may carry
   * `reason`, `sandboxId`, `processId`, `attempts` and `cause`.
   */
  constructor(message, options) {
    super(message, options && 'cause' in options ? { cause: options.cause } : undefined)
    const o = options || {}
    this.reason = o.reason
    this.sandboxId = o.sandboxId
    this.processId = o.processId
    this.attempts = Array.isArray(o.attempts) ? o.attempts : []
  }
}
Object.defineProperty(CreateosCleanupError.prototype, 'name', {
  value: 'CreateosCleanupError', writable: true, configurable: true,
})
Object.defineProperty(CreateosCleanupError.prototype, CLEANUP_BRAND, { value: true })

class CreateosDestroyError extends Error {
  /**
   * `destroySandbox` could not confirm the sandbox gone within its deadline: it may still
   * exist (and run processes). `new CreateosDestroyError(message?, { sandboxId, attempts })`.
   */
  constructor(message, options) {
    super(message, options && 'cause' in options ? { cause: options.cause } : undefined)
    const o = options || {}
    this.sandboxId = o.sandboxId
    this.attempts = Array.isArray(o.attempts) ? o.attempts : []
  }
}
Object.defineProperty(CreateosDestroyError.prototype, 'name', {
  value: 'CreateosDestroyError', writable: true, configurable: true,
})
Object.defineProperty(CreateosDestroyError.prototype, DESTROY_BRAND, { value: true })

/** True for a CreateosCleanupError from this or any other loaded copy of the package. */
function isCreateosCleanupError(error) {
  return error !== null && typeof error === 'object' && error[CLEANUP_BRAND] === true
}

// ---------------------------------------------------------------------------
// Native outcome → value or error

function toError(e) {
  const err = e && typeof e === 'object' ? e : { kind: 'error', message: 'CreateOS command failed.' }
  const message = typeof err.message === 'string' ? err.message : 'CreateOS command failed.'
  switch (err.kind) {
    case 'api':
      return new CreateosApiError(err.status, undefined, { message })
    case 'cleanup': {
      const opts = {}
      if (err.reason !== undefined) opts.reason = err.reason
      if (err.sandboxId !== undefined) opts.sandboxId = err.sandboxId
      if (err.processId !== undefined) opts.processId = err.processId
      opts.attempts = Array.isArray(err.attempts) ? err.attempts : []
      return new CreateosCleanupError(message, opts)
    }
    case 'destroy':
      return new CreateosDestroyError(message, {
        sandboxId: err.sandboxId,
        attempts: Array.isArray(err.attempts) ? err.attempts : [],
      })
    case 'cancelled':
    case 'aborted': {
      // 'aborted' is a TimeoutError abort on an entry point that has no timedOut
      // result (followProcess, waitForRequest): a cancellation there too.
      const error = new Error(message)
      error.code = 'CREATEOS_CANCELLED'
      return error
    }
    case 'input': {
      const error = new Error(message)
      error.code = 'CREATEOS_INVALID_INPUT'
      return error
    }
    default: {
      const error = new Error(message)
      // Errors with a code of their own: CREATEOS_TLS_UNTRUSTED, CREATEOS_NOT_STARTED.
      error.code = typeof err.code === 'string' ? err.code : 'CREATEOS_ERROR'
      return error
    }
  }
}

// Warnings the core queued (e.g. the shared pacing store went down or came back); each
// arrives on exactly one outcome. Fixed text and a code, never a URL.
function emitWarnings(outcome) {
  const warnings = outcome && Array.isArray(outcome.warnings) ? outcome.warnings : []
  for (const w of warnings) {
    if (w && typeof w.message === 'string') process.emitWarning(w.message, { code: w.code })
  }
}

function unwrap(outcome) {
  emitWarnings(outcome)
  if (outcome && outcome.ok) return outcome.value
  throw toError(outcome && outcome.error)
}

// ---------------------------------------------------------------------------
// Client

// Which key: the client's own, else `config.apiKey`, else CREATEOS_API_KEY. An
// empty result is passed on and rejected by the native client before any request.
function resolveApiKey(client, config) {
  for (const candidate of [client.apiKey, config.apiKey, process.env.CREATEOS_API_KEY]) {
    if (typeof candidate === 'string' && candidate.trim() !== '') return candidate.trim()
  }
  return ''
}

/** Host client (`client.config`, `client.apiKey`) or `{ config, apiKey }` → NativeClient. */
function nativeClient(client) {
  if (client === null || typeof client !== 'object') {
    throw new TypeError('A CreateOS client with a config object is required.')
  }
  const config = client.config
  if (config === null || typeof config !== 'object') {
    throw new TypeError('A CreateOS client with a config object is required.')
  }
  if (typeof config.apiUrl !== 'string') throw new TypeError('CreateOS requires an API URL.')
  const out = {}
  for (const key of Object.keys(config)) {
    if (config[key] !== undefined) out[key] = config[key]
  }
  out.apiUrl = config.apiUrl
  out.apiKey = resolveApiKey(client, config)
  out.timeoutMs = config.timeoutMs ?? DEFAULT_TIMEOUT_MS
  delete out.pacingStoreDefault
  withStoreDefault(out)
  return out
}

// CREATEOS_PACING_STORE: the pacing store of every client that names none (read here
// because a worker thread's process.env is its own).
function withStoreDefault(out) {
  const store = process.env.CREATEOS_PACING_STORE
  if (typeof store === 'string' && store.trim() !== '') out.pacingStoreDefault = store
  return out
}

function nativeParams(params) {
  if (params === null || typeof params !== 'object') {
    throw new TypeError('Sandbox command parameters are required.')
  }
  const out = {}
  const lease = params.lease
  const sandboxId = lease !== null && typeof lease === 'object' ? lease.providerLeaseId : undefined
  if (sandboxId !== undefined) out.sandboxId = sandboxId
  if (params.command !== undefined) out.command = params.command
  if (params.args !== undefined) out.args = params.args
  if (params.cwd !== undefined) out.cwd = params.cwd
  if (params.env !== undefined) out.env = params.env
  if (params.stdin !== undefined && params.stdin !== null) out.stdin = params.stdin
  return out
}

// ---------------------------------------------------------------------------
// Callbacks

function guardLog(log) {
  if (log === undefined || log === null) return undefined
  if (typeof log !== 'function') throw new TypeError('log must be a function.')
  let warned = false
  // Reported once per call, and never with the chunk or the thrown error: either
  // may hold command output.
  const reportCallbackFailure = () => {
    if (warned) return
    warned = true
    process.emitWarning('createos-execute: the log callback threw; output is still captured and cleanup still runs.', {
      code: 'CREATEOS_LOG_THREW',
    })
  }
  return (stream, text) => {
    try {
      const r = log(stream, text)
      if (r !== null && typeof r === 'object' && typeof r.then === 'function') {
        r.then(undefined, () => reportCallbackFailure())
      }
    } catch {
      reportCallbackFailure()
    }
  }
}

// ---------------------------------------------------------------------------
// AbortSignal → CancelHandle

// Every in-flight call is referenced from here until it settles, so neither the
// signal nor its listener nor the handle can be collected while native work
// runs (the TypeScript module lost aborts after a GC because fetch held the
// signal weakly).
const inFlight = new Set()

function isTimeout(signal) {
  const reason = signal.reason
  return reason !== null && typeof reason === 'object' && reason.name === 'TimeoutError'
}

function checkSignal(signal) {
  if (signal === undefined || signal === null) return undefined
  if (typeof signal !== 'object' || typeof signal.aborted !== 'boolean' || typeof signal.addEventListener !== 'function') {
    throw new TypeError('signal must be an AbortSignal.')
  }
  return signal
}

async function withCancel(signal, run) {
  signal = checkSignal(signal)
  const handle = new native.CancelHandle()
  const entry = { signal, handle, onAbort: undefined }
  inFlight.add(entry)
  try {
    if (signal) {
      if (signal.aborted) {
        handle.cancel(isTimeout(signal))
      } else {
        entry.onAbort = () => handle.cancel(isTimeout(signal))
        signal.addEventListener('abort', entry.onAbort, { once: true })
      }
    }
    return await run(handle)
  } finally {
    if (entry.onAbort) signal.removeEventListener('abort', entry.onAbort)
    inFlight.delete(entry)
  }
}

// On `process.exit()` (or the end of a worker), calls still in flight are cancelled and
// their cleanups (the DELETE of each process tree) get up to 3 s before the thread ends: the
// environment's native cleanup hook covers `worker.terminate()`, this covers `process.exit()`,
// which does not run those hooks. Nothing waits when no call is in flight.
process.on('exit', () => {
  native.endInFlightCalls()
})

// ---------------------------------------------------------------------------
// Exports

async function execute(client, params, signal, log) {
  const c = nativeClient(client)
  const p = nativeParams(params)
  const onLog = guardLog(log)
  return unwrap(await withCancel(signal, (handle) => native.executeNative(c, p, handle, onLog)))
}

async function executeStream(client, params, signal, log) {
  const c = nativeClient(client)
  const p = nativeParams(params)
  const onLog = guardLog(log)
  return unwrap(await withCancel(signal, (handle) => native.executeStreamNative(c, p, handle, onLog)))
}

async function followProcess(client, sandboxId, processId, signal, onData, onConnected) {
  const c = nativeClient(client)
  if (typeof onData !== 'function') throw new TypeError('onData must be a function.')
  if (onConnected !== undefined && onConnected !== null && typeof onConnected !== 'function') {
    throw new TypeError('onConnected must be a function.')
  }
  // As in the TypeScript module, a throwing onData/onConnected ends the follow
  // with that error; the native side is cancelled so it stops reading at once.
  let callbackError
  let failed = false
  const outcome = await withCancel(signal, (handle) => {
    const fail = (error) => {
      if (!failed) {
        failed = true
        callbackError = error
        handle.cancel(false)
      }
    }
    // One native callback: ('connected') on every attach, (stream, bytes) for output.
    const onEvent = (kind, data) => {
      if (failed) return
      try {
        if (kind === 'connected') {
          if (onConnected) onConnected()
        } else {
          onData(kind, data)
        }
      } catch (error) {
        fail(error)
      }
    }
    return native.followProcessNative(c, sandboxId, processId, handle, onEvent)
  })
  if (failed) {
    emitWarnings(outcome)
    throw callbackError
  }
  // As in the TypeScript module, an aborted follow rejects with the signal's reason
  // (the host aborts its own follower with a reason of its choosing).
  if (isCancelled(outcome) && signal && signal.aborted) {
    emitWarnings(outcome)
    throw signal.reason
  }
  return unwrap(outcome)
}

function isCancelled(outcome) {
  const kind = outcome && !outcome.ok && outcome.error ? outcome.error.kind : undefined
  return kind === 'cancelled' || kind === 'aborted'
}

async function waitForRequest(apiUrl, signal) {
  const c = withStoreDefault({ apiUrl, apiKey: '', timeoutMs: DEFAULT_TIMEOUT_MS })
  const outcome = await withCancel(signal, (handle) => native.waitForRequestNative(c, handle))
  if (isCancelled(outcome) && signal && signal.aborted) {
    emitWarnings(outcome)
    throw signal.reason
  }
  unwrap(outcome)
}

// Resolves the receipt `{ providerLeaseId, state: 'destroyed' }` once the sandbox is
// confirmed gone; else rejects with CreateosDestroyError.
async function destroySandbox(client, sandboxId) {
  const c = nativeClient(client)
  return unwrap(await native.destroySandboxNative(c, sandboxId))
}

function shellQuote(value) {
  return native.shellQuote(value)
}

module.exports = {
  execute,
  executeStream,
  followProcess,
  shellQuote,
  waitForRequest,
  destroySandbox,
  CreateosCleanupError,
  CreateosApiError,
  CreateosDestroyError,
  isCreateosCleanupError,
}
