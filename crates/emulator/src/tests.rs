use super::faults::{evaluate, FaultAction, FaultRule};
use super::model::{new_sandbox_id, rfc3339_now, Journal, Read};
use super::retention::Retention;
use super::streams::Utf8Carry;
use super::{EmulatorOptions, FaultSlot};
use bytes::Bytes;

#[test]
fn sandbox_id_shape() {
    let id = new_sandbox_id();
    assert!(id.starts_with("sb-"));
    assert_eq!(id.len(), 29);
    assert!(id[3..].chars().all(|c| "0123456789ABCDEFGHJKMNPQRSTVWXYZ".contains(c)));
    assert_ne!(id, new_sandbox_id());
}

#[test]
fn timestamp_shape() {
    let t = rfc3339_now();
    assert_eq!(t.len(), 24, "{t}");
    assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T');
    assert!(t.starts_with("20"));
}

#[test]
fn journal_evicts_oldest_but_keeps_newest() {
    let mut j = Journal::new_for_test(10);
    assert_eq!((j.oldest_seq(), j.newest_seq()), (1, 0));
    j.push_for_test(0, Bytes::from_static(b"12345"));
    j.push_for_test(1, Bytes::from_static(b"12345"));
    assert_eq!((j.oldest_seq(), j.newest_seq(), j.bytes()), (1, 2, 10));
    j.push_for_test(0, Bytes::from_static(b"123456789012"));
    assert_eq!((j.oldest_seq(), j.newest_seq(), j.bytes()), (3, 3, 12));
    assert!(matches!(j.read_after(0, 1000), Read::Expired { oldest: 3 }));
    match j.read_after(2, 1000) {
        Read::Frames(f) => assert_eq!(f.iter().map(|f| f.seq).collect::<Vec<_>>(), vec![3]),
        _ => panic!("expected frames"),
    }
    match j.read_after(3, 1000) {
        Read::Frames(f) => assert!(f.is_empty()),
        _ => panic!("expected frames"),
    }
}

#[test]
fn journal_clear_keeps_numbering() {
    let mut j = Journal::new_for_test(1000);
    j.push_for_test(0, Bytes::from_static(b"abc"));
    j.push_for_test(1, Bytes::from_static(b"def"));
    j.clear();
    assert_eq!((j.oldest_seq(), j.newest_seq(), j.bytes()), (3, 2, 0));
    assert!(matches!(j.read_after(0, 1000), Read::Expired { oldest: 3 }));
    assert!(matches!(j.read_after(1, 1000), Read::Expired { oldest: 3 }));
    match j.read_after(2, 1000) {
        Read::Frames(f) => assert!(f.is_empty(), "caught up: nothing to send, not an error"),
        _ => panic!("expected frames"),
    }
}

#[test]
fn retention_evicts_oldest_exits_first() {
    let mut r = Retention::new(Some(1000));
    assert!(r.exited(1, 400, "a").is_empty());
    assert!(r.exited(2, 400, "b").is_empty());
    assert_eq!((r.total(), r.len()), (800, 2));
    // 1200 > 1000: the oldest goes, and only it.
    assert_eq!(r.exited(3, 400, "c"), vec!["a"]);
    assert_eq!((r.total(), r.len()), (800, 2));
    // One exit can evict several.
    assert_eq!(r.exited(4, 900, "d"), vec!["b", "c"]);
    assert_eq!((r.total(), r.len()), (900, 1));
    // A process that alone exceeds the budget loses its own output too.
    assert_eq!(r.exited(5, 1500, "e"), vec!["d", "e"]);
    assert_eq!((r.total(), r.len()), (0, 0));
    // Exactly at the budget is within it.
    assert!(r.exited(6, 1000, "f").is_empty());
    assert_eq!(r.total(), 1000);
}

#[test]
fn retention_removal_leaves_no_accounting_behind() {
    let mut r = Retention::new(Some(1000));
    r.exited(1, 300, 1);
    r.exited(2, 300, 2);
    r.exited(3, 300, 3);
    r.remove(2);
    assert_eq!((r.total(), r.len()), (600, 2));
    // Removing twice, or removing a key never seen, changes nothing.
    r.remove(2);
    r.remove(99);
    assert_eq!((r.total(), r.len()), (600, 2));
    // The removed key's stale entry is skipped: 1 goes, then 3 is enough.
    assert_eq!(r.exited(4, 800, 4), vec![1, 3]);
    assert_eq!((r.total(), r.len()), (800, 1));
    // Many removals never let stale entries pile up.
    for k in 10..10_010 {
        r.exited(k, 0, 0);
        r.remove(k);
    }
    assert_eq!((r.total(), r.len()), (800, 1));
    assert!(r.fifo_len() <= 2 * r.len() + 17, "{}", r.fifo_len());
    // Unbounded: never evicts.
    let mut u = Retention::new(None);
    for k in 0..100 {
        assert!(u.exited(k, usize::MAX / 200, k).is_empty());
    }
    assert_eq!(u.len(), 100);
}

#[test]
fn utf8_carry_does_not_split_chars() {
    let s = "héllo €";
    let b = s.as_bytes();
    let mut c = Utf8Carry::default();
    let mut out = String::new();
    for byte in b {
        out.push_str(&c.push(std::slice::from_ref(byte)));
    }
    out.push_str(&c.finish());
    assert_eq!(out, s);
}

#[test]
fn fault_rules_parse_and_count() {
    let r = FaultRule::from_json(
        r#"{"route":"createProcess","skip":1,"times":1,"action":{"kind":"status","status":500,"afterHandler":true}}"#,
    )
    .unwrap();
    assert!(matches!(r.action, FaultAction::Status { status: 500, after_handler: true, .. }));
    let r2 = FaultRule::from_json(r#"{"action":{"kind":"fastStream","mib":1,"frame_bytes":1000}}"#).unwrap();
    assert_eq!(r2.skip, 0);
    FaultRule::from_json(r#"{"action":{"kind":"treeExitedFalse"}}"#).unwrap();
    FaultRule::from_json(r#"{"action":{"kind":"malformedLine","afterFrames":2}}"#).unwrap();
    let mut slots = vec![FaultSlot { rule: r, seen: 0 }, FaultSlot { rule: r2, seen: 0 }];
    let fired: Vec<bool> =
        (0..3).map(|_| evaluate(&mut slots, "createProcess", "POST", false).response.is_some()).collect();
    assert_eq!(fired, vec![false, true, false]);
    // fastStream only applies to connect.
    assert!(evaluate(&mut slots, "connect", "GET", false).stream.fast.is_some());
    assert!(evaluate(&mut slots, "exec", "POST", false).stream.fast.is_none());
}

#[test]
fn options_from_json() {
    let o: EmulatorOptions = serde_json::from_str(r#"{"port":0,"journalBytes":100}"#).unwrap();
    assert_eq!(o.journal_bytes, 100);
    assert_eq!(o.rate_limit_per_minute, Some(300));
    let o: EmulatorOptions = serde_json::from_str(r#"{"rateLimitPerMinute":null}"#).unwrap();
    assert_eq!(o.rate_limit_per_minute, None);
    assert!(!o.tls && o.http2 && !o.hold_headers);
    assert_eq!((o.rtt_ms, o.heartbeat_ms), (0, 5_000));
    let o: EmulatorOptions =
        serde_json::from_str(r#"{"tls":true,"http2":false,"rttMs":50,"holdHeaders":true,"heartbeatMs":1000}"#).unwrap();
    assert!(o.tls && !o.http2 && o.hold_headers);
    assert_eq!((o.rtt_ms, o.heartbeat_ms), (50, 1_000));
    let o: EmulatorOptions = serde_json::from_str(r#"{"rateLimit":{"limit":20,"windowMs":2000}}"#).unwrap();
    assert_eq!(o.rate_limit.map(|r| (r.limit, r.window_ms)), Some((20, 2000)));
    assert_eq!(o.retained_bytes, Some(256 * 1024 * 1024));
    let o: EmulatorOptions = serde_json::from_str(r#"{"retainedBytes":null}"#).unwrap();
    assert_eq!(o.retained_bytes, None);
    let o: EmulatorOptions = serde_json::from_str(r#"{"retainedBytes":4096}"#).unwrap();
    assert_eq!(o.retained_bytes, Some(4096));
    assert!(serde_json::from_str::<EmulatorOptions>(r#"{"retainedBytes":-1}"#).is_err());
}

#[test]
fn handle_and_futures_are_send() {
    fn send_sync<T: Send + Sync + Clone + 'static>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let fut = super::start(EmulatorOptions::default());
    send(&fut);
    drop(fut);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let emu = super::start(EmulatorOptions::default()).await.unwrap();
        send_sync(&emu);
        let close = emu.close();
        send(&close);
        close.await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_groups_are_forgotten_once_empty() {
    let emu = super::start(EmulatorOptions::default()).await.unwrap();
    let inner = emu.inner.clone();
    let sb_id = emu.create_sandbox_now();
    let sb = inner.sandbox(&sb_id).unwrap();
    let env = std::collections::HashMap::new();
    let p = super::model::start_process(&inner, &sb, "sh", vec!["-c".into(), "sleep 0.2 & exit 0".into()], None, &env)
        .unwrap();
    assert!(inner.groups.lock().unwrap().contains_key(&p.pid));
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while inner.groups.lock().unwrap().contains_key(&p.pid) {
        assert!(std::time::Instant::now() < end, "group never pruned");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    while !p.st.lock().unwrap().tree_exited() {
        assert!(std::time::Instant::now() < end, "tree never exited");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    emu.close().await;
}
