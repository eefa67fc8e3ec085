// The interception libraries hosts test with (undici MockAgent, nock, msw), each installed the
// way a host's suite installs it, answering CreateOS's routes from one table. `omit` leaves
// routes unmocked (a forgotten mock); `answers` overrides what a route answers.
import { createRequire } from 'node:module'
import { API, SANDBOX } from './host-fetch-fixture.mjs'

const require = createRequire(import.meta.url)
const undici = require('undici')
const nockModule = require('nock')
const nock = typeof nockModule === 'function' ? nockModule : nockModule.default
const { setupServer } = require('msw/node')
const { http, HttpResponse } = require('msw')

const SB = `/v1/sandboxes/${SANDBOX}`

/** Every route a command uses: its kind, method, msw path and a test on the URL path. */
export const ROUTES = [
  { kind: 'gate', method: 'PUT', msw: `${SB}/files`, test: (p, q) => p === `${SB}/files` && /createos-start-/.test(q) },
  { kind: 'upload', method: 'PUT', msw: `${SB}/files`, test: (p) => p === `${SB}/files` },
  { kind: 'create', method: 'POST', msw: `${SB}/processes`, test: (p) => p === `${SB}/processes` },
  { kind: 'list', method: 'GET', msw: `${SB}/processes`, test: (p) => p === `${SB}/processes` },
  { kind: 'connect', method: 'GET', msw: `${SB}/processes/:pid/connect`, test: (p) => /\/processes\/[^/]+\/connect$/.test(p) },
  { kind: 'stdinClose', method: 'POST', msw: `${SB}/processes/:pid/stdin/close`, test: (p) => /\/stdin\/close$/.test(p) },
  { kind: 'wait', method: 'GET', msw: `${SB}/processes/:pid/wait`, test: (p) => /\/processes\/[^/]+\/wait$/.test(p) },
  { kind: 'delete', method: 'DELETE', msw: `${SB}/processes/:pid`, test: (p) => /\/processes\/[^/]+$/.test(p) },
  { kind: 'get', method: 'GET', msw: `${SB}/processes/:pid`, test: (p) => /\/processes\/[^/]+$/.test(p) },
  { kind: 'exec', method: 'POST', msw: `${SB}/exec`, test: (p) => p === `${SB}/exec` },
  { kind: 'destroy', method: 'DELETE', msw: SB, test: (p) => p === SB },
  { kind: 'getSandbox', method: 'GET', msw: SB, test: (p) => p === SB },
]

const envelope = (data) => JSON.stringify({ status: 'success', data })
const frames = (list) => list.map((f) => `${JSON.stringify(f)}\n`).join('')
const JSON_TYPE = 'application/json'

/** What each route answers by default: { status, body, type }. */
export const DEFAULTS = {
  gate: () => ({ status: 200, body: envelope({}) }),
  upload: () => ({ status: 200, body: envelope({}) }),
  create: () => ({ status: 201, body: envelope({ process_id: 'proc-1', state: 'running' }) }),
  list: () => ({ status: 200, body: envelope({ processes: [], total: 0 }) }),
  connect: () => ({
    status: 200,
    type: 'application/x-ndjson',
    body: frames([
      { type: 'data', seq: 1, stream: 'stdout', data_base64: Buffer.from('hello\n').toString('base64') },
      { type: 'exit', exit_code: 0, signal: null, tree_exited: true, newest_seq: 1 },
    ]),
  }),
  stdinClose: () => ({ status: 200, body: envelope({}) }),
  wait: () => ({ status: 200, body: envelope({ process_id: 'proc-1', state: 'exited', tree_exited: true, exit_code: 0 }) }),
  delete: () => ({ status: 200, body: envelope({ process_id: 'proc-1', leader_exited: true, tree_exited: true, exit_code: 143 }) }),
  get: () => ({ status: 200, body: envelope({ process_id: 'proc-1', state: 'exited', tree_exited: true, exit_code: 0 }) }),
  exec: () => ({ status: 200, body: envelope({ result: { stdout: '', stderr: '', exit_code: 0 }, exec_ms: 1 }) }),
  destroy: () => ({ status: 200, body: envelope({}) }),
  getSandbox: () => ({ status: 404, body: JSON.stringify({ status: 'error', message: 'no' }) }),
}

/** A route's kind for a method and a URL, or undefined. */
export function kindOf(method, url) {
  const u = new URL(url, API)
  return ROUTES.find((r) => r.method === method && r.test(u.pathname, u.search))?.kind
}

function setup(omit, answers) {
  const seen = []
  // msw matches paths only: a handler for the files path that declines a request leaves it
  // unanswered but handled. Forgetting the gate forgets every upload (a command without stdin
  // uploads only its gate).
  const routes = ROUTES.filter((r) => !omit.includes(r.kind) && !(r.kind === 'upload' && omit.includes('gate')))
  const answer = (kind) => {
    seen.push(kind)
    const a = (answers[kind] ?? DEFAULTS[kind])(seen.filter((k) => k === kind).length)
    return { type: JSON_TYPE, ...a }
  }
  return { seen, routes, answer }
}

/** An undici MockAgent with net connect disabled, as the global dispatcher. */
export function installMockAgent({ omit = [], answers = {}, delays = {} } = {}) {
  const { seen, routes, answer } = setup(omit, answers)
  const previous = undici.getGlobalDispatcher()
  const agent = new undici.MockAgent()
  agent.disableNetConnect()
  const pool = agent.get(API)
  for (const r of routes) {
    const matches = (path) => {
      const [p, q = ''] = path.split('?')
      // The gate is an upload: the `upload` route answers every other upload.
      if (r.kind === 'upload' && /createos-start-/.test(q)) return false
      return r.test(p, `?${q}`)
    }
    const scope = pool.intercept({ path: matches, method: r.method }).reply(() => {
      const a = answer(r.kind)
      if (a.error) throw a.error
      return { statusCode: a.status, data: a.body, responseOptions: { headers: { 'content-type': a.type, ...a.headers } } }
    })
    if (delays[r.kind]) scope.delay(delays[r.kind])
    scope.persist()
  }
  undici.setGlobalDispatcher(agent)
  return { seen, async close() { undici.setGlobalDispatcher(previous); await agent.close() } }
}

/** nock, with net connect disabled. */
export function installNock({ omit = [], answers = {}, delays = {} } = {}) {
  const { seen, routes, answer } = setup(omit, answers)
  if (!nock.isActive()) nock.activate()
  nock.disableNetConnect()
  const scope = nock(API).persist()
  for (const r of routes) {
    const interceptor = scope.intercept((uri) => {
      const [p, q = ''] = uri.split('?')
      if (r.kind === 'upload' && /createos-start-/.test(q)) return false
      return r.test(p, `?${q}`)
    }, r.method)
    if (delays[r.kind]) interceptor.delay(delays[r.kind])
    interceptor.reply((_uri, _body, callback) => {
      const a = answer(r.kind)
      if (a.error) return callback(a.error)
      return callback(null, [a.status, a.body, { 'content-type': a.type, ...a.headers }])
    })
  }
  return { seen, async close() { nock.cleanAll(); nock.enableNetConnect(); nock.restore() } }
}

/** msw's setupServer with onUnhandledRequest: 'error'. */
export function installMsw({ omit = [], answers = {}, handlers = [], delays = {} } = {}) {
  const { seen, routes, answer } = setup(omit, answers)
  const list = [...handlers]
  for (const r of routes) {
    list.push(http[r.method.toLowerCase()](`${API}${r.msw}`, async ({ request }) => {
      const q = new URL(request.url).search
      // Not this route: the next handler, or none (then msw's unhandled-request strategy).
      if (r.kind === 'gate' && !/createos-start-/.test(q)) return undefined
      if (r.kind === 'upload' && /createos-start-/.test(q)) return undefined
      if (delays[r.kind]) await new Promise((resolve) => setTimeout(resolve, delays[r.kind]))
      const a = answer(r.kind)
      if (a.error) return HttpResponse.error()
      if (a.response) return a.response()
      return new HttpResponse(a.body, { status: a.status, headers: { 'content-type': a.type, ...a.headers } })
    }))
  }
  const server = setupServer(...list)
  server.listen({ onUnhandledRequest: 'error' })
  return { seen, server, async close() { server.close() } }
}

export const LIBRARIES = { 'undici MockAgent': installMockAgent, nock: installNock, msw: installMsw }
