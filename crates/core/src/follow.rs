//! Following a managed process's output: `connect?after=<cursor>`, reconnect and replay,
//! sequence checks, and exit recovery through `wait?scope=tree`.
//!
//! Rules (fail closed): a frame's `seq` must be `cursor + 1` (duplicates `<= cursor` are
//! skipped, anything else is a gap); an `error` frame, HTTP 410, invalid base64 or an invalid
//! `seq` end the follow with an error.
//!
//! Reconnects: a stream that ends or breaks without an exit frame is reconnected from the
//! cursor. The budget, [`FollowOptions::max_reconnects`], counts *consecutive attempts that
//! delivered nothing new*: a connect that advanced the cursor resets it, so a stream cut every
//! few frames is followed to its end however often it is cut. Once the budget is spent, the
//! exit is recovered with `wait?scope=tree` — and the stream is still read meanwhile (the
//! long-poll runs alongside the reconnects, never instead of them), so a chatty command's
//! output is not evicted from the journal while the follower waits. The recovered exit is
//! accepted only when the journal's `newest_seq` equals the cursor; a missing tail gets one
//! more round of replays.
//!
//! An exit frame is accepted only when every data frame before it was delivered: its
//! `newest_seq` (or, when the frame has none, the process record's `output.newest_seq`) must
//! equal the cursor. A missing tail — the last frames lost before the exit — is replayed by
//! reconnecting from the cursor, never silently dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::abort::Ctx;
use crate::client::{Body, Client, Retry};
use crate::error::{Error, Operation, Result};
use crate::hooks::{self, Phase};
use crate::stream::{self, LineSplitter, ProcessExit, ProcessFrame, StreamKind};

pub const CONNECTION_FAILED: &str = "CreateOS process output connection failed.";
pub const REPLAY_INCOMPLETE: &str = "CreateOS process stream ended before all output could be replayed.";
pub const JOURNAL_INVALID: &str = "CreateOS process output journal is invalid.";
pub const SEQUENCE_GAP: &str = "CreateOS process output has a sequence gap.";

/// Where followed output goes.
pub trait Sink: Send {
    /// A connect request, past the pacer, is being handed to the connection.
    fn sending(&mut self) {}
    /// The stream is attached (called on every successful connect; waiting here slows the
    /// reader, so an event is never dropped).
    fn connected(&mut self) -> impl Future<Output = ()> + Send;
    /// One chunk of output, in sequence order. Waiting here slows the reader.
    fn data(&mut self, stream: StreamKind, bytes: Vec<u8>) -> impl Future<Output = Result<()>> + Send;
    /// Bytes arrived on the stream (a heartbeat counts): it is alive.
    fn received(&mut self) {}
}

#[derive(Debug, Clone)]
pub struct FollowOptions {
    /// How many consecutive connects that deliver nothing new are tolerated before the exit
    /// is recovered through `wait` (a connect that advances the cursor resets the count).
    pub max_reconnects: u32,
    pub reconnect_delay: Duration,
    /// A stream that carries no byte (not even a heartbeat) for this long is treated as broken.
    pub idle_timeout: Duration,
    /// Long-poll budget of one `wait` request.
    pub wait_timeout_ms: u64,
    /// How many `wait` long-polls answering 408 are tolerated in one recovery.
    pub max_wait_polls: u32,
    /// Per-request timeout for `wait` beyond its long-poll budget.
    pub request_timeout: Duration,
    /// Test hook (`test-hooks` feature only): panic at this phase.
    pub panic_at: Option<Phase>,
}

impl Default for FollowOptions {
    fn default() -> Self {
        FollowOptions {
            max_reconnects: 3,
            reconnect_delay: Duration::from_millis(250),
            idle_timeout: Duration::from_secs(30),
            wait_timeout_ms: 30_000,
            max_wait_polls: 20,
            request_timeout: Duration::from_secs(30),
            panic_at: None,
        }
    }
}

/// How the followed process ended, and whether its tree had exited (when the server said).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Followed {
    pub exit: ProcessExit,
    pub tree_exited: Option<bool>,
}

fn process_path(sandbox_id: &str, process_id: &str) -> String {
    format!("/sandboxes/{sandbox_id}/processes/{process_id}")
}

type Recovery<'a> = Pin<Box<dyn Future<Output = Result<(Followed, u64)>> + Send + 'a>>;

/// What one connect attempt gave.
enum Attempt {
    /// An exit frame (completeness not yet checked).
    Exit(ExitFrame),
    /// The stream opened, then ended or broke without an exit frame.
    Broken,
    /// The connect failed (no stream).
    NotOpened,
}

/// Follows `process_id` until its exit, delivering every output byte exactly once, in order.
///
/// `seen_alive` is set when an answer says the tree was alive (an exit frame or the process
/// record with `tree_exited: false`, a 408 from `wait?scope=tree`), whatever the outcome:
/// the cleanup that follows an error must know it.
pub async fn follow(
    client: &Client,
    sandbox_id: &str,
    process_id: &str,
    ctx: &Ctx,
    sink: &mut impl Sink,
    opts: &FollowOptions,
    seen_alive: &mut bool,
) -> Result<Followed> {
    let seen = AtomicBool::new(*seen_alive);
    let r = follow_seen(client, sandbox_id, process_id, ctx, sink, opts, &seen).await;
    *seen_alive = seen.load(Ordering::Relaxed);
    r
}

/// Marks the tree as seen alive when `tree_exited` says so.
fn note(seen: &AtomicBool, tree_exited: Option<bool>) {
    if tree_exited == Some(false) {
        seen.store(true, Ordering::Relaxed);
    }
}

async fn follow_seen(
    client: &Client,
    sandbox_id: &str,
    process_id: &str,
    ctx: &Ctx,
    sink: &mut impl Sink,
    opts: &FollowOptions,
    seen: &AtomicBool,
) -> Result<Followed> {
    let base = process_path(sandbox_id, process_id);
    let mut cursor: u64 = 0;
    // Consecutive attempts that delivered nothing new.
    let mut failures = 0u32;
    let mut recovered: Option<(Followed, u64)> = None;
    // The exit recovery in flight (`wait?scope=tree`), polled alongside the reads.
    let mut waiting: Option<Recovery<'_>> = None;
    loop {
        ctx.check()?;
        let before = cursor;
        let attempt = connect_once(client, &base, &mut cursor, ctx, sink, opts);
        let mut waited = None;
        let outcome = match waiting.as_mut() {
            None => attempt.await,
            Some(w) => {
                tokio::pin!(attempt);
                loop {
                    tokio::select! {
                        biased;
                        r = &mut attempt => break r,
                        res = w.as_mut(), if waited.is_none() => waited = Some(res),
                    }
                }
            }
        };
        if waited.is_some() {
            waiting = None;
        }
        let opened = match outcome? {
            Attempt::Exit(exit) => {
                note(seen, exit.tree_exited);
                let (done, newest) = Box::pin(complete(client, &base, exit, cursor, ctx, seen)).await?;
                if newest < cursor {
                    return Err(Error::Protocol(JOURNAL_INVALID));
                }
                if newest == cursor {
                    return Ok(done);
                }
                // Frames before the exit are missing: replay them from the cursor.
                recovered = Some((done, newest));
                true
            }
            Attempt::Broken => true,
            Attempt::NotOpened => false,
        };
        match waited {
            Some(Ok((done, newest))) => {
                if newest < cursor {
                    return Err(Error::Protocol(JOURNAL_INVALID));
                }
                recovered = Some((done, newest));
            }
            // The streams deliver again: a recovery that gave up (e.g. its long-polls ran out on
            // a long command) is not needed; a new one starts if the budget is spent again.
            Some(Err(_)) if cursor > before => {}
            Some(Err(e)) => return Err(e),
            None => {}
        }
        if let Some((done, newest)) = &recovered {
            if cursor == *newest {
                return Ok(done.clone());
            }
        }
        if cursor > before {
            failures = 0;
        } else {
            failures += 1;
        }
        if failures > opts.max_reconnects {
            if recovered.is_some() {
                return Err(Error::Protocol(REPLAY_INCOMPLETE));
            }
            if let Some(w) = waiting.take() {
                // The streams deliver nothing more: only the recovery can end this.
                let (done, newest) = w.await?;
                if newest < cursor {
                    return Err(Error::Protocol(JOURNAL_INVALID));
                }
                if newest == cursor {
                    return Ok(done);
                }
                // The tree is gone and its journal is final: one more round of replays may
                // still deliver the missing tail.
                recovered = Some((done, newest));
                failures = 0;
                ctx.sleep(Duration::from_secs(1)).await?;
                continue;
            }
            if !opened {
                return Err(Error::Protocol(CONNECTION_FAILED));
            }
            waiting = Some(Box::pin(recover_exit(client, &base, ctx, opts, seen)));
            failures = 0;
        }
        ctx.sleep(opts.reconnect_delay).await?;
    }
}

/// One connect and read, from the cursor.
async fn connect_once(
    client: &Client,
    base: &str,
    cursor: &mut u64,
    ctx: &Ctx,
    sink: &mut impl Sink,
    opts: &FollowOptions,
) -> Result<Attempt> {
    // Boxed: freed once the stream is open, so an idle follow holds only its reader.
    let opened = Box::pin(client.open_stream(
        Operation::OutputConnection,
        Method::GET,
        &format!("{base}/connect?after={cursor}"),
        Body::Empty,
        ctx,
        &mut || sink.sending(),
    ))
    .await;
    match opened {
        Ok(resp) => {
            sink.connected().await;
            Ok(match read_stream(resp, cursor, ctx, sink, opts).await? {
                Some(exit) => Attempt::Exit(exit),
                None => Attempt::Broken,
            })
        }
        Err(Error::Api { status: 410, .. }) => Err(Error::Protocol(stream::OUTPUT_EVICTED)),
        Err(e @ Error::Api { status, .. }) if status < 500 && status != 429 => Err(e),
        Err(
            e @ (Error::Redirect { .. }
            | Error::Unmatched { .. }
            | Error::Cancelled
            | Error::TimedOut
            | Error::Input(_)),
        ) => Err(e),
        Err(_) => Ok(Attempt::NotOpened),
    }
}

/// An exit frame, before its completeness is checked.
pub(crate) struct ExitFrame {
    pub(crate) exit: ProcessExit,
    pub(crate) tree_exited: Option<bool>,
    newest_seq: Option<u64>,
}

/// The exit and the journal's last seq: from the frame, or (when the frame does not carry
/// `newest_seq`, the documented minimum) from the process record, which also fills a missing
/// `tree_exited`. The exit frame is the command's result: a record that cannot be had within
/// [`VERIFY_BUDGET`] (no answer, an error, an abort meanwhile), or that does not say
/// `newest_seq`, leaves the completeness and the tree unverified (`tree_exited: None`), never
/// turns the result into an error.
async fn complete(
    client: &Client,
    base: &str,
    frame: ExitFrame,
    cursor: u64,
    ctx: &Ctx,
    seen: &AtomicBool,
) -> Result<(Followed, u64)> {
    let followed = |tree_exited| Followed { exit: frame.exit.clone(), tree_exited };
    if let Some(newest) = frame.newest_seq {
        return Ok((followed(frame.tree_exited), newest));
    }
    let verify = Ctx::with_deadline(ctx.abort.clone(), tokio::time::Instant::now() + VERIFY_BUDGET);
    let Ok(record) = client.json(Operation::ProcessStatus, Method::GET, base, None, &verify).await else {
        return Ok((followed(frame.tree_exited), cursor));
    };
    let record_tree = record.get("tree_exited").and_then(Value::as_bool);
    note(seen, record_tree);
    let tree_exited = frame.tree_exited.or(record_tree);
    match newest_seq(&record) {
        Some(newest) => Ok((followed(tree_exited), newest)),
        None => Ok((followed(tree_exited), cursor)),
    }
}

/// The most the verification of an exit (the process record) may take.
pub const VERIFY_BUDGET: Duration = Duration::from_secs(10);

/// How many body chunks the reader task may read ahead of the parser (bounded memory: a
/// chunk is at most a few tens of KiB).
const READ_AHEAD: usize = 32;

/// How much of a body is read by the parsing task itself before a reader task takes over. A
/// command that prints little (most, and every idle one) never pays for the reader task and
/// its queue (about 2 KB while it waits; docs/benchmarks.md §14); one that streams a lot gets
/// the overlap after its first [`INLINE_BYTES`].
const INLINE_BYTES: usize = 256 * 1024;

type Chunk = std::result::Result<bytes::Bytes, crate::transport::BodyBroken>;

/// Where a followed body's chunks come from: read inline, then (past [`INLINE_BYTES`]) from a
/// reader task through a bounded queue.
enum Source {
    Inline(crate::transport::BodyStream, usize),
    /// The reader task is aborted when this is dropped.
    Ahead {
        rx: mpsc::Receiver<Chunk>,
        _reader: AbortOnDrop,
    },
}

impl Source {
    async fn next(&mut self) -> Option<Chunk> {
        match self {
            Source::Inline(stream, _) => stream.next().await,
            Source::Ahead { rx, .. } => rx.recv().await,
        }
    }

    /// Counts a chunk read inline; past [`INLINE_BYTES`] the body moves to a reader task.
    fn account(self, len: usize) -> Self {
        match self {
            Source::Inline(mut stream, read) if read + len >= INLINE_BYTES => {
                let (tx, rx) = mpsc::channel(READ_AHEAD);
                let reader = AbortOnDrop(tokio::spawn(async move {
                    while let Some(chunk) = stream.next().await {
                        let broke = chunk.is_err();
                        if tx.send(chunk).await.is_err() || broke {
                            break;
                        }
                    }
                }));
                Source::Ahead { rx, _reader: reader }
            }
            Source::Inline(stream, read) => Source::Inline(stream, read + len),
            ahead => ahead,
        }
    }
}

/// Ends a task when dropped (the reader of a connection we stopped following).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reads one connection. `Ok(Some)` on an exit frame, `Ok(None)` when the connection ended
/// or broke without one, `Err` on a protocol violation or an abort.
///
/// Past its first [`INLINE_BYTES`], a reader task receives the body while this task parses
/// and captures (the two overlap, on two cores); the bounded channel between them keeps
/// backpressure intact.
pub(crate) async fn read_stream(
    resp: crate::transport::Response,
    cursor: &mut u64,
    ctx: &Ctx,
    sink: &mut impl Sink,
    opts: &FollowOptions,
) -> Result<Option<ExitFrame>> {
    let idle = opts.idle_timeout;
    let mut body = Source::Inline(resp.into_body(), 0);
    let mut lines = LineSplitter::new();
    loop {
        let next = ctx.run(async { Ok(tokio::time::timeout(idle, body.next()).await) }).await?;
        let chunk = match next {
            Err(_) => return Ok(None),           // idle: treat as broken
            Ok(None) => break,                   // ended
            Ok(Some(Err(_))) => return Ok(None), // broke
            Ok(Some(Ok(c))) => c,
        };
        body = body.account(chunk.len());
        sink.received();
        lines.push(&chunk);
        while let Some(line) = lines.next_line()? {
            if let Some(done) = handle_line(&line, cursor, sink).await? {
                return Ok(Some(done));
            }
            if *cursor > 0 {
                hooks::panic_at(opts.panic_at, Phase::Follow);
            }
        }
    }
    if let Some(line) = lines.finish()? {
        if let Some(done) = handle_line(&line, cursor, sink).await? {
            return Ok(Some(done));
        }
    }
    Ok(None)
}

async fn handle_line(line: &[u8], cursor: &mut u64, sink: &mut impl Sink) -> Result<Option<ExitFrame>> {
    let Some(payload) = stream::payload(line) else { return Ok(None) };
    match stream::parse_process_frame(payload)? {
        ProcessFrame::Heartbeat => Ok(None),
        ProcessFrame::Data { seq, stream, bytes } => {
            if seq <= *cursor {
                return Ok(None);
            }
            if Some(seq) != cursor.checked_add(1) {
                return Err(Error::Protocol(SEQUENCE_GAP));
            }
            sink.data(stream, bytes).await?;
            *cursor = seq;
            Ok(None)
        }
        ProcessFrame::Exit { exit, tree_exited, newest_seq } => Ok(Some(ExitFrame { exit, tree_exited, newest_seq })),
        ProcessFrame::Error { evicted: true } => Err(Error::Protocol(stream::OUTPUT_EVICTED)),
        ProcessFrame::Error { evicted: false } => Err(Error::Protocol(stream::STREAM_ERROR)),
    }
}

/// Long-polls `wait?scope=tree` (408 = still running, ask again; bounded) and returns the
/// exit and the journal's `newest_seq`.
async fn recover_exit(
    client: &Client,
    base: &str,
    ctx: &Ctx,
    opts: &FollowOptions,
    seen: &AtomicBool,
) -> Result<(Followed, u64)> {
    let path = format!("{base}/wait?scope=tree&timeout_ms={}", opts.wait_timeout_ms);
    let timeout = Duration::from_millis(opts.wait_timeout_ms).saturating_add(opts.request_timeout);
    let mut polls = 0;
    let data = loop {
        match client.json_with(Operation::ProcessStatus, Method::GET, &path, None, ctx, Retry::Safe, timeout).await {
            Ok(d) => break d,
            Err(e @ Error::Api { status: 408, .. }) => {
                // Still running: the tree was alive.
                seen.store(true, Ordering::Relaxed);
                if polls >= opts.max_wait_polls {
                    return Err(e);
                }
                polls += 1;
            }
            Err(e) => return Err(e),
        }
    };
    note(seen, data.get("tree_exited").and_then(Value::as_bool));
    let newest = newest_seq(&data).ok_or(Error::Protocol(JOURNAL_INVALID))?;
    let exit =
        stream::exit_status(data.get("exit_code").unwrap_or(&Value::Null), data.get("signal").unwrap_or(&Value::Null))?;
    Ok((Followed { exit, tree_exited: data.get("tree_exited").and_then(Value::as_bool) }, newest))
}

fn newest_seq(process: &Map<String, Value>) -> Option<u64> {
    let n = process.get("output")?.get("newest_seq")?;
    let v = n.as_u64()?;
    (v <= 9_007_199_254_740_991).then_some(v)
}
