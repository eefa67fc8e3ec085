// createos-execute-emulator: the local CreateOS (Linux only; it isolates nothing).
// Hand-written over the generated binding.d.ts; __test__/binding.check.ts checks the two agree.

export interface EmulatorOptions {
  /** 0 or absent: a free port on 127.0.0.1. */
  port?: number
  /** Absent: a random key. */
  apiKey?: string
  /** Requests per minute per key; `null` turns the limit off. Default 300. */
  rateLimitPerMinute?: number | null
  /**
   * `limit` requests per sliding `windowMs` per key (replaces `rateLimitPerMinute` when given).
   * A request over it gets 429 with `Retry-After` (whole seconds, at least 1) and does not count;
   * every request, 429s included, is in `requests()`.
   */
  rateLimit?: { limit: number; windowMs: number } | null
  /** Output journal per process, in bytes. Default 1 MiB. */
  journalBytes?: number
  /**
   * Budget, in bytes, for the output kept for EXITED processes across sandboxes (journal plus
   * the `processOutput` capture). Beyond it the processes that exited first lose their output:
   * a replay answers `output_offset_expired`, `processOutput` throws. Running processes never
   * count. Default 256 MiB; `null` or 0: unbounded.
   */
  retainedBytes?: number | null
  /**
   * Serve HTTPS from a CA and leaf generated at start (see `caPem`). The leaf is valid for
   * `localhost`, `createos.test` and `127.0.0.1`; `url` becomes `https://127.0.0.1:PORT`.
   * Default false.
   */
  tls?: boolean
  /**
   * Offer HTTP/2: ALPN `h2` next to `http/1.1` with `tls`, h2 "prior knowledge" without.
   * `false`: HTTP/1.1 only. Default true.
   */
  http2?: boolean
  /**
   * Emulated round-trip time, ms: every byte is delayed by half of it in each direction, and
   * a new connection waits one more round trip before it is served (its TCP handshake).
   * Default 0; at most 60000.
   */
  rttMs?: number
  /**
   * The `connect` stream's response headers go out only with its first frame (data,
   * heartbeat, error or exit), as a Node `http` server sends them. Default false.
   */
  holdHeaders?: boolean
  /** Heartbeat interval of `connect` and streaming `exec` streams, ms (1 to 86400000). Default 5000. */
  heartbeatMs?: number
  /**
   * How a command's processes are found. `auto` (default): a cgroup per tree where the
   * machine allows it (cgroup v2, else the v1 `pids` and `freezer` hierarchies), else the
   * environment marker. `cgroup-v2` / `cgroup-v1`: that layout, or `startEmulator` rejects.
   */
  tracking?: 'auto' | 'cgroup-v2' | 'cgroup-v1' | 'marker'
  /**
   * `pids.max` of each tree's cgroup: a fork beyond it fails (`EAGAIN`). Default 512; `null`:
   * no bound. Applies where the layout has a `pids` controller.
   */
  pidsMax?: number | null
  /**
   * How much beyond the documented API it serves. `full` (default, also for `null`): a paged
   * process list with `pagination.total`, exit frames with `tree_exited` and `newest_seq`, and
   * the other extras listed in docs/emulator.md ("Profiles"). `documented`: only what the API
   * notes document: the process list is `data.processes[]`, whole and unpaged whatever
   * `limit`/`offset` say, without `pagination`; exit frames carry `exit_code` (and `signal`
   * when signalled), nothing else; a process DELETE signals the leader's process group only
   * (`terminationScope: 'group'`, unless asked otherwise). The test helpers default it from
   * `CREATEOS_EMULATOR_PROFILE`.
   */
  profile?: 'full' | 'documented' | null
  /**
   * Whom the DELETE of a process (`?grace_ms=`) signals: SIGTERM, the grace, then SIGKILL
   * `group`: to the leader's process group only (`killpg`), the least the API's "terminates the
   * whole process tree" may mean; a descendant that left the group (`setsid`, a double fork)
   * is not signalled. `tree`: to every process of the tree, wherever it went. Either way
   * `tree_exited` (the DELETE's answer, exit frames, `wait?scope=tree`, the record) counts every
   * descendant, so one the DELETE did not reach keeps it `false`. Absent or `null`: the
   * profile's (`documented`: `group`; `full`: `tree`). A sandbox DELETE and `close()` end
   * every process either way.
   */
  terminationScope?: 'group' | 'tree' | null
  /**
   * Play `createos-virtual` commands without starting a program (default false): given as
   * `cmd`, or as the command a `createos-execute` script `exec`s. Its arguments are steps:
   * `out:TEXT`, `err:TEXT`, `sleep:MS`, `exit:N`. The record, the output stream, `wait`, a
   * DELETE and signals behave as for a process that obeys every signal at once; its pid is
   * above any real one and nothing is ever signalled by it. For tests and benchmarks that hold
   * thousands of commands in flight (see docs/emulator.md, "Virtual processes").
   */
  virtualProcesses?: boolean
}

/** Whom the DELETE of a process signals (see `EmulatorOptions.terminationScope`). */
export type EmulatorTerminationScope = 'group' | 'tree'

/** How an emulator finds the processes of a tree (see `Emulator.tracking`). */
export type EmulatorTracking = 'cgroup-v2' | 'cgroup-v1' | 'marker'

export interface EmulatorRequest {
  method: string
  path: string
  query: string
  /** Route name, e.g. `createProcess`, `connect`, `deleteProcess` (`unknown` for any other path). */
  route: string
  /** Status sent; 0 when none was (a dropped connection, or a body that never arrived in full). */
  status: number
  /** When the request's head arrived, ms since the emulator started. */
  atMs: number
  /**
   * When the whole request (head and body) had arrived. The log is in this order: a request
   * whose body is held back (the start gate's upload) is listed once its body arrived.
   * `null`: the body never arrived in full (the client abandoned the upload); not handled.
   */
  receivedMs: number | null
  durationMs: number
  /** The HTTP version the request arrived with: `"HTTP/1.1"` or `"HTTP/2.0"`. */
  httpVersion: string
  /** The TCP connection it came on: 1 for the first connection accepted, then 2, ... */
  connection: number
  /**
   * A creation applied late (fault `applyLate`): when it was applied, ms since the emulator
   * started (also when the client had left by then). `null` for every other request, and
   * while the creation is still pending.
   */
  appliedMs: number | null
}

/** The emulator's route names, as `EmulatorRequest.route` and `FaultRule.route` spell them. */
export type EmulatorRoute =
  | 'whoami'
  | 'createSandbox'
  | 'getSandbox'
  | 'deleteSandbox'
  | 'putFile'
  | 'getFile'
  | 'exec'
  | 'execStream'
  | 'createProcess'
  | 'listProcesses'
  | 'getProcess'
  | 'deleteProcess'
  | 'connect'
  | 'input'
  | 'stdinClose'
  | 'signal'
  | 'wait'
  /** A request no route matched. */
  | 'unknown'

/** What a matching fault rule does (see docs/emulator.md, "Faults"). */
export type FaultAction =
  /** Answer `status`; with `afterHandler` the real handler ran first. A 429/503 carries `Retry-After: 1`, or `retryAfter` verbatim. */
  | { kind: 'status'; status: number; afterHandler?: boolean; retryAfter?: string }
  /** Close the connection without an answer (over HTTP/2: every stream of that connection). */
  | { kind: 'dropConnection'; afterHandler?: boolean }
  | { kind: 'delay'; ms: number }
  /** Answer 307 with this `Location`. */
  | { kind: 'redirect'; location: string }
  // `connect` streams
  | { kind: 'dropAfterFrames'; frames: number }
  | { kind: 'duplicateFrames' }
  | { kind: 'gapAfterFrames'; frames: number }
  | { kind: 'malformedLine'; afterFrames: number }
  | { kind: 'invalidBase64' }
  | { kind: 'badSeq' }
  | { kind: 'errorFrame'; error: string }
  | { kind: 'oversizeFrame' }
  | { kind: 'heartbeatsOnly'; ms: number }
  | { kind: 'fastStream'; mib: number; frameBytes: number }
  /** `connect` and `execStream`: SSE comments, `event:`/`id:`/`retry:` lines and `data:` prefixes. */
  | { kind: 'sseNoise' }
  // `deleteProcess`
  | { kind: 'treeExitedFalse' }
  | { kind: 'treeExitsAfter'; ms: number }
  | { kind: 'killOnly' }
  // `listProcesses`
  /** At most `limit` per page; `noTotal`: no `total`, the asked limit echoed (a silent cap). */
  | { kind: 'pageSize'; limit: number; noTotal?: boolean }
  /** `offset` ignored: every page is the first one again. */
  | { kind: 'ignoreOffset' }
  // `createProcess`
  /**
   * The creation is not applied on arrival: the connection is cut at once without an answer
   * (with `hold`: the answer is held), and the creation is applied later even if the client
   * left: with `afterList`, right after the next process-list answer of that sandbox was sent;
   * with `ms`, that many ms after it arrived (both: whichever comes first; neither: at once
   * after the cut). With `hold`, the real answer (201) is sent at apply time if the client is
   * still connected. The request's record gets `appliedMs`.
   */
  | { kind: 'applyLate'; afterList?: boolean; ms?: number; hold?: boolean }

/** A fault rule: the first `skip` matches pass, then `times` matches (default: all) get the action. */
export interface FaultRule {
  /** Absent: every route the action applies to. */
  route?: EmulatorRoute
  /** HTTP method, case-insensitive. Absent: any. */
  method?: string
  skip?: number
  times?: number
  /**
   * Match only requests naming a process whose exit frame a `connect` stream already sent
   * (e.g. the record `GET` or the `wait` after a finished stream); earlier requests pass
   * without counting towards `skip`/`times`.
   */
  afterExitFrame?: boolean
  action: FaultAction
}

export declare class Emulator {
  private constructor()
  /** `http://127.0.0.1:PORT`, or `https://127.0.0.1:PORT` with `tls`. */
  readonly url: string
  readonly apiKey: string
  /** PEM of the CA that issued the server certificate with `tls`; `null` on plain HTTP. */
  readonly caPem: string | null
  /**
   * `cgroup-v2` or `cgroup-v1`: each tree lives in a cgroup of its own, which none of its
   * processes can leave (`tree_exited` is the cgroup being empty; a DELETE freezes it, signals
   * every member, thaws). `marker`: processes are found by an environment marker, which a
   * process that clears its environment and leaves the process group escapes.
   */
  readonly tracking: EmulatorTracking
  /**
   * Every command sees its sandbox's workspace mounted on `/workspace` (a private mount
   * namespace per tree, where the emulator runs as root), so `cwd: '/workspace'` and paths
   * under it work as on the real API. `false`: `/workspace` is mapped only in the files API
   * and a process's `cwd` field (see docs/emulator.md, "Paths").
   */
  readonly workspaceMounted: boolean
  /**
   * Every tree with a cgroup sees its leaf as the root of each cgroup hierarchy (a cgroup
   * namespace and bind mounts), so writing its pid to any `cgroup.procs` it can see keeps it
   * in its leaf. Either way a process that leaves its leaf is moved back and killed with it.
   */
  readonly cgroupView: boolean
  /** The profile it serves (see `EmulatorOptions.profile`). */
  readonly profile: 'full' | 'documented'
  /** Whom the DELETE of a process signals (`EmulatorOptions.terminationScope`, or the profile's). */
  readonly terminationScope: EmulatorTerminationScope
  /** TCP connections accepted so far (including ones whose TLS handshake failed). */
  connections(): number
  requests(): EmulatorRequest[]
  clearRequests(): void
  /** Adds a fault rule (see docs/emulator.md, "Faults"). */
  addFault(rule: FaultRule): void
  clearFaults(): void
  /** Creates a running sandbox and returns its id. */
  createSandbox(): string
  /**
   * Every byte the process wrote (each stream capped at 64 MiB); `null` for an unknown sandbox
   * or process. Throws "output of process X is no longer retained (retainedBytes)" once its
   * output was dropped to stay within `retainedBytes`.
   */
  processOutput(sandboxId: string, processId: string): { stdout: Buffer; stderr: Buffer } | null
  /** Pids of every process the emulator started that is still alive. */
  livePids(): number[]
  /**
   * Pids of the managed processes (`POST /processes`, any depth) that are still alive:
   * `livePids()` less the processes of `/exec` commands.
   */
  liveProcessPids(): number[]
  /** How many virtual processes (`virtualProcesses`) still run. */
  liveVirtual(): number
  /** Ends every process it started and stops listening. */
  close(): Promise<void>
}

export declare function startEmulator(options?: EmulatorOptions): Promise<Emulator>
