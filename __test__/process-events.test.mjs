// processEvents(response) (issue 13 §6): the NDJSON frames of a real fetch Response, from a
// node http server on 127.0.0.1 and from the emulator's process connect stream.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createServer } from 'node:http'
import { once } from 'node:events'
import { lib, rejection, sleep, useEmulator } from './helpers.mjs'

const { processEvents } = lib
const MiB = 1024 * 1024
const TOO_LARGE = 'CreateOS process frame is too large.'
const INVALID = 'CreateOS returned an invalid process frame.'
const EMPTY = 'CreateOS returned an empty process stream.'

// Each route: the body as a list of writes (with a pause between writes), or a handler.
const closed = new Map() // route → resolves when the server saw the client go away
const ROUTES = {
  '/frames': ['{"type":"data","seq":1}\n', '\n', '  \r\n{"type":"da', 'ta","seq":2}\r\n{"type":"exit","exit_code":0}'],
  '/one-byte-writes': [...'{"a":1}\n\n{"b":"é€😀"}\n'].map((c) => Buffer.from(c)),
  '/exactly-1mib': [`{"a":"${'x'.repeat(MiB - 8)}"}\n{"b":2}\n`],
  '/over-1mib': [`{"a":"${'x'.repeat(MiB - 7)}"}\n`],
  '/over-1mib-no-newline': ['{"a":"', 'x'.repeat(MiB / 2), 'x'.repeat(MiB / 2 + 10)],
  '/bad-json': ['{"type":"data"}\n', '{"type":\n'],
  '/array': ['[1,2]\n'],
  '/number': ['{"a":1}\n', '42\n'],
  '/null': ['null\n'],
  '/string': ['"frame"\n'],
  '/empty': [],
  '/blank-only': ['\n\n  \n\r\n'],
  '/truncated-last': ['{"a":1}\n{"b":'],
}
let server
let base
before(async () => {
  server = createServer(async (req, res) => {
    const path = new URL(req.url, 'http://x').pathname
    let seen
    const gone = new Promise((resolve) => { seen = resolve })
    closed.set(path, gone)
    res.on('close', () => seen(res.writableFinished ? 'finished' : 'aborted'))
    res.writeHead(200, { 'content-type': 'application/x-ndjson' })
    if (path === '/endless') {
      // One frame, then a heartbeat every 20 ms until the client goes away.
      res.write('{"type":"data","seq":1}\n')
      const timer = setInterval(() => res.write('{"type":"heartbeat"}\n'), 20)
      res.on('close', () => clearInterval(timer))
      return
    }
    for (const part of ROUTES[path] ?? []) {
      res.write(part)
      await sleep(2)
    }
    res.end()
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  base = `http://127.0.0.1:${server.address().port}`
})
after(() => { server.closeAllConnections(); server.close() })

async function collect(path) {
  const frames = []
  for await (const f of processEvents(await fetch(base + path))) frames.push(f)
  return frames
}

test('yields each frame, skipping blank lines, across any chunking and CRLF', async () => {
  assert.deepEqual(await collect('/frames'), [
    { type: 'data', seq: 1 }, { type: 'data', seq: 2 }, { type: 'exit', exit_code: 0 },
  ])
  assert.deepEqual(await collect('/one-byte-writes'), [{ a: 1 }, { b: 'é€😀' }])
})

test('a line of exactly 1 MiB is a frame; one byte more is too large', async () => {
  const frames = await collect('/exactly-1mib')
  assert.equal(frames.length, 2)
  assert.equal(frames[0].a.length, MiB - 8)
  assert.equal((await rejection(collect('/over-1mib'))).message, TOO_LARGE)
  // Without a newline: rejected as soon as the buffered line passes 1 MiB.
  assert.equal((await rejection(collect('/over-1mib-no-newline'))).message, TOO_LARGE)
})

test('bad JSON and non-object frames are invalid, after the good frames before them', async () => {
  const seen = []
  const error = await rejection((async () => {
    for await (const f of processEvents(await fetch(`${base}/bad-json`))) seen.push(f)
  })())
  assert.equal(error.message, INVALID)
  assert.deepEqual(seen, [{ type: 'data' }])
  for (const path of ['/array', '/number', '/null', '/string', '/truncated-last']) {
    assert.equal((await rejection(collect(path))).message, INVALID, path)
  }
})

test('an empty body, or one of blank lines only, is an empty stream', async () => {
  assert.equal((await rejection(collect('/empty'))).message, EMPTY)
  assert.equal((await rejection(collect('/blank-only'))).message, EMPTY)
  const noBody = new Response(null, { status: 200 })
  assert.equal((await rejection((async () => { for await (const _ of processEvents(noBody)); })())).message, EMPTY)
})

test('stopping early cancels the reader: the server sees the connection go away', async () => {
  const response = await fetch(`${base}/endless`)
  const frames = []
  for await (const f of processEvents(response)) {
    frames.push(f)
    if (frames.length === 3) break
  }
  assert.deepEqual(frames[0], { type: 'data', seq: 1 })
  const outcome = await Promise.race([closed.get('/endless'), sleep(5000).then(() => 'still open')])
  assert.equal(outcome, 'aborted')
  assert.equal(response.bodyUsed, true)
})

test('a consumer that throws cancels the reader too', async () => {
  const response = await fetch(`${base}/endless`)
  const error = await rejection((async () => {
    for await (const f of processEvents(response)) {
      void f
      throw new Error('consumer failed')
    }
  })())
  assert.equal(error.message, 'consumer failed')
  const outcome = await Promise.race([closed.get('/endless'), sleep(5000).then(() => 'still open')])
  assert.equal(outcome, 'aborted')
})

// ---------------------------------------------------------------------------
// The emulator's connect stream

let ctx
let sandbox
useEmulator(import.meta.url, (c) => { ctx = c; sandbox = c.sandbox() })

test("reads the emulator's process connect stream to the exit frame", async () => {
  const headers = { 'x-api-key': ctx.apiKey, 'content-type': 'application/json' }
  const created = await fetch(`${ctx.url}/v1/sandboxes/${sandbox}/processes`, {
    method: 'POST', headers, body: JSON.stringify({ cmd: 'printf', args: ['a\\nb'] }),
  })
  assert.ok(created.ok, `HTTP ${created.status}`)
  const json = await created.json()
  const processId = (json.data ?? json).process_id
  assert.ok(processId)
  const response = await fetch(`${ctx.url}/v1/sandboxes/${sandbox}/processes/${processId}/connect?after=0`, { headers })
  assert.equal(response.status, 200)
  let out = ''
  let exit
  for await (const frame of processEvents(response)) {
    if (frame.type === 'data') out += Buffer.from(frame.data_base64, 'base64').toString()
    if (frame.type === 'exit') { exit = frame; break }
  }
  assert.equal(out, 'a\nb')
  assert.equal(exit.exit_code, 0)
  const kinds = ctx.requests().map((r) => `${r.method} ${r.path.split('/').slice(-1)[0]}`)
  assert.deepEqual(kinds, ['POST processes', 'GET connect'])
})
