//! Session mode (`config.session`): a command is one `POST …/input` to a long-lived
//! supervisor, and its output and exit come back over the supervisor's one open stream.
//!
//! - `protocol.rs`: the records and markers, and the supervisor's script
//!   (`supervisor.sh`).
//! - `supervisor.rs`: one supervisor: its creation, the task following its stream, its proof.
//! - `registry.rs`: leases and their supervisors, the ends nobody waits for, the sandboxes
//!   whose end could not be proven.
//! - here: the command path.
//!
//! **The supervisor** is `/bin/bash -c <script>`, a managed process created like any other
//! (its first line names the creation attempt and its marker path, so a lost creation is
//! recovered from the process list as in the default mode). It reads one record per line
//! from its stdin — `<token> <script, \xHH-escaped> <base64 stdin | ->`, the script being
//! `script.rs`'s `command_script` — and runs the command as `/bin/bash -lc <script>` **in the
//! foreground, in its own process group**: a DELETE that signals the leader's process group
//! (the least the API promises) reaches the command and everything it started that stayed in
//! the group, exactly as in the default mode (where the command is the leader); the signal
//! dispositions are the default mode's (no SIGINT or SIGQUIT ignored, as bash does for
//! `cmd &`). Its stdin is the decoded file, open and already unlinked when the command
//! starts, or `/dev/null` (never the supervisor's own). Before the command it writes a begin
//! marker on both streams, after it an end marker with the token, the wait status and
//! whether anything of the command is still alive:
//!
//! ```text
//! \0 \x1e cos-begin:<token> \n                     (stdout and stderr)
//! \0 \x1e cos-end:<token>:<status>:<0|1> \n        (stdout and stderr)
//! ```
//!
//! **Leftovers.** Every command carries `CREATEOS_SESSION_ID=<the supervisor's id>` in its
//! environment, which what it starts inherits; after the command the supervisor looks for a
//! process that carries it (`/proc/*/environ`), so a process that left the group (a `setsid`
//! daemon, a double fork) is seen too. Output after the end marker counts as a leftover as
//! well. A command with leftovers never hands its supervisor to another command: with
//! `leftoverProcesses: 'terminate'` the supervisor's tree is ended through the provider's
//! proof (`containment: 'provider'`; a leftover out of the DELETE's reach fails the proof, as
//! it does in the default mode); with `'keep'` the supervisor is retired and ended with the
//! proof after `idleMs`.
//!
//! **Trust.** The supervisor runs as the commands' user: a command can kill it, write to its
//! stdout or read its memory. Its word decides only the cheap path of a normal exit with no
//! leftover (`containment: 'supervisor'`). Everything else — a timeout, an abort, a stream
//! error or gap, the supervisor's exit, a marker that is malformed, carries another token or
//! has bytes before it, an input request that failed, the two streams' markers disagreeing,
//! stray output between commands, a panic — ends the supervisor's tree through the provider
//! (`Supervisor::prove`: DELETE, confirmed, under the caller's cleanup settings), the session
//! ends, and the next command starts a new one.
//!
//! **At most once.** A record is sent once: `input` is sent again only where no connection
//! was made (`Retry::Unsent`), and the supervisor never runs a token it has already run.

mod protocol;
mod registry;
mod supervisor;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use futures_util::FutureExt;
use reqwest::Method;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

pub use protocol::{MARKER_INVALID, MAX_RECORD_BYTES, SESSION_ENV, SUPERVISOR_ENDED, SUPERVISOR_SCRIPT};
pub use registry::{end_all_blocking, end_sandbox, forget_unproven, unproven, MAX_PER_LEASE, UNPROVEN_CODE};

use crate::abort::{Abort, Ctx};
use crate::client::{self, Client, Retry};
use crate::config::{Config, Leftover, Params, DEFAULT_SESSION_IDLE};
use crate::error::{Error, Operation, Result, PANIC};
use crate::follow;
use crate::output::{self, LogLine, Output};
use crate::result::{self, ExecuteResult};
use crate::stream::{ProcessExit, StreamKind};
use crate::warnings::{self, Warning};
use protocol::Lane;
use registry::{Lease, Taken};
use supervisor::{Event, Settings, Supervisor};

/// A command's record line and token ([`protocol::record`]).
pub struct Record {
    line: String,
    token: String,
}

/// The warning of a session that was asked for and runs a command in the default mode.
pub const NOT_APPLIED_CODE: &str = "CREATEOS_SESSION_NOT_APPLIED";

/// Why a session asked for does not apply; each is told once per process.
#[derive(Clone, Copy)]
enum NotApplied {
    HostFetch,
    LegacyCleanup,
    TooLarge,
}

fn warn_once(why: NotApplied) {
    static TOLD: [AtomicBool; 3] = [AtomicBool::new(false), AtomicBool::new(false), AtomicBool::new(false)];
    let (i, message) = match why {
        NotApplied::HostFetch => (0, "createos-execute: config.session is on, but requests go through the host's fetch: commands run in the default mode (a supervisor outlives the call whose fetch it would use)."),
        NotApplied::LegacyCleanup => (1, "createos-execute: config.session is on, but legacyCleanup is set: commands run in the default mode."),
        NotApplied::TooLarge => (2, "createos-execute: config.session is on, but a command's script and stdin exceed one input record (96 KiB): such commands run in the default mode."),
    };
    if !TOLD[i].swap(true, Ordering::Relaxed) {
        warnings::warn(Warning::fixed(NOT_APPLIED_CODE, message));
    }
}

/// The record to run this call in session mode, or `None` for the default mode: the session
/// is configured, the command did not opt out (`bypassSession`), over the native transport
/// (the host's `fetch` belongs to one call, a supervisor outlives it), without
/// `legacyCleanup`, and its record fits one input. A session asked for that cannot apply is
/// told once ([`NOT_APPLIED_CODE`]); an input error is left to the default mode, which
/// reports it before anything is sent.
pub fn applies(cfg: &Config, params: &Params) -> Option<Record> {
    if cfg.session.is_none() || params.bypass_session {
        return None;
    }
    let not = if cfg.host_fetch.is_some() {
        Some(NotApplied::HostFetch)
    } else if cfg.cleanup.legacy {
        Some(NotApplied::LegacyCleanup)
    } else {
        match protocol::record(params) {
            Ok(Some((line, token))) => return Some(Record { line, token }),
            Ok(None) => Some(NotApplied::TooLarge),
            Err(_) => None,
        }
    };
    if let Some(why) = not {
        warn_once(why);
    }
    None
}

/// How one command on a supervisor ended.
enum Ran {
    /// Both end markers, in agreement: the supervisor's word. `leftover`: something of the
    /// command may still be alive (its scan, or output after the end marker).
    Exited { exit: ProcessExit, leftover: bool },
    /// Anything else: the supervisor's tree must be ended through the provider, then this
    /// is the call's outcome (an abort, or an error).
    Doubt(Error),
    /// The input provably never reached the supervisor (`client::never_applied`) and nothing
    /// came of it: the command did not run, the supervisor is as it was.
    Refused(Error),
}

/// Sends the record and reads the command's output and end markers off the stream.
async fn run_one(
    call: &Client,
    request_timeout: Duration,
    sup: &mut Supervisor,
    rec: &Record,
    ctx: &Ctx,
    output: &mut Output,
) -> Ran {
    let b64 = base64::engine::general_purpose::STANDARD;
    let body = json!({ "data_base64": b64.encode(format!("{}\n", rec.line).as_bytes()) });
    let path = format!("/sandboxes/{}/processes/{}/input", sup.sandbox_id, sup.process_id);
    let post =
        call.json_with(Operation::ProcessInput, Method::POST, &path, Some(body), ctx, Retry::Unsent, request_timeout);
    let mut post = std::pin::pin!(post);
    let mut posted: Option<Result<Map<String, Value>>> = None;
    let (mut out, mut err) = (Lane::default(), Lane::default());
    loop {
        if let (Some((rc_o, left_o)), Some((rc_e, left_e))) = (out.end, err.end) {
            // The input's answer is awaited too: a failed input is doubt even after markers.
            let answered = match posted.take() {
                Some(r) => r,
                None => post.as_mut().await,
            };
            if let Err(e) = answered {
                return Ran::Doubt(e);
            }
            if (rc_o, left_o) != (rc_e, left_e) {
                return Ran::Doubt(Error::Protocol(MARKER_INVALID));
            }
            let leftover = left_o || out.trailing || err.trailing;
            return Ran::Exited { exit: protocol::exit_of(rc_o), leftover };
        }
        let next = tokio::select! {
            biased;
            () = ctx.abort.aborted() => return Ran::Doubt(ctx.abort.error()),
            r = post.as_mut(), if posted.is_none() => {
                if let Err(e) = r {
                    let quiet = !out.begun() && !err.begun();
                    return if quiet && client::never_applied(&e) { Ran::Refused(e) } else { Ran::Doubt(e) };
                }
                posted = Some(r);
                continue;
            }
            ev = sup.rx.recv() => ev,
        };
        match next {
            Some(Event::Data(kind, bytes)) => {
                let lane = match kind {
                    StreamKind::Stdout => &mut out,
                    StreamKind::Stderr => &mut err,
                    StreamKind::Pty => return Ran::Doubt(Error::Protocol(MARKER_INVALID)),
                };
                let Ok(text) = lane.push(&bytes, &rec.token) else {
                    return Ran::Doubt(Error::Protocol(MARKER_INVALID));
                };
                if !text.is_empty() {
                    let stream = match output::pipe_stream(kind) {
                        Ok(s) => s,
                        Err(e) => return Ran::Doubt(e),
                    };
                    if let Err(e) = output.write(stream, &text).await {
                        return Ran::Doubt(e);
                    }
                }
            }
            Some(Event::Exit) => return Ran::Doubt(Error::Protocol(SUPERVISOR_ENDED)),
            Some(Event::Failed(m)) => return Ran::Doubt(Error::Protocol(m)),
            Some(Event::Panicked) => return Ran::Doubt(Error::Internal(PANIC)),
            None => return Ran::Doubt(Error::Protocol(follow::CONNECTION_FAILED)),
        }
    }
}

/// Takes a clean idle supervisor of the lease (now under the caller's settings), or creates
/// one (within [`MAX_PER_LEASE`]), or waits for a slot under the caller's signal.
async fn checkout(
    cfg: &Config,
    call: &Client,
    sb: &str,
    ctx: &Ctx,
    settings: &Settings,
) -> Result<(Arc<Lease>, Supervisor)> {
    loop {
        // Looked up on every round: a lease that emptied left the registry meanwhile.
        let lease = registry::lease_for(cfg, sb)?;
        let freed = lease.freed();
        let mut freed = std::pin::pin!(freed);
        freed.as_mut().enable();
        match lease.take() {
            Taken::Idle(mut sup) => {
                sup.settings = settings.clone();
                return Ok((Arc::clone(&lease), sup));
            }
            Taken::Slot => {
                let made = AssertUnwindSafe(Box::pin(supervisor::create(cfg, call, sb, ctx, settings.clone())))
                    .catch_unwind()
                    .await
                    .unwrap_or(Err(Error::Internal(PANIC)));
                return match made {
                    Ok(sup) => Ok((Arc::clone(&lease), sup)),
                    Err(e) => {
                        lease.done();
                        Err(e)
                    }
                };
            }
            Taken::Full => {
                ctx.run(async {
                    freed.await;
                    Ok(())
                })
                .await?;
            }
        }
    }
}

/// Runs one command in session mode (see the module doc). Resolves and rejects as
/// `execute::execute` does; `metadata.containment` says whose word the result rests on.
pub async fn execute(
    cfg: &Config,
    params: &Params,
    rec: Record,
    abort: Abort,
    log: Option<mpsc::Sender<LogLine>>,
) -> Result<ExecuteResult> {
    let idle = cfg.session.as_ref().map_or(DEFAULT_SESSION_IDLE, |s| s.idle);
    let call = Arc::new(cfg.client()?);
    let ctx = Ctx::new(abort.clone());
    let mut output = Output::new(log);
    let sb = params.sandbox_id.as_str();
    if abort.is_aborted() {
        return result::aborted(&abort, output.finish().await, None, None);
    }
    let settings = Settings::of(cfg, idle);
    let (lease, mut sup) = match Box::pin(checkout(cfg, &call, sb, &ctx, &settings)).await {
        Ok(s) => s,
        Err(e) if e.is_abort() && abort.is_aborted() => {
            return result::aborted(&abort, output.finish().await, None, None)
        }
        Err(e) => return Err(e),
    };
    sup.stdin_used |= params.stdin.is_some();
    let ran = AssertUnwindSafe(Box::pin(run_one(&call, cfg.timeout, &mut sup, &rec, &ctx, &mut output)))
        .catch_unwind()
        .await
        .unwrap_or(Ran::Doubt(Error::Internal(PANIC)));
    let pid = sup.process_id.clone();
    // Ends the supervisor through the provider under the caller's settings; the lease's slot
    // is given back once the verdict is in.
    let prove = |sup: Supervisor| {
        let (call, lease) = (Arc::clone(&call), Arc::clone(&lease));
        let (sb, pid) = (sup.sandbox_id.clone(), sup.process_id.clone());
        async move {
            let ctx = Ctx::cleanup(sup.settings.policy.deadline);
            let proved = AssertUnwindSafe(Box::pin(sup.prove(&call, &ctx))).catch_unwind().await;
            drop(sup);
            lease.done();
            match proved {
                Ok(Ok(())) => Ok(()),
                Ok(Err(report)) => Err(Error::Cleanup(Box::new(report))),
                Err(_) => Err(Error::Cleanup(Box::new(crate::error::CleanupReport {
                    reason: crate::error::CleanupReason::TerminationUnconfirmed,
                    sandbox_id: sb,
                    process_id: Some(pid),
                    attempts: Vec::new(),
                }))),
            }
        }
    };
    match ran {
        Ran::Exited { exit, leftover } => {
            let (tree_exited, containment) = if !leftover {
                registry::release(&lease, sup);
                (Some(true), "supervisor")
            } else if cfg.leftover == Leftover::Terminate {
                prove(sup).await?;
                (Some(true), "provider")
            } else {
                registry::retire(&lease, sup);
                (Some(false), "supervisor")
            };
            let captured = output.finish().await;
            Ok(ExecuteResult {
                exit_code: exit.exit_code,
                signal: exit.signal,
                timed_out: false,
                stdout: captured.stdout,
                stderr: captured.stderr,
                process_id: Some(pid),
                output_truncated: captured.truncated,
                tree_exited,
                containment: Some(containment),
            })
        }
        Ran::Refused(err) => {
            registry::release(&lease, sup);
            Err(err)
        }
        Ran::Doubt(err) => {
            prove(sup).await?;
            if err.is_abort() && abort.is_aborted() {
                return result::aborted(&abort, output.finish().await, Some(pid), Some(true))
                    .map(|r| ExecuteResult { containment: Some("provider"), ..r });
            }
            Err(err)
        }
    }
}
