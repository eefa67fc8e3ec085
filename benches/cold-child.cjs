'use strict'

// §7 of the bench: the first command of a fresh process (a cold client: no HTTP client, no
// connection, no TLS session yet). argv[2] is JSON { client, params }; prints one JSON line
// { ms, exitCode, stdout } measured around that one `execute` call.
const { loadLib } = require('./lib/load.cjs')

async function main() {
  const { client, params } = JSON.parse(process.argv[2])
  const lib = loadLib()
  const t = performance.now()
  const r = await lib.execute(client, params)
  const ms = performance.now() - t
  process.stdout.write(`${JSON.stringify({ ms, exitCode: r.exitCode, stdout: r.stdout })}\n`)
}

main().then(() => setTimeout(() => process.exit(0), 20).unref(), (e) => {
  process.stdout.write(`${JSON.stringify({ error: String(e && e.message) })}\n`)
  process.exit(1)
})
