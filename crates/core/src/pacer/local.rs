//! The in-process store: the sliding-window rule over this process's own starts. The default
//! store, and the fallback of the shared one while it does not answer.
//!
//! Every reservation is an entry `(start, id, class)` in a list sorted by start. A reservation
//! whose start has come is fixed (it started, or its waiter is starting it now); a later one is
//! a waiter's slot. A reservation of new work is appended at or after the last one (so only
//! the window that ends at the new start has to be checked), at the earliest moment the window
//! allows. A cleanup's reservation is placed the same way over the fixed starts and the other
//! cleanups only, and the waiting new work is then placed again behind it, in its order: its
//! waiters learn when their old slot comes ([`Local::confirm`] answers with the new one). A
//! cancelled waiter removes its entry: the starts after it stay valid (fewer starts never
//! break the rule) and a later caller no longer waits behind it.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::time::Instant;

use super::Rule;
use crate::abort::Class;

#[derive(Clone, Copy)]
struct Entry {
    at: Instant,
    id: u64,
    class: Class,
}

#[derive(Default)]
struct State {
    /// Starts granted (past or reserved in the future), oldest first.
    starts: VecDeque<Entry>,
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

    /// Appends `id` at the earliest start at or after the last entry that the window allows.
    fn append(&mut self, rule: Rule, earliest: Instant, id: u64, class: Class) -> Instant {
        let limit = rule.limit.max(1);
        let n = self.starts.len();
        let mut at = earliest;
        if let Some(last) = self.starts.back() {
            at = at.max(last.at);
        }
        if n >= limit {
            at = at.max(self.starts[n - limit].at + rule.window);
        }
        self.starts.push_back(Entry { at, id, class });
        at
    }

    fn place(&mut self, rule: Rule, now: Instant, id: u64, class: Class) -> Instant {
        let earliest = self.earliest(now);
        // Starts at or before `earliest - window` no longer count for any slot from here on.
        while self.starts.front().is_some_and(|e| e.at + rule.window <= earliest) {
            self.starts.pop_front();
        }
        if class == Class::New {
            return self.append(rule, earliest, id, class);
        }
        // A cleanup goes ahead of every waiting request of new work: those slots are placed
        // again behind it, in their order (each moves later or stays).
        let waiting: Vec<Entry> = self.starts.iter().filter(|e| e.at > now && e.class == Class::New).copied().collect();
        if waiting.is_empty() {
            return self.append(rule, earliest, id, class);
        }
        self.starts.retain(|e| !(e.at > now && e.class == Class::New));
        let at = self.append(rule, earliest, id, class);
        // Never earlier than before: its waiter sleeps until its old slot (a gap that a
        // cancelled waiter left stays a gap).
        for e in waiting {
            self.append(rule, earliest.max(e.at), e.id, e.class);
        }
        at
    }
}

impl Local {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reserves the earliest start allowed from `now` for new work; returns the reservation's
    /// id and start.
    pub fn reserve(&self, rule: Rule, now: Instant) -> (u64, Instant) {
        self.reserve_as(rule, now, Class::New)
    }

    /// Reserves the earliest start allowed from `now` for a request of `class`. Reservations
    /// are made under one lock, so concurrent callers get distinct, ordered slots.
    pub fn reserve_as(&self, rule: Rule, now: Instant, class: Class) -> (u64, Instant) {
        let mut st = self.lock();
        st.next_id += 1;
        let id = st.next_id;
        let at = st.place(rule, now, id, class);
        (id, at)
    }

    /// Called when a waiter's slot has come: `None` = start now; `Some(at)` = the slot moved
    /// to `at` (same id): a cleanup took it, or a pause began after the reservation was made.
    pub fn confirm(&self, id: u64, rule: Rule, now: Instant, class: Class) -> Option<Instant> {
        let mut st = self.lock();
        let pos = st.starts.iter().position(|e| e.id == id);
        if let Some(i) = pos {
            let at = st.starts[i].at;
            if at > now {
                return Some(at);
            }
        }
        let paused = st.paused_until.is_some_and(|p| p > now);
        match pos {
            Some(_) if !paused => None,
            _ => {
                if let Some(i) = pos {
                    st.starts.remove(i);
                }
                Some(st.place(rule, now, id, class))
            }
        }
    }

    /// Gives a reservation back (its waiter was cancelled).
    pub fn release(&self, id: u64) {
        let mut st = self.lock();
        if let Some(i) = st.starts.iter().position(|e| e.id == id) {
            st.starts.remove(i);
        }
    }

    /// Notes a start the shared store granted, so a fallback to this store knows it.
    pub fn record(&self, at: Instant, rule: Rule) {
        let mut st = self.lock();
        while st.starts.front().is_some_and(|e| e.at + rule.window <= at) {
            st.starts.pop_front();
        }
        st.next_id += 1;
        let id = st.next_id;
        let pos = st.starts.iter().rposition(|e| e.at <= at).map_or(0, |i| i + 1);
        st.starts.insert(pos, Entry { at, id, class: Class::New });
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
