//! Observability: an optional sink that hears one event per HTTP attempt and per cleanup
//! step. Events carry fixed words and numbers only: never a URL, a key, a body, an id or
//! output. With no sink (the default) nothing is measured beyond what the code already
//! does, and nothing is allocated.

use std::sync::Arc;

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
