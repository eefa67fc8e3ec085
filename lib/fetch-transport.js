'use strict'

// The host's `fetch` as the transport of a call (crates/core/src/transport.rs is the seam).
//
// Which transport, per call: the native client when `globalThis.fetch` is Node's own and no
// undici global dispatcher other than Node's own is installed; else the host's `fetch`, so its
// stubs, interceptors, MockAgent, proxy or mTLS dispatcher and tracers apply.
// `config.transport: 'native' | 'fetch'` forces one.
//
// Through `fetch`, a request looks as the TypeScript module made it: the URL as a string,
// a plain headers object (`Content-Type` when there is a body, then `X-Api-Key`),
// `redirect: 'error'`, an AbortSignal, JSON and uploads as strings. Rust pulls the body
// one batch (at most 256 KiB) at a time; ahead of that this side reads at most HIGH_WATER
// bytes, so the memory bound is the native path's. Rust dropping an exchange cancels it here:
// the AbortController aborts and the body's reader is cancelled (the host's stream sees it).

const { CreateosInputError } = require('./errors.js')

const DISPATCHER = Symbol.for('undici.globalDispatcher.1')
const INVALID_TRANSPORT = "transport must be 'native' or 'fetch'."
const BATCH_BYTES = 256 * 1024
const HIGH_WATER = 512 * 1024
const MAX_HEADERS = 64
const DONE = Object.freeze({ done: true })
const BROKEN = Object.freeze({ error: 'broken' })

// ---------------------------------------------------------------------------
// Is it Node's own?

// Node's fetch (20, 22, 24) is a small function that loads Node's bundled undici, an
// internal module no user code can require: its source names it. A stub, a wrapper or a
// Proxy around fetch does not.
const fetchVerdicts = new WeakMap()
function isNodeFetch(f) {
  let verdict = fetchVerdicts.get(f)
  if (verdict === undefined) {
    let source = ''
    try {
      source = Function.prototype.toString.call(f)
    } catch {
      // A revoked Proxy: not Node's.
    }
    verdict = source.includes("require('internal/deps/undici/undici')")
    fetchVerdicts.set(f, verdict)
  }
  return verdict
}

// Node's default dispatcher (an Agent, or the EnvHttpProxyAgent Node installs for
// NODE_USE_ENV_PROXY, whose rules the native client follows too) is an instance of Node's
// bundled undici: its methods live in `node:internal/deps/undici/undici`. Anything else the
// host installed with setGlobalDispatcher (a MockAgent, a ProxyAgent, an Agent of npm's
// undici with client certificates or its own lookup) is the host's. Only an object named
// Agent or EnvHttpProxyAgent is probed, once: `dispatch({}, null)` throws at once in undici's
// handler check (no request, no side effect), and the top frame's file says whose it is.
const dispatcherVerdicts = new WeakMap()
function isNodeDispatcher(d) {
  if (d === undefined) return true // none yet: Node creates its own on first use
  if (d === null || (typeof d !== 'object' && typeof d !== 'function')) return false
  let verdict = dispatcherVerdicts.get(d)
  if (verdict === undefined) {
    verdict = probeDispatcher(d)
    dispatcherVerdicts.set(d, verdict)
  }
  return verdict
}

function probeDispatcher(d) {
  let name
  try {
    name = d.constructor && d.constructor.name
  } catch {
    return false
  }
  if (name !== 'Agent' && name !== 'EnvHttpProxyAgent') return false
  const prepare = Error.prepareStackTrace
  const limit = Error.stackTraceLimit
  let files = []
  try {
    Error.stackTraceLimit = 16
    Error.prepareStackTrace = (_error, sites) => sites.map((site) => String(site.getFileName() || ''))
    try {
      d.dispatch({}, null)
    } catch (error) {
      const stack = error !== null && typeof error === 'object' ? error.stack : undefined
      if (Array.isArray(stack)) files = stack
    }
  } catch {
    files = []
  } finally {
    Error.prepareStackTrace = prepare
    Error.stackTraceLimit = limit
  }
  // Every frame between the throw and this probe is Node's undici: a host's wrapper (a class
  // named Agent whose dispatch logs, adds headers, then calls Node's own Agent) has a frame
  // of its own in between, and is the host's.
  const ours = files.indexOf(__filename)
  if (ours <= 0) return false
  return files.slice(0, ours).every((file) => file.startsWith('node:internal/deps/undici/'))
}

// ---------------------------------------------------------------------------
// The choice, per call

let warned = false
function warnOnce(why) {
  if (warned) return
  warned = true
  process.emitWarning(
    `createos-execute: requests go through the host's fetch, because ${why}. ` +
    "Set client.config.transport to 'native' to send them from native code instead.",
    { code: 'CREATEOS_TRANSPORT_FETCH' },
  )
}

/**
 * The bridge for this call's requests, or undefined for the native client. `transport` is
 * the client's `config.transport` (already read by lib/config.js).
 */
function transportFor(transport) {
  if (transport === 'native') return undefined
  if (transport === 'fetch') return makeBridge()
  if (transport !== undefined && transport !== null) throw new CreateosInputError(INVALID_TRANSPORT)
  const f = globalThis.fetch
  if (typeof f !== 'function') return undefined
  if (!isNodeFetch(f)) {
    warnOnce('globalThis.fetch is not Node\'s own (a stub, a wrapper or a tracer replaced it)')
    return makeBridge()
  }
  if (!isNodeDispatcher(globalThis[DISPATCHER])) {
    warnOnce('the host installed its own undici global dispatcher (setGlobalDispatcher)')
    return makeBridge()
  }
  return undefined
}

// ---------------------------------------------------------------------------
// The bridge Rust calls: { op: 'fetch' | 'read' | 'cancel', id, ... } → Promise<reply>

// One per call: the ids are the call's own.
function makeBridge() {
  const exchanges = new Map()
  // What the host's fetch threw, cleaned (see `cause`), for the call's error.
  const seen = { cause: undefined, unmatched: undefined }
  const transport = function transport(call) {
    try {
      switch (call.op) {
        case 'fetch':
          return start(exchanges, call, seen)
        case 'read':
          return read(exchanges, call.id)
        default:
          cancel(exchanges, call.id)
          return Promise.resolve(DONE)
      }
    } catch {
      return Promise.resolve(call.op === 'fetch' ? { error: 'lost' } : BROKEN)
    }
  }
  transport[SEEN] = seen
  return transport
}

const SEEN = Symbol('createos-execute.fetchFailures')

async function start(exchanges, call, seen) {
  const controller = new AbortController()
  const ex = { controller, reader: null, whole: null, queue: [], queued: 0, done: false, broken: false, waiter: null, pumping: false, cancelled: false, timer: null }
  exchanges.set(call.id, ex)
  const headers = {}
  const list = Array.isArray(call.headers) ? call.headers : []
  for (let i = 0; i + 1 < list.length; i += 2) headers[list[i]] = list[i + 1]
  const init = { method: call.method, headers, redirect: 'error', signal: controller.signal }
  if (call.body !== undefined && call.body !== null) init.body = call.body
  if (typeof call.timeoutMs === 'number' && call.timeoutMs > 0) {
    ex.timer = setTimeout(() => controller.abort(new DOMException('The operation timed out.', 'TimeoutError')), call.timeoutMs)
  }
  let response
  try {
    const f = globalThis.fetch
    if (typeof f !== 'function') throw Object.assign(new Error('no fetch'), { code: 'ERR_NO_FETCH' })
    response = await f(call.url, init)
  } catch (error) {
    clearTimeout(ex.timer)
    exchanges.delete(call.id)
    const reply = failure(error)
    if (!ex.cancelled) {
      // Rust cancelling the exchange (its deadline, the call's abort) is not the host's failure.
      const cause = cleanCause(error, call, headers, reply.error === 'unmatched')
      seen.cause = cause
      if (reply.error === 'unmatched' && seen.unmatched === undefined) seen.unmatched = cause
    }
    return reply
  }
  clearTimeout(ex.timer)
  if (ex.cancelled || response === null || typeof response !== 'object' || !Number.isInteger(response.status)) {
    exchanges.delete(call.id)
    discard(response)
    return { error: 'lost' }
  }
  const body = response.body
  if (body !== null && body !== undefined && typeof body.getReader === 'function') {
    ex.reader = body.getReader()
  } else {
    // A stub's plain object ({ ok, status, json() }) or a Response without a body.
    ex.whole = response
  }
  return { status: response.status, headers: headerList(response.headers) }
}

function headerList(headers) {
  const out = []
  try {
    if (headers && typeof headers.forEach === 'function') {
      headers.forEach((value, name) => {
        if (out.length < MAX_HEADERS * 2) out.push(String(name), String(value))
      })
    }
  } catch {
    // Headers the host's object cannot list: none.
  }
  return out
}

// What a failed fetch proves, in fixed words (never its message, which may hold the URL).
//
// The rule: a request through the host's fetch counts as never sent only where that is
// proven. Here that is: there is no fetch at all, or an interception library said that none
// of its mocks matched the request (the table below). Rust refused what it could before
// calling fetch (a key no header can carry). Any other failure, an ECONNREFUSED included, may
// follow a request that was sent: a host's retrying wrapper rejects with its last error,
// which says nothing of the attempts before it. Those are 'lost' ("maybe sent").
//
// A certificate that did not verify and a proxy's refusal keep their own verdicts (their
// errors name what the host must fix); a refused redirect is recognised in every form.

// The no-match errors of the interception libraries hosts test with. One entry per library;
// __test__/vitest/host-fetch-libraries.test.mjs runs each through the library itself.
const UNMATCHED = Object.freeze([
  // undici MockAgent (disableNetConnect, or no interceptor left): MockNotMatchedError, as
  // the cause of fetch's TypeError('fetch failed').
  { library: 'undici MockAgent', code: 'UND_MOCK_ERR_MOCK_NOT_MATCHED' },
  // nock 14: an Error with this code, thrown by fetch itself.
  { library: 'nock', code: 'ERR_NOCK_NO_MATCH' },
  // msw 2 with onUnhandledRequest: 'error': an InternalError (no code) thrown by fetch.
  { library: 'msw', name: 'InternalError', message: '[MSW] Cannot bypass a request when using the "error" strategy for the "onUnhandledRequest" option.' },
])

function unmatchedEntry(name, code, message) {
  for (const entry of UNMATCHED) {
    if (entry.code !== undefined && entry.code === code) return entry
    if (entry.name !== undefined && entry.name === name && entry.message === message) return entry
  }
  return undefined
}

const NOT_SENT = new Set(['ERR_NO_FETCH'])
const UNTRUSTED = new Set(['UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'SELF_SIGNED_CERT_IN_CHAIN', 'DEPTH_ZERO_SELF_SIGNED_CERT', 'UNABLE_TO_GET_ISSUER_CERT', 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY', 'CERT_HAS_EXPIRED', 'CERT_NOT_YET_VALID', 'CERT_UNTRUSTED', 'CERT_SIGNATURE_FAILURE', 'ERR_TLS_CERT_ALTNAME_INVALID'])
const REDIRECT = /\bredirect\b/i
function failure(error) {
  let e = error
  for (let i = 0; i < 8 && e !== null && e !== undefined; i++) {
    if (typeof e === 'string') {
      // A cause that is only words (msw's refused redirect: cause 'unexpected redirect').
      if (REDIRECT.test(e)) return { error: 'redirect' }
      break
    }
    if (typeof e !== 'object' && typeof e !== 'function') break
    let code = ''
    let message = ''
    let name = ''
    try {
      code = typeof e.code === 'string' ? e.code : ''
      message = typeof e.message === 'string' ? e.message : ''
      name = typeof e.name === 'string' ? e.name : ''
    } catch {
      break
    }
    if (unmatchedEntry(name, code, message) !== undefined) return { error: 'unmatched' }
    if (message === 'unexpected redirect') return { error: 'redirect' }
    if (NOT_SENT.has(code)) return { error: 'not-sent' }
    if (UNTRUSTED.has(code)) return { error: 'untrusted' }
    const proxy = /^Proxy response \((\d{3})\) !== 200/.exec(message)
    if (proxy) return { error: 'proxy-refused', status: Number(proxy[1]) }
    try {
      e = e.cause
    } catch {
      break
    }
  }
  return { error: 'lost' }
}

// ---------------------------------------------------------------------------
// The cause a host sees: what its fetch threw, as a new Error with the same name, code and
// message, cleaned: the first line of the message only (nock and msw print the request's
// headers and body below it), the API key, the request's body, URL credentials and every URL
// query removed, at most 300 characters. For a no-match error the method and the URL (without its query) that had no
// mock are added, so the test's author knows which handler is missing.

const MAX_CAUSE = 300
function cleanCause(error, call, headers, unmatched) {
  let name = 'Error'
  let code
  let message = ''
  try {
    const e = error
    if (e !== null && typeof e === 'object') {
      if (typeof e.name === 'string') name = e.name
      if (typeof e.code === 'string') code = e.code
      if (typeof e.message === 'string') message = e.message
      // fetch's own TypeError('fetch failed') says little: its cause says what happened.
      const inner = e.cause
      if (inner !== null && typeof inner === 'object' && typeof inner.message === 'string' && code === undefined) {
        message = `${message}: ${inner.message}`
        if (typeof inner.code === 'string') code = inner.code
      } else if (typeof inner === 'string') {
        message = `${message}: ${inner}`
      }
    } else {
      message = String(e)
    }
  } catch {
    message = ''
  }
  const body = typeof call.body === 'string' ? call.body : undefined
  message = scrub(message.split('\n')[0], headers, body).slice(0, MAX_CAUSE)
  if (unmatched) message = `${message} (${String(call.method)} ${scrub(String(call.url), headers)})`
  const cause = new Error(message)
  Object.defineProperty(cause, 'name', { value: scrub(name, headers, body).slice(0, 100), writable: true, configurable: true })
  if (code !== undefined) cause.code = scrub(code, headers, body).slice(0, 100)
  cause.stack = `${cause.name}: ${message}`
  return cause
}

function scrub(text, headers, body) {
  let out = String(text)
  const key = headers && headers['X-Api-Key']
  if (typeof key === 'string' && key.length > 0) out = out.split(key).join('[key]')
  // The request's body (the script, with the command's environment; an upload), as written
  // and as JSON would quote it (not a body of a few bytes, such as the gate's).
  if (body !== undefined && body.length >= 8) {
    out = out.split(body).join('[body]')
    const quoted = JSON.stringify(body).slice(1, -1)
    if (quoted.length > 0) out = out.split(quoted).join('[body]')
  }
  return out
    // Credentials in a URL.
    .replace(/\/\/[^/\s@'"`]*@/g, '//')
    // A query: from a '?' to the next space, quote or bracket.
    .replace(/\?[^\s'"`<>(){}\[\]]*/g, '')
}

/** The cause for the call's error: the no-match error when there was one, else the last. */
function fetchFailure(transport) {
  const seen = transport && transport[SEEN]
  if (seen === undefined) return undefined
  return seen.unmatched ?? seen.cause
}

function discard(response) {
  try {
    const body = response && response.body
    if (body && typeof body.cancel === 'function') body.cancel().catch(() => {})
  } catch {
    // Nothing to cancel.
  }
}

// ---------------------------------------------------------------------------
// The body: pulled by Rust, read ahead here up to HIGH_WATER

function read(exchanges, id) {
  const ex = exchanges.get(id)
  if (ex === undefined) return Promise.resolve(BROKEN)
  if (ex.whole !== null) return readWhole(exchanges, id, ex)
  const ready = take(exchanges, id, ex)
  if (ready !== undefined) return Promise.resolve(ready)
  return new Promise((resolve) => {
    ex.waiter = () => {
      const r = take(exchanges, id, ex)
      if (r === undefined) return false
      resolve(r)
      return true
    }
    pump(ex)
  })
}

// The next reply, or undefined when there is nothing yet.
function take(exchanges, id, ex) {
  if (ex.queued > 0) {
    let chunk = ex.queue.shift()
    if (chunk.length < BATCH_BYTES && ex.queue.length > 0) {
      const parts = [chunk]
      let size = chunk.length
      while (ex.queue.length > 0 && size + ex.queue[0].length <= BATCH_BYTES) {
        const next = ex.queue.shift()
        parts.push(next)
        size += next.length
      }
      chunk = parts.length > 1 ? Buffer.concat(parts, size) : chunk
    }
    ex.queued -= chunk.length
    pump(ex)
    return { chunk }
  }
  if (ex.broken) {
    exchanges.delete(id)
    return BROKEN
  }
  if (ex.done) {
    exchanges.delete(id)
    return DONE
  }
  return undefined
}

function wake(ex) {
  const w = ex.waiter
  if (w !== null && w()) ex.waiter = null
}

// Never rejects: whatever the host's body does (a read() that throws or resolves null, a
// chunk that is not a Uint8Array), it is this exchange's stream error, never an unhandled
// rejection of the host process.
async function pump(ex) {
  if (ex.pumping || ex.done || ex.broken) return
  ex.pumping = true
  try {
    while (!ex.done && !ex.broken && !ex.cancelled && ex.queued < HIGH_WATER) {
      const r = await ex.reader.read()
      if (r === null || typeof r !== 'object') {
        ex.broken = true
        break
      }
      if (r.done) {
        ex.done = true
        break
      }
      const v = r.value
      if (v instanceof Uint8Array && v.length > 0) {
        ex.queue.push(Buffer.isBuffer(v) ? v : Buffer.from(v.buffer, v.byteOffset, v.byteLength))
        ex.queued += v.length
      } else if (!(v instanceof Uint8Array)) {
        ex.broken = true
        break
      }
      wake(ex)
    }
  } catch {
    ex.broken = true
  } finally {
    ex.pumping = false
    try {
      wake(ex)
    } catch {
      ex.broken = true
    }
  }
}

// A response without a readable body (a stub's plain object): its whole text, once.
async function readWhole(exchanges, id, ex) {
  const response = ex.whole
  ex.whole = null
  ex.done = true
  try {
    let bytes
    if (typeof response.arrayBuffer === 'function') bytes = Buffer.from(await response.arrayBuffer())
    else if (typeof response.text === 'function') bytes = Buffer.from(String(await response.text()))
    else if (typeof response.json === 'function') bytes = Buffer.from(JSON.stringify(await response.json()))
    else bytes = Buffer.alloc(0)
    if (bytes.length > 0) {
      ex.queue.push(bytes)
      ex.queued += bytes.length
    }
  } catch {
    ex.broken = true
  }
  if (!exchanges.has(id)) return BROKEN
  return take(exchanges, id, ex) ?? DONE
}

function cancel(exchanges, id) {
  const ex = exchanges.get(id)
  if (ex === undefined) return
  exchanges.delete(id)
  ex.cancelled = true
  ex.broken = true
  ex.queue = []
  ex.queued = 0
  clearTimeout(ex.timer)
  try {
    ex.controller.abort()
  } catch {
    // An abort listener of the host's threw: the abort still happened.
  }
  if (ex.reader !== null) ex.reader.cancel().catch(() => {})
  wake(ex)
}

module.exports = { transportFor, fetchFailure, isNodeFetch, isNodeDispatcher, INVALID_TRANSPORT, UNMATCHED }
