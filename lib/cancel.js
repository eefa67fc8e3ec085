'use strict'

// AbortSignal → native CancelHandle, and the calls still in flight when the process exits.

const { native } = require('./native.js')
const { checkSignal } = require('./input.js')

// Every in-flight call is referenced from here until it settles, so neither the
// signal nor its listener nor the handle can be collected while native work
// runs (the TypeScript module lost aborts after a GC because fetch held the
// signal weakly).
const inFlight = new Set()

function isTimeout(signal) {
  const reason = signal.reason
  return reason !== null && typeof reason === 'object' && reason.name === 'TimeoutError'
}

/** Runs `run(handle)` with a CancelHandle that `signal` (checked here) cancels. */
async function withCancel(signal, run) {
  signal = checkSignal(signal)
  const handle = new native.CancelHandle()
  const entry = { signal, handle, onAbort: undefined }
  inFlight.add(entry)
  try {
    if (signal) {
      if (signal.aborted) {
        handle.cancel(isTimeout(signal))
      } else {
        entry.onAbort = () => handle.cancel(isTimeout(signal))
        signal.addEventListener('abort', entry.onAbort, { once: true })
      }
    }
    return await run(handle)
  } finally {
    if (entry.onAbort) signal.removeEventListener('abort', entry.onAbort)
    inFlight.delete(entry)
  }
}

// On `process.exit()` (or the end of a worker), calls still in flight are cancelled and
// their cleanups (the DELETE of each process tree) get up to 3 s before the thread ends: the
// environment's native cleanup hook covers `worker.terminate()`, this covers `process.exit()`,
// which does not run those hooks. Nothing waits when no call is in flight.
process.on('exit', () => {
  native.endInFlightCalls()
})

module.exports = { withCancel, isTimeout }
