// docs/testing.md's handler sets, run as written there: the msw set with setupServer and
// onUnhandledRequest: 'error', and the vi.stubGlobal fetch. Every call of the package is
// answered, so a host can copy either and start from a suite that passes.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { lib } from './host-fetch-fixture.mjs'

const require = createRequire(import.meta.url)
const msw = require('msw')
const { setupServer } = require('msw/node')

const DOC = readFileSync(new URL('../../docs/testing.md', import.meta.url), 'utf8')

/** The code block between `<!-- name:begin -->` and `<!-- name:end -->`, as a function. */
function block(name, exported, imports = {}) {
  const m = DOC.match(new RegExp(`<!-- ${name}:begin -->\\n\`\`\`js\\n([\\s\\S]*?)\\n\`\`\`\\n<!-- ${name}:end -->`))
  if (!m) throw new Error(`docs/testing.md has no ${name} block`)
  const body = m[1]
    .replace(/^import .*$/gm, '')
    .replace(/^export function /gm, 'function ')
  // eslint-disable-next-line no-new-func
  return new Function(...Object.keys(imports), `${body}\nreturn ${exported}`)(...Object.values(imports))
}

const API = 'https://api.createos.test'
const SANDBOX = 'sb-docs-1'
const client = () => ({ config: { apiUrl: API, timeoutMs: 10_000, pacing: 'off' }, apiKey: 'sk-docs' })
const params = (extra = {}) => ({ lease: { providerLeaseId: SANDBOX }, command: 'echo', args: ['x'], ...extra })

let server
afterEach(() => {
  if (server) server.close()
  server = undefined
  vi.unstubAllGlobals()
})

describe('docs/testing.md', () => {
  it('the msw handler set answers every call, with onUnhandledRequest: error', async () => {
    const createosHandlers = block('msw-handlers', 'createosHandlers', { http: msw.http, HttpResponse: msw.HttpResponse })
    const requests = []
    server = setupServer(...createosHandlers({ apiUrl: API, sandboxId: SANDBOX, output: 'from msw\n', exitCode: 3, requests }))
    server.listen({ onUnhandledRequest: 'error' })
    const result = await lib.execute(client(), params({ stdin: 'in', cwd: '/work dir' }), AbortSignal.timeout(30_000))
    expect(result).toMatchObject({ exitCode: 3, stdout: 'from msw\n', timedOut: false })
    expect(requests.filter((r) => r.startsWith('PUT ')).length).toBe(2) // stdin and the gate
    expect(requests).toContain(`POST /v1/sandboxes/${SANDBOX}/processes`)
    const streamed = await lib.executeStream(client(), params(), AbortSignal.timeout(30_000))
    expect(streamed).toMatchObject({ exitCode: 3, stdout: 'from msw\n' })
    const chunks = []
    const followed = await lib.followProcess(client(), SANDBOX, 'proc-1', AbortSignal.timeout(30_000), (s, d) => chunks.push(Buffer.from(d).toString()))
    expect(followed).toMatchObject({ exitCode: 3 })
    await expect(lib.destroySandbox(client(), SANDBOX)).resolves.toEqual({ providerLeaseId: SANDBOX, state: 'destroyed' })
  })

  it('the msw handler set answers a timed-out command\'s cleanup', async () => {
    const createosHandlers = block('msw-handlers', 'createosHandlers', { http: msw.http, HttpResponse: msw.HttpResponse })
    const requests = []
    server = setupServer(
      // The stream stays open: the command runs until the signal's timeout.
      msw.http.get(`${API}/v1/sandboxes/${SANDBOX}/processes/:pid/connect`, () => new msw.HttpResponse(new ReadableStream({ pull: () => new Promise(() => {}) }))),
      ...createosHandlers({ apiUrl: API, sandboxId: SANDBOX, requests }),
    )
    server.listen({ onUnhandledRequest: 'error' })
    const result = await lib.execute(client(), params(), AbortSignal.timeout(800))
    expect(result.timedOut).toBe(true)
    expect(requests).toContain(`DELETE /v1/sandboxes/${SANDBOX}/processes/proc-1`)
  })

  it('the vi.stubGlobal fetch answers every call', async () => {
    const createosFetch = block('stub-fetch', 'createosFetch')
    const requests = []
    vi.stubGlobal('fetch', createosFetch({ apiUrl: API, sandboxId: SANDBOX, output: 'from stub\n', requests }))
    const result = await lib.execute(client(), params({ stdin: 'in' }), AbortSignal.timeout(30_000))
    expect(result).toMatchObject({ exitCode: 0, stdout: 'from stub\n' })
    const streamed = await lib.executeStream(client(), params(), AbortSignal.timeout(30_000))
    expect(streamed).toMatchObject({ exitCode: 0, stdout: 'from stub\n' })
    await expect(lib.destroySandbox(client(), SANDBOX)).resolves.toEqual({ providerLeaseId: SANDBOX, state: 'destroyed' })
    expect(requests.some((r) => r.startsWith('DELETE '))).toBe(true)
  })
})
