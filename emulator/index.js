'use strict'

// createos-execute-emulator: the local CreateOS for tests, demos and benchmarks.
// A thin layer over the generated binding; the emulator itself is Rust
// (crates/emulator in the createos-execute repository). Linux only: elsewhere
// loading this package fails with a message that says so.

if (process.platform !== 'linux') {
  throw new Error(`createos-execute-emulator runs only on Linux (it observes process trees through /proc); this is ${process.platform}.`)
}

const native = require('./binding.js')

/**
 * Starts a CreateOS-compatible server on 127.0.0.1 inside this process.
 * @param {import('./index').EmulatorOptions} [options]
 */
function startEmulator(options) {
  return native.startEmulator(options)
}

module.exports = { startEmulator, Emulator: native.Emulator }
