//! The in-process store: the sliding-window rule over this process's own starts. The default
//! store, and the fallback of the shared one while it does not answer.
//!
//! Every reservation is an entry `(start, id)` in a list sorted by start; a new reservation is
//! appended at or after the last one (so only the window that ends at the new start has to be
//! checked), at the earliest moment the window allows. A cancelled waiter removes its entry:
//! the starts after it stay valid (fewer starts never break the rule) and a later caller no
//! longer waits behind it.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::time::Instant;

use super::Rule;

#[derive(Default)]
struct State {
    /// Starts granted (past or reserved in the future), oldest first.
    starts: VecDeque<(Instant, u64)>,
    /// No start before this (a 429's Retry-After).
    paused_until: Option<Instant>,
    next_id: u64,
}

/// One in-process budget (per budget key).
#[derive(Default)]
pub struct Local {
    state: Mutex<State>,
}

impl State {
    fn earliest(&self, now: Instant) -> Instant {
        self.paused_until.map_or(now, |p| p.max(now))
    }

    fn place(&mut self, rule: Rule, now: Instant, id: u64) -> Instant {
        let earliest = self.earliest(now);
        let limit = rule.limit.max(1);
        // Starts at or before `earliest - window` no longer count for any slot from here on.
        while self.starts.front().is_some_and(|&(s, _)| s + rule.window <= earliest) {
            self.starts.pop_front();
        }
        let n = self.starts.len();
        let mut at = earliest;
        if let Some(&(last, _)) = self.starts.back() {
            at = at.max(last);
        }
        if n >= limit {
            at = at.max(self.starts[n - limit].0 + rule.window);
        }
        self.starts.push_back((at, id));
        at
    }
}

impl Local {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reserves the earliest start allowed from `now`; returns the reservation's id and start.
    /// Reservations are made under one lock, so concurrent callers get distinct, ordered slots.
    pub fn reserve(&self, rule: Rule, now: Instant) -> (u64, Instant) {
        let mut st = self.lock();
        st.next_id += 1;
        let id = st.next_id;
        let at = st.place(rule, now, id);
        (id, at)
    }

    /// Called when a waiter's slot has come: `None` = start now; `Some(at)` = a pause began
    /// after the reservation was made, so the slot was moved to `at` (same id).
    pub fn confirm(&self, id: u64, rule: Rule, now: Instant) -> Option<Instant> {
        let mut st = self.lock();
        let paused = st.paused_until.filter(|&p| p > now)?;
        let pos = st.starts.iter().position(|&(_, i)| i == id);
        match pos {
            Some(i) if st.starts[i].0 >= paused => None,
            _ => {
                if let Some(i) = pos {
                    st.starts.remove(i);
                }
                Some(st.place(rule, now, id))
            }
        }
    }

    /// Gives a reservation back (its waiter was cancelled).
    pub fn release(&self, id: u64) {
        let mut st = self.lock();
        if let Some(i) = st.starts.iter().position(|&(_, i)| i == id) {
            st.starts.remove(i);
        }
    }

    /// Notes a start the shared store granted, so a fallback to this store knows it.
    pub fn record(&self, at: Instant, rule: Rule) {
        let mut st = self.lock();
        while st.starts.front().is_some_and(|&(s, _)| s + rule.window <= at) {
            st.starts.pop_front();
        }
        st.next_id += 1;
        let id = st.next_id;
        let pos = st.starts.iter().rposition(|&(s, _)| s <= at).map_or(0, |i| i + 1);
        st.starts.insert(pos, (at, id));
    }

    /// Holds every start until `until` (extends, never shortens, the pause).
    pub fn pause_until(&self, until: Instant) {
        let mut st = self.lock();
        if st.paused_until.is_none_or(|p| p < until) {
            st.paused_until = Some(until);
        }
    }

    pub fn paused_until(&self) -> Option<Instant> {
        self.lock().paused_until
    }

    /// Reservations held (past starts still in a window, and waiters); for tests.
    pub fn held(&self) -> usize {
        self.lock().starts.len()
    }
}
