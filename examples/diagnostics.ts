import diagnostics from "node:diagnostics_channel";
import type { CleanupDiagnosticsMessage, RequestDiagnosticsMessage } from "createos-execute";

diagnostics.subscribe("createos-execute:request", (message) => {
  const m = message as RequestDiagnosticsMessage;
  console.error(`${m.operation} ${m.method} → ${m.status ?? m.outcome} (attempt ${m.attempt}, ${m.durationMs} ms)`);
});
diagnostics.subscribe("createos-execute:cleanup", (message) => {
  const m = message as CleanupDiagnosticsMessage;
  console.error(`cleanup ${m.step}: ${m.outcome} at ${m.atMs} ms`);
});
