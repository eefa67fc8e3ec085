//! The request budget per budget key (the API origin by default), shared by every call in the
//! process (and by the host through `waitForRequest`), and optionally by every process and host
//! that uses the same Redis store.
//!
//! Modes:
//! - `Window` (default): never more than `limit` request starts in any `window` (300 in 60 s),
//!   a sliding window. A command's few requests go at once; a burst beyond the budget waits
//!   for the oldest start to leave the window.
//! - `Spacing`: every start at least `interval` after the previous one (the TypeScript
//!   module's 300 ms rule) = at most 1 start in any `interval`.
//! - `Off`: no pacing (tests, a private emulator); only a 429's pause holds.
//!
//! Stores: [`local::Local`] (in-process, the default) and [`redis_store::RedisStore`] (shared;
//! falls back to the local store while it does not answer, with this process's share of the
//! limit only, so N processes do not get N budgets: see the store's module doc for the share
//! and why; the starts made meanwhile are written back, and a waiter that reserved locally asks
//! the store again when its slot comes). Both reserve a slot per waiter;
//! a waiter cancelled while it waits gives its slot back, and a waiter whose slot has come
//! checks it again (`confirm`), so a slot that moved (see below) or a 429's `Retry-After` that
//! began meanwhile holds waiters that already reserved a slot too.
//!
//! Two classes of requests ([`Class`], read from the caller's [`Ctx`]): new work, and the
//! requests that prove containment (a cleanup, a creation recovery, a sandbox destroy). A
//! cleanup's request takes the next free slot ahead of every waiting request of new work, in
//! either store, across processes: the store places it over the starts made and the other
//! cleanups only, and places the waiting new work again behind it, in its order, so each of
//! those waiters moves later by at most what the cleanups took; it learns its new slot when its
//! old one comes. The window rule holds for all starts together, and a pause holds both
//! classes. New work whose new slot lies beyond its deadline or abort ends as that timeout or
//! abort while it waits (nothing was sent).
//!
//! Why classes decided by the store, and not a share of each window kept from new work: a
//! share costs new work that throughput all the time, for an event that is rare, and its size
//! is a guess — a burst of timeouts larger than the share still queues behind new work, and at
//! a budget of 10 a share of one slot is a tenth of the throughput. With classes a cleanup waits
//! at most for the next slot that any start frees (at most one window at a saturated budget,
//! usually less), whatever the backlog of new work, and new work keeps the whole budget while
//! nothing is being cleaned up.
//!
//! A 429 answer pauses the budget key until its `Retry-After` has passed (in the shared store:
//! for every process using it).

pub mod local;
pub mod redis_store;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::abort::{Class, Ctx};
use crate::error::Result;

pub use local::Local;
use redis_store::{Answer, Confirmed, RedisStore};

use crate::warnings::warn;
pub use crate::warnings::{set_warning_listener, take_warnings, Warning, WarningListener};

pub const STORE_DOWN: Warning = Warning::fixed(
    "CREATEOS_PACING_STORE_DOWN",
    "createos-execute: the shared pacing store does not answer; requests are paced by this process's own budget until it answers again.",
);
pub const STORE_RESTORED: Warning = Warning::fixed(
    "CREATEOS_PACING_STORE_RESTORED",
    "createos-execute: the shared pacing store answers again; requests share its budget again.",
);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacingMode {
    Window { limit: usize, window: Duration },
    Spacing { interval: Duration },
    Off,
}

impl Default for PacingMode {
    fn default() -> Self {
        PacingMode::Window { limit: 300, window: Duration::from_secs(60) }
    }
}

impl PacingMode {
    pub fn spacing_default() -> Self {
        PacingMode::Spacing { interval: Duration::from_millis(300) }
    }

    /// The sliding-window rule of this mode (`None` = off).
    pub fn rule(self) -> Option<Rule> {
        match self {
            PacingMode::Window { limit, window } => Some(Rule { limit: limit.max(1), window }),
            PacingMode::Spacing { interval } => Some(Rule { limit: 1, window: interval }),
            PacingMode::Off => None,
        }
    }
}

/// At most `limit` starts in any `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub limit: usize,
    pub window: Duration,
}

/// Which store a client asked for.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum StoreChoice {
    /// Not configured: the budget keeps its store (in-process for a new one).
    #[default]
    Keep,
    Local,
    /// A `redis://` or `rediss://` URL (checked by the config parser).
    Redis(String),
}

impl std::fmt::Debug for StoreChoice {
    /// Never prints the URL (it may hold a password).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreChoice::Keep => "Keep",
            StoreChoice::Local => "Local",
            StoreChoice::Redis(_) => "Redis(<redacted>)",
        })
    }
}

/// A client's pacing configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PacingConfig {
    /// `None` = not configured: the budget keeps its mode (the default for a new one).
    pub mode: Option<PacingMode>,
    pub store: StoreChoice,
    /// The budget key; `None` = the API origin.
    pub key: Option<String>,
}

enum Held {
    Local(u64),
    Shared(Arc<RedisStore>, String),
}

/// How long a waiter of the shared store sleeps at most before it measures this process's
/// share again (one op per key at most every [`redis_store`]'s share interval).
const SHARE_REFRESH: Duration = Duration::from_secs(1);

pub struct Pacer {
    key: String,
    mode: Mutex<PacingMode>,
    local: Local,
    shared: Mutex<Option<Arc<RedisStore>>>,
}

/// A reservation not yet used: dropped (the wait was cancelled, timed out, or its future was
/// dropped), it is given back. Never awaited by the waiter: the shared store's release runs on
/// its own task (and is owed to the store, bounded, when it does not answer).
struct Pending<'a> {
    pacer: &'a Pacer,
    held: Option<Held>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        match self.held.take() {
            None => {}
            Some(Held::Local(id)) => self.pacer.local.release(id),
            Some(Held::Shared(store, member)) => {
                let key = self.pacer.key.clone();
                let rule = self.pacer.mode().rule();
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => {
                        rt.spawn(async move {
                            store.release(&key, &member).await;
                            if let Some(rule) = rule {
                                // A store found down is probed on its own timer.
                                store.watch(&key, rule);
                            }
                        });
                    }
                    Err(_) => store.owe(&key, &member),
                }
            }
        }
    }
}

/// What a waiter whose slot has come learned.
enum Next {
    /// Start now.
    Start,
    /// Wait for this (new) reservation.
    Wait(Held, Instant),
}

impl Pacer {
    pub fn new(mode: PacingMode) -> Self {
        Self::with_key("", mode)
    }

    pub fn with_key(key: &str, mode: PacingMode) -> Self {
        Pacer { key: key.to_owned(), mode: Mutex::new(mode), local: Local::default(), shared: Mutex::new(None) }
    }

    pub fn set_mode(&self, mode: PacingMode) {
        *self.mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = mode;
    }

    pub fn mode(&self) -> PacingMode {
        *self.mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Puts the budget behind a shared store (`None` = in-process only).
    pub fn set_store(&self, store: Option<Arc<RedisStore>>) {
        *self.shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = store;
    }

    pub fn store(&self) -> Option<Arc<RedisStore>> {
        self.shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The in-process store (also the fallback of the shared one).
    pub fn local(&self) -> &Local {
        &self.local
    }

    /// Reserves the earliest start of new work allowed from `now` in the local store and
    /// returns it.
    pub fn reserve(&self, now: Instant) -> Instant {
        self.reserve_as(now, Class::New)
    }

    /// Reserves the earliest start of a request of `class` allowed from `now` in the local
    /// store and returns it.
    pub fn reserve_as(&self, now: Instant, class: Class) -> Instant {
        match self.mode().rule() {
            Some(rule) => self.local.reserve_as(rule, now, class).1,
            None => self.local.paused_until().map_or(now, |p| p.max(now)),
        }
    }

    /// The rule of this process's own budget: the whole rule without a shared store; with one,
    /// this process's share of it (used while the store does not answer).
    fn local_rule(&self, rule: Rule) -> Rule {
        self.store().map_or(rule, |s| s.fallback_rule(&self.key, rule))
    }

    /// Reserves a start in the shared store, else (no store, or no answer) in the local one,
    /// and puts it in `pending`. The member is held before the store answers, so a decision cut
    /// short (abort, deadline) gives back what it may have reserved; a decision that found no
    /// answer owes its member to the store (it may have been made there, late).
    async fn reserve_in_store(&self, rule: Rule, class: Class, pending: &mut Pending<'_>) -> Instant {
        let local_rule = match self.store() {
            // Just back from an outage: its timer writes the starts back, this process keeps to
            // its share for one window more.
            Some(store) if store.settling(&self.key) => store.fallback_rule(&self.key, rule),
            Some(store) => {
                let member = store.member(class);
                pending.held = Some(Held::Shared(store.clone(), member.clone()));
                if let Answer::Wait(wait) = store.reserve(&self.key, rule, &member).await {
                    return Instant::now() + wait;
                }
                // No answer: the store owes itself the member's release if the op was sent.
                pending.held = None;
                store.watch(&self.key, rule);
                store.fallback_rule(&self.key, rule)
            }
            None => rule,
        };
        let (id, at) = self.local.reserve_as(local_rule, Instant::now(), class);
        pending.held = Some(Held::Local(id));
        at
    }

    /// A waiter's slot has come: start now, or wait for its new reservation (a cleanup took
    /// the slot, a pause began after it reserved, or the shared window is full of real starts).
    async fn confirm(&self, held: &Held, rule: Rule, class: Class) -> Next {
        match held {
            Held::Local(id) => {
                // Reserved while the store did not answer: once it answers again, the store
                // decides (it knows what the other processes started meanwhile).
                if let Some(store) = self.store().filter(|s| !s.is_down() && !s.settling(&self.key)) {
                    let member = store.member(class);
                    if let Answer::Wait(wait) = store.reserve(&self.key, rule, &member).await {
                        return Next::Wait(Held::Shared(store, member), Instant::now() + wait);
                    }
                    store.watch(&self.key, rule);
                }
                match self.local.confirm(*id, self.local_rule(rule), Instant::now(), class) {
                    None => Next::Start,
                    Some(at) => Next::Wait(Held::Local(*id), at),
                }
            }
            Held::Shared(store, member) => match store.confirm(&self.key, rule, member).await {
                Some(Confirmed::Start) => Next::Start,
                Some(Confirmed::Moved(wait)) => {
                    Next::Wait(Held::Shared(store.clone(), member.clone()), Instant::now() + wait)
                }
                // The store came back empty from a restart this process did not see: it
                // knows none of the window's starts, and the processes that saw the outage
                // keep to their shares meanwhile; so does this one, for a window, while its
                // starts go back.
                Some(Confirmed::Lost) => {
                    store.lost(&self.key, rule);
                    let (id, at) = self.local.reserve_as(store.fallback_rule(&self.key, rule), Instant::now(), class);
                    Next::Wait(Held::Local(id), at)
                }
                // No answer: this process's own budget decides (its share of the limit, over
                // the starts it knows of, its pause); the store learns of the start when it
                // answers again, and the member is given back.
                None => {
                    store.watch(&self.key, rule);
                    let (id, at) = self.local.reserve_as(store.fallback_rule(&self.key, rule), Instant::now(), class);
                    Next::Wait(Held::Local(id), at)
                }
            },
        }
    }

    /// Waits for this caller's slot. The class of `ctx` decides the queue: a cleanup's request
    /// takes the next free slot ahead of every waiting request of new work. Every wait (the
    /// store's decisions, the slot, the confirmations) is inside the ctx's abort and deadline;
    /// a wait that is cut short (abort, deadline, or the future dropped) gives the slot back
    /// without waiting for the store; a pause that begins while it waits holds it too.
    pub async fn acquire(&self, ctx: &Ctx) -> Result<()> {
        ctx.check()?;
        let class = ctx.class;
        // A pause this process saw holds before anything is reserved (in a shared store it is
        // on its way there, see `pause`).
        while let Some(p) = self.local.paused_until().filter(|&p| p > Instant::now()) {
            ctx.run(async {
                tokio::time::sleep_until(p).await;
                Ok(())
            })
            .await?;
        }
        let Some(rule) = self.mode().rule() else { return Ok(()) };
        let mut pending = Pending { pacer: self, held: None };
        // A decision can take a connection's bound (a new one); an abort does not wait for it.
        let mut at = ctx.run(async { Ok(self.reserve_in_store(rule, class, &mut pending).await) }).await?;
        while at > Instant::now() {
            // A long wait for a slot of the shared store wakes now and then to measure this
            // process's share afresh: the share its fallback would use if the store went down
            // now must count the processes that reserved since (see `RedisStore::refresh_share`).
            let wake = match pending.held.as_ref() {
                Some(Held::Shared(..)) => at.min(Instant::now() + SHARE_REFRESH),
                _ => at,
            };
            ctx.run(async {
                tokio::time::sleep_until(wake).await;
                Ok(())
            })
            .await?;
            if wake < at {
                if let Some(Held::Shared(store, _)) = pending.held.as_ref() {
                    let store = store.clone();
                    ctx.run(async {
                        store.refresh_share(&self.key, rule).await;
                        Ok(())
                    })
                    .await?;
                }
                continue;
            }
            let Some(h) = pending.held.as_ref() else { break };
            let next = ctx.run(async { Ok(self.confirm(h, rule, class).await) }).await?;
            match next {
                Next::Start => break,
                Next::Wait(h, a) => {
                    // A reservation that moved to the other store is given back.
                    let moved = matches!(
                        (&pending.held, &h),
                        (Some(Held::Shared(..)), Held::Local(_)) | (Some(Held::Local(_)), Held::Shared(..))
                    );
                    if moved {
                        if let Some(old) = pending.held.take() {
                            drop(Pending { pacer: self, held: Some(old) });
                        }
                    }
                    pending.held = Some(h);
                    at = a;
                }
            }
        }
        let now = Instant::now();
        match pending.held.take() {
            Some(Held::Shared(store, member)) => {
                // The fallback knows this process's own shared starts, and the store learns
                // when this one really started (its answer may have come late).
                self.local.record(now, rule);
                store.started(&self.key, &member, now, rule);
            }
            Some(Held::Local(_)) => {
                if let Some(store) = self.store() {
                    // Decided here: written back to the store when it answers.
                    store.started(&self.key, &store.member(class), now, rule);
                }
            }
            None => {}
        }
        Ok(())
    }

    /// Holds every start of this budget for `wait` (a 429's Retry-After): here at once, and in
    /// the shared store (its own clock) for every process using it. The store's part runs on
    /// its own task, so the caller (perhaps a cleanup near its deadline) never waits for the
    /// store; this process's callers wait for the pause before they reserve, so the store has
    /// it by the time they ask.
    pub async fn pause(&self, wait: Duration) {
        self.local.pause_until(Instant::now() + wait);
        if let Some(store) = self.store() {
            let key = self.key.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(async move { store.pause(&key, wait).await });
                }
                Err(_) => store.pause(&key, wait).await,
            }
        }
    }

    /// Holds every start of this budget in this process until `until`.
    pub fn pause_until(&self, until: Instant) {
        self.local.pause_until(until);
    }
}

/// The process-wide pacer of a budget key (`cfg.key`, else `origin`). A mode the caller
/// configured explicitly replaces the budget's mode (the latest wins); `None` keeps whatever
/// it has (the default for a new one), so a bare `waitForRequest` never resets it. The same
/// holds for the store.
pub fn for_budget(origin: &str, cfg: &PacingConfig) -> Arc<Pacer> {
    static REGISTRY: OnceLock<Mutex<std::collections::HashMap<String, Arc<Pacer>>>> = OnceLock::new();
    let key = cfg.key.as_deref().unwrap_or(origin);
    let pacer = {
        let mut map = REGISTRY.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(key.to_owned())
            .or_insert_with(|| Arc::new(Pacer::with_key(key, cfg.mode.unwrap_or_default())))
            .clone()
    };
    if let Some(mode) = cfg.mode {
        pacer.set_mode(mode);
    }
    match &cfg.store {
        StoreChoice::Keep => {}
        StoreChoice::Local => pacer.set_store(None),
        StoreChoice::Redis(url) => {
            let want = redis_store::for_url(url);
            let same = match (&want, pacer.store()) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, &b),
                (None, None) => true,
                _ => false,
            };
            if !same {
                pacer.set_store(want);
            }
        }
    }
    pacer
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::abort::Abort;
    use proptest::prelude::*;

    pub(crate) fn max_in_window(starts: &[Instant], window: Duration) -> usize {
        let mut sorted = starts.to_vec();
        sorted.sort();
        let mut best = 0;
        let mut lo = 0;
        for hi in 0..sorted.len() {
            while sorted[hi] >= sorted[lo] + window {
                lo += 1;
            }
            best = best.max(hi - lo + 1);
        }
        best
    }

    fn ctx_with_deadline(d: Duration) -> Ctx {
        Ctx::with_deadline(Abort::new(), Instant::now() + d)
    }

    #[test]
    fn spacing_spaces_starts() {
        let p = Pacer::new(PacingMode::spacing_default());
        let now = Instant::now();
        let a = p.reserve(now);
        let b = p.reserve(now);
        let c = p.reserve(now + Duration::from_millis(10));
        assert_eq!(a, now);
        assert_eq!(b - a, Duration::from_millis(300));
        assert_eq!(c - b, Duration::from_millis(300));
    }

    #[test]
    fn window_lets_a_few_go_at_once_then_waits_for_the_oldest() {
        let w = Duration::from_secs(60);
        let p = Pacer::new(PacingMode::Window { limit: 3, window: w });
        let now = Instant::now();
        assert_eq!(p.reserve(now), now);
        assert_eq!(p.reserve(now), now);
        assert_eq!(p.reserve(now + Duration::from_secs(1)), now + Duration::from_secs(1));
        assert_eq!(p.reserve(now + Duration::from_secs(2)), now + w);
        assert_eq!(p.reserve(now + Duration::from_secs(2)), now + w);
        assert_eq!(p.reserve(now + Duration::from_secs(2)), now + Duration::from_secs(61));
    }

    #[test]
    fn pause_holds_every_start() {
        let p = Pacer::new(PacingMode::Off);
        let now = Instant::now();
        p.pause_until(now + Duration::from_secs(2));
        assert_eq!(p.reserve(now), now + Duration::from_secs(2));
    }

    /// Issue 12, defect 1: with 2 per 3 s and six waiters that give up after 100 ms, a fresh
    /// caller waited 9 s behind their phantom slots. Their slots must come back.
    #[tokio::test(start_paused = true)]
    async fn cancelled_waiters_give_their_slots_back() {
        let p = Arc::new(Pacer::new(PacingMode::Window { limit: 2, window: Duration::from_secs(3) }));
        let t0 = Instant::now();
        for _ in 0..2 {
            p.acquire(&Ctx::new(Abort::new())).await.unwrap();
        }
        let mut waiters = vec![];
        for _ in 0..6 {
            let p = p.clone();
            waiters.push(tokio::spawn(async move { p.acquire(&ctx_with_deadline(Duration::from_millis(100))).await }));
        }
        for w in waiters {
            assert!(matches!(w.await.unwrap(), Err(crate::error::Error::TimedOut)));
        }
        // A waiter whose future is dropped (not just aborted) gives its slot back too.
        let dropped = tokio::time::timeout(Duration::from_millis(50), p.acquire(&Ctx::new(Abort::new()))).await;
        assert!(dropped.is_err());
        p.acquire(&Ctx::new(Abort::new())).await.unwrap();
        assert_eq!(Instant::now() - t0, Duration::from_secs(3), "the fresh caller waits for the budget only");
    }

    /// Issue 12, defect 2: a 429's Retry-After must hold waiters that already reserved a slot.
    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_waiters_that_already_reserved() {
        let p = Arc::new(Pacer::new(PacingMode::Window { limit: 1, window: Duration::from_millis(300) }));
        let t0 = Instant::now();
        p.acquire(&Ctx::new(Abort::new())).await.unwrap();
        let mut waiters = vec![];
        for _ in 0..3 {
            let p = p.clone();
            waiters.push(tokio::spawn(async move {
                p.acquire(&Ctx::new(Abort::new())).await.unwrap();
                Instant::now()
            }));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        p.pause(Duration::from_secs(3)).await; // the origin is paused until t0 + 3.1 s
        let mut starts = vec![];
        for w in waiters {
            starts.push(w.await.unwrap());
        }
        let pause_end = t0 + Duration::from_millis(3100);
        assert!(starts.iter().all(|&s| s >= pause_end), "{:?}", starts.iter().map(|s| *s - t0).collect::<Vec<_>>());
        assert!(max_in_window(&starts, Duration::from_millis(300)) <= 1);
    }

    proptest! {
        /// However requests arrive, no window of `window` holds more than `limit` starts.
        #[test]
        fn no_window_exceeds_the_budget(limit in 1usize..20, gaps in proptest::collection::vec(0u64..5_000, 1..300)) {
            let window = Duration::from_secs(60);
            let p = Pacer::new(PacingMode::Window { limit, window });
            let base = Instant::now();
            let mut t = base;
            let mut starts = vec![];
            for g in gaps {
                t += Duration::from_millis(g);
                let at = p.reserve(t);
                prop_assert!(at >= t);
                starts.push(at);
            }
            prop_assert!(max_in_window(&starts, window) <= limit);
        }

        /// Concurrent callers of both classes on paused time, some cancelled while they wait,
        /// some paused by a 429: no window over the limit (all starts together), no start
        /// inside a pause, a cleanup never starts after new work that was still waiting when
        /// it asked, and the cancelled ones hold nothing afterwards (a fresh caller gets
        /// exactly the slot the real starts allow).
        #[test]
        fn interleaved_callers_with_classes_cancels_and_pauses(
            limit in 1usize..6,
            window_ms in 50u64..2_000,
            callers in proptest::collection::vec(
                (0u64..3_000, proptest::option::of(1u64..2_000), proptest::bool::weighted(0.3)), 1..40),
            pause in proptest::option::of((0u64..3_000, 1u64..2_000)),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
            let window = Duration::from_millis(window_ms);
            let rule = Rule { limit, window };
            let (starts, pause_span, fresh, expected) = rt.block_on(async move {
                let p = Arc::new(Pacer::new(PacingMode::Window { limit, window }));
                let t0 = Instant::now();
                // (asked, started, class)
                let starts = Arc::new(Mutex::new(vec![]));
                let mut tasks = vec![];
                for (delay, give_up, cleanup) in callers {
                    let (p, starts) = (p.clone(), starts.clone());
                    tasks.push(tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                        let mut ctx = match give_up {
                            Some(ms) => ctx_with_deadline(Duration::from_millis(ms)),
                            None => Ctx::new(Abort::new()),
                        };
                        if cleanup {
                            ctx.class = Class::Cleanup;
                        }
                        let asked = Instant::now();
                        if p.acquire(&ctx).await.is_ok() {
                            starts.lock().unwrap().push((asked, Instant::now(), ctx.class));
                        }
                    }));
                }
                let mut pause_span = None;
                if let Some((at, len)) = pause {
                    tokio::time::sleep(Duration::from_millis(at)).await;
                    let from = Instant::now();
                    p.pause(Duration::from_millis(len)).await;
                    pause_span = Some((from, from + Duration::from_millis(len)));
                }
                for t in tasks {
                    t.await.unwrap();
                }
                let starts = starts.lock().unwrap().clone();
                // What the real starts alone allow from now on.
                let reference = Local::default();
                for &(_, s, _) in &starts {
                    reference.record(s, rule);
                }
                if let Some((_, end)) = pause_span {
                    reference.pause_until(end);
                }
                let now = Instant::now();
                let expected = reference.reserve(rule, now).1 - t0;
                let fresh = p.reserve(now) - t0;
                (starts, pause_span, fresh, expected)
            });
            let times: Vec<Instant> = starts.iter().map(|s| s.1).collect();
            prop_assert!(max_in_window(&times, window) <= limit);
            if let Some((from, to)) = pause_span {
                prop_assert!(times.iter().all(|&s| s <= from || s >= to), "a start inside the pause");
            } else {
                for &(asked, started, _) in starts.iter().filter(|s| s.2 == Class::Cleanup) {
                    for &(_, s, _) in starts.iter().filter(|s| s.2 == Class::New) {
                        prop_assert!(s >= started || s <= asked, "new work went ahead of a waiting cleanup");
                    }
                }
            }
            prop_assert_eq!(fresh, expected);
        }
    }

    /// Ten starts fill a window of 2 s, 80 requests of new work queue behind them (16 s of
    /// budget), and a cleanup asks at 1.5 s: it takes the next free slot (2 s), and the new work
    /// moves one slot later, within the window rule.
    #[tokio::test(start_paused = true)]
    async fn a_cleanup_takes_the_next_free_slot_ahead_of_queued_new_work() {
        let window = Duration::from_secs(2);
        let p = Arc::new(Pacer::new(PacingMode::Window { limit: 10, window }));
        let t0 = Instant::now();
        let starts = Arc::new(Mutex::new(vec![]));
        for _ in 0..10 {
            p.acquire(&Ctx::new(Abort::new())).await.unwrap();
            starts.lock().unwrap().push(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut tasks = vec![];
        for _ in 0..80 {
            let (p, starts) = (p.clone(), starts.clone());
            tasks.push(tokio::spawn(async move {
                p.acquire(&Ctx::new(Abort::new())).await.unwrap();
                starts.lock().unwrap().push(Instant::now());
            }));
        }
        tokio::time::sleep(Duration::from_millis(1200)).await;
        p.acquire(&Ctx::cleanup(Duration::from_secs(8))).await.unwrap();
        let cleanup = Instant::now();
        assert_eq!(cleanup - t0, window, "the cleanup waited for the next free slot only");
        starts.lock().unwrap().push(cleanup);
        for t in tasks {
            t.await.unwrap();
        }
        let starts = starts.lock().unwrap().clone();
        assert_eq!(starts.len(), 91);
        assert!(max_in_window(&starts, window) <= 10);
        assert_eq!(starts.iter().filter(|&&s| s == t0 + window).count(), 10, "the cleanup and 9 of the queue");
        assert_eq!(*starts.iter().max().unwrap() - t0, Duration::from_secs(18), "the queue moved by one slot");
    }

    /// New work whose slot a cleanup takes, and whose next slot lies beyond its deadline, ends
    /// as that timeout while it waits, and holds nothing afterwards.
    #[tokio::test(start_paused = true)]
    async fn new_work_moved_past_its_deadline_times_out() {
        let p = Arc::new(Pacer::new(PacingMode::Window { limit: 1, window: Duration::from_secs(1) }));
        let t0 = Instant::now();
        p.acquire(&Ctx::new(Abort::new())).await.unwrap();
        let waiter = {
            let p = p.clone();
            tokio::spawn(async move {
                let r = p.acquire(&ctx_with_deadline(Duration::from_millis(1500))).await;
                (r, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        p.acquire(&Ctx::cleanup(Duration::from_secs(5))).await.unwrap();
        assert_eq!(Instant::now() - t0, Duration::from_secs(1), "the cleanup took the waiter's slot");
        let (r, ended) = waiter.await.unwrap();
        assert!(matches!(r, Err(crate::error::Error::TimedOut)), "{:?}", r.err());
        assert_eq!(ended - t0, Duration::from_millis(1500), "it gave up at its deadline");
        assert_eq!(p.local().held(), 2, "the two real starts only");
    }

    #[tokio::test(start_paused = true)]
    async fn many_concurrent_callers_stay_within_the_budget() {
        let window = Duration::from_secs(60);
        let p = Arc::new(Pacer::new(PacingMode::Window { limit: 300, window }));
        let starts = Arc::new(Mutex::new(vec![]));
        let mut tasks = vec![];
        for i in 0..1000u64 {
            let p = p.clone();
            let starts = starts.clone();
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i * 37 % 5000)).await;
                p.acquire(&Ctx::new(Abort::new())).await.unwrap();
                starts.lock().unwrap().push(Instant::now());
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let starts = starts.lock().unwrap();
        assert_eq!(starts.len(), 1000);
        assert!(max_in_window(&starts, window) <= 300);
    }
}
