'use strict'

// The command's parameters and the caller's callbacks, checked and turned into the plain
// JSON the native layer takes. Every mistake is a CreateosInputError naming the field, thrown
// before anything is sent.

const { CreateosInputError } = require('./errors.js')

// Reads `object[key]`; a throwing getter counts as a value that is not JSON.
function readField(object, key) {
  try {
    return { value: object[key] }
  } catch {
    return { value: undefined, threw: true }
  }
}

function ownKeys(object) {
  try {
    return Object.keys(object)
  } catch {
    return []
  }
}

// The TypeScript module's messages for the rules it had (crates/core/src/script.rs and
// config.rs hold the same texts, the native backstop). Each input error keeps that text and
// adds the field in parentheses: `Invalid sandbox environment variable. (env key "MY-VAR")`.
const NUL_IN_VALUE = 'Sandbox command values cannot contain NUL.'
const COMMAND_REQUIRED = 'A sandbox command is required.'
const INVALID_ENV = 'Invalid sandbox environment variable.'
const INVALID_SANDBOX_ID = 'Invalid sandbox ID.'
const INVALID_PROCESS_ID = 'Invalid process ID.'
const ID_RULE = "1 to 200 letters, digits, '-' or '_'"
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/
const MAX_SHOWN = 64
// Shorter secrets are not looked for in env names (every name would hold a 1-letter one).
const MIN_SECRET = 4

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
      try {
        if (Array.isArray(value)) return 'an array'
        if (typeof Buffer === 'function' && Buffer.isBuffer(value)) return 'a Buffer'
        if (ArrayBuffer.isView(value)) return `a ${value.constructor && value.constructor.name ? value.constructor.name : 'typed array'}`
        if (value instanceof Map) return 'a Map'
        if (value instanceof Set) return 'a Set'
        if (!isPlainObject(value)) return `an instance of ${className(value)}`
      } catch {
        // A proxy whose traps throw: an object all the same.
      }
      return 'an object'
  }
}

function className(value) {
  try {
    const name = Object.getPrototypeOf(value).constructor.name
    if (typeof name === 'string' && /^[A-Za-z_$][\w$]{0,63}$/.test(name)) return name
  } catch {
    // A proxy or an odd prototype: no name to give.
  }
  return 'a class'
}

// An object literal or Object.create(null), from this realm or another (a vm context):
// its prototype is null or a prototype whose own prototype is null, and it is no builtin.
function isPlainObject(value) {
  if (value === null || typeof value !== 'object') return false
  try {
    const proto = Object.getPrototypeOf(value)
    if (proto === null) return true
    return Object.getPrototypeOf(proto) === null && Object.prototype.toString.call(value) === '[object Object]'
  } catch {
    return false
  }
}

// A caller's string inside a message (an env name): quoted, bounded, control characters escaped.
function shown(text) {
  return text.length > MAX_SHOWN ? `${JSON.stringify(text.slice(0, MAX_SHOWN))}…` : JSON.stringify(text)
}

// How a message names env key number `index`: `env.NAME`, `env["odd name"]` (bounded), or,
// when the name holds one of the client's secrets (its API key, a store password), only its
// position: a secret never appears in a message, wherever the caller put it.
function envNamer(secrets) {
  const holdsSecret = (key) => secrets.some((secret) => key.includes(secret))
  return {
    path: (key, index) => {
      if (holdsSecret(key)) return `env key #${index + 1}`
      return ENV_NAME.test(key) && key.length <= MAX_SHOWN ? `env.${key}` : `env[${shown(key)}]`
    },
    key: (key, index) => (holdsSecret(key) ? `env key #${index + 1}, which holds a secret of the client` : `env key ${shown(key)}`),
  }
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

// A string the command uses: NUL would cut it short in the sandbox.
function commandValue(value, path) {
  requireString(value, path)
  if (value.includes('\0')) throw new CreateosInputError(`${NUL_IN_VALUE} (${path})`)
  return value
}

/** A sandbox or process ID as the API names them (`kind`: 'sandbox' or 'process'). */
function requireId(value, path, kind) {
  const message = kind === 'process' ? INVALID_PROCESS_ID : INVALID_SANDBOX_ID
  if (typeof value !== 'string') throw new CreateosInputError(`${message} (${path} must be a string of ${ID_RULE}; got ${describe(value)})`)
  if (!/^[A-Za-z0-9_-]{1,200}$/.test(value)) throw new CreateosInputError(`${message} (${path} must be ${ID_RULE})`)
  return value
}

/**
 * The command parameters as plain JSON, every type and rule checked here (the native layer
 * checks them again): no value JSON cannot hold (a Buffer, a function, a symbol, a bigint)
 * reaches it, and a refusal names the field. `secrets` (the client's key, store passwords) are
 * never shown, even where the caller put one into an env name.
 */
function nativeParams(params, secrets = []) {
  if (params === null || typeof params !== 'object') {
    throw new CreateosInputError(`params must be an object with lease and command (got ${describe(params)}).`)
  }
  const out = {}
  const lease = param(params, 'lease', 'lease')
  if (lease === null || typeof lease !== 'object') {
    throw new CreateosInputError(`lease must be an object with providerLeaseId (got ${describe(lease)}).`)
  }
  out.sandboxId = requireId(param(lease, 'providerLeaseId', 'lease.providerLeaseId'), 'lease.providerLeaseId', 'sandbox')
  const command = param(params, 'command', 'command')
  if (typeof command !== 'string' || command === '') {
    throw new CreateosInputError(`${COMMAND_REQUIRED} (command must be a non-empty string; got ${command === '' ? 'an empty string' : describe(command)})`)
  }
  out.command = commandValue(command, 'command')
  const args = param(params, 'args', 'args')
  if (args !== undefined && args !== null) {
    if (!Array.isArray(args)) throw new CreateosInputError(`args must be an array of strings (got ${describe(args)}).`)
    // Array.from visits holes too (a hole is an undefined element).
    out.args = Array.from(args, (arg, i) => commandValue(arg, `args[${i}]`))
  }
  const cwd = param(params, 'cwd', 'cwd')
  if (cwd !== undefined && cwd !== null) out.cwd = commandValue(cwd, 'cwd')
  const env = param(params, 'env', 'env')
  if (env !== undefined && env !== null) {
    // Only a plain object: a Map's entries (or a class instance's fields) are not own
    // enumerable keys, so reading one as an object would run the command without them.
    if (!isPlainObject(env)) {
      throw new CreateosInputError(`env must be a plain object whose values are strings (got ${describe(env)}).`)
    }
    out.env = {}
    const name = envNamer(secrets.filter((secret) => typeof secret === 'string' && secret.length >= MIN_SECRET))
    ownKeys(env).forEach((key, i) => {
      if (!ENV_NAME.test(key)) throw new CreateosInputError(`${INVALID_ENV} (${name.key(key, i)})`)
      const value = param(env, key, name.path(key, i))
      if (typeof value !== 'string') throw new CreateosInputError(`${INVALID_ENV} (${name.path(key, i)} must be a string; got ${describe(value)})`)
      out.env[key] = commandValue(value, name.path(key, i))
    })
  }
  const stdin = param(params, 'stdin', 'stdin')
  if (stdin !== undefined && stdin !== null) {
    requireString(stdin, 'stdin', 'a string or null')
    // Staged as a file, so NUL would survive; refused like every other value the caller passes.
    if (stdin.includes('\0')) throw new CreateosInputError(`${NUL_IN_VALUE} (stdin)`)
    out.stdin = stdin
  }
  // The SDK's per-command opt-out of a persistent session (config.session): this command
  // runs in the default mode.
  const bypass = param(params, 'bypassSession', 'bypassSession')
  if (bypass !== undefined && bypass !== null) {
    if (typeof bypass !== 'boolean') throw new CreateosInputError(`bypassSession must be true or false (got ${describe(bypass)}).`)
    if (bypass) out.bypassSession = true
  }
  return out
}

function requireFunction(value, path, optional = false) {
  if (optional && (value === undefined || value === null)) return undefined
  if (typeof value !== 'function') throw new CreateosInputError(`${path} must be a function (got ${describe(value)}).`)
  return value
}

/** The caller's `log` callback, guarded: a throw or a rejection is reported once, never fatal. */
function guardLog(log) {
  if (requireFunction(log, 'log', true) === undefined) return undefined
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

function checkSignal(signal) {
  if (signal === undefined || signal === null) return undefined
  if (typeof signal !== 'object' || typeof signal.aborted !== 'boolean' || typeof signal.addEventListener !== 'function') {
    throw new CreateosInputError(`signal must be an AbortSignal (got ${describe(signal)}).`)
  }
  return signal
}

module.exports = {
  readField,
  ownKeys,
  describe,
  param,
  requireString,
  requireId,
  requireFunction,
  isPlainObject,
  NUL_IN_VALUE,
  nativeParams,
  guardLog,
  checkSignal,
}
