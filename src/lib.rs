//! The napi glue: argument conversion and promise plumbing only, no logic.
//!
//! Every async entry point resolves with an outcome `{ ok, value?, error? }` and never rejects
//! for a domain error; `index.js` turns `error` into the right JS class. A Rust panic rejects
//! the promise (it never aborts the process); the core catches panics inside a call itself,
//! so a panic never skips a cleanup.
//!
//! Environment teardown (a worker's `terminate()`, or the main thread exiting): every call is
//! registered with its environment; the environment's cleanup hook cancels the calls still in
//! flight — so each runs its cleanup (the DELETE of its process tree) — and waits up to
//! [`TEARDOWN_WAIT`] for them to finish. Their callbacks are not called any more.

mod allocator;
mod trim;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use createos_execute_core::abort::Abort;
use createos_execute_core::config::{self, Config};
use createos_execute_core::error::Error;
use createos_execute_core::events::{Event, EventSink};
use createos_execute_core::execute::{self, ExecuteResult, FollowEvent};
use createos_execute_core::output::{self, LogLine, Text};
use createos_execute_core::script;
use createos_execute_core::transport::{
    BodyBroken, Bytes, HostBody, HostFetch, HostRequest, HostResponse, HostStream, SendError,
};

/// `log(stream, text)`: weak (does not keep Node alive), errors handled by the caller's wrapper.
/// The text goes as UTF-16 when it is not ASCII: converted here, on a worker thread, so the JS
/// thread only copies it (V8's own UTF-8 decoding of non-ASCII text is the slow part of `log`).
type JsText = Either<String, Utf16String>;

/// Text as JS gets it, for `log` chunks and the result's `stdout`/`stderr` (up to 4,194,304
/// characters each): UTF-16 unless it is ASCII, converted here, off the JS thread (V8's own
/// decoding of non-ASCII UTF-8 would run on it); UTF-16 decoded straight from the bytes
/// stays so.
fn js_text(text: Text) -> JsText {
    match text {
        Text::Utf8(s) if s.is_ascii() => Either::A(s),
        Text::Utf8(s) => Either::B(Utf16String::from(output::to_utf16(&s))),
        Text::Utf16(w) => Either::B(Utf16String::from(w)),
    }
}
type LogFn = ThreadsafeFunction<FnArgs<(String, JsText)>, (), FnArgs<(String, JsText)>, Status, false, true>;

/// `onEvent(kind, data)`: kind is `connected`, `stdout`, `stderr` or `pty`.
type EventFn =
    ThreadsafeFunction<FnArgs<(String, Option<Buffer>)>, (), FnArgs<(String, Option<Buffer>)>, Status, false, true>;

/// `onDiag(channel, event)`: channel is `request` or `cleanup` (index.js publishes on
/// `createos-execute:<channel>`). Passed only while someone subscribes.
type DiagFn = ThreadsafeFunction<FnArgs<(String, Value)>, (), FnArgs<(String, Value)>, Status, false, true>;
/// `transport(call)`: the host-`fetch` bridge of `lib/fetch-transport.js`, passed only when
/// a call's requests go through the host's `fetch`. Weak: an exchange in flight keeps Node
/// alive by its own handles (the host's sockets, the call's promise).
type FetchFn = ThreadsafeFunction<FetchCall, Promise<FetchReply>, FetchCall, Status, false, true>;

/// Events waiting for the JS thread; more are dropped (observability never slows a command).
const EVENT_QUEUE: usize = 1024;

/// How many decoded chunks may wait for the JS thread before the reader slows down.
const LOG_QUEUE: usize = 64;
/// Adjacent chunks of one stream are joined up to this size (UTF-16 bytes, or UTF-8 bytes
/// for ASCII) when JS is behind; a bigger read goes alone. It keeps each string under V8's
/// 128 KiB limit for objects of the young generation: a bigger string gets fresh pages of
/// its own (with 1 MiB batches, 33–47 thousand page faults per 64 MiB of random output, most
/// on the JS thread, against 6–10 thousand now), and then JS fell further behind and the
/// batches grew.
const LOG_BATCH_BYTES: usize = (128 << 10) - 64;

/// The caller's `AbortSignal`, as seen from Rust. `index.js` calls `cancel` from the signal's
/// abort listener (or before the call, when the signal is already aborted).
#[napi]
pub struct CancelHandle {
    abort: Abort,
}

#[napi]
impl CancelHandle {
    #[napi(constructor)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        CancelHandle { abort: Abort::new() }
    }

    /// Fires the abort: `timedOut` when the signal's reason is a `TimeoutError`.
    #[napi]
    pub fn cancel(&self, timed_out: bool) {
        self.abort.abort(timed_out);
    }
}

/// How long an environment's teardown waits for its in-flight calls to finish their cleanup.
pub const TEARDOWN_WAIT: Duration = Duration::from_secs(3);

/// One in-flight call: its abort (when it has one) and the "environment gone" signal that
/// stops its callbacks.
struct Call {
    abort: Option<Abort>,
    gone: Abort,
}

#[derive(Default)]
struct EnvCalls {
    next: u64,
    calls: HashMap<u64, Call>,
}

/// In-flight calls per environment (keyed by the `napi_env` address), and a condition
/// variable signalled whenever a call ends.
fn registry() -> &'static (Mutex<HashMap<usize, EnvCalls>>, Condvar) {
    static CALLS: OnceLock<(Mutex<HashMap<usize, EnvCalls>>, Condvar)> = OnceLock::new();
    CALLS.get_or_init(Default::default)
}

/// Removes a call from the registry when dropped (the call ended, or its task was dropped).
struct Registered {
    env: usize,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let (lock, ended) = registry();
        let mut g = lock.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = g.get_mut(&self.env) {
            e.calls.remove(&self.id);
        }
        ended.notify_all();
    }
}

/// Registers a call of `env` (and, on the environment's first call, its cleanup hook).
fn register(env: &Env, abort: Option<Abort>, gone: Abort) -> Registered {
    let key = env.raw() as usize;
    let (lock, _) = registry();
    let mut g = lock.lock().unwrap_or_else(PoisonError::into_inner);
    let first = !g.contains_key(&key);
    let e = g.entry(key).or_default();
    let id = e.next;
    e.next += 1;
    e.calls.insert(id, Call { abort, gone });
    drop(g);
    if first {
        // Registered after napi-rs's own hook, so it runs before it (hooks run in reverse
        // order): the runtime is still there while the cleanups run.
        let _ = env.add_env_cleanup_hook(key, teardown);
    }
    Registered { env: key, id }
}

/// The environment is going away: cancel its calls (each runs its cleanup) and wait, at most
/// [`TEARDOWN_WAIT`], until they have finished.
fn teardown(key: usize) {
    end_calls(key);
    createos_execute_core::session::end_all_blocking(TEARDOWN_WAIT);
    registry().0.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
}

/// Cancels the in-flight calls of environment `key` and waits, at most [`TEARDOWN_WAIT`], until
/// they have finished.
fn end_calls(key: usize) {
    let (lock, ended) = registry();
    let mut g = lock.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(e) = g.get(&key) {
        for call in e.calls.values() {
            call.gone.abort(false);
            if let Some(a) = &call.abort {
                a.abort(false);
            }
        }
    }
    let deadline = Instant::now() + TEARDOWN_WAIT;
    while g.get(&key).is_some_and(|e| !e.calls.is_empty()) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        g = ended.wait_timeout(g, left).unwrap_or_else(PoisonError::into_inner).0;
    }
}

/// Ends this environment's in-flight calls (each is cancelled and runs its cleanup) and waits
/// for them, at most 3 s. `index.js` calls it from `process.on('exit')`: `process.exit()` does
/// not run the environment's cleanup hooks.
#[napi]
pub fn end_in_flight_calls(env: &Env) {
    end_calls(env.raw() as usize);
    createos_execute_core::session::end_all_blocking(TEARDOWN_WAIT);
}

// ---------------------------------------------------------------------------
// What a call resolves with: typed, so binding.d.ts says what index.js receives.

/// One step of a cleanup, recovery or sandbox destruction: fixed words and numbers only.
#[napi(object, use_nullable = true)]
pub struct NativeAttempt {
    /// `delete`, `wait`, `list`, `get`, `internal`, ...
    pub step: String,
    /// `grace_ms` of a DELETE of a process; null for every other step.
    pub grace_ms: Option<f64>,
    /// Built from statuses and booleans only: `tree exited`, `HTTP 503`, `no response`, ...
    pub outcome: String,
    /// Time since the cleanup began.
    pub at_ms: f64,
}

/// A native error as data: `index.js` turns it into the JS class that `kind` names.
#[napi(object, use_nullable = true)]
pub struct NativeError {
    #[napi(ts_type = "'api' | 'cleanup' | 'destroy' | 'cancelled' | 'aborted' | 'input' | 'error'")]
    pub kind: String,
    /// Fixed text: never a URL, a body or the key.
    pub message: String,
    /// `kind: 'error'` with a code of its own (`CREATEOS_TLS_UNTRUSTED`, `CREATEOS_NOT_STARTED`, ...).
    pub code: Option<String>,
    /// `kind: 'api'`: the HTTP status; `kind: 'destroy'`: the status of a final refusal (401…).
    pub status: Option<u32>,
    /// `kind: 'cleanup'`.
    #[napi(ts_type = "'creation-unconfirmed' | 'termination-unconfirmed' | null")]
    pub reason: Option<String>,
    /// `kind: 'cleanup'` and `'destroy'`.
    pub sandbox_id: Option<String>,
    /// `kind: 'cleanup'`: the process, when one is known.
    pub process_id: Option<String>,
    /// `kind: 'cleanup'` and `'destroy'`: every step, in order.
    pub attempts: Option<Vec<NativeAttempt>>,
    /// `kind: 'aborted'`: the abort was a timeout.
    pub timed_out: Option<bool>,
}

/// A state change the core saw (e.g. the shared pacing store went down); emitted once by
/// `index.js` with `process.emitWarning`.
#[napi(object)]
pub struct NativeWarning {
    pub code: String,
    pub message: String,
    /// The sandbox it is about, when it is about one (a session supervisor whose end could
    /// not be proven: destroy that sandbox).
    pub sandbox_id: Option<String>,
}

/// `metadata` of an execute result.
#[napi(object, use_nullable = true)]
pub struct NativeExecuteMetadata {
    pub process_id: Option<String>,
    pub output_truncated: bool,
    pub tree_exited: Option<bool>,
    /// Session mode only (index.js drops it otherwise): whose word the result rests on.
    #[napi(ts_type = "'supervisor' | 'provider'")]
    pub containment: Option<String>,
}

/// The value of a completed (or timed-out) command.
#[napi(object, use_nullable = true)]
pub struct NativeExecuteResult {
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub timed_out: bool,
    #[napi(ts_type = "string")]
    pub stdout: JsText,
    #[napi(ts_type = "string")]
    pub stderr: JsText,
    pub metadata: NativeExecuteMetadata,
}

/// How a followed process ended.
#[napi(object, use_nullable = true)]
pub struct NativeProcessExit {
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
}

/// The plugin SDK's `PluginEnvironmentTerminationReceipt`.
#[napi(object)]
pub struct NativeTerminationReceipt {
    pub provider_lease_id: String,
    #[napi(ts_type = "'destroyed'")]
    pub state: String,
}

fn attempts(list: &[createos_execute_core::error::Attempt]) -> Vec<NativeAttempt> {
    #[allow(clippy::cast_precision_loss)] // grace periods are milliseconds, far below 2^53
    list.iter()
        .map(|a| NativeAttempt {
            step: a.step.to_owned(),
            grace_ms: a.grace_ms.map(|g| g as f64),
            outcome: a.outcome.clone(),
            at_ms: a.at_ms,
        })
        .collect()
}

/// The one place a Rust error becomes data for JS.
fn native_error(e: &Error) -> NativeError {
    let mut out = NativeError {
        kind: "error".to_owned(),
        message: e.to_string(),
        code: None,
        status: None,
        reason: None,
        sandbox_id: None,
        process_id: None,
        attempts: None,
        timed_out: None,
    };
    match e {
        Error::Api { status, .. } => {
            out.kind = "api".to_owned();
            out.status = Some(u32::from(*status));
        }
        Error::Cleanup(r) => {
            out.kind = "cleanup".to_owned();
            out.reason = Some(r.reason.as_str().to_owned());
            out.sandbox_id = Some(r.sandbox_id.clone());
            out.process_id.clone_from(&r.process_id);
            out.attempts = Some(attempts(&r.attempts));
        }
        Error::DestroyUnconfirmed(r) => {
            out.kind = "destroy".to_owned();
            out.status = r.status.map(u32::from);
            out.sandbox_id = Some(r.sandbox_id.clone());
            out.attempts = Some(attempts(&r.attempts));
        }
        Error::Cancelled => out.kind = "cancelled".to_owned(),
        Error::TimedOut => {
            out.kind = "aborted".to_owned();
            out.timed_out = Some(true);
        }
        Error::Input(_) => out.kind = "input".to_owned(),
        _ => out.code = e.code().map(str::to_owned),
    }
    out
}

/// State changes the core saw since the last call settled; each is delivered once.
fn take_warnings() -> Option<Vec<NativeWarning>> {
    let warnings = createos_execute_core::warnings::take_warnings();
    (!warnings.is_empty()).then(|| {
        warnings
            .into_iter()
            .map(|w| NativeWarning {
                code: w.code.to_owned(),
                message: w.message.into_owned(),
                sandbox_id: w.sandbox_id,
            })
            .collect()
    })
}

/// `notify()`: warnings are queued (`takeWarnings` drains them). Weak: it never keeps Node
/// alive.
type NotifyFn = ThreadsafeFunction<(), (), (), Status, false, true>;

/// Registers the function told whenever the core queues a warning (the last registration
/// wins; one whose environment went away is dropped, and warnings then wait for the next call
/// that settles).
#[napi(ts_args_type = "notify: () => void")]
pub fn set_warning_listener(notify: NotifyFn) {
    createos_execute_core::warnings::set_warning_listener(Some(Box::new(move || {
        notify.call((), ThreadsafeFunctionCallMode::NonBlocking) == Status::Ok
    })));
}

/// Registers the function that publishes the events of work no call owns (a session
/// supervisor's stream and its end) on `diagnostics_channel`, as `onDiag` does for a call's
/// (the last registration wins). Weak, and called without waiting: it never keeps Node alive
/// or slows the work.
#[napi(ts_args_type = "onDiag: (channel: string, event: object) => void")]
pub fn set_diagnostics_listener(on_diag: DiagFn) {
    let sink: EventSink = std::sync::Arc::new(move |ev| {
        let _ = on_diag.call(FnArgs::from(event_json(ev)), ThreadsafeFunctionCallMode::NonBlocking);
    });
    createos_execute_core::events::set_background_sink(Some(sink));
}

/// The warnings queued since they were last taken (each is delivered once).
#[napi]
pub fn take_warnings_now() -> Option<Vec<NativeWarning>> {
    take_warnings()
}

/// `{ ok, value?, error?, warnings? }` for each kind of value; a call never rejects for a
/// domain error.
macro_rules! outcome_type {
    ($(#[$doc:meta])* $name:ident, $value:ty) => {
        $(#[$doc])*
        #[napi(object)]
        pub struct $name {
            pub ok: bool,
            pub value: Option<$value>,
            pub error: Option<NativeError>,
            pub warnings: Option<Vec<NativeWarning>>,
        }

        impl From<std::result::Result<$value, Error>> for $name {
            fn from(r: std::result::Result<$value, Error>) -> Self {
                let (ok, value, error) = match r {
                    Ok(v) => (true, Some(v), None),
                    Err(e) => (false, None, Some(native_error(&e))),
                };
                $name { ok, value, error, warnings: take_warnings() }
            }
        }
    };
}

outcome_type!(
    /// What `executeNative` and `executeStreamNative` resolve with.
    ExecuteOutcome,
    NativeExecuteResult
);
outcome_type!(
    /// What `followProcessNative` resolves with.
    FollowOutcome,
    NativeProcessExit
);
outcome_type!(
    /// What `destroySandboxNative` resolves with.
    DestroyOutcome,
    NativeTerminationReceipt
);

/// What `waitForRequestNative` resolves with (no value).
#[napi(object)]
pub struct WaitOutcome {
    pub ok: bool,
    pub error: Option<NativeError>,
    pub warnings: Option<Vec<NativeWarning>>,
}

impl From<std::result::Result<(), Error>> for WaitOutcome {
    fn from(r: std::result::Result<(), Error>) -> Self {
        WaitOutcome { ok: r.is_ok(), error: r.err().map(|e| native_error(&e)), warnings: take_warnings() }
    }
}

fn execute_value(r: ExecuteResult) -> NativeExecuteResult {
    NativeExecuteResult {
        exit_code: r.exit_code,
        signal: r.signal,
        timed_out: r.timed_out,
        stdout: js_text(r.stdout),
        stderr: js_text(r.stderr),
        metadata: NativeExecuteMetadata {
            process_id: r.process_id,
            output_truncated: r.output_truncated,
            tree_exited: r.tree_exited,
            containment: r.containment.map(str::to_owned),
        },
    }
}

/// Runs `fut` on napi's tokio runtime, registered with `env` (see the module doc); a panic
/// rejects the promise. `make` gets the "environment gone" signal.
fn spawn<'env, T, F>(env: &'env Env, abort: Option<Abort>, make: impl FnOnce(Abort) -> F) -> Result<PromiseRaw<'env, T>>
where
    T: ToNapiValue + Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    let gone = Abort::new();
    let registered = register(env, abort, gone.clone());
    // Boxed, so the task napi spawns stays small whatever the call (see docs/benchmarks.md §14).
    let fut = Box::pin(make(gone));
    env.spawn_future(async move {
        let _registered = registered;
        AssertUnwindSafe(fut)
            .catch_unwind()
            .await
            .map_err(|_| napi::Error::from_reason("createos-execute internal error: a panic in native code."))
    })
}

/// Delivers decoded output to `log`, in order, one call at a time (each awaited, so a slow
/// `log` slows the reader through the bounded queue). Ends when the capture is dropped; once
/// the environment is gone, output is drained without calling JS.
async fn forward_logs(mut rx: mpsc::Receiver<LogLine>, log: LogFn, gone: Abort) {
    let mut next = rx.recv().await;
    while let Some((stream, mut text)) = next.take() {
        if gone.is_aborted() {
            break;
        }
        // Join what is already queued for the same stream while JS is busy.
        loop {
            match rx.try_recv() {
                Ok((s, t)) if s == stream && text.size() + t.size() <= LOG_BATCH_BYTES => {
                    text.append(t);
                }
                Ok(other) => {
                    next = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        let text = js_text(text);
        tokio::select! {
            _ = log.call_async_catch(FnArgs::from((stream.as_str().to_owned(), text))) => {}
            () = gone.aborted() => break,
        }
        if next.is_none() {
            next = rx.recv().await;
        }
    }
    while rx.recv().await.is_some() {}
}

/// An event as JS sees it: fixed words and numbers only.
fn event_json(ev: Event<'_>) -> (String, Value) {
    match ev {
        Event::Request(r) => (
            "request".to_owned(),
            json!({
                "operation": r.operation,
                "method": r.method,
                "status": r.status,
                "outcome": r.outcome,
                "attempt": r.attempt,
                "durationMs": r.duration_ms,
                "pacingWaitMs": r.pacing_wait_ms,
            }),
        ),
        Event::Cleanup(a) => (
            "cleanup".to_owned(),
            json!({ "step": a.step, "graceMs": a.grace_ms, "outcome": a.outcome, "atMs": a.at_ms }),
        ),
    }
}

/// Delivers events to `onDiag` in order; after `finish`, what is queued, then ends. Once the
/// environment is gone it stops calling JS (the JS thread is then blocked in the teardown,
/// waiting for this very call to finish its cleanup) and only drains.
struct EventForwarder {
    done: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl EventForwarder {
    /// Every event of the call is delivered before its promise settles.
    async fn finish(self) {
        let _ = self.done.send(());
        let _ = self.task.await;
    }
}

fn event_sink(on_diag: Option<DiagFn>, gone: Abort) -> (Option<EventSink>, Option<EventForwarder>) {
    let Some(f) = on_diag else { return (None, None) };
    let (tx, mut rx) = mpsc::channel::<(String, Value)>(EVENT_QUEUE);
    let (done, mut done_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        // One event to JS, abandoned when the environment goes away meanwhile.
        let deliver = |ev: (String, Value)| {
            let call = f.call_async_catch(FnArgs::from(ev));
            let gone = gone.clone();
            async move {
                tokio::select! {
                    biased;
                    () = gone.aborted() => {}
                    _ = call => {}
                }
            }
        };
        loop {
            tokio::select! {
                biased;
                () = gone.aborted() => break,
                ev = rx.recv() => match ev {
                    Some(ev) => deliver(ev).await,
                    None => break,
                },
                _ = &mut done_rx => {
                    while let Ok(ev) = rx.try_recv() {
                        if gone.is_aborted() {
                            break;
                        }
                        deliver(ev).await;
                    }
                    break;
                }
            }
        }
        // Whatever else arrives is dropped with the receiver: the sink's `try_send` fails
        // and never waits.
    });
    let sink: EventSink = std::sync::Arc::new(move |ev| {
        let _ = tx.try_send(event_json(ev));
    });
    (Some(sink), Some(EventForwarder { done, task }))
}

// ---------------------------------------------------------------------------
// The host's `fetch` (see `crates/core/src/transport.rs`): each exchange is an id the bridge
// in `lib/fetch-transport.js` keeps with its AbortController and body reader.

/// One call into the bridge: `fetch` starts an exchange, `read` takes its next body chunk,
/// `cancel` aborts it (its AbortController; the body is cancelled).
#[napi(object)]
pub struct FetchCall {
    #[napi(ts_type = "'fetch' | 'read' | 'cancel'")]
    pub op: String,
    pub id: u32,
    pub method: Option<String>,
    pub url: Option<String>,
    /// Names and values in turn, in the order they are sent.
    pub headers: Option<Vec<String>>,
    #[napi(ts_type = "string | Buffer | null")]
    pub body: Option<Either<String, Buffer>>,
    /// The deadline for the answer's head (a backstop: Rust enforces it too).
    pub timeout_ms: Option<f64>,
}

/// The bridge's answer: for `fetch`, the head (`status`, `headers` as names and values in
/// turn) or `error` (`'not-sent' | 'unmatched' | 'lost' | 'redirect' | 'untrusted' |
/// 'proxy-refused'`, with
/// `status` for a proxy's refusal); for `read`, a `chunk`, or `done`, or `error: 'broken'`.
#[napi(object)]
pub struct FetchReply {
    pub error: Option<String>,
    pub status: Option<u32>,
    pub headers: Option<Vec<String>>,
    pub chunk: Option<Buffer>,
    pub done: Option<bool>,
}

/// The most header lines of an answer that are kept (the client reads `Retry-After`).
const MAX_HOST_HEADERS: usize = 64;
/// The longest header value kept.
const MAX_HOST_HEADER_VALUE: usize = 8192;

struct JsFetch {
    f: std::sync::Arc<FetchFn>,
    next: std::sync::atomic::AtomicU32,
    /// The call's environment is going away: JS can run nothing more.
    gone: Abort,
}

/// Aborts an exchange on the JS side when dropped before it ended.
struct CancelOnDrop {
    f: std::sync::Arc<FetchFn>,
    id: u32,
    armed: bool,
}

impl CancelOnDrop {
    /// The exchange ended on the JS side: nothing to cancel.
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.f.call(fetch_call("cancel", self.id), ThreadsafeFunctionCallMode::NonBlocking);
        }
    }
}

fn fetch_call(op: &str, id: u32) -> FetchCall {
    FetchCall { op: op.to_owned(), id, method: None, url: None, headers: None, body: None, timeout_ms: None }
}

fn send_error(kind: Option<&str>, status: Option<u32>) -> SendError {
    match kind {
        Some("not-sent") => SendError::NotSent,
        Some("redirect") => SendError::Redirect,
        Some("untrusted") => SendError::Untrusted,
        Some("proxy-refused") => SendError::ProxyRefused(status.and_then(|s| u16::try_from(s).ok())),
        Some("unmatched") => SendError::Unmatched,
        _ => SendError::Lost,
    }
}

/// Calls the bridge and waits for its answer; `None` when it failed or threw (nothing of
/// what it threw is kept: it may hold the URL).
async fn bridge(f: &FetchFn, call: FetchCall) -> Option<FetchReply> {
    f.call_async_catch(call).await.ok()?.await.ok()
}

impl HostFetch for JsFetch {
    fn usable(&self) -> bool {
        !self.gone.is_aborted()
    }

    fn fetch(
        &self,
        req: HostRequest,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::result::Result<HostResponse, SendError>> + Send>> {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let f = std::sync::Arc::clone(&self.f);
        let gone = self.gone.clone();
        Box::pin(async move {
            let mut headers = Vec::with_capacity(req.headers.len() * 2);
            for (k, v) in req.headers {
                headers.push(k.to_owned());
                headers.push(v);
            }
            let body = match req.body {
                HostBody::None => None,
                HostBody::Text(t) => Some(Either::A(t)),
                HostBody::Bytes(b) => Some(Either::B(Buffer::from(b.to_vec()))),
            };
            #[allow(clippy::cast_precision_loss)]
            let call = FetchCall {
                op: "fetch".to_owned(),
                id,
                method: Some(req.method.to_owned()),
                url: Some(req.url),
                headers: Some(headers),
                body,
                timeout_ms: req.timeout.map(|t| t.as_millis() as f64),
            };
            let mut guard = CancelOnDrop { f: std::sync::Arc::clone(&f), id, armed: true };
            let reply = tokio::select! {
                r = bridge(&f, call) => r.ok_or(SendError::Lost)?,
                () = gone.aborted() => return Err(SendError::Lost),
            };
            if reply.error.is_some() {
                guard.disarm(); // the bridge already let go of it
                return Err(send_error(reply.error.as_deref(), reply.status));
            }
            let status = reply.status.and_then(|s| u16::try_from(s).ok()).ok_or(SendError::Lost)?;
            let mut pairs = Vec::new();
            for kv in reply.headers.unwrap_or_default().chunks_exact(2).take(MAX_HOST_HEADERS) {
                if kv[1].len() <= MAX_HOST_HEADER_VALUE {
                    pairs.push((kv[0].to_ascii_lowercase(), kv[1].clone()));
                }
            }
            Ok(HostResponse { status, headers: pairs, body: host_body(f, guard, gone) })
        })
    }
}

/// The body of an exchange, pulled one chunk (at most 256 KiB, the bridge's batch) at a time:
/// nothing is read ahead of the consumer but the bridge's own small buffer.
fn host_body(f: std::sync::Arc<FetchFn>, guard: CancelOnDrop, gone: Abort) -> HostStream {
    struct State {
        f: std::sync::Arc<FetchFn>,
        guard: CancelOnDrop,
        gone: Abort,
        ended: bool,
    }
    let state = State { f, guard, gone, ended: false };
    Box::pin(futures_util::stream::unfold(state, |mut st| async move {
        if st.ended {
            return None;
        }
        let reply = tokio::select! {
            r = bridge(&st.f, fetch_call("read", st.guard.id)) => r,
            () = st.gone.aborted() => None,
        };
        let item = match reply {
            Some(FetchReply { chunk: Some(c), .. }) => Ok(Bytes::from_owner(c)),
            Some(FetchReply { done: Some(true), .. }) => {
                st.guard.disarm();
                return None;
            }
            Some(FetchReply { error: Some(_), .. }) => {
                st.guard.disarm();
                Err(BodyBroken)
            }
            _ => Err(BodyBroken),
        };
        st.ended = item.is_err();
        Some((item, st))
    }))
}

fn host_fetch(on_fetch: Option<FetchFn>, gone: &Abort) -> Option<std::sync::Arc<dyn HostFetch>> {
    on_fetch.map(|f| {
        std::sync::Arc::new(JsFetch {
            f: std::sync::Arc::new(f),
            next: std::sync::atomic::AtomicU32::new(1),
            gone: gone.clone(),
        }) as std::sync::Arc<dyn HostFetch>
    })
}

type Runner =
    fn(
        Config,
        config::Params,
        Abort,
        Option<mpsc::Sender<LogLine>>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::result::Result<ExecuteResult, Error>> + Send>>;

#[allow(clippy::too_many_arguments)] // the napi arguments, passed through
fn run_command<'env>(
    env: &'env Env,
    client: Value,
    params: Value,
    cancel: &CancelHandle,
    on_log: Option<LogFn>,
    on_diag: Option<DiagFn>,
    on_fetch: Option<FetchFn>,
    runner: Runner,
) -> Result<PromiseRaw<'env, ExecuteOutcome>> {
    let abort = cancel.abort.clone();
    spawn(env, Some(abort.clone()), |gone| async move {
        let (run, forwarder, events) = match prepare(client, params, on_log, on_diag, on_fetch, gone, abort, runner) {
            Ok(started) => started,
            Err(e) => return Err(e).into(),
        };
        trim::note();
        let result = run.await;
        trim::note();
        // Every log call is delivered before the promise settles.
        if let Some(f) = forwarder {
            let _ = f.await;
        }
        if let Some(e) = events {
            e.finish().await;
        }
        result.map(execute_value).into()
    })
}

/// A command's run (not polled yet), its log forwarder and its event forwarder.
type Prepared = (
    std::pin::Pin<Box<dyn std::future::Future<Output = std::result::Result<ExecuteResult, Error>> + Send>>,
    Option<tokio::task::JoinHandle<()>>,
    Option<EventForwarder>,
);

/// Parses the call's values (dropping the JS values) and builds its run. A plain function, so
/// that the parsed config and params live in the run's future only: a future keeps room for
/// every local whose scope spans one of its awaits, moved out or not, for as long as the
/// command is in flight.
#[allow(clippy::too_many_arguments)] // the napi arguments, passed through
fn prepare(
    client: Value,
    params: Value,
    on_log: Option<LogFn>,
    on_diag: Option<DiagFn>,
    on_fetch: Option<FetchFn>,
    gone: Abort,
    abort: Abort,
    runner: Runner,
) -> std::result::Result<Prepared, Error> {
    let parsed = config::parse_config(&client).and_then(|c| Ok((c, config::parse_params(&params)?)));
    // Parsed: the JS values are not held while the command runs.
    drop((client, params));
    let (mut cfg, params) = parsed?;
    let (sink, events) = event_sink(on_diag, gone.clone());
    cfg.events = sink;
    cfg.host_fetch = host_fetch(on_fetch, &gone);
    let (tx, forwarder) = match on_log {
        Some(log) => {
            let (tx, rx) = mpsc::channel(LOG_QUEUE);
            (Some(tx), Some(tokio::spawn(forward_logs(rx, log, gone))))
        }
        None => (None, None),
    };
    Ok((runner(cfg, params, abort, tx), forwarder, events))
}

/// Runs a command through a managed process (see `execute.rs`).
#[napi(
    ts_args_type = "client: object, params: object, cancel: CancelHandle, onLog?: ((stream: string, text: string) => void) | undefined | null, onDiag?: ((channel: string, event: object) => void) | undefined | null, transport?: ((call: FetchCall) => Promise<FetchReply>) | undefined | null"
)]
pub fn execute_native<'env>(
    env: &'env Env,
    client: Value,
    params: Value,
    cancel: &CancelHandle,
    on_log: Option<LogFn>,
    on_diag: Option<DiagFn>,
    on_fetch: Option<FetchFn>,
) -> Result<PromiseRaw<'env, ExecuteOutcome>> {
    run_command(env, client, params, cancel, on_log, on_diag, on_fetch, |c, p, a, l| {
        Box::pin(async move { execute::execute(&c, &p, a, l).await })
    })
}

/// Runs a command through `/exec?stream=true`.
#[napi(
    ts_args_type = "client: object, params: object, cancel: CancelHandle, onLog?: ((stream: string, text: string) => void) | undefined | null, onDiag?: ((channel: string, event: object) => void) | undefined | null, transport?: ((call: FetchCall) => Promise<FetchReply>) | undefined | null"
)]
pub fn execute_stream_native<'env>(
    env: &'env Env,
    client: Value,
    params: Value,
    cancel: &CancelHandle,
    on_log: Option<LogFn>,
    on_diag: Option<DiagFn>,
    on_fetch: Option<FetchFn>,
) -> Result<PromiseRaw<'env, ExecuteOutcome>> {
    run_command(env, client, params, cancel, on_log, on_diag, on_fetch, |c, p, a, l| {
        Box::pin(async move { execute::execute_stream(&c, &p, a, l).await })
    })
}

/// Follows a process the host created; `onEvent('connected')` on every attach,
/// `onEvent(stream, bytes)` for output.
#[napi(
    ts_args_type = "client: object, sandboxId: string, processId: string, cancel: CancelHandle, onEvent: (kind: string, data?: Buffer | null) => void, onDiag?: ((channel: string, event: object) => void) | undefined | null, transport?: ((call: FetchCall) => Promise<FetchReply>) | undefined | null"
)]
#[allow(clippy::too_many_arguments)] // one per napi argument
pub fn follow_process_native<'env>(
    env: &'env Env,
    client: Value,
    sandbox_id: Value,
    process_id: Value,
    cancel: &CancelHandle,
    on_event: EventFn,
    on_diag: Option<DiagFn>,
    on_fetch: Option<FetchFn>,
) -> Result<PromiseRaw<'env, FollowOutcome>> {
    let abort = cancel.abort.clone();
    spawn(env, Some(abort.clone()), |gone| async move {
        let parsed = config::parse_config(&client)
            .and_then(|c| Ok((c, config::sandbox_id(Some(&sandbox_id))?, config::process_id(Some(&process_id))?)));
        let (mut cfg, sb, pid) = match parsed {
            Ok(p) => p,
            Err(e) => return Err(e).into(),
        };
        let (sink, events) = event_sink(on_diag, gone.clone());
        cfg.events = sink;
        cfg.host_fetch = host_fetch(on_fetch, &gone);
        let (tx, mut rx) = mpsc::channel::<FollowEvent>(LOG_QUEUE);
        let forwarder = tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                if gone.is_aborted() {
                    continue; // drain without calling JS
                }
                let args = match ev {
                    FollowEvent::Connected => ("connected".to_owned(), None),
                    FollowEvent::Data(stream, bytes) => (stream.as_str().to_owned(), Some(Buffer::from(bytes))),
                };
                tokio::select! {
                    _ = on_event.call_async_catch(FnArgs::from(args)) => {}
                    () = gone.aborted() => {}
                }
            }
        });
        let result = execute::follow_process(&cfg, &sb, &pid, abort, tx).await;
        let _ = forwarder.await;
        if let Some(e) = events {
            e.finish().await;
        }
        result.map(|exit| NativeProcessExit { exit_code: exit.exit_code, signal: exit.signal }).into()
    })
}

/// Waits for a request slot of the API origin (the pacer shared with every call).
#[napi(ts_args_type = "client: object, cancel: CancelHandle")]
pub fn wait_for_request_native<'env>(
    env: &'env Env,
    client: Value,
    cancel: &CancelHandle,
) -> Result<PromiseRaw<'env, WaitOutcome>> {
    let abort = cancel.abort.clone();
    spawn(env, Some(abort.clone()), |_| async move {
        let r = match config::parse_config(&client) {
            Ok(cfg) => execute::wait_for_request(&cfg.api_url, &cfg.pacing, abort).await,
            Err(e) => Err(e),
        };
        WaitOutcome::from(r)
    })
}

/// Destroys a sandbox and confirms it gone; resolves the receipt
/// `{ providerLeaseId, state: 'destroyed' }`.
#[napi(
    ts_args_type = "client: object, sandboxId: string, onDiag?: ((channel: string, event: object) => void) | undefined | null, transport?: ((call: FetchCall) => Promise<FetchReply>) | undefined | null"
)]
pub fn destroy_sandbox_native<'env>(
    env: &'env Env,
    client: Value,
    sandbox_id: Value,
    on_diag: Option<DiagFn>,
    on_fetch: Option<FetchFn>,
) -> Result<PromiseRaw<'env, DestroyOutcome>> {
    spawn(env, None, |gone| async move {
        let host = host_fetch(on_fetch, &gone);
        let (sink, events) = event_sink(on_diag, gone);
        let r = async {
            let mut cfg = config::parse_config(&client)?;
            cfg.events = sink;
            cfg.host_fetch = host;
            let sb = config::sandbox_id(Some(&sandbox_id))?;
            execute::destroy_sandbox(&cfg, &sb).await?;
            Ok(NativeTerminationReceipt { provider_lease_id: sb, state: "destroyed".to_owned() })
        }
        .await;
        if let Some(e) = events {
            e.finish().await;
        }
        DestroyOutcome::from(r)
    })
}

/// Hands over Node's proxy switch of this process's command line (`--use-env-proxy` is
/// `true`, `--no-use-env-proxy` `false`, neither `null`), which only JS can see in
/// `process.execArgv`. `index.js` calls it once as it loads; later calls change nothing.
#[napi]
pub fn set_exec_argv_env_proxy(on: Option<bool>) {
    createos_execute_core::net::set_exec_argv_switch(on);
}

/// Quotes a value as one bash word; throws on NUL.
#[napi]
pub fn shell_quote(value: String) -> Result<String> {
    script::shell_quote(&value).map_err(|e| napi::Error::from_reason(e.to_string()))
}

/// For the robustness tests only: a native call whose future panics.
#[cfg(feature = "test-hooks")]
#[napi(js_name = "__panicForTest")]
pub fn panic_for_test(env: &Env) -> Result<PromiseRaw<'_, WaitOutcome>> {
    spawn(env, None, |_| async {
        if std::hint::black_box(true) {
            panic!("deliberate panic for the robustness test");
        }
        WaitOutcome::from(Ok(()))
    })
}
