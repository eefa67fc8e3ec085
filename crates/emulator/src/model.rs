//! Sandboxes, managed processes, the output journal and the tree reaper.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::watch;

use super::cgroup::{self, Leaf};
use super::isolate;
use super::procfs::{self, Entry, Filter, MARK_VAR};
use super::{Inner, TerminationScope};

/// Max raw bytes per data frame.
pub(crate) const FRAME_MAX: usize = 64 * 1024;
/// Per-stream cap of the full-output recording behind `Emulator::process_output`.
pub(crate) const CAPTURE_CAP: usize = 64 * 1024 * 1024;
/// Reaper poll interval while some tree is still alive.
const REAP_POLL: Duration = Duration::from_millis(25);
/// The exit frame waits at most this long for the pipes to reach EOF after the leader exited.
const EOF_GRACE: Duration = Duration::from_millis(100);
/// How long past the grace the exit frame waits while output is still unread in a pipe (a
/// background child that writes without end holds it back no longer than this).
const UNREAD_WAIT_MAX: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------- ids and time

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// `sb-` + 26 Crockford base32 chars (48-bit ms timestamp + 80 random bits, ULID layout).
pub(crate) fn new_sandbox_id() -> String {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
    let rnd: u128 = rand::random::<u128>() & ((1u128 << 80) - 1);
    let v = ((ms & ((1u128 << 48) - 1)) << 80) | rnd;
    let mut s = String::with_capacity(29);
    s.push_str("sb-");
    for i in 0..26 {
        let shift = 125 - 5 * i;
        s.push(CROCKFORD[((v >> shift) & 31) as usize] as char);
    }
    s
}

pub(crate) fn new_hex_id(prefix: &str) -> String {
    format!("{prefix}{}", &uuid::Uuid::new_v4().simple().to_string()[..16])
}

/// RFC 3339 UTC timestamp with milliseconds.
pub(crate) fn rfc3339_now() -> String {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    let ms = d.subsec_millis();
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z", sod / 3600, (sod / 60) % 60, sod % 60)
}

// ---------------------------------------------------------------- journal

#[derive(Clone, Debug)]
pub(crate) struct Frame {
    pub seq: u64,
    /// 0 = stdout, 1 = stderr.
    pub stream: u8,
    pub data: Bytes,
}

pub(crate) struct Journal {
    frames: VecDeque<Frame>,
    bytes: usize,
    cap: usize,
    newest: u64,
}

pub(crate) enum Read {
    Frames(Vec<Frame>),
    Expired { oldest: u64 },
}

impl Journal {
    fn new(cap: usize) -> Journal {
        Journal { frames: VecDeque::new(), bytes: 0, cap, newest: 0 }
    }

    fn push(&mut self, stream: u8, data: Bytes) {
        self.newest += 1;
        self.bytes += data.len();
        self.frames.push_back(Frame { seq: self.newest, stream, data });
        while self.bytes > self.cap && self.frames.len() > 1 {
            let f = self.frames.pop_front().unwrap();
            self.bytes -= f.data.len();
        }
    }

    pub fn newest_seq(&self) -> u64 {
        self.newest
    }

    #[cfg(test)]
    pub fn new_for_test(cap: usize) -> Journal {
        Journal::new(cap)
    }

    #[cfg(test)]
    pub fn push_for_test(&mut self, stream: u8, data: Bytes) {
        self.push(stream, data);
    }

    pub fn oldest_seq(&self) -> u64 {
        self.frames.front().map(|f| f.seq).unwrap_or(self.newest + 1)
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Drop every frame but keep the numbering: `newest_seq` stays, `oldest_seq` becomes
    /// `newest_seq + 1`, so a replay of anything already written answers `Expired`.
    pub fn clear(&mut self) {
        self.frames = VecDeque::new();
        self.bytes = 0;
    }

    /// Frames with seq > after (at most `max_bytes` raw, at least one frame when available).
    pub fn read_after(&self, after: u64, max_bytes: usize) -> Read {
        let oldest = self.oldest_seq();
        if after + 1 < oldest {
            return Read::Expired { oldest };
        }
        let mut out = Vec::new();
        if after >= self.newest {
            return Read::Frames(out);
        }
        let start = (after + 1 - oldest) as usize;
        let mut total = 0;
        for f in self.frames.iter().skip(start) {
            if !out.is_empty() && total + f.data.len() > max_bytes {
                break;
            }
            total += f.data.len();
            out.push(f.clone());
        }
        Read::Frames(out)
    }
}

// ---------------------------------------------------------------- processes

#[derive(Default, Debug)]
pub(crate) struct ProcState {
    pub leader_exited: bool,
    pub tree_exited_real: bool,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub finished_at: Option<String>,
    pub eof: [bool; 2],
    /// The exit frame may be sent (leader exited and pipes at EOF, or 100 ms passed).
    pub exit_ready: bool,
    pub terminating: bool,
    /// Fault: report `tree_exited:false` regardless of the truth.
    pub tree_hold: bool,
    /// Fault `fastStream`: fake frame count served to a client.
    pub fake_newest: u64,
    empty_scans: u8,
}

impl ProcState {
    pub fn tree_exited(&self) -> bool {
        self.tree_exited_real && !self.tree_hold
    }
}

pub(crate) struct Proc {
    pub id: String,
    pub marker: String,
    /// Its tree's cgroup, when trees are tracked by cgroup.
    pub leaf: Option<Arc<Leaf>>,
    pub pid: i32,
    pub cmd: String,
    pub args: Vec<String>,
    pub cwd: String,
    pub created_at: String,
    pub st: Mutex<ProcState>,
    pub journal: Mutex<Journal>,
    pub tx: watch::Sender<u64>,
    pub stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    pub stdin_closed: AtomicBool,
    pub input_seq: AtomicU64,
    pub capture: Mutex<[Vec<u8>; 2]>,
    /// This process's key in [`Inner::retention`].
    pub key: u64,
    /// One of `KEPT_*`; changed only under the [`Inner::retention`] lock.
    pub kept: AtomicU8,
    /// A `connect` stream has sent this process's exit frame (for
    /// [`crate::FaultRule::after_exit_frame`]).
    pub exit_sent: AtomicBool,
    /// Duplicates of the stdout and stderr read ends, to ask how many bytes still wait in the
    /// pipes (`FIONREAD`) while the exit frame waits for them; dropped once it is sent.
    pub peek: Mutex<Vec<std::os::fd::OwnedFd>>,
    /// A virtual process's signals ([`crate::virt`]); `None` for a real program.
    pub virt: Option<crate::virt::Control>,
}

/// Running, or exited and not yet handed to the retention budget.
pub(crate) const KEPT_LIVE: u8 = 0;
/// Exited; its output counts against the budget.
pub(crate) const KEPT_QUEUED: u8 = 1;
/// Its output was dropped to stay within the budget.
pub(crate) const KEPT_EVICTED: u8 = 2;
/// Its sandbox was deleted: never counted (again).
pub(crate) const KEPT_REMOVED: u8 = 3;

impl Proc {
    /// A process record as it starts: no output, no cgroup, no stdin, no pipes, not virtual
    /// (callers set what they have with struct update syntax).
    pub fn fresh(inner: &Inner, id: String, pid: i32, cmd: &str, args: Vec<String>, cwd: String) -> Proc {
        let (tx, _rx) = watch::channel(0u64);
        Proc {
            marker: inner.marker_for(&id),
            id,
            leaf: None,
            pid,
            cmd: cmd.to_string(),
            args,
            cwd,
            created_at: rfc3339_now(),
            st: Mutex::new(ProcState::default()),
            journal: Mutex::new(Journal::new(inner.journal_bytes)),
            tx,
            stdin: tokio::sync::Mutex::new(None),
            stdin_closed: AtomicBool::new(false),
            input_seq: AtomicU64::new(0),
            capture: Mutex::new([Vec::new(), Vec::new()]),
            key: inner.next_key.fetch_add(1, Ordering::Relaxed),
            kept: AtomicU8::new(KEPT_LIVE),
            exit_sent: AtomicBool::new(false),
            peek: Mutex::new(Vec::new()),
            virt: None,
        }
    }

    /// Output the process wrote on `stream` (0 stdout, 1 stderr), at most [`FRAME_MAX`]
    /// bytes: into the capture (up to [`CAPTURE_CAP`]) and the journal, as one frame.
    pub fn record(&self, stream: u8, data: Bytes) {
        {
            let mut cap = self.capture.lock().unwrap();
            let c = &mut cap[stream as usize];
            let room = CAPTURE_CAP.saturating_sub(c.len());
            c.extend_from_slice(&data[..data.len().min(room)]);
        }
        self.journal.lock().unwrap().push(stream, data);
        self.bump();
    }

    pub fn bump(&self) {
        self.tx.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Journal plus capture bytes held for this process.
    fn retained_bytes(&self) -> usize {
        let journal = self.journal.lock().unwrap().bytes();
        let cap = self.capture.lock().unwrap();
        journal + cap[0].len() + cap[1].len()
    }

    /// Drop the journal's frames (keeping its numbering) and the capture. Called under the
    /// [`Inner::retention`] lock.
    fn evict(&self) {
        self.kept.store(KEPT_EVICTED, Ordering::SeqCst);
        self.journal.lock().unwrap().clear();
        *self.capture.lock().unwrap() = [Vec::new(), Vec::new()];
        self.bump();
    }

    pub fn to_json(&self) -> Value {
        let st = self.st.lock().unwrap();
        let (oldest, newest, bytes) = {
            let j = self.journal.lock().unwrap();
            (j.oldest_seq(), j.newest_seq(), j.bytes())
        };
        let newest = newest.max(st.fake_newest);
        let state = if st.leader_exited {
            "exited"
        } else if st.terminating {
            "terminating"
        } else {
            "running"
        };
        json!({
            "process_id": self.id,
            "kind": "process",
            "pid": self.pid,
            "state": state,
            "leader_exited": st.leader_exited,
            "tree_exited": st.tree_exited(),
            "created_at": self.created_at,
            "finished_at": st.finished_at,
            "exit_code": st.exit_code,
            "signal": st.signal,
            "cmd": self.cmd,
            "args": self.args,
            "cwd": self.cwd,
            "foreground": null,
            "output": {"oldest_seq": oldest, "newest_seq": newest, "bytes": bytes},
        })
    }

    /// Selects this process's tree in a /proc scan (marker, plus the process group while the
    /// group is still known to be ours).
    pub fn filter(&self, inner: &Inner) -> Filter {
        let marker = self.marker.clone();
        let pid = self.pid;
        let group_live = inner.groups.lock().unwrap().contains_key(&pid);
        Arc::new(move |e: &Entry| e.mark.as_deref() == Some(marker.as_str()) || (group_live && e.pgid == pid))
    }
}

pub(crate) struct Sandbox {
    pub id: String,
    pub dir: PathBuf,
    pub workspace: PathBuf,
    pub shape: Value,
    pub procs: Mutex<Vec<Arc<Proc>>>,
    /// Every marker used in this sandbox (processes and execs) and every leader pid.
    pub markers: Mutex<HashSet<String>>,
    pub leaders: Mutex<HashSet<i32>>,
    /// Woken by every Files API write (a virtual process's start gate waits on it).
    pub files: tokio::sync::Notify,
}

impl Sandbox {
    pub fn process(&self, id: &str) -> Option<Arc<Proc>> {
        self.procs.lock().unwrap().iter().find(|p| p.id == id).cloned()
    }

    pub fn filter(&self, inner: &Inner) -> Filter {
        let markers = self.markers.lock().unwrap().clone();
        let live = inner.live_groups();
        let leaders: HashSet<i32> = self.leaders.lock().unwrap().intersection(&live).copied().collect();
        Arc::new(move |e: &Entry| e.mark.as_deref().is_some_and(|m| markers.contains(m)) || leaders.contains(&e.pgid))
    }

    /// Map a client path onto the host: `/workspace` prefix → workspace dir, else identity.
    pub fn map_path(&self, p: &str) -> Result<PathBuf, &'static str> {
        if p.contains('\0') {
            return Err("path must not contain NUL");
        }
        if !p.starts_with('/') {
            return Err("path must be absolute");
        }
        if Path::new(p).components().any(|c| matches!(c, Component::ParentDir)) {
            return Err("path must not contain '..'");
        }
        if p == "/workspace" {
            return Ok(self.workspace.clone());
        }
        if let Some(rest) = p.strip_prefix("/workspace/") {
            return Ok(self.workspace.join(rest));
        }
        Ok(PathBuf::from(p))
    }

    /// Files API path: mapped, and only under /tmp/ or the workspace.
    pub fn file_path(&self, p: &str) -> Result<PathBuf, &'static str> {
        let host = self.map_path(p)?;
        if host.starts_with(&self.workspace) || (host.starts_with("/tmp") && host != Path::new("/tmp")) {
            Ok(host)
        } else {
            Err("path must be under /tmp/ or the sandbox workspace")
        }
    }

    pub fn cwd_path(&self, cwd: Option<&str>) -> Result<PathBuf, &'static str> {
        match cwd {
            None | Some("") => Ok(self.workspace.clone()),
            Some(c) if !c.starts_with('/') => {
                if c.contains('\0') || Path::new(c).components().any(|x| matches!(x, Component::ParentDir)) {
                    return Err("invalid cwd");
                }
                Ok(self.workspace.join(c))
            }
            Some(c) => self.map_path(c),
        }
    }
}

pub(crate) fn create_sandbox(inner: &Arc<Inner>, shape: Value) -> std::io::Result<Arc<Sandbox>> {
    let id = new_sandbox_id();
    let dir = inner.root.join(&id);
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace)?;
    let shape = if shape.is_null() { Value::String("default".into()) } else { shape };
    let sb = Arc::new(Sandbox {
        id: id.clone(),
        dir,
        workspace,
        shape,
        procs: Mutex::new(Vec::new()),
        markers: Mutex::new(HashSet::new()),
        leaders: Mutex::new(HashSet::new()),
        files: tokio::sync::Notify::new(),
    });
    inner.sandboxes.lock().unwrap().insert(id, sb.clone());
    Ok(sb)
}

/// The environment every sandbox process starts with (before `HOME`, the sandbox variables,
/// the caller's `env` and the tree marker), like a fresh Linux sandbox's.
const SANDBOX_ENV: &[(&str, &str)] = &[
    ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
    ("LANG", "C.UTF-8"),
    ("SHELL", "/bin/bash"),
    ("USER", "sandbox"),
    ("LOGNAME", "sandbox"),
];

pub(crate) struct SpawnSpec<'a> {
    pub cmd: &'a str,
    pub args: &'a [String],
    pub cwd: PathBuf,
    pub env: &'a HashMap<String, String>,
    pub stdin: Stdio,
    /// The private view of `crate::isolate` (a mount and cgroup namespace of its own), for
    /// managed processes. An `/exec` runs without it: a namespace's teardown when its last
    /// process exits can take seconds on a loaded machine, and an exec is a short command
    /// whose answer waits for that exit.
    pub private_view: bool,
}

/// Spawn a marked child in its own process group, and in a leaf cgroup of its own when trees
/// are tracked by cgroup (the child moves itself there before it executes the command, so
/// nothing it runs starts outside). Registers marker, group and leaf.
pub(crate) fn spawn_marked(
    inner: &Arc<Inner>,
    sb: &Sandbox,
    id: &str,
    spec: SpawnSpec<'_>,
) -> std::io::Result<(Child, String)> {
    let marker = inner.marker_for(id);
    let mut cmd = Command::new(spec.cmd);
    // A sandbox has no developer dotfiles and none of the host's variables: a minimal
    // environment of its own, with HOME in the sandbox (so `bash -l` reads nothing of ours).
    cmd.args(spec.args)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(SANDBOX_ENV.iter().copied())
        .env("HOME", &sb.workspace)
        .env("CREATEOS_SANDBOX_ID", &sb.id)
        .env("CREATEOS_WORKSPACE", &sb.workspace)
        .envs(spec.env)
        .env(MARK_VAR, &marker)
        .process_group(0)
        .stdin(spec.stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    sb.markers.lock().unwrap().insert(marker.clone());
    let cg = inner.cgroups.as_ref();
    // Held open until the spawn returned: the child writes through these fds.
    let procs_files = match cg {
        Some(cg) => {
            let (_, files) = cg.new_leaf(&marker, id)?;
            let fds = cgroup::raw_fds(&files);
            // SAFETY: the closure runs in the forked child before exec and only calls
            // write(2) on fds opened (O_CLOEXEC) before the fork; it allocates nothing.
            unsafe {
                cmd.pre_exec(move || {
                    for fd in &fds {
                        if nix::libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
            files
        }
        None => Vec::new(),
    };
    // After the leaf: a private view (`/workspace`, the leaf as the cgroup root) where the
    // host allows it (see `crate::isolate`).
    let leaf_dirs = cg.and_then(|cg| cg.leaf(&marker)).map(|l| l.dirs().to_vec());
    let plan = isolate::get().plan(Some(&sb.workspace), leaf_dirs.as_deref());
    if spec.private_view && !plan.is_empty() {
        // SAFETY: the closure only makes system calls on memory allocated before the fork.
        unsafe {
            cmd.pre_exec(move || plan.apply());
        }
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            if let Some(cg) = cg {
                cg.drop_leaf(&marker);
            }
            return Err(e);
        }
    };
    drop(procs_files);
    let pid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(-1);
    if let Some(leaf) = cg.and_then(|cg| cg.leaf(&marker)) {
        leaf.set_leader(pid);
    }
    inner.unreaped.fetch_add(1, Ordering::SeqCst);
    inner.groups.lock().unwrap().insert(pid, 0);
    sb.leaders.lock().unwrap().insert(pid);
    Ok((child, marker))
}

pub(crate) fn note_reaped(inner: &Inner, pid: i32) {
    if let Some(r) = inner.groups.lock().unwrap().get_mut(&pid) {
        *r = (*r).max(1);
    }
    if let Some(cg) = &inner.cgroups {
        cg.leader_reaped(pid);
    }
    inner.unreaped.fetch_sub(1, Ordering::SeqCst);
    inner.reaped_notify.notify_waiters();
    inner.reaper_wake.notify_one();
}

/// (exit_code, signal name) from an exit status.
pub(crate) fn split_status(status: std::process::ExitStatus) -> (Option<i32>, Option<String>) {
    use std::os::unix::process::ExitStatusExt;
    match status.code() {
        Some(c) => (Some(c), None),
        None => (None, status.signal().map(procfs::signal_name)),
    }
}

pub(crate) fn start_process(
    inner: &Arc<Inner>,
    sb: &Arc<Sandbox>,
    cmd: &str,
    args: Vec<String>,
    cwd_req: Option<&str>,
    env: &HashMap<String, String>,
) -> Result<Arc<Proc>, String> {
    let cwd = sb.cwd_path(cwd_req).map_err(ToString::to_string)?;
    // A `cwd` that is not a directory here (yet, or only inside the command's own view) is
    // not a refusal: the process starts in the workspace, and a command that needs that
    // directory says so itself (the client's script `cd`s there and reports a failure).
    let cwd = if cwd.is_dir() { cwd } else { sb.workspace.clone() };
    // The record shows the `cwd` asked for, else the directory it runs in.
    let shown_cwd = cwd_req.map(str::to_string).unwrap_or_else(|| cwd.to_string_lossy().into_owned());
    if inner.virtual_processes {
        if let Some(plan) = crate::virt::plan(cmd, &args) {
            return Ok(crate::virt::start(inner, sb, cmd, args, shown_cwd, plan));
        }
    }
    let id = new_hex_id("proc_");
    let (mut child, marker) = spawn_marked(
        inner,
        sb,
        &id,
        SpawnSpec { cmd, args: &args, cwd: cwd.clone(), env, stdin: Stdio::piped(), private_view: true },
    )
    .map_err(|e| format!("cannot start {cmd}: {e}"))?;
    let pid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(-1);
    let leaf = inner.cgroups.as_ref().and_then(|cg| cg.leaf(&marker));
    let peek: Vec<std::os::fd::OwnedFd> = [
        child.stdout.as_ref().and_then(|o| o.as_fd().try_clone_to_owned().ok()),
        child.stderr.as_ref().and_then(|e| e.as_fd().try_clone_to_owned().ok()),
    ]
    .into_iter()
    .flatten()
    .collect();
    let proc = Arc::new(Proc {
        marker,
        leaf,
        stdin: tokio::sync::Mutex::new(child.stdin.take()),
        peek: Mutex::new(peek),
        ..Proc::fresh(inner, id, pid, cmd, args, shown_cwd)
    });
    sb.procs.lock().unwrap().push(proc.clone());
    if let Some(out) = child.stdout.take() {
        tokio::spawn(pump(inner.clone(), proc.clone(), out, 0));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(pump(inner.clone(), proc.clone(), err, 1));
    }
    tokio::spawn(wait_leader(inner.clone(), proc.clone(), child));
    inner.reaper_wake.notify_one();
    Ok(proc)
}

async fn pump<R: tokio::io::AsyncRead + Unpin>(inner: Arc<Inner>, proc: Arc<Proc>, mut r: R, stream: u8) {
    let mut buf = vec![0u8; FRAME_MAX];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => proc.record(stream, Bytes::copy_from_slice(&buf[..n])),
        }
    }
    proc.st.lock().unwrap().eof[stream as usize] = true;
    proc.bump();
    retire(&inner, &proc);
}

/// Once the leader has exited and both pipes are at EOF (the output is final), hand the
/// process's output to the retention budget and drop the output of the oldest exited processes
/// while the budget is exceeded. Runs once per process; a no-op before that moment and for a
/// process whose sandbox was deleted.
pub(crate) fn retire(inner: &Inner, proc: &Arc<Proc>) {
    {
        let st = proc.st.lock().unwrap();
        if !st.leader_exited || st.eof != [true, true] {
            return;
        }
    }
    let mut r = inner.retention.lock().unwrap();
    // `kept` changes only under this lock: the first caller queues the process, and a later
    // one (or one after its sandbox was deleted) finds it no longer live.
    if proc.kept.load(Ordering::SeqCst) != KEPT_LIVE {
        return;
    }
    proc.kept.store(KEPT_QUEUED, Ordering::SeqCst);
    let bytes = proc.retained_bytes();
    for old in r.exited(proc.key, bytes, Arc::downgrade(proc)) {
        if let Some(old) = old.upgrade() {
            old.evict();
        }
    }
}

/// Take a deleted sandbox's processes out of the retention budget.
pub(crate) fn forget_retained(inner: &Inner, procs: &[Arc<Proc>]) {
    let mut r = inner.retention.lock().unwrap();
    for p in procs {
        p.kept.store(KEPT_REMOVED, Ordering::SeqCst);
        r.remove(p.key);
    }
}

/// Whether the stdout or stderr pipe still holds bytes the pump has not read. Asked twice, a
/// moment apart: a read that just took the bytes has pushed them into the journal by then.
async fn unread_output(proc: &Proc) -> bool {
    let pending = || {
        proc.peek.lock().unwrap().iter().any(|fd| {
            let mut n: nix::libc::c_int = 0;
            // SAFETY: FIONREAD writes one c_int through the pointer, to a local that outlives
            // the call; the fd is open (owned by `peek`).
            let rc = unsafe { nix::libc::ioctl(fd.as_raw_fd(), nix::libc::FIONREAD, &mut n) };
            rc == 0 && n > 0
        })
    };
    if pending() {
        return true;
    }
    tokio::time::sleep(Duration::from_millis(2)).await;
    pending()
}

/// The retention budget's handle on a process.
pub(crate) type Retained = Weak<Proc>;

async fn wait_leader(inner: Arc<Inner>, proc: Arc<Proc>, mut child: Child) {
    let status = child.wait().await;
    note_reaped(&inner, proc.pid);
    // Stdin stays open until the leader exits (or stdin/close).
    *proc.stdin.lock().await = None;
    let mut rx = proc.tx.subscribe();
    {
        let mut st = proc.st.lock().unwrap();
        st.leader_exited = true;
        st.finished_at = Some(rfc3339_now());
        if let Ok(s) = status {
            let (c, sig) = split_status(s);
            st.exit_code = c;
            st.signal = sig;
        }
    }
    proc.bump();
    inner.reaper_wake.notify_one();
    // The pipes reach EOF at once unless something of the tree still holds them. Past the
    // grace the exit frame goes out without waiting for EOF, but never while output the
    // command wrote is still in a pipe (a busy machine may not have read it yet): that output
    // comes before the exit frame, as it did on the wire of the command.
    let mut deadline = tokio::time::Instant::now() + EOF_GRACE;
    let last_call = tokio::time::Instant::now() + UNREAD_WAIT_MAX;
    loop {
        rx.borrow_and_update();
        if proc.st.lock().unwrap().eof == [true, true] {
            break;
        }
        if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
            if tokio::time::Instant::now() < last_call && unread_output(&proc).await {
                deadline = tokio::time::Instant::now() + Duration::from_millis(10);
                continue;
            }
            break;
        }
    }
    proc.peek.lock().unwrap().clear();
    // The exit frame tells the truth at this moment: look at the tree now (two scans, as the
    // reaper does) rather than waiting for the reaper's next round.
    if !proc.st.lock().unwrap().tree_exited_real {
        let gone = match &proc.leaf {
            // An empty cgroup stays empty: nothing of the tree is left to fork into it, unless
            // a member left it (then it is moved back and the tree is not gone).
            Some(leaf) => leaf.is_empty() && !recapture(&inner, &proc).await,
            None => {
                let marker = proc.marker.clone();
                let pgid = proc.pid;
                let filter: Filter =
                    Arc::new(move |e: &Entry| e.mark.as_deref() == Some(marker.as_str()) || e.pgid == pgid);
                procfs::scan_async(filter.clone()).await.is_empty() && procfs::scan_async(filter).await.is_empty()
            }
        };
        if gone {
            proc.st.lock().unwrap().tree_exited_real = true;
        }
    }
    // Pipes at EOF: the output is final and counts against the budget before any client can
    // see the exit frame (a no-op when a straggler still holds a pipe; pump retires it then).
    retire(&inner, &proc);
    proc.st.lock().unwrap().exit_ready = true;
    proc.bump();
}

/// Background task: while any managed tree is not known to be gone, or a reaped leader's
/// process group (or cgroup) may still hold processes, look every ~25 ms, flip `tree_exited`,
/// forget process groups that became empty and remove cgroups that did. A tree with a cgroup
/// is gone once its leader was reaped and the cgroup lists no process (an empty cgroup stays
/// empty); a tree without one after two /proc scans that found none of it (one scan serves
/// every such check).
pub(crate) async fn reaper(inner: Arc<Inner>) {
    loop {
        if inner.shutdown.is_cancelled() {
            return;
        }
        let pending: Vec<Arc<Proc>> = {
            let sbs = inner.sandboxes.lock().unwrap();
            sbs.values()
                .flat_map(|sb| sb.procs.lock().unwrap().clone())
                .filter(|p| p.virt.is_none() && !p.st.lock().unwrap().tree_exited_real)
                .collect()
        };
        let groups: HashMap<i32, u8> = inner.groups.lock().unwrap().clone();
        let lingering = inner.cgroups.as_ref().map_or(0, |cg| cg.sweep());
        if pending.is_empty() && lingering == 0 && !groups.values().any(|state| *state >= 1) {
            tokio::select! {
                _ = inner.reaper_wake.notified() => {}
                _ = inner.shutdown.cancelled() => return,
            }
            continue;
        }
        for p in pending.iter().filter(|p| p.leaf.is_some()) {
            let empty = p.leaf.as_ref().is_some_and(|l| l.is_empty());
            let leader_exited = p.st.lock().unwrap().leader_exited;
            if leader_exited && empty && !recapture(&inner, p).await {
                p.st.lock().unwrap().tree_exited_real = true;
                p.bump();
            }
        }
        let markers: HashSet<String> = pending.iter().filter(|p| p.leaf.is_none()).map(|p| p.marker.clone()).collect();
        // A /proc scan serves trees without a cgroup and reaped leaders' groups; a running
        // leader's group needs none (its state changes only once the leader is reaped).
        if markers.is_empty() && !groups.values().any(|state| *state >= 1) {
            tokio::select! {
                _ = tokio::time::sleep(REAP_POLL) => {}
                _ = inner.shutdown.cancelled() => return,
            }
            continue;
        }
        let group_ids: HashSet<i32> = groups.keys().copied().collect();
        let found = procfs::scan_async(Arc::new(move |e: &Entry| {
            e.mark.as_deref().is_some_and(|m| markers.contains(m)) || group_ids.contains(&e.pgid)
        }))
        .await;
        {
            let mut g = inner.groups.lock().unwrap();
            for pgid in groups.keys() {
                let empty = !found.iter().any(|e| e.pgid == *pgid);
                if let Some(state) = g.get_mut(pgid) {
                    if *state >= 1 {
                        *state = if empty { *state + 1 } else { 1 };
                        if *state >= 3 {
                            g.remove(pgid);
                        }
                    }
                }
            }
        }
        for p in pending.iter().filter(|p| p.leaf.is_none()) {
            let alive = found.iter().any(|e| {
                e.mark.as_deref() == Some(p.marker.as_str()) || (groups.contains_key(&p.pid) && e.pgid == p.pid)
            });
            let mut st = p.st.lock().unwrap();
            if st.leader_exited && !alive {
                st.empty_scans += 1;
                if st.empty_scans >= 2 {
                    st.tree_exited_real = true;
                    drop(st);
                    p.bump();
                }
            } else {
                st.empty_scans = 0;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(REAP_POLL) => {}
            _ = inner.shutdown.cancelled() => return,
        }
    }
}

/// The membership check of a tree with a cgroup, made whenever its leaf looks empty: a live
/// process that carries the tree's marker or is in its process group but is not in the leaf
/// left it (by writing itself into another cgroup); it is moved back into the leaf, so it is
/// seen alive and killed with the tree. True when one was found, or when the leaf has members
/// again: the reaper and the leader's waiter check at once, and the one that finds a stray
/// already moved back by the other sees it as a member, not as a stray (its caller's "the leaf
/// looked empty" is from before the move).
async fn recapture(inner: &Inner, p: &Arc<Proc>) -> bool {
    let Some(leaf) = p.leaf.clone() else { return false };
    let marker = p.marker.clone();
    let group = inner.groups.lock().unwrap().contains_key(&p.pid).then_some(p.pid);
    tokio::task::spawn_blocking(move || !leaf.recapture(&marker, group).is_empty() || !leaf.is_empty())
        .await
        .unwrap_or(true)
}

/// Whether anything of the tree is alive: its cgroup's members (and whatever left it), else a
/// /proc scan.
async fn tree_alive(inner: &Inner, p: &Arc<Proc>, filter: &Filter) -> bool {
    match &p.leaf {
        Some(leaf) => !leaf.is_empty() || recapture(inner, p).await,
        None => !procfs::scan_async(filter.clone()).await.is_empty(),
    }
}

/// Wait until the leader exited and the tree is gone, looking every 10 ms.
async fn wait_tree_gone(inner: &Inner, p: &Arc<Proc>, filter: &Filter, deadline: Instant) -> bool {
    loop {
        let alive = tree_alive(inner, p, filter).await;
        let leader = p.st.lock().unwrap().leader_exited;
        if !alive && leader {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Send `sig` to every process of the tree: with a cgroup, to every member while it is frozen
/// (freeze, signal, thaw: nothing forks past it); else to every process a /proc scan finds.
async fn signal_tree(p: &Arc<Proc>, filter: &Filter, sig: Signal) {
    match &p.leaf {
        Some(leaf) => {
            let leaves = vec![leaf.clone()];
            let _ = tokio::task::spawn_blocking(move || cgroup::signal_frozen(&leaves, sig)).await;
        }
        None => {
            let found = procfs::scan_async(filter.clone()).await;
            procfs::signal_entries(&found, sig, &[p.pid]);
        }
    }
}

/// SIGKILL the tree until it is gone or the deadline passes.
async fn kill_tree(inner: &Inner, p: &Arc<Proc>, filter: &Filter, deadline: Instant) {
    if p.leaf.is_none() {
        procfs::kill_until_gone(filter.clone(), deadline).await;
        return;
    }
    while tree_alive(inner, p, filter).await && Instant::now() < deadline {
        signal_tree(p, filter, Signal::SIGKILL).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// DELETE semantics: SIGTERM, wait up to `grace`, SIGKILL what is left, wait up to 2 s more;
/// to the whole tree or to the leader's process group only ([`TerminationScope`]). Returns
/// whether the tree (every descendant, whatever the scope) is gone.
pub(crate) async fn terminate(inner: &Inner, p: &Arc<Proc>, grace: Duration) -> bool {
    if let Some(ctl) = &p.virt {
        return crate::virt::terminate(p, ctl, grace).await;
    }
    if p.st.lock().unwrap().tree_exited_real {
        return true;
    }
    {
        p.st.lock().unwrap().terminating = true;
    }
    p.bump();
    let gone = match inner.termination {
        TerminationScope::Tree => terminate_tree(inner, p, grace).await,
        TerminationScope::Group => terminate_group(inner, p, Some(grace)).await,
    };
    {
        let mut st = p.st.lock().unwrap();
        st.terminating = false;
        if gone {
            st.tree_exited_real = true;
        }
    }
    p.bump();
    gone
}

/// [`terminate`] of the whole tree: SIGTERM every process of it (and the leader's group),
/// the grace, SIGKILL until it is gone.
async fn terminate_tree(inner: &Inner, p: &Arc<Proc>, grace: Duration) -> bool {
    let filter = p.filter(inner);
    signal_tree(p, &filter, Signal::SIGTERM).await;
    if !p.st.lock().unwrap().leader_exited {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(p.pid), Signal::SIGTERM);
    }
    let mut gone = wait_tree_gone(inner, p, &filter, Instant::now() + grace).await;
    if !gone {
        let deadline = Instant::now() + Duration::from_secs(2);
        kill_tree(inner, p, &filter, deadline).await;
        gone = wait_tree_gone(inner, p, &filter, deadline).await;
    }
    gone
}

/// Send `sig` to the leader's process group, while the emulator still knows the group as its
/// own (a group forgotten after its leader was reaped and it stayed empty is never signalled: its
/// id may name someone else's group by now).
fn signal_group(inner: &Inner, p: &Proc, sig: Signal) {
    if inner.groups.lock().unwrap().contains_key(&p.pid) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(p.pid), sig);
    }
}

/// Whether a live process (not a zombie, not in `exit`) is in the leader's process group.
async fn group_alive(inner: &Inner, p: &Proc) -> bool {
    if !inner.groups.lock().unwrap().contains_key(&p.pid) {
        return false;
    }
    let pgid = p.pid;
    !procfs::scan_async(Arc::new(move |e: &Entry| e.pgid == pgid)).await.is_empty()
}

/// Wait until the leader exited (was reaped) and its process group is empty, looking every
/// 10 ms.
async fn wait_group_gone(inner: &Inner, p: &Proc, deadline: Instant) -> bool {
    loop {
        let alive = group_alive(inner, p).await;
        if !alive && p.st.lock().unwrap().leader_exited {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// [`terminate`] of the leader's process group only, as the least the API's DELETE may do:
/// SIGTERM to the group, the grace (`None`: none, SIGKILL at once), SIGKILL to the group until
/// it is empty (2 s at most). A descendant that left the group (`setsid`, a double fork into a
/// new session) is not signalled, and the answer is the tree as observed: gone only when
/// nothing of it is alive, inside the group or out.
async fn terminate_group(inner: &Inner, p: &Arc<Proc>, grace: Option<Duration>) -> bool {
    let mut group_gone = false;
    if let Some(grace) = grace {
        signal_group(inner, p, Signal::SIGTERM);
        group_gone = wait_group_gone(inner, p, Instant::now() + grace).await;
    }
    if !group_gone {
        let deadline = Instant::now() + Duration::from_secs(2);
        while group_alive(inner, p).await && Instant::now() < deadline {
            signal_group(inner, p, Signal::SIGKILL);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        group_gone = wait_group_gone(inner, p, deadline).await;
    }
    // What the tree is now. Two looks without a cgroup, as the reaper takes (a process that
    // forks and exits while a /proc scan runs can be missed by one).
    let filter = p.filter(inner);
    if !group_gone || tree_alive(inner, p, &filter).await {
        return false;
    }
    p.leaf.is_some() || !tree_alive(inner, p, &filter).await
}

/// SIGKILL a tree at once and wait (bounded 2 s) for it to vanish; under
/// [`TerminationScope::Group`], the leader's process group only (a DELETE without the
/// grace). Returns whether the tree is gone.
pub(crate) async fn kill_now(inner: &Inner, p: &Arc<Proc>) -> bool {
    if let Some(ctl) = &p.virt {
        return crate::virt::kill_now(p, ctl).await;
    }
    let gone = match inner.termination {
        TerminationScope::Tree => {
            let filter = p.filter(inner);
            kill_tree(inner, p, &filter, Instant::now() + Duration::from_secs(2)).await;
            wait_tree_gone(inner, p, &filter, Instant::now() + Duration::from_secs(2)).await
        }
        TerminationScope::Group => terminate_group(inner, p, None).await,
    };
    if gone {
        p.st.lock().unwrap().tree_exited_real = true;
    }
    p.bump();
    gone
}
