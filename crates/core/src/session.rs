//! Session mode (`config.session`): a command is one `POST …/input` to a long-lived
//! supervisor, and its output and exit come back over the supervisor's one open stream.
//!
//! **The supervisor** (`session/supervisor.sh`) is `/bin/bash -c <script>`, a managed process
//! created like any other (its first line names the creation attempt and its marker path, so
//! an ambiguous creation is recovered from the process list as in the default mode). It reads
//! one record per line from its stdin — `<token> <script, \xHH-escaped> <base64 stdin | ->`,
//! the script being `script.rs`'s `command_script` — and runs the command with
//! `setsid /bin/bash -lc <script>` in a process group of its own, stdin from the decoded file
//! or `/dev/null` (never its own stdin), stdout and stderr its own (the bytes are never
//! re-encoded in the sandbox). Before the command it writes a begin marker on both streams,
//! after it an end marker with the token, the wait status and whether the command's group
//! still has members:
//!
//! ```text
//! \0 \x1e cos-begin:<token> \n                     (stdout and stderr)
//! \0 \x1e cos-end:<token>:<status>:<0|1> \n        (stdout and stderr)
//! ```
//!
//! The client strips the markers from each stream (they may arrive split across frames, and
//! the command's output need not end with a newline: the end marker is found by its prefix,
//! wherever it starts). The token is 128 random bits, new per command.
//!
//! **Trust.** The supervisor runs as the commands' user: a command can kill it, write to its
//! stdout or read its memory. Its word decides only the cheap path of a normal exit
//! (`containment: 'supervisor'`). Everything else — a timeout, an abort, a stream error or
//! gap, the supervisor's exit, a marker that is malformed, carries another token, or has
//! bytes before or after it, an input request that failed, the two streams' markers
//! disagreeing, stray output between commands — ends the supervisor's tree through the
//! provider (`cleanup::terminate`: DELETE, confirmed; `containment: 'provider'`), the session
//! ends, and the next command starts a new one.
//!
//! **Leftovers.** `leftoverProcesses: 'terminate'` and a command that left members in its
//! group: the session ends through the provider's proof. With `'keep'` the supervisor is
//! retired (never given another command, whose output would mix with the leftovers') and
//! ended with the proof after `session.idleMs`.
//!
//! **Concurrency.** One command at a time per supervisor; up to [`MAX_PER_LEASE`]
//! supervisors per (API origin, key, sandbox), then a command waits (under its signal) for one
//! to become free. An idle supervisor is ended with the proof after `session.idleMs` (a tokio
//! timer: it never keeps Node alive); `destroySandbox` ends a sandbox's supervisors first, and
//! an environment's teardown ends every idle one within its bounded wait.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use futures_util::{FutureExt, StreamExt};
use reqwest::Method;
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, Notify};

use crate::abort::{Abort, Ctx};
use crate::cleanup::{self, CleanupPolicy, Facts, Steps};
use crate::client::{self, Body, Client, Retry};
use crate::config::{Config, Leftover, Params};
use crate::error::{CleanupReason, Error, Operation, Result, PANIC};
use crate::execute::ExecuteResult;
use crate::follow::{self, FollowOptions};
use crate::output::{self, LogLine, Output};
use crate::script;
use crate::stream::{self, LineSplitter, ProcessExit, ProcessFrame, StreamKind};

pub const INVALID_SESSION: &str = "session must be true, false or an object { idleMs }.";
pub const INVALID_SESSION_IDLE: &str = "session.idleMs must be an integer between 1000 and 3600000.";
/// The supervisor exited (a command killed it, or it refused a record) before the command's
/// end marker: the command's exit is unknown. Its tree was ended and proven gone.
pub const SUPERVISOR_ENDED: &str = "CreateOS session supervisor ended before the command's exit status.";
/// A marker was malformed, carried another token, or had output before or after it.
pub const MARKER_INVALID: &str = "CreateOS session marker is invalid.";

/// The idle time of `session: true`.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(30);
/// Supervisors per lease (API origin, key, sandbox).
pub const MAX_PER_LEASE: usize = 4;
/// The largest record (script and stdin, base64) sent as one input; a bigger command runs
/// in the default mode.
pub const MAX_RECORD_BYTES: usize = 96 * 1024;

/// The supervisor script (see the module doc).
pub const SUPERVISOR_SCRIPT: &str = include_str!("session/supervisor.sh");

const BEGIN: &[u8] = b"\0\x1ecos-begin:";
const END: &[u8] = b"\0\x1ecos-end:";
/// The longest end marker after its prefix: token, `:`, status (≤ 3 digits), `:`, flag, `\n`.
const END_TAIL_MAX: usize = 32 + 1 + 3 + 1 + 1 + 1;

/// `config.session`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOptions {
    pub idle: Duration,
}

/// `session`: absent, null or false = off; true = on with [`DEFAULT_IDLE`]; `{ idleMs }`.
pub fn parse(v: Option<&Value>) -> Result<Option<SessionOptions>> {
    match v {
        None | Some(Value::Null | Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(SessionOptions { idle: DEFAULT_IDLE })),
        Some(Value::Object(m)) => {
            let idle = match m.get("idleMs").filter(|v| !v.is_null()) {
                None => DEFAULT_IDLE,
                Some(i) => {
                    let n = i.as_f64().ok_or(Error::Input(INVALID_SESSION_IDLE))?;
                    if n.fract() != 0.0 || !(1000.0..=3_600_000.0).contains(&n) {
                        return Err(Error::Input(INVALID_SESSION_IDLE));
                    }
                    Duration::from_millis(n as u64)
                }
            };
            Ok(Some(SessionOptions { idle }))
        }
        Some(_) => Err(Error::Input(INVALID_SESSION)),
    }
}

/// One command's record line (without its newline) and token, or `None` when it is too big
/// for one input (then the command runs in the default mode). The script is sent with every
/// byte outside `[A-Za-z0-9_./=+-]` as `\xHH`, which the supervisor decodes with bash's
/// builtin `printf -v … %b` (no process is spawned for it); stdin, which may hold any byte, as
/// base64 into a file.
fn record(params: &Params) -> Result<Option<(String, String)>> {
    let script = script::command_script(&params.command(), None)?;
    let stdin_len = params.stdin.as_ref().map_or(0, String::len);
    if script.len().saturating_mul(4).saturating_add(stdin_len / 3 * 4).saturating_add(64) > MAX_RECORD_BYTES {
        return Ok(None);
    }
    let token = uuid::Uuid::new_v4().simple().to_string();
    let b64 = base64::engine::general_purpose::STANDARD;
    let stdin = params.stdin.as_ref().map_or_else(|| "-".to_owned(), |s| b64.encode(s.as_bytes()));
    Ok(Some((format!("{token} {} {stdin}", escape(&script)), token)))
}

/// `\xHH` for every byte outside `[A-Za-z0-9_./=+-]` (see [`record`]).
fn escape(script: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(script.len() * 2);
    for b in script.bytes() {
        if b.is_ascii_alphanumeric() || b"_./=+-".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// Whether `execute` runs this call in session mode: configured, over the native transport
/// (the host's `fetch` belongs to one call, a supervisor outlives it), and a record that fits.
pub fn applies(cfg: &Config, params: &Params) -> bool {
    cfg.session.is_some() && cfg.host_fetch.is_none() && !cfg.cleanup.legacy && matches!(record(params), Ok(Some(_)))
}

// ---------------------------------------------------------------------------
// The registry of leases and their supervisors.

type Key = (String, String, u64);

#[derive(Default)]
struct LeaseState {
    idle: Vec<Supervisor>,
    /// Supervisors of this lease that exist (idle, running a command, retired or ending).
    total: usize,
    /// `destroySandbox` is ending this lease: nothing goes back to idle.
    closed: bool,
}

struct Lease {
    key: Key,
    state: Mutex<LeaseState>,
    freed: Notify,
}

impl Lease {
    fn lock(&self) -> std::sync::MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One supervisor fewer; a lease with none left leaves the registry (it stays bounded by
    /// the leases in use).
    fn gone(self: &Arc<Self>) {
        let mut st = self.lock();
        st.total = st.total.saturating_sub(1);
        let empty = st.total == 0 && st.idle.is_empty();
        drop(st);
        self.freed.notify_waiters();
        if empty {
            let mut leases = registry().leases.lock().unwrap_or_else(PoisonError::into_inner);
            let ours = leases.get(&self.key).is_some_and(|l| Arc::ptr_eq(l, self));
            if ours && self.lock().total == 0 {
                leases.remove(&self.key);
            }
        }
    }
}

#[derive(Default)]
struct Registry {
    leases: Mutex<HashMap<Key, Arc<Lease>>>,
    /// The runtime supervisors run on (for the environment teardown, called off it).
    runtime: Mutex<Option<tokio::runtime::Handle>>,
}

fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(Registry::default)
}

fn key_hash(api_key: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static SEED: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    let mut h = SEED.get_or_init(Default::default).build_hasher();
    h.write(api_key.as_bytes());
    h.finish()
}

fn lease_for(cfg: &Config, sandbox_id: &str) -> Result<Arc<Lease>> {
    let origin = client::api_origin(&cfg.api_url)?;
    let key = (origin, sandbox_id.to_owned(), key_hash(&cfg.api_key));
    let reg = registry();
    if let Ok(h) = tokio::runtime::Handle::try_current() {
        reg.runtime.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(h);
    }
    let mut leases = reg.leases.lock().unwrap_or_else(PoisonError::into_inner);
    let lease = leases
        .entry(key.clone())
        .or_insert_with(|| Arc::new(Lease { key, state: Mutex::default(), freed: Notify::new() }));
    Ok(Arc::clone(lease))
}

static GENERATION: AtomicU64 = AtomicU64::new(1);

/// What the supervisor's reader task passes on.
enum Event {
    Data(StreamKind, Vec<u8>),
    /// The supervisor's exit frame.
    Exit,
    /// The stream failed closed (a gap, an eviction, an error frame, no connection).
    Failed(&'static str),
}

/// Ends a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Supervisor {
    generation: u64,
    /// Bumped each time it goes back to idle: an idle end armed before its last command
    /// does not end it.
    epoch: u64,
    sandbox_id: String,
    process_id: String,
    /// The unique path prefix its script carries (list recovery, cancel file, staged stdin).
    marker: String,
    /// Its own client (no per-call events): the reader and the idle end use it.
    client: Arc<Client>,
    policy: CleanupPolicy,
    rx: mpsc::Receiver<Event>,
    _reader: AbortOnDrop,
    seen_alive: Arc<AtomicBool>,
    /// A command of it took stdin (its staged file may remain after a kill).
    stdin_used: bool,
}

impl Supervisor {
    /// Fit for another command: nothing arrived since its last command ended (no stray
    /// output, no exit, no failure).
    fn clean(&mut self) -> bool {
        matches!(self.rx.try_recv(), Err(mpsc::error::TryRecvError::Empty))
    }
}

/// Ends `sup`'s tree through the provider (DELETE, confirmed) under `ctx`, and removes its
/// staged stdin afterwards when its end says it may remain. Err = unproven, with the steps.
async fn prove(client: &Client, sup: &Supervisor, ctx: &Ctx, steps: &mut Steps) -> std::result::Result<(), ()> {
    let mut seen = sup.seen_alive.load(Ordering::Relaxed);
    let r = cleanup::terminate(client, &sup.sandbox_id, &sup.process_id, &sup.policy, ctx, steps, &mut seen).await;
    // The supervisor's traps remove the staged stdin when it ends by an exit status (its own,
    // or the SIGTERM a DELETE starts with); a death by a signal or an unknown end may have
    // left it.
    let left = matches!(&r, Ok(script::End::Unknown | script::End::Signal(_)));
    if left && sup.stdin_used {
        let (c, sb, paths, d) =
            (Arc::clone(&sup.client), sup.sandbox_id.clone(), vec![format!("{}.in", sup.marker)], sup.policy.deadline);
        tokio::spawn(async move {
            let _ = AssertUnwindSafe(cleanup::remove_staged(&c, &sb, &paths, d)).catch_unwind().await;
        });
    }
    r.map(drop)
}

/// Ends an idle or retired supervisor with the proof, in a task of its own; nobody waits.
fn spawn_end(lease: Arc<Lease>, sup: Supervisor) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let ctx = Ctx::cleanup(sup.policy.deadline);
        let mut steps = Steps::new();
        let client = Arc::clone(&sup.client);
        let _ = AssertUnwindSafe(Box::pin(prove(&client, &sup, &ctx, &mut steps))).catch_unwind().await;
        drop(sup);
        lease.gone();
    })
}

/// Puts a supervisor back to idle, with its idle end armed.
fn release(lease: &Arc<Lease>, mut sup: Supervisor, idle: Duration) {
    sup.epoch += 1;
    let (generation, epoch) = (sup.generation, sup.epoch);
    let mut st = lease.lock();
    if st.closed {
        drop(st);
        spawn_end(Arc::clone(lease), sup);
        return;
    }
    st.idle.push(sup);
    drop(st);
    lease.freed.notify_waiters();
    let lease = Arc::clone(lease);
    tokio::spawn(async move {
        tokio::time::sleep(idle).await;
        let taken = {
            let mut st = lease.lock();
            st.idle.iter().position(|s| s.generation == generation && s.epoch == epoch).map(|i| st.idle.swap_remove(i))
        };
        if let Some(sup) = taken {
            spawn_end(lease, sup);
        }
    });
}

/// Retires a supervisor (a command left processes, kept): it takes no more commands and is
/// ended with the proof after `idle`.
fn retire(lease: &Arc<Lease>, sup: Supervisor, idle: Duration) {
    let lease = Arc::clone(lease);
    tokio::spawn(async move {
        let closed = lease.lock().closed;
        if !closed {
            tokio::time::sleep(idle).await;
        }
        let _ = spawn_end(lease, sup).await;
    });
}

/// Ends every idle supervisor of `sandbox_id` (any origin and key) with the proof and closes
/// its leases, so a supervisor still running a command is ended when it finishes; waits for
/// the idle ones, within `ctx`. `destroySandbox` calls it first.
pub async fn end_sandbox(sandbox_id: &str, ctx: &Ctx) {
    let leases: Vec<Arc<Lease>> = {
        let mut all = registry().leases.lock().unwrap_or_else(PoisonError::into_inner);
        let keys: Vec<Key> = all.keys().filter(|k| k.1 == sandbox_id).cloned().collect();
        keys.iter().filter_map(|k| all.remove(k)).collect()
    };
    let mut ends = Vec::new();
    for lease in leases {
        let idle = {
            let mut st = lease.lock();
            st.closed = true;
            std::mem::take(&mut st.idle)
        };
        for sup in idle {
            ends.push(spawn_end(Arc::clone(&lease), sup));
        }
    }
    let _ = ctx.run(async { Ok(futures_util::future::join_all(ends).await) }).await;
}

/// Ends every idle supervisor of the process with the proof, waiting at most `wait` (from a
/// thread outside the runtime: an environment's teardown). Leases are closed, so the
/// supervisors of commands in flight are ended as those commands end.
pub fn end_all_blocking(wait: Duration) {
    let reg = registry();
    let Some(handle) = reg.runtime.lock().unwrap_or_else(PoisonError::into_inner).clone() else { return };
    let leases: Vec<Arc<Lease>> =
        reg.leases.lock().unwrap_or_else(PoisonError::into_inner).drain().map(|(_, l)| l).collect();
    let mut idle = Vec::new();
    for lease in leases {
        let mut st = lease.lock();
        st.closed = true;
        for sup in std::mem::take(&mut st.idle) {
            idle.push((Arc::clone(&lease), sup));
        }
    }
    if idle.is_empty() {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    handle.spawn(async move {
        let ends: Vec<_> = idle.into_iter().map(|(l, s)| spawn_end(l, s)).collect();
        let _ = futures_util::future::join_all(ends).await;
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(wait);
}

// ---------------------------------------------------------------------------
// Creating a supervisor.

fn supervisor_script(marker: &str, attempt: u32, idle: Duration) -> Result<String> {
    // The supervisor exits on its own when no record came for twice the idle time and a
    // minute (a client that went away without ending it).
    let idle_s = idle.as_secs().saturating_mul(2).saturating_add(60);
    Ok(format!(
        "{}__cos_marker={}\n__cos_idle={idle_s}\n{SUPERVISOR_SCRIPT}",
        script::attempt_prefix(attempt),
        script::shell_quote(marker)?
    ))
}

/// Creates a supervisor and starts following it. A creation whose answer was lost is
/// recovered as in the default mode (the list, then the cancel file); its error is returned.
async fn create(cfg: &Config, call: &Client, sb: &str, ctx: &Ctx, idle: Duration) -> Result<Supervisor> {
    let marker = format!("/tmp/createos-session-{}", uuid::Uuid::new_v4().simple());
    let body = json!({ "cmd": "/bin/bash", "args": ["-c", supervisor_script(&marker, 1, idle)?] });
    let creation = call.create_process(sb, body, ctx, cfg.cleanup.deadline / 2).await;
    let data = match creation.result {
        Ok(d) => d,
        Err(err) => {
            if creation.maybe_created {
                let mut facts = Facts { attempt: 1, creation_ambiguous: true, ..Facts::default() };
                let cctx = Ctx::cleanup(cfg.cleanup.deadline);
                let mut steps = Steps::new();
                if let Err(f) = cleanup::contain(call, sb, &marker, &mut facts, &cfg.cleanup, &cctx, &mut steps).await {
                    return Err(steps.report(f.reason, sb, f.process_id.as_deref()));
                }
            }
            return Err(err);
        }
    };
    let pid = match data.get("process_id").and_then(Value::as_str) {
        Some(id) if client::is_identifier(id) => id.to_owned(),
        _ => {
            // Created, but not by a name we can end: recovered from the list.
            let mut facts = Facts { attempt: 1, creation_ambiguous: true, ..Facts::default() };
            let cctx = Ctx::cleanup(cfg.cleanup.deadline);
            let mut steps = Steps::new();
            if let Err(f) = cleanup::contain(call, sb, &marker, &mut facts, &cfg.cleanup, &cctx, &mut steps).await {
                return Err(steps.report(f.reason, sb, f.process_id.as_deref()));
            }
            return Err(Error::Protocol(crate::execute::INVALID_RESOURCE_ID));
        }
    };
    let own = Arc::new(Client::new(&cfg.api_url, &cfg.api_key, cfg.timeout, &cfg.pacing, &cfg.net)?.with_events(None));
    let seen_alive = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel(32);
    let base = format!("/sandboxes/{sb}/processes/{pid}");
    let reader = tokio::spawn(read_loop(Arc::clone(&own), base, tx, cfg.follow.clone(), Arc::clone(&seen_alive)));
    Ok(Supervisor {
        generation: GENERATION.fetch_add(1, Ordering::Relaxed),
        epoch: 0,
        sandbox_id: sb.to_owned(),
        process_id: pid,
        marker,
        client: own,
        policy: cfg.cleanup.clone(),
        rx,
        _reader: AbortOnDrop(reader),
        seen_alive,
        stdin_used: false,
    })
}

/// Follows the supervisor's one stream for as long as it lives: `connect?after=cursor`,
/// replayed after a disconnect; every rule of `follow.rs` holds (a gap, an eviction, an error
/// frame fail closed). A budget of consecutive connects that deliver nothing new (a quiet
/// stream whose idle timeout passed counts as delivering: heartbeats are life).
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
        let mut alive = false;
        match opened {
            Ok(resp) => {
                let mut body = resp.into_body();
                let mut lines = LineSplitter::new();
                'read: loop {
                    let chunk = match tokio::time::timeout(opts.idle_timeout, body.next()).await {
                        Err(_) | Ok(None | Some(Err(_))) => break 'read,
                        Ok(Some(Ok(c))) => c,
                    };
                    alive = true;
                    lines.push(&chunk);
                    loop {
                        let line = match lines.next_line() {
                            Ok(Some(l)) => l,
                            Ok(None) => break,
                            Err(_) => {
                                let _ = tx.send(Event::Failed(stream::FRAME_TOO_LARGE)).await;
                                return;
                            }
                        };
                        let Some(payload) = stream::payload(&line) else { continue };
                        match stream::parse_process_frame(payload) {
                            Ok(ProcessFrame::Heartbeat) => {}
                            Ok(ProcessFrame::Data { seq, stream, bytes }) => {
                                if seq <= cursor {
                                    continue;
                                }
                                if Some(seq) != cursor.checked_add(1) {
                                    let _ = tx.send(Event::Failed(follow::SEQUENCE_GAP)).await;
                                    return;
                                }
                                cursor = seq;
                                if tx.send(Event::Data(stream, bytes)).await.is_err() {
                                    return;
                                }
                            }
                            Ok(ProcessFrame::Exit { tree_exited, .. }) => {
                                if tree_exited == Some(false) {
                                    seen.store(true, Ordering::Relaxed);
                                }
                                let _ = tx.send(Event::Exit).await;
                                return;
                            }
                            Ok(ProcessFrame::Error { evicted: true }) => {
                                let _ = tx.send(Event::Failed(stream::OUTPUT_EVICTED)).await;
                                return;
                            }
                            Ok(ProcessFrame::Error { evicted: false }) => {
                                let _ = tx.send(Event::Failed(stream::STREAM_ERROR)).await;
                                return;
                            }
                            Err(Error::Protocol(m)) => {
                                let _ = tx.send(Event::Failed(m)).await;
                                return;
                            }
                            Err(_) => {
                                let _ = tx.send(Event::Failed(stream::INVALID_FRAME)).await;
                                return;
                            }
                        }
                    }
                }
            }
            Err(Error::Api { status: 410, .. }) => {
                let _ = tx.send(Event::Failed(stream::OUTPUT_EVICTED)).await;
                return;
            }
            Err(Error::Api { status, .. }) if status < 500 && status != 429 => {
                let _ = tx.send(Event::Failed(follow::CONNECTION_FAILED)).await;
                return;
            }
            Err(_) => {}
        }
        if alive {
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

// ---------------------------------------------------------------------------
// One command.

/// The marker state of one stream of one command.
#[derive(Default)]
struct Lane {
    begun: bool,
    /// Bytes held back: part of the begin marker, or a possible start of the end marker.
    held: Vec<u8>,
    end: Option<(i32, bool)>,
}

impl Lane {
    /// Takes one chunk; returns the command's bytes in it. Err = doubt (the marker framing
    /// was broken).
    fn push(&mut self, bytes: &[u8], token: &str) -> std::result::Result<Vec<u8>, ()> {
        if self.end.is_some() {
            return Err(()); // output after the end marker
        }
        self.held.extend_from_slice(bytes);
        if !self.begun {
            let begin: Vec<u8> = [BEGIN, token.as_bytes(), b"\n"].concat();
            let n = self.held.len().min(begin.len());
            if self.held[..n] != begin[..n] {
                return Err(());
            }
            if self.held.len() < begin.len() {
                return Ok(Vec::new());
            }
            self.held.drain(..begin.len());
            self.begun = true;
        }
        if let Some(i) = find(&self.held, END) {
            let tail = &self.held[i + END.len()..];
            let Some(nl) = tail.iter().position(|&b| b == b'\n') else {
                if tail.len() > END_TAIL_MAX {
                    return Err(());
                }
                let out = self.held[..i].to_vec();
                self.held.drain(..i);
                return Ok(out);
            };
            if nl + 1 != tail.len() {
                return Err(()); // bytes after the end marker
            }
            self.end = Some(parse_end(&tail[..nl], token).ok_or(())?);
            let out = self.held[..i].to_vec();
            self.held.clear();
            return Ok(out);
        }
        // Hold back the longest suffix that may begin the end marker.
        let keep = (1..END.len()).rev().find(|&k| self.held.len() >= k && self.held.ends_with(&END[..k])).unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_vec();
        self.held.drain(..cut);
        Ok(out)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// `<token>:<status>:<0|1>` → (status, leftover), for our token only.
fn parse_end(tail: &[u8], token: &str) -> Option<(i32, bool)> {
    let s = std::str::from_utf8(tail).ok()?;
    let mut parts = s.split(':');
    let (t, rc, left) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || t != token || rc.is_empty() || rc.len() > 3 || !rc.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let rc: i32 = rc.parse().ok()?;
    let left = match left {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    (rc <= 255).then_some((rc, left))
}

/// A wait status as bash reports it: above 128 a signal (bash cannot tell `exit 137` from
/// SIGKILL), else the exit code.
fn exit_of(rc: i32) -> ProcessExit {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match usize::try_from(rc - 129).ok().and_then(|i| NAMES.get(i)) {
        Some(name) => ProcessExit { exit_code: None, signal: Some((*name).to_owned()) },
        None => ProcessExit { exit_code: Some(rc), signal: None },
    }
}

/// How one command on a supervisor ended.
enum Ran {
    /// Both end markers, in agreement: the supervisor's word.
    Exited { exit: ProcessExit, leftover: bool },
    /// Anything else: the supervisor's tree must be ended through the provider, then this
    /// is the call's outcome (an abort, or an error).
    Doubt(Error),
}

/// Sends the record and reads the command's output and end markers off the stream.
async fn run_one(
    call: &Client,
    request_timeout: Duration,
    sup: &mut Supervisor,
    line: &str,
    token: &str,
    ctx: &Ctx,
    output: &mut Output,
) -> Ran {
    let b64 = base64::engine::general_purpose::STANDARD;
    let body = json!({ "data_base64": b64.encode(format!("{line}\n").as_bytes()) });
    let path = format!("/sandboxes/{}/processes/{}/input", sup.sandbox_id, sup.process_id);
    let post =
        call.json_with(Operation::ProcessInput, Method::POST, &path, Some(body), ctx, Retry::Creation, request_timeout);
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
            return Ran::Exited { exit: exit_of(rc_o), leftover: left_o };
        }
        let next = tokio::select! {
            biased;
            () = ctx.abort.aborted() => return Ran::Doubt(ctx.abort.error()),
            r = post.as_mut(), if posted.is_none() => {
                if let Err(e) = r {
                    return Ran::Doubt(e);
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
                let Ok(text) = lane.push(&bytes, token) else {
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
            None => return Ran::Doubt(Error::Protocol(follow::CONNECTION_FAILED)),
        }
    }
}

/// Takes a clean idle supervisor of the lease, or creates one (within [`MAX_PER_LEASE`]), or
/// waits for one under the caller's signal. An idle one that is not clean is ended.
async fn checkout(
    cfg: &Config,
    call: &Client,
    sb: &str,
    ctx: &Ctx,
    idle: Duration,
) -> Result<(Arc<Lease>, Supervisor)> {
    loop {
        // Looked up on every round: a lease that emptied left the registry meanwhile.
        let lease = &lease_for(cfg, sb)?;
        let freed = lease.freed.notified();
        let mut freed = std::pin::pin!(freed);
        freed.as_mut().enable();
        let create_one = {
            let mut st = lease.lock();
            let mut found = None;
            while let Some(mut s) = st.idle.pop() {
                if s.clean() {
                    found = Some(s);
                    break;
                }
                spawn_end(Arc::clone(lease), s);
            }
            if let Some(s) = found {
                return Ok((Arc::clone(lease), s));
            }
            if st.total < MAX_PER_LEASE {
                st.total += 1;
                true
            } else {
                false
            }
        };
        if create_one {
            let made = AssertUnwindSafe(Box::pin(create(cfg, call, sb, ctx, idle))).catch_unwind().await;
            let made = made.unwrap_or(Err(Error::Internal(PANIC)));
            if made.is_err() {
                lease.gone();
            }
            return made.map(|s| (Arc::clone(lease), s));
        }
        ctx.run(async {
            freed.await;
            Ok(())
        })
        .await?;
    }
}

/// Runs one command in session mode (see the module doc). Resolves and rejects as
/// `execute::execute` does; `metadata.containment` says whose word the result rests on.
pub async fn execute(
    cfg: &Config,
    params: &Params,
    abort: Abort,
    log: Option<mpsc::Sender<LogLine>>,
) -> Result<ExecuteResult> {
    let opts = cfg.session.clone().unwrap_or(SessionOptions { idle: DEFAULT_IDLE });
    let call = Arc::new(cfg.client()?);
    let ctx = Ctx::new(abort.clone());
    let mut output = Output::new(log);
    let sb = params.sandbox_id.as_str();
    let aborted = |captured: output::Captured, process_id: Option<String>, proven: bool| match abort.error() {
        Error::TimedOut => Ok(ExecuteResult {
            timed_out: true,
            stdout: captured.stdout,
            stderr: captured.stderr,
            output_truncated: captured.truncated,
            process_id,
            tree_exited: proven.then_some(true),
            containment: proven.then_some("provider"),
            ..Default::default()
        }),
        e => Err(e),
    };
    if abort.is_aborted() {
        return aborted(output.finish().await, None, false);
    }
    let Some((line, token)) = record(params)? else {
        return Err(Error::Internal("session record too large"));
    };
    let (lease, mut sup) = match Box::pin(checkout(cfg, &call, sb, &ctx, opts.idle)).await {
        Ok(s) => s,
        Err(e) if e.is_abort() && abort.is_aborted() => return aborted(output.finish().await, None, false),
        Err(e) => return Err(e),
    };
    sup.stdin_used |= params.stdin.is_some();
    let ran = AssertUnwindSafe(Box::pin(run_one(&call, cfg.timeout, &mut sup, &line, &token, &ctx, &mut output)))
        .catch_unwind()
        .await
        .unwrap_or(Ran::Doubt(Error::Internal(PANIC)));
    let pid = sup.process_id.clone();
    let proof = |sup: Supervisor| {
        let call = Arc::clone(&call);
        let lease = Arc::clone(&lease);
        async move {
            let ctx = Ctx::cleanup(sup.policy.deadline);
            let mut steps = Steps::new();
            let proved = Box::pin(prove(&call, &sup, &ctx, &mut steps)).await;
            drop(sup);
            lease.gone();
            proved.map_err(|()| steps)
        }
    };
    match ran {
        Ran::Exited { exit, leftover } => {
            let (tree_exited, containment) = if leftover && cfg.leftover == Leftover::Terminate {
                if let Err(steps) = proof(sup).await {
                    return Err(steps.report(CleanupReason::TerminationUnconfirmed, sb, Some(&pid)));
                }
                (Some(true), "provider")
            } else if leftover {
                retire(&lease, sup, opts.idle);
                (Some(false), "supervisor")
            } else {
                release(&lease, sup, opts.idle);
                (Some(true), "supervisor")
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
        Ran::Doubt(err) => {
            if let Err(steps) = proof(sup).await {
                return Err(steps.report(CleanupReason::TerminationUnconfirmed, sb, Some(&pid)));
            }
            if err.is_abort() && abort.is_aborted() {
                return aborted(output.finish().await, Some(pid), true);
            }
            Err(err)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOK: &str = "0123456789abcdef0123456789abcdef";

    fn begin() -> Vec<u8> {
        [BEGIN, TOK.as_bytes(), b"\n"].concat()
    }

    type Lanes = (Vec<u8>, std::result::Result<Option<(i32, bool)>, ()>);

    fn run(chunks: &[&[u8]]) -> Lanes {
        let mut lane = Lane::default();
        let mut out = Vec::new();
        for c in chunks {
            match lane.push(c, TOK) {
                Ok(b) => out.extend(b),
                Err(()) => return (out, Err(())),
            }
        }
        (out, Ok(lane.end))
    }

    #[test]
    fn markers_are_found_whatever_the_split() {
        let mut all = begin();
        all.extend_from_slice(b"no newline at the end\0\x1e");
        all.extend_from_slice(END);
        all.extend_from_slice(format!("{TOK}:3:1\n").as_bytes());
        for cut in 0..all.len() {
            for cut2 in cut..all.len() {
                let (out, end) = run(&[&all[..cut], &all[cut..cut2], &all[cut2..]]);
                assert_eq!(out, b"no newline at the end\0\x1e", "cuts {cut} {cut2}");
                assert_eq!(end, Ok(Some((3, true))));
            }
        }
    }

    #[test]
    fn forged_or_malformed_markers_are_doubt() {
        let other = "f".repeat(32);
        let cases: Vec<Vec<u8>> = vec![
            [&begin()[..], END, format!("{other}:0:0\n").as_bytes()].concat(),
            [&begin()[..], END, format!("{TOK}:0:0\nmore").as_bytes()].concat(),
            [&begin()[..], END, format!("{TOK}:x:0\n").as_bytes()].concat(),
            [&begin()[..], END, format!("{TOK}:0:2\n").as_bytes()].concat(),
            [&begin()[..], END, "a".repeat(80).as_bytes()].concat(),
            [b"stray".as_slice(), &begin()[..]].concat(),
        ];
        for c in cases {
            assert_eq!(run(&[&c]).1, Err(()));
        }
    }

    #[test]
    fn escaped_scripts_decode_in_bash_unchanged() {
        for v in ["plain", "a b\tc\nd\n\n", "it's \\x41 \\c %s %b", "é😀\u{1e}", "-n", "\\", "x\\"] {
            let out = std::process::Command::new("/bin/bash")
                .args(["-c", "printf -v s '%b' \"$1\"; printf %s \"$s\"", "_", &escape(v)])
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), v);
            assert!(!escape(v).contains(' '));
        }
    }

    #[test]
    fn statuses_and_options() {
        assert_eq!(exit_of(0), ProcessExit { exit_code: Some(0), signal: None });
        assert_eq!(exit_of(137).signal.as_deref(), Some("SIGKILL"));
        assert_eq!(exit_of(128).exit_code, Some(128));
        assert_eq!(exit_of(200).exit_code, Some(200));
        assert_eq!(parse(Some(&json!(true))).unwrap(), Some(SessionOptions { idle: DEFAULT_IDLE }));
        assert_eq!(parse(Some(&json!({ "idleMs": 1500 }))).unwrap().unwrap().idle, Duration::from_millis(1500));
        assert_eq!(parse(Some(&json!(false))).unwrap(), None);
        assert!(parse(Some(&json!({ "idleMs": 10 }))).is_err());
        assert!(parse(Some(&json!("yes"))).is_err());
    }
}
