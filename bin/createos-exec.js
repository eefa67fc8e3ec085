#!/usr/bin/env node
'use strict'

// createos-exec [--local | --api-url URL --sandbox ID] [--timeout MS] [--cwd DIR]
//               [--env K=V]... -- command args...
//
// Runs one command in a CreateOS sandbox through `execute`, streams its stdout
// and stderr live, and exits with its exit code. The API key comes from
// CREATEOS_API_KEY and is never printed; the API URL and the sandbox from the flags, else
// CREATEOS_API_URL and CREATEOS_SANDBOX_ID, and a CA to trust from CREATEOS_CA_FILE (the
// names `createos-emulator` prints). Exit codes of its own: 2 usage,
// 124 timed out, 125 cleanup unconfirmed, 1 any other failure; a command killed
// by a signal exits 128 + the signal number, like a shell.

const { constants } = require('node:os')

// Loaded when a command runs, so that a missing native binary (or any other load error) is
// one line and exit 1, like every other failure, not a stack trace.
function loadPackage() {
  return require('..')
}

// `--local` needs the emulator, which is its own package (a devDependency of hosts' tests):
// the production package does not contain it.
function loadEmulator() {
  try {
    return require('createos-execute-emulator')
  } catch (error) {
    if (error && error.code === 'MODULE_NOT_FOUND' && /createos-execute-emulator/.test(error.message)) {
      throw new Error('--local needs the emulator package: npm install --save-dev createos-execute-emulator')
    }
    throw error
  }
}

const USAGE = `usage: createos-exec [--local | --api-url URL --sandbox ID] [--timeout MS] [--cwd DIR]
                     [--env K=V]... [--stdin-file FILE] -- command [args...]

  --local          start an embedded emulator and a sandbox, run there (no account needed)
  --api-url URL    CreateOS API (e.g. https://api.sb.createos.sh); default CREATEOS_API_URL
  --sandbox ID     the sandbox to run in; default CREATEOS_SANDBOX_ID
  --timeout MS     time the command out after MS milliseconds (exit 124)
  --cwd DIR        working directory inside the sandbox
  --env K=V        environment variable for the command (repeatable)
  --stdin-file F   pass the contents of local file F as the command's stdin ('-' = this stdin)

The key comes from CREATEOS_API_KEY; CREATEOS_CA_FILE names a PEM CA to trust (as
createos-emulator --tls prints it).

Exit status: the command's; 124 on timeout; 125 when cleanup could not be confirmed;
2 on a usage error; 1 on any other error.`

class UsageError extends Error {}

// An environment variable's value, or undefined when it is unset or blank.
function fromEnv(env, name) {
  const value = env[name]
  return typeof value === 'string' && value.trim() !== '' ? value.trim() : undefined
}

function parseArgs(argv, env = process.env) {
  // A null-prototype object, so `--env __proto__=x` is a variable like any other.
  const opts = { local: false, apiUrl: undefined, sandbox: undefined, timeout: undefined, cwd: undefined, env: Object.create(null), stdinFile: undefined, command: [] }
  let i = 0
  const value = (flag) => {
    if (i + 1 >= argv.length) throw new UsageError(`${flag} needs a value`)
    return argv[++i]
  }
  for (; i < argv.length; i++) {
    let arg = argv[i]
    let inline
    if (/^--[a-z-]+=/.test(arg)) {
      inline = arg.slice(arg.indexOf('=') + 1)
      arg = arg.slice(0, arg.indexOf('='))
    }
    const take = () => (inline !== undefined ? inline : value(arg))
    switch (arg) {
      case '--':
        opts.command = argv.slice(i + 1)
        i = argv.length
        break
      case '-h':
      case '--help':
        opts.help = true
        break
      case '--local':
        opts.local = true
        break
      case '--api-url':
        opts.apiUrl = take()
        break
      case '--sandbox':
        opts.sandbox = take()
        break
      case '--timeout': {
        const raw = take()
        const n = Number(raw)
        if (!/^\d+$/.test(raw) || !Number.isSafeInteger(n) || n < 1) throw new UsageError('--timeout needs a positive integer (milliseconds)')
        opts.timeout = n
        break
      }
      case '--cwd':
        opts.cwd = take()
        break
      case '--env': {
        const kv = take()
        const eq = kv.indexOf('=')
        if (eq <= 0) throw new UsageError('--env needs K=V')
        opts.env[kv.slice(0, eq)] = kv.slice(eq + 1)
        break
      }
      case '--stdin-file':
        opts.stdinFile = take()
        break
      default:
        if (arg.startsWith('-')) throw new UsageError(`unknown option ${arg}`)
        // The command without a `--`: everything from here on.
        opts.command = argv.slice(i)
        i = argv.length
    }
  }
  if (opts.help) return opts
  if (opts.command.length === 0) throw new UsageError('no command given')
  if (opts.local && (opts.apiUrl || opts.sandbox)) throw new UsageError('--local cannot be combined with --api-url or --sandbox')
  if (!opts.local) {
    opts.apiUrl = opts.apiUrl || fromEnv(env, 'CREATEOS_API_URL')
    opts.sandbox = opts.sandbox || fromEnv(env, 'CREATEOS_SANDBOX_ID')
    opts.caFile = fromEnv(env, 'CREATEOS_CA_FILE')
    if (!opts.apiUrl || !opts.sandbox) {
      throw new UsageError('give --local, or both --api-url and --sandbox (or CREATEOS_API_URL and CREATEOS_SANDBOX_ID)')
    }
  }
  return opts
}

// An error as one line: its message only (a stack or a cause would be many).
function oneLine(error) {
  const text = error && typeof error.message === 'string' && error.message ? error.message : String(error)
  return text.replace(/\s*\n\s*/g, ' ')
}

function readStdin(file) {
  const fs = require('node:fs')
  return fs.readFileSync(file === '-' ? 0 : file, 'utf8')
}

async function main(argv) {
  let opts
  try {
    opts = parseArgs(argv)
  } catch (error) {
    if (!(error instanceof UsageError)) throw error
    process.stderr.write(`createos-exec: ${error.message}\n${USAGE}\n`)
    return 2
  }
  if (opts.help) {
    process.stdout.write(`${USAGE}\n`)
    return 0
  }

  let lib
  try {
    lib = loadPackage()
  } catch (error) {
    process.stderr.write(`createos-exec: ${oneLine(error)}\n`)
    return 1
  }
  const { execute, isCreateosCleanupError } = lib

  let emulator
  let apiUrl = opts.apiUrl
  let apiKey = process.env.CREATEOS_API_KEY
  let sandboxId = opts.sandbox
  const controller = new AbortController()
  const timer = opts.timeout
    ? setTimeout(() => controller.abort(new DOMException('The command timed out.', 'TimeoutError')), opts.timeout)
    : undefined
  // Ctrl-C / SIGTERM: cancel the command; execute() terminates its tree before it settles.
  let interrupted = 0
  const onSignal = (name) => {
    interrupted = constants.signals[name]
    controller.abort()
  }
  process.once('SIGINT', () => onSignal('SIGINT'))
  process.once('SIGTERM', () => onSignal('SIGTERM'))

  try {
    if (opts.local) {
      emulator = await loadEmulator().startEmulator({ rateLimitPerMinute: null })
      apiUrl = emulator.url
      apiKey = emulator.apiKey
      sandboxId = emulator.createSandbox()
    }
    const [command, ...args] = opts.command
    const params = { lease: { providerLeaseId: sandboxId }, command, args }
    if (opts.cwd !== undefined) params.cwd = opts.cwd
    if (Object.keys(opts.env).length) params.env = opts.env
    if (opts.stdinFile !== undefined) params.stdin = readStdin(opts.stdinFile)

    const config = { apiUrl, timeoutMs: 300_000, ...(opts.local ? { pacing: 'off' } : {}) }
    if (opts.caFile !== undefined) config.caCertPem = require('node:fs').readFileSync(opts.caFile, 'utf8')
    const client = { config, apiKey }
    const result = await execute(client, params, controller.signal, (stream, text) => {
      ;(stream === 'stderr' ? process.stderr : process.stdout).write(text)
    })
    if (result.timedOut) {
      process.stderr.write(`createos-exec: timed out after ${opts.timeout} ms; the command's processes were terminated.\n`)
      return 124
    }
    if (result.signal) {
      const n = constants.signals[result.signal]
      return n ? 128 + n : 1
    }
    return result.exitCode ?? 1
  } catch (error) {
    if (isCreateosCleanupError(error)) {
      process.stderr.write(`createos-exec: ${error.message}\n`)
      return 125
    }
    if (interrupted) {
      process.stderr.write('createos-exec: cancelled; the command\'s processes were terminated.\n')
      return 128 + interrupted
    }
    process.stderr.write(`createos-exec: ${oneLine(error)}\n`)
    return 1
  } finally {
    clearTimeout(timer)
    if (emulator) await emulator.close()
  }
}

if (require.main === module) {
  main(process.argv.slice(2)).then((code) => {
    process.exitCode = code
    // Everything is closed by now; never linger on a stray handle.
    setTimeout(() => process.exit(code), 1000).unref()
  }, (error) => {
    process.stderr.write(`createos-exec: ${oneLine(error)}\n`)
    process.exitCode = 1
  })
}

module.exports = { main, parseArgs }
