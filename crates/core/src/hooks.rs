//! Injected panics for the robustness tests. With the `test-hooks` feature, the client config
//! field `__panicAt` names a phase at which the call panics; without the feature the field is
//! ignored and [`panic_at`] compiles to nothing.

/// Where a test may inject a panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Right after the process was created, before its output is followed.
    Create,
    /// While following output (on the first data frame).
    Follow,
    /// At the start of terminating a process tree (the cleanup).
    Cleanup,
}

impl Phase {
    pub fn parse(s: &str) -> Option<Phase> {
        match s {
            "create" => Some(Phase::Create),
            "follow" => Some(Phase::Follow),
            "cleanup" => Some(Phase::Cleanup),
            _ => None,
        }
    }
}

/// Panics when the configured phase is `here` (only with the `test-hooks` feature). The panic
/// unwinds like any other but skips the panic hook, so test runs are not flooded with
/// "thread panicked" reports.
#[inline]
#[allow(unused_variables)]
pub fn panic_at(configured: Option<Phase>, here: Phase) {
    #[cfg(feature = "test-hooks")]
    if configured == Some(here) {
        std::panic::resume_unwind(Box::new(format!("injected panic at {here:?} (test hook)")));
    }
}
