'use strict'

// The platform's napi triple as the platform packages are named (createos-execute-<tag>), and
// as the built binary is named (createos-execute.<tag>.node). Loads nothing: scripts/pack-local.mjs
// uses it too.
function platformTag() {
  const { platform, arch } = process
  if (platform === 'linux') {
    let glibc = true
    try {
      glibc = Boolean(process.report.getReport().header.glibcVersionRuntime)
    } catch {
      // Assume glibc when the report is unavailable.
    }
    return `linux-${arch}-${glibc ? 'gnu' : 'musl'}`
  }
  if (platform === 'win32') return `win32-${arch}-msvc`
  return `${platform}-${arch}`
}

module.exports = { platformTag }
