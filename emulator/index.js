'use strict'

// createos-execute-emulator: the local CreateOS for tests, demos and benchmarks.
// A thin layer over the generated binding; the emulator itself is Rust
// (crates/emulator in the createos-execute repository). Linux only: elsewhere
// loading this package fails with a message that says so.

if (process.platform !== 'linux') {
  throw new Error(`createos-execute-emulator runs only on Linux (it observes process trees through /proc); this is ${process.platform}.`)
}

// The platform's napi triple as the platform packages are named (createos-execute-emulator-<tag>).
function platformTag() {
  let glibc = true
  try {
    glibc = Boolean(process.report.getReport().header.glibcVersionRuntime)
  } catch {
    // Assume glibc when the report is unavailable.
  }
  return `linux-${process.arch}-${glibc ? 'gnu' : 'musl'}`
}

// The generated loader's error lists every path it tried; this one says what to do.
function loadNative() {
  try {
    return require('./binding.js')
  } catch (cause) {
    const tag = platformTag()
    const error = new Error(
      `createos-execute-emulator: no native binary for ${tag} (Node.js ${process.version}). ` +
      `Install the platform package createos-execute-emulator-${tag} at the version of createos-execute-emulator ` +
      '(npm installs it as an optional dependency: do not install with --omit=optional or --no-optional), ' +
      'or build it from source with `npm run build:emulator` in a checkout of createos-execute.',
      { cause },
    )
    error.code = 'CREATEOS_NATIVE_MISSING'
    throw error
  }
}
const native = loadNative()

/**
 * Starts a CreateOS-compatible server on 127.0.0.1 inside this process.
 * @param {import('./index').EmulatorOptions} [options]
 */
function startEmulator(options) {
  return native.startEmulator(options)
}

module.exports = { startEmulator, Emulator: native.Emulator }
