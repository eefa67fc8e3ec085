//! Containment under pressure, against the real emulator, through the Rust core: one cleanup
//! deadline that holds (staged-file removal after the verdict, the in-flight creation inside
//! it), what one phase saw alive stays seen in every later cleanup path, a gate that may have
//! been written is never "not started", process lists that contradict themselves prove
//! nothing, a creation lost before any answer is sent again once the list proved nothing of
//! it runs. Each test asserts on what the caller got, on the emulator's request log (in order)
//! and on which processes are alive afterwards.

mod support;

use std::time::{Duration, Instant};

use createos_execute_core::abort::{Abort, Ctx};
use createos_execute_core::config::{parse_params, Config};
use createos_execute_core::error::{CleanupReason, Error, Operation};
use createos_execute_core::execute::{self, execute};
use createos_test_support::{assert_nothing_alive, assert_only_alive, unlimited, with_emulator, Emulator};
use reqwest::Method;
use serde_json::json;
use support::{as_full, cfg, count, fault, full, params, start_process, timed_out_run};

/// `METHOD route status` of every request that arrived in full, in the order received; the
/// query too for DELETE and wait.
fn log(emu: &Emulator) -> Vec<String> {
    emu.requests()
        .iter()
        .filter(|r| r.received_ms.is_some())
        .map(|r| match r.route {
            "deleteProcess" | "wait" | "listProcesses" => format!("{} {} {} {}", r.method, r.route, r.query, r.status),
            // The cancel file (see `script::cancel_path`) apart from the gate and the stdin.
            "putFile" if r.query.contains(".cancelled") => format!("{} putFile cancel {}", r.method, r.status),
            _ => format!("{} {} {}", r.method, r.route, r.status),
        })
        .collect()
}

/// Ends every process of `sb` the emulator knows (faults cleared first), and checks that
/// nothing is left alive.
async fn end_all(emu: &Emulator, c: &Config, sb: &str) {
    emu.clear_faults();
    let client = c.client().unwrap();
    let ctx = Ctx::cleanup(Duration::from_secs(10));
    let list = client
        .json(Operation::ProcessStatus, Method::GET, &format!("/sandboxes/{sb}/processes?limit=500"), None, &ctx)
        .await
        .unwrap();
    for p in list["processes"].as_array().unwrap() {
        let id = p["process_id"].as_str().unwrap();
        let path = format!("/sandboxes/{sb}/processes/{id}?grace_ms=0");
        let _ = client.json(Operation::ProcessCleanup, Method::DELETE, &path, None, &ctx).await;
    }
    assert_nothing_alive(emu).await;
}

/// Runs `script` with `stdin`, aborted as a timeout after `after`; returns the outcome and
/// how long after the abort it came.
async fn timed_out_with_stdin(
    c: &Config,
    sb: &str,
    script: &str,
    after: Duration,
) -> (Result<execute::ExecuteResult, Error>, Duration) {
    let abort = Abort::new();
    let a = abort.clone();
    let fired = std::sync::Arc::new(std::sync::Mutex::new(None));
    let f = fired.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        *f.lock().unwrap() = Some(Instant::now());
        a.abort(true);
    });
    let p = parse_params(&json!({ "sandboxId": sb, "command": "/bin/bash", "args": ["-c", script], "stdin": "x" }))
        .unwrap();
    let r = execute(c, &p, abort, None).await;
    let at = fired.lock().unwrap().expect("the abort fired");
    (r, at.elapsed())
}

// ---------------------------------------------------------------- one deadline that holds

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verdict_comes_within_the_deadline_when_delete_and_wait_answer_503_and_removal_hangs() {
    the_verdict_comes_within_the_deadline(json!({ "kind": "status", "status": 503 })).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verdict_comes_within_the_deadline_when_delete_and_wait_hang_and_removal_hangs() {
    the_verdict_comes_within_the_deadline(json!({ "kind": "delay", "ms": 60000 })).await;
}

/// DELETE and wait do `action` for good; the old code's file removal (`exec`) hangs.
async fn the_verdict_comes_within_the_deadline(action: serde_json::Value) {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        fault(&emu, json!({ "route": "deleteProcess", "action": action }));
        fault(&emu, json!({ "route": "wait", "action": action }));
        fault(&emu, json!({ "route": "exec", "action": { "kind": "delay", "ms": 60000 } }));
        let c = cfg(&emu, json!({ "cleanupDeadlineMs": 2000 }));
        let (r, after_abort) =
            timed_out_with_stdin(&c, &sb, "cat >/dev/null; sleep 300", Duration::from_millis(300)).await;
        let err = r.unwrap_err();
        let Error::Cleanup(report) = &err else { panic!("{err:?}") };
        assert_eq!(report.reason, CleanupReason::TerminationUnconfirmed);
        // The deadline plus a little slack, counted from the abort (the old code gave its
        // verdict after deadline + removal: about 4 s).
        assert!(after_abort < Duration::from_millis(3000), "verdict {after_abort:?} after the abort");
        assert!(count(&emu, "deleteProcess") >= 1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(count(&emu, "exec"), 0, "no file is removed while the process may still read it");
        let l = log(&emu);
        let delete = l.iter().position(|x| x.starts_with("DELETE deleteProcess")).expect("a DELETE");
        assert!(!l[delete..].iter().any(|x| x.starts_with("PUT putFile")), "nor cleared: {l:?}");
        assert!(!emu.live_pids().is_empty(), "the error was right: the process is alive");
        end_all(&emu, &c, &sb).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_file_removal_never_delays_a_proven_verdict() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        // The abort comes while the creation's answer is on its way: the DELETE may find the
        // script before its trap (a signal death), so the staged files are removed after the
        // verdict by one `/exec rm`. The removal hangs.
        fault(&emu, json!({ "route": "createProcess", "times": 1, "action": { "kind": "delay", "ms": 500 } }));
        fault(&emu, json!({ "route": "exec", "action": { "kind": "delay", "ms": 60000 } }));
        // The DELETE kills at once: the script can never remove its files itself.
        fault(&emu, json!({ "route": "deleteProcess", "action": { "kind": "killOnly" } }));
        let c = cfg(&emu, json!({ "cleanupDeadlineMs": 4000 }));
        let (r, after_abort) =
            timed_out_with_stdin(&c, &sb, "cat >/dev/null; sleep 300", Duration::from_millis(200)).await;
        // The removal never delays the verdict (it would have waited up to the deadline).
        assert!(after_abort < Duration::from_millis(3000), "verdict {after_abort:?} after the abort");
        let r = r.unwrap();
        assert!(r.timed_out);
        // A timeout whose tree was ended and proven gone says so.
        assert_eq!(r.tree_exited, Some(true));
        assert_nothing_alive(&emu).await;
        // The removal still goes out, after the proof.
        for _ in 0..150 {
            if count(&emu, "exec") >= 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let l = log(&emu);
        let delete = l.iter().position(|x| x.starts_with("DELETE deleteProcess")).expect("a DELETE");
        let exec: Vec<usize> =
            l.iter().enumerate().filter(|(_, x)| x.starts_with("POST exec")).map(|(i, _)| i).collect();
        assert_eq!(exec.len(), 1, "one removal: {l:?}");
        assert!(delete < exec[0], "{l:?}");
        // (Only requests that arrived in full count: the gate's held upload, abandoned unsent,
        // is a putFile record too.)
        assert_eq!(l.iter().filter(|x| x.starts_with("PUT putFile")).count(), 1, "the staging only: {l:?}");
        assert!(emu.live_pids().is_empty(), "no process of the call after its verdict");
        emu.clear_faults();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_while_the_creation_hangs_gets_its_verdict_within_the_deadline() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        // The creation's answer does not come within the request timeout (8 s).
        fault(&emu, json!({ "route": "createProcess", "times": 1, "action": { "kind": "delay", "ms": 20000 } }));
        let c = cfg(&emu, json!({ "cleanupDeadlineMs": 2000 }));
        let started = Instant::now();
        let r = timed_out_run(&c, &sb, "echo never", Duration::from_millis(300)).await;
        let elapsed = started.elapsed();
        // The old code waited for the answer up to the request timeout first (about 8 s).
        assert!(elapsed < Duration::from_millis(300 + 2000 + 1000), "verdict after {elapsed:?}");
        let r = r.unwrap();
        assert!(r.timed_out);
        assert_eq!(r.stdout, "");
        let l = log(&emu);
        assert_eq!(
            l,
            vec!["POST createProcess 0", "GET listProcesses limit=500&offset=0 200", "PUT putFile cancel 200"],
            "still unanswered; the list proved nothing of it runs, and the attempt is cancelled"
        );
        assert_eq!(count(&emu, "connect"), 0);
    })
    .await;
}

// ---------------------------------------------------------------- what was seen stays seen

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_error_path_knows_the_exit_frame_said_alive() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        // The data frame is left out (the exit frame then says more was written), the replay
        // is evicted, and DELETE forgets the process.
        fault(&emu, json!({ "route": "connect", "times": 1, "action": { "kind": "gapAfterFrames", "frames": 0 } }));
        fault(&emu, json!({ "route": "connect", "skip": 1, "action": { "kind": "status", "status": 410 } }));
        fault(&emu, json!({ "route": "deleteProcess", "action": { "kind": "status", "status": 404 } }));
        let c = cfg(&emu, json!({}));
        let err = execute(&c, &params(&sb, "sleep 300 & echo tag"), Abort::new(), None).await.unwrap_err();
        let Error::Cleanup(report) = &err else { panic!("an ordinary error while sleep 300 lives: {err:?}") };
        assert_eq!(report.reason, CleanupReason::TerminationUnconfirmed);
        let steps: Vec<_> = report.attempts.iter().map(|a| (a.step, a.outcome.as_str())).collect();
        assert_eq!(steps, vec![("delete", "HTTP 404 after alive")]);
        let l = log(&emu);
        assert_eq!(l[l.len() - 1], "DELETE deleteProcess grace_ms=1000 404", "{l:?}");
        assert_eq!(count(&emu, "connect"), 2);
        assert!(!emu.live_pids().is_empty(), "the error was right: sleep 300 is alive");
        end_all(&emu, &c, &sb).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_during_a_slow_replay_knows_the_exit_frame_said_alive() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        fault(&emu, json!({ "route": "connect", "times": 1, "action": { "kind": "gapAfterFrames", "frames": 0 } }));
        fault(&emu, json!({ "route": "connect", "skip": 1, "action": { "kind": "delay", "ms": 5000 } }));
        fault(&emu, json!({ "route": "deleteProcess", "action": { "kind": "status", "status": 404 } }));
        let c = cfg(&emu, json!({}));
        let err = timed_out_run(&c, &sb, "sleep 300 & echo tag", Duration::from_millis(1000)).await.unwrap_err();
        let Error::Cleanup(report) = &err else { panic!("timedOut while sleep 300 lives: {err:?}") };
        assert_eq!(report.reason, CleanupReason::TerminationUnconfirmed);
        assert_eq!(report.attempts[0].outcome, "HTTP 404 after alive");
        assert!(!emu.live_pids().is_empty(), "the error was right: sleep 300 is alive");
        end_all(&emu, &c, &sb).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_408_from_the_tree_wait_makes_a_later_404_no_proof() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        // Every stream opens and breaks at once; the exit recovery hears "still running"
        // until it gives up; DELETE forgets the process.
        fault(&emu, json!({ "route": "connect", "action": { "kind": "dropAfterFrames", "frames": 0 } }));
        fault(&emu, json!({ "route": "wait", "action": { "kind": "status", "status": 408 } }));
        fault(&emu, json!({ "route": "deleteProcess", "action": { "kind": "status", "status": 404 } }));
        let c = cfg(&emu, json!({}));
        let err = execute(&c, &params(&sb, "sleep 300"), Abort::new(), None).await.unwrap_err();
        let Error::Cleanup(report) = &err else { panic!("an ordinary error while sleep 300 lives: {err:?}") };
        assert_eq!(report.reason, CleanupReason::TerminationUnconfirmed);
        assert_eq!(report.attempts[0].outcome, "HTTP 404 after alive");
        let l = log(&emu);
        let first_wait = l.iter().position(|x| x.starts_with("GET wait")).expect("the exit was recovered");
        let delete = l.iter().position(|x| x.starts_with("DELETE")).expect("a DELETE");
        assert!(first_wait < delete, "{l:?}");
        assert!(!emu.live_pids().is_empty(), "the error was right: sleep 300 is alive");
        end_all(&emu, &c, &sb).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_list_entry_makes_a_later_404_no_proof_in_the_recovery() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        // The process is created (it waits on its gate: alive) and the answer is lost; the
        // list shows it alive; DELETE forgets it.
        fault(&emu, json!({ "route": "createProcess", "times": 1, "action": { "kind": "status", "status": 502, "afterHandler": true } }));
        fault(&emu, json!({ "route": "deleteProcess", "action": { "kind": "status", "status": 404 } }));
        let c = cfg(&emu, json!({}));
        let err = execute(&c, &params(&sb, "echo never"), Abort::new(), None).await.unwrap_err();
        let Error::Cleanup(report) = &err else { panic!("an ordinary 502 while ours is alive: {err:?}") };
        assert_eq!(report.reason, CleanupReason::TerminationUnconfirmed);
        let id = emu.requests().into_iter().find(|q| q.route == "deleteProcess").unwrap().path;
        assert!(id.ends_with(report.process_id.as_deref().unwrap()), "reported by id");
        let l = as_full(&emu, log(&emu));
        assert_eq!(
            l,
            vec![
                "POST createProcess 502",
                "GET listProcesses limit=500&offset=0 200",
                "DELETE deleteProcess grace_ms=1000 404"
            ]
        );
        assert!(!emu.live_pids().is_empty(), "the error was right: ours is alive");
        end_all(&emu, &c, &sb).await;
    })
    .await;
}

// ---------------------------------------------------------------- "not started" means not written

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_written_then_answered_500_is_not_not_started() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        // The only upload is the gate's: it is written, then 500 is answered.
        fault(&emu, json!({ "route": "putFile", "times": 1, "action": { "kind": "status", "status": 500, "afterHandler": true } }));
        let c = cfg(&emu, json!({}));
        let err = execute(&c, &params(&sb, "sleep 300"), Abort::new(), None).await.unwrap_err();
        assert!(!matches!(err, Error::NotStarted), "the command may have run: {err:?}");
        assert!(matches!(err, Error::Api { status: 500, op: Operation::FileTransfer }), "{err:?}");
        let l = log(&emu);
        let put = l.iter().position(|x| x == "PUT putFile 500").expect("the gate upload");
        let delete = l.iter().position(|x| x.starts_with("DELETE deleteProcess")).expect("the process was ended");
        assert!(put < delete, "{l:?}");
        assert!(l[delete].ends_with(" 200"), "{l:?}");
        assert_nothing_alive(&emu).await;
    })
    .await;
}

// ---------------------------------------------------------------- conclusive lists

/// Three processes that are not ours, an empty request log, and a creation that is applied
/// but answered 502 (so `execute` must recover it from the list). Returns the pids of the three.
async fn three_others_and_a_lost_creation(emu: &Emulator, c: &Config, sb: &str) -> Vec<i32> {
    for _ in 0..3 {
        start_process(c, sb, "/bin/sleep", json!(["30"])).await;
    }
    let others = emu.live_pids();
    assert_eq!(others.len(), 3, "{others:?}");
    emu.clear_requests();
    fault(
        emu,
        json!({ "route": "createProcess", "times": 1, "action": { "kind": "status", "status": 502, "afterHandler": true } }),
    );
    others
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_that_ignores_offset_proves_nothing() {
    with_emulator(full(), |emu| async move {
        let sb = emu.create_sandbox_now();
        let c = cfg(&emu, json!({}));
        let others = three_others_and_a_lost_creation(&emu, &c, &sb).await;
        fault(&emu, json!({ "route": "listProcesses", "action": { "kind": "pageSize", "limit": 2 } }));
        fault(&emu, json!({ "route": "listProcesses", "action": { "kind": "ignoreOffset" } }));
        let err = execute(&c, &params(&sb, "echo never"), Abort::new(), None).await.unwrap_err();
        let Error::Cleanup(report) = &err else { panic!("a repeated page taken as the whole list: {err:?}") };
        assert_eq!(report.reason, CleanupReason::CreationUnconfirmed);
        assert_eq!(report.attempts.last().map(|a| a.outcome.as_str()), Some("inconsistent pages"));
        assert_eq!(
            log(&emu),
            vec![
                "POST createProcess 502",
                "GET listProcesses limit=500&offset=0 200",
                "GET listProcesses limit=500&offset=2 200"
            ]
        );
        // The three others, and ours (its script waits on its gate, with a `sleep` child now
        // and then, so it is one pid or two).
        let live = emu.live_pids();
        assert!(others.iter().all(|p| live.contains(p)), "{others:?} {live:?}");
        assert!(live.len() > others.len(), "the error was right: ours (on the third page) is alive");
        end_all(&emu, &c, &sb).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_capped_without_a_total_is_read_to_an_empty_page() {
    with_emulator(full(), |emu| async move {
        let sb = emu.create_sandbox_now();
        let c = cfg(&emu, json!({}));
        let others = three_others_and_a_lost_creation(&emu, &c, &sb).await;
        fault(&emu, json!({ "route": "listProcesses", "action": { "kind": "pageSize", "limit": 2, "noTotal": true } }));
        let err = execute(&c, &params(&sb, "echo never"), Abort::new(), None).await.unwrap_err();
        assert!(matches!(err, Error::Api { status: 502, .. }), "{err:?}");
        let l = log(&emu);
        assert_eq!(
            &l[..5],
            &[
                "POST createProcess 502",
                "GET listProcesses limit=500&offset=0 200",
                "GET listProcesses limit=500&offset=2 200",
                "GET listProcesses limit=500&offset=4 200",
                "DELETE deleteProcess grace_ms=1000 200",
            ],
            "ours, on the second page, was found and ended"
        );
        assert_only_alive(&emu, &others).await;
        end_all(&emu, &c, &sb).await;
    })
    .await;
}

// ---------------------------------------------------------------- a creation lost before any answer

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_lost_before_any_answer_is_sent_again_once_the_list_proves_nothing_runs() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        let c = cfg(&emu, json!({}));
        // Not handled: the connection just closes.
        fault(&emu, json!({ "route": "createProcess", "times": 1, "action": { "kind": "dropConnection" } }));
        let r = execute(&c, &params(&sb, "echo hi"), Abort::new(), None).await.unwrap();
        assert_eq!((r.exit_code, r.stdout.to_string().as_str()), (Some(0), "hi\n"));
        let l = as_full(&emu, log(&emu));
        assert_eq!(
            &l[..4],
            &[
                "POST createProcess 0",
                "PUT putFile cancel 200",
                "GET listProcesses limit=500&offset=0 200",
                "POST createProcess 201"
            ]
        );
        // Handled, then the connection closes: the list finds it, it is ended, and sent again.
        emu.clear_requests();
        fault(&emu, json!({ "route": "createProcess", "times": 1, "action": { "kind": "dropConnection", "afterHandler": true } }));
        let r = execute(&c, &params(&sb, "echo again"), Abort::new(), None).await.unwrap();
        assert_eq!((r.exit_code, r.stdout.to_string().as_str()), (Some(0), "again\n"));
        let l = as_full(&emu, log(&emu));
        assert_eq!(
            &l[..5],
            &[
                "POST createProcess 0",
                "PUT putFile cancel 200",
                "GET listProcesses limit=500&offset=0 200",
                "DELETE deleteProcess grace_ms=1000 200",
                "POST createProcess 201"
            ]
        );
        assert_eq!(count(&emu, "connect"), 1, "only the second process ran");
        assert_nothing_alive(&emu).await;
        // Bounded: a connection that always dies fails the command after two retries.
        emu.clear_requests();
        fault(&emu, json!({ "route": "createProcess", "action": { "kind": "dropConnection" } }));
        let err = execute(&c, &params(&sb, "echo never"), Abort::new(), None).await.unwrap_err();
        assert!(matches!(err, Error::Connection { .. }), "{err:?}");
        assert_eq!(count(&emu, "createProcess"), 3);
        assert_nothing_alive(&emu).await;
    })
    .await;
}

// ---------------------------------------------------------------- small facts

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destroy_refused_by_a_final_answer_names_its_status() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        fault(&emu, json!({ "route": "deleteSandbox", "action": { "kind": "status", "status": 401 } }));
        let err = execute::destroy_sandbox(&cfg(&emu, json!({})), &sb).await.unwrap_err();
        let Error::DestroyUnconfirmed(report) = &err else { panic!("{err:?}") };
        assert_eq!(report.status, Some(401));
        assert_eq!(err.to_string(), "CreateOS sandbox destruction could not be confirmed (HTTP 401).");
        assert_eq!(count(&emu, "deleteSandbox"), 1);
    })
    .await;
}
