// Type test of the seam between index.js and the generated binding: every
// native export index.js calls exists with the arity index.js uses. If the
// generated binding.d.ts changes shape, this stops compiling.
import * as native from "../binding.js";

const handle = new native.CancelHandle();
handle.cancel(true);
const client: object = { apiUrl: "http://127.0.0.1:1", apiKey: "k", timeoutMs: 1000 };
const params: object = { sandboxId: "sb", command: "true" };
const onLog = (stream: string, text: string): void => { void stream; void text; };

void native.executeNative(client, params, handle, onLog);
void native.executeNative(client, params, handle, undefined);
void native.executeStreamNative(client, params, handle, onLog);
void native.followProcessNative(client, "sb", "p", handle, (kind: string, data?: Buffer | null) => { void kind; void data; });
void native.waitForRequestNative(client, handle);
void native.destroySandboxNative(client, "sb");
native.setExecArgvEnvProxy(true);
native.setExecArgvEnvProxy(null);
const quoted: string = native.shellQuote("x");
void quoted;

// The hand-written public types and the generated ones agree field for field: a field added,
// removed, renamed or retyped on either side stops this compiling.
import type { ExecuteResult, ExecuteMetadata, ProcessExit, SandboxTerminationReceipt, CleanupAttempt, DestroyAttempt } from "createos-execute";
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
// index.js drops a null `containment` (it is session mode's): the public field is optional.
type Flat<T> = { [K in keyof T]: T[K] };
type PublicMetadata = Flat<Omit<native.NativeExecuteMetadata, "containment"> & { containment?: Exclude<native.NativeExecuteMetadata["containment"], null> }>;
type PublicResult = Flat<Omit<native.NativeExecuteResult, "metadata"> & { metadata: PublicMetadata }>;
const resultShape: Equal<PublicResult, ExecuteResult> = true;
const metadataShape: Equal<PublicMetadata, ExecuteMetadata> = true;
const exitShape: Equal<native.NativeProcessExit, ProcessExit> = true;
const receiptShape: Equal<native.NativeTerminationReceipt, SandboxTerminationReceipt> = true;
// The attempts narrow `step` and `outcome` to the words that occur (checked against the Rust
// source by __test__/errors.test.mjs): same fields, each assignable to the native one.
type Widened<T> = { [K in keyof T]: T[K] extends string ? string : T[K] };
const attemptShape: Equal<native.NativeAttempt, Widened<CleanupAttempt>> = true;
const destroyAttemptShape: Equal<native.NativeAttempt, Widened<DestroyAttempt>> = true;
void resultShape; void metadataShape; void exitShape; void receiptShape; void attemptShape; void destroyAttemptShape;
