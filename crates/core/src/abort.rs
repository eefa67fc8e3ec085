//! Cancellation as a value: the caller's signal becomes an [`Abort`], and every wait in the
//! core selects on it. A [`Ctx`] pairs an abort with an optional deadline; cleanup runs under
//! a fresh `Ctx` that the caller's abort cannot cut short.

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

const NOT_ABORTED: u8 = 0;
const TIMED_OUT: u8 = 1;
const CANCELLED: u8 = 2;

/// A one-shot abort with a reason (timed out, or cancelled).
#[derive(Clone, Default)]
pub struct Abort {
    token: CancellationToken,
    reason: Arc<AtomicU8>,
}

impl Abort {
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the abort. The first reason wins.
    pub fn abort(&self, timed_out: bool) {
        let reason = if timed_out { TIMED_OUT } else { CANCELLED };
        let _ = self.reason.compare_exchange(NOT_ABORTED, reason, Ordering::SeqCst, Ordering::SeqCst);
        self.token.cancel();
    }

    pub fn is_aborted(&self) -> bool {
        self.token.is_cancelled()
    }

    /// The error that describes this abort (`TimedOut` or `Cancelled`).
    pub fn error(&self) -> Error {
        match self.reason.load(Ordering::SeqCst) {
            TIMED_OUT => Error::TimedOut,
            _ => Error::Cancelled,
        }
    }

    pub async fn aborted(&self) {
        self.token.cancelled().await;
    }
}

/// Which requests the request budget serves first when it is short (see `pacer/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Class {
    /// New work: a command's staging, creation, stream, gate.
    #[default]
    New,
    /// Proof of containment: a cleanup, a creation recovery, a sandbox destroy. Takes the next
    /// free slot ahead of any waiting request of new work.
    Cleanup,
}

/// What every request and wait of one job runs under.
#[derive(Clone)]
pub struct Ctx {
    pub abort: Abort,
    /// When the work must give up; `None` = only the abort ends it.
    pub deadline: Option<Instant>,
    /// The budget class of every request made under this context.
    pub class: Class,
}

impl Ctx {
    pub fn new(abort: Abort) -> Self {
        Ctx { abort, deadline: None, class: Class::New }
    }

    /// New work under `abort` that also gives up at `deadline`.
    pub fn with_deadline(abort: Abort, deadline: Instant) -> Self {
        Ctx { abort, deadline: Some(deadline), class: Class::New }
    }

    /// A fresh context for cleanup: its own (never fired) abort, its own deadline, and the
    /// cleanup class (its requests go ahead of new work in the budget).
    pub fn cleanup(timeout: Duration) -> Self {
        Ctx { abort: Abort::new(), deadline: Some(Instant::now() + timeout), class: Class::Cleanup }
    }

    /// Fails at once when aborted or past the deadline.
    pub fn check(&self) -> Result<()> {
        if self.abort.is_aborted() {
            return Err(self.abort.error());
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::TimedOut);
        }
        Ok(())
    }

    /// Time left before the deadline (None = unbounded).
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Runs `fut` until it finishes, the abort fires, or the deadline passes. A passed
    /// deadline reports `TimedOut`.
    pub async fn run<T>(&self, fut: impl Future<Output = Result<T>>) -> Result<T> {
        self.check()?;
        let deadline = self.deadline;
        tokio::select! {
            biased;
            _ = self.abort.aborted() => Err(self.abort.error()),
            _ = sleep_until_opt(deadline) => Err(Error::TimedOut),
            r = fut => r,
        }
    }

    /// Sleeps for `d` unless aborted or past the deadline first.
    pub async fn sleep(&self, d: Duration) -> Result<()> {
        self.run(async {
            tokio::time::sleep(d).await;
            Ok(())
        })
        .await
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_reason_wins_and_run_stops_at_once() {
        let abort = Abort::new();
        let ctx = Ctx::new(abort.clone());
        let a2 = abort.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            a2.abort(true);
            a2.abort(false);
        });
        let started = std::time::Instant::now();
        let r: Result<()> = ctx.run(std::future::pending()).await;
        assert!(matches!(r, Err(Error::TimedOut)));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(matches!(abort.error(), Error::TimedOut));
    }

    #[tokio::test]
    async fn cleanup_ctx_has_its_own_deadline() {
        let ctx = Ctx::cleanup(Duration::from_millis(30));
        let r: Result<()> = ctx.run(std::future::pending()).await;
        assert!(matches!(r, Err(Error::TimedOut)));
    }
}
