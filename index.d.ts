/// <reference types="node" />
// Hand-written public types of `createos-execute`. The generated `binding.d.ts`
// describes the native layer underneath; hosts import only from here.

/**
 * How requests to one API origin are paced (one budget shared by the whole process):
 * `'window'` = at most 300 request starts in any 60 s; `'spacing'` = starts at least
 * 300 ms apart (the TypeScript module's rule); `'off'`; or the same with other numbers.
 */
export type CreateosPacing =
  | 'window'
  | 'spacing'
  | 'off'
  | ({ limit?: number; windowMs?: number } & CreateosPacingShared)
  | ({ intervalMs: number } & CreateosPacingShared)

/** Where the budget lives, and under which key. */
export interface CreateosPacingShared {
  /**
   * `redis://…` or `rediss://…` (TLS with the HTTP client's trust: bundled web roots, `NODE_EXTRA_CA_CERTS`,
   * and the system store with `NODE_USE_SYSTEM_CA=1`): one budget
   * shared by every process and host using this store, decided atomically in Redis on the
   * server's clock. `false`: this process only, even when `CREATEOS_PACING_STORE` is set.
   * Default: `CREATEOS_PACING_STORE`, else this process only. While the store does not answer
   * (250 ms per decision), requests fall back to this process's own budget with the same rule;
   * `process.emitWarning` says so once per outage (code `CREATEOS_PACING_STORE_DOWN`) and once
   * when it answers again (`CREATEOS_PACING_STORE_RESTORED`). The URL never appears in an error
   * or a warning. A password goes only over TLS to a host that is not loopback: a `redis://` URL
   * with a password to such a host is refused (use `rediss://`), unless
   * `allowPlaintextPassword` is set.
   */
  store?: string | false
  /**
   * Allows a `redis://` store URL (from `store` or `CREATEOS_PACING_STORE`) that carries a
   * password to a host that is not loopback: the password then crosses the network in clear.
   * Only for a private network you trust (e.g. a compose service `redis`). Default `false`.
   */
  allowPlaintextPassword?: boolean
  /**
   * The budget key (1–200 printable ASCII characters, no spaces or braces). Default: the API
   * origin. Give the same key to clients that share one IP budget across origins or keys; it
   * must not contain the API key.
   */
  key?: string
}

/**
 * `client.config` as this package reads it. A host's own fields are allowed and ignored (the
 * functions taking a client are generic over the config type, so an object literal may carry
 * them too); a key within two edits of a field below (`pacnig`, `timeout`) is reported once
 * with `process.emitWarning` (code `CREATEOS_CONFIG_UNKNOWN_FIELD`).
 */
export interface CreateosConfigLike {
  /** `https://…` origin (optionally ending in `/v1`); plain `http` only on loopback. */
  apiUrl: string
  /** Used when the client has no `apiKey` of its own; else `CREATEOS_API_KEY`. */
  apiKey?: string | null
  /** Per-request deadline, in ms. Default 300000. */
  timeoutMs?: number
  /** Request pacing per budget key (the API origin by default). Default `'window'` (300 starts in any 60 s), in this process or in `CREATEOS_PACING_STORE`. */
  pacing?: CreateosPacing
  /** Grace periods of successive DELETE attempts during cleanup, in ms (1 to 16 entries, each 0–600000); the last one repeats until the deadline. Default `[1000, 5000]`. */
  cleanupGraceMs?: number[]
  /** Long-poll budget of one `wait?scope=tree` confirmation during cleanup, in ms. Default 1000. */
  confirmPollMs?: number
  /**
   * Deadline for the whole cleanup (and for `destroySandbox`), in ms: the verdict — proven
   * gone, or `CreateosCleanupError` — comes within it. Default `min(timeoutMs, 30000)`.
   */
  cleanupDeadlineMs?: number
  /** Reproduce the TypeScript module's cleanup exactly (one DELETE, grace 1000 ms, no confirmation). */
  legacyCleanup?: boolean
  /** What to do with processes a command left running after it exited. Default `'keep'`. */
  leftoverProcesses?: 'keep' | 'terminate'
  /** Reconnect when the output stream carries nothing (not even a heartbeat) for this long, in ms. */
  streamIdleTimeoutMs?: number
  /**
   * A proxy for every request of this client: `http://` or `https://` (credentials allowed,
   * sent only to the proxy), used for loopback targets too and regardless of `NO_PROXY`.
   * HTTPS goes through it only as a `CONNECT` tunnel, so `apiUrl` must be `https://`.
   * Without it, proxies come from the environment only with `NODE_USE_ENV_PROXY=1` or Node's
   * `--use-env-proxy` (on the command line or in `NODE_OPTIONS`). A refusing proxy is
   * `CREATEOS_PROXY_REFUSED`, an unreachable one `CREATEOS_PROXY_UNREACHABLE`.
   */
  proxy?: string | null
  /**
   * Extra trusted CA certificates (PEM, one or more), on top of the bundled web roots, the
   * bundle named by `NODE_EXTRA_CA_CERTS` and, with `NODE_USE_SYSTEM_CA=1`, the system store.
   */
  caCertPem?: string | null
  /**
   * Which transport carries this client's requests. Unset: the native client, unless at the
   * time of the call `globalThis.fetch` is not Node's own (a stub, a wrapper, a tracer) or
   * the host installed its own undici global dispatcher (`setGlobalDispatcher`: a MockAgent, a
   * ProxyAgent, an Agent with client certificates); then the host's `fetch`, with the request
   * shapes of the TypeScript module, and one `CREATEOS_TRANSPORT_FETCH` warning per process.
   * `'native'` or `'fetch'` forces one. Through `fetch`, `proxy` and `caCertPem` are the host's
   * fetch's business and are not applied.
   */
  transport?: 'native' | 'fetch' | null
  /**
   * Session mode (off by default; see docs/session.md): each command is one `POST …/input` to
   * a long-lived supervisor per lease, its output and exit come back over the supervisor's one
   * stream. For trusted tooling: a normal exit rests on the supervisor's word
   * (`metadata.containment: 'supervisor'`); every other end is proven by the provider.
   * `true` = idle supervisors end after 30 s; `{ idleMs }` (1000–3600000) sets that time.
   * Needs the native transport (with `fetch` the default mode runs, and a warning with code
   * `CREATEOS_SESSION_NOT_APPLIED` says so once; likewise `legacyCleanup` and a command whose
   * script and stdin exceed 96 KiB). A supervisor end that nobody waits for (idle, retired,
   * `destroySandbox`, the host's exit) and that cannot be proven emits a warning with code
   * `CREATEOS_SESSION_UNPROVEN` and `sandboxId`, and every later call on that sandbox rejects
   * with `CreateosCleanupError` (nothing sent) until `destroySandbox` proves it destroyed.
   */
  session?: boolean | { idleMs?: number | null } | null
}

/** The host's `CreateosClient`, or a plain `{ config, apiKey }`. */
export interface CreateosClientLike<C extends CreateosConfigLike = CreateosConfigLike> {
  readonly config: C
  readonly apiKey?: string | null
}

export interface ExecuteParams {
  /** The sandbox: `lease.providerLeaseId` is its id. */
  lease: { providerLeaseId: string | null }
  command: string
  args?: string[]
  cwd?: string
  /**
   * Variables for the command: a plain object (an object literal, `Object.create(null)`, or one
   * from another realm); a `Map`, an array or a class instance is a `CreateosInputError`. Names
   * `^[A-Za-z_][A-Za-z0-9_]*$`, string values without NUL.
   */
  env?: Record<string, string>
  stdin?: string | null
  /**
   * **Ignored.** Accepted so the plugin SDK's params pass unchanged, but it does not time
   * anything out: the only timeout is the caller's `signal`. Pass
   * `AbortSignal.timeout(params.timeoutMs)` as the signal to get `timedOut: true`.
   */
  timeoutMs?: number
  /**
   * The SDK's per-command opt-out of the persistent session: with `true` this command runs in
   * the default mode (a managed process of its own) even when `config.session` is on; without
   * `config.session` it changes nothing (see docs/session.md).
   */
  bypassSession?: boolean | null
  /** Ignored (the SDK's driver params: `driverKey`, `companyId`, `environmentId`, `config` likewise). */
  issueId?: string | null
}

// A type alias (not an interface) so it is assignable to the host's `Record<string, unknown>`.
export type ExecuteMetadata = {
  /** The managed process (`execute`); `null` for `executeStream` or when none was created. */
  processId: string | null
  /** True when stdout or stderr kept only its last 4,194,304 characters. */
  outputTruncated: boolean
  /**
   * Whether the whole process tree is gone: `true` also after a timeout whose tree was
   * ended and proven gone, or after `leftoverProcesses: 'terminate'` ended a leftover; `false`
   * when the command left processes running; `null` when unknown (e.g. the exit frame arrived
   * but the process record that would say could not be read: the result still stands).
   */
  treeExited: boolean | null
  /**
   * Session mode only (absent otherwise): `'supervisor'` when the result rests on the
   * supervisor's report of a normal exit, `'provider'` when the supervisor's tree was ended
   * and proven gone by the provider (a timeout, a leftover with `'terminate'`).
   */
  containment?: 'supervisor' | 'provider'
}

export type ExecuteResult = {
  exitCode: number | null
  signal: string | null
  timedOut: boolean
  stdout: string
  stderr: string
  metadata: ExecuteMetadata
}

export type OutputStream = 'stdout' | 'stderr'
/** Receives output as it arrives. Its return value is ignored (a rejected promise is reported once). */
export type LogFn = (stream: OutputStream, text: string) => unknown

export interface ProcessExit {
  exitCode: number | null
  signal: string | null
}

/**
 * Runs `command` in the sandbox as a managed process and resolves when it exits, after the
 * whole process tree is proven gone whenever it had to be ended.
 *
 * Timeouts: `params.timeoutMs` is **ignored**; the only timeout is `signal`. A signal aborted
 * with a `TimeoutError` reason (`AbortSignal.timeout(ms)`) resolves `{ timedOut: true }` with
 * the output so far; any other abort rejects with `CreateOS command was cancelled.`
 * (`CREATEOS_CANCELLED`). Rejects with a `CreateosError`: `CreateosCleanupError` only when a
 * process may still be alive.
 */
export declare function execute<C extends CreateosConfigLike>(
  client: CreateosClientLike<C>,
  params: ExecuteParams,
  signal?: AbortSignal,
  log?: LogFn,
): Promise<ExecuteResult>

/** What `executeStream` resolves to: there is no process id and no tree state. */
export type ExecuteStreamResult = ExecuteResult & {
  metadata: ExecuteMetadata & { processId: null; treeExited: null }
}

/**
 * Runs `command` over `POST /exec?stream=true` — **the path without a containment proof**.
 * There is no process id, so nothing can be terminated or confirmed: an abort or an error
 * (including a dropped stream) only closes the connection, and whether the command is still
 * running is unknown. Neither a result nor an error of this function proves anything about
 * the sandbox's processes, and it never throws `CreateosCleanupError`. A host that needs to
 * know every process is gone uses `execute`.
 */
export declare function executeStream<C extends CreateosConfigLike>(
  client: CreateosClientLike<C>,
  params: ExecuteParams,
  signal?: AbortSignal,
  log?: LogFn,
): Promise<ExecuteStreamResult>

/** Follows the output of a process the host created, until it exits. */
export declare function followProcess<C extends CreateosConfigLike>(
  client: CreateosClientLike<C>,
  sandboxId: string,
  processId: string,
  signal: AbortSignal | undefined,
  onData: (stream: 'stdout' | 'stderr' | 'pty', bytes: Buffer) => void,
  onConnected?: () => void,
): Promise<ProcessExit>

/** One NDJSON frame of a CreateOS process stream (`type`, `seq`, `stream`, `data_base64`, …). */
export type ProcessFrame = Record<string, unknown>

/**
 * The NDJSON frames of a fetch `Response` body (e.g. a process `connect` stream), one JSON
 * object each. Blank lines are skipped. Rejects with `CreateOS process frame is too large.`
 * for a line over 1 MiB, `CreateOS returned an invalid process frame.` for bad JSON or a
 * non-object, `CreateOS returned an empty process stream.` for a body without frames.
 * Stopping early (break/return) cancels the body's reader.
 */
export declare function processEvents(response: Response): AsyncGenerator<ProcessFrame, void, undefined>

/** Single-quotes a value for bash. Throws on NUL. */
export declare function shellQuote(value: string): string

/** Waits for this process's request budget for the API origin of `apiUrl`. */
export declare function waitForRequest(apiUrl: string, signal?: AbortSignal): Promise<void>

/** The plugin SDK's `PluginEnvironmentTerminationReceipt`. */
export interface SandboxTerminationReceipt {
  providerLeaseId: string
  state: 'destroyed'
}

/**
 * Destroys a sandbox (lease) and resolves only once it is confirmed gone: `DELETE`, then its
 * state (`GET`) until `destroyed` or 404, within `cleanupDeadlineMs`. Otherwise rejects with
 * `CreateosDestroyError` (the sandbox may still exist).
 */
export declare function destroySandbox<C extends CreateosConfigLike>(
  client: CreateosClientLike<C>,
  sandboxId: string,
): Promise<SandboxTerminationReceipt>

/** The steps of `destroySandbox`: `destroy` (the DELETE), `state` (the GET), `backoff`. */
export type DestroyStep = 'destroy' | 'state' | 'backoff'

/** A sandbox state as `destroySandbox` reports it. */
export type SandboxStateWord =
  | 'creating' | 'running' | 'pausing' | 'paused' | 'resuming' | 'forking'
  | 'error' | 'destroying' | 'destroyed' | 'failed' | 'other state'

/** What one step of a cleanup, recovery or destruction saw, when it was an error answer. */
export type AttemptFailure =
  | `HTTP ${number}`
  | 'no response'
  | 'redirect refused'
  | 'no mock answered'
  | 'deadline passed'
  | 'invalid answer'
  | 'failed'

export interface DestroyAttempt {
  step: DestroyStep
  /** `null`: only process DELETEs have a grace period. */
  graceMs: number | null
  /** A sandbox state (`destroying`), `HTTP 404` (gone), or a failure (`HTTP 401`, `no response`, …). */
  outcome: SandboxStateWord | AttemptFailure
  /** Milliseconds since `destroySandbox` started. */
  atMs: number
}

/**
 * `destroySandbox` could not confirm the sandbox gone within its deadline: it may still
 * exist (and run processes).
 */
export declare class CreateosDestroyError extends Error {
  readonly code: 'CREATEOS_DESTROY_UNCONFIRMED'
  /** The sandbox (empty only when constructed by hand without one). */
  readonly sandboxId: string
  readonly attempts: DestroyAttempt[]
  /** The HTTP status of a final refusal that ended the attempts (401, 403…); `null` when the deadline did. */
  readonly status: number | null
  constructor(message?: string, options?: { sandboxId?: string; attempts?: DestroyAttempt[]; status?: number | null; cause?: unknown })
}

/** An HTTP error status: the command failed, and every process it started is proven gone. */
export declare class CreateosApiError extends Error {
  readonly code: 'CREATEOS_API_ERROR'
  readonly status: number
  constructor(status: number, operation?: string, options?: { message?: string; cause?: unknown })
}

export type CleanupReason = 'creation-unconfirmed' | 'termination-unconfirmed'

/**
 * The steps of a cleanup: `delete` (a process DELETE, with its grace), `wait` (a
 * `wait?scope=tree` confirmation), `list` (the search for a process behind a lost creation
 * answer), `cancel` (the cancel file that makes a creation applied late exit without running),
 * `backoff` (the pause between rounds), `internal` (a panic in native code), and `remove` (the
 * removal of staged files after the verdict: only on the `createos-execute:cleanup` channel).
 */
export type CleanupStep = 'delete' | 'wait' | 'list' | 'cancel' | 'backoff' | 'internal' | 'remove'

/**
 * What a cleanup step saw. `tree exited` proves the tree gone; `HTTP 404` does too unless the
 * tree was seen alive earlier in the call, which gives `HTTP 404 after alive` (no proof).
 */
export type CleanupOutcome =
  | 'tree exited'
  | 'tree_exited false'
  | 'still running'
  | 'HTTP 404'
  | 'HTTP 404 after alive'
  | 'invalid id'
  | 'inconsistent pages'
  | 'too many pages'
  | 'written'
  | 'removed'
  | 'failed'
  | 'panic'
  | `found ${number}`
  | AttemptFailure

export interface CleanupAttempt {
  step: CleanupStep
  /** `grace_ms` of a process DELETE; null for every other step. */
  graceMs: number | null
  /** Fixed words built from statuses only, e.g. `tree_exited false`, `HTTP 500`, `still running`. */
  outcome: CleanupOutcome
  /** Milliseconds since the cleanup started. */
  atMs: number
}

/**
 * A process may still be alive: destroy the sandbox (`destroySandbox(client, e.sandboxId)`)
 * before reusing it.
 */
export declare class CreateosCleanupError extends Error {
  readonly code: 'CREATEOS_CLEANUP_UNCONFIRMED'
  readonly reason: CleanupReason
  /** The sandbox to destroy (empty only when constructed by hand without one). */
  readonly sandboxId: string
  /** The process that could not be proven gone; `null` when none was found (a lost creation answer). */
  readonly processId: string | null
  readonly attempts: CleanupAttempt[]
  constructor(message?: string, options?: {
    reason?: CleanupReason
    sandboxId?: string
    processId?: string | null
    attempts?: CleanupAttempt[]
    cause?: unknown
  })
}

/**
 * A caller mistake, found before anything was sent: a missing or mistyped client, config
 * field, parameter, signal or callback, or a value a rule refuses (NUL, a bad environment
 * name, a malformed sandbox id). The message keeps the TypeScript module's text where it had
 * one, then names the field and states the limit, e.g.
 * `Invalid sandbox environment variable. (env key "MY-VAR")`,
 * `Sandbox command values cannot contain NUL. (args[1])`, `args[1] must be a string (got a Buffer).`
 * or `pacing.limit must be an integer between 1 and 1000000. (got 0)`.
 * A `TypeError`, so `instanceof TypeError` holds too.
 */
export declare class CreateosInputError extends TypeError {
  readonly code: 'CREATEOS_INVALID_INPUT'
  constructor(message?: string, options?: { cause?: unknown })
}

/** An `Error` with one of this package's codes and no fields of its own. */
export interface CreateosCodedError<C extends string> extends Error {
  readonly code: C
}

/**
 * `code` of the plain `Error`s this package throws:
 * - `CREATEOS_CANCELLED`: `CreateOS command was cancelled.` (an abort that is not a timeout);
 *   the tree was ended and proven gone.
 * - `CREATEOS_TLS_UNTRUSTED`: `CreateOS TLS certificate is not trusted.`; nothing was sent.
 * - `CREATEOS_NOT_STARTED`: `CreateOS command did not start; its start gate could not be
 *   opened.`; the gate provably never reached the server, the process was ended and proven
 *   gone, the sandbox can be reused.
 * - `CREATEOS_PROXY_REFUSED`: the proxy refused the connection (e.g. `HTTP 407`); nothing
 *   reached CreateOS.
 * - `CREATEOS_PROXY_UNREACHABLE`: the proxy could not be reached; nothing reached CreateOS.
 * - `CREATEOS_FETCH_UNMATCHED`: `CreateOS request was not sent: no mock of the host's fetch
 *   answered the <operation> request.`; the host's fetch is an interception library's
 *   (undici `MockAgent`, nock, msw with `onUnhandledRequest: 'error'`) and none of its mocks
 *   matched: nothing was sent. `cause` is the library's error (its first line, without the
 *   key or URL queries) followed by the method and URL that had no mock.
 * - `CREATEOS_NATIVE_MISSING`: thrown when the package is loaded without its platform package.
 * - `CREATEOS_ERROR`: protocol and connection failures (`CreateOS connection failed.`,
 *   `CreateOS process output has a sequence gap.`, …).
 */
export type CreateosPlainErrorCode =
  | 'CREATEOS_CANCELLED'
  | 'CREATEOS_TLS_UNTRUSTED'
  | 'CREATEOS_NOT_STARTED'
  | 'CREATEOS_PROXY_REFUSED'
  | 'CREATEOS_PROXY_UNREACHABLE'
  | 'CREATEOS_FETCH_UNMATCHED'
  | 'CREATEOS_NATIVE_MISSING'
  | 'CREATEOS_ERROR'

/**
 * Every error this package throws, discriminated by `code`. (`followProcess` and
 * `waitForRequest` reject with the signal's own `reason` on an abort, and `followProcess`
 * with whatever `onData` threw: those are the caller's values.)
 */
export type CreateosError =
  | CreateosApiError
  | CreateosCleanupError
  | CreateosDestroyError
  | CreateosInputError
  | { [C in CreateosPlainErrorCode]: CreateosCodedError<C> }[CreateosPlainErrorCode]

/** Every `code` a `CreateosError` can have. */
export type CreateosErrorCode = CreateosError['code']

/** True for an error of this package (of any loaded copy of it): narrows to `CreateosError`. */
export declare function isCreateosError(error: unknown): error is CreateosError

/**
 * A message on the `createos-execute:request` diagnostics channel: one per HTTP attempt.
 * Fixed words and numbers only (no URL, id, key, body or output).
 */
export interface RequestDiagnosticsMessage {
  /** The fixed operation label, e.g. `process creation`, `output connection`, `process cleanup`. */
  operation: string
  method: 'GET' | 'POST' | 'PUT' | 'DELETE' | 'HEAD' | 'PATCH' | 'OTHER'
  /** The HTTP status; `null` when no answer arrived. */
  status: number | null
  outcome: 'ok' | 'http error' | 'no response' | 'redirect refused' | 'no mock answered' | 'untrusted certificate' | 'proxy refused' | 'proxy unreachable' | 'aborted' | 'failed'
  /** 1 for the first try, 2 for the first retry, … */
  attempt: number
  /** From handing the request over to the answer's head (or the failure), in ms. */
  durationMs: number
  /** Time spent waiting for the origin's request budget (429 pauses included), in ms. */
  pacingWaitMs: number
}

/** A message on the `createos-execute:cleanup` diagnostics channel: one per cleanup step. */
export type CleanupDiagnosticsMessage = CleanupAttempt

/** True for a `CreateosCleanupError` from this or any other loaded copy of the package. */
export declare function isCreateosCleanupError(error: unknown): error is CreateosCleanupError
