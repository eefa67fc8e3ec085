'use strict'

// Hand-written entry point: only the wiring of the public API. Everything that decides
// anything about a command lives in Rust (src/); the JS side's concerns are in lib/:
//   lib/native.js       loads the addon (a missing platform package is CREATEOS_NATIVE_MISSING)
//   lib/platform.js     the platform tag of the package and binary names (loads nothing)
//   lib/errors.js       the error classes, codes and guards; native outcome → value or error
//   lib/config.js       the host's client object → the native config; misspelled-key warnings
//   lib/input.js        the command's parameters, ids and callbacks, checked before anything is sent
//   lib/cancel.js       AbortSignal → native CancelHandle; in-flight calls at process exit
//   lib/diagnostics.js  the diagnostics_channel channels
//   lib/frames.js       processEvents (NDJSON frames of a fetch Response body)
//   lib/fetch-transport.js  which transport a call uses; the bridge to the host's fetch

const { native } = require('./lib/native.js')
const {
  CreateosApiError, CreateosCleanupError, CreateosDestroyError, CreateosInputError,
  isCreateosCleanupError, isCreateosError, emitWarnings, unwrap, isCancelled,
} = require('./lib/errors.js')
const { nativeClient, urlClient, clientSecrets } = require('./lib/config.js')
const { nativeParams, guardLog, requireString, requireId, requireFunction, NUL_IN_VALUE } = require('./lib/input.js')
const { withCancel } = require('./lib/cancel.js')
const { diagnosticsCallback, publishBackground } = require('./lib/diagnostics.js')
const { processEvents } = require('./lib/frames.js')
const { transportFor, fetchFailure } = require('./lib/fetch-transport.js')

// Warnings the core queues between calls (a shared pacing store that answers again, noticed by
// its probe) reach the host when they happen, not only with the next call that settles.
native.setWarningListener(() => emitWarnings({ warnings: native.takeWarningsNow() }))
// Requests no call owns (a session supervisor's stream and its end) on diagnostics_channel too.
native.setDiagnosticsListener(publishBackground)

async function execute(client, params, signal, log) {
  const c = nativeClient(client)
  const p = nativeParams(params, clientSecrets(c))
  const onLog = guardLog(log)
  const onDiag = diagnosticsCallback()
  const transport = transportFor(c.transport)
  const outcome = await withCancel(signal, (handle) => native.executeNative(c, p, handle, onLog, onDiag, transport))
  const value = unwrap(outcome, fetchFailure(transport))
  // `containment` is session mode's (config.session); the default mode's metadata has none.
  if (value.metadata.containment == null) delete value.metadata.containment
  return value
}

async function executeStream(client, params, signal, log) {
  const c = nativeClient(client)
  const p = nativeParams(params, clientSecrets(c))
  const onLog = guardLog(log)
  const onDiag = diagnosticsCallback()
  const transport = transportFor(c.transport)
  const outcome = await withCancel(signal, (handle) => native.executeStreamNative(c, p, handle, onLog, onDiag, transport))
  return unwrap(outcome, fetchFailure(transport))
}

async function followProcess(client, sandboxId, processId, signal, onData, onConnected) {
  const c = nativeClient(client)
  requireId(sandboxId, 'sandboxId', 'sandbox')
  requireId(processId, 'processId', 'process')
  requireFunction(onData, 'onData')
  requireFunction(onConnected, 'onConnected', true)
  const transport = transportFor(c.transport)
  // As in the TypeScript module, a throwing onData/onConnected ends the follow
  // with that error; the native side is cancelled so it stops reading at once.
  let callbackError
  let failed = false
  const outcome = await withCancel(signal, (handle) => {
    const fail = (error) => {
      if (!failed) {
        failed = true
        callbackError = error
        handle.cancel(false)
      }
    }
    // One native callback: ('connected') on every attach, (stream, bytes) for output.
    const onEvent = (kind, data) => {
      if (failed) return
      try {
        if (kind === 'connected') {
          if (onConnected) onConnected()
        } else {
          onData(kind, data)
        }
      } catch (error) {
        fail(error)
      }
    }
    return native.followProcessNative(c, sandboxId, processId, handle, onEvent, diagnosticsCallback(), transport)
  })
  if (failed) {
    emitWarnings(outcome)
    throw callbackError
  }
  // As in the TypeScript module, an aborted follow rejects with the signal's reason
  // (the host aborts its own follower with a reason of its choosing).
  if (isCancelled(outcome) && signal && signal.aborted) {
    emitWarnings(outcome)
    throw signal.reason
  }
  return unwrap(outcome, fetchFailure(transport))
}

async function waitForRequest(apiUrl, signal) {
  requireString(apiUrl, 'apiUrl')
  const c = urlClient(apiUrl)
  const outcome = await withCancel(signal, (handle) => native.waitForRequestNative(c, handle))
  if (isCancelled(outcome) && signal && signal.aborted) {
    emitWarnings(outcome)
    throw signal.reason
  }
  unwrap(outcome)
}

// Resolves the receipt `{ providerLeaseId, state: 'destroyed' }` once the sandbox is
// confirmed gone; else rejects with CreateosDestroyError.
async function destroySandbox(client, sandboxId) {
  const c = nativeClient(client)
  requireId(sandboxId, 'sandboxId', 'sandbox')
  const transport = transportFor(c.transport)
  return unwrap(await native.destroySandboxNative(c, sandboxId, diagnosticsCallback(), transport), fetchFailure(transport))
}

function shellQuote(value) {
  requireString(value, 'value')
  try {
    return native.shellQuote(value)
  } catch (error) {
    // The one native refusal: NUL in the value.
    throw new CreateosInputError(error && typeof error.message === 'string' ? error.message : NUL_IN_VALUE)
  }
}

module.exports = {
  execute,
  executeStream,
  followProcess,
  shellQuote,
  processEvents,
  waitForRequest,
  destroySandbox,
  CreateosCleanupError,
  CreateosApiError,
  CreateosDestroyError,
  CreateosInputError,
  isCreateosCleanupError,
  isCreateosError,
}
