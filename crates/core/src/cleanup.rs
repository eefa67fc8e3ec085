//! Terminating a process tree and proving it, and recovering an ambiguous creation.
//!
//! Everything here runs under its own deadline (a fresh [`Ctx`]), never the caller's signal.
//! Proof of termination is `tree_exited: true` from DELETE or from `wait?scope=tree`, or a 404
//! (the process is unknown: gone). Anything else — `tree_exited: false`, 5xx, 429, no
//! answer — proves nothing, so the tree is asked again (confirmation polls, then DELETE with
//! the next, longer grace) until the deadline. Only then is containment reported unproven.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::abort::Ctx;
use crate::client::{Client, Retry};
use crate::error::{Attempt, CleanupReason, CleanupReport, Error, Operation, Result};

#[derive(Debug, Clone)]
pub struct CleanupPolicy {
    /// Grace periods of successive DELETEs; the last one repeats until the deadline.
    pub graces_ms: Vec<u64>,
    /// The whole cleanup's deadline (default: `client.config.timeoutMs`).
    pub deadline: Duration,
    /// Long-poll budget of one confirmation `wait?scope=tree`.
    pub confirm_ms: u64,
    /// The TypeScript module's behaviour: one DELETE with a 1 s grace, no confirmation, no
    /// creation recovery.
    pub legacy: bool,
}

impl Default for CleanupPolicy {
    fn default() -> Self {
        CleanupPolicy {
            graces_ms: vec![1000, 5000],
            deadline: Duration::from_secs(300),
            confirm_ms: 1000,
            legacy: false,
        }
    }
}

/// Upper bound on DELETE rounds, whatever the deadline.
const MAX_ROUNDS: usize = 16;

/// Records cleanup steps with their time since the cleanup started.
pub struct Steps {
    started: Instant,
    pub attempts: Vec<Attempt>,
}

impl Steps {
    pub fn new() -> Self {
        Steps { started: Instant::now(), attempts: Vec::new() }
    }

    fn push(&mut self, step: &'static str, grace_ms: Option<u64>, outcome: impl Into<String>) {
        let at_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        self.attempts.push(Attempt { step, grace_ms, outcome: outcome.into(), at_ms: (at_ms * 10.0).round() / 10.0 });
    }

    pub fn report(self, reason: CleanupReason, sandbox_id: &str, process_id: Option<&str>) -> Error {
        Error::Cleanup(Box::new(CleanupReport {
            reason,
            sandbox_id: sandbox_id.to_owned(),
            process_id: process_id.map(str::to_owned),
            attempts: self.attempts,
        }))
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
        Error::TimedOut => "deadline passed".into(),
        Error::Protocol(_) => "invalid answer".into(),
        _ => "failed".into(),
    }
}

fn tree_exited(data: &Map<String, Value>) -> bool {
    data.get("tree_exited") == Some(&Value::Bool(true))
}

/// Terminates the tree of `process_id` and proves it, within `ctx` (a cleanup context:
/// its own deadline, never the caller's abort). `Ok(())` = proven gone.
pub async fn terminate(
    client: &Client,
    sandbox_id: &str,
    process_id: &str,
    policy: &CleanupPolicy,
    ctx: &Ctx,
    steps: &mut Steps,
) -> std::result::Result<(), ()> {
    let base = format!("/sandboxes/{sandbox_id}/processes/{process_id}");
    if policy.legacy {
        let grace = 1000;
        return match delete(client, &base, grace, ctx).await {
            Ok(d) if tree_exited(&d) => {
                steps.push("delete", Some(grace), "tree exited");
                Ok(())
            }
            Ok(_) => {
                steps.push("delete", Some(grace), "tree_exited false");
                Err(())
            }
            Err(Error::Api { status: 404, .. }) => {
                steps.push("delete", Some(grace), "HTTP 404");
                Ok(())
            }
            Err(e) => {
                steps.push("delete", Some(grace), outcome_of(&e));
                Err(())
            }
        };
    }
    let graces = if policy.graces_ms.is_empty() { vec![1000] } else { policy.graces_ms.clone() };
    for round in 0..MAX_ROUNDS {
        let grace = graces[round.min(graces.len() - 1)];
        match delete(client, &base, grace, ctx).await {
            Ok(d) if tree_exited(&d) => {
                steps.push("delete", Some(grace), "tree exited");
                return Ok(());
            }
            Ok(_) => steps.push("delete", Some(grace), "tree_exited false"),
            Err(Error::Api { status: 404, .. }) => {
                steps.push("delete", Some(grace), "HTTP 404");
                return Ok(());
            }
            Err(e @ Error::TimedOut) => {
                steps.push("delete", Some(grace), outcome_of(&e));
                return Err(());
            }
            Err(e @ (Error::Api { status: 400..=499, .. } | Error::Redirect { .. }))
                if !matches!(e.status(), Some(408 | 409 | 429)) =>
            {
                // A refusal that repeating cannot change (auth, validation).
                steps.push("delete", Some(grace), outcome_of(&e));
                return Err(());
            }
            Err(e) => steps.push("delete", Some(grace), outcome_of(&e)),
        }
        match confirm(client, &base, policy.confirm_ms, ctx).await {
            Ok(true) => {
                steps.push("wait", None, "tree exited");
                return Ok(());
            }
            Ok(false) => steps.push("wait", None, "still running"),
            Err(Error::Api { status: 404, .. }) => {
                steps.push("wait", None, "HTTP 404");
                return Ok(());
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

async fn delete(client: &Client, base: &str, grace_ms: u64, ctx: &Ctx) -> Result<Map<String, Value>> {
    let timeout = ctx.remaining().unwrap_or(Duration::from_secs(60));
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

/// One `wait?scope=tree` long-poll: `Ok(true)` when the tree exited, `Ok(false)` on 408.
async fn confirm(client: &Client, base: &str, confirm_ms: u64, ctx: &Ctx) -> Result<bool> {
    let budget = ctx.remaining().map_or(confirm_ms, |r| confirm_ms.min(r.as_millis() as u64));
    let timeout = Duration::from_millis(budget) + Duration::from_secs(5);
    let path = format!("{base}/wait?scope=tree&timeout_ms={budget}");
    match client.json_with(Operation::ProcessStatus, Method::GET, &path, None, ctx, Retry::RateLimitOnly, timeout).await
    {
        Ok(d) => Ok(tree_exited(&d)),
        Err(Error::Api { status: 408, .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// After `POST /processes` failed ambiguously: finds the process(es) whose arguments carry
/// `marker` (the unique start-gate path), terminates and confirms them.
/// `Ok(found)` = proven: nothing of ours runs (found says whether one had been created).
pub async fn recover_creation(
    client: &Client,
    sandbox_id: &str,
    marker: &str,
    policy: &CleanupPolicy,
    ctx: &Ctx,
    steps: &mut Steps,
) -> std::result::Result<bool, ()> {
    let list = client
        .json(Operation::ProcessStatus, Method::GET, &format!("/sandboxes/{sandbox_id}/processes"), None, ctx)
        .await;
    let data = match list {
        Ok(d) => d,
        Err(e) => {
            steps.push("list", None, outcome_of(&e));
            return Err(());
        }
    };
    let Some(Value::Array(processes)) = data.get("processes") else {
        steps.push("list", None, "invalid answer");
        return Err(());
    };
    let ours: Vec<String> = processes
        .iter()
        .filter(|p| carries(p, marker))
        .filter_map(|p| p.get("process_id").and_then(Value::as_str))
        .filter(|id| crate::client::is_identifier(id))
        .map(str::to_owned)
        .collect();
    steps.push("list", None, format!("found {}", ours.len()));
    for id in &ours {
        terminate(client, sandbox_id, id, policy, ctx, steps).await?;
    }
    Ok(!ours.is_empty())
}

fn carries(process: &Value, marker: &str) -> bool {
    let in_args = process
        .get("args")
        .and_then(Value::as_array)
        .is_some_and(|args| args.iter().any(|a| a.as_str().is_some_and(|s| s.contains(marker))));
    in_args || process.get("cmd").and_then(Value::as_str).is_some_and(|s| s.contains(marker))
}

/// The most a staged-file removal may add to a cleanup.
pub const REMOVE_FILES_DEADLINE: Duration = Duration::from_secs(10);

/// Removes staged files with a one-shot `/exec rm -f` (there is no file delete endpoint).
/// Best effort: failures are ignored, as the files hold only the command's own stdin. Runs
/// under its own short deadline, so a cleanup that used its whole deadline still tries.
pub async fn remove_files(client: &Client, sandbox_id: &str, paths: &[&str], deadline: Duration) {
    if paths.is_empty() {
        return;
    }
    let ctx = Ctx::cleanup(deadline.min(REMOVE_FILES_DEADLINE));
    let mut args = vec![Value::from("-f"), Value::from("--")];
    args.extend(paths.iter().map(|p| Value::from(*p)));
    let body = serde_json::json!({ "cmd": "/bin/rm", "args": args });
    let _ = client
        .json(Operation::WorkspaceCommand, Method::POST, &format!("/sandboxes/{sandbox_id}/exec"), Some(body), &ctx)
        .await;
}
