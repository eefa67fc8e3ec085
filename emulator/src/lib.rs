//! The emulator, for JS: `startEmulator(options)` → an `Emulator` handle.

use napi::bindgen_prelude::*;
use napi_derive::napi;
use serde_json::Value;

use createos_emulator::{self as emulator, EmulatorOptions, FaultRule};

#[napi]
pub struct Emulator {
    inner: emulator::Emulator,
}

/// One HTTP request as the emulator saw it.
#[napi(object, use_nullable = true)]
pub struct EmulatorRequest {
    pub method: String,
    /// Path only, without the query.
    pub path: String,
    /// Raw query string without `?` (empty when none).
    pub query: String,
    /// Route name, e.g. `createProcess`, `connect`, `deleteProcess`.
    pub route: String,
    /// Status sent; 0 when none was (a dropped connection, or a body that never arrived).
    pub status: u32,
    /// Arrival time of the head, ms since the emulator started. The log is in the order of
    /// `receivedMs`.
    pub at_ms: f64,
    /// When the whole request (head and body) had arrived; `null` when its body never
    /// arrived in full (the client abandoned it, e.g. a start gate held back and then
    /// dropped): such a request was not handled, and its status is 0.
    pub received_ms: Option<f64>,
    /// Time until the response head was produced (streams: not their whole duration).
    pub duration_ms: f64,
    /// `"HTTP/1.1"` or `"HTTP/2.0"`.
    pub http_version: String,
    /// The TCP connection it came on: 1 for the first accepted, then 2, ...
    pub connection: f64,
    /// A creation applied late (fault `applyLate`): when it was applied, ms since the emulator
    /// started; `null` for every other request and while it is still pending.
    pub applied_ms: Option<f64>,
}

impl From<emulator::RequestRecord> for EmulatorRequest {
    fn from(r: emulator::RequestRecord) -> Self {
        EmulatorRequest {
            method: r.method,
            path: r.path,
            query: r.query,
            route: r.route.to_owned(),
            status: u32::from(r.status),
            at_ms: r.at_ms,
            received_ms: r.received_ms,
            duration_ms: r.duration_ms,
            http_version: r.http_version.to_owned(),
            #[allow(clippy::cast_precision_loss)] // connection counts stay far below 2^53
            connection: r.connection as f64,
            applied_ms: r.applied_ms,
        }
    }
}

/// Every byte a process wrote (recorded apart from the journal).
#[napi(object)]
pub struct ProcessOutput {
    pub stdout: Buffer,
    pub stderr: Buffer,
}

/// Starts the local CreateOS emulator on 127.0.0.1.
#[napi(
    ts_args_type = "options?: { port?: number; apiKey?: string; rateLimitPerMinute?: number | null; rateLimit?: { limit: number; windowMs: number } | null; journalBytes?: number; retainedBytes?: number | null; tls?: boolean; http2?: boolean; rttMs?: number; holdHeaders?: boolean; heartbeatMs?: number; tracking?: 'auto' | 'cgroup-v2' | 'cgroup-v1' | 'marker'; pidsMax?: number | null; profile?: 'full' | 'documented' | null; terminationScope?: 'group' | 'tree' | null; virtualProcesses?: boolean } | undefined | null"
)]
pub async fn start_emulator(options: Option<Value>) -> Result<Emulator> {
    let opts: EmulatorOptions = match options {
        Some(Value::Null) | None => EmulatorOptions::default(),
        Some(v) => {
            serde_json::from_value(v).map_err(|e| Error::from_reason(format!("Invalid emulator options: {e}")))?
        }
    };
    let inner =
        emulator::start(opts).await.map_err(|e| Error::from_reason(format!("The emulator could not start: {e}")))?;
    Ok(Emulator { inner })
}

#[napi]
impl Emulator {
    /// `http://127.0.0.1:PORT`, or `https://127.0.0.1:PORT` with `tls`.
    #[napi(getter)]
    pub fn url(&self) -> String {
        self.inner.url()
    }

    /// PEM of the CA that issued the server certificate (with `tls`), else null.
    #[napi(getter)]
    pub fn ca_pem(&self) -> Option<String> {
        self.inner.ca_pem()
    }

    /// TCP connections accepted so far.
    #[napi]
    pub fn connections(&self) -> u32 {
        u32::try_from(self.inner.connections()).unwrap_or(u32::MAX)
    }

    /// How it finds a command's processes: `cgroup-v2` or `cgroup-v1` (a cgroup per tree, which
    /// no process of the tree can leave) or `marker` (an environment marker, which a process
    /// that clears its environment and calls `setsid` escapes).
    #[napi(getter, ts_return_type = "'cgroup-v2' | 'cgroup-v1' | 'marker'")]
    pub fn tracking(&self) -> String {
        self.inner.tracking().as_str().to_owned()
    }

    /// Whether each command sees its sandbox's workspace on `/workspace` (a private mount
    /// namespace per tree, where the emulator runs as root).
    #[napi(getter)]
    pub fn workspace_mounted(&self) -> bool {
        self.inner.workspace_mounted()
    }

    /// Whether each tree with a cgroup sees its leaf as the root of every cgroup hierarchy.
    #[napi(getter)]
    pub fn cgroup_view(&self) -> bool {
        self.inner.cgroup_view()
    }

    /// The profile it serves: `full` or `documented` (the documented minimum of the API).
    #[napi(getter, ts_return_type = "'full' | 'documented'")]
    pub fn profile(&self) -> String {
        self.inner.profile().as_str().to_owned()
    }

    /// Whom the DELETE of a process signals: `group` (the leader's process group only: the
    /// `documented` profile's default) or `tree` (every process of the tree: the `full`
    /// profile's). `tree_exited` counts every descendant either way.
    #[napi(getter, ts_return_type = "'group' | 'tree'")]
    pub fn termination_scope(&self) -> String {
        self.inner.termination_scope().as_str().to_owned()
    }

    /// The emulator's own throwaway key.
    #[napi(getter)]
    pub fn api_key(&self) -> String {
        self.inner.api_key()
    }

    /// Every request so far, in arrival order.
    #[napi]
    pub fn requests(&self) -> Vec<EmulatorRequest> {
        self.inner.requests().into_iter().map(EmulatorRequest::from).collect()
    }

    #[napi]
    pub fn clear_requests(&self) {
        self.inner.clear_requests();
    }

    /// Adds a fault rule (`{ route?, method?, skip?, times?, action: { kind, ... } }`).
    #[napi(ts_args_type = "rule: object")]
    pub fn add_fault(&self, rule: Value) -> Result<()> {
        let rule: FaultRule =
            serde_json::from_value(rule).map_err(|e| Error::from_reason(format!("Invalid fault rule: {e}")))?;
        self.inner.add_fault(rule);
        Ok(())
    }

    #[napi]
    pub fn clear_faults(&self) {
        self.inner.clear_faults();
    }

    /// Creates a sandbox without a request; returns its id.
    #[napi]
    pub fn create_sandbox(&self) -> String {
        self.inner.create_sandbox_now()
    }

    /// Every byte a process wrote (recorded apart from the journal); null for an unknown
    /// sandbox or process. Throws once the output was dropped to stay within `retainedBytes`.
    #[napi]
    pub fn process_output(&self, sandbox_id: String, process_id: String) -> Result<Option<ProcessOutput>> {
        self.inner
            .process_output(&sandbox_id, &process_id)
            .map(|out| out.map(|(o, e)| ProcessOutput { stdout: o.into(), stderr: e.into() }))
            .map_err(|e| Error::from_reason(e.to_string()))
    }

    /// Pids still alive that this emulator started (any depth).
    #[napi]
    pub fn live_pids(&self) -> Vec<i32> {
        self.inner.live_pids()
    }

    /// Pids still alive of managed processes (`POST /processes`, any depth): `livePids` less
    /// the processes of `/exec` commands.
    #[napi]
    pub fn live_process_pids(&self) -> Vec<i32> {
        self.inner.live_process_pids()
    }

    /// How many virtual processes (`virtualProcesses`) still run.
    #[napi]
    pub fn live_virtual(&self) -> u32 {
        u32::try_from(self.inner.live_virtual()).unwrap_or(u32::MAX)
    }

    /// Stops serving, kills every tree it started, removes its files.
    #[napi]
    pub async fn close(&self) -> Result<()> {
        self.inner.close().await;
        Ok(())
    }
}
