//! Processes that try to leave their tree: a cleared environment (`env -i`), a new session
//! (`setsid`) and a double fork, in a managed process and in an exec. The emulator must see each
//! one alive (`tree_exited: false`, a tree wait that times out) and must kill it on DELETE (of
//! the process or of the sandbox) and on close. Whether a process lives is read from /proc
//! here, by its command line, not from the emulator.

use std::time::{Duration, Instant};

use createos_test_support::{emulator, with_emulator, Emulator, EmulatorOptions};
use createos_test_support::{sleepers, unique_sleep};
use serde_json::{json, Value};

struct Ctx {
    emu: Emulator,
    http: reqwest::Client,
}

impl Ctx {
    fn url(&self, path: &str) -> String {
        format!("{}/v1{}", self.emu.url(), path)
    }
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut r = self.http.request(method, self.url(path)).header("X-Api-Key", self.emu.api_key());
        if let Some(b) = body {
            r = r.header("content-type", "application/json").body(b.to_string());
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        let bytes = r.bytes().await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
    async fn sandbox(&self) -> String {
        let (s, v) = self.call(reqwest::Method::POST, "/sandboxes", Some(json!({}))).await;
        assert_eq!(s, 201);
        v["data"]["id"].as_str().unwrap().to_string()
    }
    async fn spawn_bash(&self, sb: &str, script: &str) -> String {
        let body = json!({"cmd": "bash", "args": ["-c", script]});
        let (s, v) = self.call(reqwest::Method::POST, &format!("/sandboxes/{sb}/processes"), Some(body)).await;
        assert_eq!(s, 201, "{v}");
        v["data"]["process_id"].as_str().unwrap().to_string()
    }
    async fn wait(&self, sb: &str, id: &str, scope: &str, ms: u64) -> (u16, Value) {
        self.call(
            reqwest::Method::GET,
            &format!("/sandboxes/{sb}/processes/{id}/wait?scope={scope}&timeout_ms={ms}"),
            None,
        )
        .await
    }
    async fn get(&self, sb: &str, id: &str) -> Value {
        self.call(reqwest::Method::GET, &format!("/sandboxes/{sb}/processes/{id}"), None).await.1
    }
    async fn delete(&self, sb: &str, id: &str) -> Value {
        let (s, v) =
            self.call(reqwest::Method::DELETE, &format!("/sandboxes/{sb}/processes/{id}?grace_ms=200"), None).await;
        assert_eq!(s, 200, "{v}");
        v
    }
}

/// Whole trees: these tests prove a process DELETE ends what left the process group
/// (`TerminationScope::Tree`), whatever profile `CREATEOS_EMULATOR_PROFILE` names
/// (tests/termination.rs covers `group`).
fn opts() -> EmulatorOptions {
    EmulatorOptions {
        termination_scope: Some(createos_test_support::TerminationScope::Tree),
        ..createos_test_support::unlimited()
    }
}

async fn with_emu<F, Fut>(f: F)
where
    F: FnOnce(Ctx) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    with_emulator(opts(), |emu| f(Ctx { emu, http: reqwest::Client::new() })).await;
}

async fn until_sleepers(arg: &str, n: usize) -> Vec<i32> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let found = sleepers(arg);
        if found.len() >= n {
            return found;
        }
        assert!(Instant::now() < end, "only {} of {n} `sleep {arg}` started", found.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ends what a failing run left behind (the test's own processes, by pid).
fn kill_leftovers(arg: &str) {
    for pid in sleepers(arg) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
}

/// The managed-process cases: each script starts one `sleep <arg>` that tries to leave and
/// then lets its leader exit.
async fn escape_is_seen_then_killed(c: &Ctx, what: &str, script: impl Fn(&str) -> String) {
    let arg = unique_sleep(301);
    let sb = c.sandbox().await;
    let id = c.spawn_bash(&sb, &script(&arg)).await;
    let (s, w) = c.wait(&sb, &id, "leader", 5000).await;
    assert_eq!((s, &w["data"]["exit_code"]), (200, &json!(0)), "{what}: {w}");
    let pids = until_sleepers(&arg, 1).await;
    // Seen alive: the tree wait times out and the record says the tree lives.
    let (s, _) = c.wait(&sb, &id, "tree", 400).await;
    let v = c.get(&sb, &id).await;
    if s != 408 || v["data"]["tree_exited"] != false {
        kill_leftovers(&arg);
        panic!("{what}: the emulator lost `sleep {arg}` (pid {pids:?}): tree wait {s}, {v}");
    }
    assert!(c.emu.live_pids().contains(&pids[0]), "{what}: live_pids misses {}", pids[0]);
    // Killed by DELETE, and gone by /proc's account.
    let v = c.delete(&sb, &id).await;
    let left = sleepers(&arg);
    kill_leftovers(&arg);
    assert_eq!(v["data"]["tree_exited"], true, "{what}: {v}");
    assert_eq!(left, Vec::<i32>::new(), "{what}: alive after DELETE answered tree_exited true");
    assert!(c.emu.live_pids().is_empty(), "{what}: {:?}", c.emu.live_pids());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_i_setsid_escape_is_seen_and_killed() {
    with_emu(|c| async move {
        escape_is_seen_then_killed(&c, "env -i setsid", |arg| {
            format!("env -i setsid sleep {arg} </dev/null >/dev/null 2>&1 & echo started")
        })
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_fork_escape_is_seen_and_killed() {
    with_emu(|c| async move {
        // A new session whose shell forks the sleeper and exits at once: the sleeper is an
        // orphan (re-parented), in no group of ours, without the marker.
        escape_is_seen_then_killed(&c, "double fork", |arg| {
            format!("env -i setsid sh -c '(sleep {arg} &); exit 0' </dev/null >/dev/null 2>&1 & wait; echo started")
        })
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_escape_is_killed_with_its_sandbox_and_on_close() {
    let emu = emulator::start(opts()).await.unwrap();
    let c = Ctx { emu: emu.clone(), http: reqwest::Client::new() };
    let (a, b) = (unique_sleep(302), unique_sleep(303));
    let run = |sb: String, arg: String| {
        let c = &c;
        async move {
            let script = format!("env -i setsid sleep {arg} </dev/null >/dev/null 2>&1 & echo started");
            let (s, v) = c
                .call(
                    reqwest::Method::POST,
                    &format!("/sandboxes/{sb}/exec"),
                    Some(json!({"cmd":"bash","args":["-c",script]})),
                )
                .await;
            assert_eq!((s, v["data"]["stdout"].as_str()), (200, Some("started\n")), "{v}");
        }
    };
    let sb1 = c.sandbox().await;
    let sb2 = c.sandbox().await;
    run(sb1.clone(), a.clone()).await;
    run(sb2, b.clone()).await;
    let pa = until_sleepers(&a, 1).await;
    let pb = until_sleepers(&b, 1).await;
    let live = emu.live_pids();
    let seen = live.contains(&pa[0]) && live.contains(&pb[0]);
    // Deleting the first sandbox ends its escaped sleeper; close ends the other.
    let (s, _) = c.call(reqwest::Method::DELETE, &format!("/sandboxes/{sb1}"), None).await;
    let after_delete = sleepers(&a);
    emu.close().await;
    let after_close = sleepers(&b);
    kill_leftovers(&a);
    kill_leftovers(&b);
    assert!(seen, "live_pids {live:?} misses {pa:?} or {pb:?}");
    assert_eq!(s, 200);
    assert_eq!(after_delete, Vec::<i32>::new(), "alive after the sandbox was deleted");
    assert_eq!(after_close, Vec::<i32>::new(), "alive after close()");
}
