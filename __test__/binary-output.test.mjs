// Binary output (issue 13 §5): random bytes decode exactly as WHATWG/`from_utf8_lossy` do
// (TextDecoder is the reference), in stdout and in `log`, with few `log` calls.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync, rmSync } from 'node:fs'
import { lib, bashParams, useEmulator } from './helpers.mjs'

const { execute } = lib
let ctx
let sandbox
// A journal that holds a whole `cat` (a file's `cat` outruns any reader, and the slow `log` below
// lags on purpose).
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() }, { journalBytes: 4 << 20 })

test('random bytes: stdout and the joined log equal TextDecoder of the bytes; one log call per read', async () => {
  const file = `/tmp/createos-binary-${process.pid}`
  try {
    const make = await execute(ctx.client(), bashParams(sandbox, `head -c 300000 /dev/urandom > ${file}; printf 'é€😀\\xff\\xe2\\x82' >> ${file}`))
    assert.equal(make.exitCode, 0, make.stderr)
    const want = new TextDecoder().decode(readFileSync(file))
    const logged = []
    const r = await execute(ctx.client(), bashParams(sandbox, `cat ${file}`), undefined, (stream, text) => {
      assert.equal(stream, 'stdout')
      logged.push(text)
    })
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, want)
    assert.equal(logged.join(''), want)
    // ~300 KB arrives in a handful of reads; one call per byte run would be ~100,000.
    assert.ok(logged.length < 200, `${logged.length} log calls`)
    assert.ok(logged.every((t) => t.length > 0))
  } finally {
    rmSync(file, { force: true })
  }
})

test('a slow log: queued text is joined only up to 128 KiB of UTF-16 (V8 young-generation strings), nothing lost', async () => {
  const file = `/tmp/createos-binary-slow-${process.pid}`
  try {
    const make = await execute(ctx.client(), bashParams(sandbox, `head -c 2097152 /dev/urandom > ${file}`))
    assert.equal(make.exitCode, 0, make.stderr)
    const want = new TextDecoder().decode(readFileSync(file))
    const logged = []
    const r = await execute(ctx.client(), bashParams(sandbox, `cat ${file}`), undefined, (_stream, text) => {
      // Behind on purpose: the reader queues several reads while this call runs.
      const until = performance.now() + 3
      while (performance.now() < until) {}
      logged.push(text)
    })
    assert.equal(r.exitCode, 0)
    assert.equal(logged.join(''), want)
    // A read is at most 64 KiB (65,536 units); two of random bytes never fit under the cap,
    // where joining up to 1 MiB made strings of ~500,000 units here.
    const longest = Math.max(...logged.map((t) => t.length))
    assert.ok(longest <= 65536, `longest log string: ${longest} units`)
    assert.ok(logged.length >= 30, `${logged.length} log calls`)
  } finally {
    rmSync(file, { force: true })
  }
})
