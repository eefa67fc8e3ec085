'use strict'

// processEvents: the NDJSON frames of a fetch Response body (the TypeScript module's export).

const { CODES, codedError } = require('./errors.js')

const MAX_FRAME_BYTES = 1024 * 1024
const FRAME_TOO_LARGE = 'CreateOS process frame is too large.'
const INVALID_FRAME = 'CreateOS returned an invalid process frame.'
const EMPTY_STREAM = 'CreateOS returned an empty process stream.'

function parseFrame(bytes, decoder) {
  const line = decoder.decode(bytes)
  if (line.trim() === '') return undefined
  let frame
  try {
    frame = JSON.parse(line)
  } catch {
    throw codedError(INVALID_FRAME, CODES.error)
  }
  if (frame === null || typeof frame !== 'object' || Array.isArray(frame)) throw codedError(INVALID_FRAME, CODES.error)
  return frame
}

/**
 * Yields each NDJSON frame (a JSON object) of `response.body`. Blank lines are skipped; a
 * line over 1 MiB, bad JSON or a non-object, and a body without any frame are errors. The
 * body's reader is cancelled when the consumer stops early (break, return, throw).
 */
async function* processEvents(response) {
  const body = response !== null && typeof response === 'object' ? response.body : undefined
  if (body === null || body === undefined || typeof body.getReader !== 'function') throw codedError(EMPTY_STREAM, CODES.error)
  const reader = body.getReader()
  const decoder = new TextDecoder()
  let pending = [] // bytes of the line being read, as chunks
  let pendingBytes = 0
  let frames = 0
  let finished = false
  try {
    for (;;) {
      const { done, value } = await reader.read()
      if (done) break
      const chunk = value instanceof Uint8Array ? value : new Uint8Array(value)
      let start = 0
      for (let nl = chunk.indexOf(10, start); nl !== -1; nl = chunk.indexOf(10, start)) {
        if (pendingBytes + (nl - start) > MAX_FRAME_BYTES) throw codedError(FRAME_TOO_LARGE, CODES.error)
        let line = chunk.subarray(start, nl)
        if (pendingBytes > 0) {
          pending.push(line)
          line = Buffer.concat(pending, pendingBytes + line.length)
          pending = []
          pendingBytes = 0
        }
        start = nl + 1
        const frame = parseFrame(line, decoder)
        if (frame !== undefined) {
          frames++
          yield frame
        }
      }
      if (start < chunk.length) {
        pendingBytes += chunk.length - start
        if (pendingBytes > MAX_FRAME_BYTES) throw codedError(FRAME_TOO_LARGE, CODES.error)
        // Copied: the reader may reuse its buffer.
        pending.push(Uint8Array.prototype.slice.call(chunk, start))
      }
    }
    finished = true
    if (pendingBytes > 0) {
      const frame = parseFrame(Buffer.concat(pending, pendingBytes), decoder)
      pending = []
      if (frame !== undefined) {
        frames++
        yield frame
      }
    }
    if (frames === 0) throw codedError(EMPTY_STREAM, CODES.error)
  } finally {
    if (!finished) await reader.cancel().catch(() => {})
    reader.releaseLock()
  }
}

module.exports = { processEvents, parseFrame, MAX_FRAME_BYTES }
