'use strict'

// Hand-written entry point. Everything that decides anything about a command
// lives in Rust (src/); this file only
//   - turns the host's client object into the plain object the binding takes,
//   - bridges an AbortSignal to a native CancelHandle,
//   - guards the caller's callbacks (a throwing `log` is reported, never fatal),
//   - turns a native outcome into the resolved value or the right Error class.

const diagnostics = require('node:diagnostics_channel')

// The platform's napi triple as the platform packages are named (createos-execute-<tag>).
function platformTag() {
  const { platform, arch } = process
  if (platform === 'linux') {
    let glibc = true
    try {
      glibc = Boolean(process.report.getReport().header.glibcVersionRuntime)
    } catch {
      // Assume glibc when the report is unavailable.
    }
    return `linux-${arch}-${glibc ? 'gnu' : 'musl'}`
  }
  if (platform === 'win32') return `win32-${arch}-msvc`
  return `${platform}-${arch}`
}

// The generated loader's error lists every path it tried; this one says what to do.
function loadNative() {
  try {
    return require('./binding.js')
  } catch (cause) {
    const tag = platformTag()
    const error = new Error(
      `createos-execute: no native binary for ${tag} (Node.js ${process.version}). ` +
      `Install the platform package createos-execute-${tag} at the version of createos-execute ` +
      '(npm installs it as an optional dependency: do not install with --omit=optional or --no-optional), ' +
      'or build the addon from source with `npm run build`.',
      { cause },
    )
    error.code = 'CREATEOS_NATIVE_MISSING'
    throw error
  }
}
const native = loadNative()

// --- Node's proxy switch on the command line -------------------------------------------
// `--use-env-proxy` / `--no-use-env-proxy` in process.execArgv (the last one wins, `_` reads
// as `-`): only JS sees it. NODE_OPTIONS and NODE_USE_ENV_PROXY are read natively.
function execArgvEnvProxy(argv) {
  let on = null
  for (const arg of Array.isArray(argv) ? argv : []) {
    const name = typeof arg === 'string' ? arg.replace(/_/g, '-') : ''
    if (name === '--use-env-proxy') on = true
    else if (name === '--no-use-env-proxy') on = false
  }
  return on
}
native.setExecArgvEnvProxy(execArgvEnvProxy(process.execArgv))
// ----------------------------------------------------------------------------------------

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

// The `client.config` fields this package reads. Nothing else of the host's config
// object is touched (hosts put methods, getters and class instances there). Add a
// field here when the native config learns it.
const CONFIG_FIELDS = Object.freeze([
  'apiUrl',
  'apiKey',
  'timeoutMs',
  'pacing',
  'cleanupGraceMs',
  'confirmPollMs',
  'cleanupDeadlineMs',
  'legacyCleanup',
  'leftoverProcesses',
  'streamIdleTimeoutMs',
  'proxy',
  'caCertPem',
  // Test hook: honoured only by a build with the `test-hooks` feature.
  '__panicAt',
])
const MAX_CONFIG_DEPTH = 4

// Reads `object[key]`; a throwing getter counts as a value that is not JSON.
function readField(object, key) {
  try {
    return { value: object[key] }
  } catch {
    return { value: undefined, threw: true }
  }
}

// A known field's value as JSON the native config parses. A value JSON cannot hold
// (a function, symbol, bigint, a getter that throws, too deep) becomes the string
// '[invalid]', which the native check of that field rejects with its own message;
// inside an object, only own enumerable string keys are read.
const NOT_JSON = '[invalid]'
function jsonValue(value, depth) {
  switch (typeof value) {
    case 'string':
    case 'boolean':
      return value
    case 'number':
      return Number.isFinite(value) ? value : NOT_JSON
    case 'object': {
      if (value === null) return null
      if (depth >= MAX_CONFIG_DEPTH) return NOT_JSON
      let keys
      try {
        if (Array.isArray(value)) return Array.from(value, (v) => jsonValue(v, depth + 1))
        keys = Object.keys(value)
      } catch {
        return NOT_JSON
      }
      const out = {}
      for (const key of keys) {
        const field = readField(value, key)
        if (field.value !== undefined || field.threw) out[key] = field.threw ? NOT_JSON : jsonValue(field.value, depth + 1)
      }
      return out
    }
    default:
      return NOT_JSON
  }
}

// Which key: the client's own, else `config.apiKey`, else CREATEOS_API_KEY. An
// empty result is passed on and rejected by the native client before any request.
function resolveApiKey(client, config) {
  const candidates = [readField(client, 'apiKey').value, readField(config, 'apiKey').value, process.env.CREATEOS_API_KEY]
  for (const candidate of candidates) {
    if (typeof candidate === 'string' && candidate.trim() !== '') return candidate.trim()
  }
  return ''
}

/** Host client (`client.config`, `client.apiKey`) or `{ config, apiKey }` → NativeClient. */
function nativeClient(client) {
  if (client === null || typeof client !== 'object') {
    throw new TypeError('A CreateOS client with a config object is required.')
  }
  const config = readField(client, 'config').value
  if (config === null || typeof config !== 'object') {
    throw new TypeError('A CreateOS client with a config object is required.')
  }
  const out = {}
  for (const key of CONFIG_FIELDS) {
    const field = readField(config, key)
    if (field.threw) out[key] = NOT_JSON
    else if (field.value !== undefined) out[key] = jsonValue(field.value, 1)
  }
  if (typeof out.apiUrl !== 'string' || out.apiUrl === NOT_JSON) throw new TypeError('CreateOS requires an API URL.')
  out.apiKey = resolveApiKey(client, config)
  out.timeoutMs = out.timeoutMs ?? DEFAULT_TIMEOUT_MS
  // pacingStoreDefault is not a config field (not in CONFIG_FIELDS): only the environment sets it.
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
// diagnostics_channel: `createos-execute:request` (one message per HTTP attempt) and
// `createos-execute:cleanup` (one per cleanup step). Fixed words and numbers only.

const channels = {
  request: diagnostics.channel('createos-execute:request'),
  cleanup: diagnostics.channel('createos-execute:cleanup'),
}

// Checked once per call: with no subscriber, native gets no callback and builds no events.
function diagnosticsCallback() {
  if (!channels.request.hasSubscribers && !channels.cleanup.hasSubscribers) return undefined
  return (name, event) => {
    const channel = channels[name]
    if (channel === undefined || !channel.hasSubscribers) return
    try {
      channel.publish(event)
    } catch {
      // A throwing subscriber is the subscriber's problem (node reports it); the call goes on.
    }
  }
}

// ---------------------------------------------------------------------------
// Exports

async function execute(client, params, signal, log) {
  const c = nativeClient(client)
  const p = nativeParams(params)
  const onLog = guardLog(log)
  const onDiag = diagnosticsCallback()
  return unwrap(await withCancel(signal, (handle) => native.executeNative(c, p, handle, onLog, onDiag)))
}

async function executeStream(client, params, signal, log) {
  const c = nativeClient(client)
  const p = nativeParams(params)
  const onLog = guardLog(log)
  const onDiag = diagnosticsCallback()
  return unwrap(await withCancel(signal, (handle) => native.executeStreamNative(c, p, handle, onLog, onDiag)))
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
    return native.followProcessNative(c, sandboxId, processId, handle, onEvent, diagnosticsCallback())
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
  return unwrap(await native.destroySandboxNative(c, sandboxId, diagnosticsCallback()))
}

// ---------------------------------------------------------------------------
// processEvents: the NDJSON frames of a fetch Response body (the TypeScript module's export)

const MAX_FRAME_BYTES = 1024 * 1024
const FRAME_TOO_LARGE = 'CreateOS process frame is too large.'
const INVALID_FRAME = 'CreateOS returned an invalid process frame.'
const EMPTY_STREAM = 'CreateOS returned an empty process stream.'

function parseFrame(bytes, decoder) {
  const line = decoder.decode(bytes)
  if (line.trim() === '') return undefined
  let frame
  try {
    frame = JSON.parse(line)
  } catch {
    throw new Error(INVALID_FRAME)
  }
  if (frame === null || typeof frame !== 'object' || Array.isArray(frame)) throw new Error(INVALID_FRAME)
  return frame
}

/**
 * Yields each NDJSON frame (a JSON object) of `response.body`. Blank lines are skipped; a
 * line over 1 MiB, bad JSON or a non-object, and a body without any frame are errors. The
 * body's reader is cancelled when the consumer stops early (break, return, throw).
 */
async function* processEvents(response) {
  const body = response !== null && typeof response === 'object' ? response.body : undefined
  if (body === null || body === undefined || typeof body.getReader !== 'function') throw new Error(EMPTY_STREAM)
  const reader = body.getReader()
  const decoder = new TextDecoder()
  let pending = [] // bytes of the line being read, as chunks
  let pendingBytes = 0
  let frames = 0
  let finished = false
  try {
    for (;;) {
      const { done, value } = await reader.read()
      if (done) break
      const chunk = value instanceof Uint8Array ? value : new Uint8Array(value)
      let start = 0
      for (let nl = chunk.indexOf(10, start); nl !== -1; nl = chunk.indexOf(10, start)) {
        if (pendingBytes + (nl - start) > MAX_FRAME_BYTES) throw new Error(FRAME_TOO_LARGE)
        let line = chunk.subarray(start, nl)
        if (pendingBytes > 0) {
          pending.push(line)
          line = Buffer.concat(pending, pendingBytes + line.length)
          pending = []
          pendingBytes = 0
        }
        start = nl + 1
        const frame = parseFrame(line, decoder)
        if (frame !== undefined) {
          frames++
          yield frame
        }
      }
      if (start < chunk.length) {
        pendingBytes += chunk.length - start
        if (pendingBytes > MAX_FRAME_BYTES) throw new Error(FRAME_TOO_LARGE)
        // Copied: the reader may reuse its buffer.
        pending.push(Uint8Array.prototype.slice.call(chunk, start))
      }
    }
    finished = true
    if (pendingBytes > 0) {
      const frame = parseFrame(Buffer.concat(pending, pendingBytes), decoder)
      pending = []
      if (frame !== undefined) {
        frames++
        yield frame
      }
    }
    if (frames === 0) throw new Error(EMPTY_STREAM)
  } finally {
    if (!finished) await reader.cancel().catch(() => {})
    reader.releaseLock()
  }
}

function shellQuote(value) {
  return native.shellQuote(value)
}

module.exports = {
  execute,
  executeStream,
  followProcess,
  shellQuote,
  processEvents,
  waitForRequest,
  destroySandbox,
  CreateosCleanupError,
  CreateosApiError,
  CreateosDestroyError,
  isCreateosCleanupError,
}
