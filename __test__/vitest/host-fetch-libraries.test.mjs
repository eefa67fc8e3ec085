// What the host's fetch proves, tried with the libraries hosts test with: undici's MockAgent,
// nock and msw (each installed as a host's suite installs it), and vi.stubGlobal stubs.
//
// - A forgotten mock (the library's no-match error) is CREATEOS_FETCH_UNMATCHED at once,
//   naming the operation, with the library's error as the cause; never a cleanup error,
//   except where the forgotten request was the proof (the DELETE of a timed-out command,
//   the list of a recovery): then CreateosCleanupError, as it must be.
// - Any other failure may follow a sent request: a retrying wrapper whose last error is
//   ECONNREFUSED over an applied creation gives CreateosCleanupError, never an ordinary error.
// - A key no header can carry is CREATEOS_INVALID_INPUT with nothing sent, on both transports.
// - A refused redirect in msw's form is a redirect; a broken body reader is a stream error.
// - A dispatcher named Agent wrapping Node's own is the host's.
import http from 'node:http'
import { createRequire } from 'node:module'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { lib, client, params, createosFixture, API, KEY, SANDBOX } from './host-fetch-fixture.mjs'
import { LIBRARIES, DEFAULTS, installMsw } from './host-libraries.mjs'

const require = createRequire(import.meta.url)
const { http: mswHttp, HttpResponse } = require('msw')
const transport = require('../../lib/fetch-transport.js')
const SB = `${API}/v1/sandboxes/${SANDBOX}`

let installed
afterEach(async () => {
  if (installed) await installed.close()
  installed = undefined
  vi.unstubAllGlobals()
  vi.restoreAllMocks()
})

/** The call's rejection, and how long it took. */
async function failure(promise) {
  const t0 = Date.now()
  try {
    await promise
  } catch (error) {
    return { error, ms: Date.now() - t0 }
  }
  throw new Error('the call resolved')
}

/** No secret anywhere a host would log. */
function expectClean(error) {
  const texts = [error.message, error.stack, error.cause && error.cause.message, error.cause && error.cause.stack, JSON.stringify(error.attempts ?? [])]
  for (const t of texts) {
    if (t === undefined) continue
    expect(t).not.toContain(KEY)
    expect(t).not.toMatch(/\?path=|\?after=|\?grace_ms=|createos-start-/)
  }
}

describe('the table of no-match errors', () => {
  it('has one entry per library, each run below through the library itself', () => {
    expect(transport.UNMATCHED.map((e) => e.library)).toEqual(Object.keys(LIBRARIES))
  })
})

describe.each(Object.entries(LIBRARIES))('%s', (name, install) => {
  it('a forgotten mock for the creation: CREATEOS_FETCH_UNMATCHED at once, no recovery, the cause names the request', async () => {
    installed = install({ omit: ['create'] })
    const { error, ms } = await failure(lib.execute(client(), params(), AbortSignal.timeout(30_000)))
    expect(error).not.toBeInstanceOf(lib.CreateosCleanupError)
    expect(error.code).toBe('CREATEOS_FETCH_UNMATCHED')
    expect(error.message).toBe("CreateOS request was not sent: no mock of the host's fetch answered the process creation request.")
    expect(ms).toBeLessThan(1500)
    expect(installed.seen).not.toContain('list')
    expect(installed.seen).not.toContain('delete')
    expect(error.cause).toBeInstanceOf(Error)
    expect(error.cause.message).toContain(`(POST ${SB}/processes)`)
    expectClean(error)
  })

  it('a forgotten mock for the connect: CREATEOS_FETCH_UNMATCHED naming the output connection; the process was ended', async () => {
    installed = install({ omit: ['connect'] })
    const { error, ms } = await failure(lib.execute(client(), params(), AbortSignal.timeout(30_000)))
    expect(error.code).toBe('CREATEOS_FETCH_UNMATCHED')
    expect(error.message).toMatch(/the output connection request\.$/)
    expect(ms).toBeLessThan(5000)
    expect(installed.seen).toContain('delete')
    expect(error.cause.message).toContain(`(GET ${SB}/processes/proc-1/connect)`)
    expectClean(error)
  })

  it('a forgotten mock for the start gate: CREATEOS_FETCH_UNMATCHED naming the file transfer', async () => {
    installed = install({ omit: ['gate'] })
    const { error } = await failure(lib.execute(client(), params(), AbortSignal.timeout(30_000)))
    expect(error.code).toBe('CREATEOS_FETCH_UNMATCHED')
    expect(error.message).toMatch(/the file transfer request\.$/)
    expect(installed.seen).toContain('delete')
    expect(error.cause.message).toContain(`(PUT ${SB}/files)`)
    expectClean(error)
  })

  it('a forgotten mock for the DELETE of a timed-out command: CreateosCleanupError (the proof is missing)', async () => {
    installed = install({ omit: ['delete'], delays: { connect: 10_000 } })
    const { error, ms } = await failure(lib.execute(client(), params(), AbortSignal.timeout(1_000)))
    expect(error).toBeInstanceOf(lib.CreateosCleanupError)
    expect(error.reason).toBe('termination-unconfirmed')
    expect(ms).toBeLessThan(5000)
    expect(error.attempts.some((a) => a.outcome === 'no mock answered')).toBe(true)
    expect(error.cause.message).toContain(`(DELETE ${SB}/processes/proc-1)`)
    expectClean(error)
  })

  it('a forgotten mock for the list of a recovery: CreateosCleanupError (the proof is missing)', async () => {
    installed = install({ omit: ['list'], answers: { create: () => ({ status: 500, body: '{"status":"error","message":"boom"}' }) } })
    const { error } = await failure(lib.execute(client(), params(), AbortSignal.timeout(30_000)))
    expect(error).toBeInstanceOf(lib.CreateosCleanupError)
    expect(error.reason).toBe('creation-unconfirmed')
    expect(installed.seen).toContain('create')
    expect(error.cause.message).toContain(`(GET ${SB}/processes)`)
    expectClean(error)
  })

  it('a retrying wrapper over an applied creation whose last error is ECONNREFUSED: CreateosCleanupError, never an ordinary error', async () => {
    let applied = false
    const down = () => ({ error: Object.assign(new Error('connect ECONNREFUSED 10.0.0.1:443'), { code: 'ECONNREFUSED' }) })
    const answers = {}
    for (const kind of Object.keys(DEFAULTS)) answers[kind] = (n) => (applied ? down() : DEFAULTS[kind](n))
    answers.create = () => {
      if (applied) return down()
      applied = true // the creation reached the API and was applied; its answer is lost
      return { error: Object.assign(new Error('other side closed'), { code: 'UND_ERR_SOCKET' }) }
    }
    installed = install({ answers })
    const inner = globalThis.fetch
    // As fetch-retry does: every method is retried, the last error is the rejection.
    const retrying = async (input, init) => {
      let last
      for (let i = 0; i < 3; i++) {
        try {
          return await inner(input, init)
        } catch (error) {
          last = error
        }
      }
      throw last
    }
    vi.stubGlobal('fetch', retrying)
    const { error } = await failure(lib.execute(client({ cleanupDeadlineMs: 3000 }), params(), AbortSignal.timeout(30_000)))
    expect(applied).toBe(true)
    expect(error).toBeInstanceOf(lib.CreateosCleanupError)
    expect(error.reason).toBe('creation-unconfirmed')
    expect(error.cause).toBeInstanceOf(Error)
    expectClean(error)
  })

  it('a redirect answer to the creation is refused at once, never followed, never a cleanup error', async () => {
    installed = install({ answers: { create: () => ({ status: 302, body: '', headers: { location: 'https://elsewhere.test/x' } }) } })
    const { error, ms } = await failure(lib.execute(client(), params(), AbortSignal.timeout(30_000)))
    expect(error).not.toBeInstanceOf(lib.CreateosCleanupError)
    expect(error.message).toBe('CreateOS answered with a redirect, which is refused.')
    expect(ms).toBeLessThan(1500)
    expect(installed.seen).not.toContain('list')
    expectClean(error)
  })

  it.each([
    ['a control character', 'sk-\u0001-key'],
    ['DEL', 'sk-\u007f-key'],
    ['an escape', 'sk-\u001b-key'],
    ['a line feed', 'sk-\n-key'],
    ['a character above U+00FF', 'sk-\u0100-key'],
  ])('a key with %s: CREATEOS_INVALID_INPUT, nothing sent', async (_what, key) => {
    installed = install()
    const c = { ...client(), apiKey: key }
    const { error } = await failure(lib.execute(c, params(), AbortSignal.timeout(30_000)))
    expect(error).toBeInstanceOf(lib.CreateosInputError)
    expect(error.code).toBe('CREATEOS_INVALID_INPUT')
    expect(installed.seen).toEqual([])
    expect(String(error.message)).not.toContain(key)
  })
})

describe('a key no header can carry, natively', () => {
  it.each([['sk-\u0001-key'], ['sk-\u007f-key'], ['sk-\n-key'], ['sk-\u0100-key']])('%j is CREATEOS_INVALID_INPUT and nothing reaches the server', async (key) => {
    let requests = 0
    const server = http.createServer((_req, res) => {
      requests++
      res.writeHead(500).end()
    })
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
    try {
      const c = { config: { apiUrl: `http://127.0.0.1:${server.address().port}`, transport: 'native', pacing: 'off' }, apiKey: key }
      const { error } = await failure(lib.execute(c, params(), AbortSignal.timeout(30_000)))
      expect(error.code).toBe('CREATEOS_INVALID_INPUT')
      expect(requests).toBe(0)
    } finally {
      server.closeAllConnections()
      await new Promise((resolve) => server.close(resolve))
    }
  })
})

describe('msw', () => {
  it("a refused redirect (TypeError('Failed to fetch') with the cause 'unexpected redirect') is a redirect, never followed", async () => {
    let followed = 0
    installed = installMsw({
      handlers: [mswHttp.all('https://elsewhere.test/*', () => {
        followed++
        return HttpResponse.json({})
      })],
      answers: { create: () => ({ response: () => new HttpResponse(null, { status: 302, headers: { location: 'https://elsewhere.test/x' } }) }) },
    })
    const { error, ms } = await failure(lib.execute(client(), params(), AbortSignal.timeout(30_000)))
    expect(error).not.toBeInstanceOf(lib.CreateosCleanupError)
    expect(error.message).toBe('CreateOS answered with a redirect, which is refused.')
    expect(ms).toBeLessThan(1500)
    expect(installed.seen).not.toContain('list')
    expect(followed).toBe(0)
  })

  it('a body whose chunks are not bytes is a stream error of the call: it reconnects, nothing is unhandled', async () => {
    const unhandled = []
    const onUnhandled = (e) => unhandled.push(e)
    process.on('unhandledRejection', onUnhandled)
    try {
      installed = installMsw({
        answers: {
          connect: (n) => n === 1
            ? { response: () => new HttpResponse(new ReadableStream({ start(c) { c.enqueue('not bytes'); c.close() } }), { headers: { 'content-type': 'application/x-ndjson' } }) }
            : DEFAULTS.connect(),
        },
      })
      const result = await lib.execute(client(), params(), AbortSignal.timeout(30_000))
      expect(result).toMatchObject({ exitCode: 0, stdout: 'hello\n' })
      expect(installed.seen.filter((k) => k === 'connect').length).toBe(2)
      await new Promise((resolve) => setTimeout(resolve, 50))
      expect(unhandled).toEqual([])
    } finally {
      process.off('unhandledRejection', onUnhandled)
    }
  })
})

describe('a vi.stubGlobal fetch', () => {
  function stub(routes) {
    const seen = []
    const fetch = async (url, init) => {
      const u = new URL(url)
      const method = init.method
      const kind = method === 'PUT' ? 'upload'
        : u.pathname.endsWith('/processes') && method === 'POST' ? 'create'
          : u.pathname.endsWith('/connect') ? 'connect'
            : method === 'DELETE' ? 'delete' : `${method} ${u.pathname}`
      seen.push(kind)
      const n = seen.filter((k) => k === kind).length
      if (routes[kind]) return routes[kind](n, url)
      const a = (DEFAULTS[kind === 'upload' ? 'upload' : kind] ?? DEFAULTS.stdinClose)(n)
      return new Response(a.body, { status: a.status, headers: { 'content-type': a.type ?? 'application/json' } })
    }
    vi.stubGlobal('fetch', fetch)
    return seen
  }

  it("the creation's body carries cwd as the TypeScript module's did (an absolute one; the script still cds)", async () => {
    const fx = createosFixture()
    vi.stubGlobal('fetch', fx.fetch)
    await lib.execute(client(), params({ cwd: '/work dir' }), AbortSignal.timeout(30_000))
    const create = fx.requests.find((r) => fx.kinds()[fx.requests.indexOf(r)] === 'create')
    const body = JSON.parse(create.init.body)
    expect(body).toMatchObject({ cmd: '/bin/bash', cwd: '/work dir' })
    expect(body.args[0]).toBe('-lc')
    expect(body.args[1]).toContain("cd -- '/work dir' || exit")
    fx.requests.length = 0
    await lib.execute(client(), params({ cwd: 'relative/dir' }), AbortSignal.timeout(30_000))
    const relative = JSON.parse(fx.requests.find((r) => fx.kinds()[fx.requests.indexOf(r)] === 'create').init.body)
    expect(relative).not.toHaveProperty('cwd')
  })

  it('a body reader whose read() resolves null is a stream error of the call, never an unhandled rejection', async () => {
    const unhandled = []
    const onUnhandled = (e) => unhandled.push(e)
    process.on('unhandledRejection', onUnhandled)
    try {
      const seen = stub({
        connect: (n) => {
          if (n > 1) {
            const a = DEFAULTS.connect()
            return new Response(a.body, { headers: { 'content-type': a.type } })
          }
          return { status: 200, headers: new Headers(), body: { getReader: () => ({ read: async () => null, cancel: async () => {} }) } }
        },
      })
      const result = await lib.execute(client(), params(), AbortSignal.timeout(30_000))
      expect(result).toMatchObject({ exitCode: 0, stdout: 'hello\n' })
      expect(seen.filter((k) => k === 'connect').length).toBe(2)
      await new Promise((resolve) => setTimeout(resolve, 50))
      expect(unhandled).toEqual([])
    } finally {
      process.off('unhandledRejection', onUnhandled)
    }
  })

  it("what the stub threw is the error's cause (its message kept, the query and the key removed)", async () => {
    stub({
      connect: (_n, url) => {
        throw new Error(`test forgot to mock GET ${url} (key ${KEY})`)
      },
    })
    const { error } = await failure(lib.execute(client({ cleanupDeadlineMs: 2000 }), params(), AbortSignal.timeout(6_000)))
    expect(error.message).toBe('CreateOS process output connection failed.')
    expect(error.cause).toBeInstanceOf(Error)
    expect(error.cause.message).toBe(`test forgot to mock GET ${SB}/processes/proc-1/connect (key [key])`)
    expectClean(error)
  })

  it("a request body in what the stub threw never reaches the cause; credentials in a URL neither", async () => {
    const secret = 'env-secret-value-42'
    const fx = createosFixture()
    vi.stubGlobal('fetch', async (url, init) => {
      if (init.method !== 'POST') return fx.fetch(url, init)
      throw new Error(`refused ${init.method} https://user:pw@proxy.test/x?y=1 with ${init.body}`)
    })
    const { error } = await failure(lib.execute(client({ cleanupDeadlineMs: 1000 }), params({ env: { SECRET: secret } }), AbortSignal.timeout(6_000)))
    expect(error.cause).toBeInstanceOf(Error)
    expect(error.cause.message).toMatch(/^refused POST https:\/\/proxy\.test\/x with \[body\]$/)
    for (const t of [error.message, error.stack, error.cause.message, error.cause.stack]) expect(t).not.toContain(secret)
    expectClean(error)
  })
})
