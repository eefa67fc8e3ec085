// createos-execute-emulator: the local CreateOS (Linux only; it isolates nothing).
// Hand-written over the generated binding.d.ts; __test__/binding.check.ts checks the two agree.

export interface EmulatorOptions {
  /** 0 or absent: a free port on 127.0.0.1. */
  port?: number
  /** Absent: a random key. */
  apiKey?: string
  /** Requests per minute per key; `null` turns the limit off. Default 300. */
  rateLimitPerMinute?: number | null
  /** Output journal per process, in bytes. Default 1 MiB. */
  journalBytes?: number
}

export interface EmulatorRequest {
  method: string
  path: string
  query: string
  /** Route pattern, e.g. `DELETE /v1/sandboxes/:id/processes/:pid`. */
  route: string
  status: number
  atMs: number
  durationMs: number
}

export declare class Emulator {
  private constructor()
  readonly url: string
  readonly apiKey: string
  requests(): EmulatorRequest[]
  clearRequests(): void
  /** Adds a fault rule (see README, "Emulator faults"). */
  addFault(rule: Record<string, unknown>): void
  clearFaults(): void
  /** Creates a running sandbox and returns its id. */
  createSandbox(): string
  processOutput(sandboxId: string, processId: string): { stdout: Buffer; stderr: Buffer } | null
  /** Pids of every process the emulator started that is still alive. */
  livePids(): number[]
  /** Ends every process it started and stops listening. */
  close(): Promise<void>
}

export declare function startEmulator(options?: EmulatorOptions): Promise<Emulator>
