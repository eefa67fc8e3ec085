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

// Every error this package throws carries a stable `code` (index.d.ts: `CreateosError`).
const CODES = Object.freeze({
  api: 'CREATEOS_API_ERROR',
  cleanup: 'CREATEOS_CLEANUP_UNCONFIRMED',
  destroy: 'CREATEOS_DESTROY_UNCONFIRMED',
  input: 'CREATEOS_INVALID_INPUT',
  cancelled: 'CREATEOS_CANCELLED',
  error: 'CREATEOS_ERROR',
})

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
    this.code = CODES.api
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
    this.code = CODES.cleanup
    this.reason = o.reason ?? 'termination-unconfirmed'
    this.sandboxId = o.sandboxId ?? ''
    this.processId = o.processId ?? null
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
   * exist (and run processes). `new CreateosDestroyError(message?, { sandboxId, attempts, status })`.
   */
  constructor(message, options) {
    super(message, options && 'cause' in options ? { cause: options.cause } : undefined)
    const o = options || {}
    this.code = CODES.destroy
    this.sandboxId = o.sandboxId ?? ''
    this.attempts = Array.isArray(o.attempts) ? o.attempts : []
    this.status = typeof o.status === 'number' ? o.status : null
  }
}
Object.defineProperty(CreateosDestroyError.prototype, 'name', {
  value: 'CreateosDestroyError', writable: true, configurable: true,
})
Object.defineProperty(CreateosDestroyError.prototype, DESTROY_BRAND, { value: true })

/**
 * Every caller mistake (a missing or mistyped client, config field, parameter, signal or
 * callback, or a value a rule refuses): nothing was sent. The message names the field. It
 * is a TypeError, so a host's `instanceof TypeError` check keeps working.
 */
class CreateosInputError extends TypeError {
  constructor(message, options) {
    super(message, options && 'cause' in options ? { cause: options.cause } : undefined)
    this.code = CODES.input
  }
}
Object.defineProperty(CreateosInputError.prototype, 'name', {
  value: 'CreateosInputError', writable: true, configurable: true,
})

/** An `Error` with one of this package's codes (the plain ones: cancelled, TLS, not started, …). */
function codedError(message, code) {
  const error = new Error(message)
  error.code = code
  return error
}

/** True for any error this package (or another loaded copy of it) threw. */
function isCreateosError(error) {
  if (error === null || typeof error !== 'object') return false
  let code
  try {
    code = error.code
  } catch {
    return false
  }
  return typeof code === 'string' && code.startsWith('CREATEOS_') && typeof error.message === 'string'
}

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
        status: typeof err.status === 'number' ? err.status : null,
      })
    case 'cancelled':
    case 'aborted':
      // 'aborted' is a TimeoutError abort on an entry point that has no timedOut
      // result (followProcess, waitForRequest): a cancellation there too.
      return codedError(message, CODES.cancelled)
    case 'input':
      return new CreateosInputError(message)
    default:
      // Errors with a code of their own: CREATEOS_TLS_UNTRUSTED, CREATEOS_NOT_STARTED,
      // CREATEOS_PROXY_REFUSED, CREATEOS_PROXY_UNREACHABLE.
      return codedError(message, typeof err.code === 'string' ? err.code : CODES.error)
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
    throw new CreateosInputError(`client must be an object with a config object (got ${describe(client)}).`)
  }
  const config = readField(client, 'config').value
  if (config === null || typeof config !== 'object') {
    throw new CreateosInputError(`client.config must be an object (got ${describe(config)}).`)
  }
  warnUnknownFields(config)
  const out = {}
  for (const key of CONFIG_FIELDS) {
    const field = readField(config, key)
    if (field.threw) out[key] = NOT_JSON
    else if (field.value !== undefined) out[key] = jsonValue(field.value, 1)
  }
  if (typeof out.apiUrl !== 'string' || out.apiUrl === NOT_JSON) {
    const field = readField(config, 'apiUrl')
    throw new CreateosInputError(`CreateOS requires an API URL: apiUrl must be a string (got ${field.threw ? 'a throwing getter' : describe(field.value)}).`)
  }
  out.apiKey = resolveApiKey(client, config)
  out.timeoutMs = out.timeoutMs ?? DEFAULT_TIMEOUT_MS
  // pacingStoreDefault is not a config field (not in CONFIG_FIELDS): only the environment sets it.
  withStoreDefault(out)
  return out
}

// ---------------------------------------------------------------------------
// Misspelled config keys: a host's own fields are allowed (the plugin's config object holds
// many), so only a key within a small edit distance of one this package reads is reported,
// once per key and process, with the key it probably meant.

const PACING_FIELDS = Object.freeze(['limit', 'windowMs', 'intervalMs', 'store', 'key', 'allowPlaintextPassword'])
const MAX_TYPO_DISTANCE = 2
const warnedKeys = new Set()

// Optimal string alignment distance (Damerau-Levenshtein with adjacent transpositions),
// case-insensitive; bounded inputs (a config key longer than 64 characters is never a typo).
function editDistance(a, b) {
  a = a.toLowerCase()
  b = b.toLowerCase()
  const d = Array.from({ length: a.length + 1 }, (_, i) => [i, ...new Array(b.length).fill(0)])
  for (let j = 1; j <= b.length; j++) d[0][j] = j
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1)
    }
  }
  return d[a.length][b.length]
}

// Keys already looked at (hosts pass the same config object on every call); bounded.
const closestCache = new Map()
const MAX_CACHED_KEYS = 1024

function closestField(key, known) {
  const cacheKey = `${known === CONFIG_FIELDS ? '' : 'pacing.'}${key}`
  if (closestCache.has(cacheKey)) return closestCache.get(cacheKey)
  const found = findClosest(key, known)
  if (closestCache.size < MAX_CACHED_KEYS) closestCache.set(cacheKey, found)
  return found
}

function findClosest(key, known) {
  if (key.length > 64 || known.includes(key)) return undefined
  let best
  let bestDistance = MAX_TYPO_DISTANCE + 1
  for (const candidate of known) {
    const distance = editDistance(key, candidate)
    if (distance < bestDistance) {
      best = candidate
      bestDistance = distance
    }
  }
  return best
}

function ownKeys(object) {
  try {
    return Object.keys(object)
  } catch {
    return []
  }
}

function warnUnknownFields(config) {
  const check = (keys, known, prefix) => {
    for (const key of keys) {
      const meant = closestField(key, known)
      if (meant === undefined || meant.startsWith('__')) continue
      const path = `${prefix}${key}`
      if (warnedKeys.has(path)) continue
      warnedKeys.add(path)
      process.emitWarning(
        `createos-execute: the config field "${path}" is not one this package reads (did you mean "${prefix}${meant}"?); it is ignored.`,
        { code: 'CREATEOS_CONFIG_UNKNOWN_FIELD' },
      )
    }
  }
  check(ownKeys(config), CONFIG_FIELDS, '')
  const pacing = readField(config, 'pacing').value
  if (pacing !== null && typeof pacing === 'object' && !Array.isArray(pacing)) check(ownKeys(pacing), PACING_FIELDS, 'pacing.')
}

// CREATEOS_PACING_STORE: the pacing store of every client that names none (read here
// because a worker thread's process.env is its own).
function withStoreDefault(out) {
  const store = process.env.CREATEOS_PACING_STORE
  if (typeof store === 'string' && store.trim() !== '') out.pacingStoreDefault = store
  return out
}

// What a value is, for an input error's message: its type, never its content.
function describe(value) {
  if (value === null) return 'null'
  if (value === undefined) return 'undefined'
  switch (typeof value) {
    case 'string': return 'a string'
    case 'number': return 'a number'
    case 'boolean': return 'a boolean'
    case 'bigint': return 'a bigint'
    case 'symbol': return 'a symbol'
    case 'function': return 'a function'
    default:
      if (Array.isArray(value)) return 'an array'
      if (typeof Buffer === 'function' && Buffer.isBuffer(value)) return 'a Buffer'
      if (ArrayBuffer.isView(value)) return `a ${value.constructor && value.constructor.name ? value.constructor.name : 'typed array'}`
      return 'an object'
  }
}

// An env name as it appears in a message: `env.NAME`, or `env["odd name"]` (bounded).
function envPath(key) {
  return /^[A-Za-z_][A-Za-z0-9_]*$/.test(key) && key.length <= 64 ? `env.${key}` : `env[${JSON.stringify(key.slice(0, 64))}]`
}

// Reads a parameter; a throwing getter is that field being invalid.
function param(object, key, path) {
  const field = readField(object, key)
  if (field.threw) throw new CreateosInputError(`${path} could not be read (its getter threw).`)
  return field.value
}

function requireString(value, path, what = 'a string') {
  if (typeof value !== 'string') throw new CreateosInputError(`${path} must be ${what} (got ${describe(value)}).`)
  return value
}

/**
 * The command parameters as plain JSON, every type checked here so that no value JSON cannot
 * hold (a Buffer, a function, a symbol, a bigint) reaches the native layer. The values'
 * rules (NUL, environment names, the sandbox id's form) are checked natively.
 */
function nativeParams(params) {
  if (params === null || typeof params !== 'object') {
    throw new CreateosInputError(`params must be an object with lease and command (got ${describe(params)}).`)
  }
  const out = {}
  const lease = param(params, 'lease', 'lease')
  if (lease === null || typeof lease !== 'object') {
    throw new CreateosInputError(`lease must be an object with providerLeaseId (got ${describe(lease)}).`)
  }
  out.sandboxId = requireString(param(lease, 'providerLeaseId', 'lease.providerLeaseId'), 'lease.providerLeaseId', 'a sandbox ID string')
  const command = param(params, 'command', 'command')
  if (typeof command !== 'string' || command === '') {
    throw new CreateosInputError(`A sandbox command is required: command must be a non-empty string (got ${command === '' ? 'an empty string' : describe(command)}).`)
  }
  out.command = command
  const args = param(params, 'args', 'args')
  if (args !== undefined && args !== null) {
    if (!Array.isArray(args)) throw new CreateosInputError(`args must be an array of strings (got ${describe(args)}).`)
    // Array.from visits holes too (a hole is an undefined element).
    out.args = Array.from(args, (arg, i) => requireString(arg, `args[${i}]`))
  }
  const cwd = param(params, 'cwd', 'cwd')
  if (cwd !== undefined && cwd !== null) out.cwd = requireString(cwd, 'cwd')
  const env = param(params, 'env', 'env')
  if (env !== undefined && env !== null) {
    if (typeof env !== 'object' || Array.isArray(env) || ArrayBuffer.isView(env)) {
      throw new CreateosInputError(`env must be an object whose values are strings (got ${describe(env)}).`)
    }
    out.env = {}
    for (const key of ownKeys(env)) out.env[key] = requireString(param(env, key, envPath(key)), envPath(key))
  }
  const stdin = param(params, 'stdin', 'stdin')
  if (stdin !== undefined && stdin !== null) out.stdin = requireString(stdin, 'stdin', 'a string or null')
  return out
}

// ---------------------------------------------------------------------------
// Callbacks

function guardLog(log) {
  if (log === undefined || log === null) return undefined
  if (typeof log !== 'function') throw new CreateosInputError(`log must be a function (got ${describe(log)}).`)
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
    throw new CreateosInputError(`signal must be an AbortSignal (got ${describe(signal)}).`)
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
  requireString(sandboxId, 'sandboxId')
  requireString(processId, 'processId')
  if (typeof onData !== 'function') throw new CreateosInputError(`onData must be a function (got ${describe(onData)}).`)
  if (onConnected !== undefined && onConnected !== null && typeof onConnected !== 'function') {
    throw new CreateosInputError(`onConnected must be a function (got ${describe(onConnected)}).`)
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
  requireString(apiUrl, 'apiUrl')
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
  requireString(sandboxId, 'sandboxId', 'a sandbox ID string')
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
    throw codedError(INVALID_FRAME, CODES.error)
  }
  if (frame === null || typeof frame !== 'object' || Array.isArray(frame)) throw codedError(INVALID_FRAME, CODES.error)
  return frame
}

/**
 * Yields each NDJSON frame (a JSON object) of `response.body`. Blank lines are skipped; a
 * line over 1 MiB, bad JSON or a non-object, and a body without any frame are errors. The
 * body's reader is cancelled when the consumer stops early (break, return, throw).
 */
async function* processEvents(response) {
  const body = response !== null && typeof response === 'object' ? response.body : undefined
  if (body === null || body === undefined || typeof body.getReader !== 'function') throw codedError(EMPTY_STREAM, CODES.error)
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
        if (pendingBytes + (nl - start) > MAX_FRAME_BYTES) throw codedError(FRAME_TOO_LARGE, CODES.error)
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
        if (pendingBytes > MAX_FRAME_BYTES) throw codedError(FRAME_TOO_LARGE, CODES.error)
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
    if (frames === 0) throw codedError(EMPTY_STREAM, CODES.error)
  } finally {
    if (!finished) await reader.cancel().catch(() => {})
    reader.releaseLock()
  }
}

function shellQuote(value) {
  requireString(value, 'value')
  try {
    return native.shellQuote(value)
  } catch (error) {
    // The one native refusal: NUL in the value.
    throw new CreateosInputError(error && typeof error.message === 'string' ? error.message : 'Sandbox command values cannot contain NUL.')
  }
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
  CreateosInputError,
  isCreateosCleanupError,
  isCreateosError,
}
