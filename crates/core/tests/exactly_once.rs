//! At most once, against the emulator's documented profile (an unpaged process list without
//! `total`, exit frames without `newest_seq`): a creation the server applies late never runs
//! the command and ends itself; a lost creation in a sandbox that already ran commands is sent
//! again or found and ended; staged files never stay behind; a finished command stays finished.
//! Each test asserts on what the caller got, on the emulator's request log (in order), on what
//! the command left in the file system, and on which processes are alive afterwards.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use createos_execute_core::abort::{Abort, Ctx};
use createos_execute_core::config::{parse_params, Config};
use createos_execute_core::error::{Error, Operation};
use createos_execute_core::execute::execute;
use createos_test_support::{assert_nothing_alive, unlimited, with_emulator, Emulator, EmulatorOptions, Profile};
use reqwest::Method;
use serde_json::{json, Value};
use support::{cfg, fault, params, timed_out_run};

fn documented() -> EmulatorOptions {
    EmulatorOptions { profile: Some(Profile::Documented), ..unlimited() }
}

/// `METHOD route status` of every request that arrived in full, in order; the query too for
/// the list, and the cancel file apart from the other uploads.
fn log(emu: &Emulator) -> Vec<String> {
    emu.requests()
        .iter()
        .filter(|r| r.received_ms.is_some())
        .map(|r| match r.route {
            "listProcesses" | "deleteProcess" => format!("{} {} {} {}", r.method, r.route, r.query, r.status),
            "putFile" if r.query.contains(".cancelled") => format!("PUT putFile cancel {}", r.status),
            _ => format!("{} {} {}", r.method, r.route, r.status),
        })
        .collect()
}

/// A file name no other test uses: the command appends a line to it each time it runs.
fn ran_file() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("/tmp/exact-ran-{}-{nanos}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

fn runs(file: &str) -> usize {
    std::fs::read_to_string(file).map(|s| s.lines().count()).unwrap_or(0)
}

/// The call's token (`/tmp/createos-start-<token>`), from its gate upload in the request log.
fn tokens(emu: &Emulator) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in emu.requests().iter().filter(|r| r.route == "putFile") {
        let Some((i, n)) =
            ["createos-start-", "createos-stdin-"].iter().find_map(|p| Some((r.query.find(p)?, p.len())))
        else {
            continue;
        };
        let t: String = r.query[i + n..].chars().take_while(char::is_ascii_alphanumeric).collect();
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

/// The staged files of a call's token still in `/tmp`: its gate, claim and staged stdin (the
/// cancel file stays by design: a creation applied late must still find it; it holds a number).
fn staged_files(token: &str) -> Vec<String> {
    std::fs::read_dir("/tmp")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains(token) && !n.ends_with(".cancelled"))
        .collect()
}

/// Removes what a call of `token` may leave in `/tmp` (the test's own housekeeping).
fn remove_call_files(token: &str) {
    for name in [
        format!("createos-start-{token}"),
        format!("createos-start-{token}.claimed"),
        format!("createos-start-{token}.cancelled"),
        format!("createos-stdin-{token}"),
    ] {
        let _ = std::fs::remove_file(format!("/tmp/{name}"));
    }
}

/// Waits (up to 10 s) until no staged file of `token` remains; returns what remains.
async fn staged_files_after(token: &str) -> Vec<String> {
    for _ in 0..500 {
        if staged_files(token).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    staged_files(token)
}

/// Waits until nothing the emulator started is alive, at most until `by`; then asserts it.
async fn nothing_alive_by(emu: &Emulator, by: Instant) {
    while !emu.live_pids().is_empty() && Instant::now() < by {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(emu.live_pids(), Vec::<i32>::new(), "alive when they must be gone");
}

/// Waits (up to 10 s) until every late creation in the log was applied.
async fn late_creations_applied(emu: &Emulator, want: usize) {
    for _ in 0..500 {
        if emu.requests().iter().filter(|r| r.applied_ms.is_some()).count() >= want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the late creations were never applied");
}

/// The process list of `sb` (the documented profile gives it whole).
async fn processes(c: &Config, sb: &str) -> Vec<Value> {
    let client = c.client().unwrap();
    let ctx = Ctx::cleanup(Duration::from_secs(10));
    let list = client
        .json(Operation::ProcessStatus, Method::GET, &format!("/sandboxes/{sb}/processes"), None, &ctx)
        .await
        .unwrap();
    list["processes"].as_array().unwrap().clone()
}

/// Milliseconds of the day of an RFC 3339 time `…THH:MM:SS.mmmZ`.
fn ms_of_day(t: &str) -> f64 {
    let time = t.split('T').nth(1).unwrap().trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: f64 = parts.next().unwrap().parse().unwrap();
    let m: f64 = parts.next().unwrap().parse().unwrap();
    let s: f64 = parts.next().unwrap().parse().unwrap();
    ((h * 60.0 + m) * 60.0 + s) * 1000.0
}

async fn earlier_commands(c: &Config, sb: &str) {
    for i in 0..2 {
        let r = execute(c, &params(sb, &format!("echo earlier {i}")), Abort::new(), None).await.unwrap();
        assert_eq!(r.exit_code, Some(0));
    }
}

// ---------------------------------------------------------------- late creations

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_applied_after_the_recovery_list_never_runs_the_command_twice() {
    with_emulator(documented(), |emu| Box::pin(async move {
        let sb = emu.create_sandbox_now();
        let c = cfg(&emu, json!({}));
        earlier_commands(&c, &sb).await;
        for round in 0..50 {
            emu.clear_requests();
            // The first creation's connection is cut before it is applied; the server applies
            // it right after it answered the recovery list (which does not show it).
            fault(
                &emu,
                json!({ "route": "createProcess", "times": 1, "action": { "kind": "applyLate", "afterList": true } }),
            );
            let file = ran_file();
            let r = execute(&c, &params(&sb, &format!("echo run >> {file}; echo done")), Abort::new(), None).await;
            let settled = Instant::now();
            let r = r.unwrap_or_else(|e| panic!("round {round}: {e:?}"));
            assert_eq!((r.exit_code, r.stdout.to_string().as_str()), (Some(0), "done\n"), "round {round}");
            let l = log(&emu);
            // The unpaged list: short, then the same again at the next offset (conclusive), or
            // with the late process already on it (found, and ended). Either way the lost
            // attempt is cancelled before the creation is sent again.
            // The lost attempt is cancelled first (a process of it found on the list then
            // leaves the staged files to the next attempt), then the list is read.
            assert_eq!(
                &l[..3],
                &["POST createProcess 0", "PUT putFile cancel 200", "GET listProcesses limit=500&offset=0 200"][..],
                "{l:?}"
            );
            assert!(l[3].starts_with("GET listProcesses limit=500&offset=") && l[3].ends_with(" 200"), "{l:?}");
            let mut rest = l[4..].iter().skip_while(|x| x.starts_with("DELETE deleteProcess") && x.ends_with(" 200"));
            assert_eq!(rest.next().map(String::as_str), Some("POST createProcess 201"), "{l:?}");
            late_creations_applied(&emu, 1).await;
            nothing_alive_by(&emu, settled + Duration::from_secs(1)).await;
            assert_eq!(runs(&file), 1, "round {round}: the command ran exactly once");
            let _ = std::fs::remove_file(&file);
            // The late process ran nothing: it exited as cancelled.
            let token = &tokens(&emu)[0];
            let late: Vec<Value> = processes(&c, &sb)
                .await
                .into_iter()
                .filter(|p| {
                    p["args"][1]
                        .as_str()
                        .is_some_and(|a| a.starts_with("__cos_attempt=1\n") && a.contains(token.as_str()))
                })
                .collect();
            assert_eq!(late.len(), 1, "round {round}: {late:?}");
            // Cancelled (124: by the cancel file, or by it when the recovery's DELETE came), or
            // ended by that DELETE before its script ran (a signal).
            let how = (late[0]["exit_code"].as_i64(), late[0]["signal"].as_str());
            assert!(matches!(how, (Some(124), _) | (_, Some(_))), "round {round}: {}", late[0]);
            // Only the cancel file stays (it holds no data).
            assert_eq!(staged_files_after(token).await, Vec::<String>::new());
            remove_call_files(token);
        }
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_held_past_the_verdict_and_applied_late_ends_itself_without_running() {
    with_emulator(documented(), |emu| Box::pin(async move {
        const N: usize = 20;
        let c = cfg(&emu, json!({ "cleanupDeadlineMs": 2000 }));
        let sbs: Vec<String> = (0..N).map(|_| emu.create_sandbox_now()).collect();
        // Every creation's answer is held 2.5 s; it is applied then, whether or not the client
        // is still there.
        fault(&emu, json!({ "route": "createProcess", "times": N, "action": { "kind": "applyLate", "ms": 2500, "hold": true } }));
        let files: Vec<String> = (0..N).map(|_| ran_file()).collect();
        let calls = sbs.iter().zip(&files).map(|(sb, file)| {
            let c = &c;
            async move { timed_out_run(c, sb, &format!("echo run >> {file}"), Duration::from_millis(300)).await }
        });
        let results = futures_util::future::join_all(calls).await;
        for r in results {
            let r = r.unwrap_or_else(|e| panic!("a verdict that is not true: {e:?}"));
            assert!(r.timed_out);
        }
        let l = log(&emu);
        assert_eq!(l.iter().filter(|x| x.starts_with("PUT putFile cancel 200")).count(), N, "{l:?}");
        assert_eq!(l.iter().filter(|x| x.starts_with("POST createProcess")).count(), N, "never sent again");
        assert!(!l.iter().any(|x| x.starts_with("DELETE")), "nothing was there to end: {l:?}");
        late_creations_applied(&emu, N).await;
        assert_nothing_alive(&emu).await;
        for (sb, file) in sbs.iter().zip(&files) {
            let ps = processes(&c, sb).await;
            assert_eq!(ps.len(), 1, "{ps:?}");
            let p = &ps[0];
            assert_eq!(p["exit_code"], 124, "cancelled: {p}");
            let life = ms_of_day(p["finished_at"].as_str().unwrap()) - ms_of_day(p["created_at"].as_str().unwrap());
            assert!((0.0..1000.0).contains(&life), "the late process lived {life} ms");
            assert_eq!(runs(file), 0, "the command never ran");
        }
        for t in tokens(&emu) {
            remove_call_files(&t);
        }
    }))
    .await;
}

// ---------------------------------------------------------------- lost creations, unpaged list

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_creations_in_a_used_sandbox_under_an_unpaged_list() {
    with_emulator(documented(), |emu| Box::pin(async move {
        let sb = emu.create_sandbox_now();
        let c = cfg(&emu, json!({}));
        earlier_commands(&c, &sb).await;

        // Cut before it was applied: nothing exists, the list (short, then the same again)
        // proves it, the attempt is cancelled, and the creation is sent again.
        emu.clear_requests();
        fault(&emu, json!({ "route": "createProcess", "times": 1, "action": { "kind": "dropConnection" } }));
        let file = ran_file();
        let r = execute(&c, &params(&sb, &format!("echo run >> {file}")), Abort::new(), None).await.unwrap();
        assert_eq!(r.exit_code, Some(0));
        assert_eq!(runs(&file), 1);
        assert_eq!(
            &log(&emu)[..5],
            &[
                "POST createProcess 0",
                "PUT putFile cancel 200",
                "GET listProcesses limit=500&offset=0 200",
                "GET listProcesses limit=500&offset=2 200",
                "POST createProcess 201",
            ][..]
        );
        assert_nothing_alive(&emu).await;

        // Applied, then cut: found on the page, ended, and sent again.
        emu.clear_requests();
        fault(&emu, json!({ "route": "createProcess", "times": 1, "action": { "kind": "dropConnection", "afterHandler": true } }));
        let file = ran_file();
        let r = execute(&c, &params(&sb, &format!("echo run >> {file}")), Abort::new(), None).await.unwrap();
        assert_eq!(r.exit_code, Some(0));
        assert_eq!(runs(&file), 1);
        let l = log(&emu);
        assert_eq!(
            &l[..3],
            &["POST createProcess 0", "PUT putFile cancel 200", "GET listProcesses limit=500&offset=0 200"][..]
        );
        assert!(l[3].starts_with("GET listProcesses limit=500&offset=4 200"), "{l:?}");
        assert!(l[4].starts_with("DELETE deleteProcess"), "{l:?}");
        assert!(l.iter().any(|x| x == "POST createProcess 201"), "{l:?}");
        assert_nothing_alive(&emu).await;

        // Applied, then answered 502: found, ended and proven gone; an ordinary error.
        emu.clear_requests();
        fault(&emu, json!({ "route": "createProcess", "times": 1, "action": { "kind": "status", "status": 502, "afterHandler": true } }));
        let file = ran_file();
        let err = execute(&c, &params(&sb, &format!("echo run >> {file}")), Abort::new(), None).await.unwrap_err();
        assert!(matches!(err, Error::Api { status: 502, .. }), "{err:?}");
        let l = log(&emu);
        assert_eq!(l[0], "POST createProcess 502");
        let delete = l.iter().position(|x| x.starts_with("DELETE deleteProcess")).expect("ours was ended");
        assert!(l[delete].ends_with(" 200"), "{l:?}");
        assert!(!l.iter().any(|x| x.starts_with("PUT putFile cancel")), "its fate is known: {l:?}");
        assert_nothing_alive(&emu).await;
        assert_eq!(runs(&file), 0);
        for t in tokens(&emu) {
            remove_call_files(&t);
        }
    }))
    .await;
}

// ---------------------------------------------------------------- staged files

/// Runs `script` with stdin in a sandbox whose login shell takes 1 s to start (so the call
/// ends before the script reached its gate), and returns the call's token.
async fn staged_run(
    emu: &Emulator,
    c: &Config,
    sb: &str,
    script: &str,
    abort_after: Option<Duration>,
) -> (String, Result<createos_execute_core::execute::ExecuteResult, Error>) {
    emu.clear_requests();
    let p =
        parse_params(&json!({ "sandboxId": sb, "command": "/bin/bash", "args": ["-c", script], "stdin": "secret" }))
            .unwrap();
    let abort = Abort::new();
    if let Some(after) = abort_after {
        let a = abort.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            a.abort(true);
        });
    }
    let r = execute(c, &p, abort, None).await;
    (tokens(emu).pop().expect("the gate was uploaded"), r)
}

/// The requests of the last call, in order (`METHOD kind status`).
fn positions(l: &[String], prefix: &str) -> Vec<usize> {
    l.iter().enumerate().filter(|(_, x)| x.starts_with(prefix)).map(|(i, _)| i).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_staged_file_remains_after_a_stream_error_a_timeout_or_a_success() {
    with_emulator(documented(), |emu| {
        Box::pin(async move {
            let sb = emu.create_sandbox_now();
            let c = cfg(&emu, json!({}));
            let client = c.client().unwrap();
            let slow_login = bytes::Bytes::from_static(b"sleep 1\n");
            client
                .put_file(&sb, "/workspace/.bash_profile", slow_login, &Ctx::cleanup(Duration::from_secs(5)))
                .await
                .unwrap();

            // A stream error while the script is still starting (its login shell): the DELETE's
            // SIGTERM ends it before it could remove anything, so one `/exec rm` does, after the
            // process was proven gone.
            fault(&emu, json!({ "route": "connect", "times": 1, "action": { "kind": "errorFrame", "error": "boom" } }));
            let (token, r) = staged_run(&emu, &c, &sb, "cat", None).await;
            assert!(matches!(r, Err(Error::Protocol(_))), "{r:?}");
            assert_eq!(staged_files_after(&token).await, Vec::<String>::new(), "after a stream error: {:?}", log(&emu));
            assert_nothing_alive(&emu).await;
            let l = log(&emu);
            let delete = positions(&l, "DELETE");
            let exec = positions(&l, "POST exec");
            assert!(!delete.is_empty() && exec.len() == 1 && delete[0] < exec[0], "removed once proven gone: {l:?}");

            // A timeout while the script is still starting: the same.
            let (token, r) = staged_run(&emu, &c, &sb, "cat", Some(Duration::from_millis(300))).await;
            assert!(r.unwrap().timed_out);
            assert_eq!(staged_files_after(&token).await, Vec::<String>::new(), "after a timeout");
            assert_nothing_alive(&emu).await;
            assert_eq!(positions(&log(&emu), "POST exec").len(), 1);

            // A success: the script removed them itself; nothing more is sent.
            let (token, r) = staged_run(&emu, &c, &sb, "cat", None).await;
            assert_eq!(r.unwrap().stdout.to_string(), "secret");
            assert_eq!(staged_files(&token), Vec::<String>::new(), "after a success");
            assert!(!log(&emu).iter().any(|x| x.starts_with("POST exec")));
            assert_nothing_alive(&emu).await;

            // The rest needs the injected panic (a failure that leaves the gate shut).
            if !cfg!(feature = "test-hooks") {
                return;
            }
            // At its gate (a fast login; the DELETE comes 300 ms after a failure that leaves the
            // gate shut): the script takes the DELETE's SIGTERM, removes its files itself and
            // says so in its exit status, so no `/exec` is sent.
            let sb2 = emu.create_sandbox_now();
            let failing = cfg(&emu, json!({ "__panicAt": "create" }));
            fault(&emu, json!({ "route": "deleteProcess", "times": 1, "action": { "kind": "delay", "ms": 300 } }));
            let (token, r) = staged_run(&emu, &failing, &sb2, "cat", None).await;
            assert!(r.is_err(), "{r:?}");
            assert_eq!(staged_files(&token), Vec::<String>::new(), "removed by the script at its gate");
            tokio::time::sleep(Duration::from_millis(300)).await;
            let l = log(&emu);
            assert!(!l.iter().any(|x| x.starts_with("POST exec")), "{l:?}");
            assert_nothing_alive(&emu).await;

            // A server whose DELETE sends SIGKILL at once: nothing could run in the script, so
            // the `/exec rm` removes them.
            fault(&emu, json!({ "route": "deleteProcess", "times": 1, "action": { "kind": "killOnly" } }));
            fault(&emu, json!({ "route": "deleteProcess", "times": 1, "action": { "kind": "delay", "ms": 300 } }));
            let (token, r) = staged_run(&emu, &failing, &sb2, "cat", None).await;
            assert!(r.is_err(), "{r:?}");
            assert_eq!(staged_files_after(&token).await, Vec::<String>::new(), "after a SIGKILL");
            let l = log(&emu);
            let (delete, exec) = (positions(&l, "DELETE"), positions(&l, "POST exec"));
            assert!(!delete.is_empty() && exec.len() == 1 && delete[0] < exec[0], "{l:?}");
            assert_nothing_alive(&emu).await;
        })
    })
    .await;
}

// ---------------------------------------------------------------- a finished command

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_command_stays_finished_when_its_record_cannot_be_read() {
    with_emulator(documented(), |emu| {
        Box::pin(async move {
            let sb = emu.create_sandbox_now();
            // Exit frames without `newest_seq` (documented profile); the record that would say it
            // fails once the exit frame was sent.
            fault(
                &emu,
                json!({ "route": "getProcess", "afterExitFrame": true, "action": { "kind": "status", "status": 500 } }),
            );
            let c = cfg(&emu, json!({}));
            let r = execute(&c, &params(&sb, "echo hi"), Abort::new(), None).await.unwrap();
            assert_eq!((r.exit_code, r.stdout.to_string().as_str()), (Some(0), "hi\n"));
            assert_eq!(r.tree_exited, None, "unverified, and said so");
            let l = log(&emu);
            assert!(l.iter().any(|x| x == "GET getProcess 500"), "{l:?}");
            assert!(!l.iter().any(|x| x.starts_with("DELETE")), "{l:?}");
            assert_nothing_alive(&emu).await;
            // With 'terminate' the DELETE proves the tree gone: true.
            emu.clear_requests();
            let c = cfg(&emu, json!({ "leftoverProcesses": "terminate" }));
            let r = execute(&c, &params(&sb, "echo hi"), Abort::new(), None).await.unwrap();
            assert_eq!((r.exit_code, r.tree_exited), (Some(0), Some(true)));
            assert!(log(&emu).iter().any(|x| x.starts_with("DELETE deleteProcess") && x.ends_with(" 200")));
            assert_nothing_alive(&emu).await;
        })
    })
    .await;
}
