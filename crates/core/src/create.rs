//! Creating a managed process (`POST …/processes`), and recovering a creation whose answer
//! was lost: the default mode's command and a session's supervisor are created here.

use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

use crate::abort::Ctx;
use crate::cleanup::{self, Steps};
use crate::client::{self, Client};
use crate::config::Config;
use crate::error::{CleanupReason, Error, Result};

pub const INVALID_RESOURCE_ID: &str = "CreateOS returned an invalid resource ID.";

/// How many times a creation whose connection ended before any answer is sent again, once
/// a conclusive process list proved that nothing of it runs.
const LOST_CREATION_RETRIES: u32 = 2;

/// What the creation step gave.
pub(crate) enum Created {
    /// The answer of the last creation sent (success, or an error with what it may mean).
    Answer(client::Creation),
    /// A lost answer was recovered here and could not be retried: this is the call's
    /// verdict (a cleanup error when the recovery could not prove containment).
    Settled(Error),
}

/// Creates a process whose script attempt `n` is `body_for(n)`'s, and whose every attempt
/// carries `marker` (the call's start-gate path, or a session supervisor's marker) and obeys
/// its cancel file (`script::cancel_path`). A creation lost on a connection that died before
/// any answer (a pooled connection the server closed as it was reused, typically) is sent
/// again, at most [`LOST_CREATION_RETRIES`] times and only while the caller's signal has not
/// fired, once the process list proved that no process of this call runs (its own cleanup, as
/// for any ambiguous creation: what it finds is ended) and the attempt was cancelled in the
/// sandbox (`cleanup::cancel_attempts`), so that attempt exits at once if the server applies
/// it late. `attempt` is the last one sent.
pub(crate) async fn create_with_recovery(
    client: &Client,
    cfg: &Config,
    sb: &str,
    marker: &str,
    body_for: &(dyn Fn(u32) -> Result<Value> + Send + Sync),
    attempt: &AtomicU32,
    ctx: &Ctx,
) -> Created {
    // The answer is awaited after an abort for at most half the cleanup's deadline: the
    // other half is for ending what it created, or for finding it in the list.
    let answer_after_abort = cfg.cleanup.deadline / 2;
    let mut lost = 0;
    loop {
        let n = attempt.load(Ordering::Relaxed);
        let body = match body_for(n) {
            Ok(b) => b,
            Err(e) => {
                return Created::Answer(client::Creation { result: Err(e), maybe_created: false, unanswered: false })
            }
        };
        let creation = client.create_process(sb, body, ctx, answer_after_abort).await;
        if !creation.unanswered || lost >= LOST_CREATION_RETRIES || cfg.cleanup.legacy || ctx.abort.is_aborted() {
            return Created::Answer(creation);
        }
        lost += 1;
        let mut steps = Steps::new();
        let mut seen_alive = false;
        let cleanup_ctx = Ctx::cleanup(cfg.cleanup.deadline);
        // Cancelled first, so the lost attempt can never run later, and a process of it that
        // the list finds takes the DELETE's SIGTERM as cancelled: it leaves the staged stdin
        // (the next attempt's) in place. Unwritten, the attempt is not sent again.
        let cancelled = cleanup::cancel_attempts(client, sb, marker, n, &cleanup_ctx, &mut steps).await;
        let recovered =
            cleanup::recover_creation(client, sb, marker, n, &cfg.cleanup, &cleanup_ctx, &mut steps, &mut seen_alive)
                .await;
        if let Err(f) = recovered {
            return Created::Settled(steps.report(f.reason, sb, f.process_id.as_deref()));
        }
        if cancelled.is_err() {
            return Created::Settled(steps.report(CleanupReason::CreationUnconfirmed, sb, None));
        }
        if ctx.abort.is_aborted() {
            // Sent again unless the caller gave up meanwhile.
            return Created::Settled(ctx.abort.error());
        }
        attempt.store(n + 1, Ordering::Relaxed);
    }
}
