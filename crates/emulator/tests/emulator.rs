//! Emulator tests over real HTTP on 127.0.0.1. Every test closes its emulator (also on panic),
//! which SIGKILLs every process the test started.

use std::time::{Duration, Instant};

use base64::Engine;
use createos_test_support::{emulator, pid_gone, EmulatorOptions, FaultRule};
use serde_json::{json, Value};

mod support;

use support::{with_emu, Ctx, JsonBody};

impl Ctx {
    async fn wait(&self, sb: &str, pid: &str, scope: &str, ms: u64) -> (u16, Value) {
        let r = self
            .get(&format!("/sandboxes/{sb}/processes/{pid}/wait?scope={scope}&timeout_ms={ms}"))
            .send()
            .await
            .unwrap();
        let s = r.status().as_u16();
        (s, r.j().await.unwrap())
    }
}

/// These tests check the full profile's answers (pagination, exit-frame extras), whatever
/// `CREATEOS_EMULATOR_PROFILE` says.
fn opts() -> EmulatorOptions {
    EmulatorOptions { profile: Some(createos_emulator::Profile::Full), ..EmulatorOptions::default() }
}

/// Parse an NDJSON body into JSON values.
fn lines(body: &[u8]) -> Vec<Value> {
    body.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap_or_else(|_| panic!("bad line {}", String::from_utf8_lossy(l))))
        .collect()
}

fn b64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(v["data_base64"].as_str().unwrap()).unwrap()
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_sandboxes_and_request_log() {
    with_emu(opts(), |c| async move {
        let r = c.http.get(c.url("/whoami")).send().await.unwrap();
        assert_eq!(r.status(), 401);
        assert!(r.headers().get("x-request-id").is_some());
        let v: Value = r.j().await.unwrap();
        assert_eq!(v, json!({"status":"fail","data":{"auth":"invalid api key"}}));
        let r = c.http.get(c.url("/whoami")).header("X-Api-Key", "nope").send().await.unwrap();
        assert_eq!(r.status(), 401);
        let v: Value = c.get("/whoami").send().await.unwrap().j().await.unwrap();
        assert_eq!(v, json!({"status":"success","data":{"user":"emulator"}}));

        let r = c.post("/sandboxes", json!({"shape":"s-1"})).send().await.unwrap();
        assert_eq!(r.status(), 201);
        let v: Value = r.j().await.unwrap();
        let id = v["data"]["id"].as_str().unwrap().to_string();
        assert!(id.starts_with("sb-") && id.len() == 29, "{id}");
        assert_eq!(v["data"]["status"], "running");
        assert_eq!(v["data"]["shape"], "s-1");
        let v: Value = c.get(&format!("/sandboxes/{id}")).send().await.unwrap().j().await.unwrap();
        assert_eq!(v["data"]["id"], id.as_str());
        let p = c.spawn(&id, "sleep", &["30"]).await;
        let pid = p["pid"].as_i64().unwrap() as i32;
        let r = c.delete(&format!("/sandboxes/{id}")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.j().await.unwrap();
        assert_eq!(v["data"], json!({"id": id, "status": "destroyed"}));
        assert!(pid_gone(pid));
        assert_eq!(c.get(&format!("/sandboxes/{id}")).send().await.unwrap().status(), 404);
        assert_eq!(c.get("/nope").send().await.unwrap().status(), 404);

        let log = c.emu.requests();
        let routes: Vec<(&str, u16)> = log.iter().map(|r| (r.route, r.status)).collect();
        assert_eq!(
            routes,
            vec![
                ("whoami", 401),
                ("whoami", 401),
                ("whoami", 200),
                ("createSandbox", 201),
                ("getSandbox", 200),
                ("createProcess", 201),
                ("deleteSandbox", 200),
                ("getSandbox", 404),
                ("unknown", 404)
            ]
        );
        assert!(log.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        c.emu.clear_requests();
        assert!(c.emu.requests().is_empty());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_path_rules() {
    with_emu(opts(), |c| async move {
        let sb = c.sandbox().await;
        let f = format!("/sandboxes/{sb}/files");
        let r = c.put(&format!("{f}?path=/workspace/a.bin")).body(vec![0u8, 1, 2, 255]).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.j().await.unwrap();
        assert_eq!(v["data"], json!({"path":"/workspace/a.bin","bytes":4}));
        let r = c.get(&format!("{f}?path=/workspace/a.bin")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.bytes().await.unwrap().as_ref(), &[0u8, 1, 2, 255]);
        // The host path of the workspace is the same file.
        let out = c
            .post(&format!("/sandboxes/{sb}/exec"), json!({"cmd":"sh","args":["-c","printf %s \"$PWD\"; test \"$HOME\" = \"$PWD\" && test \"$CREATEOS_WORKSPACE\" = \"$PWD\" && echo ok >&2"]}))
            .send()
            .await
            .unwrap()
            .j()
            .await
            .unwrap();
        let ws = out["data"]["stdout"].as_str().unwrap().to_string();
        assert!(ws.ends_with(&format!("{sb}/workspace")), "{ws}");
        assert_eq!(out["data"]["stderr"], "ok\n");
        let r = c.get(&format!("{f}?path={ws}/a.bin")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        for bad in ["relative.txt", "/workspace/../x", "/etc/passwd", "/tmp"] {
            let r = c.put(&format!("{f}?path={bad}")).body("x").send().await.unwrap();
            assert_eq!(r.status(), 400, "{bad}");
            let v: Value = r.j().await.unwrap();
            assert_eq!(v["status"], "fail");
        }
        let r = c.put(&format!("{f}?path=/workspace/missing/dir/x")).body("x").send().await.unwrap();
        assert_eq!(r.status(), 404);
        let r = c.get(&format!("{f}?path=/workspace/nothing")).send().await.unwrap();
        assert_eq!(r.status(), 404);
        let r = c.get("/sandboxes/sb-unknown/files?path=/workspace/a.bin").send().await.unwrap();
        assert_eq!(r.status(), 404);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_buffered_and_stream() {
    with_emu(opts(), |c| async move {
        let sb = c.sandbox().await;
        let v: Value = c
            .post(
                &format!("/sandboxes/{sb}/exec"),
                json!({"cmd":"sh","args":["-c","cat; echo err >&2; echo $FOO; exit 3"],"stdin":"in-","env":{"FOO":"bar"}}),
            )
            .send()
            .await
            .unwrap()
            .j()
            .await
            .unwrap();
        assert_eq!(v["data"]["exit_code"], 3);
        assert_eq!(v["data"]["stdout"], "in-bar\n");
        assert_eq!(v["data"]["stderr"], "err\n");
        assert_eq!(v["data"]["result"]["exit_code"], 3);

        let r = c
            .post(
                &format!("/sandboxes/{sb}/exec?stream=true"),
                json!({"cmd":"sh","args":["-c","echo a; sleep 0.1; echo b >&2; exit 2"]}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["content-type"], "application/x-ndjson");
        let ls = lines(&r.bytes().await.unwrap());
        assert_eq!(ls, vec![json!({"stdout":"a\n"}), json!({"stderr":"b\n"}), json!({"exit_code":2})]);

        // Disconnecting from a streaming exec kills its tree.
        let mut r = c
            .post(
                &format!("/sandboxes/{sb}/exec"),
                json!({"cmd":"sh","args":["-c","sleep 30 & echo started; sleep 30"],"stream":true}),
            )
            .send()
            .await
            .unwrap();
        let first = r.chunk().await.unwrap().unwrap();
        assert!(String::from_utf8_lossy(&first).contains("started"));
        assert!(!c.emu.live_pids().is_empty());
        // An `/exec` command is no managed process.
        assert_eq!(c.emu.live_process_pids(), Vec::<i32>::new());
        drop(r);
        let emu = c.emu.clone();
        eventually("exec tree killed", move || emu.live_pids().is_empty()).await;
        let routes: Vec<&str> = c.emu.requests().iter().map(|r| r.route).collect();
        assert_eq!(&routes[1..], &["exec", "execStream", "execStream"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_connect_replay_and_stdin() {
    with_emu(opts(), |c| async move {
        let sb = c.sandbox().await;
        let p = c.spawn(&sb, "sh", &["-c", "printf abc; sleep 0.1; printf def >&2; exit 4"]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        assert!(id.starts_with("proc_"));
        assert_eq!(p["kind"], "process");
        assert_eq!(p["state"], "running");
        let body = c
            .get(&format!("/sandboxes/{sb}/processes/{id}/connect?after=0"))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let ls = lines(&body);
        let data: Vec<&Value> = ls.iter().filter(|l| l["type"] == "data").collect();
        assert_eq!(data.len(), 2, "{ls:?}");
        assert_eq!((data[0]["seq"].as_u64(), data[0]["stream"].as_str()), (Some(1), Some("stdout")));
        assert_eq!((data[1]["seq"].as_u64(), data[1]["stream"].as_str()), (Some(2), Some("stderr")));
        assert_eq!(b64(data[0]), b"abc");
        assert_eq!(b64(data[1]), b"def");
        let exit = ls.last().unwrap();
        assert_eq!(exit["type"], "exit");
        assert_eq!(exit["exit_code"], 4);
        assert_eq!(exit["signal"], Value::Null);

        // Replay after=1.
        let body = c
            .get(&format!("/sandboxes/{sb}/processes/{id}/connect?after=1"))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let ls = lines(&body);
        assert_eq!(ls.len(), 2);
        assert_eq!(ls[0]["seq"], 2);
        assert_eq!(ls[1]["type"], "exit");
        assert_eq!(c.emu.process_output(&sb, &id), Ok(Some((b"abc".to_vec(), b"def".to_vec()))));

        let (s, w) = c.wait(&sb, &id, "tree", 5000).await;
        assert_eq!(s, 200);
        let d = &w["data"];
        assert_eq!(
            (d["state"].as_str(), d["leader_exited"].as_bool(), d["tree_exited"].as_bool()),
            (Some("exited"), Some(true), Some(true))
        );
        assert_eq!(d["output"], json!({"oldest_seq":1,"newest_seq":2,"bytes":6}));

        // stdin stays open until stdin/close.
        let p = c.spawn(&sb, "cat", &[]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        let base = format!("/sandboxes/{sb}/processes/{id}");
        let v: Value = c
            .post(
                &format!("{base}/input"),
                json!({"data_base64": base64::engine::general_purpose::STANDARD.encode("hello\n")}),
            )
            .send()
            .await
            .unwrap()
            .j()
            .await
            .unwrap();
        assert_eq!(v["data"]["input_seq"], 1);
        let (s, _) = c.wait(&sb, &id, "leader", 200).await;
        assert_eq!(s, 408, "cat must still be running (stdin open)");
        let r = c.post(&format!("{base}/stdin/close"), json!({})).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let r = c.post(&format!("{base}/stdin/close"), json!({})).send().await.unwrap();
        assert_eq!(r.status(), 409);
        let body = c.get(&format!("{base}/connect")).send().await.unwrap().bytes().await.unwrap();
        let ls = lines(&body);
        assert_eq!(b64(&ls[0]), b"hello\n");
        assert_eq!(ls.last().unwrap()["exit_code"], 0);

        // Signal by name; exit frame reports it.
        let p = c.spawn(&sb, "sleep", &["30"]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        let r = c
            .post(&format!("/sandboxes/{sb}/processes/{id}/signal"), json!({"signal":"SIGTERM"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let body =
            c.get(&format!("/sandboxes/{sb}/processes/{id}/connect")).send().await.unwrap().bytes().await.unwrap();
        let ls = lines(&body);
        assert_eq!(ls.last().unwrap()["signal"], "SIGTERM");
        assert_eq!(ls.last().unwrap()["exit_code"], Value::Null);

        let v: Value = c.get(&format!("/sandboxes/{sb}/processes")).send().await.unwrap().j().await.unwrap();
        assert_eq!(v["data"]["processes"].as_array().unwrap().len(), 3);
        let r = c
            .post(&format!("/sandboxes/{sb}/processes"), json!({"cmd":"sh","pty":{"rows":24,"cols":80}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        assert_eq!(c.get(&format!("/sandboxes/{sb}/processes/proc_nope")).send().await.unwrap().status(), 404);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_offset_is_410() {
    let mut o = opts();
    o.journal_bytes = 100;
    with_emu(o, |c| async move {
        let sb = c.sandbox().await;
        let p = c.spawn(&sb, "sh", &["-c", "for i in 1 2 3 4 5; do printf '%0100d' 0; sleep 0.03; done"]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        let (s, w) = c.wait(&sb, &id, "tree", 5000).await;
        assert_eq!(s, 200);
        let newest = w["data"]["output"]["newest_seq"].as_u64().unwrap();
        let oldest = w["data"]["output"]["oldest_seq"].as_u64().unwrap();
        assert!(newest >= 2 && oldest > 1, "{w}");
        let r = c.get(&format!("/sandboxes/{sb}/processes/{id}/connect?after=0")).send().await.unwrap();
        assert_eq!(r.status(), 410);
        let v: Value = r.j().await.unwrap();
        assert_eq!(v["status"], "fail");
        assert_eq!(v["data"]["error"], "output_offset_expired");
        assert_eq!(v["data"]["oldest_available_seq"].as_u64(), Some(oldest));
        let r = c.get(&format!("/sandboxes/{sb}/processes/{id}/connect?after={}", oldest - 1)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let ls = lines(&r.bytes().await.unwrap());
        assert_eq!(ls[0]["seq"].as_u64(), Some(oldest));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_times_out_then_succeeds() {
    with_emu(opts(), |c| async move {
        let sb = c.sandbox().await;
        let p = c.spawn(&sb, "sleep", &["0.6"]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        let (s, v) = c.wait(&sb, &id, "leader", 100).await;
        assert_eq!(s, 408);
        assert_eq!(v, json!({"status":"fail","data":{"wait":"timeout"}}));
        let (s, v) = c.wait(&sb, &id, "tree", 5000).await;
        assert_eq!(s, 200);
        assert_eq!(v["data"]["exit_code"], 0);
        assert_eq!(v["data"]["tree_exited"], true);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_escalates_to_sigkill_and_finds_setsid_children() {
    with_emu(opts(), |c| async move {
        let sb = c.sandbox().await;
        let p = c.spawn(&sb, "bash", &["-c", "trap '' TERM; sleep 30 & sleep 30"]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pids = c.emu.live_pids();
        assert!(pids.len() >= 3, "{pids:?}");
        let t = Instant::now();
        let r = c.delete(&format!("/sandboxes/{sb}/processes/{id}?grace_ms=200")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.j().await.unwrap();
        assert!(t.elapsed() >= Duration::from_millis(200));
        assert_eq!(v["data"]["tree_exited"], true, "{v}");
        assert_eq!(v["data"]["leader_exited"], true);
        assert_eq!(v["data"]["signal"], "SIGKILL");
        for pid in &pids {
            assert!(pid_gone(*pid), "pid {pid} still alive");
        }
        // The record stays.
        assert_eq!(c.get(&format!("/sandboxes/{sb}/processes/{id}")).send().await.unwrap().status(), 200);

        // A child that calls setsid leaves the process group but keeps the marker.
        let p = c.spawn(&sb, "bash", &["-c", "setsid sleep 30 & sleep 0.1; exit 0"]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        let (s, w) = c.wait(&sb, &id, "leader", 5000).await;
        assert_eq!(s, 200);
        assert_eq!(w["data"]["exit_code"], 0);
        let (s, _) = c.wait(&sb, &id, "tree", 300).await;
        assert_eq!(s, 408, "setsid child keeps the tree alive");
        let pids = c.emu.live_pids();
        assert_eq!(pids.len(), 1, "{pids:?}");
        // The setsid child is of a managed process.
        assert_eq!(c.emu.live_process_pids(), pids);
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pids[0])).unwrap();
        assert!(stat.contains("(sleep)"));
        let v: Value =
            c.delete(&format!("/sandboxes/{sb}/processes/{id}?grace_ms=100")).send().await.unwrap().j().await.unwrap();
        assert_eq!(v["data"]["tree_exited"], true);
        assert!(pid_gone(pids[0]));
        assert!(c.emu.live_pids().is_empty());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_faults() {
    with_emu(opts(), |c| async move {
        let sb = c.sandbox().await;
        c.emu.add_fault(
            FaultRule::from_json(r#"{"route":"deleteProcess","times":1,"action":{"kind":"treeExitedFalse"}}"#).unwrap(),
        );
        c.emu.add_fault(
            FaultRule::from_json(
                r#"{"route":"deleteProcess","skip":1,"times":1,"action":{"kind":"treeExitsAfter","ms":300}}"#,
            )
            .unwrap(),
        );
        let p = c.spawn(&sb, "sleep", &["30"]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        let pid = p["pid"].as_i64().unwrap() as i32;
        let v: Value =
            c.delete(&format!("/sandboxes/{sb}/processes/{id}?grace_ms=100")).send().await.unwrap().j().await.unwrap();
        assert_eq!(v["data"]["tree_exited"], false);
        assert!(!pid_gone(pid), "stubborn tree must not be killed");
        let (s, _) = c.wait(&sb, &id, "tree", 200).await;
        assert_eq!(s, 408);

        let p = c.spawn(&sb, "sleep", &["30"]).await;
        let id2 = p["process_id"].as_str().unwrap().to_string();
        let t = Instant::now();
        let v: Value = c.delete(&format!("/sandboxes/{sb}/processes/{id2}")).send().await.unwrap().j().await.unwrap();
        assert_eq!(v["data"]["tree_exited"], false);
        assert!(t.elapsed() < Duration::from_millis(1000), "answered at once, before the kill");
        let (s, w) = c.wait(&sb, &id2, "tree", 5000).await;
        assert_eq!(s, 200);
        assert_eq!(w["data"]["tree_exited"], true);
        assert!(t.elapsed() >= Duration::from_millis(290));
        // The stubborn one is still there; close() must kill it.
        assert!(!pid_gone(pid));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_after_handler_and_drop_connection() {
    with_emu(opts(), |c| async move {
        let sb = c.sandbox().await;
        c.emu.add_fault(
            FaultRule::from_json(
                r#"{"route":"createProcess","times":1,"action":{"kind":"status","status":500,"afterHandler":true}}"#,
            )
            .unwrap(),
        );
        let r =
            c.post(&format!("/sandboxes/{sb}/processes"), json!({"cmd":"sleep","args":["30"]})).send().await.unwrap();
        assert_eq!(r.status(), 500);
        let text = r.text().await.unwrap();
        assert!(text.contains("secret-body-token"));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["status"], "error");
        let v: Value = c.get(&format!("/sandboxes/{sb}/processes")).send().await.unwrap().j().await.unwrap();
        assert_eq!(v["data"]["processes"].as_array().unwrap().len(), 1, "the process was really created");
        let _ = c.spawn(&sb, "true", &[]).await; // rule used up

        c.emu.add_fault(
            FaultRule::from_json(r#"{"route":"whoami","times":1,"action":{"kind":"dropConnection"}}"#).unwrap(),
        );
        let r = c.get("/whoami").send().await;
        assert!(r.is_err(), "{r:?}");
        assert_eq!(c.get("/whoami").send().await.unwrap().status(), 200);
        c.emu.add_fault(
            FaultRule::from_json(
                r#"{"route":"whoami","action":{"kind":"redirect","location":"http://127.0.0.1:1/x"}}"#,
            )
            .unwrap(),
        );
        let r = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
            .get(c.url("/whoami"))
            .header("X-Api-Key", c.emu.api_key())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 307);
        assert_eq!(r.headers()["location"], "http://127.0.0.1:1/x");
        c.emu.clear_faults();
        let statuses: Vec<(&str, u16)> = c.emu.requests().iter().map(|r| (r.route, r.status)).collect();
        assert!(statuses.contains(&("createProcess", 500)));
        assert!(statuses.contains(&("whoami", 0)));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_after_frames_then_reconnect() {
    with_emu(opts(), |c| async move {
        let sb = c.sandbox().await;
        let p = c.spawn(&sb, "sh", &["-c", "for i in 1 2 3 4 5; do echo $i; sleep 0.03; done"]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        let (s, w) = c.wait(&sb, &id, "tree", 5000).await;
        assert_eq!(s, 200);
        assert_eq!(w["data"]["output"]["newest_seq"], 5);
        c.emu.add_fault(
            FaultRule::from_json(r#"{"route":"connect","times":1,"action":{"kind":"dropAfterFrames","frames":2}}"#)
                .unwrap(),
        );
        let mut r = c.get(&format!("/sandboxes/{sb}/processes/{id}/connect")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let mut got = Vec::new();
        let mut errored = false;
        loop {
            match r.chunk().await {
                Ok(Some(b)) => got.extend_from_slice(&b),
                Ok(None) => break,
                Err(_) => {
                    errored = true;
                    break;
                }
            }
        }
        assert!(errored, "stream must end abruptly");
        let ls = lines(&got);
        assert_eq!(ls.len(), 2);
        assert!(ls.iter().all(|l| l["type"] == "data"));
        let body = c
            .get(&format!("/sandboxes/{sb}/processes/{id}/connect?after=2"))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let ls = lines(&body);
        let seqs: Vec<u64> = ls.iter().filter_map(|l| l["seq"].as_u64()).collect();
        assert_eq!(seqs, vec![3, 4, 5]);
        assert_eq!(ls.last().unwrap()["type"], "exit");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_429() {
    let mut o = opts();
    o.rate_limit_per_minute = Some(3);
    with_emu(o, |c| async move {
        for _ in 0..3 {
            assert_eq!(c.get("/whoami").send().await.unwrap().status(), 200);
        }
        let r = c.get("/whoami").send().await.unwrap();
        assert_eq!(r.status(), 429);
        let ra: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&ra));
        let v: Value = r.j().await.unwrap();
        assert_eq!(v, json!({"status":"fail","data":{"rate":"limited"}}));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_leaves_no_live_pid() {
    let emu = emulator::start(opts()).await.unwrap();
    let c = Ctx::new(emu.clone());
    let sb = c.sandbox().await;
    let root = {
        let v: Value =
            c.post(&format!("/sandboxes/{sb}/exec"), json!({"cmd":"pwd"})).send().await.unwrap().j().await.unwrap();
        std::path::PathBuf::from(v["data"]["stdout"].as_str().unwrap().trim())
    };
    c.spawn(&sb, "sleep", &["30"]).await;
    c.spawn(&sb, "sh", &["-c", "sleep 30 & sleep 30"]).await;
    c.spawn(&sb, "bash", &["-c", "setsid sleep 30 & trap '' TERM; sleep 30"]).await;
    let sb2 = emu.create_sandbox_now();
    c.spawn(&sb2, "sleep", &["30"]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pids = emu.live_pids();
    assert!(pids.len() >= 7, "{pids:?}");
    emu.close().await;
    for pid in &pids {
        assert!(pid_gone(*pid), "pid {pid} survived close()");
    }
    assert!(emu.live_pids().is_empty());
    assert!(!root.exists(), "sandbox dir removed");
    assert!(c.get("/whoami").send().await.is_err(), "no longer accepting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_stream_faults() {
    with_emu(opts(), |c| async move {
        let sb = c.sandbox().await;
        let p = c.spawn(&sb, "sh", &["-c", "for i in 1 2 3 4; do echo $i; sleep 0.03; done"]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        let (s, _) = c.wait(&sb, &id, "tree", 5000).await;
        assert_eq!(s, 200);
        let url = format!("/sandboxes/{sb}/processes/{id}/connect");
        let fetch = |kind: &'static str| {
            let c = &c;
            let url = url.clone();
            async move {
                c.emu.clear_faults();
                c.emu.add_fault(FaultRule::from_json(&format!(r#"{{"route":"connect","action":{kind}}}"#)).unwrap());
                let b = c.get(&url).send().await.unwrap().bytes().await.unwrap();
                String::from_utf8(b.to_vec()).unwrap()
            }
        };
        let text = fetch(r#"{"kind":"duplicateFrames"}"#).await;
        let ls = lines(text.as_bytes());
        let seqs: Vec<u64> = ls.iter().filter_map(|l| l["seq"].as_u64()).collect();
        assert_eq!(seqs, vec![1, 1, 2, 2, 3, 3, 4, 4]);
        let text = fetch(r#"{"kind":"gapAfterFrames","frames":1}"#).await;
        let seqs: Vec<u64> = lines(text.as_bytes()).iter().filter_map(|l| l["seq"].as_u64()).collect();
        assert_eq!(seqs, vec![1, 3, 4]);
        let text = fetch(r#"{"kind":"malformedLine","after_frames":2}"#).await;
        assert_eq!(text.lines().filter(|l| serde_json::from_str::<Value>(l).is_err()).count(), 1);
        let text = fetch(r#"{"kind":"sseNoise"}"#).await;
        assert!(text.contains(": keep-alive\n") && text.contains("data: {\"type\":\"exit\""), "{text}");
        let text = fetch(r#"{"kind":"invalidBase64"}"#).await;
        assert!(text.contains("@@not*base64@@"));
        let text = fetch(r#"{"kind":"badSeq"}"#).await;
        assert!(text.contains(r#""seq":-1"#));
        let text = fetch(r#"{"kind":"errorFrame","error":"boom"}"#).await;
        assert_eq!(lines(text.as_bytes()), vec![json!({"type":"error","error":"boom"})]);
        let text = fetch(r#"{"kind":"oversizeFrame"}"#).await;
        assert!(text.lines().next().unwrap().len() > 1024 * 1024);
        let last = text.trim_end().lines().last().unwrap();
        assert!(last.contains(r#""type":"exit""#) && last.contains(r#""tree_exited":true"#), "{last}");
        let t = Instant::now();
        let text = fetch(r#"{"kind":"heartbeatsOnly","ms":300}"#).await;
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert!(text.lines().take_while(|l| l.contains("heartbeat")).count() >= 2);
        let t = Instant::now();
        let text = fetch(r#"{"kind":"fastStream","mib":4,"frameBytes":65536}"#).await;
        let ls = lines(text.as_bytes());
        assert_eq!(ls.len(), 65);
        assert_eq!(ls[63]["seq"], 64);
        assert_eq!(b64(&ls[0]).len(), 65536);
        assert_eq!(ls[64]["exit_code"], 0);
        assert!(t.elapsed() < Duration::from_secs(5));
        c.emu.clear_faults();
        let (_, w) = c.wait(&sb, &id, "tree", 1000).await;
        assert_eq!(w["data"]["output"]["newest_seq"], 64);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_frame_does_not_wait_for_background_children() {
    with_emu(opts(), |c| async move {
        let sb = c.sandbox().await;
        let p = c.spawn(&sb, "sh", &["-c", "sleep 30 & echo hi; exit 5"]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        let t = Instant::now();
        let body =
            c.get(&format!("/sandboxes/{sb}/processes/{id}/connect")).send().await.unwrap().bytes().await.unwrap();
        assert!(t.elapsed() < Duration::from_secs(2));
        let ls = lines(&body);
        assert_eq!(b64(&ls[0]), b"hi\n");
        let exit = ls.last().unwrap();
        assert_eq!(exit["type"], "exit");
        assert_eq!(exit["exit_code"], 5);
        assert_eq!(exit["tree_exited"], false);
        let (s, w) = c.wait(&sb, &id, "leader", 1000).await;
        assert_eq!((s, w["data"]["tree_exited"].as_bool()), (200, Some(false)));
        let v: Value =
            c.delete(&format!("/sandboxes/{sb}/processes/{id}?grace_ms=0")).send().await.unwrap().j().await.unwrap();
        assert_eq!(v["data"]["tree_exited"], true);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_live_client_gets_error_frame() {
    let mut o = opts();
    o.journal_bytes = 64 * 1024;
    with_emu(o, |c| async move {
        let sb = c.sandbox().await;
        let p = c.spawn(&sb, "sh", &["-c", "read x; head -c 30000000 /dev/zero"]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        let base = format!("/sandboxes/{sb}/processes/{id}");
        let r = c.get(&format!("{base}/connect?after=0")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        c.post(&format!("{base}/input"), json!({"data_base64":"Z28K"})).send().await.unwrap();
        let (s, _) = c.wait(&sb, &id, "tree", 10_000).await;
        assert_eq!(s, 200);
        let body = r.bytes().await.unwrap();
        let ls = lines(&body);
        let last = ls.last().unwrap();
        assert_eq!(last["type"], "error", "{last}");
        assert_eq!(last["error"], "output_offset_expired");
        assert!(last["oldest_available_seq"].as_u64().unwrap() > 1);
        let data: Vec<u64> = ls.iter().filter_map(|l| l["seq"].as_u64()).collect();
        assert!(data.windows(2).all(|w| w[1] == w[0] + 1), "seqs contiguous before the error");
        let total = c.emu.process_output(&sb, &id).unwrap().unwrap().0.len();
        assert_eq!(total, 30_000_000);
    })
    .await;
}

#[test]
fn dropping_the_runtime_without_close_kills_trees() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let pids = rt.block_on(async {
        let emu = emulator::start(opts()).await.unwrap();
        let c = Ctx::new(emu.clone());
        let sb = c.sandbox().await;
        c.spawn(&sb, "sh", &["-c", "sleep 30 & sleep 30"]).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        emu.live_pids()
    });
    assert!(pids.len() >= 2, "{pids:?}");
    drop(rt);
    for pid in pids {
        assert!(pid_gone(pid), "pid {pid} survived runtime drop");
    }
}

/// `retainedBytes`: exited processes' output (journal + capture) is bounded across processes
/// and sandboxes, oldest exit first; a running process's output is never dropped; an evicted
/// process fails closed (`output_offset_expired`, `process_output` says so); deleting a
/// sandbox takes its processes out of the total.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_output_is_bounded_across_processes() {
    const HALF: usize = 150 * 1024;
    // Each process writes 150 KiB to stdout and 150 KiB to stderr: 300 KiB in the journal
    // (1 MiB per process) plus 300 KiB captured = 600 KiB retained; two fit in 1.5 MiB.
    const PER: usize = 4 * HALF;
    let mut o = opts();
    o.retained_bytes = Some(1536 * 1024);
    with_emu(o, |c| async move {
        let write = format!("head -c {HALF} /dev/zero; head -c {HALF} /dev/zero >&2");
        let (a, b) = (c.sandbox().await, c.sandbox().await);
        // The running process wrote as much, and holds on until its stdin closes.
        let running = c.spawn(&a, "sh", &["-c", &format!("{write}; read x")]).await;
        let rid = running["process_id"].as_str().unwrap().to_string();
        eventually("the running process's output", || {
            c.emu.process_output(&a, &rid).unwrap().is_some_and(|(o, e)| o.len() + e.len() == 2 * HALF)
        })
        .await;
        let mut ids = Vec::new();
        for (k, sb) in [&a, &a, &b, &b, &b].into_iter().enumerate() {
            let p = c.spawn(sb, "sh", &["-c", &write]).await;
            let id = p["process_id"].as_str().unwrap().to_string();
            let (s, _) = c.wait(sb, &id, "tree", 10_000).await;
            assert_eq!(s, 200);
            // One exit at a time, so the exit order is the spawn order.
            eventually("the exit to be accounted", || c.emu.retained().exits == k as u64 + 1).await;
            ids.push((sb.clone(), id));
        }
        let r = c.emu.retained();
        assert_eq!((r.bytes, r.processes, r.evictions), (2 * PER, 2, 3), "{r:?}");

        for (i, (sb, id)) in ids.iter().enumerate() {
            let rec: Value = c.get(&format!("/sandboxes/{sb}/processes/{id}")).send().await.unwrap().j().await.unwrap();
            let out = &rec["data"]["output"];
            let newest = out["newest_seq"].as_u64().unwrap();
            assert!(newest >= 2, "{out}");
            let replay = c.get(&format!("/sandboxes/{sb}/processes/{id}/connect?after=0")).send().await.unwrap();
            let status = replay.status().as_u16();
            let ls = lines(&replay.bytes().await.unwrap());
            if i < 3 {
                // Evicted: numbering kept, nothing retained, a replay fails closed (410 with
                // `output_offset_expired`, as for any offset older than the journal).
                assert_eq!(out, &json!({"oldest_seq": newest + 1, "newest_seq": newest, "bytes": 0}), "#{i}");
                assert_eq!(status, 410, "#{i}: {ls:?}");
                assert_eq!(
                    ls,
                    vec![json!({"status":"fail","data":{"error":"output_offset_expired","oldest_available_seq":newest + 1}})],
                    "#{i}"
                );
                let err = c.emu.process_output(sb, id).unwrap_err();
                assert_eq!(err.to_string(), format!("output of process {id} is no longer retained (retainedBytes)"));
                // A client that had read everything still gets its exit frame.
                let tail = c.get(&format!("/sandboxes/{sb}/processes/{id}/connect?after={newest}")).send().await.unwrap();
                let ls = lines(&tail.bytes().await.unwrap());
                assert_eq!(ls.last().unwrap()["type"], "exit", "{ls:?}");
            } else {
                assert_eq!(status, 200, "#{i}");
                assert_eq!(out["oldest_seq"], 1, "#{i}: {out}");
                assert_eq!(out["bytes"], 2 * HALF, "#{i}: {out}");
                let data: usize = ls.iter().filter(|l| l["type"] == "data").map(|l| b64(l).len()).sum();
                assert_eq!(data, 2 * HALF, "#{i}");
                assert_eq!(ls.last().unwrap()["type"], "exit");
                assert_eq!(c.emu.process_output(sb, id), Ok(Some((vec![0; HALF], vec![0; HALF]))), "#{i}");
            }
        }
        // The running process is the oldest and kept everything.
        let rec: Value = c.get(&format!("/sandboxes/{a}/processes/{rid}")).send().await.unwrap().j().await.unwrap();
        assert_eq!(rec["data"]["state"], "running");
        assert_eq!(rec["data"]["output"]["oldest_seq"], 1);
        assert_eq!(rec["data"]["output"]["bytes"], 2 * HALF);
        assert_eq!(c.emu.process_output(&a, &rid), Ok(Some((vec![0; HALF], vec![0; HALF]))));

        // Deleting sandbox b takes its two kept processes out of the total.
        let r = c.delete(&format!("/sandboxes/{b}")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let r = c.emu.retained();
        assert_eq!((r.bytes, r.processes), (0, 0), "{r:?}");

        // The running process ends: now it counts, and fits.
        let r = c.post(&format!("/sandboxes/{a}/processes/{rid}/stdin/close"), json!({})).send().await.unwrap();
        assert_eq!(r.status().as_u16() / 100, 2);
        let (s, _) = c.wait(&a, &rid, "tree", 10_000).await;
        assert_eq!(s, 200);
        eventually("the last exit to be accounted", || c.emu.retained().exits == 6).await;
        let r = c.emu.retained();
        assert_eq!((r.bytes, r.processes, r.evictions), (PER, 1, 3), "{r:?}");
        assert_eq!(c.emu.process_output(&a, &rid), Ok(Some((vec![0; HALF], vec![0; HALF]))));

        let r = c.delete(&format!("/sandboxes/{a}")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let r = c.emu.retained();
        assert_eq!((r.bytes, r.processes), (0, 0), "{r:?}");
    })
    .await;
}

/// `retainedBytes: null` (or 0): nothing is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_output_unbounded_when_off() {
    let mut o = opts();
    o.retained_bytes = Some(0);
    o.journal_bytes = 1024;
    with_emu(o, |c| async move {
        let sb = c.sandbox().await;
        for k in 0..3u64 {
            let p = c.spawn(&sb, "sh", &["-c", "head -c 100000 /dev/zero"]).await;
            let id = p["process_id"].as_str().unwrap().to_string();
            let (s, _) = c.wait(&sb, &id, "tree", 10_000).await;
            assert_eq!(s, 200);
            eventually("the exit to be accounted", || c.emu.retained().exits == k + 1).await;
        }
        let r = c.emu.retained();
        assert_eq!((r.processes, r.evictions), (3, 0), "{r:?}");
        assert!(r.bytes >= 3 * 100_000, "{r:?}");
    })
    .await;
}
