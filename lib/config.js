'use strict'

// The host's client object (`client.config`, `client.apiKey`) → the plain config the native
// client parses, and the warning for a misspelled config key. The fields' rules are checked
// natively; this module only reads the fields this package knows and keeps them JSON.

const { CreateosInputError } = require('./errors.js')
const { readField, ownKeys, describe } = require('./input.js')

const DEFAULT_TIMEOUT_MS = 300_000

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
  // Read by lib/fetch-transport.js (which transport carries the requests); native ignores it.
  'transport',
  // Test hook: honoured only by a build with the `test-hooks` feature.
  '__panicAt',
])
const PACING_FIELDS = Object.freeze(['limit', 'windowMs', 'intervalMs', 'store', 'key', 'allowPlaintextPassword'])
const MAX_CONFIG_DEPTH = 4

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

// CREATEOS_PACING_STORE: the pacing store of every client that names none (read here
// because a worker thread's process.env is its own).
function withStoreDefault(out) {
  const store = process.env.CREATEOS_PACING_STORE
  if (typeof store === 'string' && store.trim() !== '') out.pacingStoreDefault = store
  return out
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

module.exports = { CONFIG_FIELDS, PACING_FIELDS, DEFAULT_TIMEOUT_MS, nativeClient, urlClient }
