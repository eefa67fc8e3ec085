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
} from "createos-execute";
import { startEmulator } from "createos-execute-emulator";

// --- the host's shapes (as the plugin SDK and the plugin declare them) -------
interface PluginEnvironmentLease {
  providerLeaseId: string | null;
  metadata?: Record<string, unknown>;
  expiresAt?: string | null;
}
interface PluginEnvironmentExecuteParams {
  driverKey: string;
  companyId: string;
  environmentId: string;
  config: Record<string, unknown>;
  lease: PluginEnvironmentLease;
  executionId: string;
  command: string;
  args?: string[];
  cwd?: string;
  env?: Record<string, string>;
  stdin?: string;
  timeoutMs?: number;
}
interface PluginEnvironmentExecuteResult {
  exitCode: number | null;
  signal?: string | null;
  timedOut: boolean;
  stdout: string;
  stderr: string;
  metadata?: Record<string, unknown>;
}
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

void runInLease; void quoted; void more; void classify;
new CreateosApiError(503, "process cleanup");
new CreateosCleanupError("x", { reason: "termination-unconfirmed", attempts: [] });

// --- issue 10: network configuration and error codes -------------------------
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
