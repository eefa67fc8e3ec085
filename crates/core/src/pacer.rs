//! The request budget per API origin, shared by every call in the process (and by the host
//! through `waitForRequest`).
//!
//! Modes:
//! - `Window` (default): never more than `limit` request starts in any `window` (300 in 60 s),
//!   a sliding window. A command's few requests go at once; a burst beyond the budget waits
//!   for the oldest start to leave the window.
//! - `Spacing`: every start at least `interval` after the previous one (the TypeScript
//!   module's 300 ms rule), kept for comparison and for hosts that want it.
//! - `Off`: no pacing (tests, a private emulator).
//!
//! A 429 answer pauses the whole origin until its `Retry-After` has passed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::abort::Ctx;
use crate::error::Result;

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
}

#[derive(Default)]
struct State {
    /// Start times granted (past or reserved in the future), oldest first.
    starts: VecDeque<Instant>,
    /// No start before this (a 429's Retry-After).
    paused_until: Option<Instant>,
}

pub struct Pacer {
    mode: Mutex<PacingMode>,
    state: Mutex<State>,
}

impl Pacer {
    pub fn new(mode: PacingMode) -> Self {
        Pacer { mode: Mutex::new(mode), state: Mutex::new(State::default()) }
    }

    pub fn set_mode(&self, mode: PacingMode) {
        *self.mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = mode;
    }

    pub fn mode(&self) -> PacingMode {
        *self.mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reserves the earliest start allowed from `now` and returns it. Reservations are
    /// made under one lock, so concurrent callers get distinct, ordered slots.
    pub fn reserve(&self, now: Instant) -> Instant {
        let mode = self.mode();
        let mut st = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let earliest = st.paused_until.map_or(now, |p| p.max(now));
        let at = match mode {
            PacingMode::Off => earliest,
            PacingMode::Spacing { interval } => {
                let at = st.starts.back().map_or(earliest, |&last| (last + interval).max(earliest));
                st.starts.clear();
                st.starts.push_back(at);
                at
            }
            PacingMode::Window { limit, window } => {
                let limit = limit.max(1);
                // Starts at or before `earliest - window` no longer count.
                while st.starts.front().is_some_and(|&s| s + window <= earliest) {
                    st.starts.pop_front();
                }
                let at = if st.starts.len() < limit {
                    earliest.max(st.starts.back().copied().unwrap_or(earliest))
                } else {
                    let oldest = st.starts[st.starts.len() - limit];
                    (oldest + window).max(earliest)
                };
                st.starts.push_back(at);
                while st.starts.len() > limit {
                    st.starts.pop_front();
                }
                at
            }
        };
        at
    }

    /// Waits for this caller's slot. Cancelling the wait does not give the slot back
    /// (conservative: the budget is never exceeded).
    pub async fn acquire(&self, ctx: &Ctx) -> Result<()> {
        ctx.check()?;
        let at = self.reserve(Instant::now());
        if at > Instant::now() {
            ctx.run(async {
                tokio::time::sleep_until(at).await;
                Ok(())
            })
            .await?;
        }
        Ok(())
    }

    /// Holds every start of this origin until `until` (a 429's Retry-After).
    pub fn pause_until(&self, until: Instant) {
        let mut st = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if st.paused_until.is_none_or(|p| p < until) {
            st.paused_until = Some(until);
        }
    }
}

/// The process-wide pacer of `origin` (scheme://host:port). A mode the caller configured
/// explicitly replaces the origin's mode (the latest wins); `None` keeps whatever the origin
/// has (the default for a new origin), so a bare `waitForRequest` never resets it.
pub fn for_origin(origin: &str, mode: Option<PacingMode>) -> Arc<Pacer> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<Pacer>>>> = OnceLock::new();
    let mut map = REGISTRY.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let pacer = map.entry(origin.to_owned()).or_insert_with(|| Arc::new(Pacer::new(mode.unwrap_or_default()))).clone();
    if let Some(mode) = mode {
        pacer.set_mode(mode);
    }
    pacer
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn max_in_window(starts: &[Instant], window: Duration) -> usize {
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
                p.acquire(&Ctx::new(crate::abort::Abort::new())).await.unwrap();
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
