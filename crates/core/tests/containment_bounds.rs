//! Containment you can bound and trust (issue 11), against the real emulator, through the Rust
//! core. Each test asserts on what the caller got, on the emulator's request log and on which
//! processes are alive afterwards.

mod support;

use std::time::{Duration, Instant};

use createos_execute_core::abort::Abort;
use createos_execute_core::error::{CleanupReason, Error};
use createos_execute_core::execute::{self, execute, FollowEvent};
use createos_execute_core::follow::SEQUENCE_GAP;
use createos_test_support::{
    assert_nothing_alive, assert_only_alive, unlimited, with_emulator, Emulator, EmulatorOptions,
};
use serde_json::json;
use support::{cfg, count, fault, full, params, start_process, timed_out_run};

/// `METHOD route query status` of every request of `route`.
fn of(emu: &Emulator, route: &str) -> Vec<String> {
    emu.requests()
        .iter()
        .filter(|r| r.route == route)
        .map(|r| format!("{} {} {} {}", r.method, r.route, r.query, r.status))
        .collect()
}

// ---------------------------------------------------------------- panic safety, Retry-After

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_or_malformed_retry_after_on_the_cleanup_delete_is_ridden_out_not_a_panic() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        let huge = "Sun, 06 Nov 400000000000 08:49:37 GMT";
        let day00 = "Sun, 00 Nov 1994 08:49:37 GMT";
        fault(&emu, json!({ "route": "deleteProcess", "times": 1, "action": { "kind": "status", "status": 429, "retryAfter": huge } }));
        fault(&emu, json!({ "route": "deleteProcess", "skip": 1, "times": 1, "action": { "kind": "status", "status": 429, "retryAfter": day00 } }));
        let r = timed_out_run(&cfg(&emu, json!({})), &sb, "echo up; sleep 30", Duration::from_millis(400)).await.unwrap();
        assert!(r.timed_out);
        assert_eq!(r.stdout, "up\n");
        let deletes = of(&emu, "deleteProcess");
        assert_eq!(deletes.len(), 3, "{deletes:?}");
        assert!(deletes[0].ends_with(" 429") && deletes[1].ends_with(" 429") && deletes[2].ends_with(" 200"), "{deletes:?}");
        assert_nothing_alive(&emu).await;
    })
    .await;
}

#[cfg(feature = "test-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_while_following_or_after_creation_still_ends_the_process() {
    with_emulator(unlimited(), |emu| async move {
        for phase in ["follow", "create"] {
            emu.clear_requests();
            let sb = emu.create_sandbox_now();
            let c = cfg(&emu, json!({ "__panicAt": phase }));
            let err = execute(&c, &params(&sb, "echo up; sleep 30"), Abort::new(), None).await.unwrap_err();
            assert!(matches!(err, Error::Internal(_)), "{phase}: {err:?}");
            assert_eq!(err.to_string(), "createos-execute internal error: a panic in native code.");
            let deletes = of(&emu, "deleteProcess");
            assert_eq!(deletes.len(), 1, "{phase}: {deletes:?}");
            assert!(deletes[0].ends_with(" 200"), "{deletes:?}");
            assert_nothing_alive(&emu).await;
        }
    })
    .await;
}

#[cfg(feature = "test-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_cleanup_is_termination_unconfirmed() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        let c = cfg(&emu, json!({ "__panicAt": "cleanup" }));
        let err = timed_out_run(&c, &sb, "sleep 30", Duration::from_millis(300)).await.unwrap_err();
        let Error::Cleanup(report) = &err else { panic!("{err:?}") };
        assert_eq!(report.reason, CleanupReason::TerminationUnconfirmed);
        assert!(report.process_id.is_some());
        assert_eq!((report.attempts[0].step, report.attempts[0].outcome.as_str()), ("internal", "panic"));
        assert_eq!(count(&emu, "deleteProcess"), 0, "the panic came before any DELETE");
        assert!(!emu.live_pids().is_empty(), "the verdict is honest: the tree is really alive");
    })
    .await;
}

// ---------------------------------------------------------------- a bounded verdict

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_verdict_comes_within_30_s_even_with_a_5_minute_timeout() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        fault(&emu, json!({ "route": "deleteProcess", "action": { "kind": "treeExitedFalse" } }));
        let c = cfg(&emu, json!({ "timeoutMs": 300_000 }));
        assert_eq!(c.cleanup.deadline, Duration::from_secs(30));
        let started = Instant::now();
        let err = timed_out_run(&c, &sb, "sleep 60", Duration::from_millis(300)).await.unwrap_err();
        let elapsed = started.elapsed();
        let Error::Cleanup(report) = &err else { panic!("{err:?}") };
        assert_eq!(report.reason, CleanupReason::TerminationUnconfirmed);
        let last = report.attempts.last().unwrap();
        assert!(last.at_ms <= 30_500.0, "{last:?}");
        assert!(elapsed < Duration::from_secs(35), "{elapsed:?}");
        // Rounds were spaced out, not burnt: far fewer than one per millisecond.
        let deletes = count(&emu, "deleteProcess");
        assert!((5..=80).contains(&deletes), "{deletes} DELETEs in 30 s");
        assert!(!emu.live_pids().is_empty(), "the stubborn tree is really alive");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_503s_on_delete_and_wait_are_ridden_out_with_backoff() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        fault(&emu, json!({ "route": "deleteProcess", "times": 16, "action": { "kind": "status", "status": 503 } }));
        fault(&emu, json!({ "route": "wait", "times": 16, "action": { "kind": "status", "status": 503 } }));
        let c = cfg(&emu, json!({ "cleanupGraceMs": [200], "confirmPollMs": 200, "cleanupDeadlineMs": 30_000 }));
        let r = timed_out_run(&c, &sb, "sleep 30", Duration::from_millis(300)).await.unwrap();
        assert!(r.timed_out);
        let deletes: Vec<_> = emu.requests().into_iter().filter(|q| q.route == "deleteProcess").collect();
        assert_eq!(deletes.len(), 17);
        assert!(deletes[..16].iter().all(|d| d.status == 503));
        assert_eq!(deletes[16].status, 200);
        let spread = deletes[16].at_ms - deletes[0].at_ms;
        assert!(spread > 3000.0, "the rounds were spaced by a backoff: {spread} ms");
        assert_nothing_alive(&emu).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_delete_is_abandoned_and_sent_again() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        fault(&emu, json!({ "route": "deleteProcess", "times": 1, "action": { "kind": "delay", "ms": 25_000 } }));
        let c = cfg(&emu, json!({ "cleanupGraceMs": [500], "cleanupDeadlineMs": 20_000 }));
        let started = Instant::now();
        let r = timed_out_run(&c, &sb, "sleep 30", Duration::from_millis(300)).await.unwrap();
        assert!(r.timed_out);
        assert!(started.elapsed() < Duration::from_secs(12), "{:?}", started.elapsed());
        let deletes: Vec<_> = emu.requests().into_iter().filter(|q| q.route == "deleteProcess").collect();
        assert_eq!(deletes.len(), 2, "{deletes:?}");
        assert_eq!(deletes[1].status, 200);
        assert!(deletes[1].at_ms - deletes[0].at_ms >= 5000.0, "the first got its slice: {deletes:?}");
        assert_nothing_alive(&emu).await;
    })
    .await;
}

// ---------------------------------------------------------------- proof that is proof

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_after_tree_exited_false_is_not_proof() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        fault(&emu, json!({ "route": "deleteProcess", "action": { "kind": "treeExitedFalse" } }));
        fault(&emu, json!({ "route": "wait", "action": { "kind": "status", "status": 404 } }));
        let started = Instant::now();
        let err = timed_out_run(&cfg(&emu, json!({})), &sb, "sleep 30", Duration::from_millis(300)).await.unwrap_err();
        let Error::Cleanup(report) = &err else { panic!("{err:?}") };
        assert_eq!(report.reason, CleanupReason::TerminationUnconfirmed);
        let steps: Vec<_> = report.attempts.iter().map(|a| (a.step, a.outcome.as_str())).collect();
        assert_eq!(steps, vec![("delete", "tree_exited false"), ("wait", "HTTP 404 after alive")]);
        assert!(started.elapsed() < Duration::from_secs(5), "the verdict is immediate");
        assert!(!emu.live_pids().is_empty(), "the error was right: sleep 30 is alive");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_with_nothing_said_alive_is_still_proof() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        // The first DELETE really kills (afterHandler), then answers 404.
        fault(&emu, json!({ "route": "deleteProcess", "times": 1, "action": { "kind": "status", "status": 404, "afterHandler": true } }));
        let r = timed_out_run(&cfg(&emu, json!({})), &sb, "sleep 30", Duration::from_millis(300)).await.unwrap();
        assert!(r.timed_out);
        assert_eq!(of(&emu, "deleteProcess").len(), 1);
        assert_nothing_alive(&emu).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_creation_is_found_on_a_later_page_of_the_list() {
    with_emulator(full(), |emu| async move {
        let sb = emu.create_sandbox_now();
        let c = cfg(&emu, json!({}));
        for _ in 0..4 {
            start_process(&c, &sb, "/bin/sleep", json!(["30"])).await;
        }
        let decoys = emu.live_pids();
        assert_eq!(decoys.len(), 4);
        emu.clear_requests();
        fault(&emu, json!({ "route": "createProcess", "times": 1, "action": { "kind": "status", "status": 502, "afterHandler": true } }));
        fault(&emu, json!({ "route": "listProcesses", "action": { "kind": "pageSize", "limit": 2 } }));
        let err = execute(&c, &params(&sb, "echo never"), Abort::new(), None).await.unwrap_err();
        assert!(matches!(err, Error::Api { status: 502, .. }), "{err:?}");
        let lists: Vec<_> = emu.requests().into_iter().filter(|q| q.route == "listProcesses").map(|q| q.query).collect();
        assert_eq!(lists, vec!["limit=500&offset=0", "limit=500&offset=2", "limit=500&offset=4"]);
        assert_eq!(count(&emu, "deleteProcess"), 1, "ours, found on the third page, was ended");
        assert_only_alive(&emu, &decoys).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_found_behind_a_lost_answer_but_not_ended_is_reported_by_id() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        fault(&emu, json!({ "route": "createProcess", "times": 1, "action": { "kind": "status", "status": 502, "afterHandler": true } }));
        fault(&emu, json!({ "route": "deleteProcess", "action": { "kind": "treeExitedFalse" } }));
        let c = cfg(&emu, json!({ "cleanupGraceMs": [100], "confirmPollMs": 200, "cleanupDeadlineMs": 1500 }));
        let err = execute(&c, &params(&sb, "echo never"), Abort::new(), None).await.unwrap_err();
        let Error::Cleanup(report) = &err else { panic!("{err:?}") };
        assert_eq!(report.reason, CleanupReason::TerminationUnconfirmed);
        let deleted = emu.requests().into_iter().find(|q| q.route == "deleteProcess").unwrap();
        let id = deleted.path.rsplit('/').next().unwrap().to_owned();
        assert_eq!(report.process_id.as_deref(), Some(id.as_str()));
        assert!(!emu.live_pids().is_empty());
    })
    .await;
}

// ---------------------------------------------------------------- reconnects

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_every_two_frames_is_followed_to_the_end() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        fault(&emu, json!({ "route": "connect", "action": { "kind": "dropAfterFrames", "frames": 2 } }));
        let script = "for i in $(seq 1 16); do echo line$i; sleep 0.03; done";
        let r = execute(&cfg(&emu, json!({})), &params(&sb, script), Abort::new(), None).await.unwrap();
        let want: String = (1..=16).map(|i| format!("line{i}\n")).collect();
        assert_eq!((r.exit_code, r.stdout.to_string().as_str()), (Some(0), want.as_str()));
        let connects = count(&emu, "connect");
        assert!(connects >= 6, "cut again and again, and followed anyway: {connects} connects");
        assert_nothing_alive(&emu).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_still_read_while_the_exit_is_recovered() {
    let opts = EmulatorOptions { journal_bytes: 64 * 1024, ..unlimited() };
    with_emulator(opts, |emu| async move {
        let sb = emu.create_sandbox_now();
        // One frame, then four connects that deliver nothing: the budget is spent and the
        // exit is recovered through `wait` — while the next connect reads 320 KB of output,
        // five times the 64 KiB journal, produced while the wait is pending.
        fault(&emu, json!({ "route": "connect", "times": 1, "action": { "kind": "dropAfterFrames", "frames": 1 } }));
        fault(
            &emu,
            json!({ "route": "connect", "skip": 1, "times": 4, "action": { "kind": "dropAfterFrames", "frames": 0 } }),
        );
        let script =
            "echo start; sleep 2; for i in $(seq 1 40); do head -c 8000 /dev/zero | tr '\\0' x; sleep 0.05; done; echo";
        let r = execute(&cfg(&emu, json!({ "timeoutMs": 20_000 })), &params(&sb, script), Abort::new(), None)
            .await
            .unwrap();
        assert_eq!(r.exit_code, Some(0));
        assert_eq!(r.stdout.to_string().len(), "start\n".len() + 320_001);
        assert!(count(&emu, "wait") >= 1, "the exit was being recovered meanwhile");
        assert!(count(&emu, "connect") >= 6);
        assert_nothing_alive(&emu).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_connected_is_never_dropped_when_the_host_is_behind() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        let c = cfg(&emu, json!({}));
        let pid =
            start_process(&c, &sb, "/bin/bash", json!(["-c", "for i in $(seq 1 12); do echo $i; sleep 0.02; done"]))
                .await;
        emu.clear_requests();
        fault(&emu, json!({ "route": "connect", "action": { "kind": "dropAfterFrames", "frames": 1 } }));
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let slow = tokio::spawn(async move {
            let mut connected = 0;
            while let Some(ev) = rx.recv().await {
                if matches!(ev, FollowEvent::Connected) {
                    connected += 1;
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            connected
        });
        let exit = execute::follow_process(&c, &sb, &pid, Abort::new(), tx).await.unwrap();
        assert_eq!(exit.exit_code, Some(0));
        let connected = slow.await.unwrap();
        let opened = emu.requests().iter().filter(|q| q.route == "connect" && q.status == 200).count();
        assert!(opened >= 6, "{opened}");
        assert_eq!(connected, opened, "one event per attach");
        assert_nothing_alive(&emu).await;
    })
    .await;
}

// ---------------------------------------------------------------- smaller items

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_during_the_cleanup_does_not_replace_a_real_error() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        fault(&emu, json!({ "route": "connect", "times": 1, "action": { "kind": "gapAfterFrames", "frames": 1 } }));
        fault(&emu, json!({ "route": "deleteProcess", "times": 1, "action": { "kind": "delay", "ms": 1500 } }));
        let script = "echo a; sleep 0.1; echo b; sleep 0.1; echo c; sleep 30";
        let err = timed_out_run(&cfg(&emu, json!({})), &sb, script, Duration::from_millis(900)).await.unwrap_err();
        assert!(matches!(err, Error::Protocol(SEQUENCE_GAP)), "{err:?}");
        let deletes = of(&emu, "deleteProcess");
        assert_eq!(deletes.len(), 1, "{deletes:?}");
        assert_nothing_alive(&emu).await;
    })
    .await;
}

// ---------------------------------------------------------------- sandbox receipts

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_sandbox_confirms_the_sandbox_gone() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        let c = cfg(&emu, json!({}));
        start_process(&c, &sb, "/bin/sleep", json!(["30"])).await;
        emu.clear_requests();
        execute::destroy_sandbox(&c, &sb).await.unwrap();
        let l: Vec<_> = emu.requests().iter().map(|q| format!("{} {} {}", q.method, q.route, q.status)).collect();
        assert_eq!(l, vec!["DELETE deleteSandbox 200", "GET getSandbox 404"]);
        assert_nothing_alive(&emu).await;
        // Already gone: 404, then 404.
        execute::destroy_sandbox(&c, &sb).await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_sandbox_that_cannot_be_confirmed_is_a_distinct_error_within_its_deadline() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        let c = cfg(&emu, json!({ "cleanupDeadlineMs": 1500 }));
        fault(&emu, json!({ "route": "deleteSandbox", "action": { "kind": "status", "status": 500 } }));
        let started = Instant::now();
        let err = execute::destroy_sandbox(&c, &sb).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(4));
        let Error::DestroyUnconfirmed(report) = &err else { panic!("{err:?}") };
        assert_eq!(err.to_string(), "CreateOS sandbox destruction could not be confirmed.");
        assert_eq!(report.sandbox_id, sb);
        assert!(report.attempts.iter().all(|a| a.step != "state"), "{:?}", report.attempts);
        assert!(count(&emu, "deleteSandbox") >= 2, "asked again after a backoff");
        assert_eq!(count(&emu, "getSandbox"), 0);
        // A DELETE that worked but a state that cannot be read is unconfirmed too.
        emu.clear_faults();
        emu.clear_requests();
        fault(&emu, json!({ "route": "getSandbox", "action": { "kind": "status", "status": 503 } }));
        let sb2 = emu.create_sandbox_now();
        let err = execute::destroy_sandbox(&c, &sb2).await.unwrap_err();
        assert!(matches!(err, Error::DestroyUnconfirmed(_)), "{err:?}");
        assert_eq!(count(&emu, "deleteSandbox"), 1);
        assert!(count(&emu, "getSandbox") >= 2);
    })
    .await;
}
