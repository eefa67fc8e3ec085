//! The registry of leases and their supervisors, the ends of supervisors no caller waits
//! for (idle, retired, `destroySandbox`, the host's exit), and the sandboxes whose end could
//! not be proven.
//!
//! A lease is (API origin, sandbox, key). Its slots ([`MAX_PER_LEASE`]) count the supervisors
//! that run a command or are being created, and the idle ones; a retired supervisor holds no
//! slot: it is ended at once (`Supervisor::end_kept`), its command's leftovers kept.
//!
//! **Every end is proven or reported.** An end that no caller waits for and whose proof
//! fails queues a warning (`CREATEOS_SESSION_UNPROVEN`, with the sandbox id) and marks the
//! sandbox: every later call on it rejects at once with `CreateosCleanupError` (the failed
//! proof's report, nothing sent) until `destroySandbox` proves it destroyed.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::Notify;

use super::supervisor::Supervisor;
use crate::abort::Ctx;
use crate::client;
use crate::config::Config;
use crate::error::{CleanupReport, Result};
use crate::warnings::{self, Warning};

/// Supervisors per lease (API origin, key, sandbox) that run a command or wait idle.
pub const MAX_PER_LEASE: usize = 4;
/// Sandboxes remembered as unproven; past it the oldest is forgotten (its warning was given).
const MAX_UNPROVEN: usize = 4096;

/// The warning of an end that could not be proven.
pub const UNPROVEN_CODE: &str = "CREATEOS_SESSION_UNPROVEN";

type Key = (String, String, u64);

#[derive(Default)]
struct LeaseState {
    idle: Vec<Supervisor>,
    /// Supervisors being created or running a command.
    busy: usize,
    /// `destroySandbox` or the host's exit is ending this lease: nothing goes back to idle.
    closed: bool,
}

pub(super) struct Lease {
    key: Key,
    state: Mutex<LeaseState>,
    freed: Notify,
}

/// What [`Lease::take`] found.
pub(super) enum Taken {
    /// A clean idle supervisor, now busy.
    Idle(Supervisor),
    /// A slot, now busy: create a supervisor (and give the slot back with [`Lease::done`]
    /// when that fails).
    Slot,
    /// Every slot is busy: wait for [`Lease::freed`].
    Full,
}

/// Why a supervisor is ended with nobody waiting (the warning names it).
#[derive(Clone, Copy)]
pub(super) enum Why {
    Idle,
    Retired,
    /// Output or an exit came while it was idle.
    Unclean,
    Destroy,
    Exit,
}

impl Why {
    fn words(self) -> &'static str {
        match self {
            Why::Idle => "its idle end",
            Why::Retired => "its retirement (a command left processes)",
            Why::Unclean => "its end (output or an exit came while it was idle)",
            Why::Destroy => "destroySandbox",
            Why::Exit => "the host's exit",
        }
    }
}

impl Lease {
    fn lock(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a clean idle supervisor, or a slot to create one. An idle one that is not clean
    /// is ended (with the proof).
    pub fn take(self: &Arc<Self>) -> Taken {
        let mut st = self.lock();
        while let Some(mut s) = st.idle.pop() {
            if s.clean() {
                st.busy += 1;
                return Taken::Idle(s);
            }
            spawn_end(Arc::clone(self), s, Why::Unclean);
        }
        if st.busy + st.idle.len() < MAX_PER_LEASE {
            st.busy += 1;
            Taken::Slot
        } else {
            Taken::Full
        }
    }

    /// Notified whenever a slot may have come free.
    pub fn freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.freed.notified()
    }

    /// A busy supervisor (or slot) is done: ended with its proof, or never created.
    pub fn done(self: &Arc<Self>) {
        self.lock().busy -= 1;
        self.freed.notify_waiters();
        self.leave_if_empty();
    }

    /// A lease with no supervisor left leaves the registry (it stays bounded by the leases
    /// in use).
    fn leave_if_empty(self: &Arc<Self>) {
        let mut leases = registry().leases.lock().unwrap_or_else(PoisonError::into_inner);
        let st = self.lock();
        let empty = st.busy == 0 && st.idle.is_empty();
        drop(st);
        if empty && leases.get(&self.key).is_some_and(|l| Arc::ptr_eq(l, self)) {
            leases.remove(&self.key);
        }
    }
}

#[derive(Default)]
struct Registry {
    leases: Mutex<HashMap<Key, Arc<Lease>>>,
    /// (origin, sandbox) → the report of the end that could not be proven, oldest first.
    unproven: Mutex<VecDeque<((String, String), CleanupReport)>>,
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

pub(super) fn lease_for(cfg: &Config, sandbox_id: &str) -> Result<Arc<Lease>> {
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

/// The report of a supervisor end on `sandbox_id` (at `api_url`'s origin) that could not be
/// proven, while the sandbox was not proven destroyed since: the call must not run.
pub fn unproven(api_url: &str, sandbox_id: &str) -> Option<CleanupReport> {
    let origin = client::api_origin(api_url).ok()?;
    let list = registry().unproven.lock().unwrap_or_else(PoisonError::into_inner);
    list.iter().find(|((o, s), _)| *o == origin && s == sandbox_id).map(|(_, r)| r.clone())
}

/// `destroySandbox` proved the sandbox destroyed: it is no longer unproven.
pub fn forget_unproven(api_url: &str, sandbox_id: &str) {
    let Ok(origin) = client::api_origin(api_url) else { return };
    registry()
        .unproven
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .retain(|((o, s), _)| *o != origin || s != sandbox_id);
}

/// Records an end that could not be proven, and tells the host.
fn report_unproven(origin: &str, report: CleanupReport, why: Why) {
    let sandbox_id = report.sandbox_id.clone();
    {
        let mut list = registry().unproven.lock().unwrap_or_else(PoisonError::into_inner);
        list.retain(|((o, s), _)| o != origin || *s != sandbox_id);
        if list.len() >= MAX_UNPROVEN {
            list.pop_front();
        }
        list.push_back(((origin.to_owned(), sandbox_id.clone()), report));
    }
    warnings::warn(Warning {
        code: UNPROVEN_CODE,
        message: Cow::Owned(format!(
            "createos-execute: a session supervisor in sandbox {sandbox_id} could not be proven gone after {}; \
             a process of it may still run. Destroy the sandbox: every call on it rejects with CreateosCleanupError until then.",
            why.words()
        )),
        sandbox_id: Some(sandbox_id),
    });
}

/// Ends a supervisor with the proof, in a task of its own, over its own client; nobody waits
/// for the verdict, so a failed proof is reported ([`report_unproven`]).
pub(super) fn spawn_end(lease: Arc<Lease>, sup: Supervisor, why: Why) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut sup = sup;
        // The host is exiting: a server that refuses connections is gone, no use waiting.
        sup.settings.policy.refused_is_final |= matches!(why, Why::Exit);
        let ctx = Ctx::cleanup(sup.settings.policy.deadline);
        let client = Arc::clone(&sup.client);
        let proved = match why {
            Why::Retired => AssertUnwindSafe(Box::pin(sup.end_kept(&ctx))).catch_unwind().await,
            _ => AssertUnwindSafe(Box::pin(sup.prove(&client, &ctx))).catch_unwind().await,
        };
        let failed = match proved {
            Ok(Ok(())) => None,
            Ok(Err(report)) => Some(report),
            Err(_) => Some(CleanupReport {
                reason: crate::error::CleanupReason::TerminationUnconfirmed,
                sandbox_id: sup.sandbox_id.clone(),
                process_id: Some(sup.process_id.clone()),
                attempts: Vec::new(),
            }),
        };
        drop(sup);
        if let Some(report) = failed {
            report_unproven(&lease.key.0, report, why);
        }
        lease.leave_if_empty();
    })
}

/// Puts a busy supervisor back to idle, with its idle end armed.
pub(super) fn release(lease: &Arc<Lease>, mut sup: Supervisor) {
    sup.epoch += 1;
    let (generation, epoch, idle) = (sup.generation, sup.epoch, sup.settings.idle);
    {
        let mut st = lease.lock();
        st.busy -= 1;
        if st.closed {
            drop(st);
            spawn_end(Arc::clone(lease), sup, Why::Destroy);
            return;
        }
        st.idle.push(sup);
    }
    lease.freed.notify_waiters();
    let lease = Arc::clone(lease);
    tokio::spawn(async move {
        tokio::time::sleep(idle).await;
        let taken = {
            let mut st = lease.lock();
            st.idle.iter().position(|s| s.generation == generation && s.epoch == epoch).map(|i| st.idle.swap_remove(i))
        };
        if let Some(sup) = taken {
            spawn_end(lease, sup, Why::Idle);
        }
    });
}

/// Retires a busy supervisor (its command left processes, kept): it gives its slot back and
/// is ended at once, its command's leftovers kept (`Supervisor::end_kept`).
pub(super) fn retire(lease: &Arc<Lease>, sup: Supervisor) {
    lease.lock().busy -= 1;
    lease.freed.notify_waiters();
    spawn_end(Arc::clone(lease), sup, Why::Retired);
}

/// Closes the leases `which` selects and takes their idle supervisors (those running a
/// command are ended as their command ends).
fn close(which: impl Fn(&Key) -> bool) -> Vec<(Arc<Lease>, Supervisor)> {
    let leases: Vec<Arc<Lease>> = {
        let mut all = registry().leases.lock().unwrap_or_else(PoisonError::into_inner);
        let keys: Vec<Key> = all.keys().filter(|k| which(k)).cloned().collect();
        keys.iter().filter_map(|k| all.remove(k)).collect()
    };
    let mut taken = Vec::new();
    for lease in leases {
        let mut st = lease.lock();
        st.closed = true;
        let sups = std::mem::take(&mut st.idle);
        drop(st);
        taken.extend(sups.into_iter().map(|s| (Arc::clone(&lease), s)));
    }
    taken
}

/// Ends every idle supervisor of `sandbox_id` (any origin and key) with the
/// proof and closes its leases, so a supervisor still running a command is ended when it
/// finishes; waits for them, within `ctx`. `destroySandbox` calls it first.
pub async fn end_sandbox(sandbox_id: &str, ctx: &Ctx) {
    let ends: Vec<_> = close(|k| k.1 == sandbox_id).into_iter().map(|(l, s)| spawn_end(l, s, Why::Destroy)).collect();
    let _ = ctx.run(async { Ok(futures_util::future::join_all(ends).await) }).await;
}

/// Ends every idle supervisor of the process with the proof, waiting at most
/// `wait` (from a thread outside the runtime: an environment's teardown). Leases are closed,
/// so the supervisors of commands in flight are ended as those commands end.
pub fn end_all_blocking(wait: Duration) {
    let reg = registry();
    let Some(handle) = reg.runtime.lock().unwrap_or_else(PoisonError::into_inner).clone() else { return };
    let taken = close(|_| true);
    if taken.is_empty() {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    handle.spawn(async move {
        let ends: Vec<_> = taken.into_iter().map(|(l, s)| spawn_end(l, s, Why::Exit)).collect();
        let _ = futures_util::future::join_all(ends).await;
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(wait);
}
