//! A private view for every tree, where the emulator runs as root.
//!
//! The child, after it joined its leaf cgroups and before it executes the command, enters a
//! mount namespace of its own (every mount private, so nothing propagates back to the host)
//! in which:
//!
//! * the sandbox's workspace is bind-mounted on `/workspace`, so `cd /workspace` and paths
//!   under it work as on the real API, and two sandboxes never see each other's files there;
//! * with cgroup tracking, a cgroup namespace rooted at its leaf, and over the mount point of
//!   every cgroup hierarchy a bind mount of its own cgroup there (its leaf, or, in a hierarchy
//!   without one, the emulator's cgroup it started in): the command sees its leaf as the root
//!   of each hierarchy (`/proc/self/cgroup` says `/`, `cgroup.procs` at the top is its leaf's),
//!   so writing its pid to any `cgroup.procs` it can see leaves it inside its leaf; cgroups it
//!   makes nest below its leaf. A hierarchy whose cgroup cannot be bound is made read-only in
//!   that namespace instead. (A fresh cgroup mount inside the namespace would give the same
//!   view, but kernels refuse to share a v1 hierarchy's superblock that way, with `EBUSY`.)
//!
//! A process that still reaches the host's hierarchy (through `/proc/<pid>/root` of a process
//! outside, say) and moves itself out is found by the membership check (`model::recapture`).
//!
//! `/workspace` must exist on the host as a mount point: as root the emulator creates the empty
//! directory when it is missing (it is never mounted on, or written to, in the host's namespace).
//! Everything needed is allocated before the fork; the child only makes system calls.
//!
//! Elsewhere (not root, no mount namespaces) nothing of this applies: `/workspace` is mapped
//! onto the workspace in the files API and the `cwd` field only, and a tree is kept whole by the
//! membership check alone (see `model::recapture`).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nix::libc;

/// The mount point of the workspace in a tree's namespace.
pub(crate) const WORKSPACE: &str = "/workspace";

/// A cgroup hierarchy's mount point, and the path there of the cgroup the emulator runs in.
struct CgMount {
    target: PathBuf,
    /// `None` when it cannot be told (then the hierarchy is made read-only).
    own: Option<PathBuf>,
}

/// What the host allows, found once per OS process.
pub(crate) struct Isolation {
    /// `/workspace` can be bind-mounted.
    pub workspace: bool,
    /// The cgroup namespace and the fresh cgroup mounts work.
    pub cgroup_view: bool,
    mounts: Vec<CgMount>,
}

/// What one child does before it executes the command.
pub(crate) struct Plan {
    workspace: Option<(CString, CString)>,
    cgroup_view: bool,
    /// (what to bind, `None` = make read-only; the mount point).
    binds: Vec<(Option<CString>, CString)>,
}

static PROBED: OnceLock<Isolation> = OnceLock::new();

/// What this host allows (probed once: a child that tries every step).
pub(crate) fn get() -> &'static Isolation {
    PROBED.get_or_init(probe)
}

fn probe() -> Isolation {
    let none = Isolation { workspace: false, cgroup_view: false, mounts: Vec::new() };
    // SAFETY: geteuid cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        return none;
    }
    let mounts = cgroup_mounts();
    let ws_dir = Path::new(WORKSPACE);
    let have_ws = ws_dir.is_dir() || (std::fs::create_dir(ws_dir).is_ok() && ws_dir.is_dir());
    let scratch = std::env::temp_dir().join(format!("createos-emulator-probe-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&scratch);
    let mut iso = Isolation { workspace: have_ws, cgroup_view: !mounts.is_empty(), mounts };
    // Each part is kept only when a child could really do it.
    if iso.workspace && !try_plan(&iso.plan(Some(&scratch), None)) {
        iso.workspace = false;
    }
    if iso.cgroup_view && !try_plan(&iso.plan(None, Some(&[]))) {
        iso.cgroup_view = false;
    }
    let _ = std::fs::remove_dir(&scratch);
    iso
}

fn try_plan(plan: &Plan) -> bool {
    let plan = plan.clone_plan();
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.args(["-c", "exit 0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: the closure only makes system calls on memory allocated before the fork.
    unsafe {
        cmd.pre_exec(move || plan.apply());
    }
    cmd.status().is_ok_and(|s| s.success())
}

impl Isolation {
    /// The plan of one child: `/workspace` from `workspace` when given (and possible), the
    /// cgroup view when `leaf` (the directories of the child's leaf; it is in them by then).
    pub fn plan(&self, workspace: Option<&Path>, leaf: Option<&[PathBuf]>) -> Plan {
        let cstr = |p: &Path| CString::new(p.as_os_str().as_bytes()).ok();
        let workspace =
            workspace.filter(|_| self.workspace).and_then(|w| Some((cstr(w)?, CString::new(WORKSPACE).ok()?)));
        let cgroup_view = leaf.is_some() && self.cgroup_view;
        let mut binds = Vec::new();
        if let (true, Some(leaf)) = (cgroup_view, leaf) {
            for m in &self.mounts {
                let Some(target) = cstr(&m.target) else { continue };
                let source = leaf.iter().find(|d| d.starts_with(&m.target)).or(m.own.as_ref()).and_then(|p| cstr(p));
                binds.push((source, target));
            }
        }
        Plan { workspace, cgroup_view, binds }
    }
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.workspace.is_none() && !self.cgroup_view
    }

    fn clone_plan(&self) -> Plan {
        Plan { workspace: self.workspace.clone(), cgroup_view: self.cgroup_view, binds: self.binds.clone() }
    }

    /// Runs in the forked child before exec: system calls only.
    pub fn apply(&self) -> io::Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        let mut flags = libc::CLONE_NEWNS;
        if self.cgroup_view {
            flags |= libc::CLONE_NEWCGROUP;
        }
        // SAFETY: plain system calls on NUL-terminated strings that outlive them.
        unsafe {
            check(libc::unshare(flags))?;
            let root = c"/";
            check(libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            if let Some((src, dst)) = &self.workspace {
                check(libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
            }
            for (source, target) in &self.binds {
                let bound = source.as_ref().is_some_and(|src| {
                    libc::mount(src.as_ptr(), target.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) == 0
                });
                if !bound {
                    check(libc::mount(
                        std::ptr::null(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY,
                        std::ptr::null(),
                    ))?;
                }
            }
        }
        Ok(())
    }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The cgroup mounts of this namespace, from `/proc/self/mountinfo`, each with the path there of
/// the cgroup this process is in (from `/proc/self/cgroup`).
fn cgroup_mounts() -> Vec<CgMount> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut out: Vec<CgMount> = Vec::new();
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(target), Some(fstype), Some(opts)) = (l.get(3), l.get(4), r.first(), r.get(2)) else {
            continue;
        };
        // Mount points with spaces are escaped (`\040`); the usual cgroup mounts have none.
        if target.contains('\\') || root.contains('\\') {
            continue;
        }
        // The hierarchy's name as /proc/self/cgroup spells it: "" for v2, else its controllers
        // and `name=`, in the kernel's order (the mount options list them in the same order).
        let key = match *fstype {
            "cgroup2" => String::new(),
            "cgroup" => opts
                .split(',')
                .filter(|o| {
                    !matches!(*o, "rw" | "ro" | "xattr" | "clone_children" | "noprefix" | "cpuset_v2_mode" | "none")
                        && !o.starts_with("release_agent=")
                })
                .collect::<Vec<_>>()
                .join(","),
            _ => continue,
        };
        let path = own.lines().find_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, name, path) = (it.next()?, it.next()?, it.next()?);
            same_hierarchy(name, &key).then_some(path)
        });
        let own = path.and_then(|p| {
            let rel = if *root == "/" { p } else { p.strip_prefix(*root)? };
            Some(Path::new(target).join(rel.trim_start_matches('/')))
        });
        let target = PathBuf::from(*target);
        // A later mount on the same point hides the earlier one: keep the last.
        out.retain(|m| m.target != target);
        out.push(CgMount { target, own });
    }
    out
}

/// Whether a /proc/self/cgroup hierarchy name and a mount's controller list are the same set.
fn same_hierarchy(name: &str, key: &str) -> bool {
    let mut a: Vec<&str> = name.split(',').filter(|s| !s.is_empty()).collect();
    let mut b: Vec<&str> = key.split(',').filter(|s| !s.is_empty()).collect();
    a.sort_unstable();
    b.sort_unstable();
    a == b
}
