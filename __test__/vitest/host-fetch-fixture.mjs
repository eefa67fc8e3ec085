// A host's fetch fixture, written as a plugin's test suite writes one: a function to install
// with vi.stubGlobal('fetch', …) that answers CreateOS's routes with JSend envelopes and
// NDJSON streams, and records every (url, init) it was called with.
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
/** The package under test (CREATEOS_EXECUTE_UNDER_TEST points at another checkout's index.js). */
export const lib = require(process.env.CREATEOS_EXECUTE_UNDER_TEST || '../../index.js')

export const API = 'https://api.createos.test'
export const KEY = 'sk-host-fixture-key'
export const SANDBOX = 'sb-host-1'

export function client(extra = {}) {
  return { config: { apiUrl: API, timeoutMs: 10_000, pacing: 'off', ...extra }, apiKey: KEY }
}

export function params(extra = {}) {
  return { lease: { providerLeaseId: SANDBOX }, command: 'echo', args: ['hello'], ...extra }
}

const json = (data, status = 200) =>
  new Response(JSON.stringify({ status: 'success', data }), { status, headers: { 'content-type': 'application/json' } })
const failure = (status) =>
  new Response(JSON.stringify({ status: 'error', message: 'no' }), { status, headers: { 'content-type': 'application/json' } })

export const data = (seq, text, stream = 'stdout') =>
  ({ type: 'data', seq, stream, data_base64: Buffer.from(text).toString('base64') })
export const exit = (code, newestSeq) =>
  ({ type: 'exit', exit_code: code, signal: null, tree_exited: true, newest_seq: newestSeq })

/**
 * An NDJSON body: `frames` in order, then `end` ('close' = the end of the body, 'error' = the
 * body breaks as a lost connection does, 'hang' = nothing more until cancelled).
 * `stream.cancelled` says whether the reader cancelled it.
 */
export function ndjson(frames, end = 'close') {
  const state = { cancelled: false }
  const lines = frames.map((f) => `${JSON.stringify(f)}\n`)
  const body = new ReadableStream({
    pull(controller) {
      if (lines.length > 0) {
        controller.enqueue(new TextEncoder().encode(lines.shift()))
        return undefined
      }
      if (end === 'close') controller.close()
      else if (end === 'error') controller.error(new TypeError('terminated'))
      else return new Promise(() => {}) // hang
      return undefined
    },
    cancel() {
      state.cancelled = true
    },
  })
  return { state, response: () => new Response(body, { headers: { 'content-type': 'application/x-ndjson' } }) }
}

/**
 * The fixture: `routes` overrides per route name
 * (upload, create, connect(n, after), stdinClose, remove, exec, execStream, list, get, wait,
 * destroy, getSandbox); each returns a Response (or throws, as a lost connection does).
 */
export function createosFixture(routes = {}) {
  const requests = []
  let connects = 0
  const defaults = {
    upload: () => json({}),
    create: () => json({ process_id: 'proc-1', state: 'running' }, 201),
    connect: () => ndjson([data(1, 'hello\n'), exit(0, 1)]).response(),
    stdinClose: () => json({}),
    remove: () => json({ process_id: 'proc-1', leader_exited: true, tree_exited: true, exit_code: 143 }),
    exec: () => json({ result: { stdout: '', stderr: '', exit_code: 0 }, exec_ms: 1 }),
    execStream: () => ndjson([{ stdout: 'streamed\n' }, { exit_code: 0 }]).response(),
    list: () => json({ processes: [], total: 0 }),
    get: () => json({ process_id: 'proc-1', state: 'exited', tree_exited: true, exit_code: 0, output: { newest_seq: 1 } }),
    wait: () => json({ process_id: 'proc-1', state: 'exited', tree_exited: true, exit_code: 0, output: { newest_seq: 1 } }),
    destroy: () => json({}),
    getSandbox: () => failure(404),
  }
  const r = { ...defaults, ...routes }
  const fetch = async (input, init) => {
    const url = typeof input === 'string' ? input : String(input)
    requests.push({ url, init })
    const u = new URL(url)
    const method = (init && init.method) || 'GET'
    const p = u.pathname
    const sb = `/v1/sandboxes/${SANDBOX}`
    if (p === `${sb}/files` && method === 'PUT') return r.upload(u, init)
    if (p === `${sb}/processes` && method === 'POST') return r.create(u, init)
    if (p === `${sb}/processes` && method === 'GET') return r.list(u, init)
    if (/\/processes\/[^/]+\/connect$/.test(p)) return r.connect(++connects, Number(u.searchParams.get('after')), init)
    if (/\/processes\/[^/]+\/stdin\/close$/.test(p)) return r.stdinClose(u, init)
    if (/\/processes\/[^/]+\/wait$/.test(p)) return r.wait(u, init)
    if (/\/processes\/[^/]+$/.test(p) && method === 'DELETE') return r.remove(u, init)
    if (/\/processes\/[^/]+$/.test(p) && method === 'GET') return r.get(u, init)
    if (p === `${sb}/exec` && u.searchParams.get('stream') === 'true') return r.execStream(u, init)
    if (p === `${sb}/exec`) return r.exec(u, init)
    if (p === sb && method === 'DELETE') return r.destroy(u, init)
    if (p === sb && method === 'GET') return r.getSandbox(u, init)
    return failure(404)
  }
  return { fetch, requests, kinds: () => requests.map(kindOf) }
}

/** A request's kind, by method and path, for assertions on order. */
export function kindOf({ url, init }) {
  const u = new URL(url)
  const m = (init && init.method) || 'GET'
  const p = u.pathname.replace(`/v1/sandboxes/${SANDBOX}`, '')
  if (p === '/files') return 'upload'
  if (p === '/processes') return m === 'POST' ? 'create' : 'list'
  if (p.endsWith('/connect')) return 'connect'
  if (p.endsWith('/stdin/close')) return 'stdinClose'
  if (p.endsWith('/wait')) return 'wait'
  if (p.startsWith('/processes/')) return m === 'DELETE' ? 'remove' : 'get'
  if (p === '/exec') return u.searchParams.get('stream') === 'true' ? 'execStream' : 'exec'
  if (p === '') return m === 'DELETE' ? 'destroy' : 'getSandbox'
  return `${m} ${u.pathname}`
}

/** The init every request through fetch must have, as the TypeScript module sent it. */
export function assertInit(expect, { url, init }) {
  expect(typeof url).toBe('string')
  expect(url.startsWith(`${API}/v1/sandboxes/${SANDBOX}`)).toBe(true)
  expect(Object.getPrototypeOf(init.headers)).toBe(Object.prototype)
  expect(init.headers['X-Api-Key']).toBe(KEY)
  expect(init.redirect).toBe('error')
  expect(init.signal).toBeInstanceOf(AbortSignal)
  if (init.body !== undefined) {
    expect(typeof init.body).toBe('string')
    const type = init.headers['Content-Type']
    if (type === 'application/json') JSON.parse(init.body)
    else expect(type).toBe('application/octet-stream')
    expect(Object.keys(init.headers)).toEqual(['Content-Type', 'X-Api-Key'])
  } else {
    expect(Object.keys(init.headers)).toEqual(['X-Api-Key'])
  }
}
