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

/// A live process: not a zombie, and not on its way out ([`Stat::live`]).
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub pid: i32,
    pub pgid: i32,
    /// The tree it belongs to (`<instance>:<id>`): from its leaf cgroup, else from
    /// `CREATEOS_EMULATOR_MARK` in its initial environment; `None` when neither names one.
    pub mark: Option<String>,
}

pub(crate) type Filter = Arc<dyn Fn(&Entry) -> bool + Send + Sync>;

/// `PF_EXITING` in the flags field of `/proc/<pid>/stat` (include/linux/sched.h): set when the
/// process enters `exit`, before the kernel drops it from its cgroup's `cgroup.procs` and long
/// before it is a zombie.
const PF_EXITING: u32 = 0x4;
/// `PF_KTHREAD`: a kernel thread, which has no memory of its own and is never of a tree.
const PF_KTHREAD: u32 = 0x0020_0000;

/// What a scan reads of `/proc/<pid>/stat`.
#[derive(Debug, PartialEq)]
struct Stat {
    state: u8,
    pgid: i32,
    /// In `exit`: it never runs its own code again, though it is not a zombie yet.
    exiting: bool,
    kthread: bool,
    /// When it started, in clock ticks since boot.
    start: u64,
    /// Where its environment starts and ends in its memory (fields 50 and 51, Linux 3.5 on;
    /// shown to a reader allowed to read its `environ`). Both 0 while an `execve` is between
    /// dropping the old image and placing the new one's environment.
    env: Option<(u64, u64)>,
}

impl Stat {
    /// Whether it may still run: neither a zombie nor dead nor on its way out. A process on its
    /// way out may already have left `cgroup.procs`; were it counted, a scan could see alive a
    /// tree its cgroup shows gone (a SIGKILLed process lingers in `exit` on a busy machine).
    fn live(&self) -> bool {
        !(self.exiting || matches!(self.state, b'Z' | b'X' | b'x'))
    }

    /// Whether its image has an environment, and that environment is empty: `environ` reading
    /// empty is then the truth, not a moment of an `execve`.
    fn env_empty(&self) -> bool {
        self.env.is_some_and(|(start, end)| end != 0 && start == end)
    }
}

/// Parse the text of `/proc/<pid>/stat` (stat(5)); the command name may hold spaces and `)`.
fn parse_stat(s: &[u8]) -> Option<Stat> {
    let close = s.iter().rposition(|b| *b == b')')?;
    let rest = std::str::from_utf8(&s[close + 1..]).ok()?;
    // fields[i] is field i + 3 of stat(5): the state is field 3.
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let num = |field: usize| fields.get(field - 3).and_then(|f| f.parse::<u64>().ok());
    let state = *fields.first()?.as_bytes().first()?;
    let pgid: i32 = fields.get(2)?.parse().ok()?;
    let flags = u32::try_from(num(9)?).ok()?;
    Some(Stat {
        state,
        pgid,
        exiting: flags & PF_EXITING != 0,
        kthread: flags & PF_KTHREAD != 0,
        start: num(22)?,
        env: num(50).zip(num(51)),
    })
}

/// Whether the text of a `/proc/<pid>/stat` is that of a live process, as the emulator's
/// scans judge it ([`Stat::live`]); an unreadable text is not.
pub fn stat_live(stat: &str) -> bool {
    parse_stat(stat.as_bytes()).is_some_and(|st| st.live())
}

fn read_stat(pid: &str) -> Option<Stat> {
    parse_stat(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// When `pid` started (clock ticks since boot); `None` when it is gone.
pub(crate) fn start_ticks(pid: i32) -> Option<u64> {
    read_stat(&pid.to_string()).map(|st| st.start)
}

/// How long a scan reads again the empty environment of a process in the middle of an
/// `execve` before it takes it as empty.
const EXEC_SETTLE: Duration = Duration::from_millis(500);

/// The marker in a process's initial environment. A process in the middle of an `execve` reads
/// an empty environment for a moment (an `environ` opened on the image it is leaving reads
/// nothing once that image is dropped; the new image has its arguments placed a moment before
/// its environment), and a marked one would be passed over. So an empty environment is taken
/// as it is only when its `stat` shows an image whose environment is placed and empty
/// ([`Stat::env_empty`]); else it is read again every 200 µs, 500 ms at most (an `execve`
/// preempted on a busy machine), then taken as empty. A process that really has an empty
/// environment costs two reads; one that exits meanwhile is passed over.
fn read_mark(pid: &str) -> Option<String> {
    let end = Instant::now() + EXEC_SETTLE;
    loop {
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        if !env.is_empty() {
            return mark_in(&env);
        }
        let st = read_stat(pid)?;
        if st.env_empty() || !st.live() || Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_micros(200));
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

/// One pass over /proc; returns the live processes (see [`Stat::live`]) the filter accepts.
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
        let Some(st) = read_stat(name) else {
            continue;
        };
        if !st.live() || st.kthread || st.start < since {
            continue;
        }
        let Ok(pid) = name.parse::<i32>() else {
            continue;
        };
        let from_cgroup = if cgroups { cgroup::mark_of(name) } else { None };
        let e = Entry { pid, pgid: st.pgid, mark: from_cgroup.or_else(|| read_mark(name)) };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A stat line as the kernel writes it, with `flags` and a command name holding `) (`.
    fn line(state: char, flags: u32) -> String {
        format!("4242 (a) (b c) {state} 1 4200 4200 0 -1 {flags} 10 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100")
    }

    /// A whole stat line (52 fields, the last the exit code) whose environment lies at `env`.
    fn full_line(env: (u64, u64)) -> String {
        let middle = "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23";
        format!("{} {middle} 140000 140100 {} {} 0", line('S', 0x0040_0100), env.0, env.1)
    }

    #[test]
    fn a_process_in_exit_is_not_live() {
        let running = parse_stat(line('S', 0x0040_0100).as_bytes()).unwrap();
        assert_eq!(running, Stat { state: b'S', pgid: 4200, exiting: false, kthread: false, start: 987654, env: None });
        assert!(parse_stat(line('I', 0x0020_8040).as_bytes()).unwrap().kthread);
        assert!(running.live());
        // SIGKILLed and tearing down, still state R or D, out of cgroup.procs: not live.
        let exiting = parse_stat(line('D', 0x0040_0104).as_bytes()).unwrap();
        assert!(exiting.exiting && !exiting.live());
        assert!(!parse_stat(line('Z', 0x0040_010c).as_bytes()).unwrap().live());
        assert!(!parse_stat(line('X', 0).as_bytes()).unwrap().live());
        assert_eq!(parse_stat(b"4242 (a) S 1 4200"), None, "a truncated line is not taken");
    }

    #[test]
    fn an_environment_is_empty_only_once_placed() {
        let placed_empty = parse_stat(full_line((140200, 140200)).as_bytes()).unwrap();
        assert_eq!(placed_empty.env, Some((140200, 140200)));
        assert!(placed_empty.env_empty());
        // In the middle of an execve: nothing placed yet. Or an environment that is not empty.
        assert!(!parse_stat(full_line((0, 0)).as_bytes()).unwrap().env_empty());
        assert!(!parse_stat(full_line((140200, 140900)).as_bytes()).unwrap().env_empty());
    }

    #[test]
    fn this_process_reads_live_with_its_start_time() {
        let me = read_stat(&std::process::id().to_string()).unwrap();
        assert!(me.live(), "{me:?}");
        assert_eq!(start_ticks(i32::try_from(std::process::id()).unwrap()), Some(me.start));
        assert!(me.start > 0);
        let (start, end) = me.env.expect("the environment's place, readable by the process itself");
        assert!(end > start, "{me:?}");
        assert!(!me.kthread);
    }
}
