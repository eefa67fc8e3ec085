//! The budget for output retained by exited processes ([`crate::EmulatorOptions::retained_bytes`]).
//!
//! Pure accounting, no processes: the model hands in an exited process's key, its retained
//! bytes (journal plus capture) and a handle, and gets back the handles of the processes whose
//! output must go, oldest exit first. Every operation is O(1) amortised: an exit pushes one
//! entry and pops the entries it evicts; a removal (its sandbox was deleted) only forgets the
//! key, and the FIFO drops such stale entries when it reaches them or when they outnumber the
//! live ones (one pass over the FIFO per as many removals).

use std::collections::{HashMap, VecDeque};

pub(crate) struct Retention<T> {
    /// `None` = unbounded.
    budget: Option<usize>,
    /// Sum of the bytes of every key in `queued`.
    total: usize,
    /// Exited processes still holding their output: key → retained bytes.
    queued: HashMap<u64, usize>,
    /// In exit order; an entry whose key is no longer in `queued` is stale.
    fifo: VecDeque<(u64, T)>,
    /// Exits handed in so far, and evictions so far.
    exits: u64,
    evictions: u64,
}

impl<T> Retention<T> {
    pub fn new(budget: Option<usize>) -> Self {
        Retention { budget, total: 0, queued: HashMap::new(), fifo: VecDeque::new(), exits: 0, evictions: 0 }
    }

    /// A process exited holding `bytes`: returns the handles whose output must now be dropped
    /// (oldest exit first; possibly this one's own, when it alone exceeds the budget).
    pub fn exited(&mut self, key: u64, bytes: usize, handle: T) -> Vec<T> {
        if let Some(old) = self.queued.insert(key, bytes) {
            // Exits are reported once per process; never count one twice regardless.
            self.total -= old;
        }
        self.total += bytes;
        self.exits += 1;
        self.fifo.push_back((key, handle));
        let mut evicted = Vec::new();
        let Some(budget) = self.budget else { return evicted };
        while self.total > budget {
            let Some((k, h)) = self.fifo.pop_front() else { break };
            if let Some(b) = self.queued.remove(&k) {
                self.total -= b;
                self.evictions += 1;
                evicted.push(h);
            }
        }
        evicted
    }

    /// Forget a process (its sandbox was deleted): its bytes leave the total.
    pub fn remove(&mut self, key: u64) {
        if let Some(b) = self.queued.remove(&key) {
            self.total -= b;
        }
        if self.fifo.len() > 2 * self.queued.len() + 16 {
            let queued = &self.queued;
            self.fifo.retain(|(k, _)| queued.contains_key(k));
        }
    }

    /// Bytes retained by exited processes.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Exited processes still holding output.
    pub fn len(&self) -> usize {
        self.queued.len()
    }

    /// Exits handed in so far.
    pub fn exits(&self) -> u64 {
        self.exits
    }

    /// Processes whose output was dropped so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// FIFO entries, stale ones included (bounded by about twice `len()`).
    #[cfg(test)]
    pub fn fifo_len(&self) -> usize {
        self.fifo.len()
    }
}
