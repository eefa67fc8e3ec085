// Binary output (issue 13 §5): random bytes decode exactly as WHATWG/`from_utf8_lossy` do
// (TextDecoder is the reference), in stdout and in `log`, with few `log` calls.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync, rmSync } from 'node:fs'
import { lib, bashParams, useEmulator } from './helpers.mjs'

const { execute } = lib
let ctx
let sandbox
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() })

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
