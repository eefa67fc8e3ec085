//! Terminating a process tree and proving it, recovering an ambiguous creation, and
//! destroying a sandbox with a receipt.
//!
//! Everything here runs under its own deadline (a fresh [`Ctx`]), never the caller's signal,
//! and inside a panic guard: a panic during a cleanup is an unproven containment, never a
//! skipped one.
//!
//! # What proves a tree gone
//!
//! | answer | proof? |
//! |---|---|
//! | `tree_exited: true` from `DELETE …/processes/{id}` | yes |
//! | `tree_exited: true` from `GET …/wait?scope=tree` | yes |
//! | 404 from DELETE or `wait`, when nothing in this call said the tree was alive | yes: the server does not know the process, so nothing of it runs |
//! | 404 after an answer said the tree was alive (`tree_exited: false` from DELETE, the exit frame or the process record; 408 from `wait?scope=tree`) | **no**: the server forgot a tree it last reported alive, which can hide a survivor. Asking again cannot prove anything, so the cleanup ends at once, unproven |
//! | `tree_exited: false`, 408, 5xx, 429, no answer, a timeout, a panic | no: ask again (after a backoff with jitter) until the deadline |
//! | 401/403/400/… from DELETE | no, and repeating cannot change it: unproven at once |
//!
//! Bounds: the whole cleanup has one deadline (`cleanupDeadlineMs`, default
//! `min(timeoutMs, 30000)`); each DELETE gets a time slice of its grace plus
//! [`REQUEST_SLICE`] (a hung DELETE is abandoned and sent again on another connection rather
//! than given the whole remaining deadline); rounds are spaced by an exponential backoff with
//! jitter ([`backoff`]), so a run of 503s is ridden out instead of burnt in a millisecond.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use rand::Rng;
use reqwest::Method;
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::abort::Ctx;
use crate::client::{Client, Retry};
use crate::error::{Attempt, CleanupReason, CleanupReport, DestroyReport, Error, Operation, Result};
use crate::events::{Event, EventSink};
use crate::hooks::{self, Phase};
use crate::script::End;

/// The default cleanup deadline when `timeoutMs` is longer: a host learns the verdict within
/// 30 s.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
/// How long one DELETE may take beyond its grace period before it is abandoned and sent
/// again (and how long one list page, sandbox DELETE or state GET may take).
pub const REQUEST_SLICE: Duration = Duration::from_secs(5);
const BACKOFF_BASE_MS: u64 = 50;
const BACKOFF_CAP_MS: u64 = 1000;
/// Upper bound on DELETE rounds, whatever the deadline (the deadline normally ends first).
const MAX_ROUNDS: u32 = 256;
/// Page size asked of the process list, and the most pages read.
const LIST_PAGE: usize = 500;
const MAX_LIST_PAGES: usize = 100;

#[derive(Debug, Clone)]
pub struct CleanupPolicy {
    /// Grace periods of successive DELETEs; the last one repeats until the deadline.
    pub graces_ms: Vec<u64>,
    /// The whole cleanup's deadline (default: `min(timeoutMs, 30000)`).
    pub deadline: Duration,
    /// Long-poll budget of one confirmation `wait?scope=tree`.
    pub confirm_ms: u64,
    /// The TypeScript module's behaviour: one DELETE with a 1 s grace, no confirmation, no
    /// creation recovery.
    pub legacy: bool,
    /// Test hook (`test-hooks` feature only): panic at this phase.
    pub panic_at: Option<Phase>,
    /// A DELETE whose connection is refused (nothing listens at the API's address) ends the
    /// cleanup at once, unproven, instead of being sent again until the deadline. Only for the
    /// ends the host's exit waits for: a host whose server is already gone exits at once.
    pub refused_is_final: bool,
}

impl Default for CleanupPolicy {
    fn default() -> Self {
        CleanupPolicy {
            graces_ms: vec![1000, 5000],
            deadline: DEFAULT_DEADLINE,
            confirm_ms: 1000,
            legacy: false,
            panic_at: None,
            refused_is_final: false,
        }
    }
}

/// The pause before cleanup round `round` (1-based): exponential from 50 ms, capped at 1 s,
/// with "equal jitter" (a uniform draw in the upper half), so concurrent cleanups spread out.
pub fn backoff(round: u32) -> Duration {
    let ceiling = BACKOFF_BASE_MS.saturating_mul(1u64 << round.saturating_sub(1).min(20)).min(BACKOFF_CAP_MS);
    let half = ceiling / 2;
    Duration::from_millis(half + rand::thread_rng().gen_range(0..=half))
}

/// Records cleanup steps with their time since the cleanup started.
pub struct Steps {
    started: Instant,
    pub attempts: Vec<Attempt>,
    events: Option<EventSink>,
}

impl Steps {
    pub fn new() -> Self {
        Steps { started: Instant::now(), attempts: Vec::new(), events: None }
    }

    /// Reports each following step to the client's event sink too.
    fn observe(&mut self, client: &Client) {
        if self.events.is_none() {
            self.events = client.events().cloned();
        }
    }

    pub(crate) fn push(&mut self, step: &'static str, grace_ms: Option<u64>, outcome: impl Into<String>) {
        let at_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let attempt = Attempt { step, grace_ms, outcome: outcome.into(), at_ms: (at_ms * 10.0).round() / 10.0 };
        if let Some(sink) = &self.events {
            sink(Event::Cleanup(&attempt));
        }
        self.attempts.push(attempt);
    }

    pub fn report(self, reason: CleanupReason, sandbox_id: &str, process_id: Option<&str>) -> Error {
        Error::Cleanup(Box::new(self.into_report(reason, sandbox_id, process_id)))
    }

    /// The steps as the report of an unproven cleanup.
    pub fn into_report(self, reason: CleanupReason, sandbox_id: &str, process_id: Option<&str>) -> CleanupReport {
        CleanupReport {
            reason,
            sandbox_id: sandbox_id.to_owned(),
            process_id: process_id.map(str::to_owned),
            attempts: self.attempts,
        }
    }
}

impl Default for Steps {
    fn default() -> Self {
        Self::new()
    }
}

/// A short, fixed description of an error for the attempt log (no provider text).
fn outcome_of(e: &Error) -> String {
    match e {
        Error::Api { status, .. } => format!("HTTP {status}"),
        Error::Connection { .. } => "no response".into(),
        Error::Redirect { .. } => "redirect refused".into(),
        Error::Unmatched { .. } => "no mock answered".into(),
        Error::TimedOut => "deadline passed".into(),
        Error::Protocol(_) => "invalid answer".into(),
        _ => "failed".into(),
    }
}

fn tree_exited(data: &Map<String, Value>) -> bool {
    data.get("tree_exited") == Some(&Value::Bool(true))
}

/// How the record says its process ended (`exit_code`, else `signal`).
fn end_of(data: &Map<String, Value>) -> End {
    match (data.get("exit_code").and_then(Value::as_i64), data.get("signal").and_then(Value::as_str)) {
        (Some(code), _) => End::Exit(code),
        (None, Some(sig)) => End::Signal(sig.to_owned()),
        (None, None) => End::Unknown,
    }
}

/// Terminates the tree of `process_id` and proves it (see the module doc), within `ctx` (a
/// cleanup context: its own deadline, never the caller's abort). `Ok(end)` = proven gone, and
/// how the terminated record says it ended (`End::Unknown` when no record said).
///
/// `seen_alive`: whether an answer earlier in this call said the tree was alive (then a 404
/// is no proof); set here too when an answer of this cleanup says so. A panic inside is
/// caught and reported as unproven.
pub async fn terminate(
    client: &Client,
    sandbox_id: &str,
    process_id: &str,
    policy: &CleanupPolicy,
    ctx: &Ctx,
    steps: &mut Steps,
    seen_alive: &mut bool,
) -> std::result::Result<End, ()> {
    steps.observe(client);
    let run = terminate_unguarded(client, sandbox_id, process_id, policy, ctx, &mut *steps, &mut *seen_alive);
    match AssertUnwindSafe(run).catch_unwind().await {
        Ok(r) => r,
        Err(_) => {
            steps.push("internal", None, "panic");
            Err(())
        }
    }
}

async fn terminate_unguarded(
    client: &Client,
    sandbox_id: &str,
    process_id: &str,
    policy: &CleanupPolicy,
    ctx: &Ctx,
    steps: &mut Steps,
    seen_alive: &mut bool,
) -> std::result::Result<End, ()> {
    hooks::panic_at(policy.panic_at, Phase::Cleanup);
    let base = format!("/sandboxes/{sandbox_id}/processes/{process_id}");
    if policy.legacy {
        let grace = 1000;
        return match delete(client, &base, grace, ctx).await {
            Ok(d) if tree_exited(&d) => {
                steps.push("delete", Some(grace), "tree exited");
                Ok(end_of(&d))
            }
            Ok(_) => {
                *seen_alive = true;
                steps.push("delete", Some(grace), "tree_exited false");
                Err(())
            }
            Err(Error::Api { status: 404, .. }) if !*seen_alive => {
                steps.push("delete", Some(grace), "HTTP 404");
                Ok(End::Unknown)
            }
            Err(e) => {
                steps.push("delete", Some(grace), outcome_of(&e));
                Err(())
            }
        };
    }
    let graces = if policy.graces_ms.is_empty() { vec![1000] } else { policy.graces_ms.clone() };
    for round in 0..MAX_ROUNDS {
        if round > 0 && ctx.sleep(backoff(round)).await.is_err() {
            steps.push("backoff", None, "deadline passed");
            return Err(());
        }
        let grace = graces[(round as usize).min(graces.len() - 1)];
        match delete(client, &base, grace, ctx).await {
            Ok(d) if tree_exited(&d) => {
                steps.push("delete", Some(grace), "tree exited");
                return Ok(end_of(&d));
            }
            Ok(_) => {
                *seen_alive = true;
                steps.push("delete", Some(grace), "tree_exited false");
            }
            Err(Error::Api { status: 404, .. }) if !*seen_alive => {
                steps.push("delete", Some(grace), "HTTP 404");
                return Ok(End::Unknown);
            }
            Err(Error::Api { status: 404, .. }) => {
                steps.push("delete", Some(grace), "HTTP 404 after alive");
                return Err(());
            }
            Err(e @ Error::TimedOut) => {
                steps.push("delete", Some(grace), outcome_of(&e));
                return Err(());
            }
            Err(e @ Error::Connection { maybe_sent: false, .. }) if policy.refused_is_final => {
                steps.push("delete", Some(grace), outcome_of(&e));
                return Err(());
            }
            Err(e @ (Error::Api { status: 400..=499, .. } | Error::Redirect { .. } | Error::Unmatched { .. }))
                if !matches!(e.status(), Some(408 | 409 | 429)) =>
            {
                // A refusal that repeating cannot change (auth, validation).
                steps.push("delete", Some(grace), outcome_of(&e));
                return Err(());
            }
            Err(e) => steps.push("delete", Some(grace), outcome_of(&e)),
        }
        match confirm(client, &base, policy.confirm_ms, ctx).await {
            Ok(Some(end)) => {
                steps.push("wait", None, "tree exited");
                return Ok(end);
            }
            Ok(None) => {
                *seen_alive = true;
                steps.push("wait", None, "still running");
            }
            Err(Error::Api { status: 404, .. }) if !*seen_alive => {
                steps.push("wait", None, "HTTP 404");
                return Ok(End::Unknown);
            }
            Err(Error::Api { status: 404, .. }) => {
                steps.push("wait", None, "HTTP 404 after alive");
                return Err(());
            }
            Err(e @ Error::TimedOut) => {
                steps.push("wait", None, outcome_of(&e));
                return Err(());
            }
            Err(e) => steps.push("wait", None, outcome_of(&e)),
        }
        if ctx.check().is_err() {
            return Err(());
        }
    }
    Err(())
}

/// The time one request of a cleanup may take: `extra` plus [`REQUEST_SLICE`], within the
/// deadline.
fn slice(ctx: &Ctx, extra: Duration) -> Duration {
    let want = extra.saturating_add(REQUEST_SLICE);
    ctx.remaining().map_or(want, |r| want.min(r)).max(Duration::from_millis(1))
}

async fn delete(client: &Client, base: &str, grace_ms: u64, ctx: &Ctx) -> Result<Map<String, Value>> {
    let timeout = slice(ctx, Duration::from_millis(grace_ms));
    client
        .json_with(
            Operation::ProcessCleanup,
            Method::DELETE,
            &format!("{base}?grace_ms={grace_ms}"),
            None,
            ctx,
            Retry::RateLimitOnly,
            timeout,
        )
        .await
}

/// One `wait?scope=tree` long-poll: `Ok(Some(end))` when the tree exited, `Ok(None)` on 408
/// (or an answer without `tree_exited: true`).
async fn confirm(client: &Client, base: &str, confirm_ms: u64, ctx: &Ctx) -> Result<Option<End>> {
    let budget =
        ctx.remaining().map_or(confirm_ms, |r| confirm_ms.min(u64::try_from(r.as_millis()).unwrap_or(u64::MAX)));
    let timeout = slice(ctx, Duration::from_millis(budget));
    let path = format!("{base}/wait?scope=tree&timeout_ms={budget}");
    match client.json_with(Operation::ProcessStatus, Method::GET, &path, None, ctx, Retry::RateLimitOnly, timeout).await
    {
        Ok(d) => Ok(tree_exited(&d).then(|| end_of(&d))),
        Err(Error::Api { status: 408, .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What one call learned, carried from the creation through the follow into every cleanup
/// path. No phase starts from "nothing known": a phase that learns something writes it here,
/// and every cleanup decides from it.
#[derive(Debug, Default)]
pub struct Facts {
    /// The process this call created (from the creation's answer).
    pub process_id: Option<String>,
    /// Some answer in this call said the tree was alive: `tree_exited: false` from the exit
    /// frame, the process record or a DELETE, a 408 from `wait?scope=tree`, or a live list
    /// entry of ours. From then on a 404 is no proof.
    pub seen_alive: bool,
    /// The stdin file was staged (its upload went out).
    pub staged: bool,
    /// The start gate's content may have been sent: the command may have started, and past
    /// its gate the script removes its staged files itself.
    pub gate_sent: bool,
    /// The creation may have been applied without an answer that says so (a process may
    /// exist that `process_id` does not name).
    pub creation_ambiguous: bool,
    /// The verdict is already decided: the command completed, or a cleanup inside the run
    /// gave its own verdict. Nothing more to end.
    pub settled: bool,
    /// The last creation attempt sent (1 for the first; see `script.rs`, "Attempts").
    pub attempt: u32,
    /// How the process named by `process_id` ended, as the cleanup's receipt says (whether
    /// its script removed its staged files: `script::staged_files_remain`).
    pub ended: End,
}

/// How a cleanup ended when containment was proven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contained {
    /// A tree of this call was ended and proven gone.
    TreeGone,
    /// No process of this call exists (none was created, or the list proved it).
    NothingRan,
}

/// Ends whatever `facts` say this call may have started and proves it, within `ctx`. `marker`
/// finds a process behind a lost creation answer. Err = unproven: the reason and the process
/// the verdict is about.
pub async fn contain(
    client: &Client,
    sandbox_id: &str,
    marker: &str,
    facts: &mut Facts,
    policy: &CleanupPolicy,
    ctx: &Ctx,
    steps: &mut Steps,
) -> std::result::Result<Contained, RecoveryFailure> {
    if let Some(pid) = facts.process_id.clone() {
        return match terminate(client, sandbox_id, &pid, policy, ctx, steps, &mut facts.seen_alive).await {
            Ok(end) => {
                facts.ended = end;
                Ok(Contained::TreeGone)
            }
            Err(()) => Err(RecoveryFailure { reason: CleanupReason::TerminationUnconfirmed, process_id: Some(pid) }),
        };
    }
    if !facts.creation_ambiguous {
        return Ok(Contained::NothingRan);
    }
    if policy.legacy {
        return Err(RecoveryFailure::creation());
    }
    let attempt = facts.attempt.max(1);
    if recover_creation(client, sandbox_id, marker, attempt, policy, ctx, steps, &mut facts.seen_alive).await? {
        return Ok(Contained::TreeGone);
    }
    // Nothing of the attempt exists now, but the server may still apply it: cancelled, it
    // exits at once if it ever starts. Unwritten, the verdict says what is true.
    match cancel_attempts(client, sandbox_id, marker, attempt, ctx, steps).await {
        Ok(()) => Ok(Contained::NothingRan),
        Err(()) => Err(RecoveryFailure::creation()),
    }
}

/// Writes the call's cancel file (`script::cancel_path`) with `attempt`: every attempt up to
/// it that starts, or waits on its gate, exits without running anything. One upload, under
/// `ctx` (a cleanup context), with the upload's retry rules.
pub async fn cancel_attempts(
    client: &Client,
    sandbox_id: &str,
    marker: &str,
    attempt: u32,
    ctx: &Ctx,
    steps: &mut Steps,
) -> std::result::Result<(), ()> {
    steps.observe(client);
    let path = crate::script::cancel_path(marker);
    let content = bytes::Bytes::from(attempt.to_string());
    match AssertUnwindSafe(client.put_file(sandbox_id, &path, content, ctx)).catch_unwind().await {
        Ok(Ok(())) => {
            steps.push("cancel", None, "written");
            Ok(())
        }
        Ok(Err(e)) => {
            steps.push("cancel", None, outcome_of(&e));
            Err(())
        }
        Err(_) => {
            steps.push("internal", None, "panic");
            Err(())
        }
    }
}

/// Why a creation recovery could not prove containment, and the process it was about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryFailure {
    pub reason: CleanupReason,
    /// The process found behind the lost answer whose end could not be proven.
    pub process_id: Option<String>,
}

impl RecoveryFailure {
    fn creation() -> Self {
        RecoveryFailure { reason: CleanupReason::CreationUnconfirmed, process_id: None }
    }
}

/// One process of ours found in the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub process_id: String,
    /// The entry said its tree was alive (`tree_exited: false`): a later 404 is no proof.
    pub alive: bool,
    /// The creation attempt whose script it runs, when its arguments say.
    pub attempt: Option<u32>,
}

/// The processes in one list page whose arguments carry `marker`. An entry that carries the
/// marker without a valid `process_id` cannot be ended: `None`, never dropped.
pub fn ours_in_page(processes: &[Value], marker: &str) -> Option<Vec<Found>> {
    let mut ours = Vec::new();
    for p in processes.iter().filter(|p| carries(p, marker)) {
        match p.get("process_id").and_then(Value::as_str) {
            Some(id) if crate::client::is_identifier(id) => {
                let alive = p.get("tree_exited") == Some(&Value::Bool(false));
                ours.push(Found { process_id: id.to_owned(), alive, attempt: attempt_of(p) });
            }
            _ => return None,
        }
    }
    Some(ours)
}

/// What one list page says about where the list ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageShape {
    /// Entries on the page.
    pub count: usize,
    /// `pagination.total`, when the server gave one.
    pub total: Option<usize>,
    /// The page size asked for (`limit`).
    pub limit: usize,
}

/// Where reading a paged list stands after one more page (see [`ListCheck::page`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStep {
    /// Read the next page, from this offset.
    Next(usize),
    /// Every entry was read: the list is complete.
    Complete,
    /// `total` changed between pages: entries may have moved past both; read it again.
    Restart,
    /// The pages contradict each other: nothing can be concluded from them.
    Inconclusive,
}

/// The rules that make a paged list conclusive, for a server that pages as asked and for one
/// that gives the documented minimum (no pagination, no `total`):
/// - with a `total`: complete when the entries read reach it (never pass it); a `total` that
///   changes between pages means the list moved under the read ([`ListStep::Restart`]);
/// - a page longer than asked comes from a server that ignores paging: it is the whole list;
/// - without a `total`, a page shorter than asked ends the list when the next page is empty or
///   repeats it exactly (a server that ignores `offset`; being short shows it did not cut at
///   our `limit`); a next page with new entries is read on (a server that caps its pages
///   below our `limit`);
/// - a full page repeated, or an id on two pages otherwise, proves nothing.
///
/// The residual risk: a server that ignores `offset`, gives no `total` and silently caps its
/// pages below our `limit` looks like a short, complete list.
#[derive(Debug, Default)]
pub struct ListCheck {
    seen: HashSet<String>,
    offset: usize,
    pages: usize,
    total: Option<usize>,
    /// The ids of the previous page, when it was shorter than asked (without a `total`).
    short_page: Option<Vec<Option<String>>>,
}

impl ListCheck {
    /// Takes one page: the ids of its entries (`None` for an entry without one) and its shape.
    pub fn page<'a>(&mut self, ids: impl IntoIterator<Item = Option<&'a str>>, shape: PageShape) -> ListStep {
        let ids: Vec<Option<String>> = ids.into_iter().map(|i| i.map(str::to_owned)).collect();
        let first = self.pages == 0;
        self.pages += 1;
        if let (Some(before), Some(now)) = (self.total, shape.total) {
            if before != now {
                return ListStep::Restart;
            }
        }
        self.total = self.total.or(shape.total);
        if shape.total.is_none() {
            if let Some(prev) = self.short_page.take() {
                // After a short page: an empty page or the same page again ends the list.
                if ids.is_empty() || ids == prev {
                    return ListStep::Complete;
                }
            }
        }
        for id in ids.iter().flatten() {
            if !self.seen.insert(id.clone()) {
                return ListStep::Inconclusive;
            }
        }
        self.offset = self.offset.saturating_add(shape.count);
        match shape.total {
            Some(total) if self.offset == total => ListStep::Complete,
            Some(total) if self.offset > total || shape.count == 0 => ListStep::Inconclusive,
            Some(_) => ListStep::Next(self.offset),
            None if shape.count == 0 => ListStep::Complete,
            // More than asked: a server that ignores paging gave its whole list.
            None if shape.count > shape.limit => {
                if first {
                    ListStep::Complete
                } else {
                    ListStep::Inconclusive
                }
            }
            None => {
                if shape.count < shape.limit {
                    self.short_page = Some(ids);
                }
                ListStep::Next(self.offset)
            }
        }
    }
}

/// What reading the list gave: every entry of ours seen on any page, and whether the pages
/// prove that there is no other.
#[derive(Debug, Default)]
pub struct Listed {
    pub ours: Vec<Found>,
    pub conclusive: bool,
}

/// How many times a list whose `total` changed is read again from the start.
const LIST_RESTARTS: usize = 2;

/// Reads every page of the process list and returns the processes of ours on any page (see
/// [`ours_in_page`]), and whether the pages were conclusive ([`ListCheck`]). A failed or
/// invalid page ends the read, inconclusive; what was found before it is still returned.
async fn list_ours(client: &Client, sandbox_id: &str, marker: &str, ctx: &Ctx, steps: &mut Steps) -> Listed {
    let mut listed = Listed::default();
    let mut check = ListCheck::default();
    let mut offset: usize = 0;
    let mut restarts = 0;
    let add = |listed: &mut Listed, found: Vec<Found>| {
        for f in found {
            if !listed.ours.iter().any(|o| o.process_id == f.process_id) {
                listed.ours.push(f);
            } else if f.alive {
                if let Some(o) = listed.ours.iter_mut().find(|o| o.process_id == f.process_id) {
                    o.alive = true;
                }
            }
        }
    };
    for _ in 0..MAX_LIST_PAGES {
        let path = format!("/sandboxes/{sandbox_id}/processes?limit={LIST_PAGE}&offset={offset}");
        let timeout = slice(ctx, Duration::ZERO);
        let data =
            match client.json_with(Operation::ProcessStatus, Method::GET, &path, None, ctx, Retry::Safe, timeout).await
            {
                Ok(d) => d,
                Err(e) => {
                    steps.push("list", None, outcome_of(&e));
                    return listed;
                }
            };
        let Some(Value::Array(processes)) = data.get("processes") else {
            steps.push("list", None, "invalid answer");
            return listed;
        };
        let Some(found) = ours_in_page(processes, marker) else {
            // Ours, without an id to end it by: what else of ours there is still counts.
            add(&mut listed, ours_with_ids(processes, marker));
            steps.push("list", None, "invalid id");
            return listed;
        };
        add(&mut listed, found);
        let total = data
            .get("pagination")
            .and_then(|p| p.get("total"))
            .and_then(Value::as_u64)
            .and_then(|v| usize::try_from(v).ok());
        let ids = processes.iter().map(|p| p.get("process_id").and_then(Value::as_str));
        match check.page(ids, PageShape { count: processes.len(), total, limit: LIST_PAGE }) {
            ListStep::Next(next) => offset = next,
            ListStep::Complete => {
                steps.push("list", None, format!("found {}", listed.ours.len()));
                listed.conclusive = true;
                return listed;
            }
            ListStep::Restart if restarts < LIST_RESTARTS => {
                restarts += 1;
                check = ListCheck::default();
                offset = 0;
            }
            ListStep::Restart | ListStep::Inconclusive => {
                steps.push("list", None, "inconsistent pages");
                return listed;
            }
        }
    }
    steps.push("list", None, "too many pages");
    listed
}

/// The entries of ours in a page that have a valid id (those without one cannot be ended).
fn ours_with_ids(processes: &[Value], marker: &str) -> Vec<Found> {
    processes.iter().filter_map(|p| ours_in_page(std::slice::from_ref(p), marker).and_then(|mut v| v.pop())).collect()
}

/// After `POST /processes` failed ambiguously: finds the process(es) whose arguments carry
/// `marker` (the unique start-gate path) in the process list, terminates and confirms every
/// one seen on any page, whatever the list's conclusiveness. `Ok(found)` = proven: nothing of
/// ours runs; `found` says whether the process of `attempt` (the last creation sent) was among
/// them. Proven needs the list to be conclusive, or the process of `attempt` found (one
/// creation makes one process, and earlier attempts were cancelled before it was sent). A
/// list entry of ours that said its tree was alive sets `seen_alive`, and so does any answer
/// of the terminations.
#[allow(clippy::too_many_arguments)]
pub async fn recover_creation(
    client: &Client,
    sandbox_id: &str,
    marker: &str,
    attempt: u32,
    policy: &CleanupPolicy,
    ctx: &Ctx,
    steps: &mut Steps,
    seen_alive: &mut bool,
) -> std::result::Result<bool, RecoveryFailure> {
    steps.observe(client);
    let listed = AssertUnwindSafe(list_ours(client, sandbox_id, marker, ctx, &mut *steps)).catch_unwind().await;
    let Ok(listed) = listed else {
        steps.push("internal", None, "panic");
        return Err(RecoveryFailure::creation());
    };
    for found in &listed.ours {
        *seen_alive |= found.alive;
        if terminate(client, sandbox_id, &found.process_id, policy, ctx, steps, &mut *seen_alive).await.is_err() {
            return Err(RecoveryFailure {
                reason: CleanupReason::TerminationUnconfirmed,
                process_id: Some(found.process_id.clone()),
            });
        }
    }
    let found_attempt = listed.ours.iter().any(|f| f.attempt == Some(attempt));
    if listed.conclusive || found_attempt {
        Ok(found_attempt)
    } else {
        Err(RecoveryFailure::creation())
    }
}

/// Destroys a sandbox and proves it: `DELETE /sandboxes/{id}`, then its state (`GET`) until
/// it is `destroyed` or unknown (404), within `ctx`. A `destroying` state is polled again; any
/// other state (or a failed DELETE) gets the DELETE again, after a backoff. A refusal that
/// repeating cannot change (401, 403, 400…) ends it at once.
pub async fn destroy_sandbox(client: &Client, sandbox_id: &str, ctx: &Ctx) -> Result<()> {
    let mut steps = Steps::new();
    let path = format!("/sandboxes/{sandbox_id}");
    // `status`: the final answer that ended it, when one did (a 401, a 403…).
    let unconfirmed = |steps: Steps, status: Option<u16>| {
        Error::DestroyUnconfirmed(Box::new(DestroyReport {
            sandbox_id: sandbox_id.to_owned(),
            attempts: steps.attempts,
            status,
        }))
    };
    let final_refusal = |e: &Error| {
        matches!(e, Error::Api { status: 400..=499, .. } | Error::Redirect { .. } | Error::Unmatched { .. })
            && !matches!(e.status(), Some(404 | 408 | 409 | 429))
    };
    let mut need_delete = true;
    for round in 0..MAX_ROUNDS {
        if round > 0 && ctx.sleep(backoff(round)).await.is_err() {
            steps.push("backoff", None, "deadline passed");
            return Err(unconfirmed(steps, None));
        }
        if need_delete {
            let timeout = slice(ctx, Duration::ZERO);
            let op = Operation::SandboxLifecycle;
            match client.json_with(op, Method::DELETE, &path, None, ctx, Retry::Safe, timeout).await {
                Ok(d) => {
                    let state = d.get("status").and_then(Value::as_str).unwrap_or("");
                    steps.push("destroy", None, state_word(state));
                    need_delete = false;
                }
                Err(Error::Api { status: 404, .. }) => {
                    steps.push("destroy", None, "HTTP 404");
                    need_delete = false;
                }
                Err(e) => {
                    steps.push("destroy", None, outcome_of(&e));
                    if final_refusal(&e) {
                        return Err(unconfirmed(steps, e.status()));
                    }
                    if matches!(e, Error::TimedOut) {
                        return Err(unconfirmed(steps, None));
                    }
                    continue;
                }
            }
        }
        let timeout = slice(ctx, Duration::ZERO);
        match client.json_with(Operation::SandboxLifecycle, Method::GET, &path, None, ctx, Retry::Safe, timeout).await {
            Err(Error::Api { status: 404, .. }) => {
                steps.push("state", None, "HTTP 404");
                return Ok(());
            }
            Ok(d) => {
                let state = d.get("status").and_then(Value::as_str).unwrap_or("");
                steps.push("state", None, state_word(state));
                match state {
                    "destroyed" => return Ok(()),
                    "destroying" => {}
                    _ => need_delete = true,
                }
            }
            Err(e) => {
                steps.push("state", None, outcome_of(&e));
                if final_refusal(&e) {
                    return Err(unconfirmed(steps, e.status()));
                }
                if matches!(e, Error::TimedOut) {
                    return Err(unconfirmed(steps, None));
                }
            }
        }
    }
    Err(unconfirmed(steps, None))
}

/// A sandbox state for the attempt log: one of the documented words, never provider text.
fn state_word(state: &str) -> &'static str {
    match state {
        "creating" => "creating",
        "running" => "running",
        "pausing" => "pausing",
        "paused" => "paused",
        "resuming" => "resuming",
        "forking" => "forking",
        "error" => "error",
        "destroying" => "destroying",
        "destroyed" => "destroyed",
        "failed" => "failed",
        _ => "other state",
    }
}

fn carries(process: &Value, marker: &str) -> bool {
    let in_args = process
        .get("args")
        .and_then(Value::as_array)
        .is_some_and(|args| args.iter().any(|a| a.as_str().is_some_and(|s| s.contains(marker))));
    in_args || process.get("cmd").and_then(Value::as_str).is_some_and(|s| s.contains(marker))
}

/// The attempt whose script a list entry runs (see `script::attempt_prefix`).
fn attempt_of(process: &Value) -> Option<u32> {
    let args = process.get("args")?.as_array()?;
    args.iter().filter_map(Value::as_str).find_map(|a| {
        let rest = a.strip_prefix("__cos_attempt=")?;
        let (n, _) = rest.split_once('\n')?;
        n.parse().ok()
    })
}

/// The most removing staged files may take.
pub const REMOVE_STAGED_DEADLINE: Duration = Duration::from_secs(10);

/// Removes staged files the script could not remove itself (it was killed at its gate
/// without the SIGTERM that makes it remove them, or its end is unknown: see
/// `script::staged_files_remain`): one buffered `/exec` of `rm -f`, the files API having no
/// delete. It runs after the verdict, only once nothing of the call runs, under its own short
/// deadline, taking its request slot as new work does (it never goes ahead of another call's
/// cleanup). Housekeeping, not proof: the outcome is a `remove` step on the cleanup
/// diagnostics channel (`removed`, or what failed), and nothing waits for it.
pub async fn remove_staged(client: &Client, sandbox_id: &str, paths: &[String], deadline: Duration) {
    let mut steps = Steps::new();
    steps.observe(client);
    let ctx = Ctx::with_deadline(crate::abort::Abort::new(), Instant::now() + deadline.min(REMOVE_STAGED_DEADLINE));
    let mut args = vec![Value::from("-f"), Value::from("--")];
    args.extend(paths.iter().map(|p| Value::from(p.as_str())));
    let body = serde_json::json!({ "cmd": "/bin/rm", "args": args });
    let path = format!("/sandboxes/{sandbox_id}/exec");
    let timeout = slice(&ctx, Duration::ZERO);
    let op = Operation::WorkspaceCommand;
    match client.json_with(op, Method::POST, &path, Some(body), &ctx, Retry::Safe, timeout).await {
        Ok(d) if d.get("result").and_then(|r| r.get("exit_code")).and_then(Value::as_i64) == Some(0) => {
            steps.push("remove", None, "removed");
        }
        Ok(_) => steps.push("remove", None, "failed"),
        Err(e) => steps.push("remove", None, outcome_of(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        for round in 1..40 {
            let d = backoff(round).as_millis() as u64;
            let ceiling = (BACKOFF_BASE_MS << (round - 1).min(20)).min(BACKOFF_CAP_MS);
            assert!(d >= ceiling / 2 && d <= ceiling, "round {round}: {d} ms");
        }
        assert!(backoff(u32::MAX) <= Duration::from_millis(BACKOFF_CAP_MS));
    }

    fn shape(count: usize, total: Option<usize>) -> PageShape {
        PageShape { count, total, limit: 500 }
    }

    #[test]
    fn a_list_is_complete_only_when_its_pages_agree() {
        let ids = |v: &[&'static str]| v.iter().map(|s| Some(*s)).collect::<Vec<_>>();
        // With a total: complete when reached.
        let mut c = ListCheck::default();
        assert_eq!(c.page(ids(&["a", "b", "c"]), shape(3, Some(4))), ListStep::Next(3));
        assert_eq!(c.page(ids(&["d"]), shape(1, Some(4))), ListStep::Complete);
        // A repeated page with a total, or a full one without, is inconclusive (offset
        // ignored, and the server may have cut at our limit).
        let mut c = ListCheck::default();
        assert_eq!(c.page(ids(&["a", "b", "c"]), shape(3, Some(6))), ListStep::Next(3));
        assert_eq!(c.page(ids(&["a", "b", "c"]), shape(3, Some(6))), ListStep::Inconclusive);
        let full = |count| PageShape { count, total: None, limit: 3 };
        let mut c = ListCheck::default();
        assert_eq!(c.page(ids(&["a", "b", "c"]), full(3)), ListStep::Next(3));
        assert_eq!(c.page(ids(&["a", "b", "c"]), full(3)), ListStep::Inconclusive);
        // Without a total, a short page repeated exactly is a server that ignores offset: the
        // whole list. Repeated in another order, or with an entry more, it proves nothing.
        let mut c = ListCheck::default();
        assert_eq!(c.page(ids(&["a", "b", "c"]), shape(3, None)), ListStep::Next(3));
        assert_eq!(c.page(ids(&["a", "b", "c"]), shape(3, None)), ListStep::Complete);
        let mut c = ListCheck::default();
        assert_eq!(c.page(ids(&["a", "b"]), shape(2, None)), ListStep::Next(2));
        assert_eq!(c.page(ids(&["b", "a"]), shape(2, None)), ListStep::Inconclusive);
        let mut c = ListCheck::default();
        assert_eq!(c.page(ids(&["a", "b"]), shape(2, None)), ListStep::Next(2));
        assert_eq!(c.page(ids(&["a", "b", "x"]), shape(3, None)), ListStep::Inconclusive);
        // A page longer than asked: a server that ignores paging gave all of it.
        let mut c = ListCheck::default();
        assert_eq!(c.page(ids(&["a", "b", "c", "d"]), full(4)), ListStep::Complete);
        // A total that changes between pages: read again.
        let mut c = ListCheck::default();
        assert_eq!(c.page(ids(&["a", "b"]), shape(2, Some(4))), ListStep::Next(2));
        assert_eq!(c.page(ids(&["d"]), shape(1, Some(3))), ListStep::Restart);
        // A total never reached (an empty page before it) or passed is inconclusive.
        let mut c = ListCheck::default();
        assert_eq!(c.page(ids(&["a"]), shape(1, Some(3))), ListStep::Next(1));
        assert_eq!(c.page(ids(&[]), shape(0, Some(3))), ListStep::Inconclusive);
        let mut c = ListCheck::default();
        assert_eq!(c.page(ids(&["a", "b"]), shape(2, Some(1))), ListStep::Inconclusive);
        // Without a total, a short page is confirmed by an empty one; a capped server's next
        // page is read rather than taken as the end.
        let mut c = ListCheck::default();
        assert_eq!(c.page(ids(&["a", "b"]), shape(2, None)), ListStep::Next(2));
        assert_eq!(c.page(ids(&["c", "d"]), shape(2, None)), ListStep::Next(4));
        assert_eq!(c.page(ids(&[]), shape(0, None)), ListStep::Complete);
        // An empty list.
        assert_eq!(ListCheck::default().page(ids(&[]), shape(0, Some(0))), ListStep::Complete);
        assert_eq!(ListCheck::default().page(ids(&[]), shape(0, None)), ListStep::Complete);
    }

    #[test]
    fn entries_of_ours_with_invalid_ids_are_an_error_not_dropped() {
        let m = "/tmp/createos-start-abc";
        let page = vec![
            json!({ "process_id": "p1", "args": ["-lc", format!("wait {m}")] }),
            json!({ "process_id": "other", "args": ["-lc", "x"] }),
            json!({ "process_id": "bad/id", "args": ["y"] }),
            json!("not even an object"),
        ];
        assert_eq!(
            ours_in_page(&page, m),
            Some(vec![Found { process_id: "p1".to_owned(), alive: false, attempt: None }])
        );
        for bad in [
            json!({ "process_id": "bad/id", "args": [m] }),
            json!({ "args": [m] }),
            json!({ "process_id": 7, "cmd": m }),
        ] {
            assert_eq!(ours_in_page(&[page[0].clone(), bad.clone()], m), None, "{bad}");
        }
    }
}
