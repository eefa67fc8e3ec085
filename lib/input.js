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
  requireFunction,
  nativeParams,
  guardLog,
  checkSignal,
}
