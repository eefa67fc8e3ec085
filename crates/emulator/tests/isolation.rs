//! The private view of each tree where the emulator runs as root: the sandbox's workspace on
//! `/workspace` (two sandboxes never see each other's), and a tree that writes itself into a
//! root `cgroup.procs` staying in its leaf (seen alive, killed, proven gone). As root in CI
//! these must run; elsewhere they say why they skip.

use std::time::{Duration, Instant};

use createos_test_support::emulator::{self, Emulator, EmulatorOptions, TrackingMode};
use createos_test_support::{pid_gone, sleepers, unique_sleep};
use serde_json::{json, Value};

/// Whole trees: these tests prove a process DELETE ends what left the process group
/// (`TerminationScope::Tree`), whatever profile `CREATEOS_EMULATOR_PROFILE` names
/// (tests/termination.rs covers `group`).
fn opts() -> EmulatorOptions {
    EmulatorOptions {
        termination_scope: Some(createos_test_support::TerminationScope::Tree),
        ..createos_test_support::unlimited()
    }
}

mod support;

use support::{in_ci, is_root};

async fn call(emu: &Emulator, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Vec<u8>) {
    let mut r =
        reqwest::Client::new().request(method, format!("{}/v1{path}", emu.url())).header("X-Api-Key", emu.api_key());
    if let Some(b) = body {
        r = r.header("content-type", "application/json").body(b.to_string());
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
}

async fn json_call(emu: &Emulator, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let (s, b) = call(emu, method, path, body).await;
    (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

/// Runs `bash -c script` as a managed process to its end; returns (exit code, stdout).
async fn run(emu: &Emulator, sb: &str, script: &str) -> (i64, String) {
    let (s, v) = json_call(
        emu,
        reqwest::Method::POST,
        &format!("/sandboxes/{sb}/processes"),
        Some(json!({"cmd":"bash","args":["-c",script]})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let id = v["data"]["process_id"].as_str().unwrap().to_string();
    let (s, w) = json_call(
        emu,
        reqwest::Method::GET,
        &format!("/sandboxes/{sb}/processes/{id}/wait?scope=tree&timeout_ms=20000"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{w}");
    let (out, _) = emu.process_output(sb, &id).unwrap().unwrap();
    (w["data"]["exit_code"].as_i64().unwrap_or(-1), String::from_utf8_lossy(&out).into_owned())
}

fn kill_pids(pids: &[i32]) {
    for pid in pids {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::Signal::SIGKILL);
    }
}

fn skip_unless_root(what: &str) -> bool {
    if is_root() {
        return false;
    }
    assert!(!in_ci(), "CI runs as root: {what} must run there");
    println!("skipped: {what} needs root");
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_is_each_sandboxs_own_directory() {
    if skip_unless_root("/workspace as a mount") {
        return;
    }
    let emu = emulator::start(opts()).await.unwrap();
    let a = emu.create_sandbox_now();
    let b = emu.create_sandbox_now();
    let mounted = emu.workspace_mounted();
    let (code_a, out_a) = run(
        &emu,
        &a,
        "cd /workspace && echo from-a > made-in-a && mkdir -p sub && cd /workspace/sub && pwd && ls /workspace",
    )
    .await;
    let (code_b, out_b) = run(&emu, &b, "cd /workspace && ls -A /workspace; echo end").await;
    // The file landed in the sandbox's own directory: the files API reads it back there.
    let (s_a, body_a) =
        call(&emu, reqwest::Method::GET, &format!("/sandboxes/{a}/files?path=/workspace/made-in-a"), None).await;
    let (s_b, _) =
        call(&emu, reqwest::Method::GET, &format!("/sandboxes/{b}/files?path=/workspace/made-in-a"), None).await;
    // A process cwd given as `/workspace/sub` works too (the raw field, mapped).
    let (s, v) = json_call(
        &emu,
        reqwest::Method::POST,
        &format!("/sandboxes/{a}/processes"),
        Some(json!({"cmd":"bash","args":["-c","cat ../made-in-a; pwd"],"cwd":"/workspace/sub"})),
    )
    .await;
    emu.close().await;
    let host_leak = std::path::Path::new("/workspace/made-in-a").exists();
    assert!(mounted, "as root the emulator mounts each workspace on /workspace");
    assert_eq!(code_a, 0, "{out_a}");
    assert_eq!(out_a, "/workspace/sub\nmade-in-a\nsub\n");
    assert_eq!(code_b, 0, "{out_b}");
    assert_eq!(out_b, "end\n", "sandbox b sees nothing of a's workspace");
    assert_eq!((s_a, body_a.as_slice()), (200, b"from-a\n".as_slice()));
    assert_eq!(s_b, 404);
    assert_eq!(s, 201, "{v}");
    assert!(!host_leak, "nothing was written to the host's /workspace");
}

/// The escape of a tracked tree, under each cgroup layout the machine offers: a process that
/// writes its own pid into the root `cgroup.procs` of every hierarchy it can see (the v1 `pids`
/// root, the v2 root), and one that reaches the host's hierarchies through the emulator's
/// `/proc/<pid>/root` (past the view its namespace gives it). Both stay part of the tree: not
/// exited while they live, killed by DELETE, proven gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_that_writes_itself_into_a_root_cgroup_stays_in_its_leaf() {
    if skip_unless_root("cgroup tracking") {
        return;
    }
    let mut failures = Vec::new();
    let mut layouts = 0;
    for mode in [TrackingMode::CgroupV2, TrackingMode::CgroupV1] {
        let Ok(emu) = emulator::start(EmulatorOptions { tracking: mode, ..opts() }).await else {
            println!("{}: not offered here", mode.as_str());
            continue;
        };
        layouts += 1;
        println!("{}: cgroup view {}", mode.as_str(), emu.cgroup_view());
        let sb = emu.create_sandbox_now();
        // Through its own view (any cgroup.procs it can see is inside its leaf), then through
        // the emulator's root directory, which reaches the host's hierarchies (the kernel takes
        // that write: the membership check must catch it).
        let roots = "sys/fs/cgroup/pids/cgroup.procs sys/fs/cgroup/unified/cgroup.procs sys/fs/cgroup/cgroup.procs";
        let through_view: String = roots.split(' ').map(|f| format!("/{f}")).collect::<Vec<_>>().join(" ");
        let through_host: String =
            roots.split(' ').map(|f| format!("/proc/$EMU/root/{f}")).collect::<Vec<_>>().join(" ");
        for (n, files) in [through_view, through_host].into_iter().enumerate() {
            let arg = unique_sleep(300 + u32::try_from(n).unwrap());
            let script = format!(
                "EMU=$PPID setsid bash -c 'r=none; for f in {files}; do [ -e \"$f\" ] || continue; \
                   if echo $BASHPID > \"$f\"; then r=moved; elif [ $r = none ]; then r=refused; fi; done 2>/dev/null; \
                   echo $r > /tmp/.escape-{arg}; exec sleep {arg}' </dev/null >/dev/null 2>&1 & \
                 echo started"
            );
            let outcome = escape_round(&emu, &sb, &script, &arg).await;
            let said = std::fs::read_to_string(format!("/tmp/.escape-{arg}")).unwrap_or_default();
            let _ = std::fs::remove_file(format!("/tmp/.escape-{arg}"));
            let what = if n == 0 { "its own view" } else { "the host's hierarchies" };
            println!("{}, {what}: the write was {}", mode.as_str(), said.trim());
            if n == 1 && said.trim() != "moved" {
                failures.push(format!("{}, {what}: the escape was not made ({said:?})", mode.as_str()));
            }
            if let Err(e) = outcome {
                failures.push(format!("{}, {what}: {e}", mode.as_str()));
            }
        }
        emu.close().await;
    }
    assert!(layouts > 0 || !in_ci(), "CI offers a cgroup layout");
    assert_eq!(failures, Vec::<String>::new());
}

/// One escape: returns what went wrong, after killing what the emulator left alive.
async fn escape_round(emu: &Emulator, sb: &str, script: &str, arg: &str) -> Result<(), String> {
    let (s, v) = json_call(
        emu,
        reqwest::Method::POST,
        &format!("/sandboxes/{sb}/processes"),
        Some(json!({"cmd":"bash","args":["-c",script]})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let id = v["data"]["process_id"].as_str().unwrap().to_string();
    let path = format!("/sandboxes/{sb}/processes/{id}");
    let (s, w) = json_call(emu, reqwest::Method::GET, &format!("{path}/wait?timeout_ms=10000"), None).await;
    assert_eq!(s, 200, "{w}");
    // The escape is made before `exec sleep`: once the marker file exists it was tried.
    let end = Instant::now() + Duration::from_secs(10);
    let outcome = || std::fs::read_to_string(format!("/tmp/.escape-{arg}")).unwrap_or_default();
    while (sleepers(arg).is_empty() || outcome().trim().is_empty()) && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pids = sleepers(arg);
    let (tree_s, tree) =
        json_call(emu, reqwest::Method::GET, &format!("{path}/wait?scope=tree&timeout_ms=500"), None).await;
    let (_, rec) = json_call(emu, reqwest::Method::GET, &path, None).await;
    let live_before = emu.live_pids();
    let (d, del) = json_call(emu, reqwest::Method::DELETE, &format!("{path}?grace_ms=100"), None).await;
    let end = Instant::now() + Duration::from_secs(5);
    while !pids.iter().all(|p| pid_gone(*p)) && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left: Vec<i32> = pids.iter().copied().filter(|p| !pid_gone(*p)).collect();
    let end = Instant::now() + Duration::from_secs(5);
    while !emu.live_pids().is_empty() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let live_after = emu.live_pids();
    kill_pids(&left);
    let mut errs = Vec::new();
    if pids.len() != 1 {
        errs.push(format!("the sleeper did not start: {pids:?}"));
    }
    if tree_s != 408 {
        errs.push(format!("the tree was reported exited while the escaper lived: {tree}"));
    }
    if rec["data"]["tree_exited"] != json!(false) {
        errs.push(format!("record: {rec}"));
    }
    if !pids.iter().all(|p| live_before.contains(p)) {
        errs.push(format!("livePids {live_before:?} missed {pids:?}"));
    }
    if (d, &del["data"]["tree_exited"]) != (200, &json!(true)) {
        errs.push(format!("DELETE: {del}"));
    }
    if !left.is_empty() {
        errs.push(format!("alive after the DELETE: {left:?}"));
    }
    if !live_after.is_empty() {
        errs.push(format!("livePids after: {live_after:?}"));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}
