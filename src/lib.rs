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

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use napi::bindgen_prelude::*;
use napi::threadsafe_function::ThreadsafeFunction;
use napi_derive::napi;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use createos_execute_core::abort::Abort;
use createos_execute_core::config::{self, Config};
use createos_execute_core::error::Error;
use createos_execute_core::events::{Event, EventSink};
use createos_execute_core::execute::{self, ExecuteResult, FollowEvent};
use createos_execute_core::output::LogLine;
use createos_execute_core::script;

/// `log(stream, text)`: weak (does not keep Node alive), errors handled by the caller's wrapper.
/// The text goes as UTF-16 when it is not ASCII: converted here, on a worker thread, so the JS
/// thread only copies it (V8's own UTF-8 decoding of non-ASCII text is the slow part of `log`).
type LogText = Either<String, Utf16String>;
type LogFn = ThreadsafeFunction<FnArgs<(String, LogText)>, (), FnArgs<(String, LogText)>, Status, false, true>;
/// `onEvent(kind, data)`: kind is `connected`, `stdout`, `stderr` or `pty`.
type EventFn =
    ThreadsafeFunction<FnArgs<(String, Option<Buffer>)>, (), FnArgs<(String, Option<Buffer>)>, Status, false, true>;

/// `onDiag(channel, event)`: channel is `request` or `cleanup` (index.js publishes on
/// `createos-execute:<channel>`). Passed only while someone subscribes.
type DiagFn = ThreadsafeFunction<FnArgs<(String, Value)>, (), FnArgs<(String, Value)>, Status, false, true>;
/// Events waiting for the JS thread; more are dropped (observability never slows a command).
const EVENT_QUEUE: usize = 1024;

/// How many decoded chunks may wait for the JS thread before the reader slows down.
const LOG_QUEUE: usize = 64;
/// Adjacent chunks of one stream are joined up to this size when JS is behind.
const LOG_BATCH_BYTES: usize = 1 << 20;

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
}

/// The one place a Rust error becomes data for JS.
fn error_json(e: &Error) -> Value {
    let message = e.to_string();
    match e {
        Error::Api { status, .. } => json!({ "kind": "api", "message": message, "status": status }),
        Error::Cleanup(r) => json!({
            "kind": "cleanup",
            "message": message,
            "reason": r.reason.as_str(),
            "sandboxId": r.sandbox_id,
            "processId": r.process_id,
            "attempts": r.attempts.iter().map(|a| json!({
                "step": a.step, "graceMs": a.grace_ms, "outcome": a.outcome, "atMs": a.at_ms,
            })).collect::<Vec<_>>(),
        }),
        Error::DestroyUnconfirmed(r) => json!({
            "kind": "destroy",
            "message": message,
            "sandboxId": r.sandbox_id,
            "attempts": r.attempts.iter().map(|a| json!({ "step": a.step, "outcome": a.outcome, "atMs": a.at_ms })).collect::<Vec<_>>(),
        }),
        Error::Cancelled => json!({ "kind": "cancelled", "message": message }),
        Error::TimedOut => json!({ "kind": "aborted", "timedOut": true, "message": message }),
        Error::Input(_) => json!({ "kind": "input", "message": message }),
        _ => match e.code() {
            Some(code) => json!({ "kind": "error", "code": code, "message": message }),
            None => json!({ "kind": "error", "message": message }),
        },
    }
}

fn outcome(r: std::result::Result<Value, Error>) -> Value {
    let mut out = match r {
        Ok(value) => json!({ "ok": true, "value": value }),
        Err(e) => json!({ "ok": false, "error": error_json(&e) }),
    };
    // State changes the core saw since the last call settled (e.g. the shared pacing store
    // went down); index.js emits each with `process.emitWarning`. Each is delivered once.
    let warnings = createos_execute_core::pacer::take_warnings();
    if !warnings.is_empty() {
        out["warnings"] =
            warnings.iter().map(|w| json!({ "code": w.code, "message": w.message })).collect::<Vec<_>>().into();
    }
    out
}

fn result_json(r: ExecuteResult) -> Value {
    json!({
        "exitCode": r.exit_code,
        "signal": r.signal,
        "timedOut": r.timed_out,
        "stdout": r.stdout,
        "stderr": r.stderr,
        "metadata": {
            "processId": r.process_id,
            "outputTruncated": r.output_truncated,
            "treeExited": r.tree_exited,
        },
    })
}

/// Runs `fut` on napi's tokio runtime, registered with `env` (see the module doc); a panic
/// rejects the promise. `make` gets the "environment gone" signal.
fn spawn<'env, F>(
    env: &'env Env,
    abort: Option<Abort>,
    make: impl FnOnce(Abort) -> F,
) -> Result<PromiseRaw<'env, Value>>
where
    F: std::future::Future<Output = Value> + Send + 'static,
{
    let gone = Abort::new();
    let registered = register(env, abort, gone.clone());
    let fut = make(gone);
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
                Ok((s, t)) if s == stream && text.len() + t.len() <= LOG_BATCH_BYTES => text.push_str(&t),
                Ok(other) => {
                    next = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        let text: LogText = if text.is_ascii() {
            Either::A(text)
        } else {
            Either::B(Utf16String::from(text.encode_utf16().collect::<Vec<u16>>()))
        };
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

/// Delivers events to `onDiag` in order; after `finish`, what is queued, then ends.
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

fn event_sink(on_diag: Option<DiagFn>) -> (Option<EventSink>, Option<EventForwarder>) {
    let Some(f) = on_diag else { return (None, None) };
    let (tx, mut rx) = mpsc::channel::<(String, Value)>(EVENT_QUEUE);
    let (done, mut done_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                biased;
                ev = rx.recv() => match ev {
                    Some(ev) => { let _ = f.call_async_catch(FnArgs::from(ev)).await; }
                    None => break,
                },
                _ = &mut done_rx => {
                    while let Ok(ev) = rx.try_recv() {
                        let _ = f.call_async_catch(FnArgs::from(ev)).await;
                    }
                    break;
                }
            }
        }
    });
    let sink: EventSink = std::sync::Arc::new(move |ev| {
        let _ = tx.try_send(event_json(ev));
    });
    (Some(sink), Some(EventForwarder { done, task }))
}

type Runner =
    fn(
        Config,
        config::Params,
        Abort,
        Option<mpsc::Sender<LogLine>>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::result::Result<ExecuteResult, Error>> + Send>>;

fn run_command<'env>(
    env: &'env Env,
    client: Value,
    params: Value,
    cancel: &CancelHandle,
    on_log: Option<LogFn>,
    on_diag: Option<DiagFn>,
    runner: Runner,
) -> Result<PromiseRaw<'env, Value>> {
    let abort = cancel.abort.clone();
    spawn(env, Some(abort.clone()), |gone| async move {
        let parsed = config::parse_config(&client).and_then(|c| Ok((c, config::parse_params(&params)?)));
        let (mut cfg, params) = match parsed {
            Ok(p) => p,
            Err(e) => return outcome(Err(e)),
        };
        let (sink, events) = event_sink(on_diag);
        cfg.events = sink;
        let (tx, forwarder) = match on_log {
            Some(log) => {
                let (tx, rx) = mpsc::channel(LOG_QUEUE);
                (Some(tx), Some(tokio::spawn(forward_logs(rx, log, gone))))
            }
            None => (None, None),
        };
        let result = runner(cfg, params, abort, tx).await;
        // Every log call is delivered before the promise settles.
        if let Some(f) = forwarder {
            let _ = f.await;
        }
        if let Some(e) = events {
            e.finish().await;
        }
        outcome(result.map(result_json))
    })
}

/// Runs a command through a managed process (see `execute.rs`).
#[napi(
    ts_args_type = "client: object, params: object, cancel: CancelHandle, onLog?: ((stream: string, text: string) => void) | undefined | null, onDiag?: ((channel: string, event: object) => void) | undefined | null"
)]
pub fn execute_native<'env>(
    env: &'env Env,
    client: Value,
    params: Value,
    cancel: &CancelHandle,
    on_log: Option<LogFn>,
    on_diag: Option<DiagFn>,
) -> Result<PromiseRaw<'env, Value>> {
    run_command(env, client, params, cancel, on_log, on_diag, |c, p, a, l| {
        Box::pin(async move { execute::execute(&c, &p, a, l).await })
    })
}

/// Runs a command through `/exec?stream=true`.
#[napi(
    ts_args_type = "client: object, params: object, cancel: CancelHandle, onLog?: ((stream: string, text: string) => void) | undefined | null, onDiag?: ((channel: string, event: object) => void) | undefined | null"
)]
pub fn execute_stream_native<'env>(
    env: &'env Env,
    client: Value,
    params: Value,
    cancel: &CancelHandle,
    on_log: Option<LogFn>,
    on_diag: Option<DiagFn>,
) -> Result<PromiseRaw<'env, Value>> {
    run_command(env, client, params, cancel, on_log, on_diag, |c, p, a, l| {
        Box::pin(async move { execute::execute_stream(&c, &p, a, l).await })
    })
}

/// Follows a process the host created; `onEvent('connected')` on every attach,
/// `onEvent(stream, bytes)` for output.
#[napi(
    ts_args_type = "client: object, sandboxId: string, processId: string, cancel: CancelHandle, onEvent: (kind: string, data?: Buffer | null) => void, onDiag?: ((channel: string, event: object) => void) | undefined | null"
)]
pub fn follow_process_native<'env>(
    env: &'env Env,
    client: Value,
    sandbox_id: Value,
    process_id: Value,
    cancel: &CancelHandle,
    on_event: EventFn,
    on_diag: Option<DiagFn>,
) -> Result<PromiseRaw<'env, Value>> {
    let abort = cancel.abort.clone();
    spawn(env, Some(abort.clone()), |gone| async move {
        let parsed = config::parse_config(&client)
            .and_then(|c| Ok((c, config::sandbox_id(Some(&sandbox_id))?, config::process_id(Some(&process_id))?)));
        let (mut cfg, sb, pid) = match parsed {
            Ok(p) => p,
            Err(e) => return outcome(Err(e)),
        };
        let (sink, events) = event_sink(on_diag);
        cfg.events = sink;
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
        outcome(result.map(|exit| json!({ "exitCode": exit.exit_code, "signal": exit.signal })))
    })
}

/// Waits for a request slot of the API origin (the pacer shared with every call).
#[napi(ts_args_type = "client: object, cancel: CancelHandle")]
pub fn wait_for_request_native<'env>(
    env: &'env Env,
    client: Value,
    cancel: &CancelHandle,
) -> Result<PromiseRaw<'env, Value>> {
    let abort = cancel.abort.clone();
    spawn(env, Some(abort.clone()), |_| async move {
        let r = match config::parse_config(&client) {
            Ok(cfg) => execute::wait_for_request(&cfg.api_url, &cfg.pacing, abort).await,
            Err(e) => Err(e),
        };
        outcome(r.map(|()| Value::Null))
    })
}

/// Destroys a sandbox and confirms it gone; resolves the receipt
/// `{ providerLeaseId, state: 'destroyed' }`.
#[napi(
    ts_args_type = "client: object, sandboxId: string, onDiag?: ((channel: string, event: object) => void) | undefined | null"
)]
pub fn destroy_sandbox_native<'env>(
    env: &'env Env,
    client: Value,
    sandbox_id: Value,
    on_diag: Option<DiagFn>,
) -> Result<PromiseRaw<'env, Value>> {
    spawn(env, None, |_| async move {
        let (sink, events) = event_sink(on_diag);
        let r = async {
            let mut cfg = config::parse_config(&client)?;
            cfg.events = sink;
            let sb = config::sandbox_id(Some(&sandbox_id))?;
            execute::destroy_sandbox(&cfg, &sb).await?;
            Ok(json!({ "providerLeaseId": sb, "state": "destroyed" }))
        }
        .await;
        if let Some(e) = events {
            e.finish().await;
        }
        outcome(r)
    })
}

/// Quotes a value as one bash word; throws on NUL.
#[napi]
pub fn shell_quote(value: String) -> Result<String> {
    script::shell_quote(&value).map_err(|e| napi::Error::from_reason(e.to_string()))
}

/// For the robustness tests only: a native call whose future panics.
#[cfg(feature = "test-hooks")]
#[napi(js_name = "__panicForTest")]
pub fn panic_for_test(env: &Env) -> Result<PromiseRaw<'_, Value>> {
    spawn(env, None, |_| async {
        let v: Option<Value> = None;
        v.expect("deliberate panic for the robustness test")
    })
}
