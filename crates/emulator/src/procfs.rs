//! /proc scanning and signalling of process trees.
//!
//! A process belongs to the tree its [`Entry::mark`] names: the leaf cgroup it is in, when the
//! emulator tracks trees by cgroup (see [`crate::cgroup`]), else the `CREATEOS_EMULATOR_MARK`
//! of its initial environment.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use super::cgroup::{self, Leaf};

pub(crate) const MARK_VAR: &str = "CREATEOS_EMULATOR_MARK";

/// A live (non-zombie) process.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub pid: i32,
    pub pgid: i32,
    /// The tree it belongs to (`<instance>:<id>`): from its leaf cgroup, else from
    /// `CREATEOS_EMULATOR_MARK` in its initial environment; `None` when neither names one.
    pub mark: Option<String>,
}

pub(crate) type Filter = Arc<dyn Fn(&Entry) -> bool + Send + Sync>;

/// Parse `/proc/<pid>/stat`: returns (state, pgid, start time in clock ticks since boot).
fn read_stat(pid: &str) -> Option<(u8, i32, u64)> {
    let s = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = s.iter().rposition(|b| *b == b')')?;
    let rest = std::str::from_utf8(&s[close + 1..]).ok()?;
    let mut it = rest.split_ascii_whitespace();
    let state = it.next()?.as_bytes()[0];
    let _ppid = it.next()?;
    let pgid: i32 = it.next()?.parse().ok()?;
    // Fields 6 to 21 of stat(5) lie between the pgrp and the start time.
    let start: u64 = it.nth(16)?.parse().ok()?;
    Some((state, pgid, start))
}

/// When `pid` started (clock ticks since boot); `None` when it is gone.
pub(crate) fn start_ticks(pid: i32) -> Option<u64> {
    read_stat(&pid.to_string()).map(|(_, _, start)| start)
}

/// How long a scan reads again the empty environment of a process in the middle of an
/// `execve` before it takes it as empty.
const EXEC_SETTLE: Duration = Duration::from_millis(20);

/// The marker in a process's initial environment. A process in the middle of an `execve` reads
/// an empty environment for a moment (an `environ` opened on the image it is leaving reads
/// nothing once that image is dropped; the new image has its arguments placed a moment before
/// its environment), and a marked one would be passed over. So an empty environment is taken
/// as it is only when read again ~200 µs later, still empty, between two reads of the command
/// line that are equal and not empty (no `execve` overlapped the read: a chain of quick execs
/// changes the command line each time); else it is read again, 20 ms at most, then taken as
/// empty. A process that really has an empty environment costs three reads and a short nap.
fn read_mark(pid: &str) -> Option<String> {
    let end = Instant::now() + EXEC_SETTLE;
    loop {
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        if !env.is_empty() {
            return mark_in(&env);
        }
        std::thread::sleep(Duration::from_micros(200));
        let before = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        if !env.is_empty() {
            return mark_in(&env);
        }
        let after = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        if (!before.is_empty() && before == after) || Instant::now() >= end {
            return None;
        }
    }
}

fn mark_in(env: &[u8]) -> Option<String> {
    let key = MARK_VAR.as_bytes();
    for var in env.split(|b| *b == 0) {
        if var.len() > key.len() && var.starts_with(key) && var[key.len()] == b'=' {
            return Some(String::from_utf8_lossy(&var[key.len() + 1..]).into_owned());
        }
    }
    None
}

/// One pass over /proc; returns the live, non-zombie processes the filter accepts.
/// Synchronous (a few hundred small reads); call through `spawn_blocking` from async code.
pub(crate) fn scan(filter: &dyn Fn(&Entry) -> bool) -> Vec<Entry> {
    scan_since(filter, 0)
}

/// [`scan`] of the processes that started at `since` (clock ticks since boot) or later: a
/// tree's processes all start after its leader, and the others cost one read each.
pub(crate) fn scan_since(filter: &dyn Fn(&Entry) -> bool, since: u64) -> Vec<Entry> {
    let me = std::process::id().to_string();
    let cgroups = cgroup::any_active();
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for d in dir.flatten() {
        let name = d.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.as_bytes()[0].is_ascii_digit() || name == me {
            continue;
        }
        let Some((state, pgid, start)) = read_stat(name) else {
            continue;
        };
        if state == b'Z' || state == b'X' || state == b'x' || start < since {
            continue;
        }
        let Ok(pid) = name.parse::<i32>() else {
            continue;
        };
        let from_cgroup = if cgroups { cgroup::mark_of(name) } else { None };
        let e = Entry { pid, pgid, mark: from_cgroup.or_else(|| read_mark(name)) };
        if filter(&e) {
            out.push(e);
        }
    }
    out
}

pub(crate) async fn scan_async(filter: Filter) -> Vec<Entry> {
    tokio::task::spawn_blocking(move || scan(&*filter)).await.unwrap_or_default()
}

/// Send `sig` to every entry, and to every process group (pgid) found among them whose id is
/// in `groups` (process groups the emulator created).
pub(crate) fn signal_entries(entries: &[Entry], sig: Signal, groups: &[i32]) {
    for e in entries {
        let _ = kill(Pid::from_raw(e.pid), sig);
    }
    for g in groups {
        if entries.iter().any(|e| e.pgid == *g) {
            let _ = killpg(Pid::from_raw(*g), sig);
        }
    }
}

/// SIGKILL everything the filter selects until nothing is left or the deadline passes.
/// The members of a selected tree with a leaf cgroup are killed while it is frozen (no fork
/// slips past). Returns true when nothing selected is alive any more.
pub(crate) async fn kill_until_gone(filter: Filter, deadline: Instant) -> bool {
    loop {
        let found = scan_async(filter.clone()).await;
        if found.is_empty() {
            return true;
        }
        let mut leaves: Vec<Arc<Leaf>> = Vec::new();
        let mut marks: Vec<&str> = found.iter().filter_map(|e| e.mark.as_deref()).collect();
        marks.sort_unstable();
        marks.dedup();
        for m in marks {
            if let Some(l) = cgroup::leaf_of_mark(m) {
                leaves.push(l);
            }
        }
        if !leaves.is_empty() {
            let _ = tokio::task::spawn_blocking(move || cgroup::signal_frozen(&leaves, Signal::SIGKILL)).await;
        }
        let mut groups: Vec<i32> = found.iter().map(|e| e.pgid).collect();
        groups.sort_unstable();
        groups.dedup();
        // Only kill groups whose leader is a selected process or whose members all are selected
        // (pgid of a selected process is one of our groups, or the process's own group).
        let groups: Vec<i32> = groups.into_iter().filter(|g| found.iter().any(|e| e.pid == *g)).collect();
        signal_entries(&found, Signal::SIGKILL, &groups);
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(crate) fn signal_name(sig: i32) -> String {
    match Signal::try_from(sig) {
        Ok(s) => s.as_str().to_string(),
        Err(_) => format!("SIG{sig}"),
    }
}

pub(crate) fn parse_signal(name: &str) -> Option<Signal> {
    let upper = name.trim().to_ascii_uppercase();
    if let Ok(n) = upper.parse::<i32>() {
        return Signal::try_from(n).ok();
    }
    let full = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    full.parse::<Signal>().ok()
}
