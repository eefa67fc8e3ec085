#!/usr/bin/env node
'use strict'

// createos-emulator [--port N] [--api-key K] [--rate-limit N|off] [--journal-bytes N]
//                   [--retained-bytes N|off] [--tls] [--no-http2] [--rtt-ms N]
//                   [--hold-headers] [--heartbeat-ms N] [--tracking MODE] [--pids-max N|off]
//                   [--profile full|documented] [--termination group|tree]
//
// Runs the local CreateOS emulator until SIGINT/SIGTERM, with one sandbox made at start
// (its id printed as CREATEOS_SANDBOX_ID). It runs real processes on this machine and
// isolates nothing: for tests, demos and development only.

const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { startEmulator } = require('..')  // createos-execute-emulator

const USAGE = `usage: createos-emulator [--port N] [--api-key K] [--rate-limit N|off] [--journal-bytes N]
                         [--retained-bytes N|off] [--tls] [--no-http2] [--rtt-ms N]
                         [--hold-headers] [--heartbeat-ms N] [--tracking MODE] [--pids-max N|off]
                         [--profile full|documented] [--termination group|tree]

  --port N           TCP port on 127.0.0.1 (default: a free one)
  --api-key K        the key clients must send (default: a random one, printed)
  --rate-limit N     requests per minute per key (default 300); 'off' disables it
  --journal-bytes N  output journal per process (default 1048576)
  --retained-bytes N output kept for exited processes, all together (default 268435456);
                     beyond it the oldest exits lose theirs; 'off' disables the bound
  --tls              serve HTTPS (ALPN h2 and http/1.1) from a CA made at start; the CA is
                     written to a temp file, printed as CREATEOS_CA_FILE=..., removed on exit
  --no-http2         offer HTTP/1.1 only
  --rtt-ms N         emulated round-trip time: bytes delayed N/2 ms each way, connections N ms
  --hold-headers     connect stream headers go out only with the first frame (as Node http)
  --heartbeat-ms N   heartbeat interval of connect and exec streams (default 5000)
  --tracking MODE    how a command's processes are found: auto (default: a cgroup per
                     tree where the machine allows it, else an environment marker),
                     cgroup-v2, cgroup-v1 or marker
  --pids-max N       processes one tree may hold at once, where cgroups apply (default 512);
                     'off' disables the bound
  --profile P        full (default: everything the emulator has) or documented (only what
                     the API documents: an unpaged process list without pagination, exit
                     frames without newest_seq/tree_exited, a DELETE that signals the
                     leader's process group only)
  --termination S    whom the DELETE of a process signals: group (the leader's process
                     group only; the documented profile's default) or tree (every process
                     of the tree; the full profile's default)

Prints the URL, the key and the id of a sandbox it made at start (more: POST /v1/sandboxes).

Runs real processes on this machine and isolates nothing: not for untrusted code.`

function parseArgs(argv) {
  const opts = {}
  for (let i = 0; i < argv.length; i++) {
    let arg = argv[i]
    let inline
    if (/^--[a-z-]+=/.test(arg)) {
      inline = arg.slice(arg.indexOf('=') + 1)
      arg = arg.slice(0, arg.indexOf('='))
    }
    const take = () => {
      if (inline !== undefined) return inline
      if (i + 1 >= argv.length) throw new Error(`${arg} needs a value`)
      return argv[++i]
    }
    const int = (raw, name) => {
      if (!/^\d+$/.test(raw)) throw new Error(`${name} needs a non-negative integer`)
      return Number(raw)
    }
    switch (arg) {
      case '-h':
      case '--help':
        opts.help = true
        break
      case '--port': {
        const port = int(take(), '--port')
        if (port > 65535) throw new Error('--port must be at most 65535')
        opts.port = port
        break
      }
      case '--api-key':
        opts.apiKey = take()
        if (!opts.apiKey || /[\r\n\0]/.test(opts.apiKey)) throw new Error('--api-key needs a non-empty value')
        break
      case '--rate-limit': {
        const raw = take()
        opts.rateLimitPerMinute = raw === 'off' ? null : int(raw, '--rate-limit')
        if (opts.rateLimitPerMinute === 0) opts.rateLimitPerMinute = null
        break
      }
      case '--journal-bytes':
        opts.journalBytes = int(take(), '--journal-bytes')
        break
      case '--retained-bytes': {
        const raw = take()
        opts.retainedBytes = raw === 'off' ? null : int(raw, '--retained-bytes')
        if (opts.retainedBytes === 0) opts.retainedBytes = null
        break
      }
      case '--tls':
        opts.tls = true
        break
      case '--no-http2':
        opts.http2 = false
        break
      case '--rtt-ms':
        opts.rttMs = int(take(), '--rtt-ms')
        break
      case '--hold-headers':
        opts.holdHeaders = true
        break
      case '--heartbeat-ms':
        opts.heartbeatMs = int(take(), '--heartbeat-ms')
        if (opts.heartbeatMs === 0) throw new Error('--heartbeat-ms must be at least 1')
        break
      case '--tracking': {
        const mode = take()
        if (!['auto', 'cgroup-v2', 'cgroup-v1', 'marker'].includes(mode)) {
          throw new Error('--tracking must be auto, cgroup-v2, cgroup-v1 or marker')
        }
        opts.tracking = mode
        break
      }
      case '--pids-max': {
        const raw = take()
        opts.pidsMax = raw === 'off' ? null : int(raw, '--pids-max')
        if (opts.pidsMax === 0) throw new Error('--pids-max must be at least 1')
        break
      }
      case '--profile': {
        const profile = take()
        if (!['full', 'documented'].includes(profile)) throw new Error('--profile must be full or documented')
        opts.profile = profile
        break
      }
      case '--termination': {
        const scope = take()
        if (!['group', 'tree'].includes(scope)) throw new Error('--termination must be group or tree')
        opts.terminationScope = scope
        break
      }
      default:
        throw new Error(`unknown argument ${arg}`)
    }
  }
  return opts
}

async function main(argv) {
  let opts
  try {
    opts = parseArgs(argv)
  } catch (error) {
    process.stderr.write(`createos-emulator: ${error.message}\n${USAGE}\n`)
    return 2
  }
  if (opts.help) {
    process.stdout.write(`${USAGE}\n`)
    return 0
  }
  delete opts.help
  const emulator = await startEmulator(opts)
  let caDir
  try {
    let caLine = ''
    if (emulator.caPem !== null) {
      // The CA exists only for this run: a private temp dir, removed on exit.
      caDir = fs.mkdtempSync(path.join(os.tmpdir(), 'createos-emulator-ca-'))
      const caFile = path.join(caDir, 'ca.pem')
      fs.writeFileSync(caFile, emulator.caPem, { mode: 0o644 })
      caLine = `CREATEOS_CA_FILE=${caFile}\n`
    }
    // The handlers are in place before the first line is printed: a caller
    // that signals as soon as it reads the line must not meet the default
    // action (death by the signal, the processes left behind).
    const stopped = new Promise((resolve) => {
      process.once('SIGINT', resolve)
      process.once('SIGTERM', resolve)
    })
    // The server runs on the native runtime, which does not keep Node's event
    // loop alive by itself: hold it open until a signal arrives.
    const keepAlive = setInterval(() => {}, 1 << 30)
    // A sandbox ready to use, so a first command needs no request of its own.
    const sandboxId = emulator.createSandbox()
    // The key is the emulator's own throwaway key, printed so a client can use it.
    process.stdout.write(
      `CreateOS emulator listening on ${emulator.url} (process tracking: ${emulator.tracking})\n` +
      `CREATEOS_API_URL=${emulator.url}\n` +
      `CREATEOS_API_KEY=${emulator.apiKey}\n` +
      `CREATEOS_SANDBOX_ID=${sandboxId}\n` +
      caLine +
      'It runs real processes on this machine and isolates nothing. Stop it with Ctrl-C.\n')
    await stopped
    clearInterval(keepAlive)
  } finally {
    await emulator.close()
    if (caDir !== undefined) fs.rmSync(caDir, { recursive: true, force: true })
  }
  process.stdout.write('CreateOS emulator stopped; every process it started has ended.\n')
  return 0
}

if (require.main === module) {
  main(process.argv.slice(2)).then((code) => {
    process.exitCode = code
    setTimeout(() => process.exit(code), 1000).unref()
  }, (error) => {
    process.stderr.write(`createos-emulator: ${error && error.message ? error.message : String(error)}\n`)
    process.exitCode = 1
  })
}

module.exports = { main, parseArgs }
