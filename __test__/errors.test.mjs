// The error classes, isCreateosCleanupError across loaded copies, and
// waitForRequest (the shared request pacer).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { spawnSync } from 'node:child_process'
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { lib, startEmu, bashParams, rejection, TERMINATION_UNCONFIRMED, ROOT } from './helpers.mjs'

const require = createRequire(import.meta.url)
const {
  CreateosCleanupError, CreateosApiError, CreateosDestroyError, CreateosInputError,
  isCreateosCleanupError, isCreateosError, waitForRequest,
} = lib

/**
 * A second, independent copy of index.js and its lib/ modules (as when two versions are
 * installed); the native binding is loaded once per process, so it stays shared.
 */
function loadSecondCopy() {
  const paths = [require.resolve('../index.js'), ...readdirSync(join(ROOT, 'lib')).filter((f) => f.endsWith('.js')).map((f) => join(ROOT, 'lib', f))]
  const saved = new Map(paths.map((p) => [p, require.cache[p]]))
  for (const p of paths) delete require.cache[p]
  try {
    return require('../index.js')
  } finally {
    for (const [p, m] of saved) {
      if (m) require.cache[p] = m
      else delete require.cache[p]
    }
  }
}

let ctx
before(async () => { ctx = await startEmu() })
after(async () => { await ctx.close(fileURLToPath(import.meta.url)) })

test('CreateosCleanupError is a real Error subclass', () => {
  const e = new CreateosCleanupError('m', { reason: 'termination-unconfirmed', sandboxId: 's', processId: 'p', attempts: [] })
  assert.ok(e instanceof CreateosCleanupError)
  assert.ok(e instanceof Error)
  assert.equal(e.name, 'CreateosCleanupError')
  assert.equal(e.message, 'm')
  assert.match(e.stack, /^CreateosCleanupError: m\n\s+at /)
  assert.equal(e.reason, 'termination-unconfirmed')
  assert.equal(e.sandboxId, 's')
  assert.equal(e.processId, 'p')
  assert.deepEqual(e.attempts, [])
  assert.equal(Object.prototype.toString.call(e), '[object Error]')
  // Same constructor shape as the TypeScript module (extends Error with no fields).
  const plain = new CreateosCleanupError()
  assert.equal(plain.message, '')
  assert.ok(isCreateosCleanupError(plain))
})

test('CreateosApiError has the TypeScript module\'s constructor and message', () => {
  const e = new CreateosApiError(503, 'process cleanup')
  assert.ok(e instanceof Error)
  assert.equal(e.name, 'CreateosApiError')
  assert.equal(e.status, 503)
  assert.equal(e.message, 'CreateOS request failed (HTTP 503) during process cleanup.')
  assert.equal(new CreateosApiError(404).message, 'CreateOS request failed (HTTP 404).')
  assert.match(e.stack, /^CreateosApiError: /)
})

test('isCreateosCleanupError recognises an error from another loaded copy', async () => {
  const other = loadSecondCopy()
  assert.notEqual(other.CreateosCleanupError, CreateosCleanupError, 'really a second copy')
  const foreign = new other.CreateosCleanupError('x')
  assert.equal(foreign instanceof CreateosCleanupError, false)
  assert.equal(isCreateosCleanupError(foreign), true)
  assert.equal(other.isCreateosCleanupError(new CreateosCleanupError('y')), true)
  for (const value of [null, undefined, 'CreateosCleanupError', new Error('x'), { name: 'CreateosCleanupError' }, new CreateosApiError(500)]) {
    assert.equal(isCreateosCleanupError(value), false)
  }

  // And one thrown for real by the other copy.
  const sandbox = ctx.sandbox()
  ctx.emu.addFault({ route: 'deleteProcess', action: { kind: 'treeExitedFalse' } })
  try {
    const error = await rejection(other.execute(ctx.client({ timeoutMs: 1500, legacyCleanup: true }),
      bashParams(sandbox, 'sleep 60'), AbortSignal.timeout(300)))
    assert.equal(error.message, TERMINATION_UNCONFIRMED)
    assert.equal(error.code, 'CREATEOS_CLEANUP_UNCONFIRMED')
    assert.equal(isCreateosError(error), true)
    assert.equal(error instanceof CreateosCleanupError, false)
    assert.equal(isCreateosCleanupError(error), true)
  } finally {
    ctx.emu.clearFaults()
  }
})

test('a cleanup error from a vm context is recognised too', async () => {
  const { runInNewContext } = await import('node:vm')
  const { readFileSync } = await import('node:fs')
  const { join } = await import('node:path')
  // The classes live in lib/errors.js, which requires nothing.
  const source = readFileSync(join(ROOT, 'lib', 'errors.js'), 'utf8')
  const module = { exports: {} }
  const sandboxRequire = (id) => { throw new Error(`lib/errors.js requires nothing (asked for ${id})`) }
  runInNewContext(`(function (module, exports, require, process) {${source}\n})`, {})(module, module.exports, sandboxRequire, process)
  const e = new module.exports.CreateosCleanupError('from vm')
  assert.equal(e instanceof Error, false, 'another realm')
  assert.equal(isCreateosCleanupError(e), true)
})

test('waitForRequest spaces a fresh origin\'s requests by the default budget and honours signals', async () => {
  // An origin nobody else uses; the first call passes at once.
  const origin = 'https://pacer-test.invalid'
  const t0 = performance.now()
  await waitForRequest(origin)
  assert.ok(performance.now() - t0 < 100)
  const aborted = AbortSignal.abort(new Error('why'))
  const error = await rejection(waitForRequest(origin, aborted))
  assert.equal(error, aborted.reason)
  await assert.rejects(waitForRequest('not a url'), Error)
})

test('waitForRequest shares one budget with execute for the same origin (spacing mode)', async () => {
  // With the TypeScript module's spacing rule every start is ≥ 300 ms after the
  // previous one, whoever makes it.
  const sandbox = ctx.sandbox()
  ctx.emu.clearRequests()
  await lib.execute(ctx.client({ pacing: 'spacing' }), bashParams(sandbox, 'true'))
  const t0 = performance.now()
  await waitForRequest(ctx.url)
  await waitForRequest(ctx.url)
  const elapsed = performance.now() - t0
  assert.ok(elapsed >= 280, `two waits took only ${elapsed.toFixed(0)} ms`)
})

test('every error class has its stable code, and the fields that are always set are set', () => {
  const api = new CreateosApiError(503, 'process cleanup')
  assert.equal(api.code, 'CREATEOS_API_ERROR')
  const cleanup = new CreateosCleanupError('m')
  assert.equal(cleanup.code, 'CREATEOS_CLEANUP_UNCONFIRMED')
  assert.equal(cleanup.reason, 'termination-unconfirmed')
  assert.equal(cleanup.sandboxId, '')
  assert.equal(cleanup.processId, null)
  const destroy = new CreateosDestroyError('m', { sandboxId: 's' })
  assert.equal(destroy.code, 'CREATEOS_DESTROY_UNCONFIRMED')
  assert.equal(destroy.sandboxId, 's')
  const input = new CreateosInputError('x must be a string.')
  assert.equal(input.code, 'CREATEOS_INVALID_INPUT')
  assert.ok(input instanceof TypeError)
  assert.equal(input.name, 'CreateosInputError')
  for (const e of [api, cleanup, destroy, input]) assert.equal(isCreateosError(e), true, e.name)
  for (const v of [null, undefined, 'CREATEOS_ERROR', new Error('x'), { code: 'CREATEOS_ERROR' }, Object.assign(new Error('x'), { code: 'ENOENT' })]) {
    assert.equal(isCreateosError(v), false, String(v))
  }
})

test('errors thrown for real carry their codes: API, cleanup, destroy, cancelled, protocol', async () => {
  const sandbox = ctx.sandbox()
  ctx.emu.clearFaults()
  ctx.emu.addFault({ route: 'putFile', times: 1, action: { kind: 'status', status: 403 } })
  const api = await rejection(lib.execute(ctx.client(), bashParams(sandbox, 'cat', { stdin: 'x' })))
  assert.ok(api instanceof CreateosApiError)
  assert.equal(api.code, 'CREATEOS_API_ERROR')
  assert.equal(api.status, 403)
  ctx.emu.clearFaults()

  ctx.emu.addFault({ route: 'deleteProcess', action: { kind: 'treeExitedFalse' } })
  const cleanup = await rejection(lib.execute(ctx.client({ timeoutMs: 1500, legacyCleanup: true }),
    bashParams(sandbox, 'echo started; sleep 60'), AbortSignal.timeout(600)))
  ctx.emu.clearFaults()
  assert.ok(cleanup instanceof CreateosCleanupError)
  assert.equal(cleanup.code, 'CREATEOS_CLEANUP_UNCONFIRMED')
  assert.equal(cleanup.reason, 'termination-unconfirmed')
  assert.equal(cleanup.sandboxId, sandbox)
  assert.equal(typeof cleanup.processId, 'string')
  assert.ok(cleanup.attempts.length > 0)

  const bad = await rejection(lib.destroySandbox({ config: { apiUrl: ctx.url, timeoutMs: 2000 }, apiKey: 'wrong-key' }, sandbox))
  assert.ok(bad instanceof CreateosDestroyError)
  assert.equal(bad.code, 'CREATEOS_DESTROY_UNCONFIRMED')
  assert.equal(bad.sandboxId, sandbox)

  const cancelled = await rejection(lib.execute(ctx.client(), bashParams(sandbox, 'sleep 60'), AbortSignal.abort()))
  assert.equal(cancelled.code, 'CREATEOS_CANCELLED')

  ctx.emu.addFault({ route: 'connect', times: 1, action: { kind: 'gapAfterFrames', frames: 1 } })
  const gap = await rejection(lib.execute(ctx.client(), bashParams(sandbox, 'for i in 1 2 3 4; do echo $i; sleep 0.05; done')))
  ctx.emu.clearFaults()
  assert.equal(gap.code, 'CREATEOS_ERROR', gap.message)
  for (const e of [api, cleanup, bad, cancelled, gap]) assert.equal(isCreateosError(e), true, e.message)
})

/** The top-level arguments of every call of `prefix` in `source` (balanced parentheses, strings skipped). */
function calls(source, prefix) {
  const out = []
  for (let at = source.indexOf(prefix); at !== -1; at = source.indexOf(prefix, at + 1)) {
    const args = []
    let depth = 1
    let current = ''
    for (let i = at + prefix.length; i < source.length && depth > 0; i++) {
      const c = source[i]
      if (c === '"') {
        const end = source.indexOf('"', i + 1)
        current += source.slice(i, end + 1)
        i = end
        continue
      }
      if (c === '(') depth++
      if (c === ')') depth--
      if (depth === 0 || (depth === 1 && c === ',')) {
        args.push(current.trim())
        current = ''
      } else {
        current += c
      }
    }
    out.push(args.filter((a) => a !== ''))
  }
  return out
}

// The words a cleanup or a destruction reports, read from the Rust source: every
// `steps.push(step, grace, outcome)` call, with `outcome_of(..)`, `state_word(..)` and
// `format!("found {}", ..)` expanded to what they return.
function rustAttemptWords() {
  const rust = readFileSync(join(ROOT, 'crates', 'core', 'src', 'cleanup.rs'), 'utf8')
  const body = (name) => {
    const start = rust.indexOf(`fn ${name}(`)
    assert.ok(start >= 0, `fn ${name} in cleanup.rs`)
    return rust.slice(start, rust.indexOf('\n}\n', start))
  }
  const literals = (text) => [...text.matchAll(/=>\s*(?:format!\()?"([^"]*)"/g)].map((m) => m[1].replace(/\{[a-z_]*\}/g, '7'))
  const failures = literals(body('outcome_of')).map((w) => w.replace(/\.into\(\)$/, ''))
  const states = literals(body('state_word'))
  assert.ok(failures.includes('HTTP 7') && failures.includes('no response'), failures.join(','))
  assert.ok(states.includes('destroying') && states.includes('other state'), states.join(','))
  const pairs = []
  for (const args of calls(rust, 'steps.push(')) {
    assert.equal(args.length, 3, args.join(' | '))
    const [step, , expr] = args
    let words
    if (expr.startsWith('outcome_of(')) words = failures
    else if (expr.startsWith('state_word(')) words = states
    else if (expr.startsWith('format!')) words = [JSON.parse(expr.match(/"[^"]*"/)[0]).replace(/\{[a-z_]*\}/g, '2')]
    else words = [JSON.parse(expr)]
    for (const w of words) pairs.push([JSON.parse(step), w])
  }
  assert.ok(pairs.length > 20, `found ${pairs.length} steps.push calls`)
  return pairs
}

test('the d.ts unions of steps and outcomes hold every word the Rust source reports, and only those', () => {
  const pairs = rustAttemptWords()
  const DESTROY = new Set(['destroy', 'state'])
  const seenDestroy = new Set(pairs.filter(([step]) => DESTROY.has(step)).map(([, w]) => w))
  const lines = ['import type { CleanupAttempt, DestroyAttempt } from "createos-execute";']
  pairs.forEach(([step, word], i) => {
    const type = DESTROY.has(step) || (step === 'backoff' && seenDestroy.size === 0) ? 'DestroyAttempt' : 'CleanupAttempt'
    lines.push(`export const a${i}: ${type} = { step: ${JSON.stringify(step)}, graceMs: null, outcome: ${JSON.stringify(word)}, atMs: 0 };`)
  })
  // backoff is a step of both.
  lines.push('export const b1: DestroyAttempt = { step: "backoff", graceMs: null, outcome: "deadline passed", atMs: 0 };')
  const dir = mkdtempSync(join(tmpdir(), 'createos-dts-words-'))
  try {
    writeFileSync(join(dir, 'words.ts'), `${lines.join('\n')}\n`)
    writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({
      compilerOptions: {
        strict: true, noEmit: true, module: 'nodenext', moduleResolution: 'nodenext', types: ['node'],
        typeRoots: [join(ROOT, 'node_modules', '@types')],
        paths: { 'createos-execute': [join(ROOT, 'index.d.ts')] },
      },
      files: ['words.ts'],
    }))
    const tsc = spawnSync(process.execPath, [join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', dir], { encoding: 'utf8' })
    assert.equal(tsc.status, 0, `a word the Rust source reports is missing from index.d.ts:\n${tsc.stdout}${tsc.stderr}`)
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }

  // And the other way: every literal word of the d.ts unions occurs in the Rust source.
  const dts = readFileSync(join(ROOT, 'index.d.ts'), 'utf8')
  const union = (name) => {
    const start = dts.indexOf(`export type ${name} =`)
    assert.ok(start >= 0, name)
    const end = dts.indexOf('\n\n', start)
    return [...dts.slice(start, end).matchAll(/'([^']*)'/g)].map((m) => m[1])
  }
  const words = new Set(pairs.map(([, w]) => w))
  const steps = new Set(pairs.map(([s]) => s))
  for (const w of [...union('CleanupOutcome'), ...union('AttemptFailure'), ...union('SandboxStateWord')]) {
    assert.ok(words.has(w), `index.d.ts lists "${w}", which the Rust source never reports`)
  }
  for (const s of [...union('CleanupStep'), ...union('DestroyStep')]) assert.ok(steps.has(s), `step "${s}"`)
})

test('the doc comments quote outcomes that really occur', () => {
  const words = new Set(rustAttemptWords().map(([, w]) => w))
  const dts = readFileSync(join(ROOT, 'index.d.ts'), 'utf8')
  const block = (name) => dts.slice(dts.lastIndexOf('/**', dts.indexOf(name)), dts.indexOf(name))
  for (const name of ['export interface CleanupAttempt', 'export interface DestroyAttempt', 'export type CleanupOutcome']) {
    const quoted = [...block(name).matchAll(/`([^`]+)`/g)].map((m) => m[1]).filter((w) => /^[a-zA-Z_ 0-9]+$/.test(w) && w !== 'null')
    for (const w of quoted) assert.ok(words.has(w.replace(/\d+/g, (n) => (n === '404' ? n : '7'))) || words.has(w), `${name} quotes "${w}"`)
  }
})

test('the export list is the same through require and import, and the error classes are one identity', async () => {
  const EXPORTS = [
    'CreateosApiError', 'CreateosCleanupError', 'CreateosDestroyError', 'CreateosInputError',
    'destroySandbox', 'execute', 'executeStream', 'followProcess', 'isCreateosCleanupError',
    'isCreateosError', 'processEvents', 'shellQuote', 'waitForRequest',
  ]
  const required = require('../index.js')
  assert.deepEqual(Object.keys(required).sort(), EXPORTS)
  // ESM named exports come from node's static reading of index.js's `module.exports = {…}`.
  const imported = await import('../index.js')
  // Node 24 adds a 'module.exports' key (the CommonJS value itself) beside 'default'.
  assert.deepEqual(Object.keys(imported).filter((k) => k !== 'default' && k !== 'module.exports').sort(), EXPORTS)
  assert.equal(imported.default, required)
  for (const name of EXPORTS) assert.equal(imported[name], required[name], name)
  const errors = require('../lib/errors.js')
  for (const name of ['CreateosApiError', 'CreateosCleanupError', 'CreateosDestroyError', 'CreateosInputError']) {
    assert.equal(required[name], errors[name], `${name} is lib/errors.js's class`)
  }
  // An error thrown from a lib/ module is an instance of the exported class.
  const thrown = await rejection(required.execute({ config: {} }, {}))
  assert.ok(thrown instanceof imported.CreateosInputError)
  assert.ok(thrown instanceof TypeError)
  assert.equal(thrown.code, 'CREATEOS_INVALID_INPUT')
})
