// Leak audit (issue 6, part 4): drive every error path with a recognisable API key and
// provider error bodies full of secrets, and scan everything a host could see — every
// error's message, stack, cause chain, own properties (JSON and util.inspect, attempts
// included), every log line, every process warning and the result metadata — for the key,
// the provider's `secret-body-token`, the emulator URL (with or without a query) and the
// `/tmp/createos-` staging paths.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { inspect } from 'node:util'
import { randomBytes } from 'node:crypto'
import { fileURLToPath } from 'node:url'
import { lib, startEmu, kinds } from './helpers.mjs'

const FILE = fileURLToPath(import.meta.url)
const KEY = `sk-live-LEAKCANARY-${randomBytes(12).toString('hex')}`
const BODY_SECRET = 'secret-body-token'

let E
let URL_HOST // "127.0.0.1:PORT"
const scanned = { errors: 0, logs: 0, metadata: 0, cases: 0 }
const warnings = []
const onWarning = (w) => warnings.push(w)

before(async () => {
  E = await startEmu({ apiKey: KEY })
  assert.equal(E.apiKey, KEY)
  URL_HOST = new URL(E.url).host
  process.on('warning', onWarning)
})

after(async () => {
  process.off('warning', onWarning)
  for (const w of warnings) assertClean(`warning ${w.code}`, [w.message, w.stack, inspect(w, { showHidden: true })].join('\n'))
  await E.close(FILE)
})

function secrets() {
  return [KEY, 'LEAKCANARY', BODY_SECRET, E.url, URL_HOST, '/tmp/createos-', 'createos-stdin-', 'createos-start-']
}

function assertClean(where, text) {
  for (const s of secrets()) {
    assert.ok(!text.includes(s), `${where} leaks ${JSON.stringify(s)}:\n${text.slice(0, 2000)}`)
  }
}

/** Every string a host could get out of an error, its cause chain and its fields. */
function errorText(e, depth = 0) {
  if (e === null || e === undefined) return ''
  if (typeof e !== 'object' && typeof e !== 'function') return String(e)
  const parts = [String(e.message), String(e.stack), String(e.name), String(e.code)]
  try { parts.push(JSON.stringify(e)) } catch {}
  try { parts.push(JSON.stringify(e.attempts)) } catch {}
  parts.push(inspect(e, { showHidden: true, depth: 8, getters: true }))
  for (const k of [...Object.getOwnPropertyNames(e), ...Object.getOwnPropertySymbols(e)]) {
    let v
    try { v = e[k] } catch { continue }
    if (typeof v === 'string') parts.push(v)
    else if (v && typeof v === 'object' && depth < 4) parts.push(errorText(v, depth + 1))
    else parts.push(String(v))
  }
  if ('cause' in e && depth < 4) parts.push(errorText(e.cause, depth + 1))
  return parts.join('\n')
}

/**
 * Runs one call (execute by default) with `faults` active; scans its error or result
 * metadata and every log line. Returns { error, value, logs }.
 */
async function audit(name, { faults = [], run, params, client, signal, expectError = true }) {
  E.reset()
  for (const f of faults) E.emu.addFault(f)
  const logs = []
  const log = (stream, text) => logs.push(`${stream}:${text}`)
  let error
  let value
  const t0 = performance.now()
  try {
    value = run ? await run(log) : await lib.execute(client ?? E.client({ pacing: 'off', cleanupDeadlineMs: 1500, cleanupGraceMs: [50, 100], confirmPollMs: 200 }), params, signal, log)
  } catch (e) {
    error = e
  }
  E.emu.clearFaults()
  if (process.env.LEAK_AUDIT_TIMING) console.log(`${name}: ${Math.round(performance.now() - t0)} ms`)
  scanned.cases++
  if (expectError) assert.ok(error, `${name}: expected an error, got ${JSON.stringify(value)?.slice(0, 300)}`)
  if (error) {
    scanned.errors++
    assertClean(`${name}: error`, errorText(error))
  }
  if (value && typeof value === 'object') {
    scanned.metadata++
    assertClean(`${name}: result metadata`, JSON.stringify(value.metadata ?? {}) + inspect(value.metadata, { showHidden: true }))
  }
  // The commands below print nothing secret themselves, so no log line may hold one.
  for (const l of logs) {
    scanned.logs++
    assertClean(`${name}: log line`, l)
  }
  // Kill what a stubborn-tree fault kept alive, so the next case starts clean.
  for (const pid of E.emu.livePids()) {
    try { process.kill(-pid, 'SIGKILL') } catch {}
  }
  return { error, value, logs }
}

const bash = (sb, script, extra = {}) => E.params(sb, '/bin/bash', { args: ['-c', script], ...extra })

const ROUTES_WITH_STDIN = ['putFile', 'createProcess', 'connect']
const STATUSES = [400, 401, 403, 404, 409, 422, 500, 502, 503, 504]

test('API errors from every operation carry no key, body, URL or staging path', async () => {
  const sb = E.sandbox()
  for (const route of ROUTES_WITH_STDIN) {
    for (const status of STATUSES) {
      const { error } = await audit(`${route} ${status}`, {
        faults: [{ route, action: { kind: 'status', status } }],
        params: bash(sb, 'printf out; printf err >&2', { stdin: 'some stdin' }),
      })
      assert.ok(error instanceof Error)
    }
    // The real handler ran and its answer was replaced by a secret-laden error body.
    await audit(`${route} 502 afterHandler`, {
      faults: [{ route, times: 1, action: { kind: 'status', status: 502, afterHandler: true } }],
      params: bash(sb, 'printf out; sleep 0.2', { stdin: 'x' }),
      expectError: false,
    })
  }
})

test('cleanup-path errors (DELETE, wait, list, exec) carry no secret', async () => {
  const sb = E.sandbox()
  // DELETE refused / failing while a timed-out command is cleaned up.
  for (const status of [401, 403, 500, 503]) {
    const { error } = await audit(`deleteProcess ${status}`, {
      faults: [{ route: 'deleteProcess', action: { kind: 'status', status } }],
      params: bash(sb, 'printf started; sleep 30', { stdin: 'x' }),
      signal: AbortSignal.timeout(300),
    })
    assert.ok(lib.isCreateosCleanupError(error), `deleteProcess ${status}: ${error && error.message}`)
  }
  // A stubborn tree: DELETE answers tree_exited:false; wait fails with a secret body.
  const { error: stubborn } = await audit('stubborn tree', {
    faults: [
      { route: 'deleteProcess', action: { kind: 'treeExitedFalse' } },
      { route: 'wait', action: { kind: 'status', status: 500 } },
    ],
    params: bash(sb, 'sleep 30'),
    signal: AbortSignal.timeout(300),
  })
  assert.ok(lib.isCreateosCleanupError(stubborn))
  assert.ok(Array.isArray(stubborn.attempts) && stubborn.attempts.length > 0)
  // Lost creation answer, then the process list fails: creation unconfirmed.
  const { error: lost } = await audit('lost creation + list 500', {
    faults: [
      { route: 'createProcess', times: 1, action: { kind: 'status', status: 502, afterHandler: true } },
      { route: 'listProcesses', action: { kind: 'status', status: 500 } },
      { route: 'exec', action: { kind: 'status', status: 500 } },
    ],
    params: bash(sb, 'sleep 30', { stdin: 'staged' }),
  })
  assert.ok(lib.isCreateosCleanupError(lost))
  assert.equal(lost.reason, 'creation-unconfirmed')
})

test('redirects, dropped connections and broken streams carry no secret', async () => {
  const sb = E.sandbox()
  const location = `${E.url}/v1/steal?key=${KEY}&token=${BODY_SECRET}`
  for (const route of ['putFile', 'createProcess', 'connect', 'deleteProcess']) {
    const { error } = await audit(`redirect on ${route}`, {
      faults: [{ route, action: { kind: 'redirect', location } }],
      params: bash(sb, 'printf x; sleep 30', { stdin: 'x' }),
      signal: route === 'deleteProcess' ? AbortSignal.timeout(300) : undefined,
    })
    assert.ok(error)
  }
  for (const route of ['putFile', 'createProcess', 'connect', 'getProcess']) {
    await audit(`drop connection on ${route}`, {
      faults: [{ route, action: { kind: 'dropConnection', afterHandler: route === 'createProcess' } }],
      params: bash(sb, 'printf x', { stdin: 'x' }),
      expectError: route !== 'getProcess',
    })
  }
  for (const action of [
    { kind: 'errorFrame', error: `${BODY_SECRET} ${KEY}` },
    { kind: 'malformedLine', afterFrames: 0 },
    { kind: 'invalidBase64' },
    { kind: 'badSeq' },
    { kind: 'oversizeFrame' },
  ]) {
    await audit(`connect ${action.kind}`, {
      faults: [{ route: 'connect', action }],
      params: bash(sb, 'printf x; sleep 0.1; printf y'),
      expectError: action.kind !== 'oversizeFrame',
    })
  }
})

test('bad input holding the key is refused without echoing it', async () => {
  const sb = E.sandbox()
  const cases = [
    ['NUL in command', bash(sb, 'x', { command: `${KEY}\0` })],
    ['NUL in arg', E.params(sb, 'echo', { args: [`${KEY}\0`] })],
    ['NUL in env', E.params(sb, 'echo', { env: { TOKEN: `${KEY}\0` } })],
    ['bad env name', E.params(sb, 'echo', { env: { [`${KEY}-X`]: 'v' } })],
    ['NUL in cwd', E.params(sb, 'echo', { cwd: `/tmp/${KEY}\0` })],
    ['NUL in stdin', E.params(sb, 'echo', { stdin: `${KEY}\0` })],
    ['bad sandbox id', E.params(`${KEY}/..`, 'echo')],
    ['args not strings', E.params(sb, 'echo', { args: [{ key: KEY }] })],
  ]
  for (const [name, params] of cases) await audit(name, { params })
  const badClients = [
    ['url with query', { config: { apiUrl: `${E.url}/?key=${KEY}` }, apiKey: KEY }],
    ['url with credentials', { config: { apiUrl: `http://user:${KEY}@${URL_HOST}` }, apiKey: KEY }],
    ['url with path', { config: { apiUrl: `${E.url}/${KEY}` }, apiKey: KEY }],
    ['plain http off loopback', { config: { apiUrl: `http://${KEY.toLowerCase()}.example.com` }, apiKey: KEY }],
    ['key with newline', { config: { apiUrl: E.url }, apiKey: `${KEY}\nX-Evil: 1` }],
    ['bad timeout', { config: { apiUrl: E.url, timeoutMs: KEY }, apiKey: KEY }],
    ['bad pacing', { config: { apiUrl: E.url, pacing: KEY }, apiKey: KEY }],
  ]
  for (const [name, client] of badClients) {
    await audit(`client: ${name}`, { client, params: E.params(sb, 'echo') })
  }
  assert.deepEqual(kinds(E.requests()), [], 'bad input sends nothing')
})

test('a wrong key, executeStream, destroySandbox and followProcess errors carry no secret', async () => {
  const sb = E.sandbox()
  await audit('wrong key', {
    client: { config: { apiUrl: E.url, timeoutMs: 3000, pacing: 'off' }, apiKey: `${KEY}-wrong` },
    params: E.params(sb, 'echo'),
  })
  for (const status of [401, 500, 503]) {
    await audit(`executeStream ${status}`, {
      faults: [{ route: 'execStream', action: { kind: 'status', status } }],
      run: (log) => lib.executeStream(E.client({ pacing: 'off' }), E.params(sb, 'echo', { args: ['x'], stdin: 'in' }), undefined, log),
    })
    await audit(`destroySandbox ${status}`, {
      faults: [{ route: 'deleteSandbox', action: { kind: 'status', status } }],
      run: () => lib.destroySandbox(E.client({ pacing: 'off' }), sb),
    })
  }
  await audit('executeStream sse error frame', {
    faults: [{ route: 'execStream', action: { kind: 'dropConnection', afterHandler: true } }],
    run: (log) => lib.executeStream(E.client({ pacing: 'off' }), E.params(sb, 'echo', { args: ['x'] }), undefined, log),
  })
  await audit('followProcess unknown process', {
    run: () => lib.followProcess(E.client({ pacing: 'off' }), sb, 'proc_does_not_exist', undefined, () => {}),
  })
  await audit('followProcess 500', {
    faults: [{ route: 'connect', action: { kind: 'status', status: 500 } }],
    run: async () => {
      const r = await lib.execute(E.client({ pacing: 'off' }), E.params(sb, 'echo', { args: ['x'] }))
      E.emu.addFault({ route: 'connect', action: { kind: 'status', status: 500 } })
      return lib.followProcess(E.client({ pacing: 'off' }), sb, r.metadata.processId, AbortSignal.timeout(5000), () => {})
    },
  })
})

test('results and logs of calls that succeed despite faults carry no secret', async () => {
  const sb = E.sandbox()
  for (const faults of [
    [{ route: 'connect', times: 1, action: { kind: 'dropAfterFrames', frames: 1 } }],
    [{ route: 'putFile', times: 1, action: { kind: 'status', status: 503 } }],
    [{ route: 'createProcess', times: 1, action: { kind: 'status', status: 429 } }],
    [{ route: 'connect', action: { kind: 'sseNoise' } }],
  ]) {
    const { value } = await audit(`recovered: ${faults[0].action.kind}`, {
      faults,
      params: bash(sb, 'printf one; sleep 0.05; printf two', { stdin: 'x' }),
      expectError: false,
    })
    assert.equal(value && value.stdout, 'onetwo')
  }
  const { value } = await audit('timed out', {
    params: bash(sb, 'printf partial; sleep 30', { stdin: 'x' }),
    signal: AbortSignal.timeout(400),
    expectError: false,
  })
  assert.equal(value.timedOut, true)
})

test('the audit covered every path', () => {
  assert.ok(scanned.cases >= 80, JSON.stringify(scanned))
  assert.ok(scanned.errors >= 70, JSON.stringify(scanned))
})
