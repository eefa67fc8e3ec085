//! Local CreateOS sandbox emulator.
//!
//! A small HTTP/1.1 and HTTP/2 server (axum on hyper-util, tokio, bound to `127.0.0.1` only;
//! HTTPS with [`EmulatorOptions::tls`], an emulated round-trip time with
//! [`EmulatorOptions::rtt_ms`]) that speaks the subset of
//! the CreateOS sandbox REST API this crate uses: sandboxes, files, buffered and streaming
//! `exec`, and managed processes (`connect`, `input`, `stdin/close`, `signal`, `wait`,
//! `DELETE ?grace_ms=`). Every request is logged ([`Emulator::requests`]) and faults can be
//! injected per route ([`FaultRule`]). It runs real processes on the host: it isolates nothing.
//!
//! # Sandbox filesystem mapping
//!
//! * Every sandbox gets the directory `<root>/<sandbox id>/workspace`, created when the sandbox
//!   is created and removed (recursively) when the sandbox is deleted or the emulator is closed.
//!   `<root>` is [`EmulatorOptions::root_dir`], by default a fresh
//!   `createos-emulator-<random>` directory under the system temp dir, which `close()` removes.
//! * Processes (`exec` and managed processes) start with their working directory and `HOME` set
//!   to that workspace, and with `CREATEOS_SANDBOX_ID=<id>` and `CREATEOS_WORKSPACE=<workspace
//!   dir>` in their environment.
//! * Absolute paths are **host** paths (identity mapping). The one rewrite: a path equal to
//!   `/workspace` or starting with `/workspace/` is mapped onto the sandbox's workspace dir, both
//!   in the files API and in a process `cwd`. A relative `cwd` is resolved against the workspace.
//!   A managed process whose `cwd` is not a directory starts in the workspace (the client's
//!   script `cd`s there itself and reports a missing directory as its exit).
//! * Where the emulator runs as root ([`Emulator::workspace_mounted`]), every tree also runs in a
//!   private mount namespace with its sandbox's workspace bind-mounted on `/workspace`, so
//!   `cd /workspace` and paths under it work in the command itself, as on the real API (the
//!   emulator creates the empty mount point `/workspace` on the host when it is missing; the
//!   host's own `/workspace` is never written). Elsewhere only the rewrite above applies.
//! * The files API (`PUT`/`GET /v1/sandboxes/{id}/files?path=`) only accepts paths under `/tmp/`
//!   or under that sandbox's workspace (after the rewrite). Paths must be absolute, must not
//!   contain `..` components and must not contain NUL; otherwise the answer is 400. A `PUT`
//!   whose parent directory does not exist answers 404; a `GET` of a missing file answers 404.
//!
//! # Process trees: a cgroup per tree, or an environment marker
//!
//! Every process the emulator starts is spawned in a new process group (`setpgid(0, 0)`) and
//! with the environment variable `CREATEOS_EMULATOR_MARK=<emulator instance id>:<process id>`.
//!
//! **cgroups** ([`Tracking::CgroupV2`], [`Tracking::CgroupV1`]; [`Emulator::tracking`] says
//! which). Where a cgroup hierarchy is writable (typically as root), each tree (a managed
//! process or an exec) also gets a leaf cgroup of its own, under a parent of this instance
//! (`createos-emulator-<os pid>-<instance id>`): cgroup v2 when its `pids` controller can be
//! enabled there, else the v1 `pids` and `freezer` hierarchies, else v2 without a `pids` bound.
//! The child writes itself into the leaf after the fork and before it executes the command, so
//! every process the command ever starts is a member, whatever it does to its environment,
//! session or parent. Where the emulator runs as root ([`Emulator::cgroup_view`]) the child
//! then enters a cgroup namespace rooted at its leaf and a mount namespace in which each cgroup
//! hierarchy's mount point shows its own cgroup, so every `cgroup.procs` it can see is inside
//! its leaf. A process that still writes itself into another cgroup (through a path of the
//! host's) is found by the membership check whenever its leaf looks empty: a live process that
//! names the tree (in another hierarchy's cgroup path, its environment marker, or its process
//! group) but is not in the leaf is moved back into it, so the tree is not exited and is killed
//! whole. The tree is the
//! leaf's members; it has exited once the leader was reaped and the leaf lists no process (an
//! empty cgroup stays empty). Killing it (a DELETE under [`TerminationScope::Tree`], a sandbox
//! DELETE, an exec's timeout, `close`) freezes the leaf, signals every member, thaws it (the order systemd uses: nothing forks past
//! the signal), and repeats until the leaf is empty. Each leaf has `pids.max` =
//! [`EmulatorOptions::pids_max`] (default 512) where the layout has a `pids` controller, so a
//! fork loop is bounded. A leaf is removed once its leader was reaped and it is empty; `close`
//! kills whatever is left and removes every leaf and the parent. An emulator's start removes
//! the empty parents of emulators whose OS process is gone.
//!
//! **The marker** ([`Tracking::Marker`]: no writable hierarchy, or
//! [`EmulatorOptions::tracking`] asked for it). The tree is every live pid whose
//! `/proc/<pid>/environ` carries the marker, plus every member of the leader's process group.
//! Descendants inherit the marker, including ones that call `setsid` or double-fork, so they are
//! found even after they left the group and were re-parented (one in the middle of an `execve`,
//! whose environment reads empty for a moment, is read again until it settles). A process that
//! clears its environment (`env -i`) *and* leaves the process group escapes: that is the limit of
//! this fallback, and the reason cgroups come first.
//!
//! Zombies (state `Z` in `/proc/<pid>/stat`) and processes already in `exit` (`PF_EXITING` in their
//! flags: they run no code of their own again, and may have left `cgroup.procs`) count as exited in
//! both. Process groups are tracked in both: one background task polls every ~25 ms while any
//! managed process is not yet `tree_exited` (or a reaped leader's process group, or cgroup, still
//! has members). A process group is forgotten once it is empty and its leader was reaped, so a
//! recycled pid is never mistaken for one of ours. Without a cgroup a tree is declared exited after
//! two consecutive /proc scans in which the leader has exited (and been reaped) and no process of
//! the tree is alive, which closes the race of a process forking while a scan runs.
//! [`Emulator::live_pids`] reports the members of this instance's cgroups and every marked process.
//!
//! # Termination scope
//!
//! The DELETE of a process (`?grace_ms=`) sends SIGTERM, waits the grace (less when nothing it
//! signalled is left), SIGKILLs what is left and answers the process record. Whom it signals is
//! [`EmulatorOptions::termination_scope`]: [`TerminationScope::Tree`] (the `full` profile's
//! default) every process of the tree, as described above; [`TerminationScope::Group`] (the
//! `documented` profile's default) the leader's process group only (`killpg`), the least the
//! API's "terminates the whole process tree" may mean. Under `group` a descendant that left the
//! group (`setsid`, a double fork into a new session) is not signalled; it still belongs to the
//! tree as observed, so `tree_exited` (the DELETE's answer, exit frames, `wait?scope=tree`, the
//! record) stays false while it lives. A sandbox DELETE, `close` and an exec's timeout end
//! every process of a tree under either scope.
//!
//! # Output journal
//!
//! Output of a managed process is cut into data frames of at most 64 KiB of raw bytes, numbered
//! by one sequence counter for stdout and stderr starting at 1. The journal keeps at most
//! [`EmulatorOptions::journal_bytes`] raw bytes, evicting oldest frames first, but always keeps
//! the newest frame. `output.oldest_seq` is the first retained seq (or `newest_seq + 1` when
//! nothing was written yet), `output.bytes` the retained raw bytes. Independently of the journal
//! the emulator records all output of each process for [`Emulator::process_output`], capped at
//! 64 MiB per stream (bytes beyond the cap are not recorded).
//!
//! Both stay after the process exits, bounded across processes (and sandboxes) by
//! [`EmulatorOptions::retained_bytes`] (default 256 MiB): once a process has exited (its leader
//! exited and both pipes reached EOF) its journal and capture bytes join a FIFO of exited
//! processes, and while their total exceeds the budget the process that exited first loses its
//! journal frames and its capture. Its numbering stays (`newest_seq` unchanged, `oldest_seq =
//! newest_seq + 1`, `output.bytes` 0), so a `connect?after=N` with `N < newest_seq` answers
//! `output_offset_expired` (a 410 at connect, an error frame mid-stream), and
//! [`Emulator::process_output`] answers [`OutputNotRetained`] rather than empty output. Output
//! of a running process is never dropped by the budget; deleting a sandbox takes its processes
//! out of the total.
//!
//! Connect streams are fed from the journal only (a `watch` channel signals "something
//! changed"; each stream copies frames out of the journal under a short lock and writes them to
//! a small bounded channel), so a slow client never makes the emulator buffer more than the
//! journal. A client that falls behind the journal gets an `output_offset_expired` error frame.
//!
//! # Lifecycle
//!
//! [`Emulator::close`] stops accepting, aborts every open connection, SIGKILLs every process
//! of its trees (members of its cgroups, frozen first; processes carrying this instance's
//! marker; every process group it started), waits (bounded, 5 s) until none is alive and every
//! direct child was reaped, and removes its cgroups and the sandbox directories (and the root
//! dir when the emulator created it). Dropping an [`Emulator`] without `close()`
//! only SIGKILLs the trees (best effort, synchronously) once every task of the emulator is gone,
//! e.g. when its tokio runtime shuts down; inside a long-lived runtime (Node.js) nothing happens
//! until `close()`, so always call `close()`.

// The emulator observes process trees through /proc and process groups: it cannot answer
// `tree_exited` honestly anywhere else, so it does not build anywhere else.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "createos_emulator runs only on Linux: it finds process trees through /proc, and without it \
     it would claim `tree_exited` for trees it cannot see. Build the core crate or the addon instead."
);

mod cgroup;
mod faults;
mod isolate;
mod model;
mod net;
mod procfs;
mod retention;
mod server;
mod streams;
mod tls;
mod virt;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use faults::{FaultAction, FaultRule};
pub use procfs::stat_live;

use model::Sandbox;

/// Largest [`EmulatorOptions::rtt_ms`] (one minute).
pub const MAX_RTT_MS: u64 = 60_000;
/// Largest [`EmulatorOptions::heartbeat_ms`] (one day).
pub const MAX_HEARTBEAT_MS: u64 = 86_400_000;
/// Default [`EmulatorOptions::retained_bytes`] (256 MiB).
pub const DEFAULT_RETAINED_BYTES: usize = 256 * 1024 * 1024;
/// Default [`EmulatorOptions::pids_max`]: processes (and threads) one tree may hold at once.
pub const DEFAULT_PIDS_MAX: u32 = 512;

/// How an emulator finds the processes of a tree ([`Emulator::tracking`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Tracking {
    /// A cgroup v2 leaf per tree (`cgroup.freeze`; `pids.max` when the `pids` controller is
    /// available there).
    #[serde(rename = "cgroup-v2")]
    CgroupV2,
    /// A leaf per tree in the cgroup v1 `pids` and `freezer` hierarchies.
    #[serde(rename = "cgroup-v1")]
    CgroupV1,
    /// The environment marker found through /proc (no cgroup hierarchy is writable here).
    #[serde(rename = "marker")]
    Marker,
}

impl Tracking {
    /// `"cgroup-v2"`, `"cgroup-v1"` or `"marker"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Tracking::CgroupV2 => "cgroup-v2",
            Tracking::CgroupV1 => "cgroup-v1",
            Tracking::Marker => "marker",
        }
    }
}

/// [`EmulatorOptions::tracking`]: which tracking to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum TrackingMode {
    /// cgroup v2 with a `pids` bound, else cgroup v1, else cgroup v2 without the bound, else the
    /// marker.
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// cgroup v2 or fail to start.
    #[serde(rename = "cgroup-v2")]
    CgroupV2,
    /// cgroup v1 (`pids` and `freezer`) or fail to start.
    #[serde(rename = "cgroup-v1")]
    CgroupV1,
    /// The environment marker only.
    #[serde(rename = "marker")]
    Marker,
}

impl TrackingMode {
    /// `"auto"`, `"cgroup-v2"`, `"cgroup-v1"` or `"marker"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            TrackingMode::Auto => "auto",
            TrackingMode::CgroupV2 => "cgroup-v2",
            TrackingMode::CgroupV1 => "cgroup-v1",
            TrackingMode::Marker => "marker",
        }
    }
}

/// [`EmulatorOptions::profile`]: how much beyond the documented API the emulator serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Profile {
    /// Everything the emulator has: a paged process list with `pagination { total, … }`, exit
    /// frames with `tree_exited` and `newest_seq`, exec answers with the result fields also at
    /// the top of `data`, file uploads answered `{path, bytes}`, a process DELETE that signals
    /// every process of the tree (unless [`EmulatorOptions::termination_scope`] says otherwise).
    #[default]
    #[serde(rename = "full")]
    Full,
    /// Only what the API notes document (see docs/emulator.md, "Profiles"): the process list is
    /// `data.processes[]`, whole and unpaged whatever `limit`/`offset` say, with no
    /// `pagination`; exit frames carry `exit_code` and, when signalled, `signal`, nothing else;
    /// a buffered exec answers `data.result` and `data.exec_ms` only; an upload answers `{}`;
    /// a process DELETE signals the leader's process group only (unless
    /// [`EmulatorOptions::termination_scope`] says otherwise).
    #[serde(rename = "documented")]
    Documented,
}

impl Profile {
    /// `"full"` or `"documented"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Full => "full",
            Profile::Documented => "documented",
        }
    }

    /// The profile named by `CREATEOS_EMULATOR_PROFILE` (`full` or `documented`); `None` when
    /// it is unset or empty.
    ///
    /// # Panics
    /// When it names no profile (a misspelt name must not silently run the full profile).
    #[must_use]
    pub fn from_env() -> Option<Profile> {
        match std::env::var(PROFILE_ENV).ok().as_deref() {
            None | Some("") => None,
            Some("full") => Some(Profile::Full),
            Some("documented") => Some(Profile::Documented),
            Some(other) => panic!("{PROFILE_ENV}={other:?} names no profile (full or documented)"),
        }
    }
}

/// [`EmulatorOptions::termination_scope`]: which processes the DELETE of a process signals.
/// Either way `tree_exited` (exit frames, `wait?scope=tree`, the process record) counts every
/// descendant the emulator observes, so a process the DELETE did not reach keeps it `false`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TerminationScope {
    /// SIGTERM, the grace, SIGKILL to the leader's process group only: the least the API's
    /// "terminates the whole process tree" may mean (it does not say how the tree is found). A
    /// descendant that left the group (`setsid`, a double fork into a new session) is not
    /// signalled. The [`Profile::Documented`] default.
    #[serde(rename = "group")]
    Group,
    /// SIGTERM, the grace, SIGKILL to every process of the tree (its cgroup, frozen while it is
    /// signalled, or every process carrying its marker), wherever it went. The
    /// [`Profile::Full`] default.
    #[serde(rename = "tree")]
    Tree,
}

impl TerminationScope {
    /// `"group"` or `"tree"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            TerminationScope::Group => "group",
            TerminationScope::Tree => "tree",
        }
    }

    /// The scope a profile terminates with when the options name none: `documented` → `group`
    /// (the documented minimum), `full` → `tree`.
    #[must_use]
    pub fn of_profile(profile: Profile) -> TerminationScope {
        match profile {
            Profile::Documented => TerminationScope::Group,
            Profile::Full => TerminationScope::Tree,
        }
    }
}

/// The environment variable the test support reads for the profile of the emulators it starts
/// when a test asks for none ([`Profile::from_env`]).
pub const PROFILE_ENV: &str = "CREATEOS_EMULATOR_PROFILE";

/// What [`Emulator::process_output`] recorded: (stdout, stderr).
pub type Captured = (Vec<u8>, Vec<u8>);

/// [`Emulator::process_output`] of a process whose output was dropped to stay within
/// [`EmulatorOptions::retained_bytes`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputNotRetained {
    pub process_id: String,
}

impl std::fmt::Display for OutputNotRetained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "output of process {} is no longer retained (retainedBytes)", self.process_id)
    }
}

impl std::error::Error for OutputNotRetained {}

/// [`Emulator::retained`]: the output held for exited processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetainedOutput {
    /// Journal plus capture bytes of exited processes (of sandboxes not deleted).
    pub bytes: usize,
    /// Exited processes still holding output.
    pub processes: usize,
    /// Processes that exited so far (leader exited, both pipes at EOF) in sandboxes not yet
    /// deleted at that moment.
    pub exits: u64,
    /// Processes whose output was dropped to stay within the budget, so far.
    pub evictions: u64,
}

/// Options of [`start`]. Deserializable from camelCase JSON; every field is optional.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EmulatorOptions {
    /// TCP port on 127.0.0.1; 0 = ephemeral.
    pub port: u16,
    /// API key to accept; `None` = random `emu_<uuid hex>`.
    pub api_key: Option<String>,
    /// Requests per sliding 60 s window per API key. Default `Some(300)`; `None` or 0 = off.
    pub rate_limit_per_minute: Option<u32>,
    /// `limit` requests per sliding `windowMs` per API key; replaces `rate_limit_per_minute`
    /// when given. Requests over it get 429 with `Retry-After` and do not count.
    pub rate_limit: Option<RateLimit>,
    /// Raw output bytes retained per process in the replay journal. Default 1 MiB.
    pub journal_bytes: usize,
    /// Budget for the output retained by exited processes, across sandboxes: journal plus
    /// [`Emulator::process_output`] capture bytes. Beyond it the output of the processes that
    /// exited first is dropped (see "Output journal" above). Default `Some(256 MiB)`; `None` or
    /// 0 = unbounded. Running processes are never counted.
    pub retained_bytes: Option<usize>,
    /// Root directory for sandbox directories. Default: a fresh temp dir removed on close.
    pub root_dir: Option<PathBuf>,
    /// Serve HTTPS from a CA and leaf generated at start ([`Emulator::ca_pem`]); the leaf is
    /// valid for `localhost`, `createos.test` and `127.0.0.1`. Default false (plain HTTP).
    pub tls: bool,
    /// Offer HTTP/2: ALPN `h2` besides `http/1.1` with TLS, the h2 preface ("prior
    /// knowledge") without. False = HTTP/1.1 only. Default true.
    pub http2: bool,
    /// Emulated round-trip time in ms: every byte reaches the other side `rtt_ms / 2` after it
    /// was sent, in each direction, and a new connection waits one more `rtt_ms` before it is
    /// served (its TCP handshake). Default 0 (none); at most [`MAX_RTT_MS`].
    pub rtt_ms: u64,
    /// The `connect` stream's response headers go out only together with its first frame (a
    /// data, heartbeat, error or exit frame), as a Node `http` server sends them by default.
    /// Default false (headers at once).
    pub hold_headers: bool,
    /// Heartbeat interval of connect and streaming-exec streams, ms (1 to
    /// [`MAX_HEARTBEAT_MS`]). Default 5000.
    pub heartbeat_ms: u64,
    /// How trees are tracked (see "Process trees" above). Default [`TrackingMode::Auto`].
    pub tracking: TrackingMode,
    /// `pids.max` of each tree's cgroup (where the layout has a `pids` controller): a fork
    /// beyond it fails with `EAGAIN`. Default `Some(`[`DEFAULT_PIDS_MAX`]`)`; `None` = no
    /// bound; at least 1.
    pub pids_max: Option<u32>,
    /// How much beyond the documented API is served ([`Profile`]). `None` = [`Profile::Full`];
    /// the test support fills a `None` from `CREATEOS_EMULATOR_PROFILE`
    /// ([`Profile::from_env`]), so `Some` is a test asking for a profile explicitly.
    pub profile: Option<Profile>,
    /// Which processes the DELETE of a process signals ([`TerminationScope`]). `None` = the
    /// profile's ([`TerminationScope::of_profile`]): `group` under `documented`, `tree` under
    /// `full`. A sandbox DELETE and [`Emulator::close`] end every process of every tree
    /// whatever the scope (they are the emulator's own housekeeping).
    pub termination_scope: Option<TerminationScope>,
    /// Play `createos-virtual` commands without starting a program ([`crate::virt`]): ten
    /// thousand commands in flight cost tasks, not processes. Default false.
    pub virtual_processes: bool,
}

impl Default for EmulatorOptions {
    fn default() -> Self {
        EmulatorOptions {
            port: 0,
            api_key: None,
            rate_limit_per_minute: Some(300),
            rate_limit: None,
            journal_bytes: 1_048_576,
            retained_bytes: Some(DEFAULT_RETAINED_BYTES),
            root_dir: None,
            tls: false,
            http2: true,
            rtt_ms: 0,
            hold_headers: false,
            heartbeat_ms: 5_000,
            tracking: TrackingMode::Auto,
            pids_max: Some(DEFAULT_PIDS_MAX),
            profile: None,
            termination_scope: None,
            virtual_processes: false,
        }
    }
}

/// A sliding-window request limit (`{ limit, windowMs }`).
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RateLimit {
    pub limit: u32,
    pub window_ms: u64,
}

/// One HTTP request as seen by the emulator.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestRecord {
    pub method: String,
    /// Path only, without the query.
    pub path: String,
    /// Raw query string without `?` (empty when none).
    pub query: String,
    pub route: &'static str,
    /// Status sent; 0 when none was (a dropped connection, or a body that never arrived).
    pub status: u16,
    /// Arrival time of the head, ms since the emulator started. The log is in the order of
    /// `received_ms`.
    pub at_ms: f64,
    /// When the whole request (head and body) had arrived, ms since the emulator started;
    /// `None` when its body never arrived in full (the client abandoned it): such a request
    /// was not handled.
    pub received_ms: Option<f64>,
    /// Time until the response head was produced (streams: not their whole duration).
    pub duration_ms: f64,
    /// `"HTTP/1.1"` or `"HTTP/2.0"` (as the request arrived).
    pub http_version: &'static str,
    /// The TCP connection it came on: 1 for the first connection accepted, then 2, ...
    pub connection: u64,
    /// A creation applied late ([`FaultAction::ApplyLate`]): when it was applied, ms since the
    /// emulator started (also when the client had left by then); `None` for every other
    /// request, and while a late creation is still pending.
    pub applied_ms: Option<f64>,
}

pub(crate) struct FaultSlot {
    pub rule: FaultRule,
    pub seen: u32,
}

/// A creation held by [`FaultAction::ApplyLate`] `after_list`, until the next list answer of
/// its sandbox was sent.
pub(crate) struct LateCreation {
    pub sandbox: String,
    pub fire: tokio::sync::oneshot::Sender<()>,
}

pub(crate) struct Inner {
    pub instance: String,
    pub profile: Profile,
    /// What a process DELETE signals ([`EmulatorOptions::termination_scope`], resolved).
    pub termination: TerminationScope,
    /// Creations waiting for a list answer of their sandbox ([`FaultAction::ApplyLate`]).
    pub late: Mutex<Vec<LateCreation>>,
    /// One leaf cgroup per tree, when trees are tracked by cgroup.
    pub cgroups: Option<Arc<cgroup::Cgroups>>,
    pub api_key: String,
    pub root: PathBuf,
    pub owns_root: bool,
    pub started: Instant,
    pub journal_bytes: usize,
    /// Output retained by exited processes ([`EmulatorOptions::retained_bytes`]). Lock order:
    /// this before a process's journal or capture.
    pub retention: Mutex<retention::Retention<model::Retained>>,
    /// Next [`model::Proc::key`].
    pub next_key: AtomicU64,
    pub rate_limit: Option<u32>,
    pub rate_window: Duration,
    pub addr: SocketAddr,
    /// The CA's PEM when serving HTTPS.
    pub ca_pem: Option<String>,
    pub hold_headers: bool,
    pub heartbeat: Duration,
    /// TCP connections accepted so far.
    pub connections: Arc<AtomicU64>,
    pub requests: Mutex<(u64, Vec<RequestRecord>)>,
    pub faults: Mutex<Vec<FaultSlot>>,
    pub sandboxes: Mutex<HashMap<String, Arc<Sandbox>>>,
    pub rate: Mutex<HashMap<String, VecDeque<Instant>>>,
    pub shutdown: CancellationToken,
    pub reaper_wake: Notify,
    /// Process groups this instance created (leader pid = pgid) → 0 while the leader is not
    /// reaped, then 1 + number of consecutive scans that found the group empty. A group is
    /// forgotten after two empty scans, so a pid recycled later by an unrelated group leader is
    /// never mistaken for ours.
    pub groups: Mutex<HashMap<i32, u8>>,
    /// Direct children not yet reaped (managed leaders and exec'd commands).
    pub unreaped: AtomicU64,
    pub reaped_notify: Notify,
    pub closed: AtomicBool,
    pub serve_task: Mutex<Option<JoinHandle<()>>>,
    pub reaper_task: Mutex<Option<JoinHandle<()>>>,
    /// [`EmulatorOptions::virtual_processes`].
    pub virtual_processes: bool,
    /// Virtual processes still running.
    pub live_virtual: AtomicUsize,
}

impl Inner {
    pub fn mark_prefix(&self) -> String {
        format!("{}:", self.instance)
    }
    pub fn marker_for(&self, id: &str) -> String {
        format!("{}:{}", self.instance, id)
    }
    pub fn now_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }
    /// Process groups that may still hold processes of ours.
    pub fn live_groups(&self) -> HashSet<i32> {
        self.groups.lock().unwrap().keys().copied().collect()
    }
    pub fn sandbox(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.sandboxes.lock().unwrap().get(id).cloned()
    }
}

impl Drop for Inner {
    /// Safety net when `close()` was never called: runs once the last handle and every task of
    /// the emulator are gone (for example when the tokio runtime shuts down). Synchronous,
    /// bounded to a few short passes.
    fn drop(&mut self) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let prefix = self.mark_prefix();
        let groups: HashSet<i32> = self.groups.get_mut().map(|g| g.keys().copied().collect()).unwrap_or_default();
        for _ in 0..10 {
            let found = procfs::scan(&|e: &procfs::Entry| {
                e.mark.as_deref().is_some_and(|m| m.starts_with(&prefix)) || groups.contains(&e.pgid)
            });
            if found.is_empty() {
                break;
            }
            procfs::signal_entries(&found, nix::sys::signal::Signal::SIGKILL, &[]);
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(cg) = &self.cgroups {
            cg.kill_all_and_remove(Instant::now() + Duration::from_millis(500));
        }
        if let Ok(sbs) = self.sandboxes.get_mut() {
            for sb in sbs.values() {
                let _ = std::fs::remove_dir_all(&sb.dir);
            }
        }
        if self.owns_root {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// Handle to a running emulator (cheap to clone).
#[derive(Clone)]
pub struct Emulator {
    inner: Arc<Inner>,
}

/// Start an emulator. Binds `127.0.0.1:<port>` before returning.
pub async fn start(opts: EmulatorOptions) -> std::io::Result<Emulator> {
    // Without a readable /proc every tree would look empty, i.e. exited: refuse to start
    // rather than ever answer `tree_exited: true` for a tree that was not observed.
    if std::fs::read("/proc/self/environ").is_err() {
        return Err(std::io::Error::other("the emulator needs a readable /proc to observe process trees"));
    }
    if !(1..=MAX_HEARTBEAT_MS).contains(&opts.heartbeat_ms) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("heartbeatMs must be between 1 and {MAX_HEARTBEAT_MS}"),
        ));
    }
    if opts.rtt_ms > MAX_RTT_MS {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("rttMs must be at most {MAX_RTT_MS}"),
        ));
    }
    if opts.pids_max == Some(0) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "pidsMax must be at least 1"));
    }
    let instance = format!("emu{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let want = match opts.tracking {
        TrackingMode::Auto => Some(cgroup::Want::Auto),
        TrackingMode::CgroupV2 => Some(cgroup::Want::V2),
        TrackingMode::CgroupV1 => Some(cgroup::Want::V1),
        TrackingMode::Marker => None,
    };
    let cgroups = match want {
        Some(w) => cgroup::Cgroups::start(w, &instance, opts.pids_max).map_err(|e| {
            std::io::Error::new(e.kind(), format!("tracking {} is not available here: {e}", opts.tracking.as_str()))
        })?,
        None => None,
    };
    // Probed once per OS process (a child tries each step), before the first tree needs it.
    let _ = isolate::get();
    let tls = if opts.tls { Some(tls::make(&instance, opts.http2)?) } else { None };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", opts.port)).await?;
    let addr = listener.local_addr()?;
    let (root, owns_root) = match opts.root_dir.clone() {
        Some(dir) => {
            std::fs::create_dir_all(&dir)?;
            (dir, false)
        }
        None => {
            let dir = std::env::temp_dir()
                .join(format!("createos-emulator-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]));
            std::fs::create_dir_all(&dir)?;
            (dir, true)
        }
    };
    let api_key = opts.api_key.clone().unwrap_or_else(|| format!("emu_{}", uuid::Uuid::new_v4().simple()));
    let inner = Arc::new(Inner {
        instance,
        profile: opts.profile.unwrap_or_default(),
        termination: opts.termination_scope.unwrap_or(TerminationScope::of_profile(opts.profile.unwrap_or_default())),
        late: Mutex::new(Vec::new()),
        cgroups,
        api_key,
        root,
        owns_root,
        started: Instant::now(),
        journal_bytes: opts.journal_bytes,
        retention: Mutex::new(retention::Retention::new(opts.retained_bytes.filter(|n| *n > 0))),
        next_key: AtomicU64::new(0),
        rate_limit: opts.rate_limit.map_or(opts.rate_limit_per_minute, |r| Some(r.limit)).filter(|n| *n > 0),
        rate_window: opts.rate_limit.map_or(Duration::from_secs(60), |r| Duration::from_millis(r.window_ms.max(1))),
        addr,
        ca_pem: tls.as_ref().map(|t| t.ca_pem.clone()),
        hold_headers: opts.hold_headers,
        heartbeat: Duration::from_millis(opts.heartbeat_ms),
        connections: Arc::new(AtomicU64::new(0)),
        requests: Mutex::new((0, Vec::new())),
        faults: Mutex::new(Vec::new()),
        sandboxes: Mutex::new(HashMap::new()),
        rate: Mutex::new(HashMap::new()),
        shutdown: CancellationToken::new(),
        reaper_wake: Notify::new(),
        groups: Mutex::new(HashMap::new()),
        unreaped: AtomicU64::new(0),
        reaped_notify: Notify::new(),
        closed: AtomicBool::new(false),
        serve_task: Mutex::new(None),
        reaper_task: Mutex::new(None),
        virtual_processes: opts.virtual_processes,
        live_virtual: AtomicUsize::new(0),
    });
    let net =
        net::NetConfig { tls: tls.map(|t| t.acceptor), http2: opts.http2, rtt: Duration::from_millis(opts.rtt_ms) };
    let serve = server::spawn_server(inner.clone(), listener, net);
    *inner.serve_task.lock().unwrap() = Some(serve);
    let reaper = tokio::spawn(model::reaper(inner.clone()));
    *inner.reaper_task.lock().unwrap() = Some(reaper);
    Ok(Emulator { inner })
}

impl Emulator {
    /// `http://127.0.0.1:PORT`, or `https://127.0.0.1:PORT` with [`EmulatorOptions::tls`]
    /// (without `/v1`).
    pub fn url(&self) -> String {
        let scheme = if self.inner.ca_pem.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.inner.addr)
    }

    /// The PEM of the CA that issued the server certificate (with [`EmulatorOptions::tls`]);
    /// `None` when serving plain HTTP. Generated at start, valid only for this instance.
    pub fn ca_pem(&self) -> Option<String> {
        self.inner.ca_pem.clone()
    }

    /// TCP connections accepted so far (the highest [`RequestRecord::connection`] seen, or
    /// more when a connection sent no request, e.g. a failed TLS handshake).
    pub fn connections(&self) -> u64 {
        self.inner.connections.load(Ordering::SeqCst)
    }

    pub fn api_key(&self) -> String {
        self.inner.api_key.clone()
    }

    /// Whether every tree sees its sandbox's workspace mounted on `/workspace` (a private mount
    /// namespace per tree, where the emulator runs as root); else `/workspace` is mapped only
    /// in the files API and the `cwd` field (see "Sandbox filesystem mapping").
    pub fn workspace_mounted(&self) -> bool {
        isolate::get().workspace
    }

    /// Whether every tree with a cgroup sees its leaf as the root of each cgroup hierarchy (a
    /// cgroup namespace and fresh cgroup mounts), so no `cgroup.procs` it can see leads out.
    pub fn cgroup_view(&self) -> bool {
        self.inner.cgroups.is_some() && isolate::get().cgroup_view
    }

    /// The profile it serves ([`EmulatorOptions::profile`]).
    pub fn profile(&self) -> Profile {
        self.inner.profile
    }

    /// Which processes the DELETE of a process signals ([`EmulatorOptions::termination_scope`],
    /// or the profile's).
    pub fn termination_scope(&self) -> TerminationScope {
        self.inner.termination
    }

    /// How this emulator finds the processes of a tree.
    pub fn tracking(&self) -> Tracking {
        match self.inner.cgroups.as_ref().map(|c| c.mode) {
            Some(cgroup::Mode::V2) => Tracking::CgroupV2,
            Some(cgroup::Mode::V1) => Tracking::CgroupV1,
            None => Tracking::Marker,
        }
    }

    /// The `pids.max` each tree's cgroup has; `None` when no bound applies (the marker, cgroup
    /// v2 without its `pids` controller, or [`EmulatorOptions::pids_max`] `None`).
    pub fn pids_max(&self) -> Option<u32> {
        self.inner.cgroups.as_ref().and_then(|c| c.pids_max)
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.inner.requests.lock().unwrap().1.clone()
    }

    pub fn clear_requests(&self) {
        let mut g = self.inner.requests.lock().unwrap();
        g.0 += 1;
        g.1.clear();
    }

    pub fn add_fault(&self, rule: FaultRule) {
        self.inner.faults.lock().unwrap().push(FaultSlot { rule, seen: 0 });
    }

    pub fn clear_faults(&self) {
        self.inner.faults.lock().unwrap().clear();
    }

    /// Create a sandbox without HTTP; returns its id.
    pub fn create_sandbox_now(&self) -> String {
        model::create_sandbox(&self.inner, serde_json::Value::Null)
            .map(|sb| sb.id.clone())
            .expect("create sandbox directory")
    }

    /// All bytes the process wrote (stdout, stderr), each capped at 64 MiB; `Ok(None)` for an
    /// unknown sandbox or process, `Err` once its output was dropped to stay within
    /// [`EmulatorOptions::retained_bytes`] (never an empty capture in its place).
    pub fn process_output(&self, sandbox_id: &str, process_id: &str) -> Result<Option<Captured>, OutputNotRetained> {
        let Some(p) = self.inner.sandbox(sandbox_id).and_then(|sb| sb.process(process_id)) else {
            return Ok(None);
        };
        // Under the retention lock: an eviction cannot slip between the check and the copy.
        let _retention = self.inner.retention.lock().unwrap();
        if p.kept.load(Ordering::SeqCst) == model::KEPT_EVICTED {
            return Err(OutputNotRetained { process_id: p.id.clone() });
        }
        let cap = p.capture.lock().unwrap();
        Ok(Some((cap[0].clone(), cap[1].clone())))
    }

    /// What [`EmulatorOptions::retained_bytes`] bounds, at this moment.
    pub fn retained(&self) -> RetainedOutput {
        let r = self.inner.retention.lock().unwrap();
        RetainedOutput { bytes: r.total(), processes: r.len(), exits: r.exits(), evictions: r.evictions() }
    }

    /// How many virtual processes ([`EmulatorOptions::virtual_processes`]) still run.
    pub fn live_virtual(&self) -> usize {
        self.inner.live_virtual.load(Ordering::SeqCst)
    }

    /// Every still-alive pid of this emulator's trees (not a zombie, not on its way out of
    /// `exit`): in one of its cgroups, carrying its marker, or in a process group it started.
    pub fn live_pids(&self) -> Vec<i32> {
        self.live(false)
    }

    /// [`Emulator::live_pids`] less the processes of `/exec` commands: the trees of managed
    /// processes (`POST /processes`) only. An `/exec` process is told by its marker (its leaf
    /// cgroup, or the marker variable), which it carries from the fork on where trees are
    /// tracked by cgroup; a process found only by its process group counts as managed.
    pub fn live_process_pids(&self) -> Vec<i32> {
        self.live(true)
    }

    fn live(&self, managed_only: bool) -> Vec<i32> {
        let prefix = self.inner.mark_prefix();
        let exec = format!("{prefix}exec_");
        let groups = self.inner.live_groups();
        procfs::scan(&move |e: &procfs::Entry| {
            let ours = e.mark.as_deref().is_some_and(|m| m.starts_with(&prefix)) || groups.contains(&e.pgid);
            ours && !(managed_only && e.mark.as_deref().is_some_and(|m| m.starts_with(&exec)))
        })
        .into_iter()
        .map(|e| e.pid)
        .collect()
    }

    /// Stop accepting, abort connections, SIGKILL every tree, wait (bounded, 5 s) until none is
    /// alive, remove the sandbox directories (and the root dir when the emulator created it).
    pub async fn close(&self) {
        let inner = &self.inner;
        if inner.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        inner.shutdown.cancel();
        let deadline = Instant::now() + Duration::from_secs(5);
        let prefix = inner.mark_prefix();
        let groups = inner.live_groups();
        procfs::kill_until_gone(
            Arc::new(move |e: &procfs::Entry| {
                e.mark.as_deref().is_some_and(|m| m.starts_with(&prefix)) || groups.contains(&e.pgid)
            }),
            deadline,
        )
        .await;
        // Wait until every direct child was reaped (so no zombie of ours is left behind).
        while inner.unreaped.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            let _ = tokio::time::timeout(Duration::from_millis(20), inner.reaped_notify.notified()).await;
        }
        if let Some(cg) = inner.cgroups.clone() {
            // Whatever a cgroup still holds is killed frozen; then the cgroups are removed.
            let _ = tokio::task::spawn_blocking(move || cg.kill_all_and_remove(deadline)).await;
        }
        let serve = inner.serve_task.lock().unwrap().take();
        if let Some(mut h) = serve {
            if tokio::time::timeout(Duration::from_secs(2), &mut h).await.is_err() {
                h.abort();
            }
        }
        if let Some(h) = inner.reaper_task.lock().unwrap().take() {
            h.abort();
        }
        let sandboxes: Vec<Arc<Sandbox>> = inner.sandboxes.lock().unwrap().drain().map(|(_, v)| v).collect();
        for sb in sandboxes {
            let _ = std::fs::remove_dir_all(&sb.dir);
        }
        if inner.owns_root {
            let _ = std::fs::remove_dir_all(&inner.root);
        }
    }
}

#[cfg(test)]
mod tests;
