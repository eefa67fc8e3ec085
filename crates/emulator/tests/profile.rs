//! The documented profile and the creation/record faults, over real HTTP on 127.0.0.1. Every
//! test closes its emulator (also on panic), which SIGKILLs every process the test started.

use std::future::Future;
use std::time::{Duration, Instant};

use createos_emulator::Profile;
use createos_test_support::{unlimited, EmulatorOptions, FaultRule};
use serde_json::{json, Value};

mod support;

use support::{with_emu, Ctx};

impl Ctx {
    async fn list(&self, sb: &str, query: &str) -> Value {
        let (s, v) = self.json(self.get(&format!("/sandboxes/{sb}/processes{query}"))).await;
        assert_eq!(s, 200, "{v}");
        v["data"].clone()
    }
    async fn count(&self, sb: &str) -> usize {
        self.list(sb, "").await["processes"].as_array().unwrap().len()
    }
    /// The whole connect stream of a process (it has exited), as JSON lines.
    async fn stream(&self, sb: &str, id: &str) -> Vec<Value> {
        let r = self.get(&format!("/sandboxes/{sb}/processes/{id}/connect")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let b = r.bytes().await.unwrap();
        b.split(|c| *c == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).unwrap()).collect()
    }
    async fn wait_tree(&self, sb: &str, id: &str) {
        let (s, v) =
            self.json(self.get(&format!("/sandboxes/{sb}/processes/{id}/wait?scope=tree&timeout_ms=20000"))).await;
        assert_eq!(s, 200, "{v}");
    }
}

fn profile(p: Profile) -> EmulatorOptions {
    EmulatorOptions { profile: Some(p), ..unlimited() }
}

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

async fn until<F: Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    let end = Instant::now() + Duration::from_secs(20);
    while !cond().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn rule(s: &str) -> FaultRule {
    FaultRule::from_json(s).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_profile_serves_the_documented_minimum() {
    with_emu(profile(Profile::Documented), |c| async move {
        assert_eq!(c.emu.profile(), Profile::Documented);
        let sb = c.sandbox().await;
        let mut ids = Vec::new();
        for _ in 0..3 {
            let p = c.spawn(&sb, "sh", &["-c", "echo hi"]).await;
            ids.push(p["process_id"].as_str().unwrap().to_string());
            c.wait_tree(&sb, ids.last().unwrap()).await;
        }
        // The list: every process, whatever limit and offset say, and nothing else.
        for query in ["", "?limit=1", "?limit=1&offset=1", "?limit=2&offset=2", "?offset=3", "?limit=500&offset=0"] {
            let data = c.list(&sb, query).await;
            assert_eq!(keys(&data), ["processes"], "{query}: {data}");
            let got: Vec<&str> =
                data["processes"].as_array().unwrap().iter().map(|p| p["process_id"].as_str().unwrap()).collect();
            assert_eq!(got, ids, "{query}: the same whole list, oldest first");
        }
        // Exit frames: exit_code, and signal only when signalled.
        let frames = c.stream(&sb, &ids[0]).await;
        let exit = frames.last().unwrap();
        assert_eq!(keys(exit), ["exit_code", "type"], "{exit}");
        assert_eq!(exit["exit_code"], 0);
        let killed = c.spawn(&sb, "sh", &["-c", "kill -9 $$"]).await;
        let kid = killed["process_id"].as_str().unwrap();
        c.wait_tree(&sb, kid).await;
        let exit = c.stream(&sb, kid).await.pop().unwrap();
        assert_eq!(keys(&exit), ["exit_code", "signal", "type"], "{exit}");
        assert_eq!(exit["signal"], "SIGKILL");
        // Buffered exec: data.result and data.exec_ms only.
        let (s, v) = c.json(c.post(&format!("/sandboxes/{sb}/exec"), json!({"cmd":"echo","args":["x"]}))).await;
        assert_eq!(s, 200);
        assert_eq!(keys(&v["data"]), ["exec_ms", "result"], "{v}");
        assert_eq!(v["data"]["result"]["stdout"], "x\n");
        // Upload: no undocumented data.
        let r = c
            .http
            .put(c.url(&format!("/sandboxes/{sb}/files?path=/workspace/f")))
            .header("X-Api-Key", c.emu.api_key())
            .body("abc")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        assert_eq!(v, json!({"status":"success","data":{}}));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_full_profile_keeps_its_extras() {
    with_emu(profile(Profile::Full), |c| async move {
        assert_eq!(c.emu.profile(), Profile::Full);
        let sb = c.sandbox().await;
        let mut ids = Vec::new();
        for _ in 0..2 {
            let p = c.spawn(&sb, "true", &[]).await;
            ids.push(p["process_id"].as_str().unwrap().to_string());
            c.wait_tree(&sb, ids.last().unwrap()).await;
        }
        let data = c.list(&sb, "?limit=1&offset=1").await;
        assert_eq!(data["processes"].as_array().unwrap().len(), 1);
        assert_eq!(data["pagination"]["total"], 2);
        let exit = c.stream(&sb, &ids[0]).await.pop().unwrap();
        assert_eq!(keys(&exit), ["exit_code", "newest_seq", "signal", "tree_exited", "type"], "{exit}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_cut_before_it_is_applied_creates_nothing() {
    with_emu(profile(Profile::Documented), |c| async move {
        let sb = c.sandbox().await;
        c.emu.add_fault(rule(r#"{"route":"createProcess","times":1,"action":{"kind":"dropConnection"}}"#));
        let r = c.post(&format!("/sandboxes/{sb}/processes"), json!({"cmd":"sleep","args":["30"]})).send().await;
        assert!(r.is_err(), "{r:?}");
        // The handler never ran: nothing to wait for.
        assert_eq!(c.count(&sb).await, 0);
        assert!(c.emu.live_pids().is_empty());
        let rec = c.emu.requests().into_iter().find(|r| r.route == "createProcess").unwrap();
        assert_eq!((rec.status, rec.applied_ms), (0, None));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_applied_after_the_next_list() {
    with_emu(profile(Profile::Documented), |c| async move {
        let sb = c.sandbox().await;
        let other = c.sandbox().await;
        c.emu.add_fault(rule(r#"{"route":"createProcess","times":1,"action":{"kind":"applyLate","afterList":true}}"#));
        let r = c.post(&format!("/sandboxes/{sb}/processes"), json!({"cmd":"sleep","args":["30"]})).send().await;
        assert!(r.is_err(), "the connection is cut: {r:?}");
        // A list of another sandbox does not apply it.
        assert_eq!(c.count(&other).await, 0);
        // The next list of its sandbox is answered without it; then it is applied.
        assert_eq!(c.count(&sb).await, 0, "the list answer was made before the creation was applied");
        until("the late creation", || async { c.count(&sb).await == 1 }).await;
        let log = c.emu.requests();
        let create = log.iter().find(|r| r.route == "createProcess").unwrap();
        let list = log.iter().find(|r| r.route == "listProcesses" && r.path.contains(&sb)).unwrap();
        assert_eq!(create.status, 0, "no answer was sent");
        let applied = create.applied_ms.expect("the record says when it was applied");
        assert!(applied >= list.received_ms.unwrap(), "applied after the list ({applied} vs {list:?})");
        assert_eq!(c.emu.live_pids().len(), 1, "the late process runs");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_held_and_applied_after_ms_even_when_the_client_left() {
    with_emu(profile(Profile::Documented), |c| async move {
        let sb = c.sandbox().await;
        c.emu.add_fault(rule(
            r#"{"route":"createProcess","times":1,"action":{"kind":"applyLate","ms":1500,"hold":true}}"#,
        ));
        let r = c
            .post(&format!("/sandboxes/{sb}/processes"), json!({"cmd":"sleep","args":["30"]}))
            .timeout(Duration::from_millis(300))
            .send()
            .await;
        assert!(r.is_err(), "the client gave up on the held answer: {r:?}");
        assert_eq!(c.count(&sb).await, 0, "not applied yet");
        until("the late creation", || async { c.count(&sb).await == 1 }).await;
        let create = c.emu.requests().into_iter().find(|r| r.route == "createProcess").unwrap();
        let applied = create.applied_ms.unwrap();
        assert!(applied - create.received_ms.unwrap() >= 1500.0, "{create:?}");
        assert_eq!(create.status, 0, "the client had left: nothing was sent");

        // With the client still there, the held answer is the real one, sent at apply time.
        c.emu.add_fault(rule(
            r#"{"route":"createProcess","times":1,"action":{"kind":"applyLate","ms":200,"hold":true}}"#,
        ));
        let (s, v) = c.json(c.post(&format!("/sandboxes/{sb}/processes"), json!({"cmd":"true"}))).await;
        assert_eq!(s, 201, "{v}");
        let id = v["data"]["process_id"].as_str().unwrap();
        let create = c.emu.requests().into_iter().rev().find(|r| r.route == "createProcess").unwrap();
        assert_eq!(create.status, 201);
        assert!(create.applied_ms.unwrap() - create.received_ms.unwrap() >= 200.0);
        assert!(c.list(&sb, "").await["processes"].as_array().unwrap().iter().any(|p| p["process_id"] == id));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_routes_fail_only_after_the_exit_frame() {
    with_emu(profile(Profile::Documented), |c| async move {
        let sb = c.sandbox().await;
        c.emu
            .add_fault(rule(r#"{"route":"getProcess","afterExitFrame":true,"action":{"kind":"status","status":502}}"#));
        c.emu.add_fault(rule(r#"{"route":"wait","afterExitFrame":true,"action":{"kind":"dropConnection"}}"#));
        let p = c.spawn(&sb, "sh", &["-c", "echo out"]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        let path = format!("/sandboxes/{sb}/processes/{id}");
        c.wait_tree(&sb, &id).await; // before the exit frame: answered
        assert_eq!(c.json(c.get(&path)).await.0, 200, "before the exit frame");
        let frames = c.stream(&sb, &id).await;
        assert_eq!(frames.last().unwrap()["type"], "exit");
        assert_eq!(c.json(c.get(&path)).await.0, 502, "after the exit frame");
        let r = c.get(&format!("{path}/wait?scope=tree&timeout_ms=1000")).send().await;
        assert!(r.is_err(), "{r:?}");
    })
    .await;
}
