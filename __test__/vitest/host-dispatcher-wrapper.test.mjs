// A host's dispatcher that wraps Node's own: a class named Agent whose dispatch does the host's
// work (here, it records each path) and then calls Node's own Agent. It is the host's: requests
// go through fetch (its own file, so that Node's fetch is the first to install a dispatcher).
import { createRequire } from 'node:module'
import { describe, expect, it, vi } from 'vitest'
import { lib } from './host-fetch-fixture.mjs'

const require = createRequire(import.meta.url)
const transport = require('../../lib/fetch-transport.js')

describe('a dispatcher the host installed', () => {
  it('a class named Agent that wraps Node\'s own Agent is the host\'s: requests go through fetch, with the warning', async () => {
    const { startEmulator } = require('createos-execute-emulator')
    const emu = await startEmulator({ rateLimitPerMinute: null })
    const SYMBOL = Symbol.for('undici.globalDispatcher.1')
    const before = globalThis[SYMBOL]
    try {
      // Node installs its own Agent on its fetch's first use.
      await fetch(`${emu.url}/v1/health`).then((r) => r.arrayBuffer()).catch(() => {})
      const own = globalThis[SYMBOL]
      expect(transport.isNodeDispatcher(own)).toBe(true)
      const paths = []
      class Agent {
        constructor(inner) {
          this.inner = inner
        }

        dispatch(options, handler) {
          paths.push(options.path)
          return this.inner.dispatch(options, handler)
        }

        close() {
          return this.inner.close()
        }

        destroy() {
          return this.inner.destroy()
        }
      }
      const wrapper = new Agent(own)
      expect(transport.isNodeDispatcher(wrapper)).toBe(false)
      globalThis[SYMBOL] = wrapper
      const warn = vi.spyOn(process, 'emitWarning')
      const sandboxId = emu.createSandbox()
      const c = { config: { apiUrl: emu.url, timeoutMs: 10_000 }, apiKey: emu.apiKey }
      const result = await lib.execute(c, { lease: { providerLeaseId: sandboxId }, command: 'echo', args: ['wrapped'] }, AbortSignal.timeout(30_000))
      expect(result).toMatchObject({ exitCode: 0, stdout: 'wrapped\n' })
      expect(paths.some((p) => typeof p === 'string' && p.endsWith('/processes'))).toBe(true)
      const warned = warn.mock.calls.filter((call) => call[1] && call[1].code === 'CREATEOS_TRANSPORT_FETCH')
      expect(warned.length).toBe(1)
      expect(warned[0][0]).toMatch(/its own undici global dispatcher/)
    } finally {
      globalThis[SYMBOL] = before
      await emu.close()
    }
  })
})
