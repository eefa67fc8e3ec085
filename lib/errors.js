'use strict'

// The error classes, their stable codes, the guards that recognise them across loaded copies
// and realms, and the one place that turns a native outcome into a value or an error.
// Requires nothing: the classes are the same whichever module loads them.

// Every error this package throws carries a stable `code` (index.d.ts: `CreateosError`).
const CODES = Object.freeze({
  api: 'CREATEOS_API_ERROR',
  cleanup: 'CREATEOS_CLEANUP_UNCONFIRMED',
  destroy: 'CREATEOS_DESTROY_UNCONFIRMED',
  input: 'CREATEOS_INVALID_INPUT',
  cancelled: 'CREATEOS_CANCELLED',
  error: 'CREATEOS_ERROR',
  fetchUnmatched: 'CREATEOS_FETCH_UNMATCHED',
})

const CLEANUP_BRAND = Symbol.for('createos-execute.CleanupError')
const API_BRAND = Symbol.for('createos-execute.ApiError')
const DESTROY_BRAND = Symbol.for('createos-execute.DestroyError')

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
function codedError(message, code, cause) {
  const error = cause === undefined ? new Error(message) : new Error(message, { cause })
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

// `cause`: what the host's fetch threw (lib/fetch-transport.js, already cleaned of the key and
// of URL queries), for the errors of a request that had no answer: a cleanup or destroy
// that could not be proven, a connection failure, a forgotten mock. Never on an API error (its
// status is the answer), an input error or a cancellation.
// The plain errors a failed request can end in (their `cause` is the host's error); the others
// (a protocol error, an evicted output) come from an answer, and get none.
const FAILED_REQUEST = new Set([
  CODES.fetchUnmatched, 'CREATEOS_NOT_STARTED', 'CREATEOS_TLS_UNTRUSTED',
  'CREATEOS_PROXY_REFUSED', 'CREATEOS_PROXY_UNREACHABLE',
])
const FAILED_REQUEST_MESSAGES = new Set([
  'CreateOS connection failed.', 'CreateOS process output connection failed.',
  'CreateOS answered with a redirect, which is refused.',
])

function toError(e, cause) {
  const err = e && typeof e === 'object' ? e : { kind: 'error', message: 'CreateOS command failed.' }
  const message = typeof err.message === 'string' ? err.message : 'CreateOS command failed.'
  const withCause = (opts) => (cause === undefined ? opts : { ...opts, cause })
  switch (err.kind) {
    case 'api':
      return new CreateosApiError(err.status, undefined, { message })
    case 'cleanup': {
      const opts = withCause({})
      if (err.reason !== undefined) opts.reason = err.reason
      if (err.sandboxId !== undefined) opts.sandboxId = err.sandboxId
      if (err.processId !== undefined) opts.processId = err.processId
      opts.attempts = Array.isArray(err.attempts) ? err.attempts : []
      return new CreateosCleanupError(message, opts)
    }
    case 'destroy':
      return new CreateosDestroyError(message, withCause({
        sandboxId: err.sandboxId,
        attempts: Array.isArray(err.attempts) ? err.attempts : [],
        status: typeof err.status === 'number' ? err.status : null,
      }))
    case 'cancelled':
    case 'aborted':
      // 'aborted' is a TimeoutError abort on an entry point that has no timedOut
      // result (followProcess, waitForRequest): a cancellation there too.
      return codedError(message, CODES.cancelled)
    case 'input':
      return new CreateosInputError(message)
    default: {
      // Errors with a code of their own: CREATEOS_TLS_UNTRUSTED, CREATEOS_NOT_STARTED,
      // CREATEOS_PROXY_REFUSED, CREATEOS_PROXY_UNREACHABLE, CREATEOS_FETCH_UNMATCHED.
      const code = typeof err.code === 'string' ? err.code : CODES.error
      const failed = FAILED_REQUEST.has(code) || (code === CODES.error && FAILED_REQUEST_MESSAGES.has(message))
      return codedError(message, code, failed ? cause : undefined)
    }
  }
}

// Warnings the core queued (e.g. the shared pacing store went down or came back, a session
// supervisor whose end could not be proven); each arrives on exactly one outcome. Fixed text,
// a code and, when it is about a sandbox, its id as `sandboxId` (a `Warning` whose `code` and
// `sandboxId` a `process.on('warning')` listener can act on); never a URL.
function emitWarnings(outcome) {
  const warnings = outcome && Array.isArray(outcome.warnings) ? outcome.warnings : []
  for (const w of warnings) {
    if (!w || typeof w.message !== 'string') continue
    if (typeof w.sandboxId === 'string') {
      const warning = Object.assign(new Error(w.message), { name: 'Warning', code: w.code, sandboxId: w.sandboxId })
      process.emitWarning(warning)
    } else {
      process.emitWarning(w.message, { code: w.code })
    }
  }
}

function unwrap(outcome, cause) {
  emitWarnings(outcome)
  if (outcome && outcome.ok) return outcome.value
  throw toError(outcome && outcome.error, cause)
}

/** True when a native outcome is a cancellation (the signal fired). */
function isCancelled(outcome) {
  const kind = outcome && !outcome.ok && outcome.error ? outcome.error.kind : undefined
  return kind === 'cancelled' || kind === 'aborted'
}

module.exports = {
  CODES,
  CreateosApiError,
  CreateosCleanupError,
  CreateosDestroyError,
  CreateosInputError,
  codedError,
  isCreateosError,
  isCreateosCleanupError,
  toError,
  emitWarnings,
  unwrap,
  isCancelled,
}
