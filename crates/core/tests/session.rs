//! Session mode through the Rust core, against the real emulator under both profiles: one
//! input request per warm command, and every abnormal end proven by the provider (a DELETE of
//! the supervisor's tree, confirmed) before the next command starts a new supervisor. Each
//! test asserts on what the caller got, on the emulator's request log and on live processes.

mod support;

use createos_execute_core::abort::Abort;
use createos_execute_core::config::Config;
use createos_execute_core::error::Error;
use createos_execute_core::execute::{destroy_sandbox, execute};
use createos_execute_core::session::{MARKER_INVALID, SUPERVISOR_ENDED};
use createos_test_support::{assert_nothing_alive, unlimited, with_emulator, Emulator, EmulatorOptions, Profile};
use serde_json::json;
use support::{count, fault, params};

fn session_cfg(emu: &Emulator, extra: serde_json::Value) -> Config {
    let mut e = json!({ "session": { "idleMs": 60_000 } });
    for (k, v) in extra.as_object().unwrap() {
        e[k] = v.clone();
    }
    support::cfg(emu, e)
}

/// The routes the emulator saw, in order.
fn routes(emu: &Emulator) -> Vec<&'static str> {
    emu.requests().iter().map(|r| r.route).collect()
}

async fn run(c: &Config, sb: &str, script: &str) -> Result<createos_execute_core::execute::ExecuteResult, Error> {
    // Boxed: the command's future is large in a debug build, and a test body awaits several.
    Box::pin(execute(c, &params(sb, script), Abort::new(), None)).await
}

/// The abnormal end was proven (a DELETE after the command's input), and the next command
/// works on a new supervisor: create, connect, input.
async fn proven_then_works(emu: &Emulator, c: &Config, sb: &str, pid_before: &str) {
    let r = routes(emu);
    let input = r.iter().rposition(|k| *k == "input").expect("an input was sent");
    assert!(r[input..].contains(&"deleteProcess"), "the proof follows the input: {r:?}");
    emu.clear_requests();
    let again = run(c, sb, "echo again").await.unwrap();
    assert_eq!(again.stdout, "again\n");
    assert_ne!(again.process_id.as_deref(), Some(pid_before));
    let mut r = routes(emu);
    r.sort_unstable();
    assert_eq!(r, ["connect", "createProcess", "input"]);
}

async fn sequential_then_killed(profile: Profile) {
    let opts = EmulatorOptions { profile: Some(profile), ..unlimited() };
    with_emulator(opts, |emu| async move {
        let sb = emu.create_sandbox_now();
        let c = session_cfg(&emu, json!({}));
        let mut pid = None;
        for i in 0..4 {
            let r = run(&c, &sb, &format!("printf 'o{i}'; printf 'e{i}' >&2; exit {i}")).await.unwrap();
            assert_eq!(
                (r.stdout.to_string(), r.stderr.to_string(), r.exit_code),
                (format!("o{i}"), format!("e{i}"), Some(i))
            );
            assert_eq!(r.containment, Some("supervisor"));
            pid.get_or_insert(r.process_id.clone().unwrap());
            assert_eq!(r.process_id, pid.clone());
        }
        assert_eq!((count(&emu, "createProcess"), count(&emu, "connect"), count(&emu, "input")), (1, 1, 4));
        assert_eq!(emu.requests().len(), 6, "one creation, one stream, one input per command");
        // A command that kills its supervisor: rejected, proven, and the next one works.
        let pid = pid.unwrap();
        match run(&c, &sb, "grep -q __cos_marker /proc/$PPID/cmdline && kill -9 $PPID; sleep 5").await {
            Err(Error::Protocol(m)) => assert_eq!(m, SUPERVISOR_ENDED),
            other => panic!("expected the supervisor's end, got {other:?}"),
        }
        Box::pin(proven_then_works(&emu, &c, &sb, &pid)).await;
        Box::pin(destroy_sandbox(&c, &sb)).await.unwrap();
        assert_nothing_alive(&emu).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_input_per_command_and_a_killed_supervisor_is_proven_full_profile() {
    sequential_then_killed(Profile::Full).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_input_per_command_and_a_killed_supervisor_is_proven_documented_profile() {
    sequential_then_killed(Profile::Documented).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_marker_a_lost_stream_and_a_leftover_end_in_the_proof() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        let c = session_cfg(&emu, json!({ "leftoverProcesses": "terminate" }));
        let first = run(&c, &sb, "true").await.unwrap();
        let pid = first.process_id.unwrap();
        // A marker with another token.
        let forged = format!("printf 'x\\0\\036cos-end:{}:0:0\\n'; sleep 30", "e".repeat(32));
        match run(&c, &sb, &forged).await {
            Err(Error::Protocol(m)) => assert_eq!(m, MARKER_INVALID),
            other => panic!("expected an invalid marker, got {other:?}"),
        }
        Box::pin(proven_then_works(&emu, &c, &sb, &pid)).await;
        // An error frame on the stream fails closed.
        let pid = run(&c, &sb, "true").await.unwrap().process_id.unwrap();
        fault(
            &emu,
            json!({ "route": "input", "times": 1, "action": { "kind": "dropConnection", "afterHandler": true } }),
        );
        assert!(run(&c, &sb, "echo lost").await.is_err());
        emu.clear_faults();
        Box::pin(proven_then_works(&emu, &c, &sb, &pid)).await;
        // A leftover with 'terminate': the session ends through the proof.
        emu.clear_requests();
        let r = run(&c, &sb, "sleep 300 & echo $!").await.unwrap();
        assert_eq!((r.exit_code, r.containment, r.tree_exited), (Some(0), Some("provider"), Some(true)));
        assert!(count(&emu, "deleteProcess") >= 1, "the proof was sent");
        Box::pin(destroy_sandbox(&c, &sb)).await.unwrap();
        assert_nothing_alive(&emu).await;
    })
    .await;
}
