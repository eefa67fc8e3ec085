'use strict'

// The host's client object (`client.config`, `client.apiKey`) → the plain config the native
// client parses, and the warning for a misspelled config key. Only the fields this package
// knows are read, each once, and each is type- and range-checked here before anything is sent;
// the native config checks them again (the forms of URLs and certificates only there).

const { CreateosInputError } = require('./errors.js')
const { readField, ownKeys, describe } = require('./input.js')

const DEFAULT_TIMEOUT_MS = 300_000

// The `client.config` fields this package reads. Nothing else of the host's config
// object is touched (hosts put methods, getters and class instances there). Add a
// field here, and its check to CHECKS, when the native config learns it.
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
  'session',
  // Which transport carries the requests (lib/fetch-transport.js); native ignores it.
  'transport',
  // Test hook: honoured only by a build with the `test-hooks` feature.
  '__panicAt',
])
const PACING_FIELDS = Object.freeze(['limit', 'windowMs', 'intervalMs', 'store', 'key', 'allowPlaintextPassword'])
const PACING_MODES = Object.freeze(['window', 'spacing', 'off'])
const MAX_GRACE_STEPS = 16

// The native config's messages (crates/core/src/config.rs, net.rs): the same text here, so a
// host sees one wording whichever layer refuses a value. JS adds what it got in parentheses.
const MESSAGES = Object.freeze({
  apiUrl: 'CreateOS requires an API URL.',
  timeoutMs: 'timeoutMs must be an integer between 1 and 86400000.',
  pacing: "pacing must be 'window', 'spacing', 'off' or an object { limit, windowMs, store, key } or { intervalMs, store, key }.",
  'pacing.limit': 'pacing.limit must be an integer between 1 and 1000000.',
  'pacing.windowMs': 'pacing.windowMs must be an integer between 1 and 3600000.',
  'pacing.intervalMs': 'pacing.intervalMs must be an integer between 0 and 600000.',
  'pacing.store': 'pacing.store must be a redis:// or rediss:// URL, or false.',
  'pacing.key': 'pacing.key must be 1 to 200 printable ASCII characters without spaces or braces, and must not contain the API key.',
  'pacing.allowPlaintextPassword': 'pacing.allowPlaintextPassword must be true or false.',
  cleanupGraceMs: `cleanupGraceMs must be a non-empty array of at most ${MAX_GRACE_STEPS} integers between 0 and 600000.`,
  cleanupDeadlineMs: 'cleanupDeadlineMs must be an integer between 1 and 86400000.',
  confirmPollMs: 'confirmPollMs must be an integer between 1 and 600000.',
  legacyCleanup: 'legacyCleanup must be true or false.',
  leftoverProcesses: "leftoverProcesses must be 'keep' or 'terminate'.",
  streamIdleTimeoutMs: 'streamIdleTimeoutMs must be an integer between 1000 and 3600000.',
  proxy: 'proxy must be an http:// or https:// proxy URL.',
  caCertPem: 'caCertPem must be a PEM string with at least one certificate.',
  transport: "transport must be 'native' or 'fetch'.",
  session: 'session must be true, false or an object { idleMs }.',
  'session.idleMs': 'session.idleMs must be an integer between 1000 and 3600000.',
})

/** What a config value was, for a message: its type, or a number itself (never a string's content). */
function got(field) {
  if (field.threw) return 'a throwing getter'
  const v = field.value
  return typeof v === 'number' ? String(v) : describe(v)
}

function refuse(path, detail) {
  return new CreateosInputError(`${MESSAGES[path]} (${detail})`)
}

// Each checker gets { value, threw } (a present value: not undefined or null) and returns the
// JSON the native config parses, or throws a CreateosInputError naming the field.
const integerIn = (path, min, max) => (field) => {
  const v = field.value
  if (field.threw || typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) throw refuse(path, `got ${got(field)}`)
  return v
}
const stringField = (path) => (field) => {
  if (field.threw || typeof field.value !== 'string') throw refuse(path, `got ${got(field)}`)
  return field.value
}
const booleanField = (path) => (field) => {
  if (field.threw || typeof field.value !== 'boolean') throw refuse(path, `got ${got(field)}`)
  return field.value
}
const oneOf = (path, allowed) => (field) => {
  if (field.threw || typeof field.value !== 'string' || !allowed.includes(field.value)) {
    throw refuse(path, typeof field.value === 'string' ? 'got an unsupported string' : `got ${got(field)}`)
  }
  return field.value
}

function graces(field) {
  const v = field.value
  if (field.threw || !Array.isArray(v)) throw refuse('cleanupGraceMs', `got ${got(field)}`)
  let length
  try {
    length = v.length
  } catch {
    throw refuse('cleanupGraceMs', 'got an array that could not be read')
  }
  if (length === 0 || length > MAX_GRACE_STEPS) throw refuse('cleanupGraceMs', `got ${length} entries`)
  const out = []
  for (let i = 0; i < length; i++) {
    const entry = readField(v, i)
    if (entry.threw || typeof entry.value !== 'number' || !Number.isInteger(entry.value) || entry.value < 0 || entry.value > 600_000) {
      throw refuse('cleanupGraceMs', `cleanupGraceMs[${i}] is ${got(entry)}`)
    }
    out.push(entry.value)
  }
  return out
}

// `session`: a boolean, or `{ idleMs }` (crates/core/src/session.rs).
function session(field) {
  const v = field.value
  if (!field.threw && typeof v === 'boolean') return v
  if (field.threw || typeof v !== 'object' || Array.isArray(v) || ArrayBuffer.isView(v)) throw refuse('session', `got ${got(field)}`)
  const idle = readField(v, 'idleMs')
  if (!idle.threw && (idle.value === undefined || idle.value === null)) return {}
  return { idleMs: integerIn('session.idleMs', 1000, 3_600_000)(idle) }
}

const PACING_CHECKS = {
  limit: integerIn('pacing.limit', 1, 1_000_000),
  windowMs: integerIn('pacing.windowMs', 1, 3_600_000),
  intervalMs: integerIn('pacing.intervalMs', 0, 600_000),
  store: (field) => {
    if (field.threw || (typeof field.value !== 'string' && field.value !== false)) throw refuse('pacing.store', `got ${got(field)}`)
    return field.value
  },
  key: stringField('pacing.key'), // its content is checked in checkPacingKey, with the API key
  allowPlaintextPassword: booleanField('pacing.allowPlaintextPassword'),
}

function pacing(field) {
  const v = field.value
  if (!field.threw && typeof v === 'string' && PACING_MODES.includes(v)) return v
  if (field.threw || typeof v !== 'object' || Array.isArray(v) || ArrayBuffer.isView(v)) {
    throw refuse('pacing', typeof v === 'string' ? 'got an unsupported string' : `got ${got(field)}`)
  }
  const out = {}
  for (const key of PACING_FIELDS) {
    const sub = readField(v, key)
    if (!sub.threw && (sub.value === undefined || sub.value === null)) continue
    out[key] = PACING_CHECKS[key](sub)
  }
  return out
}

// A pacing key is shared by every process using the same store: printable ASCII without spaces
// or braces (braces would pick a Redis Cluster hash slot), and never the API key.
function checkPacingKey(key, apiKey) {
  const printable = /^[\x21-\x7a\x7c\x7e]+$/.test(key) // '!'..'~' without '{' (0x7b) and '}' (0x7d)
  if (!printable || key.length > 200) throw refuse('pacing.key', `got ${key.length === 0 ? 'an empty string' : 'an unsupported string'}`)
  if (apiKey !== '' && key.includes(apiKey)) throw refuse('pacing.key', 'it contains the API key')
}

// The checks of every field but apiUrl (read first) and __panicAt (a test hook, left to
// the native check). Add a field here, and to CONFIG_FIELDS, when the native config learns it.
const CHECKS = {
  timeoutMs: integerIn('timeoutMs', 1, 86_400_000),
  pacing,
  cleanupGraceMs: graces,
  confirmPollMs: integerIn('confirmPollMs', 1, 600_000),
  cleanupDeadlineMs: integerIn('cleanupDeadlineMs', 1, 86_400_000),
  legacyCleanup: booleanField('legacyCleanup'),
  leftoverProcesses: oneOf('leftoverProcesses', ['keep', 'terminate']),
  streamIdleTimeoutMs: integerIn('streamIdleTimeoutMs', 1000, 3_600_000),
  proxy: stringField('proxy'),
  caCertPem: stringField('caCertPem'),
  // Read by lib/fetch-transport.js; the native config ignores it.
  transport: oneOf('transport', ['native', 'fetch']),
  session,
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

// CREATEOS_PACING_STORE: the pacing store of every client that names none (read here
// because a worker thread's process.env is its own).
function withStoreDefault(out) {
  const store = process.env.CREATEOS_PACING_STORE
  if (typeof store === 'string' && store.trim() !== '') out.pacingStoreDefault = store
  return out
}

/**
 * Host client (`client.config`, `client.apiKey`) or `{ config, apiKey }` → NativeClient. Only
 * the fields in CONFIG_FIELDS are read, each once; every one is type- and range-checked here,
 * before anything is sent (the URL's, the store's, the proxy's and the certificate's form are
 * checked natively, with the same kind of message).
 */
function nativeClient(client) {
  if (client === null || typeof client !== 'object') {
    throw new CreateosInputError(`client must be an object with a config object (got ${describe(client)}).`)
  }
  const config = readField(client, 'config').value
  if (config === null || typeof config !== 'object') {
    throw new CreateosInputError(`client.config must be an object (got ${describe(config)}).`)
  }
  warnUnknownFields(config)
  const apiUrl = readField(config, 'apiUrl')
  if (apiUrl.threw || typeof apiUrl.value !== 'string') throw refuse('apiUrl', `apiUrl must be a string; got ${got(apiUrl)}`)
  const out = { apiUrl: apiUrl.value }
  for (const key of Object.keys(CHECKS)) {
    const field = readField(config, key)
    if (!field.threw && (field.value === undefined || field.value === null)) continue
    out[key] = CHECKS[key](field)
  }
  const panicAt = readField(config, '__panicAt')
  if (panicAt.threw || (panicAt.value !== undefined && panicAt.value !== null)) {
    out.__panicAt = typeof panicAt.value === 'string' ? panicAt.value : NOT_JSON
  }
  out.apiKey = resolveApiKey(client, config)
  if (out.pacing !== null && typeof out.pacing === 'object' && typeof out.pacing.key === 'string') checkPacingKey(out.pacing.key, out.apiKey)
  out.timeoutMs = out.timeoutMs ?? DEFAULT_TIMEOUT_MS
  // pacingStoreDefault is not a config field (not in CONFIG_FIELDS): only the environment sets it.
  withStoreDefault(out)
  return out
}

// A value the native check refuses with its own message (a test hook's wrong type).
const NOT_JSON = '[invalid]'

// The password of a redis:// or rediss:// store URL, if it has one.
function storePassword(url) {
  if (typeof url !== 'string') return ''
  try {
    const password = new URL(url.trim()).password
    return password ? decodeURIComponent(password) : ''
  } catch {
    return ''
  }
}

/** The secrets of a native client (its key, store passwords): never shown in a message. */
function clientSecrets(c) {
  const store = c.pacing !== null && typeof c.pacing === 'object' ? c.pacing.store : undefined
  return [c.apiKey, storePassword(store), storePassword(c.pacingStoreDefault)].filter((s) => s !== '')
}

/** The client `waitForRequest` builds for an API URL alone. */
function urlClient(apiUrl) {
  return withStoreDefault({ apiUrl, apiKey: '', timeoutMs: DEFAULT_TIMEOUT_MS })
}

// ---------------------------------------------------------------------------
// Misspelled config keys: a host's own fields are allowed (the plugin's config object holds
// many), so only a key within a small edit distance of one this package reads is reported,
// once per key and process, with the key it probably meant.

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

module.exports = { CONFIG_FIELDS, PACING_FIELDS, DEFAULT_TIMEOUT_MS, MESSAGES, nativeClient, urlClient, clientSecrets }
