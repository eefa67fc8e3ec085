//! Gives memory freed after bursts back to the OS (glibc only).
//!
//! A command that starts holds up to three connections (its creation, its held gate upload,
//! its follow) and runs with one. After a burst of starts, what the finished requests freed
//! stays in glibc's arenas, resident: measured with 300 commands started at once, the host's
//! RSS stayed about twice what the commands in flight still held (docs/benchmarks.md §14).
//! glibc returns the free pages inside its arenas only when asked (`malloc_trim`), so while
//! commands start or end, a background task asks every [`PERIOD`], on a blocking thread. A
//! host whose commands only run (idle streams, heartbeats) triggers nothing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often, at most, memory is given back.
const PERIOD: Duration = Duration::from_secs(5);

static ACTIVITY: AtomicU64 = AtomicU64::new(0);
static STARTED: AtomicBool = AtomicBool::new(false);

/// A command started or ended (call from a tokio context).
pub fn note() {
    ACTIVITY.fetch_add(1, Ordering::Relaxed);
    if !STARTED.swap(true, Ordering::Relaxed) {
        tokio::spawn(run());
    }
}

async fn run() {
    let mut seen = ACTIVITY.load(Ordering::Relaxed);
    // One more round after the activity stopped: pooled connections idle out a few seconds
    // after their last request, and that memory is freed then.
    let mut pending = false;
    loop {
        tokio::time::sleep(PERIOD).await;
        let now = ACTIVITY.load(Ordering::Relaxed);
        let active = now != seen;
        seen = now;
        if active || pending {
            let _ = tokio::task::spawn_blocking(release).await;
        }
        pending = active;
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release() {
    extern "C" {
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: glibc's `malloc_trim` takes each arena's lock; it is safe from any thread.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release() {}
