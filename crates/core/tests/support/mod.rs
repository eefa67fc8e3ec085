//! Helpers the core's integration tests share (`mod support;` in each test file): a config and
//! params for an emulator, fault rules from JSON, request-log counts, a run that times out.
#![allow(dead_code)] // each test file uses its own subset

use std::time::Duration;

use createos_execute_core::abort::{Abort, Ctx};
use createos_execute_core::config::{parse_config, parse_params, Config, Params};
use createos_execute_core::error::{Error, Operation};
use createos_execute_core::execute::{execute, ExecuteResult};
use createos_test_support::{unlimited, Emulator, EmulatorOptions, FaultRule, Profile};
use reqwest::Method;
use serde_json::json;

/// A config for `emu`: its URL and key, an 8 s request deadline, no pacing, plus `extra`.
pub fn cfg(emu: &Emulator, extra: serde_json::Value) -> Config {
    let mut c = json!({ "apiUrl": emu.url(), "apiKey": emu.api_key(), "timeoutMs": 8000, "pacing": "off" });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    parse_config(&c).unwrap()
}

/// `/bin/bash -c script` in sandbox `sb`.
pub fn params(sb: &str, script: &str) -> Params {
    parse_params(&json!({ "sandboxId": sb, "command": "/bin/bash", "args": ["-c", script] })).unwrap()
}

/// Adds a fault rule given as JSON (the emulator's `addFault` shape).
pub fn fault(emu: &Emulator, rule: serde_json::Value) {
    emu.add_fault(FaultRule::from_json(&rule.to_string()).unwrap());
}

/// How many requests of `route` the emulator saw.
pub fn count(emu: &Emulator, route: &str) -> usize {
    emu.requests().iter().filter(|r| r.route == route).count()
}

/// Runs `script` and aborts it as a timeout after `after`.
pub async fn timed_out_run(c: &Config, sb: &str, script: &str, after: Duration) -> Result<ExecuteResult, Error> {
    let abort = Abort::new();
    let a = abort.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        a.abort(true);
    });
    execute(c, &params(sb, script), abort, None).await
}

/// Starts `cmd args` as a managed process the way a host would (no gate); returns its id.
pub async fn start_process(c: &Config, sb: &str, cmd: &str, args: serde_json::Value) -> String {
    let client = c.client().unwrap();
    let ctx = Ctx::cleanup(Duration::from_secs(5));
    let body = json!({ "cmd": cmd, "args": args });
    let d = client
        .json(Operation::ProcessCreation, Method::POST, &format!("/sandboxes/{sb}/processes"), Some(body), &ctx)
        .await
        .unwrap();
    d["process_id"].as_str().unwrap().to_owned()
}

/// An emulator of the full profile, for a test whose faults shape what only it serves (a paged
/// process list: `pageSize`, `ignoreOffset`).
pub fn full() -> EmulatorOptions {
    EmulatorOptions { profile: Some(Profile::Full), ..unlimited() }
}

/// A request log (`METHOD route …` lines) as the full profile gives it: under the documented
/// profile the unpaged process list is read twice (a short page, then the same page again at
/// the next offset, which ends it), and the second read is folded into the first here.
pub fn as_full(emu: &Emulator, log: Vec<String>) -> Vec<String> {
    if emu.profile() != Profile::Documented {
        return log;
    }
    let mut out: Vec<String> = Vec::with_capacity(log.len());
    for line in log {
        let list = |l: &str| l.starts_with("GET listProcesses");
        if list(&line) && out.last().is_some_and(|prev| list(prev)) {
            continue;
        }
        out.push(line);
    }
    out
}
