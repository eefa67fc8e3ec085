//! One supervisor: its creation (recovered as the default mode recovers a creation), the
//! task that follows its one stream for its whole life, and its end through the provider.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use futures_util::FutureExt;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::protocol;
use crate::abort::{Abort, Ctx};
use crate::cleanup::{self, CleanupPolicy, Facts, Steps};
use crate::client::{self, Body, Client, Retry};
use crate::config::Config;
use crate::create::{create_with_recovery, Created, INVALID_RESOURCE_ID};
use crate::error::{CleanupReason, CleanupReport, Error, Operation, Result};
use crate::follow::{self, FollowOptions, Sink};
use crate::script;
use crate::stream::{self, StreamKind};

/// What the supervisor's reader task passes on.
pub(super) enum Event {
    Data(StreamKind, Vec<u8>),
    /// The supervisor's exit frame (the provider's word that it exited).
    Exit,
    /// The stream failed closed (a gap, an eviction, an error frame, no connection).
    Failed(&'static str),
    /// The reader panicked: an internal error, as a panic of the default mode's follow is.
    Panicked,
}

/// Ends a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

static GENERATION: AtomicU64 = AtomicU64::new(1);

/// The settings of the client whose command a supervisor runs (or ran last): its proof
/// follows them, never those of whichever client created it.
#[derive(Clone)]
pub(super) struct Settings {
    pub policy: CleanupPolicy,
    pub idle: Duration,
}

impl Settings {
    pub fn of(cfg: &Config, idle: Duration) -> Self {
        Settings { policy: cfg.cleanup.clone(), idle }
    }
}

pub(super) struct Supervisor {
    pub generation: u64,
    /// Bumped each time it goes back to idle: an idle end armed before its last command
    /// does not end it.
    pub epoch: u64,
    pub sandbox_id: String,
    pub process_id: String,
    /// The unique path prefix its script carries (list recovery, cancel file, staged stdin).
    pub marker: String,
    /// Its own client (events to the background sink): the reader and the ends nobody waits
    /// for use it.
    pub client: Arc<Client>,
    pub settings: Settings,
    pub rx: mpsc::Receiver<Event>,
    _reader: AbortOnDrop,
    seen_alive: Arc<AtomicBool>,
    /// A command of it took stdin (its staged file may remain after a kill).
    pub stdin_used: bool,
}

impl Supervisor {
    /// Fit for another command: nothing arrived since its last command ended (no stray
    /// output, no exit, no failure).
    pub fn clean(&mut self) -> bool {
        matches!(self.rx.try_recv(), Err(mpsc::error::TryRecvError::Empty))
    }

    /// Ends its tree through the provider (DELETE, confirmed) under `ctx` with its current
    /// settings, over `client` (the caller's, or its own), and removes its staged stdin
    /// afterwards when its end says it may remain. Err = unproven: the report to give.
    pub async fn prove(&self, client: &Client, ctx: &Ctx) -> std::result::Result<(), CleanupReport> {
        let mut steps = Steps::new();
        let mut seen = self.seen_alive.load(Ordering::Relaxed);
        let policy = &self.settings.policy;
        let r =
            cleanup::terminate(client, &self.sandbox_id, &self.process_id, policy, ctx, &mut steps, &mut seen).await;
        // The supervisor's traps remove the staged stdin when it ends by an exit status (its
        // own, or the SIGTERM a DELETE starts with); a death by a signal or an unknown end may
        // have left it.
        let left = matches!(&r, Ok(script::End::Unknown | script::End::Signal(_)));
        if left && self.stdin_used {
            let (c, sb, paths, d) = (
                Arc::clone(&self.client),
                self.sandbox_id.clone(),
                vec![format!("{}.in", self.marker)],
                policy.deadline,
            );
            tokio::spawn(async move {
                let _ = AssertUnwindSafe(cleanup::remove_staged(&c, &sb, &paths, d)).catch_unwind().await;
            });
        }
        r.map(drop).map_err(|()| {
            steps.into_report(CleanupReason::TerminationUnconfirmed, &self.sandbox_id, Some(&self.process_id))
        })
    }
}

impl Supervisor {
    /// Ends a retired supervisor (its last command left processes, and the caller keeps
    /// them, as the default mode keeps a command's leftovers): one `end` record, and the
    /// provider's exit frame of the supervisor within half the deadline. Without that exit,
    /// its tree is ended through the provider ([`Supervisor::prove`]).
    pub async fn end_kept(&mut self, ctx: &Ctx) -> std::result::Result<(), CleanupReport> {
        let client = Arc::clone(&self.client);
        let path = format!("/sandboxes/{}/processes/{}/input", self.sandbox_id, self.process_id);
        let b64 = base64::engine::general_purpose::STANDARD;
        let body = json!({ "data_base64": b64.encode(b"end\n") });
        let half = self.settings.policy.deadline / 2;
        let wait = Ctx::with_deadline(ctx.abort.clone(), tokio::time::Instant::now() + half);
        let sent = client
            .json_with(Operation::ProcessInput, Method::POST, &path, Some(body), &wait, Retry::Unsent, half)
            .await;
        if sent.is_ok() {
            let exited = wait
                .run(async {
                    loop {
                        match self.rx.recv().await {
                            Some(Event::Data(..)) => {}
                            Some(Event::Exit) => return Ok(true),
                            Some(Event::Failed(_) | Event::Panicked) | None => return Ok(false),
                        }
                    }
                })
                .await;
            if matches!(exited, Ok(true)) {
                return Ok(());
            }
        }
        self.prove(&client, ctx).await
    }
}

/// Creates a supervisor and starts following it. A creation whose answer was lost is sent
/// again as in the default mode (`execute::create_with_recovery`: the list proved nothing of
/// it runs, and the lost attempt was cancelled); one that may have been applied without an
/// answer is recovered from the list (what it finds is ended). The command was never sent:
/// an error here means it did not run.
pub(super) async fn create(cfg: &Config, call: &Client, sb: &str, ctx: &Ctx, settings: Settings) -> Result<Supervisor> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let marker = format!("/tmp/createos-session-{id}");
    let idle = settings.idle;
    let body_for = |n| {
        protocol::supervisor_script(&marker, &id, n, idle).map(|s| json!({ "cmd": "/bin/bash", "args": ["-c", s] }))
    };
    let attempt = AtomicU32::new(1);
    let creation = match create_with_recovery(call, cfg, sb, &marker, &body_for, &attempt, ctx).await {
        Created::Answer(c) => c,
        Created::Settled(verdict) => return Err(verdict),
    };
    // What may have been created without an answer that names it is found in the list and
    // ended; unproven, that is the call's verdict.
    let facts = Facts { attempt: attempt.load(Ordering::Relaxed), creation_ambiguous: true, ..Facts::default() };
    let marker_ref = marker.as_str();
    let recover = |mut facts: Facts| async move {
        let cctx = Ctx::cleanup(cfg.cleanup.deadline);
        let mut steps = Steps::new();
        match cleanup::contain(call, sb, marker_ref, &mut facts, &cfg.cleanup, &cctx, &mut steps).await {
            Ok(_) => Ok(()),
            Err(f) => Err(steps.report(f.reason, sb, f.process_id.as_deref())),
        }
    };
    let data = match creation.result {
        Ok(d) => d,
        Err(err) => {
            if creation.maybe_created {
                recover(facts).await?;
            }
            return Err(err);
        }
    };
    let pid = match data.get("process_id").and_then(Value::as_str) {
        Some(pid) if client::is_identifier(pid) => pid.to_owned(),
        _ => {
            // Created, but not by a name we can end: recovered from the list.
            recover(facts).await?;
            return Err(Error::Protocol(INVALID_RESOURCE_ID));
        }
    };
    // Its own client outlives the call: its requests (the stream, its end) are published on
    // the background sink, as no call's.
    let own = Arc::new(
        Client::new(&cfg.api_url, &cfg.api_key, cfg.timeout, &cfg.pacing, &cfg.net)?
            .with_events(Some(crate::events::background())),
    );
    let seen_alive = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel(32);
    let base = format!("/sandboxes/{sb}/processes/{pid}");
    let reading = read_loop(Arc::clone(&own), base, tx.clone(), cfg.follow.clone(), Arc::clone(&seen_alive));
    let reader = tokio::spawn(async move {
        if AssertUnwindSafe(reading).catch_unwind().await.is_err() {
            let _ = tx.send(Event::Panicked).await;
        }
    });
    Ok(Supervisor {
        generation: GENERATION.fetch_add(1, Ordering::Relaxed),
        epoch: 0,
        sandbox_id: sb.to_owned(),
        process_id: pid,
        marker,
        client: own,
        settings,
        rx,
        _reader: AbortOnDrop(reader),
        seen_alive,
        stdin_used: false,
    })
}

/// Passes the stream's output on to the command being run (waiting here slows the reader,
/// never drops a chunk), and notes that the stream is alive.
struct Forward<'a> {
    tx: &'a mpsc::Sender<Event>,
    alive: bool,
}

impl Sink for Forward<'_> {
    async fn connected(&mut self) {}

    async fn data(&mut self, stream: StreamKind, bytes: Vec<u8>) -> Result<()> {
        self.tx.send(Event::Data(stream, bytes)).await.map_err(|_| Error::Cancelled)
    }

    fn received(&mut self) {
        self.alive = true;
    }
}

/// Follows the supervisor's one stream for as long as it lives: `connect?after=cursor`,
/// replayed after a disconnect, read as the default mode reads (`follow::read_stream`: a
/// reader task apart from the parser, every rule of `follow.rs`: a gap, an eviction, an
/// error frame fail closed). A budget of consecutive connects that deliver nothing (a quiet
/// stream whose heartbeats came counts as delivering: heartbeats are life).
async fn read_loop(
    client: Arc<Client>,
    base: String,
    tx: mpsc::Sender<Event>,
    opts: FollowOptions,
    seen: Arc<AtomicBool>,
) {
    let ctx = Ctx::new(Abort::new());
    let mut cursor = 0u64;
    let mut failures = 0u32;
    loop {
        let path = format!("{base}/connect?after={cursor}");
        let opened =
            client.open_stream(Operation::OutputConnection, Method::GET, &path, Body::Empty, &ctx, &mut || {}).await;
        let mut sink = Forward { tx: &tx, alive: false };
        let failed = match opened {
            Ok(resp) => match follow::read_stream(resp, &mut cursor, &ctx, &mut sink, &opts).await {
                Ok(Some(exit)) => {
                    if exit.tree_exited == Some(false) {
                        seen.store(true, Ordering::Relaxed);
                    }
                    let _ = tx.send(Event::Exit).await;
                    return;
                }
                Ok(None) => None,
                Err(Error::Protocol(m)) => Some(m),
                // The command side went away (the supervisor was dropped).
                Err(_) => return,
            },
            Err(Error::Api { status: 410, .. }) => Some(stream::OUTPUT_EVICTED),
            Err(Error::Api { status, .. }) if status < 500 && status != 429 => Some(follow::CONNECTION_FAILED),
            Err(_) => None,
        };
        if let Some(m) = failed {
            let _ = tx.send(Event::Failed(m)).await;
            return;
        }
        if sink.alive {
            failures = 0;
        } else {
            failures += 1;
        }
        if failures > opts.max_reconnects {
            let _ = tx.send(Event::Failed(follow::CONNECTION_FAILED)).await;
            return;
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(opts.reconnect_delay).await;
    }
}
