// Type test of the seam between emulator/index.js and its generated binding.
import * as native from "../emulator/binding.js";

async function emulator(): Promise<void> {
  const emu: native.Emulator = await native.startEmulator({ port: 0, apiKey: "k", rateLimitPerMinute: null, journalBytes: 1024 });
  const url: string = emu.url;
  const key: string = emu.apiKey;
  const reqs = emu.requests();
  const route: string = reqs[0]!.route;
  emu.addFault({ action: { kind: "delay", ms: 1 } });
  const out = emu.processOutput("sb", "p");
  const pids: number[] = emu.livePids();
  await emu.close();
  void url; void key; void route; void out; void pids;
}
void emulator;
