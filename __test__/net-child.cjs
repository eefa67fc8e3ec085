'use strict'
// Runs one `execute` in a fresh process, for the tests whose rule is read from the
// environment once per process (proxies, NODE_EXTRA_CA_CERTS): argv[2] is JSON
// { client, params }; prints JSON { ok, result } or { ok: false, message, code, stack }.
const { execute } = require('../index.js')

const { client, params } = JSON.parse(process.argv[2])
execute(client, params).then(
  (result) => process.stdout.write(JSON.stringify({ ok: true, result })),
  (e) => process.stdout.write(JSON.stringify({ ok: false, message: e.message, code: e.code, stack: String(e.stack) })),
)
