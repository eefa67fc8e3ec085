//! Fault rules: matched per request by one front layer; handlers stay honest.

use serde::Deserialize;

/// A fault rule. JSON example:
/// `{"route":"connect","skip":1,"times":1,"action":{"kind":"dropAfterFrames","frames":3}}`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FaultRule {
    /// Route name (see [`super::RequestRecord::route`]), one of [`ROUTES`] (any other is an
    /// error: a misspelled route would never match, silently); `None` = any route the action
    /// applies to.
    #[serde(default, deserialize_with = "known_route")]
    pub route: Option<String>,
    /// HTTP method (case-insensitive); `None` = any.
    pub method: Option<String>,
    /// Let the first `skip` matches pass.
    #[serde(default)]
    pub skip: u32,
    /// Match only requests naming a process whose exit frame a `connect` stream has already
    /// sent (the record `GET`, `wait`, `DELETE` that follow a finished stream). Requests before
    /// that pass without counting towards `skip`/`times`. JSON `afterExitFrame`.
    #[serde(default, alias = "afterExitFrame")]
    pub after_exit_frame: bool,
    /// Apply to this many matches after `skip`; `None` = forever.
    pub times: Option<u32>,
    pub action: FaultAction,
}

impl FaultRule {
    /// Parse a rule from JSON (the shape shown on [`FaultRule`]).
    pub fn from_json(s: &str) -> Result<FaultRule, serde_json::Error> {
        serde_json::from_str(s)
    }
}

fn known_route<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let route = Option::<String>::deserialize(d)?;
    match &route {
        Some(r) if !ROUTES.contains(&r.as_str()) => {
            Err(serde::de::Error::custom(format!("unknown route `{r}` (known: {})", ROUTES.join(", "))))
        }
        _ => Ok(route),
    }
}

/// What a matching rule does. Tagged by `kind` (camelCase variant name). Field names are
/// snake_case; camelCase aliases (`afterHandler`, `afterFrames`, `frameBytes`) are accepted too.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum FaultAction {
    /// Answer `status` (JSend body carrying the fake secret `secret-body-token`); with
    /// `after_handler` the real handler runs first and its answer is discarded (on `putFile`,
    /// a write-then-500: the file is written, then 500 is answered). A 429 or 503
    /// carries `Retry-After: 1`, or `retry_after` verbatim (any text: a huge HTTP-date, a
    /// malformed one, an absurd number) when given.
    Status {
        status: u16,
        #[serde(default, alias = "afterHandler")]
        after_handler: bool,
        #[serde(default, alias = "retryAfter")]
        retry_after: Option<String>,
    },
    /// Close the TCP connection without any response (optionally after the real handler ran).
    DropConnection {
        #[serde(default, alias = "afterHandler")]
        after_handler: bool,
    },
    /// Sleep before handling.
    Delay { ms: u64 },
    /// Answer 307 with this `Location`.
    Redirect { location: String },
    // ---- connect-stream faults (route `connect`; `sseNoise` also applies to `execStream`) ----
    /// End the stream abruptly (connection aborted, no terminating chunk, no exit frame) after
    /// N data frames of this connection.
    DropAfterFrames { frames: u32 },
    /// Send every data frame twice.
    DuplicateFrames,
    /// After N data frames, leave out the next one (a seq gap).
    GapAfterFrames { frames: u32 },
    /// After N data frames write one line that is not JSON, then continue.
    MalformedLine {
        #[serde(alias = "afterFrames")]
        after_frames: u32,
    },
    /// Interleave SSE noise (`: keep-alive`, `event: x`, `id: 1`, `retry: 5`, blank lines) and
    /// prefix every frame with `data: `.
    SseNoise,
    /// The first data frame carries a `data_base64` that is not valid base64.
    InvalidBase64,
    /// The first data frame carries `"seq": -1`.
    BadSeq,
    /// Send `{"type":"error","error":<error>}` first, then end the stream.
    ErrorFrame { error: String },
    /// First send one heartbeat line longer than 1 MiB (padding field), then continue normally.
    OversizeFrame,
    /// Send only heartbeats (every 100 ms) for `ms`, then continue normally.
    HeartbeatsOnly { ms: u64 },
    /// Ignore the real process: serve `mib` MiB of data frames of `frame_bytes` raw bytes
    /// (`'x'`), then an exit frame with code 0. The fake count is recorded on the process so
    /// `output.newest_seq` agrees later.
    FastStream {
        mib: u64,
        #[serde(alias = "frameBytes")]
        frame_bytes: usize,
    },
    // ---- DELETE faults (route `deleteProcess`) ----
    /// Answer `tree_exited:false` and do not kill; the tree is reported as not exited until
    /// `close()`.
    TreeExitedFalse,
    /// Answer `tree_exited:false` at once and really SIGKILL `ms` later (the tree, or the
    /// leader's process group under [`crate::TerminationScope::Group`]).
    TreeExitsAfter { ms: u64 },
    /// SIGKILL at once (the tree, or the leader's process group under
    /// [`crate::TerminationScope::Group`]), no SIGTERM first (a server whose DELETE ignores the
    /// grace: the documented minimum does not say it sends SIGTERM), then answer as usual.
    KillOnly,
    // ---- list faults (route `listProcesses`) ----
    /// Serve at most `limit` processes per page, whatever the client asks for. With
    /// `no_total` the page's `pagination` has no `total` and echoes the asked `limit`, as a
    /// server that caps its pages without saying so.
    PageSize {
        limit: usize,
        #[serde(default, alias = "noTotal")]
        no_total: bool,
    },
    /// Ignore `offset`: every page is served from the start (the same page again).
    IgnoreOffset,
    // ---- creation faults (route `createProcess`) ----
    /// The creation is not applied when it arrives: the connection is cut at once without an
    /// answer (or, with `hold`, the answer is held), and the creation is applied later whether
    /// or not the client is still there: with `after_list`, right after the next process-list
    /// answer of that sandbox was sent; with `ms`, that many ms after it arrived (both: the
    /// earlier; neither: at once after the cut). With `hold` the real answer is sent at apply
    /// time if the client is still connected. The request's record gets `applied_ms`.
    ApplyLate {
        #[serde(default, alias = "afterList")]
        after_list: bool,
        #[serde(default)]
        ms: Option<u64>,
        #[serde(default)]
        hold: bool,
    },
}

/// When and how a late creation is applied (see [`FaultAction::ApplyLate`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ApplyLate {
    pub after_list: bool,
    pub ms: Option<u64>,
    pub hold: bool,
}

/// The route names a rule may name (see [`super::RequestRecord::route`]).
pub const ROUTES: &[&str] = &[
    "whoami",
    "createSandbox",
    "getSandbox",
    "deleteSandbox",
    "putFile",
    "getFile",
    "exec",
    "execStream",
    "createProcess",
    "listProcesses",
    "getProcess",
    "deleteProcess",
    "connect",
    "input",
    "stdinClose",
    "signal",
    "wait",
    "unknown",
];

impl FaultAction {
    pub(crate) fn applies_to(&self, route: &str) -> bool {
        use FaultAction::*;
        match self {
            Status { .. } | DropConnection { .. } | Delay { .. } | Redirect { .. } => true,
            SseNoise => route == "connect" || route == "execStream",
            DropAfterFrames { .. }
            | DuplicateFrames
            | GapAfterFrames { .. }
            | MalformedLine { .. }
            | InvalidBase64
            | BadSeq
            | ErrorFrame { .. }
            | OversizeFrame
            | HeartbeatsOnly { .. }
            | FastStream { .. } => route == "connect",
            TreeExitedFalse | TreeExitsAfter { .. } | KillOnly => route == "deleteProcess",
            PageSize { .. } | IgnoreOffset => route == "listProcesses",
            ApplyLate { .. } => route == "createProcess",
        }
    }
}

/// Faults that shape a connect (or exec) stream.
#[derive(Clone, Debug, Default)]
pub(crate) struct StreamFaults {
    pub drop_after: Option<u32>,
    pub duplicate: bool,
    pub gap_after: Option<u32>,
    pub malformed_after: Option<u32>,
    pub sse_noise: bool,
    pub invalid_b64: bool,
    pub bad_seq: bool,
    pub error_frame: Option<String>,
    pub oversize: bool,
    pub heartbeats_only_ms: Option<u64>,
    pub fast: Option<(u64, usize)>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct DeleteFaults {
    pub tree_exited_false: bool,
    pub tree_exits_after: Option<u64>,
    pub kill_only: bool,
}

/// Everything that fired for one request.
#[derive(Clone, Debug, Default)]
pub(crate) struct Fired {
    pub delay_ms: u64,
    /// First of Status / DropConnection / Redirect that fired.
    pub response: Option<FaultAction>,
    pub stream: StreamFaults,
    pub delete: DeleteFaults,
    /// Page size cap of a process list.
    pub page_size: Option<usize>,
    /// A capped list page says nothing of its total (see [`FaultAction::PageSize`]).
    pub no_total: bool,
    /// A process list ignores `offset`.
    pub ignore_offset: bool,
    /// A creation applied late.
    pub apply_late: Option<ApplyLate>,
}

/// The rules matching one request, in order, with their effects combined. `exit_sent`: the
/// request names a process whose exit frame was sent (for [`FaultRule::after_exit_frame`]).
pub(crate) fn evaluate(slots: &mut [super::FaultSlot], route: &str, method: &str, exit_sent: bool) -> Fired {
    let mut fired = Fired::default();
    for slot in slots.iter_mut() {
        let r = &slot.rule;
        if let Some(rr) = &r.route {
            if rr != route {
                continue;
            }
        }
        if let Some(m) = &r.method {
            if !m.eq_ignore_ascii_case(method) {
                continue;
            }
        }
        if !r.action.applies_to(route) || (r.after_exit_frame && !exit_sent) {
            continue;
        }
        slot.seen = slot.seen.saturating_add(1);
        if slot.seen <= r.skip {
            continue;
        }
        if let Some(t) = r.times {
            if slot.seen - r.skip > t {
                continue;
            }
        }
        use FaultAction::*;
        let s = &mut fired.stream;
        match &r.action {
            Delay { ms } => fired.delay_ms += ms,
            Status { .. } | DropConnection { .. } | Redirect { .. } => {
                if fired.response.is_none() {
                    fired.response = Some(r.action.clone());
                }
            }
            DropAfterFrames { frames } => s.drop_after = Some(*frames),
            DuplicateFrames => s.duplicate = true,
            GapAfterFrames { frames } => s.gap_after = Some(*frames),
            MalformedLine { after_frames } => s.malformed_after = Some(*after_frames),
            SseNoise => s.sse_noise = true,
            InvalidBase64 => s.invalid_b64 = true,
            BadSeq => s.bad_seq = true,
            ErrorFrame { error } => s.error_frame = Some(error.clone()),
            OversizeFrame => s.oversize = true,
            HeartbeatsOnly { ms } => s.heartbeats_only_ms = Some(*ms),
            FastStream { mib, frame_bytes } => s.fast = Some((*mib, (*frame_bytes).max(1))),
            TreeExitedFalse => fired.delete.tree_exited_false = true,
            TreeExitsAfter { ms } => fired.delete.tree_exits_after = Some(*ms),
            KillOnly => fired.delete.kill_only = true,
            PageSize { limit, no_total } => {
                fired.page_size = Some((*limit).max(1));
                fired.no_total |= *no_total;
            }
            IgnoreOffset => fired.ignore_offset = true,
            ApplyLate { after_list, ms, hold } => {
                if fired.apply_late.is_none() {
                    fired.apply_late = Some(self::ApplyLate { after_list: *after_list, ms: *ms, hold: *hold });
                }
            }
        }
    }
    fired
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_route_is_refused_and_the_list_faults_parse() {
        let e = FaultRule::from_json(r#"{"route":"createProces","action":{"kind":"delay","ms":1}}"#).unwrap_err();
        assert!(e.to_string().contains("unknown route `createProces`"), "{e}");
        let v = serde_json::json!({"route":"nope","action":{"kind":"delay","ms":1}});
        assert!(serde_json::from_value::<FaultRule>(v).is_err(), "the binding's path refuses it too");
        for route in ROUTES {
            let rule = format!(r#"{{"route":"{route}","action":{{"kind":"delay","ms":1}}}}"#);
            FaultRule::from_json(&rule).unwrap();
        }
        let r =
            FaultRule::from_json(r#"{"route":"listProcesses","action":{"kind":"pageSize","limit":2,"noTotal":true}}"#)
                .unwrap();
        assert!(matches!(r.action, FaultAction::PageSize { limit: 2, no_total: true }));
        let r2 = FaultRule::from_json(r#"{"route":"listProcesses","action":{"kind":"ignoreOffset"}}"#).unwrap();
        let mut slots =
            vec![super::super::FaultSlot { rule: r, seen: 0 }, super::super::FaultSlot { rule: r2, seen: 0 }];
        let fired = evaluate(&mut slots, "listProcesses", "GET", false);
        assert_eq!((fired.page_size, fired.no_total, fired.ignore_offset), (Some(2), true, true));
        assert!(!evaluate(&mut slots, "connect", "GET", false).ignore_offset);
    }

    #[test]
    fn apply_late_and_after_exit_frame_parse_and_match() {
        let r = FaultRule::from_json(r#"{"route":"createProcess","action":{"kind":"applyLate","afterList":true}}"#)
            .unwrap();
        assert!(matches!(r.action, FaultAction::ApplyLate { after_list: true, ms: None, hold: false }));
        let r2 =
            FaultRule::from_json(r#"{"route":"createProcess","action":{"kind":"applyLate","ms":2500,"hold":true}}"#)
                .unwrap();
        let mut slots =
            vec![super::super::FaultSlot { rule: r2, seen: 0 }, super::super::FaultSlot { rule: r, seen: 0 }];
        let fired = evaluate(&mut slots, "createProcess", "POST", false);
        assert_eq!(fired.apply_late, Some(ApplyLate { after_list: false, ms: Some(2500), hold: true }), "first wins");
        assert!(evaluate(&mut slots, "listProcesses", "GET", false).apply_late.is_none());
        let after = FaultRule::from_json(
            r#"{"route":"getProcess","afterExitFrame":true,"times":1,"action":{"kind":"status","status":502}}"#,
        )
        .unwrap();
        let mut slots = vec![super::super::FaultSlot { rule: after, seen: 0 }];
        assert!(evaluate(&mut slots, "getProcess", "GET", false).response.is_none(), "before the exit frame");
        assert!(evaluate(&mut slots, "getProcess", "GET", true).response.is_some(), "the first one after it");
        assert!(evaluate(&mut slots, "getProcess", "GET", true).response.is_none(), "times: 1");
    }
}
