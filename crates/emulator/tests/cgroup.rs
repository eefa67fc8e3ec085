//! Tracking by cgroup: which tracking an emulator uses (CI must run the cgroup mode), a fork
//! loop bounded by `pids.max`, each cgroup layout the machine offers, the marker fallback, and
//! the cgroup directories removed once empty and on close.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use createos_test_support::emulator::{self, Emulator, EmulatorOptions, Tracking, TrackingMode};
use createos_test_support::{sleepers, unique_sleep};
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

async fn call(emu: &Emulator, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut r =
        reqwest::Client::new().request(method, format!("{}/v1{path}", emu.url())).header("X-Api-Key", emu.api_key());
    if let Some(b) = body {
        r = r.header("content-type", "application/json").body(b.to_string());
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    (status, serde_json::from_slice(&r.bytes().await.unwrap()).unwrap_or(Value::Null))
}

async fn spawn_bash(emu: &Emulator, sb: &str, script: &str) -> String {
    let (s, v) = call(
        emu,
        reqwest::Method::POST,
        &format!("/sandboxes/{sb}/processes"),
        Some(json!({"cmd":"bash","args":["-c",script]})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    v["data"]["process_id"].as_str().unwrap().to_string()
}

fn kill_pids(pids: &[i32]) {
    for pid in pids {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::Signal::SIGKILL);
    }
}

/// The leaf cgroup directory of `pid` in the hierarchy that tells membership, from
/// /proc/<pid>/cgroup: the `pids` line under v1, the `0::` line under v2.
fn leaf_dir(pid: i32, tracking: Tracking) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        let ours = match tracking {
            Tracking::CgroupV1 => ctrls.split(',').any(|c| c == "pids"),
            Tracking::CgroupV2 => ctrls.is_empty(),
            Tracking::Marker => false,
        };
        if !ours || !path.contains("/createos-emulator-") {
            continue;
        }
        let mount = mounts.lines().find_map(|m| {
            let f: Vec<&str> = m.split(' ').collect();
            let hit = match tracking {
                Tracking::CgroupV1 => f[2] == "cgroup" && f[3].split(',').any(|o| o == "pids"),
                _ => f[2] == "cgroup2",
            };
            hit.then(|| PathBuf::from(f[1]))
        })?;
        return Some(mount.join(path.trim_start_matches('/')));
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_its_tracking_and_ci_runs_a_cgroup_mode() {
    let emu = emulator::start(opts()).await.unwrap();
    let (tracking, pids_max) = (emu.tracking(), emu.pids_max());
    emu.close().await;
    println!("tracking: {} (pids.max {pids_max:?}), root: {}, CI: {}", tracking.as_str(), is_root(), in_ci());
    if in_ci() && is_root() {
        assert_ne!(tracking, Tracking::Marker, "CI runs as root and must track trees by cgroup");
    }
    if tracking != Tracking::Marker && pids_max.is_some() {
        assert_eq!(pids_max, Some(emulator::DEFAULT_PIDS_MAX));
    }
    // Options: a bound of 0 is refused; the marker on request.
    assert!(emulator::start(EmulatorOptions { pids_max: Some(0), ..opts() }).await.is_err());
    let emu = emulator::start(EmulatorOptions { tracking: TrackingMode::Marker, ..opts() }).await.unwrap();
    let (t, p) = (emu.tracking(), emu.pids_max());
    emu.close().await;
    assert_eq!((t, p), (Tracking::Marker, None));
}

/// A loop that forks sleepers (each in a new session, without the marker) as fast as it can:
/// the tree never holds more than `pids.max` = 64 processes, is seen alive, and a DELETE kills
/// all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_loop_is_bounded_by_pids_max_and_killed() {
    let emu = emulator::start(EmulatorOptions { pids_max: Some(64), ..opts() }).await.unwrap();
    if emu.pids_max().is_none() {
        let t = emu.tracking();
        emu.close().await;
        assert!(!(in_ci() && is_root()), "CI must run with a pids bound (tracking {})", t.as_str());
        println!("skipped: tracking {} applies no pids.max here", t.as_str());
        return;
    }
    let arg = unique_sleep(304);
    let sb = emu.create_sandbox_now();
    let script = format!("while :; do env -i setsid sleep {arg} </dev/null >/dev/null 2>&1 & done");
    let id = spawn_bash(&emu, &sb, &script).await;
    // The loop fills the cgroup: bash and 63 sleepers, never more.
    let end = Instant::now() + Duration::from_secs(15);
    let mut most = 0;
    let mut full_for = 0;
    while full_for < 10 && Instant::now() < end {
        let n = sleepers(&arg).len();
        most = most.max(n);
        full_for = if n == 63 { full_for + 1 } else { 0 };
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let pids = sleepers(&arg);
    let (s, _) = call(
        &emu,
        reqwest::Method::GET,
        &format!("/sandboxes/{sb}/processes/{id}/wait?scope=tree&timeout_ms=200"),
        None,
    )
    .await;
    let (d, v) =
        call(&emu, reqwest::Method::DELETE, &format!("/sandboxes/{sb}/processes/{id}?grace_ms=100"), None).await;
    let left = sleepers(&arg);
    emu.close().await;
    kill_pids(&sleepers(&arg));
    assert!(most <= 63, "the tree held {most} sleepers besides bash, above pids.max 64");
    assert_eq!(full_for, 10, "the loop never filled the bound (most {most})");
    assert_eq!(pids.len(), 63);
    assert_eq!(s, 408, "a full tree is not exited");
    assert_eq!((d, &v["data"]["tree_exited"]), (200, &json!(true)), "{v}");
    assert_eq!(left, Vec::<i32>::new(), "alive after DELETE answered tree_exited true");
}

/// Each layout this machine offers (v1 and v2 are tried on their own), and the marker:
/// an `env -i setsid` sleeper is seen alive, is killed by DELETE, and its cgroup directory is
/// removed once empty; the parent goes with close. The marker loses it (the documented limit of
/// the fallback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layout_catches_env_i_setsid_and_removes_its_cgroups() {
    for mode in [TrackingMode::CgroupV1, TrackingMode::CgroupV2, TrackingMode::Marker] {
        let emu = match emulator::start(EmulatorOptions { tracking: mode, ..opts() }).await {
            Ok(e) => e,
            Err(e) => {
                println!("{mode:?}: not available here ({e})");
                continue;
            }
        };
        let tracking = emu.tracking();
        let arg = unique_sleep(305);
        let sb = emu.create_sandbox_now();
        let id = spawn_bash(&emu, &sb, &format!("env -i setsid sleep {arg} </dev/null >/dev/null 2>&1 & echo started"))
            .await;
        let path = format!("/sandboxes/{sb}/processes/{id}");
        let (s, w) = call(&emu, reqwest::Method::GET, &format!("{path}/wait?timeout_ms=5000"), None).await;
        assert_eq!(s, 200, "{w}");
        let end = Instant::now() + Duration::from_secs(5);
        while sleepers(&arg).is_empty() && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let pids = sleepers(&arg);
        assert_eq!(pids.len(), 1, "{mode:?}");
        let leaf = leaf_dir(pids[0], tracking);
        let (s, _) = call(&emu, reqwest::Method::GET, &format!("{path}/wait?scope=tree&timeout_ms=300"), None).await;
        if tracking == Tracking::Marker {
            // The fallback cannot see it: the tree reads as exited while the sleeper lives.
            assert_eq!(s, 200);
            assert!(leaf.is_none());
            emu.close().await;
            let survived = sleepers(&arg);
            kill_pids(&survived);
            assert_eq!(survived, pids, "the marker's limit: close cannot find it either");
            continue;
        }
        let leaf = leaf.unwrap_or_else(|| panic!("{mode:?}: pid {} is in no emulator cgroup", pids[0]));
        assert!(leaf.is_dir(), "{}", leaf.display());
        let (d, v) = call(&emu, reqwest::Method::DELETE, &format!("{path}?grace_ms=100"), None).await;
        let left = sleepers(&arg);
        let end = Instant::now() + Duration::from_secs(5);
        while leaf.exists() && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let leaf_left = leaf.exists();
        let parent = leaf.parent().unwrap().to_path_buf();
        emu.close().await;
        kill_pids(&left);
        assert_eq!((s, d, &v["data"]["tree_exited"]), (408, 200, &json!(true)), "{mode:?}: {v}");
        assert_eq!(left, Vec::<i32>::new(), "{mode:?}: alive after DELETE");
        assert!(!leaf_left, "{mode:?}: the empty leaf {} was not removed", leaf.display());
        assert!(!parent.exists(), "{mode:?}: close left {}", parent.display());
        println!("{}: caught, killed, cgroups removed", tracking.as_str());
    }
}

/// A member that moves itself into a cgroup below its leaf (as an emulator run inside the tree
/// does) is still part of the tree: seen alive, killed by DELETE, the nested cgroup removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_in_a_nested_cgroup_stays_in_the_tree() {
    let Ok(emu) = emulator::start(EmulatorOptions { tracking: TrackingMode::CgroupV1, ..opts() }).await else {
        println!("skipped: no cgroup v1 pids and freezer hierarchies here");
        return;
    };
    let arg = unique_sleep(309);
    let sb = emu.create_sandbox_now();
    let mount = leaf_mount_v1();
    let script = format!(
        "p=$(sed -n 's/^[0-9]*:pids://p' /proc/self/cgroup); d={mount}$p/nested; \
         (mkdir \"$d\" && echo $BASHPID > \"$d/cgroup.procs\" && exec env -i setsid sleep {arg}) </dev/null >/dev/null 2>&1 & \
         wait_for=50; while [ ! -d \"$d\" ] && [ $wait_for -gt 0 ]; do sleep 0.02; wait_for=$((wait_for-1)); done; echo started"
    );
    let id = spawn_bash(&emu, &sb, &script).await;
    let path = format!("/sandboxes/{sb}/processes/{id}");
    let (s, w) = call(&emu, reqwest::Method::GET, &format!("{path}/wait?timeout_ms=5000"), None).await;
    assert_eq!((s, &w["data"]["exit_code"]), (200, &json!(0)), "{w}");
    let end = Instant::now() + Duration::from_secs(5);
    while sleepers(&arg).is_empty() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pids = sleepers(&arg);
    let nested = pids.first().and_then(|p| leaf_dir(*p, Tracking::CgroupV1));
    let (s, _) = call(&emu, reqwest::Method::GET, &format!("{path}/wait?scope=tree&timeout_ms=300"), None).await;
    let (d, v) = call(&emu, reqwest::Method::DELETE, &format!("{path}?grace_ms=100"), None).await;
    let left = sleepers(&arg);
    let end = Instant::now() + Duration::from_secs(5);
    while nested.as_ref().is_some_and(|n| n.exists()) && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let nested_left = nested.as_ref().is_some_and(|n| n.exists());
    emu.close().await;
    kill_pids(&left);
    assert_eq!(pids.len(), 1);
    let nested = nested.expect("the sleeper is in an emulator cgroup");
    assert!(nested.ends_with("nested"), "{}", nested.display());
    assert_eq!((s, d, &v["data"]["tree_exited"]), (408, 200, &json!(true)), "{v}");
    assert_eq!(left, Vec::<i32>::new(), "alive after DELETE");
    assert!(!nested_left, "the nested cgroup {} was not removed", nested.display());
}

fn leaf_mount_v1() -> String {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts
        .lines()
        .find_map(|m| {
            let f: Vec<&str> = m.split(' ').collect();
            (f[2] == "cgroup" && f[3].split(',').any(|o| o == "pids")).then(|| f[1].to_string())
        })
        .unwrap()
}
