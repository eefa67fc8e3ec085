import { execute, destroySandbox, isCreateosError } from "createos-execute";
import { startEmulator } from "createos-execute-emulator";

const emu = await startEmulator(); // a local CreateOS; in production: your API URL and key
const client = { config: { apiUrl: emu.url, timeoutMs: 30_000 }, apiKey: emu.apiKey };
const sandboxId = emu.createSandbox();
try {
  const result = await execute(
    client,
    { lease: { providerLeaseId: sandboxId }, command: "bash", args: ["-c", "echo hello; sleep 30"] },
    AbortSignal.timeout(2_000), // the only timeout (params.timeoutMs is ignored)
    (stream, text) => (stream === "stdout" ? process.stdout : process.stderr).write(text),
  );
  console.log(`exit ${result.exitCode}, timed out: ${result.timedOut}`);
} catch (error) {
  if (!isCreateosError(error)) throw error;
  console.error(`${error.code}: ${error.message}`);
  if (error.code === "CREATEOS_CLEANUP_UNCONFIRMED") {
    // A process may still be alive: destroy the sandbox, never reuse it.
    await destroySandbox(client, error.sandboxId);
  } // any other error: every process the command started is proven gone
  process.exitCode = 1;
} finally {
  await emu.close();
}
