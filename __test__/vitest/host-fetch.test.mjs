// A host's suite: globalThis.fetch stubbed with vi.stubGlobal, answering JSend envelopes and
// NDJSON streams. Every request of execute, executeStream, followProcess and destroySandbox
// must reach the stub, with the init the TypeScript module used.
import { afterEach, describe, expect, it, vi } from 'vitest'
import {
  lib, client, params, createosFixture, ndjson, data, exit, assertInit, API, SANDBOX,
} from './host-fetch-fixture.mjs'

afterEach(() => {
  vi.unstubAllGlobals()
  vi.restoreAllMocks()
})

function install(routes) {
  const fx = createosFixture(routes)
  vi.stubGlobal('fetch', vi.fn(fx.fetch))
  return fx
}

describe('execute through the host fetch', () => {
  it('a success: every request reaches the stub, shaped as the TypeScript module made it', async () => {
    const warn = vi.spyOn(process, 'emitWarning')
    const fx = install()
    const logged = []
    const result = await lib.execute(client(), params({ stdin: 'input text' }), AbortSignal.timeout(30_000), (s, t) => logged.push([s, t]))
    expect(result).toMatchObject({ exitCode: 0, signal: null, timedOut: false, stdout: 'hello\n', stderr: '' })
    expect(result.metadata.processId).toBe('proc-1')
    expect(logged).toEqual([['stdout', 'hello\n']])
    const kinds = fx.kinds()
    expect(kinds).toContain('create')
    expect(kinds).toContain('connect')
    expect(kinds.filter((k) => k === 'upload').length).toBeGreaterThanOrEqual(2) // stdin + gate
    for (const r of fx.requests) assertInit(expect, r)
    const create = fx.requests.find((r) => fx.kinds()[fx.requests.indexOf(r)] === 'create')
    expect(create.url).toBe(`${API}/v1/sandboxes/${SANDBOX}/processes`)
    expect(create.init.method).toBe('POST')
    expect(JSON.parse(create.init.body)).toMatchObject({ cmd: '/bin/bash' })
    const connect = fx.requests.find((r) => r.url.includes('/connect?'))
    expect(connect.url).toBe(`${API}/v1/sandboxes/${SANDBOX}/processes/proc-1/connect?after=0`)
    const stdin = fx.requests.find((r) => r.init.body === 'input text')
    expect(stdin.url).toMatch(new RegExp(`^${API}/v1/sandboxes/${SANDBOX}/files\\?path=%2F`))
    expect(stdin.init.method).toBe('PUT')
    // The first call that chose fetch because of the stub said so, once, with a code.
    const warnings = () => warn.mock.calls.filter((c) => c[1] && c[1].code === 'CREATEOS_TRANSPORT_FETCH')
    expect(warnings().length).toBe(1)
    expect(warnings()[0][0]).toMatch(/globalThis\.fetch is not Node's own.*transport to 'native'/)
    await lib.executeStream(client(), params(), AbortSignal.timeout(30_000))
    expect(warnings().length).toBe(1)
  })

  it('a replay after a disconnect: the stream breaks, the reconnect asks after the last seq', async () => {
    const fx = install({
      connect: (n, after) => n === 1
        ? ndjson([data(1, 'one\n')], 'error').response()
        : ndjson([data(after + 1, 'two\n'), exit(0, after + 1)]).response(),
    })
    const result = await lib.execute(client(), params(), AbortSignal.timeout(30_000))
    expect(result.stdout).toBe('one\ntwo\n')
    expect(result.exitCode).toBe(0)
    const connects = fx.requests.filter((r) => r.url.includes('/connect?')).map((r) => new URL(r.url).search)
    expect(connects).toEqual(['?after=0', '?after=1'])
  })

  it('a timeout with partial output: timedOut, the output so far, the tree ended with a DELETE', async () => {
    const stream = ndjson([data(1, 'partial\n')], 'hang')
    const fx = install({ connect: () => stream.response() })
    const result = await lib.execute(client(), params(), AbortSignal.timeout(1_500))
    expect(result.timedOut).toBe(true)
    expect(result.stdout).toBe('partial\n')
    const remove = fx.requests.find((r) => r.init.method === 'DELETE')
    expect(remove.url).toMatch(new RegExp(`^${API}/v1/sandboxes/${SANDBOX}/processes/proc-1\\?grace_ms=\\d+$`))
    assertInit(expect, remove)
    expect(stream.state.cancelled).toBe(true)
  })

  it('a stream error: the call rejects and the process is terminated with a DELETE', async () => {
    const fx = install({ connect: () => ndjson([data(1, 'x'), { type: 'error', error: 'internal' }]).response() })
    await expect(lib.execute(client(), params(), AbortSignal.timeout(30_000))).rejects.toThrow(/CreateOS/)
    const kinds = fx.kinds()
    expect(kinds.indexOf('remove')).toBeGreaterThan(kinds.indexOf('connect'))
  })

  it('an unconfirmed termination: the DELETE never confirms the tree gone', async () => {
    const fx = install({
      connect: () => ndjson([data(1, 'x')], 'hang').response(),
      remove: () => new Response(JSON.stringify({ status: 'success', data: { tree_exited: false, leader_exited: false } })),
      get: () => new Response(JSON.stringify({ status: 'success', data: { process_id: 'proc-1', state: 'running', tree_exited: false } })),
      wait: () => new Response(JSON.stringify({ status: 'error' }), { status: 408 }),
    })
    const error = await lib.execute(client({ cleanupDeadlineMs: 3_000, cleanupGraceMs: [0], confirmPollMs: 100 }), params(), AbortSignal.timeout(1_000))
      .then(() => null, (e) => e)
    expect(lib.isCreateosCleanupError(error)).toBe(true)
    expect(error.reason).toBe('termination-unconfirmed')
    expect(fx.kinds()).toContain('remove')
  })

  it('an ambiguous creation: the POST is lost after it was sent, and nothing can confirm it', async () => {
    const fx = install({
      create: () => { throw new TypeError('fetch failed') },
      list: () => new Response('{}', { status: 503 }),
    })
    const error = await lib.execute(client({ cleanupDeadlineMs: 3_000 }), params(), AbortSignal.timeout(30_000)).then(() => null, (e) => e)
    expect(lib.isCreateosCleanupError(error)).toBe(true)
    expect(error.reason).toBe('creation-unconfirmed')
    expect(fx.kinds()).toContain('create')
    expect(JSON.stringify(error)).not.toContain('api.createos.test')
  })

  it('an abort mid-stream: cancelled, the stub stream sees the cancel, the tree is ended', async () => {
    const stream = ndjson([data(1, 'started\n')], 'hang')
    const fx = install({ connect: () => stream.response() })
    const controller = new AbortController()
    const run = lib.execute(client(), params(), controller.signal, () => controller.abort())
    await expect(run).rejects.toMatchObject({ code: 'CREATEOS_CANCELLED' })
    expect(stream.state.cancelled).toBe(true)
    expect(fx.kinds()).toContain('remove')
  })
})

describe('the other entry points through the host fetch', () => {
  it('executeStream', async () => {
    const fx = install()
    const result = await lib.executeStream(client(), params(), AbortSignal.timeout(30_000))
    expect(result).toMatchObject({ exitCode: 0, stdout: 'streamed\n' })
    expect(fx.requests.map((r) => r.url)).toEqual([`${API}/v1/sandboxes/${SANDBOX}/exec?stream=true`])
    assertInit(expect, fx.requests[0])
    expect(JSON.parse(fx.requests[0].init.body)).toMatchObject({ cmd: '/bin/bash', stream: true })
  })

  it('followProcess', async () => {
    const fx = install()
    const chunks = []
    const exitStatus = await lib.followProcess(client(), SANDBOX, 'proc-9', AbortSignal.timeout(30_000), (s, b) => chunks.push([s, b.toString()]))
    expect(exitStatus).toEqual({ exitCode: 0, signal: null })
    expect(chunks).toEqual([['stdout', 'hello\n']])
    expect(fx.requests[0].url).toBe(`${API}/v1/sandboxes/${SANDBOX}/processes/proc-9/connect?after=0`)
    for (const r of fx.requests) assertInit(expect, r)
  })

  it('destroySandbox', async () => {
    const fx = install()
    await expect(lib.destroySandbox(client(), SANDBOX)).resolves.toEqual({ providerLeaseId: SANDBOX, state: 'destroyed' })
    expect(fx.kinds()[0]).toBe('destroy')
    expect(fx.requests[0].url).toBe(`${API}/v1/sandboxes/${SANDBOX}`)
    for (const r of fx.requests) assertInit(expect, r)
  })

  it("transport: 'native' bypasses the stub", async () => {
    const fx = install()
    const error = await lib.destroySandbox(client({ transport: 'native', apiUrl: 'http://127.0.0.1:9', cleanupDeadlineMs: 2_000 }), SANDBOX).then(() => null, (e) => e)
    expect(error).not.toBeNull()
    expect(fx.requests).toEqual([])
  })

  it('a transport that is neither is an input error', async () => {
    install()
    await expect(lib.destroySandbox(client({ transport: 'curl' }), SANDBOX)).rejects.toMatchObject({ code: 'CREATEOS_INVALID_INPUT' })
  })
})
