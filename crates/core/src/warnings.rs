//! Warnings for the host (`process.emitWarning(message, { code })`): state changes the core
//! notices with no call to tell (a shared pacing store that went down or came back, a session
//! supervisor whose end could not be proven). A bounded queue, drained by the next call that
//! settles, and a listener told at once when one is queued.

use std::borrow::Cow;
use std::sync::{Mutex, OnceLock, PoisonError};

/// One warning. `message` holds fixed words and, at most, a sandbox id (never a key, a URL
/// or provider text); `sandbox_id` names the sandbox it is about, when it is about one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub code: &'static str,
    pub message: Cow<'static, str>,
    pub sandbox_id: Option<String>,
}

impl Warning {
    /// A warning with a fixed message, about no sandbox.
    pub const fn fixed(code: &'static str, message: &'static str) -> Self {
        Warning { code, message: Cow::Borrowed(message), sandbox_id: None }
    }
}

const MAX_PENDING_WARNINGS: usize = 32;

fn pending() -> &'static Mutex<Vec<Warning>> {
    static PENDING: OnceLock<Mutex<Vec<Warning>>> = OnceLock::new();
    PENDING.get_or_init(Default::default)
}

/// Told that a warning was queued; returns false once it can no longer deliver (then it is
/// dropped, and warnings wait for the next call that settles).
pub type WarningListener = Box<dyn Fn() -> bool + Send + Sync>;

fn listener() -> &'static Mutex<Option<WarningListener>> {
    static LISTENER: OnceLock<Mutex<Option<WarningListener>>> = OnceLock::new();
    LISTENER.get_or_init(Default::default)
}

/// Sets (or clears) the one listener told of every queued warning, so the host hears of a
/// transition when it happens (a store that answers again is noticed by the probe's own timer,
/// while no call may be in flight), not only when a call settles.
pub fn set_warning_listener(l: Option<WarningListener>) {
    *listener().lock().unwrap_or_else(PoisonError::into_inner) = l;
}

/// Queues a warning for the listener, or else for the next native call that settles (bounded:
/// past [`MAX_PENDING_WARNINGS`] undelivered ones, more are dropped).
pub(crate) fn warn(w: Warning) {
    {
        let mut p = pending().lock().unwrap_or_else(PoisonError::into_inner);
        if p.len() >= MAX_PENDING_WARNINGS {
            return;
        }
        p.push(w);
    }
    let mut l = listener().lock().unwrap_or_else(PoisonError::into_inner);
    if l.as_ref().is_some_and(|notify| !notify()) {
        *l = None;
    }
}

/// The warnings queued since the last call (each is delivered once, to one call).
pub fn take_warnings() -> Vec<Warning> {
    std::mem::take(&mut *pending().lock().unwrap_or_else(PoisonError::into_inner))
}
