//! The orchestration of one command, and the other entry points the binding exposes.
//!
//! `execute` (managed process), in round trips:
//! 1. stage stdin as a file (PUT /files), if there is stdin, and send the start gate's upload
//!    with its one byte held back (`Client::put_file_held`), while
//! 2. creating `/bin/bash -lc <script>` (POST /processes); the script waits for a start gate;
//! 3. follow `connect?after=<cursor>`; once attached (headers received, or one measured round
//!    trip after the connect request was handed over, see [`GATE_FALLBACK_MAX`]), release the
//!    gate's byte;
//! 4. on the exit frame: done (the script already removed the gate and the staged stdin).
//!
//! So a warm command costs about three round trips plus the command: create, connect (its
//! headers), and the gate's byte with the first output coming back. On HTTP/2 every request
//! is a stream of one connection; on HTTP/1.1 the stream holds one connection and the gate
//! has another: warm in the pool from the previous command (`net::POOL_IDLE`), or, on a cold
//! start, opened in parallel with the creation's, because the gate's request went out then.
//!
//! On every other path the process is terminated and proven gone (`cleanup.rs`, under a fresh
//! deadline) and staged files are removed. An abort is acted on at once: a timeout resolves a
//! `timedOut` result with the output so far, any other abort is a cancellation.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::abort::{Abort, Ctx};
use crate::cleanup::{self, Contained, Facts, Steps};
use crate::client::{self, Body, Client, HeldUpload};
use crate::config::{Config, Leftover, Params};
use crate::error::{CleanupReason, Error, Operation, Result, PANIC};
use crate::follow::{self, Followed, Sink};
use crate::hooks::{self, Phase};
use crate::output::{self, LogLine, Output};
use crate::pacer;
use crate::script::{self, Gate};
use crate::stream::{self, LineSplitter, StreamKind};

use crate::create::{create_with_recovery, Created};
use crate::result::aborted;
pub use crate::result::ExecuteResult;

pub use crate::create::INVALID_RESOURCE_ID;
pub const EXEC_STREAM_ENDED: &str = "CreateOS command stream ended without an exit status.";

/// Writes followed output into the capture and reports the first connect request and the
/// first attach.
struct CaptureSink<'a> {
    output: &'a mut Output,
    sending: Option<oneshot::Sender<()>>,
    connected: Option<oneshot::Sender<()>>,
}

impl Sink for CaptureSink<'_> {
    fn sending(&mut self) {
        if let Some(tx) = self.sending.take() {
            let _ = tx.send(());
        }
    }

    async fn connected(&mut self) {
        if let Some(tx) = self.connected.take() {
            let _ = tx.send(());
        }
    }

    async fn data(&mut self, stream: StreamKind, bytes: Vec<u8>) -> Result<()> {
        let stream = output::pipe_stream(stream)?;
        self.output.write(stream, &bytes).await
    }
}

/// Runs one command through a managed process. See the module doc.
pub async fn execute(
    cfg: &Config,
    params: &Params,
    abort: Abort,
    log: Option<mpsc::Sender<LogLine>>,
) -> Result<ExecuteResult> {
    // A sandbox whose session supervisor could not be proven gone is refused, nothing sent.
    if let Some(report) = crate::session::unproven(&cfg.api_url, &params.sandbox_id) {
        return Err(Error::Cleanup(Box::new(report)));
    }
    if let Some(rec) = crate::session::applies(cfg, params) {
        return Box::pin(crate::session::execute(cfg, params, rec, abort, log)).await;
    }
    let client = Arc::new(cfg.client()?);
    let ctx = Ctx::new(abort.clone());
    let mut output = Output::new(log);
    if abort.is_aborted() {
        // Nothing is sent for an already aborted signal.
        return aborted(&abort, output.finish().await, None, None);
    }
    let token = uuid::Uuid::new_v4().simple().to_string();
    let stdin_path = params.stdin.as_ref().map(|_| format!("/tmp/createos-stdin-{token}"));
    let gate_path = format!("/tmp/createos-start-{token}");
    let scripts = Scripts {
        cmd: params.command(),
        gate_path: &gate_path,
        stdin_path: stdin_path.as_deref(),
        timeout_s: cfg.timeout.as_secs() + 60,
    };
    // Input errors come before anything is sent.
    scripts.attempt(1)?;
    let mut facts = Facts { attempt: 1, ..Facts::default() };
    // A panic anywhere in the run is an error like any other: it still goes through the
    // cleanup below (the cleanup has its own panic guard).
    let run = async {
        // Boxed: the caller's future stays small, and each phase below frees what it no longer
        // needs (a command in flight holds only its follow; see docs/benchmarks.md §14).
        AssertUnwindSafe(Box::pin(run_managed(&client, cfg, params, &ctx, &scripts, &mut output, &mut facts)))
            .catch_unwind()
            .await
            .unwrap_or(Err(Error::Internal(PANIC)))
    };
    // When the caller's signal fired: the cleanup that follows an abort began then, and its
    // deadline counts from then (the run may take a bounded while to stop, see
    // `Client::create_process`).
    let mut aborted_at = None;
    let run = beside(
        run,
        std::pin::pin!(async {
            abort.aborted().await;
            Instant::now()
        }),
        &mut aborted_at,
    )
    .await;
    let sb = params.sandbox_id.as_str();
    match run {
        Ok(mut result) => {
            let captured = output.finish().await;
            result.stdout = captured.stdout;
            result.stderr = captured.stderr;
            result.output_truncated = captured.truncated;
            Ok(result)
        }
        Err(err) => {
            // After the command completed, or once a cleanup inside the run gave its verdict,
            // the error is that verdict: nothing more to end.
            let contained = if facts.settled {
                if matches!(err, Error::Cleanup(_)) {
                    return Err(err);
                }
                Contained::NothingRan
            } else {
                let now = Instant::now();
                let began = aborted_at.map_or(now, |at| at.min(now));
                let cleanup_ctx = cleanup_ctx(began, cfg.cleanup.deadline);
                let mut steps = Steps::new();
                // Boxed (as every rare path here): a command in flight does not carry its size.
                let contained = Box::pin(cleanup::contain(
                    &client,
                    sb,
                    &gate_path,
                    &mut facts,
                    &cfg.cleanup,
                    &cleanup_ctx,
                    &mut steps,
                ))
                .await;
                match contained {
                    Ok(c) => c,
                    Err(f) => {
                        let reported = f.process_id.or(facts.process_id);
                        return Err(steps.report(f.reason, sb, reported.as_deref()));
                    }
                }
            };
            // Proven: nothing of this call runs. The script removes its staged files once past
            // its gate, and at its gate on the SIGTERM a DELETE starts with; killed without it
            // (or its end unknown) it could not, so they are removed after the verdict
            // (housekeeping never delays it), bounded. The cancel file stays: a late creation
            // must still find it.
            // (A settled run completed: its script was past its gate.) Without staged stdin, once
            // the gate was sent, the only file a signal death can leave is the gate itself (one
            // byte, no data of the command), and only when the kill came between the gate's
            // release and the script's next poll; a timed-out command that dies of its SIGTERM is
            // by far the likelier reading, so no removal is sent for it.
            let may_have_files = !facts.settled && (facts.staged || (!facts.gate_sent && facts.process_id.is_some()));
            if may_have_files && script::staged_files_remain(&facts.ended, facts.gate_sent) {
                let mut paths: Vec<String> = stdin_path.iter().cloned().collect();
                paths.extend([gate_path.clone(), script::claim_path(&gate_path)]);
                spawn_remove(Arc::clone(&client), sb.to_owned(), paths, cfg.cleanup.deadline);
            }
            // Only an abort that ended the run makes the outcome an abort: one that fired
            // during the cleanup never replaces a real error (a gap, an eviction, a panic).
            if err.is_abort() && abort.is_aborted() {
                let tree_exited = (contained == Contained::TreeGone).then_some(true);
                return aborted(&abort, output.finish().await, facts.process_id, tree_exited);
            }
            Err(err)
        }
    }
}

/// The script of each creation attempt of one call (see `script.rs`, "Attempts").
struct Scripts<'a> {
    cmd: script::Command<'a>,
    gate_path: &'a str,
    stdin_path: Option<&'a str>,
    timeout_s: u64,
}

impl Scripts<'_> {
    fn attempt(&self, attempt: u32) -> Result<String> {
        let gate = Gate { gate_path: self.gate_path, stdin_path: self.stdin_path, timeout_s: self.timeout_s, attempt };
        script::command_script(&self.cmd, Some(&gate))
    }
}

/// The creation's body, as the TypeScript module sent it: `cwd` rides along when it is
/// absolute (the script still `cd`s there, so where the command runs is the script's word).
/// A relative `cwd` is only in the script: the server would resolve it first and the
/// script's `cd` would then apply it a second time.
fn creation_body(script: String, cwd: Option<&str>) -> Value {
    let mut body = json!({ "cmd": "/bin/bash", "args": ["-lc", script] });
    if let Some(cwd) = cwd.filter(|c| c.starts_with('/')) {
        body["cwd"] = Value::from(cwd);
    }
    body
}

/// A cleanup context whose deadline counts from `began` (the abort, or the error). A run that
/// took most of that time to stop after the abort still leaves the cleanup [`CLEANUP_FLOOR`]
/// (or the whole deadline, when shorter) to send its requests: an unproven verdict is never
/// given without asking.
fn cleanup_ctx(began: Instant, deadline: Duration) -> Ctx {
    let mut ctx = Ctx::cleanup(deadline);
    let floor = Instant::now() + deadline.min(CLEANUP_FLOOR);
    ctx.deadline = Some((began + deadline).max(floor));
    ctx
}

/// See [`cleanup_ctx`].
const CLEANUP_FLOOR: Duration = Duration::from_millis(500);

/// Removes staged files after the verdict, in a task of its own under its own short deadline
/// (see [`cleanup::remove_staged`]); nothing waits for it.
fn spawn_remove(client: Arc<Client>, sandbox_id: String, paths: Vec<String>, deadline: Duration) {
    tokio::spawn(async move {
        let remove = cleanup::remove_staged(&client, &sandbox_id, &paths, deadline);
        let _ = AssertUnwindSafe(remove).catch_unwind().await;
    });
}

#[allow(clippy::too_many_arguments)]
async fn run_managed(
    client: &Client,
    cfg: &Config,
    params: &Params,
    ctx: &Ctx,
    scripts: &Scripts<'_>,
    output: &mut Output,
    facts: &mut Facts,
) -> Result<ExecuteResult> {
    let sb = params.sandbox_id.as_str();
    let (gate_path, stdin_path) = (scripts.gate_path, scripts.stdin_path);
    // 1 ∥ 2: stdin is staged while the process is created. The script opens the staged file
    // only after its gate opens, and the gate opens only after the upload succeeded.
    let stage = async {
        match (stdin_path, params.stdin.as_ref()) {
            (Some(path), Some(stdin)) => client.put_file(sb, path, Bytes::copy_from_slice(stdin.as_bytes()), ctx).await,
            _ => Ok(()),
        }
    };
    facts.staged = stdin_path.is_some();
    // Ambiguous until the answer says otherwise (a panic in flight leaves it so).
    facts.creation_ambiguous = true;
    let attempt = AtomicU32::new(1);
    let create = async {
        let started = Instant::now();
        let body_for = |n| scripts.attempt(n).map(|s| creation_body(s, scripts.cmd.cwd));
        let r = create_with_recovery(client, cfg, sb, scripts.gate_path, &body_for, &attempt, ctx).await;
        (r, started.elapsed())
    };
    // The gate's request goes out now, beside the creation, and holds its content until the
    // stream is attached (`open_gate`): its connection is ready when the gate must open. It
    // is polled in every phase below; dropping it before the release abandons it unsent.
    let (release, release_rx) = oneshot::channel();
    // Boxed, like the creation below: each is freed once it ended, so a command in flight
    // holds only its follow.
    let mut held =
        Box::pin(client.put_file_held(sb, gate_path, Bytes::from_static(script::GATE_CONTENT), release_rx, ctx));
    let mut held_early = None;
    // Both are awaited to the end (never one dropped half-way), so what each did is known.
    let (staged, (created, create_rtt)) =
        beside(Box::pin(async { tokio::join!(stage, create) }), held.as_mut(), &mut held_early).await;
    facts.attempt = attempt.load(Ordering::Relaxed);
    let created = match created {
        Created::Answer(creation) => {
            facts.creation_ambiguous = creation.maybe_created;
            creation.result?
        }
        Created::Settled(verdict) => {
            // Lost answers were recovered inside: the verdict (proof, or its failure) is in.
            facts.creation_ambiguous = false;
            facts.settled = matches!(verdict, Error::Cleanup(_));
            return Err(verdict);
        }
    };
    let pid = match created.get("process_id").and_then(Value::as_str) {
        Some(id) if client::is_identifier(id) => id.to_owned(),
        _ => {
            facts.creation_ambiguous = true;
            return Err(Error::Protocol(INVALID_RESOURCE_ID));
        }
    };
    // The creation's answer (with the script it echoes) is not kept while the command runs.
    drop(created);
    facts.process_id = Some(pid.clone());
    staged?;
    hooks::panic_at(cfg.panic_at, Phase::Create);

    // 3: follow, and open the gate once attached (see `open_gate`).
    let (sending_tx, sending) = oneshot::channel();
    let (tx, rx) = oneshot::channel();
    let mut sink = CaptureSink { output, sending: Some(sending_tx), connected: Some(tx) };
    let followed: Followed = {
        // Polled first by `try_join!`: the connect request goes out before the gate's
        // content can (that waits for the attach, or the fallback after this request started).
        let following = follow::follow(client, sb, &pid, ctx, &mut sink, &cfg.follow, &mut facts.seen_alive);
        let fallback = create_rtt.clamp(GATE_FALLBACK_MIN, GATE_FALLBACK_MAX);
        let held = HeldGate { release, upload: held, early: held_early, sent: &mut facts.gate_sent };
        // Boxed: `try_join!` drops it (and the held upload it owns) once the gate is open.
        let gate = Box::pin(open_gate(client, sb, gate_path, ctx, cfg.timeout, fallback, (sending, rx), held));
        let (followed, ()) = tokio::try_join!(following, gate)?;
        followed
    };
    facts.settled = true;

    let tree_exited = followed.tree_exited;
    if cfg.leftover == Leftover::Terminate && tree_exited != Some(true) {
        let mut steps = Steps::new();
        let cleanup_ctx = Ctx::cleanup(cfg.cleanup.deadline);
        // What the follow saw (the exit said the tree was alive): a 404 now is no proof.
        let seen = &mut facts.seen_alive;
        if Box::pin(cleanup::terminate(client, sb, &pid, &cfg.cleanup, &cleanup_ctx, &mut steps, seen)).await.is_err() {
            return Err(steps.report(CleanupReason::TerminationUnconfirmed, sb, Some(&pid)));
        }
    }
    // Proven gone by the follow, or by the termination just above.
    let tree_exited = if cfg.leftover == Leftover::Terminate { Some(true) } else { tree_exited };
    Ok(ExecuteResult {
        exit_code: followed.exit.exit_code,
        signal: followed.exit.signal,
        process_id: Some(pid),
        tree_exited,
        ..Default::default()
    })
}

/// How long after the connect request was started the gate opens when its response headers
/// have not arrived (a server that holds them until the first frame, as a Node `http` server
/// does by default, would otherwise hold the command until its first heartbeat): the time the
/// process creation took (one round trip to this server and back, measured), kept within
/// [`GATE_FALLBACK_MIN`, `GATE_FALLBACK_MAX`].
///
/// The trade-off: headers are the proof that the stream is attached; without them the gate
/// opens on the evidence that a request sent that long ago has had a whole round trip's time
/// to reach the server. Nothing is lost if it has not: the first attach is `connect?after=0`,
/// which replays every frame the process wrote since it started, and a journal that evicted
/// frames before the attach answers with an eviction error, which fails the call closed (the
/// process is ended). The only cost of opening early is that risk of eviction for a command
/// that writes more than the journal holds before the stream attaches; the cost of waiting
/// longer is latency on every command against such a server. Against servers that send their
/// headers at once it only matters when a round trip takes longer than the cap (100 ms), where
/// opening at the cap saves the rest of the round trip.
pub const GATE_FALLBACK_MIN: Duration = Duration::from_millis(10);
pub const GATE_FALLBACK_MAX: Duration = Duration::from_millis(100);

/// Runs `main` to its end while also polling `side`, whose output (if it finishes first) is
/// kept in `side_out`; `side` is not polled again once it finished.
async fn beside<F: std::future::Future, G: std::future::Future>(
    main: F,
    mut side: std::pin::Pin<&mut G>,
    side_out: &mut Option<G::Output>,
) -> F::Output {
    let mut main = std::pin::pin!(main);
    loop {
        tokio::select! {
            biased;
            out = &mut main => return out,
            o = side.as_mut(), if side_out.is_none() => *side_out = Some(o),
        }
    }
}

/// The gate's upload, sent ahead with its content held (see [`Client::put_file_held`]).
struct HeldGate<'a, G: std::future::Future<Output = HeldUpload>> {
    release: oneshot::Sender<()>,
    upload: std::pin::Pin<Box<G>>,
    /// Its outcome, when it ended before the release (then nothing was written).
    early: Option<HeldUpload>,
    /// Set once the gate's content may have been sent (by the release or a plain upload):
    /// from then on the command may have started (see [`Facts::gate_sent`]).
    sent: &'a mut bool,
}

/// Opens the start gate once the stream is attached, or `fallback` after the connect request
/// was handed over past the pacer (see [`GATE_FALLBACK_MAX`]), whichever is first: it releases the content of the
/// held upload, which costs half a round trip on a connection that is already open. When the
/// held upload ended unsent (an early answer or a lost connection), or failed in a way the
/// retry rules retry, a plain upload takes over within the same retry budget. The wait for
/// the answer has a deadline of `timeout` (the script itself gives up `timeout + 60 s` after
/// it started): a gate that could not be opened is [`Error::NotStarted`] when no attempt can
/// have written it, the upload's own error otherwise (then the command may have started).
#[allow(clippy::too_many_arguments)]
async fn open_gate<G: std::future::Future<Output = HeldUpload>>(
    client: &Client,
    sb: &str,
    gate_path: &str,
    ctx: &Ctx,
    timeout: Duration,
    fallback: Duration,
    (sending, mut attached): (oneshot::Receiver<()>, oneshot::Receiver<()>),
    mut held: HeldGate<'_, G>,
) -> Result<()> {
    let wait = async {
        // The fallback counts from when the connect request was handed over (after its
        // pacer wait), never from before: the gate never opens ahead of that request.
        tokio::select! {
            biased;
            r = &mut attached => return r.is_ok(),
            s = sending => {
                if s.is_err() {
                    // Following ended before sending anything.
                    return false;
                }
            }
        }
        tokio::select! {
            r = attached => r.is_ok(),
            () = tokio::time::sleep(fallback) => true,
        }
    };
    let attached = beside(wait, held.upload.as_mut(), &mut held.early).await;
    if !attached {
        // Following ended without ever attaching: `try_join!` already has its error. The
        // held upload is abandoned unsent when the caller drops it.
        return Ok(());
    }
    let gate_ctx = Ctx::with_deadline(ctx.abort.clone(), Instant::now() + timeout);
    let outcome = match held.early.take() {
        Some(early) => Ok(early),
        None => {
            // A failed send means the upload already ended: polling it tells how.
            *held.sent = true;
            let _ = held.release.send(());
            gate_ctx.run(async { Ok(held.upload.as_mut().await) }).await
        }
    };
    let content = || Bytes::from_static(script::GATE_CONTENT);
    let (result, maybe_written) = match outcome {
        Ok(HeldUpload::Sent(Ok(()), _)) => return Ok(()),
        Ok(HeldUpload::Sent(Err(e), maybe)) if !client::upload_retryable(&e) || ctx.abort.is_aborted() => {
            (Err(e), maybe)
        }
        Ok(HeldUpload::Sent(Err(e), maybe)) => {
            // 429 already paused the pacer; other retryable failures back off first.
            let backoff = if matches!(e, Error::Api { status: 429, .. }) { Duration::ZERO } else { RETRY_BACKOFF };
            match gate_ctx.sleep(backoff).await {
                Ok(()) => {
                    *held.sent = true;
                    let (r, m) = client.put_file_after(sb, gate_path, content(), &gate_ctx, 1).await;
                    (r, m || maybe)
                }
                Err(abort) => (Err(abort), maybe),
            }
        }
        Ok(HeldUpload::Unsent { attempted }) => {
            *held.sent = true;
            client.put_file_after(sb, gate_path, content(), &gate_ctx, u32::from(attempted)).await
        }
        // The deadline or the abort came while the content was on its way.
        Err(e) => (Err(e), true),
    };
    match (result, maybe_written) {
        (Ok(()), _) => Ok(()),
        (Err(e), _) if ctx.abort.is_aborted() => Err(e),
        // No mock of the host's fetch answered the gate: that error names what to fix.
        (Err(e @ Error::Unmatched { .. }), false) => Err(e),
        (Err(_), false) => Err(Error::NotStarted),
        // The gate's deadline passed with an upload on the wire: its fate is unknown.
        (Err(Error::TimedOut), true) => Err(Error::Connection { op: Operation::FileTransfer, maybe_sent: true }),
        (Err(e), true) => Err(e),
    }
}

/// The pause before a failed held gate upload is sent again (as `Client::send` backs off).
const RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// Runs one command through `/exec?stream=true` (no reconnect, no process id: a dropped
/// stream cannot be resumed).
pub async fn execute_stream(
    cfg: &Config,
    params: &Params,
    abort: Abort,
    log: Option<mpsc::Sender<LogLine>>,
) -> Result<ExecuteResult> {
    if let Some(report) = crate::session::unproven(&cfg.api_url, &params.sandbox_id) {
        return Err(Error::Cleanup(Box::new(report)));
    }
    let client = cfg.client()?;
    let ctx = Ctx::new(abort.clone());
    let mut output = Output::new(log);
    if abort.is_aborted() {
        return aborted(&abort, output.finish().await, None, None);
    }
    let script = script::command_script(&params.command(), None)?;
    let run = run_stream(&client, cfg, params, &ctx, &script, &mut output).await;
    match run {
        Ok(exit_code) => {
            let c = output.finish().await;
            Ok(ExecuteResult {
                exit_code: Some(exit_code),
                stdout: c.stdout,
                stderr: c.stderr,
                output_truncated: c.truncated,
                ..Default::default()
            })
        }
        Err(_) if abort.is_aborted() => aborted(&abort, output.finish().await, None, None),
        Err(e) => Err(e),
    }
}

async fn run_stream(
    client: &Client,
    cfg: &Config,
    params: &Params,
    ctx: &Ctx,
    script: &str,
    output: &mut Output,
) -> Result<i32> {
    let mut body = json!({ "cmd": "/bin/bash", "args": ["-lc", script], "stream": true });
    if let Some(stdin) = &params.stdin {
        body["stdin"] = Value::from(stdin.as_str());
    }
    let path = format!("/sandboxes/{}/exec?stream=true", params.sandbox_id);
    let resp =
        client.open_stream(Operation::WorkspaceCommand, Method::POST, &path, Body::Json(body), ctx, &mut || {}).await?;
    let mut bytes = resp.into_body();
    let mut lines = LineSplitter::new();
    let idle = cfg.follow.idle_timeout;
    loop {
        let next = ctx.run(async { Ok(tokio::time::timeout(idle, bytes.next()).await) }).await?;
        let ended = match next {
            Ok(Some(Ok(chunk))) => {
                lines.push(&chunk);
                false
            }
            Ok(None) => true,
            Err(_) | Ok(Some(Err(_))) => {
                return Err(Error::Connection { op: Operation::WorkspaceCommand, maybe_sent: true })
            }
        };
        loop {
            let line = if ended { lines.finish()? } else { lines.next_line()? };
            let Some(line) = line else { break };
            let Some(payload) = stream::payload(&line) else { continue };
            let frame = stream::parse_exec_frame(payload)?;
            if let Some(s) = &frame.stdout {
                output.write(StreamKind::Stdout, s.as_bytes()).await?;
            }
            if let Some(s) = &frame.stderr {
                output.write(StreamKind::Stderr, s.as_bytes()).await?;
            }
            if frame.error {
                return Err(Error::Protocol(stream::EXEC_STREAM_ERROR));
            }
            if let Some(code) = frame.exit_code {
                return Ok(code);
            }
            if ended {
                break;
            }
        }
        if ended {
            return Err(Error::Protocol(EXEC_STREAM_ENDED));
        }
    }
}

/// What `followProcess` reports to its caller.
pub enum FollowEvent {
    Connected,
    Data(StreamKind, Vec<u8>),
}

struct ChannelSink(mpsc::Sender<FollowEvent>);

impl Sink for ChannelSink {
    async fn connected(&mut self) {
        // Awaited like the data: the event is never dropped when the host is behind.
        let _ = self.0.send(FollowEvent::Connected).await;
    }

    async fn data(&mut self, stream: StreamKind, bytes: Vec<u8>) -> Result<()> {
        let _ = self.0.send(FollowEvent::Data(stream, bytes)).await;
        Ok(())
    }
}

/// Follows a process the host created itself.
pub async fn follow_process(
    cfg: &Config,
    sandbox_id: &str,
    process_id: &str,
    abort: Abort,
    events: mpsc::Sender<FollowEvent>,
) -> Result<stream::ProcessExit> {
    let client = cfg.client()?;
    let ctx = Ctx::new(abort);
    ctx.check()?;
    let mut sink = ChannelSink(events);
    let mut seen_alive = false;
    let followed =
        follow::follow(&client, sandbox_id, process_id, &ctx, &mut sink, &cfg.follow, &mut seen_alive).await?;
    Ok(followed.exit)
}

/// Destroys a sandbox and proves it gone (see [`cleanup::destroy_sandbox`]), within the
/// cleanup deadline. `Ok(())` = confirmed destroyed; else `Error::DestroyUnconfirmed`.
pub async fn destroy_sandbox(cfg: &Config, sandbox_id: &str) -> Result<()> {
    let client = cfg.client()?;
    let ctx = Ctx::cleanup(cfg.cleanup.deadline);
    // Session supervisors of the sandbox end first, with their proof, within the deadline.
    crate::session::end_sandbox(sandbox_id, &Ctx::cleanup(cfg.cleanup.deadline / 2)).await;
    let run = cleanup::destroy_sandbox(&client, sandbox_id, &ctx);
    let destroyed = AssertUnwindSafe(run).catch_unwind().await.unwrap_or_else(|_| {
        Err(Error::DestroyUnconfirmed(Box::new(crate::error::DestroyReport {
            sandbox_id: sandbox_id.to_owned(),
            attempts: Vec::new(),
            status: None,
        })))
    });
    if destroyed.is_ok() {
        crate::session::forget_unproven(&cfg.api_url, sandbox_id);
    }
    destroyed
}

/// Waits for a request slot of `api_url`'s origin (shared with every call in the process).
pub async fn wait_for_request(api_url: &str, pacing: &pacer::PacingConfig, abort: Abort) -> Result<()> {
    let origin = client::api_origin(api_url)?;
    pacer::for_budget(&origin, pacing).acquire(&Ctx::new(abort)).await
}

#[cfg(test)]
mod tests {
    use super::creation_body;
    use serde_json::json;

    #[test]
    fn the_creation_body_carries_an_absolute_cwd_as_the_typescript_module_did() {
        let body = creation_body("s".into(), Some("/work dir"));
        assert_eq!(body, json!({ "cmd": "/bin/bash", "args": ["-lc", "s"], "cwd": "/work dir" }));
        assert_eq!(creation_body("s".into(), None), json!({ "cmd": "/bin/bash", "args": ["-lc", "s"] }));
        assert_eq!(creation_body("s".into(), Some("sub")), json!({ "cmd": "/bin/bash", "args": ["-lc", "s"] }));
    }
}
