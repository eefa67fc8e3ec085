//! Control groups: one per process tree, where the machine allows it.
//!
//! Every tree the emulator starts (a managed process or an exec) gets a leaf cgroup of its own
//! under a parent that belongs to this emulator instance,
//! `createos-emulator-<os pid>-<instance>`. The child moves itself into the leaf after the fork
//! and before it executes the command (a `pre_exec` write of `0` to `cgroup.procs`), so the
//! command and every process it ever forks are members: clearing the environment, `setsid` and
//! double forks do not leave a cgroup. A tree is gone when its leaf lists no process.
//!
//! Killing a tree: freeze the leaf (no member can fork while frozen), send the signal to every
//! member listed, thaw (a frozen task acts on a fatal signal once thawed), repeat until the leaf
//! is empty. `pids.max` bounds the processes of one tree (a fork loop fails with `EAGAIN`).
//!
//! Two layouts: cgroup v2 (`cgroup.freeze`, and `pids.max` when the `pids` controller can be
//! enabled below the mount's root) and cgroup v1 (the `pids` and `freezer` hierarchies, a leaf
//! in each). Only a member that writes itself into another cgroup leaves (which needs the
//! privileges the emulator has).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// First path component of every parent cgroup the emulator makes.
pub(crate) const PARENT_PREFIX: &str = "createos-emulator-";
/// How long a kill pass waits for a leaf to report itself frozen before it signals anyway.
const FREEZE_WAIT: Duration = Duration::from_millis(200);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    V2,
    V1,
}

/// Which layouts a start may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    Auto,
    V2,
    V1,
}

/// The cgroups of one emulator instance.
pub(crate) struct Cgroups {
    pub mode: Mode,
    /// The `pids.max` every leaf gets, when the layout has a `pids` controller.
    pub pids_max: Option<u32>,
    /// v2: `[parent]`; v1: `[pids parent, freezer parent]`.
    parents: Vec<PathBuf>,
    /// marker → leaf, until the leaf is removed.
    leaves: Mutex<HashMap<String, Arc<Leaf>>>,
}

/// One tree's cgroup.
pub(crate) struct Leaf {
    mode: Mode,
    /// v2: `[leaf]`; v1: `[pids leaf, freezer leaf]`. Membership is read from `dirs[0]`.
    dirs: Vec<PathBuf>,
    leader: AtomicI32,
    reaped: AtomicBool,
    /// When the leader started (clock ticks since boot): every process of the tree started
    /// then or later, which bounds the membership check's scan.
    started: AtomicU64,
    /// The membership check found the leaf empty and nothing of the tree outside it: it stays
    /// empty, no check is needed again.
    confirmed: AtomicBool,
}

/// Instances in this OS process that use cgroups (for [`leaf_of_mark`] and [`mark_of`]).
/// Each with its instance id, so a lookup by instance upgrades only the handle it needs.
static ACTIVE: Mutex<Vec<(String, Weak<Cgroups>)>> = Mutex::new(Vec::new());
static ACTIVE_COUNT: AtomicUsize = AtomicUsize::new(0);

/// True while some emulator of this OS process tracks trees by cgroup.
pub(crate) fn any_active() -> bool {
    ACTIVE_COUNT.load(Ordering::SeqCst) > 0
}

struct Mounts {
    v2: Option<PathBuf>,
    pids: Option<PathBuf>,
    freezer: Option<PathBuf>,
}

fn mounts() -> &'static Mounts {
    static M: OnceLock<Mounts> = OnceLock::new();
    M.get_or_init(|| {
        let mut m = Mounts { v2: None, pids: None, freezer: None };
        let Ok(text) = fs::read_to_string("/proc/self/mounts") else { return m };
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() < 4 {
                continue;
            }
            let (dir, fstype, opts) = (PathBuf::from(f[1]), f[2], f[3]);
            let rw = opts.split(',').any(|o| o == "rw");
            if !rw {
                continue;
            }
            if fstype == "cgroup2" && m.v2.is_none() {
                m.v2 = Some(dir);
            } else if fstype == "cgroup" {
                for o in opts.split(',') {
                    match o {
                        "pids" if m.pids.is_none() => m.pids = Some(dir.clone()),
                        "freezer" if m.freezer.is_none() => m.freezer = Some(dir.clone()),
                        _ => {}
                    }
                }
            }
        }
        m
    })
}

/// This process's cgroup path in the v1 hierarchy holding `controller` ("" when unknown).
fn own_v1_path(controller: &str) -> String {
    let text = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (_, ctrls, path) = (it.next(), it.next().unwrap_or(""), it.next().unwrap_or(""));
        if ctrls.split(',').any(|c| c == controller) {
            return path.trim_start_matches('/').to_string();
        }
    }
    String::new()
}

/// Where a v1 parent goes: below this process's own cgroup of that hierarchy when the mount
/// shows it (so limits set on it still apply), else at the mount's root.
fn v1_base(mount: &Path, controller: &str) -> PathBuf {
    let own = own_v1_path(controller);
    let nested = mount.join(&own);
    if !own.is_empty() && nested.is_dir() {
        nested
    } else {
        mount.to_path_buf()
    }
}

/// Remove empty parents left by emulators whose OS process is gone (a crash skips `close`).
fn sweep_stale(base: &Path) {
    let Ok(dir) = fs::read_dir(base) else { return };
    for d in dir.flatten() {
        let name = d.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PARENT_PREFIX)) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else { continue };
        if pid <= 0 || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        // Only empty cgroups can be removed: a populated one stays, and says so by staying.
        remove_below(&d.path(), 0);
    }
}

fn parent_name(instance: &str) -> String {
    format!("{PARENT_PREFIX}{}-{instance}", std::process::id())
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value)
}

impl Cgroups {
    /// Sets up this instance's parent cgroup(s): `Ok(None)` when `want` is `Auto` and no
    /// layout is usable, `Err` when the layout asked for is not.
    pub fn start(want: Want, instance: &str, pids_max: Option<u32>) -> io::Result<Option<Arc<Cgroups>>> {
        let tries: &[(Mode, bool)] = match want {
            // v2 with a pids bound, then v1 (pids + freezer), then v2 without the bound.
            Want::Auto => &[(Mode::V2, true), (Mode::V1, true), (Mode::V2, false)],
            Want::V2 => &[(Mode::V2, true), (Mode::V2, false)],
            Want::V1 => &[(Mode::V1, true)],
        };
        let mut last = io::Error::other("no writable cgroup hierarchy is mounted");
        for &(mode, bound) in tries {
            match Self::try_layout(mode, bound, instance, pids_max) {
                Ok(cg) => {
                    let cg = Arc::new(cg);
                    let mut active = ACTIVE.lock().unwrap();
                    prune(&mut active, |w| w.strong_count() > 0);
                    active.push((instance.to_string(), Arc::downgrade(&cg)));
                    ACTIVE_COUNT.fetch_add(1, Ordering::SeqCst);
                    return Ok(Some(cg));
                }
                Err(e) => last = e,
            }
        }
        match want {
            Want::Auto => Ok(None),
            _ => Err(last),
        }
    }

    fn try_layout(mode: Mode, bound: bool, instance: &str, pids_max: Option<u32>) -> io::Result<Cgroups> {
        let m = mounts();
        let name = parent_name(instance);
        let missing = |what: &str| io::Error::other(format!("no writable {what} cgroup hierarchy is mounted"));
        match mode {
            Mode::V2 => {
                let mount = m.v2.clone().ok_or_else(|| missing("cgroup2"))?;
                sweep_stale(&mount);
                let parent = mount.join(&name);
                fs::create_dir(&parent)?;
                let cleanup = |e: io::Error| {
                    let _ = fs::remove_dir(&parent);
                    e
                };
                // The freezer of v2 is built in; make sure it is there (kernel 5.2 and later).
                if !parent.join("cgroup.freeze").exists() {
                    return Err(cleanup(io::Error::other("this kernel's cgroup v2 has no cgroup.freeze")));
                }
                let limit = if bound {
                    let ctrls = fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
                    if !ctrls.split_whitespace().any(|c| c == "pids") {
                        return Err(cleanup(io::Error::other("the cgroup v2 pids controller is not available")));
                    }
                    write(&parent.join("cgroup.subtree_control"), "+pids").map_err(cleanup)?;
                    pids_max
                } else {
                    None
                };
                Ok(Cgroups { mode, pids_max: limit, parents: vec![parent], leaves: Mutex::new(HashMap::new()) })
            }
            Mode::V1 => {
                let pids = m.pids.clone().ok_or_else(|| missing("v1 pids"))?;
                let freezer = m.freezer.clone().ok_or_else(|| missing("v1 freezer"))?;
                let (pb, fb) = (v1_base(&pids, "pids"), v1_base(&freezer, "freezer"));
                sweep_stale(&pb);
                sweep_stale(&fb);
                let (pp, fp) = (pb.join(&name), fb.join(&name));
                fs::create_dir(&pp)?;
                if let Err(e) = fs::create_dir(&fp) {
                    let _ = fs::remove_dir(&pp);
                    return Err(e);
                }
                Ok(Cgroups { mode, pids_max, parents: vec![pp, fp], leaves: Mutex::new(HashMap::new()) })
            }
        }
    }

    /// A new leaf named `id` for the tree marked `marker`, with its `cgroup.procs` files open
    /// for the child's `pre_exec` move.
    pub fn new_leaf(&self, marker: &str, id: &str) -> io::Result<(Arc<Leaf>, Vec<File>)> {
        let dirs: Vec<PathBuf> = self.parents.iter().map(|p| p.join(id)).collect();
        let leaf = Arc::new(Leaf {
            mode: self.mode,
            dirs,
            leader: AtomicI32::new(0),
            reaped: AtomicBool::new(false),
            started: AtomicU64::new(0),
            confirmed: AtomicBool::new(false),
        });
        let made = (|| {
            for d in &leaf.dirs {
                fs::create_dir(d)?;
            }
            if let Some(max) = self.pids_max {
                write(&leaf.dirs[0].join("pids.max"), &max.to_string())?;
            }
            leaf.dirs.iter().map(|d| OpenOptions::new().write(true).open(d.join("cgroup.procs"))).collect()
        })();
        match made {
            Ok(files) => {
                self.leaves.lock().unwrap().insert(marker.to_string(), leaf.clone());
                Ok((leaf, files))
            }
            Err(e) => {
                leaf.remove();
                Err(e)
            }
        }
    }

    /// The spawn failed: forget and remove the leaf.
    pub fn drop_leaf(&self, marker: &str) {
        if let Some(l) = self.leaves.lock().unwrap().remove(marker) {
            l.remove();
        }
    }

    /// The leader `pid` was reaped: its leaf may be removed once empty.
    pub fn leader_reaped(&self, pid: i32) {
        for l in self.leaves.lock().unwrap().values() {
            if l.leader.load(Ordering::SeqCst) == pid {
                l.reaped.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Remove the leaves whose leader was reaped and which are empty, after the membership
    /// check: a live process of the tree outside its leaf (it wrote itself into another
    /// cgroup; it still names the tree in another hierarchy's path or in its environment) is
    /// moved back, and the leaf stays. Returns how many reaped leaves still hold processes
    /// (the reaper keeps looking while any does).
    pub fn sweep(&self) -> usize {
        let empty: HashMap<String, Arc<Leaf>> = self
            .leaves
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, l)| l.reaped.load(Ordering::SeqCst) && l.is_empty())
            .map(|(m, l)| (m.clone(), l.clone()))
            .collect();
        // Outside the lock: a scan reads the marks of cgroup members through it.
        let held: Vec<String> =
            empty.iter().filter(|(m, l)| !l.recapture(m, None).is_empty()).map(|(m, _)| m.clone()).collect();
        let mut leaves = self.leaves.lock().unwrap();
        let mut lingering = 0;
        leaves.retain(|m, l| {
            if !l.reaped.load(Ordering::SeqCst) {
                return true;
            }
            if !held.contains(m) && l.is_empty() && l.remove() {
                return false;
            }
            lingering += 1;
            true
        });
        lingering
    }

    pub fn leaf(&self, marker: &str) -> Option<Arc<Leaf>> {
        self.leaves.lock().unwrap().get(marker).cloned()
    }

    /// Every leaf not yet removed.
    pub fn all_leaves(&self) -> Vec<Arc<Leaf>> {
        self.leaves.lock().unwrap().values().cloned().collect()
    }

    /// SIGKILL every member of every leaf (freeze, signal, thaw) until all are empty or the
    /// deadline passes; then remove the leaves and the parents. Synchronous. Returns whether
    /// every leaf was empty.
    pub fn kill_all_and_remove(&self, deadline: Instant) -> bool {
        let leaves = self.all_leaves();
        let mut empty = false;
        loop {
            let live: Vec<Arc<Leaf>> = leaves.iter().filter(|l| !l.is_empty()).cloned().collect();
            if live.is_empty() {
                empty = true;
                break;
            }
            if Instant::now() >= deadline {
                break;
            }
            signal_frozen(&live, Signal::SIGKILL);
            std::thread::sleep(Duration::from_millis(5));
        }
        self.leaves.lock().unwrap().retain(|_, l| !l.remove());
        self.remove_parents();
        empty
    }

    fn remove_parents(&self) {
        for p in &self.parents {
            let _ = fs::remove_dir(p);
        }
        let me: *const Cgroups = self;
        prune(&mut ACTIVE.lock().unwrap(), |w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), me));
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        // Normally done by `kill_all_and_remove`; a no-op then.
        for l in self.leaves.get_mut().map(|m| m.values().cloned().collect::<Vec<_>>()).unwrap_or_default() {
            l.remove();
        }
        for p in &self.parents {
            let _ = fs::remove_dir(p);
        }
        prune(&mut ACTIVE.lock().unwrap(), |w| w.strong_count() > 0);
    }
}

/// Keep the entries `keep` accepts, counting the others out of [`ACTIVE_COUNT`]. Never
/// upgrades a handle (a last strong handle dropped under the lock would re-enter it).
fn prune(active: &mut Vec<(String, Weak<Cgroups>)>, keep: impl Fn(&Weak<Cgroups>) -> bool) {
    let before = active.len();
    active.retain(|(_, w)| keep(w));
    ACTIVE_COUNT.fetch_sub(before - active.len(), Ordering::SeqCst);
}

impl Leaf {
    pub fn set_leader(&self, pid: i32) {
        self.leader.store(pid, Ordering::SeqCst);
        // Read at once after the spawn (the leader is reaped only later, by us); 0 = unknown,
        // which makes the check scan everything.
        self.started.store(crate::procfs::start_ticks(pid).unwrap_or(0), Ordering::SeqCst);
    }

    /// The membership check of an empty-looking leaf: a live process that still names this
    /// tree (`marker`: in another hierarchy's cgroup path or its environment) or is in
    /// `group` (other than as its leader) but is not a member left the leaf; each is moved back. Returns those pids. Once
    /// a check finds none the leaf is confirmed empty and later checks cost nothing.
    pub fn recapture(&self, marker: &str, group: Option<i32>) -> Vec<i32> {
        if self.confirmed.load(Ordering::SeqCst) {
            return Vec::new();
        }
        let since = self.started.load(Ordering::SeqCst);
        // In the group, but not its leader: the leader is the tree's own (reaped by now), and a
        // process whose pid and group are the leader's old pid is a newcomer the pid was
        // handed to again (pids wrap at `pid_max`), never a stray of this tree.
        let strayed = |e: &crate::procfs::Entry| group == Some(e.pgid) && e.pid != e.pgid;
        let found = crate::procfs::scan_since(
            &|e: &crate::procfs::Entry| e.mark.as_deref() == Some(marker) || strayed(e),
            since,
        );
        let members = self.members().unwrap_or_default();
        let strays: Vec<i32> = found.iter().map(|e| e.pid).filter(|p| !members.contains(p)).collect();
        for pid in &strays {
            self.adopt(*pid);
        }
        if strays.is_empty() && members.is_empty() {
            self.confirmed.store(true, Ordering::SeqCst);
        }
        strays
    }

    /// Pids listed in the leaf; `None` when it cannot be read (a removed leaf reads as empty:
    /// only an empty cgroup can be removed).
    /// Members of cgroups below the leaf count too (an emulator run inside the tree nests its
    /// own cgroups there).
    pub fn members(&self) -> Option<Vec<i32>> {
        let mut out = Vec::new();
        members_below(&self.dirs[0], 0, &mut out).then_some(out)
    }

    /// Its directories: v2 `[leaf]`, v1 `[pids leaf, freezer leaf]`.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Move `pid` back into the leaf (every hierarchy of it); true when every write took.
    pub fn adopt(&self, pid: i32) -> bool {
        let pid = pid.to_string();
        // Every hierarchy is tried, even after one refused.
        let done: Vec<bool> = self.dirs.iter().map(|d| write(&d.join("cgroup.procs"), &pid).is_ok()).collect();
        done.into_iter().all(|ok| ok)
    }

    /// Empty for sure (an unreadable leaf is not).
    pub fn is_empty(&self) -> bool {
        self.members().is_some_and(|m| m.is_empty())
    }

    fn freeze(&self, on: bool) {
        let _ = match self.mode {
            Mode::V2 => write(&self.dirs[0].join("cgroup.freeze"), if on { "1" } else { "0" }),
            Mode::V1 => write(&self.dirs[1].join("freezer.state"), if on { "FROZEN" } else { "THAWED" }),
        };
    }

    fn frozen(&self) -> bool {
        match self.mode {
            Mode::V2 => fs::read_to_string(self.dirs[0].join("cgroup.events"))
                .map(|s| s.lines().any(|l| l.trim() == "frozen 1"))
                .unwrap_or(true),
            Mode::V1 => {
                fs::read_to_string(self.dirs[1].join("freezer.state")).map(|s| s.trim() == "FROZEN").unwrap_or(true)
            }
        }
    }

    /// rmdir every directory of the leaf; true when none is left.
    pub fn remove(&self) -> bool {
        // The freezer leaf of v1 first: it is the pids leaf that tells membership.
        // Every directory is tried, even after one failed.
        let removed: Vec<bool> = self.dirs.iter().rev().map(|d| remove_below(d, 0)).collect();
        removed.into_iter().all(|gone| gone)
    }
}

/// Cgroups nest at most this deep below a leaf before the walk gives up (and reports the
/// leaf unreadable, so never empty).
const NEST_MAX: usize = 16;

/// Appends the pids of `dir` and of every cgroup below it; false when one cannot be read (a
/// missing `dir` reads as empty: only an empty cgroup can be removed).
fn members_below(dir: &Path, depth: usize, out: &mut Vec<i32>) -> bool {
    if depth > NEST_MAX {
        return false;
    }
    match fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(s) => out.extend(s.split_ascii_whitespace().filter_map(|p| p.parse::<i32>().ok())),
        Err(e) if e.kind() == io::ErrorKind::NotFound && depth == 0 && !dir.exists() => return true,
        Err(_) => return false,
    }
    let Ok(entries) = fs::read_dir(dir) else { return false };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) && !members_below(&e.path(), depth + 1, out) {
            return false;
        }
    }
    true
}

/// rmdir `dir` after every cgroup below it; true when it is gone.
fn remove_below(dir: &Path, depth: usize) -> bool {
    if depth <= NEST_MAX {
        if let Ok(entries) = fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    remove_below(&e.path(), depth + 1);
                }
            }
        }
    }
    match fs::remove_dir(dir) {
        Ok(()) => true,
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

/// Freeze the leaves, send `sig` to every member listed while frozen, thaw. Synchronous (a
/// few small writes and reads of cgroupfs). Returns the pids signalled.
pub(crate) fn signal_frozen(leaves: &[Arc<Leaf>], sig: Signal) -> Vec<i32> {
    for l in leaves {
        l.freeze(true);
    }
    let end = Instant::now() + FREEZE_WAIT;
    while !leaves.iter().all(|l| l.frozen()) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut pids = Vec::new();
    for l in leaves {
        for pid in l.members().unwrap_or_default() {
            let _ = kill(Pid::from_raw(pid), sig);
            pids.push(pid);
        }
    }
    for l in leaves {
        l.freeze(false);
    }
    pids
}

/// The leaf of a tree marker (`<instance>:<id>`) of any cgroup-tracking emulator of this OS
/// process.
pub(crate) fn leaf_of_mark(mark: &str) -> Option<Arc<Leaf>> {
    let instance = mark.split(':').next()?;
    // The handle is released after the lock (a last handle dropped under it would re-enter).
    let cg = ACTIVE.lock().unwrap().iter().find(|(i, _)| i == instance).and_then(|(_, w)| w.upgrade());
    cg.and_then(|c| c.leaf(mark))
}

/// The tree marker of a process from its `/proc/<pid>/cgroup`, when it is in a leaf of an
/// emulator (`…/createos-emulator-<os pid>-<instance>/<id>` → `<instance>:<id>`). When leaves
/// nest (an emulator run inside a tree), the one of an emulator of this OS process wins.
pub(crate) fn mark_of(pid: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let ours: Vec<String> = ACTIVE.lock().unwrap().iter().map(|(i, _)| i.clone()).collect();
    mark_in(&text, |instance| ours.iter().any(|o| o == instance))
}

/// Every `<instance>:<id>` the cgroup paths name, outermost first; the first `prefer` accepts,
/// else the innermost.
fn mark_in(text: &str, prefer: impl Fn(&str) -> bool) -> Option<String> {
    let mut found: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let Some(path) = line.splitn(3, ':').nth(2) else { continue };
        let parts: Vec<&str> = path.split('/').collect();
        for (i, part) in parts.iter().enumerate() {
            let Some(rest) = part.strip_prefix(PARENT_PREFIX) else { continue };
            let (Some((_, instance)), Some(id)) = (rest.split_once('-'), parts.get(i + 1).filter(|s| !s.is_empty()))
            else {
                continue;
            };
            if !found.iter().any(|(a, b)| a == instance && b == id) {
                found.push((instance.to_string(), (*id).to_string()));
            }
        }
    }
    let pick = found.iter().find(|(i, _)| prefer(i)).or(found.last())?;
    Some(format!("{}:{}", pick.0, pick.1))
}

/// The raw fds the child writes `0` to before it executes the command.
pub(crate) fn raw_fds(files: &[File]) -> Vec<i32> {
    files.iter().map(AsRawFd::as_raw_fd).collect()
}

#[cfg(test)]
mod tests {
    use super::mark_in;

    #[test]
    fn marks_from_proc_cgroup() {
        let v1 = "9:name=systemd:/\n8:pids:/createos-emulator-123-emuabc/proc_1f\n6:freezer:/createos-emulator-123-emuabc/proc_1f\n0::/\n";
        let any = |_: &str| false;
        assert_eq!(mark_in(v1, any).as_deref(), Some("emuabc:proc_1f"));
        let v2 = "0::/createos-emulator-9-emu0123456789ab/exec_00ff\n";
        assert_eq!(mark_in(v2, any).as_deref(), Some("emu0123456789ab:exec_00ff"));
        assert_eq!(mark_in("0::/user.slice\n", any), None);
        assert_eq!(mark_in("0::/createos-emulator-9-emux\n", any), None, "the parent itself holds no tree");
        // Nested: an emulator run inside a tree of another.
        let nested = "8:pids:/createos-emulator-1-emuout/proc_a/createos-emulator-2-emuin/proc_b\n";
        assert_eq!(mark_in(nested, any).as_deref(), Some("emuin:proc_b"), "the innermost by default");
        assert_eq!(mark_in(nested, |i| i == "emuout").as_deref(), Some("emuout:proc_a"), "this process's own");
    }
}
