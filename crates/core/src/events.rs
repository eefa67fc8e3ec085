//! Observability: an optional sink that hears one event per HTTP attempt and per cleanup
//! step. Events carry fixed words and numbers only: never a URL, a key, a body, an id or
//! output. With no sink (the default) nothing is measured beyond what the code already
//! does, and nothing is allocated.

use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use crate::error::Attempt;

/// One HTTP attempt, as `createos-execute:request` publishes it.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestEvent {
    /// The fixed operation label (`process creation`, `output connection`, …).
    pub operation: &'static str,
    /// `GET`, `POST`, `PUT`, `DELETE`.
    pub method: &'static str,
    /// The HTTP status, or `None` when no answer arrived.
    pub status: Option<u16>,
    /// `ok`, `http error`, `no response`, `redirect refused`, `untrusted certificate`, `aborted`
    /// or `failed`.
    pub outcome: &'static str,
    /// 1 for the first try of a request, 2 for its first retry, …
    pub attempt: u32,
    /// From handing the request to the connection to the answer's head (or the failure).
    pub duration_ms: f64,
    /// How long this attempt waited for the origin's pacer (429 pauses included).
    pub pacing_wait_ms: f64,
}

/// What the sink hears.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    Request(&'a RequestEvent),
    /// A cleanup step, exactly as it is recorded in a `CreateosCleanupError`'s `attempts`.
    Cleanup(&'a Attempt),
}

/// Called on the thread that does the work: it must not block (queue and return).
pub type EventSink = Arc<dyn Fn(Event<'_>) + Send + Sync>;

/// Milliseconds with 0.1 ms resolution.
pub fn millis(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

fn background_slot() -> &'static RwLock<Option<EventSink>> {
    static SLOT: OnceLock<RwLock<Option<EventSink>>> = OnceLock::new();
    SLOT.get_or_init(Default::default)
}

/// Sets (or clears) the sink of work no call owns: a session supervisor's stream and its end
/// (an idle end, a retirement, the host's exit). The last registration wins.
pub fn set_background_sink(sink: Option<EventSink>) {
    *background_slot().write().unwrap_or_else(PoisonError::into_inner) = sink;
}

/// A sink that passes each event on to the background sink registered at that moment (none:
/// the event is dropped).
pub fn background() -> EventSink {
    Arc::new(|ev| {
        if let Some(sink) = background_slot().read().unwrap_or_else(PoisonError::into_inner).as_ref() {
            sink(ev);
        }
    })
}
