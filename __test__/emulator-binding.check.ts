// Type test of the seam between emulator/index.js and its generated binding.
import * as native from "../emulator/binding.js";
import * as pkgTypes from "createos-execute-emulator";

async function emulator(): Promise<void> {
  const emu: native.Emulator = await native.startEmulator({ port: 0, apiKey: "k", rateLimitPerMinute: null, journalBytes: 1024, retainedBytes: null });
  const bounded: pkgTypes.Emulator = await pkgTypes.startEmulator({ journalBytes: 1024, retainedBytes: 1 << 20 });
  void bounded;
  const url: string = emu.url;
  const key: string = emu.apiKey;
  const reqs = emu.requests();
  const route: string = reqs[0]!.route;
  emu.addFault({ action: { kind: "delay", ms: 1 } });
  const out = emu.processOutput("sb", "p");
  const pids: number[] = emu.livePids();
  await emu.close();
  void url; void key; void route; void out; void pids;
  // The network options and observations, through the binding and the package.
  const net: native.Emulator = await native.startEmulator({ tls: true, http2: false, rttMs: 20, holdHeaders: true, heartbeatMs: 1000 });
  const ca: string | null = net.caPem;
  const conns: number = net.connections();
  const version: string = net.requests()[0]!.httpVersion;
  const conn: number = net.requests()[0]!.connection;
  const pkg: pkgTypes.Emulator = await pkgTypes.startEmulator({ tls: true, http2: false, rttMs: 20, holdHeaders: true, heartbeatMs: 1000 });
  const pkgCa: string | null = pkg.caPem;
  const pkgConns: number = pkg.connections();
  const pkgReq: pkgTypes.EmulatorRequest = pkg.requests()[0]!;
  const pkgVersion: string = pkgReq.httpVersion;
  const pkgConn: number = pkgReq.connection;
  void ca; void conns; void version; void conn; void pkgCa; void pkgConns; void pkgVersion; void pkgConn;
  // The termination scope, through the binding and the package.
  const grouped: native.Emulator = await native.startEmulator({ profile: "full", terminationScope: "group" });
  const scope: "group" | "tree" = grouped.terminationScope;
  const pkgGrouped: pkgTypes.Emulator = await pkgTypes.startEmulator({ profile: "documented", terminationScope: null });
  const pkgScope: pkgTypes.EmulatorTerminationScope = pkgGrouped.terminationScope;
  void scope; void pkgScope;
}
void emulator;

// The hand-written types and the generated ones agree field for field: a field added, removed,
// renamed or retyped on either side stops this compiling.
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
const requestShape: Equal<native.EmulatorRequest, pkgTypes.EmulatorRequest> = true;
const outputShape: Equal<native.ProcessOutput, NonNullable<ReturnType<pkgTypes.Emulator["processOutput"]>>> = true;
const scopeShape: Equal<native.Emulator["terminationScope"], pkgTypes.Emulator["terminationScope"]> = true;
void requestShape; void outputShape; void scopeShape;
