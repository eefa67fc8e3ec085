// Type test: `npm run test:types` (tsc --noEmit). It imports the package the way
// the CreateOS provider plugin does after its one-line change, and uses it with
// the plugin's own parameter, result and client types. Nothing here runs.
import { execute, shellQuote, CreateosCleanupError } from "createos-execute";
import {
  executeStream,
  followProcess,
  waitForRequest,
  destroySandbox,
  isCreateosCleanupError,
  CreateosApiError,
  type ExecuteResult,
  type CreateosClientLike,
  type RequestDiagnosticsMessage,
  type CleanupDiagnosticsMessage,
  processEvents,
} from "createos-execute";
import diagnostics from "node:diagnostics_channel";
import { startEmulator } from "createos-execute-emulator";

// --- the host's shapes: the plugin SDK's own types (pinned devDependency) ----
import type {
  PluginDefinition,
  PluginEnvironmentExecuteParams,
  PluginEnvironmentExecuteResult,
  PluginEnvironmentTerminationReceipt,
} from "@paperclipai/plugin-sdk" with { "resolution-mode": "import" };

interface CreateosConfig {
  apiUrl: string;
  apiKey: string | null;
  shape: string;
  rootfs: string | null;
  rootfsByAdapter: Record<string, string>;
  egressAllowlist: string[];
  region: string | null;
  timeoutMs: number;
  reuseLease: boolean;
  autoPauseAfterSeconds: number;
}
function configFrom(raw: Record<string, unknown>): CreateosConfig {
  return raw as unknown as CreateosConfig;
}
class CreateosClient {
  readonly apiKey: string;
  constructor(readonly config: CreateosConfig) {
    this.apiKey = config.apiKey ?? "";
  }
}

// --- what the plugin does --------------------------------------------------
async function runInLease(
  client: CreateosClient,
  params: PluginEnvironmentExecuteParams,
  signal: AbortSignal,
  onLog: (stream: "stdout" | "stderr", chunk: string) => Promise<void>,
): Promise<PluginEnvironmentExecuteResult> {
  try {
    return await execute(client, params, signal, (stream, text) => { void onLog(stream, text); });
  } catch (error) {
    if (error instanceof CreateosCleanupError) {
      const receipt = await destroySandbox(client, params.lease.providerLeaseId ?? "");
      const state: "destroyed" = receipt.state;
      const lease: string = receipt.providerLeaseId;
      void state; void lease;
    }
    throw error;
  }
}

// The plugin's `onEnvironmentExecute` handler, typed by the SDK's own
// PluginDefinition: the host's params object goes to `execute` unchanged (its
// extra fields — driverKey, companyId, issueId, timeoutMs, bypassSession, … —
// are accepted and ignored); the handler makes the signal from `timeoutMs`.
const handlers: Pick<PluginDefinition, "onEnvironmentExecute" | "onEnvironmentDestroyLease"> = {
  async onEnvironmentExecute(params: PluginEnvironmentExecuteParams): Promise<PluginEnvironmentExecuteResult> {
    const client = new CreateosClient(configFrom(params.config));
    const signal = AbortSignal.timeout(params.timeoutMs ?? client.config.timeoutMs);
    const result = await execute(client, params, signal);
    const sdkResult: PluginEnvironmentExecuteResult = result;
    return sdkResult;
  },
  async onEnvironmentDestroyLease(params): Promise<PluginEnvironmentTerminationReceipt | void> {
    if (params.providerLeaseId === null) return;
    await destroySandbox(new CreateosClient(configFrom(params.config)), params.providerLeaseId);
    return { providerLeaseId: params.providerLeaseId, state: "destroyed" };
  },
};

// The SDK's params with every optional field set, as a literal.
const fullParams: PluginEnvironmentExecuteParams = {
  driverKey: "createos",
  companyId: "c",
  environmentId: "e",
  issueId: null,
  config: {},
  lease: { providerLeaseId: "sb", metadata: {}, expiresAt: null },
  command: "echo",
  args: ["hi"],
  cwd: "/workspace",
  env: { A: "1" },
  stdin: "input",
  timeoutMs: 1000,
  bypassSession: true,
};
function sdkParams(plain: CreateosClientLike) {
  void execute(plain, fullParams);
  // The fields the SDK adds are accepted in a literal passed directly, too.
  void execute(plain, { lease: { providerLeaseId: "sb" }, command: "x", timeoutMs: 5, bypassSession: false, issueId: "i" });
}
// The plugin's file-sync call shape.
function syncCall(plain: CreateosClientLike, syncParams: PluginEnvironmentExecuteParams, signal: AbortSignal, script: string, cwd: string) {
  return execute(plain, { ...syncParams, command: "/bin/bash", args: ["-c", script], cwd },
    AbortSignal.any([signal, AbortSignal.timeout(1000)]));
}

const quoted: string = shellQuote("it's");
const plain = { config: { apiUrl: "http://127.0.0.1:1", timeoutMs: 5000 }, apiKey: "k" };

async function more(signal: AbortSignal): Promise<void> {
  const r: ExecuteResult = await executeStream(plain, { lease: { providerLeaseId: "sb" }, command: "true" });
  const exitCode: number | null = r.exitCode;
  const truncated: boolean = r.metadata.outputTruncated;
  const processId: string | null = r.metadata.processId;
  const s2 = await executeStream(plain, { lease: { providerLeaseId: "sb" }, command: "true" });
  const none: null = s2.metadata.processId;
  void none;
  const exit = await followProcess(plain, "sb", "p", signal, (stream, bytes) => {
    const s: "stdout" | "stderr" | "pty" = stream;
    const b: Buffer = bytes;
    void s; void b;
  }, () => {});
  const code: number | null = exit.exitCode;
  await waitForRequest("https://api.sb.createos.sh", signal);
  await execute({ config: { apiUrl: "http://127.0.0.1:1", pacing: "off", leftoverProcesses: "terminate" } },
    { lease: { providerLeaseId: "sb" }, command: "echo", args: ["hi"], env: { A: "1" }, stdin: null });
  await execute({ config: { apiUrl: "http://127.0.0.1:1", pacing: { limit: 20, windowMs: 2000, store: "redis://127.0.0.1:6379/0", key: "nat-1" } } },
    { lease: { providerLeaseId: "sb" }, command: "true" });
  await execute({ config: { apiUrl: "http://127.0.0.1:1", pacing: { intervalMs: 300, store: false } } },
    { lease: { providerLeaseId: "sb" }, command: "true" });
  await execute({ config: { apiUrl: "http://127.0.0.1:1", pacing: { limit: 20, windowMs: 2000, store: "redis://:pw@redis:6379/0", allowPlaintextPassword: true } } },
    { lease: { providerLeaseId: "sb" }, command: "true" });
  // @ts-expect-error the store is a URL string or false
  await execute({ config: { apiUrl: "http://127.0.0.1:1", pacing: { limit: 1, store: true } } }, { lease: { providerLeaseId: "sb" }, command: "true" });
  const emu = await startEmulator({ rateLimitPerMinute: null, rateLimit: { limit: 20, windowMs: 2000 } });
  const url: string = emu.url;
  const live: number[] = emu.livePids();
  await emu.close();
  void exitCode; void truncated; void processId; void code; void url; void live;
}

function classify(error: unknown): string {
  if (isCreateosCleanupError(error)) {
    const reason: "creation-unconfirmed" | "termination-unconfirmed" | undefined = error.reason;
    return `${error.message} ${reason ?? ""} ${error.attempts.length}`;
  }
  if (error instanceof CreateosApiError) {
    const status: number = error.status;
    return String(status);
  }
  return "other";
}

// @ts-expect-error: the command is required
void execute(plain, { lease: { providerLeaseId: "sb" } });
// @ts-expect-error: env values are strings
void execute(plain, { lease: { providerLeaseId: "sb" }, command: "x", env: { A: 1 } });
// @ts-expect-error: env is a plain object, not a Map (its entries would not be read)
void execute(plain, { lease: { providerLeaseId: "sb" }, command: "x", env: new Map([["A", "1"]]) });
// @ts-expect-error: allowPlaintextPassword is a boolean
void execute({ config: { apiUrl: "http://127.0.0.1:1", pacing: { allowPlaintextPassword: "yes" } } }, { lease: { providerLeaseId: "sb" }, command: "x" });

diagnostics.subscribe("createos-execute:request", (m) => {
  const r = m as RequestDiagnosticsMessage;
  const n: number | null = r.status;
  void n;
});
diagnostics.subscribe("createos-execute:cleanup", (m) => {
  const c = m as CleanupDiagnosticsMessage;
  const at: number = c.atMs;
  void at;
});
async function frames(response: Response): Promise<number> {
  let n = 0;
  for await (const frame of processEvents(response)) {
    const t: unknown = frame.type;
    void t;
    n++;
  }
  return n;
}
void frames;
void runInLease; void handlers; void syncCall; void sdkParams; void quoted; void more; void classify;
new CreateosApiError(503, "process cleanup");
new CreateosCleanupError("x", { reason: "termination-unconfirmed", attempts: [] });

// --- network configuration and error codes -----------------------------------
import type { CreateosConfigLike, CreateosErrorCode } from "createos-execute";
const netConfig: CreateosConfigLike = {
  apiUrl: "https://api.sb.createos.sh",
  proxy: "http://user:pass@proxy.corp:3128",
  caCertPem: "-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n",
};
void netConfig;
const notStarted: CreateosErrorCode = "CREATEOS_NOT_STARTED";
const untrusted: CreateosErrorCode = "CREATEOS_TLS_UNTRUSTED";
void notStarted;
void untrusted;

// --- errors you can branch on ----------------------------------------------------------
import {
  isCreateosError,
  CreateosInputError,
  CreateosDestroyError,
  type CreateosError,
  type CleanupAttempt,
  type CleanupStep,
  type DestroyAttempt,
  type LogFn,
} from "createos-execute";

async function branch(client: CreateosClientLike, sandboxId: string): Promise<string> {
  try {
    await execute(client, { lease: { providerLeaseId: sandboxId }, command: "true" });
    return "ok";
  } catch (error) {
    if (!isCreateosError(error)) throw error;
    // `code` is the discriminant: each branch sees its class's fields, required or `| null`.
    switch (error.code) {
      case "CREATEOS_CLEANUP_UNCONFIRMED": {
        const reason: "creation-unconfirmed" | "termination-unconfirmed" = error.reason;
        const sb: string = error.sandboxId;
        const pid: string | null = error.processId;
        const steps: CleanupStep[] = error.attempts.map((a) => a.step);
        // @ts-expect-error processId is nullable, not a string
        const notNull: string = error.processId;
        void reason; void sb; void pid; void steps; void notNull;
        return "destroy";
      }
      case "CREATEOS_API_ERROR": {
        const status: number = error.status;
        return String(status);
      }
      case "CREATEOS_DESTROY_UNCONFIRMED": {
        const attempts: DestroyAttempt[] = error.attempts;
        return String(attempts.length);
      }
      case "CREATEOS_INVALID_INPUT": {
        const input: CreateosInputError = error;
        const t: TypeError = error;
        void input; void t;
        return "fix the call";
      }
      case "CREATEOS_CANCELLED":
      case "CREATEOS_NOT_STARTED":
      case "CREATEOS_TLS_UNTRUSTED":
      case "CREATEOS_PROXY_REFUSED":
      case "CREATEOS_PROXY_UNREACHABLE":
      case "CREATEOS_FETCH_UNMATCHED":
      case "CREATEOS_NATIVE_MISSING":
      case "CREATEOS_ERROR":
        return error.message;
      default: {
        // Every code is handled above.
        const never: never = error;
        return never;
      }
    }
  }
}
void branch;
const errorCode: CreateosError["code"] = "CREATEOS_PROXY_REFUSED";
void errorCode;
// @ts-expect-error not a code of this package
const badCode: CreateosError["code"] = "CREATEOS_OOPS";
void badCode;
const destroyError = new CreateosDestroyError("x", { sandboxId: "sb", attempts: [] });
const destroyCode: "CREATEOS_DESTROY_UNCONFIRMED" = destroyError.code;
void destroyCode;

// The attempts' steps and outcomes are unions of the words that occur.
const attempt: CleanupAttempt = { step: "delete", graceMs: 1000, outcome: "HTTP 404 after alive", atMs: 3 };
const found: CleanupAttempt = { step: "list", graceMs: null, outcome: "found 2", atMs: 4 };
const status503: CleanupAttempt = { step: "wait", graceMs: null, outcome: "HTTP 503", atMs: 5 };
// @ts-expect-error not an outcome the cleanup reports
const gone: CleanupAttempt = { step: "delete", graceMs: null, outcome: "gone", atMs: 1 };
// @ts-expect-error not a step the cleanup reports
const getStep: CleanupAttempt = { step: "get", graceMs: null, outcome: "HTTP 503", atMs: 1 };
const destroyed: DestroyAttempt = { step: "state", graceMs: null, outcome: "destroying", atMs: 1 };
void attempt; void found; void status503; void gone; void getStep; void destroyed;

// --- small traps ---------------------------------------------------------------------
// A log callback may return anything (process.stdout.write returns a boolean).
const writeLog: LogFn = (stream, text) => (stream === "stdout" ? process.stdout : process.stderr).write(text);
void execute(plain, { lease: { providerLeaseId: "sb" }, command: "x" }, undefined, (_s, t) => process.stdout.write(t));
void writeLog;
// A host's own config fields are allowed in an object literal, known fields stay checked.
void execute({ config: { apiUrl: "https://api.sb.createos.sh", shape: "small", region: null, timeoutMs: 5000 } },
  { lease: { providerLeaseId: "sb" }, command: "x" });
// @ts-expect-error timeoutMs is a number
void execute({ config: { apiUrl: "https://api.sb.createos.sh", shape: "small", timeoutMs: "5s" } }, { lease: { providerLeaseId: "sb" }, command: "x" });
// @ts-expect-error apiUrl is required
void destroySandbox({ config: { shape: "small" } }, "sb");

// The emulator's fault rules are typed.
async function faults(): Promise<void> {
  const emu = await startEmulator();
  emu.addFault({ route: "deleteProcess", times: 1, action: { kind: "status", status: 503 } });
  emu.addFault({ route: "connect", action: { kind: "dropAfterFrames", frames: 3 } });
  emu.addFault({ action: { kind: "delay", ms: 5 } });
  // @ts-expect-error not a route of the emulator
  emu.addFault({ route: "deleteProces", action: { kind: "treeExitedFalse" } });
  // @ts-expect-error not a fault kind
  emu.addFault({ route: "connect", action: { kind: "dropFrames", frames: 3 } });
  // @ts-expect-error a status fault needs its status
  emu.addFault({ route: "connect", action: { kind: "status" } });
  await emu.close();
}
void faults;

// The README's diagnostics example, as written there.
import type { CleanupDiagnosticsMessage as CleanupMessage, RequestDiagnosticsMessage as RequestMessage } from "createos-execute";
diagnostics.subscribe("createos-execute:request", (message) => {
  const m = message as RequestMessage;
  console.error(`${m.operation} ${m.method} → ${m.status ?? m.outcome} (attempt ${m.attempt}, ${m.durationMs} ms, paced ${m.pacingWaitMs} ms)`);
});
diagnostics.subscribe("createos-execute:cleanup", (message) => {
  const m = message as CleanupMessage;
  console.error(`cleanup ${m.step}${m.graceMs !== null ? ` grace ${m.graceMs} ms` : ""}: ${m.outcome} at ${m.atMs} ms`);
});
