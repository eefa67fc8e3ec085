// Opt-in test against the real CreateOS service. Skipped unless
// CREATEOS_LIVE_TEST=1 and CREATEOS_API_URL, CREATEOS_API_KEY, CREATEOS_SHAPE are
// set. It creates a real sandbox, runs commands with stdin, env, large output and
// a timeout, and destroys the sandbox in `finally`. The key is never printed.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { lib } from './helpers.mjs'

const { execute, destroySandbox } = lib
const env = process.env
const enabled = env.CREATEOS_LIVE_TEST === '1' && env.CREATEOS_API_URL && env.CREATEOS_API_KEY && env.CREATEOS_SHAPE
const skip = enabled ? false : 'set CREATEOS_LIVE_TEST=1, CREATEOS_API_URL, CREATEOS_API_KEY and CREATEOS_SHAPE to run'

test('live: execute against a real CreateOS sandbox', { skip, timeout: 15 * 60_000 }, async () => {
  const client = { config: { apiUrl: env.CREATEOS_API_URL, timeoutMs: 120_000 }, apiKey: env.CREATEOS_API_KEY }
  const sandboxId = await createSandbox(client)
  try {
    await waitRunning(client, sandboxId)
    const lease = { providerLeaseId: sandboxId }

    const a = await execute(client, { lease, command: '/bin/bash', args: ['-c', 'echo "$GREETING"; cat; echo err >&2; exit 3'], env: { GREETING: "it's live" }, stdin: 'from stdin\n' },
      AbortSignal.timeout(120_000))
    assert.equal(a.exitCode, 3)
    assert.equal(a.stdout, "it's live\nfrom stdin\n")
    assert.equal(a.stderr, 'err\n')

    const big = await execute(client, { lease, command: '/bin/bash', args: ['-c', 'head -c 5000000 /dev/zero | tr "\\0" x; printf END'] },
      AbortSignal.timeout(300_000))
    assert.equal(big.exitCode, 0)
    assert.equal(big.metadata.outputTruncated, true)
    assert.equal(big.stdout.length, 4194304)
    assert.ok(big.stdout.endsWith('xEND'))

    const t = await execute(client, { lease, command: '/bin/bash', args: ['-c', 'echo started; sleep 600'] }, AbortSignal.timeout(5000))
    assert.equal(t.timedOut, true)
    assert.equal(t.stdout, 'started\n')
  } finally {
    await destroySandbox(client, sandboxId)
  }
})

async function api(client, method, path, body) {
  const base = client.config.apiUrl.replace(/\/v1\/?$/, '').replace(/\/$/, '')
  const res = await fetch(`${base}/v1${path}`, {
    method,
    redirect: 'error',
    headers: { 'X-Api-Key': client.apiKey, ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  })
  if (!res.ok) throw new Error(`live API ${method} failed with HTTP ${res.status}`)
  return (await res.json()).data
}

async function createSandbox(client) {
  const data = await api(client, 'POST', '/sandboxes', { shape: env.CREATEOS_SHAPE, ingress_enabled: false })
  return data.id
}

async function waitRunning(client, id) {
  const end = Date.now() + 5 * 60_000
  for (;;) {
    const data = await api(client, 'GET', `/sandboxes/${id}`)
    if (data.status === 'running') return
    if (Date.now() > end || ['error', 'failed', 'destroyed'].includes(data.status)) throw new Error(`sandbox is ${data.status}`)
    await new Promise((resolve) => setTimeout(resolve, 2000))
  }
}
