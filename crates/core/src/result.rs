//! What a command resolves to, in every mode (`execute`, `executeStream`, session mode).

use crate::abort::Abort;
use crate::error::{Error, Result};
use crate::output::{Captured, Text};

/// What `execute` and `executeStream` resolve to.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExecuteResult {
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub timed_out: bool,
    /// The output's tail, in the form it was decoded to (see [`Text`]).
    pub stdout: Text,
    pub stderr: Text,
    pub process_id: Option<String>,
    pub output_truncated: bool,
    /// Whether the process tree had exited when the command finished (None = unknown).
    pub tree_exited: Option<bool>,
    /// Session mode only: whose word the result rests on, `supervisor` or `provider`.
    pub containment: Option<&'static str>,
}

impl ExecuteResult {
    pub(crate) fn timed_out(captured: Captured, process_id: Option<String>) -> Self {
        ExecuteResult {
            timed_out: true,
            stdout: captured.stdout,
            stderr: captured.stderr,
            output_truncated: captured.truncated,
            process_id,
            ..Default::default()
        }
    }
}

/// The outcome of an abort: a timeout is a result, a cancellation an error. `tree_exited`:
/// `Some(true)` when the cleanup proved the tree gone.
pub(crate) fn aborted(
    abort: &Abort,
    captured: Captured,
    process_id: Option<String>,
    tree_exited: Option<bool>,
) -> Result<ExecuteResult> {
    match abort.error() {
        Error::TimedOut => Ok(ExecuteResult { tree_exited, ..ExecuteResult::timed_out(captured, process_id) }),
        e => Err(e),
    }
}
