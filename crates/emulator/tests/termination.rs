//! The termination scope of a process DELETE, with real processes on 127.0.0.1: under `group`
//! SIGTERM, the grace and SIGKILL reach the leader's process group only, so a `setsid` child
//! and a double-forked daemon in a session of their own survive it, while `tree_exited` (the
//! DELETE's answer, the exit frame, `wait?scope=tree`, the record) still counts them; under
//! `tree` the same DELETE ends them all. Each scenario asserts, per scope, what the other scope
//! would not give. Whether a process lives is read from /proc (by its command line), not from
//! the emulator; every survivor is ended by pid, and each test closes its emulator.

use std::time::{Duration, Instant};

use createos_test_support::emulator::{self, EmulatorOptions, Profile, TerminationScope, Tracking, TrackingMode};
use createos_test_support::{sleepers, unique_sleep, with_emulator, FaultRule};
use serde_json::Value;

mod support;

use support::Ctx;

fn opts(profile: Profile, scope: Option<TerminationScope>) -> EmulatorOptions {
    EmulatorOptions { profile: Some(profile), termination_scope: scope, ..createos_test_support::unlimited() }
}

/// The process group of a live pid, from /proc.
fn pgid_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].split_ascii_whitespace().nth(2)?.parse().ok()
}

/// Waits (10 s at most) until exactly one `sleep <arg>` lives, and returns its pid.
async fn one_sleeper(arg: &str) -> i32 {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let [pid] = sleepers(arg)[..] {
            return pid;
        }
        assert!(Instant::now() < end, "`sleep {arg}` did not start: {:?}", sleepers(arg));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn kill_by_pid(pid: i32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}

/// Ends every `sleep <arg>` still alive (the test's own processes, by pid).
fn kill_sleepers(args: &[&str]) {
    for arg in args {
        for pid in sleepers(arg) {
            kill_by_pid(pid);
        }
    }
}

impl Ctx {
    async fn wait(&self, sb: &str, id: &str, scope: &str, ms: u64) -> (u16, Value) {
        self.json(self.get(&format!("/sandboxes/{sb}/processes/{id}/wait?scope={scope}&timeout_ms={ms}"))).await
    }
    async fn record(&self, sb: &str, id: &str) -> Value {
        let (s, v) = self.json(self.get(&format!("/sandboxes/{sb}/processes/{id}"))).await;
        assert_eq!(s, 200, "{v}");
        v["data"].clone()
    }
    /// The exit frame of a process whose leader has exited (its whole connect stream's last line).
    async fn exit_frame(&self, sb: &str, id: &str) -> Value {
        let r = self.get(&format!("/sandboxes/{sb}/processes/{id}/connect")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let b = r.bytes().await.unwrap();
        let last = b.split(|c| *c == b'\n').rfind(|l| !l.is_empty()).expect("a frame");
        let v: Value = serde_json::from_slice(last).unwrap();
        assert_eq!(v["type"], "exit", "{v}");
        v
    }
}

/// One process whose group holds a leader and a child that both ignore SIGTERM, plus two
/// processes that left the group: a `setsid` child and a double-forked `setsid` daemon (its
/// parent exits: it is re-parented). DELETE with a 300 ms grace, then what each scope must
/// give. Under `group` the survivors are ended by pid at the end, and the tree is then seen
/// exited.
async fn scenario(c: &Ctx, scope: TerminationScope) {
    let (member, child, daemon) = (unique_sleep(311), unique_sleep(312), unique_sleep(313));
    let all = [member.as_str(), child.as_str(), daemon.as_str()];
    let sb = c.sandbox().await;
    let script = format!(
        "trap '' TERM; (trap '' TERM; exec sleep {member}) & setsid sleep {child} & \
         (setsid sleep {daemon} &); echo ready; wait"
    );
    let p = c.spawn(&sb, "bash", &["-c", &script]).await;
    let id = p["process_id"].as_str().unwrap().to_string();
    let leader = i32::try_from(p["pid"].as_i64().unwrap()).unwrap();
    let pm = one_sleeper(&member).await;
    let pc = one_sleeper(&child).await;
    let pd = one_sleeper(&daemon).await;
    // The setup is what the test says: the member in the leader's group, the other two out.
    let groups = (pgid_of(pm), pgid_of(pc), pgid_of(pd));
    if groups.0 != Some(leader) || groups.1 == Some(leader) || groups.2 == Some(leader) {
        kill_sleepers(&all);
        panic!("unexpected process groups (member, child, daemon) {groups:?}, leader {leader}");
    }

    let t = Instant::now();
    let (s, v) = c.json(c.delete(&format!("/sandboxes/{sb}/processes/{id}?grace_ms=300"))).await;
    let took = t.elapsed();
    let alive = (sleepers(&member), sleepers(&child), sleepers(&daemon));
    let (w, _) = c.wait(&sb, &id, "tree", 400).await;
    let rec = c.record(&sb, &id).await;
    let exit = if c.emu.profile() == Profile::Full { Some(c.exit_frame(&sb, &id).await) } else { None };
    let live = c.emu.live_pids();
    if scope == TerminationScope::Group {
        // The survivors, by pid, before any assertion can fail.
        kill_by_pid(pc);
        kill_by_pid(pd);
    }
    kill_sleepers(&all);

    assert_eq!(s, 200, "{v}");
    let d = &v["data"];
    // Both scopes: the group ignored SIGTERM, so the grace passed and SIGKILL ended the group.
    assert!(took >= Duration::from_millis(300), "the grace was not waited: {took:?}");
    assert_eq!((d["leader_exited"].as_bool(), d["signal"].as_str()), (Some(true), Some("SIGKILL")), "{d}");
    assert_eq!(alive.0, Vec::<i32>::new(), "the group's member that ignores SIGTERM outlived the DELETE");
    match scope {
        TerminationScope::Group => {
            assert_eq!((alive.1, alive.2), (vec![pc], vec![pd]), "the processes outside the group were signalled");
            assert_eq!(d["tree_exited"], false, "the DELETE claimed a tree whose processes live: {d}");
            assert_eq!(w, 408, "wait?scope=tree answered while processes of the tree live");
            assert_eq!(rec["tree_exited"], false, "{rec}");
            if let Some(exit) = &exit {
                assert_eq!(exit["tree_exited"], false, "{exit}");
            }
            assert!(live.contains(&pc) && live.contains(&pd), "live_pids {live:?} misses {pc} or {pd}");
            // Once the survivors are gone (ended above, by pid), the tree is seen exited.
            let (w, v) = c.wait(&sb, &id, "tree", 10_000).await;
            assert_eq!((w, &v["data"]["tree_exited"]), (200, &Value::Bool(true)), "{v}");
        }
        TerminationScope::Tree => {
            assert_eq!((alive.1, alive.2), (vec![], vec![]), "the processes outside the group outlived the DELETE");
            assert_eq!(d["tree_exited"], true, "{d}");
            assert_eq!(w, 200, "wait?scope=tree");
            assert_eq!(rec["tree_exited"], true, "{rec}");
            if let Some(exit) = &exit {
                assert_eq!(exit["tree_exited"], true, "{exit}");
            }
            assert!(live.is_empty(), "{live:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_scope_ends_the_leaders_group_and_leaves_what_left_it() {
    with_emulator(opts(Profile::Full, Some(TerminationScope::Group)), |emu| async move {
        assert_eq!(emu.termination_scope(), TerminationScope::Group);
        scenario(&Ctx::new(emu), TerminationScope::Group).await;
    })
    .await;
}

/// The same without a cgroup: the tree found by its environment marker and process group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_scopes_with_marker_tracking() {
    for scope in [TerminationScope::Group, TerminationScope::Tree] {
        let o = EmulatorOptions { tracking: TrackingMode::Marker, ..opts(Profile::Full, Some(scope)) };
        with_emulator(o, |emu| async move {
            assert_eq!(emu.tracking(), Tracking::Marker);
            scenario(&Ctx::new(emu), scope).await;
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tree_scope_ends_every_process_of_the_tree() {
    with_emulator(opts(Profile::Full, Some(TerminationScope::Tree)), |emu| async move {
        assert_eq!(emu.termination_scope(), TerminationScope::Tree);
        scenario(&Ctx::new(emu), TerminationScope::Tree).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_profile_terminates_by_group_and_the_full_one_by_tree() {
    with_emulator(opts(Profile::Documented, None), |emu| async move {
        assert_eq!(emu.termination_scope(), TerminationScope::Group);
        scenario(&Ctx::new(emu), TerminationScope::Group).await;
    })
    .await;
    with_emulator(opts(Profile::Full, None), |emu| async move {
        assert_eq!(emu.termination_scope(), TerminationScope::Tree);
        scenario(&Ctx::new(emu), TerminationScope::Tree).await;
    })
    .await;
    // An explicit scope overrides the profile's.
    with_emulator(opts(Profile::Documented, Some(TerminationScope::Tree)), |emu| async move {
        assert_eq!(emu.termination_scope(), TerminationScope::Tree);
        scenario(&Ctx::new(emu), TerminationScope::Tree).await;
    })
    .await;
}

/// A group whose processes end on SIGTERM: the DELETE answers as soon as the group is gone
/// (not after the whole grace), and with nothing outside the group the tree is exited at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_scope_answers_when_the_group_is_gone_and_the_tree_with_it() {
    with_emulator(opts(Profile::Full, Some(TerminationScope::Group)), |emu| async move {
        let c = Ctx::new(emu);
        let arg = unique_sleep(314);
        let sb = c.sandbox().await;
        let p = c.spawn(&sb, "bash", &["-c", &format!("sleep {arg} & wait")]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        let pid = one_sleeper(&arg).await;
        let t = Instant::now();
        let (s, v) = c.json(c.delete(&format!("/sandboxes/{sb}/processes/{id}?grace_ms=5000"))).await;
        let took = t.elapsed();
        let left = sleepers(&arg);
        kill_by_pid(pid);
        assert_eq!(s, 200, "{v}");
        assert_eq!(left, Vec::<i32>::new(), "a member of the group outlived the DELETE");
        assert_eq!(v["data"]["tree_exited"], true, "{v}");
        assert_eq!(v["data"]["signal"], "SIGTERM", "{v}");
        assert!(took < Duration::from_millis(4000), "the DELETE waited out the grace: {took:?}");
    })
    .await;
}

/// The emulator's own housekeeping ends what a group DELETE left: a sandbox DELETE ends the
/// processes that left the group, and so does `close()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_group_scope_a_sandbox_delete_and_close_still_end_everything() {
    let emu = emulator::start(opts(Profile::Documented, None)).await.unwrap();
    let c = Ctx::new(emu.clone());
    let (a, b) = (unique_sleep(315), unique_sleep(316));
    let survivor = |arg: &str| format!("setsid sleep {arg} & sleep 0.1; exit 0");
    let sb1 = c.sandbox().await;
    let sb2 = c.sandbox().await;
    let mut deletes = Vec::new();
    for (sb, arg) in [(&sb1, &a), (&sb2, &b)] {
        let p = c.spawn(sb, "bash", &["-c", &survivor(arg)]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        one_sleeper(arg).await;
        let (s, v) = c.json(c.delete(&format!("/sandboxes/{sb}/processes/{id}?grace_ms=100"))).await;
        deletes.push((s, v["data"]["tree_exited"].clone()));
    }
    let after_process_deletes = (sleepers(&a).len(), sleepers(&b).len());
    let (s, _) = c.json(c.delete(&format!("/sandboxes/{sb1}"))).await;
    let after_sandbox_delete = (sleepers(&a).len(), sleepers(&b).len());
    emu.close().await;
    let after_close = (sleepers(&a).len(), sleepers(&b).len());
    kill_sleepers(&[&a, &b]);
    assert_eq!(deletes, vec![(200, Value::Bool(false)); 2], "the process DELETEs left the setsid children");
    assert_eq!(after_process_deletes, (1, 1));
    assert_eq!(s, 200);
    assert_eq!(after_sandbox_delete, (0, 1), "the sandbox DELETE ended its survivor, and only its");
    assert_eq!(after_close, (0, 0), "close() ended the other");
}

/// The DELETE faults act with the scope: `killOnly` SIGKILLs the group at once (no grace), and
/// a `setsid` child outside it lives on, keeping the tree alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_only_under_group_scope_kills_the_group_only() {
    with_emulator(opts(Profile::Full, Some(TerminationScope::Group)), |emu| async move {
        let c = Ctx::new(emu);
        c.emu.add_fault(FaultRule::from_json(r#"{"route":"deleteProcess","action":{"kind":"killOnly"}}"#).unwrap());
        let (member, child) = (unique_sleep(317), unique_sleep(318));
        let sb = c.sandbox().await;
        let script = format!("sleep {member} & setsid sleep {child} & wait");
        let p = c.spawn(&sb, "bash", &["-c", &script]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        one_sleeper(&member).await;
        let pc = one_sleeper(&child).await;
        let t = Instant::now();
        let (s, v) = c.json(c.delete(&format!("/sandboxes/{sb}/processes/{id}?grace_ms=5000"))).await;
        let took = t.elapsed();
        let alive = (sleepers(&member), sleepers(&child));
        let (w, _) = c.wait(&sb, &id, "tree", 300).await;
        kill_by_pid(pc);
        kill_sleepers(&[&member, &child]);
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["data"]["signal"], "SIGKILL", "{v}");
        assert!(took < Duration::from_millis(4000), "killOnly waited for the grace: {took:?}");
        assert_eq!(alive, (vec![], vec![pc]));
        assert_eq!(v["data"]["tree_exited"], false, "{v}");
        assert_eq!(w, 408);
    })
    .await;
}

/// Whether a pid lives ([`createos_emulator::stat_live`]: not a zombie, not in `exit`), its
/// process group and the `exit_code` field of its /proc stat (the wait status it dies with, set
/// as it enters `exit`); `None` once it is gone.
fn stat_of(pid: i32) -> Option<(bool, i32, i64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_ascii_whitespace().collect();
    Some((createos_emulator::stat_live(&stat), fields.get(2)?.parse().ok()?, fields.last()?.parse().ok()?))
}

/// The race of a group DELETE sent a few ms after the leader exited: the command's last act was
/// to start a `setsid` daemon in the background, which may still be between its fork and its
/// `setsid()` (in the leader's group, so the DELETE's SIGTERM ends it) or past it (out of the
/// group: it lives on). Either is right; what must hold is that the answer says which: each
/// round `tree_exited` is true only when nothing of the tree lives (the daemon's pid is gone,
/// in `exit` or a zombie, and no `sleep` of it runs), read from /proc right after the DELETE
/// answered, and false only when something did (the daemon lives on, or the group's SIGTERM ended it just
/// after it left the group: received while a member, it takes effect after its `setsid()`).
/// The leader is shaped as the client's script (a login shell that `exec`s the command), and
/// the DELETE follows, by turns, the exit frame at once, a read of the record after the exit
/// frame (the client's order), or the first record that shows the leader exited.
async fn delete_right_after_the_leader(c: &Ctx, rounds: usize) {
    let (mut gone, mut survived, mut late) = (0, 0, 0);
    for round in 0..rounds {
        let arg = unique_sleep(319);
        let sb = c.sandbox().await;
        let cmd = format!("exec bash -c 'setsid sleep {arg} </dev/null >/dev/null 2>&1 & echo $!'");
        let p = c.spawn(&sb, "bash", &["-lc", &cmd]).await;
        let id = p["process_id"].as_str().unwrap().to_string();
        let leader = i32::try_from(p["pid"].as_i64().unwrap()).unwrap();
        match round % 3 {
            0 => {
                c.exit_frame(&sb, &id).await;
            }
            1 => {
                c.exit_frame(&sb, &id).await;
                c.record(&sb, &id).await;
            }
            _ => {
                let end = Instant::now() + Duration::from_secs(10);
                while c.record(&sb, &id).await["leader_exited"] != true {
                    assert!(Instant::now() < end, "the leader did not exit");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
        let (s, v) = c.json(c.delete(&format!("/sandboxes/{sb}/processes/{id}?grace_ms=1000"))).await;
        // What lives, from /proc, right after the answer (the daemon sleeps for ages: nothing
        // of the tree ends by itself in between).
        let (out, _) = c.emu.process_output(&sb, &id).unwrap().expect("the process is known");
        let daemon: i32 = String::from_utf8_lossy(&out).trim().parse().expect("the daemon's pid on stdout");
        let daemon_stat = stat_of(daemon);
        let sleeping = sleepers(&arg);
        let (w, _) = c.wait(&sb, &id, "tree", 0).await;
        // The survivors, by pid, before any assertion can fail.
        if daemon_stat.is_some_and(|(live, _, _)| live) {
            kill_by_pid(daemon);
        }
        kill_sleepers(&[&arg]);

        assert_eq!(s, 200, "{v}");
        let claimed = v["data"]["tree_exited"].as_bool().expect("tree_exited in the DELETE's answer");
        let alive = daemon_stat.is_some_and(|(live, _, _)| live) || !sleeping.is_empty();
        // The wait status the daemon died with (a zombie, or still in `exit`): 15 when the
        // DELETE's SIGTERM ended it (sent to the group while it was a member; it may have
        // finished its setsid() before it died).
        let terminated = daemon_stat.is_some_and(|(live, _, status)| !live && status == 15);
        let seen = format!(
            "round {round}: DELETE {v}, daemon {daemon} {daemon_stat:?} (leader {leader}), sleepers {sleeping:?}"
        );
        if claimed {
            // The safety property: "gone" only when nothing of the tree lives.
            assert!(!alive, "tree_exited while a process of the tree lives: {seen}");
            assert!(terminated || daemon_stat.is_none(), "the daemon did not end by the group's SIGTERM: {seen}");
            assert_eq!(w, 200, "wait?scope=tree disagrees with the DELETE: {seen}");
            gone += 1;
        } else {
            // Alive when the DELETE looked: it still is, or the group's SIGTERM, pending while
            // it left the group, ended it just after.
            assert!(alive || terminated, "tree_exited false, yet nothing of the tree lived: {seen}");
            if alive {
                assert_eq!(w, 408, "wait?scope=tree disagrees with the DELETE: {seen}");
                survived += 1;
            } else {
                late += 1;
            }
            // Once the survivor is gone (ended above, by pid), the tree is seen exited.
            let (w, v) = c.wait(&sb, &id, "tree", 10_000).await;
            assert_eq!((w, &v["data"]["tree_exited"]), (200, &Value::Bool(true)), "{seen}: {v}");
        }
    }
    eprintln!(
        "{:?}: {gone} rounds ended in the group, {survived} left it and lived, {late} left it as the SIGTERM came",
        c.emu.tracking()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_delete_right_after_the_leader_exited_answers_what_lives() {
    with_emulator(opts(Profile::Documented, None), |emu| async move {
        assert_eq!(emu.termination_scope(), TerminationScope::Group);
        delete_right_after_the_leader(&Ctx::new(emu), 30).await;
    })
    .await;
    let o = EmulatorOptions { tracking: TrackingMode::Marker, ..opts(Profile::Documented, None) };
    with_emulator(o, |emu| async move {
        delete_right_after_the_leader(&Ctx::new(emu), 30).await;
    })
    .await;
}

/// A descendant caught in the middle of an `execve` (its new image's arguments and environment
/// not yet placed: `/proc/<pid>/environ` reads empty for a moment) is still of the tree. A
/// `setsid` daemon that runs a chain of 400 `env` execs before its `sleep` spends many such
/// moments out of the leader's group, found by its marker only; DELETEs (no grace: the group
/// is already gone) every few ms while the chain runs must each answer `tree_exited: false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descendant_in_the_middle_of_an_exec_is_still_of_the_tree() {
    let o = EmulatorOptions { tracking: TrackingMode::Marker, ..opts(Profile::Documented, None) };
    with_emulator(o, |emu| async move {
        let c = Ctx::new(emu);
        let mut deletes = 0;
        for round in 0..10 {
            let arg = unique_sleep(320);
            let sb = c.sandbox().await;
            let chain = "env ".repeat(400);
            let cmd = format!("setsid {chain}sleep {arg} </dev/null >/dev/null 2>&1 & echo $!");
            let p = c.spawn(&sb, "bash", &["-c", &cmd]).await;
            let id = p["process_id"].as_str().unwrap().to_string();
            c.exit_frame(&sb, &id).await;
            let (out, _) = c.emu.process_output(&sb, &id).unwrap().expect("the process is known");
            let daemon: i32 = String::from_utf8_lossy(&out).trim().parse().expect("the daemon's pid on stdout");
            let mut wrong = None;
            // Until the chain reached its `sleep` (10 s at most).
            let end = Instant::now() + Duration::from_secs(10);
            while sleepers(&arg).is_empty() && Instant::now() < end {
                let (s, v) = c.json(c.delete(&format!("/sandboxes/{sb}/processes/{id}?grace_ms=0"))).await;
                let st = stat_of(daemon);
                deletes += 1;
                if s != 200 || (v["data"]["tree_exited"] != false && st.is_some_and(|(live, _, _)| live)) {
                    let answer = (&v["data"]["leader_exited"], &v["data"]["tree_exited"]);
                    wrong = Some(format!("round {round}: DELETE {s} {answer:?}, daemon {daemon} {st:?}"));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            kill_by_pid(daemon);
            kill_sleepers(&[&arg]);
            assert_eq!(wrong, None, "tree_exited while a process of the tree lives");
        }
        eprintln!("{deletes} DELETEs while the daemon exec'd, each answered tree_exited false");
    })
    .await;
}
