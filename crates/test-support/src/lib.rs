//! The one helper the Rust integration tests share (the model: reqwest's `tests/support`).
//!
//! [`with_emulator`] starts an emulator on 127.0.0.1, runs the test body under a time limit,
//! and closes the emulator — which SIGKILLs and reaps every process it started — whether the
//! body returned, timed out or panicked. A panic is re-raised after the close.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

pub use createos_emulator::{self as emulator, Emulator, EmulatorOptions, FaultRule};
use futures_util::FutureExt;

/// How long one test body may run before it fails as "timed out".
pub const TEST_LIMIT: Duration = Duration::from_secs(40);

/// Emulator options for tests: no rate limit (tests measure the client, not the limiter).
#[must_use]
pub fn unlimited() -> EmulatorOptions {
    EmulatorOptions { rate_limit_per_minute: None, ..Default::default() }
}

/// Runs `body` against a fresh emulator started with `opts`, within [`TEST_LIMIT`], and closes
/// the emulator on every path.
///
/// # Panics
/// When the emulator cannot start, when the body panics (re-raised after the close), or when
/// the body runs longer than [`TEST_LIMIT`].
pub async fn with_emulator<F, Fut>(opts: EmulatorOptions, body: F)
where
    F: FnOnce(Emulator) -> Fut,
    Fut: Future<Output = ()>,
{
    let emu = emulator::start(opts).await.expect("the emulator starts");
    let outcome = AssertUnwindSafe(tokio::time::timeout(TEST_LIMIT, body(emu.clone()))).catch_unwind().await;
    emu.close().await;
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(_)) => panic!("test timed out after {TEST_LIMIT:?}"),
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Waits (up to 2 s) until the emulator sees no live process it started.
///
/// # Panics
/// When processes are still alive after 2 s.
pub async fn assert_nothing_alive(emu: &Emulator) {
    for _ in 0..100 {
        if emu.live_pids().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("processes still alive: {:?}", emu.live_pids());
}
