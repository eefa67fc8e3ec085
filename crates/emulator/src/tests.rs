use super::faults::{evaluate, FaultAction, FaultRule};
use super::model::{new_sandbox_id, rfc3339_now, Journal, Read};
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
    let fired: Vec<bool> = (0..3).map(|_| evaluate(&mut slots, "createProcess", "POST").response.is_some()).collect();
    assert_eq!(fired, vec![false, true, false]);
    // fastStream only applies to connect.
    assert!(evaluate(&mut slots, "connect", "GET").stream.fast.is_some());
    assert!(evaluate(&mut slots, "exec", "POST").stream.fast.is_none());
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
