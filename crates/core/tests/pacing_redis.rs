//! The shared pacing store against a real `redis-server` (no mock): each test starts its own
//! server on a free loopback port in a temp dir and ends it by pid, also when it fails.
//! Real time with small windows; two `Pacer`s with their own store connections stand for two
//! processes sharing one budget key.
#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use createos_execute_core::abort::{Abort, Class, Ctx};
use createos_execute_core::net::NetEnv;
use createos_execute_core::pacer::redis_store::{RedisStore, KEY_PREFIX};
use createos_execute_core::pacer::{self, Pacer, PacingMode, STORE_DOWN, STORE_RESTORED};
use createos_test_support::DelayProxy;
use proptest::prelude::*;
use tokio::time::Instant;

/// A `redis-server` of this test: ended by pid on drop, its temp dir removed.
struct Server {
    child: Option<Child>,
    port: u16,
    dir: std::path::PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Server {
    fn start() -> Server {
        let dir = std::env::temp_dir().join(format!("createos-redis-{}", uuid_like()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = Server { child: None, port: free_port(), dir };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (CI installs it in .ci/run)");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.as_ref().unwrap().id()).unwrap()
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, sig: &str) {
        Command::new("kill").args([sig, &self.pid().to_string()]).status().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal("-CONT");
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn uuid_like() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    format!("{}-{}", std::process::id(), SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos())
}

/// The warnings queue and `take_warnings` are process-wide: these tests run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn shared_pacer(url: &str, key: &str, mode: PacingMode) -> Arc<Pacer> {
    let p = Pacer::with_key(key, mode);
    p.set_store(Some(Arc::new(RedisStore::new(url).unwrap())));
    Arc::new(p)
}

async fn zcard(url: &str, key: &str) -> i64 {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("ZCARD").arg(format!("{KEY_PREFIX}{{{key}}}:starts")).query_async(&mut c).await.unwrap()
}

/// Waits (up to 3 s) until the budget key holds `n` members. A given-up reservation is
/// released on a task of its own (the waiter never waits for the store), so its member leaves
/// Redis a moment after the waiter returned.
async fn settles_at(url: &str, key: &str, n: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let members = zcard(url, key).await;
        if members == n {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {members} members, not {n}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A caller of `p` on a task of its own; the task answers when it started.
fn spawn_waiter(p: &Arc<Pacer>) -> tokio::task::JoinHandle<Instant> {
    let p = p.clone();
    tokio::spawn(async move {
        p.acquire(&Ctx::new(Abort::new())).await.unwrap();
        Instant::now()
    })
}

/// Most starts in any window of `window` (half-open).
fn max_in_window(starts: &[Instant], window: Duration) -> usize {
    let mut sorted = starts.to_vec();
    sorted.sort();
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..sorted.len() {
        while sorted[hi] >= sorted[lo] + window {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

/// Decisions are made on the server's clock and the waits arrive over loopback: a start is
/// observed here a little off (a busy machine delays a task by tens of ms). Windows are checked
/// shrunk by this much.
const JITTER: Duration = Duration::from_millis(50);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_free_their_slots_in_redis() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let server = Server::start();
    let key = "cancel-test";
    let p = shared_pacer(&server.url(), key, PacingMode::Window { limit: 2, window: Duration::from_secs(1) });
    let t0 = Instant::now();
    for _ in 0..2 {
        p.acquire(&Ctx::new(Abort::new())).await.unwrap();
    }
    let mut waiters = vec![];
    for _ in 0..6 {
        let p = p.clone();
        waiters.push(tokio::spawn(async move {
            let ctx = Ctx::with_deadline(Abort::new(), Instant::now() + Duration::from_millis(100));
            p.acquire(&ctx).await
        }));
    }
    for w in waiters {
        assert!(w.await.unwrap().is_err());
    }
    settles_at(&server.url(), key, 2, "the six cancelled members are gone from Redis").await;
    p.acquire(&Ctx::new(Abort::new())).await.unwrap();
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(1000) - JITTER && waited < Duration::from_millis(1500), "{waited:?}");
    assert!(p.store().is_some_and(|s| !s.is_down()));
    assert!(pacer::take_warnings().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_pause_holds_other_processes_waiters() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let server = Server::start();
    let key = "pause-test";
    let mode = PacingMode::Window { limit: 1, window: Duration::from_millis(200) };
    let a = shared_pacer(&server.url(), key, mode);
    let b = shared_pacer(&server.url(), key, mode);
    a.acquire(&Ctx::new(Abort::new())).await.unwrap();
    // b reserves the next slot (~200 ms out) and waits; then a sees a 429 with 600 ms.
    let waiter = spawn_waiter(&b);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let paused_at = Instant::now();
    a.pause(Duration::from_millis(600)).await;
    let started = waiter.await.unwrap();
    assert!(started >= paused_at + Duration::from_millis(600) - JITTER, "{:?}", started - paused_at);
    // And a fresh caller of b (which never saw the 429) is held too.
    let t = Instant::now();
    b.acquire(&Ctx::new(Abort::new())).await.unwrap();
    assert!(Instant::now() >= t.min(started) + Duration::from_millis(200) - JITTER);
    assert!(pacer::take_warnings().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_falls_back_once_and_comes_back() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let mut server = Server::start();
    let key = "outage-test";
    let mode = PacingMode::Window { limit: 5, window: Duration::from_millis(300) };
    let p = shared_pacer(&server.url(), key, mode);
    for _ in 0..3 {
        p.acquire(&Ctx::new(Abort::new())).await.unwrap();
    }
    assert_eq!(zcard(&server.url(), key).await, 3);

    // Killed: every call still gets a slot (local budget, same rule), one warning in all.
    server.kill();
    let mut starts = vec![];
    let t = Instant::now();
    for _ in 0..12 {
        p.acquire(&Ctx::new(Abort::new())).await.unwrap();
        starts.push(Instant::now());
    }
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(max_in_window(&starts, mode.rule().unwrap().window - JITTER) <= 5);
    assert_eq!(pacer::take_warnings(), vec![STORE_DOWN]);

    // Back on the same port: after the backoff the store is used again.
    server.spawn();
    let deadline = Instant::now() + Duration::from_secs(5);
    while p.store().unwrap().is_down() {
        assert!(Instant::now() < deadline, "the store was not used again");
        p.acquire(&Ctx::new(Abort::new())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(zcard(&server.url(), key).await >= 1);
    assert_eq!(pacer::take_warnings(), vec![STORE_RESTORED]);

    // Slow (stopped), once the window after the return has passed (decisions are local for
    // that window): a decision gives up after its bound; a cleanup's wait is not held.
    tokio::time::sleep(mode.rule().unwrap().window + Duration::from_millis(100)).await;
    server.signal("-STOP");
    let ctx = Ctx::with_deadline(Abort::new(), Instant::now() + Duration::from_secs(2));
    let t = Instant::now();
    p.acquire(&ctx).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(pacer::take_warnings(), vec![STORE_DOWN]);
    server.signal("-CONT");
}

/// A store across a network: 100 ms round trips (a `DelayProxy` in front of the server), and
/// the server's first two answers on a connection 200 ms later still. The first decision of a
/// process connects (TCP, the handshake, the script's first load: about four round trips,
/// ~700 ms here), more than one decision's bound, and the script's first answer alone takes
/// longer than that bound; a decision on a new connection has the connection's bound as well,
/// so every decision is shared and nothing warns. Later decisions take one round trip each.
/// Before that, this store was never used (still down after 10 s of probes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_across_a_slow_network_is_used_from_the_first_decision() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let server = Server::start();
    let proxy = DelayProxy::start(server.port, Duration::from_millis(50), 2, Duration::from_millis(200)).await;
    let url = format!("redis://127.0.0.1:{}/0", proxy.port());
    let key = "slow-network-test";
    let p = shared_pacer(&url, key, PacingMode::Window { limit: 100, window: Duration::from_secs(10) });
    let t = Instant::now();
    p.acquire(&Ctx::new(Abort::new())).await.unwrap();
    let first = t.elapsed();
    assert!(!p.store().unwrap().is_down(), "the first decision fell back after {first:?}");
    assert!(first >= Duration::from_millis(300), "{first:?}: the proxy did not delay");
    let mut later = vec![];
    for _ in 0..4 {
        let t = Instant::now();
        p.acquire(&Ctx::new(Abort::new())).await.unwrap();
        later.push(t.elapsed());
    }
    assert!(!p.store().unwrap().is_down());
    assert!(later.iter().all(|d| *d >= Duration::from_millis(100)), "{later:?}: not through the proxy");
    assert_eq!(zcard(&server.url(), key).await, 5, "every decision was made in the store");
    let warnings = pacer::take_warnings();
    assert!(warnings.is_empty(), "{warnings:?}");
    drop(proxy);
}

/// A first decision waits for a new connection (up to its bound), and an abort does not wait
/// for that: a stopped server, an abort at 100 ms, the call rejects at once. The slot it may
/// have taken is given back once the server answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_does_not_wait_for_a_decision() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let server = Server::start();
    let key = "abort-decision-test";
    server.signal("-STOP");
    let p = shared_pacer(&server.url(), key, PacingMode::Window { limit: 5, window: Duration::from_secs(10) });
    let abort = Abort::new();
    let ctx = Ctx::new(abort.clone());
    let t = Instant::now();
    let aborter = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        abort.abort(false);
    });
    let r = p.acquire(&ctx).await;
    let took = t.elapsed();
    aborter.await.unwrap();
    assert!(r.is_err(), "the aborted wait rejects");
    assert!(took < Duration::from_millis(500), "{took:?}");
    server.signal("-CONT");
    // A later decision is shared, and the aborted one holds no slot.
    p.acquire(&Ctx::new(Abort::new())).await.unwrap();
    settles_at(&server.url(), key, 1, "the aborted decision kept a slot").await;
    assert!(!p.store().unwrap().is_down());
    assert!(pacer::take_warnings().is_empty());
}

/// A connection the server closed while idle (`CLIENT KILL`, as a restart or an idle proxy
/// does) is gone, not the store: the next decision is made on a new connection, with no
/// warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_while_idle_is_replaced_without_a_warning() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let server = Server::start();
    let key = "killed-connection-test";
    let p = shared_pacer(&server.url(), key, PacingMode::Window { limit: 100, window: Duration::from_secs(10) });
    p.acquire(&Ctx::new(Abort::new())).await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(killed, 1, "the store's one connection");
    for _ in 0..3 {
        p.acquire(&Ctx::new(Abort::new())).await.unwrap();
    }
    assert!(!p.store().unwrap().is_down());
    assert_eq!(zcard(&server.url(), key).await, 4, "every decision was made in the store");
    assert!(pacer::take_warnings().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_never_shows() {
    let url = "redis://:hunter2-secret@127.0.0.1:1/0";
    let store = RedisStore::new(url).unwrap();
    let c = createos_execute_core::config::parse_config(
        &serde_json::json!({"apiUrl": "https://x.io", "pacing": {"store": url}}),
    )
    .unwrap();
    assert!(!format!("{:?}", c.pacing).contains("hunter2"));
    drop(store);
    let bad = createos_execute_core::config::parse_config(
        &serde_json::json!({"apiUrl": "https://x.io", "pacing": {"store": "rediz://:hunter2@h"}}),
    );
    assert!(!bad.err().unwrap().to_string().contains("hunter2"));
}

/// A throwaway CA (`ca.pem`) and a leaf for `localhost` (`srv.pem`, `srv.key`), made with rcgen.
fn write_test_pki(dir: &std::path::Path) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.distinguished_name.push(DnType::CommonName, "createos-execute pacing test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("srv.pem"), leaf_cert.pem()).unwrap();
    std::fs::write(dir.join("srv.key"), leaf_key.serialize_pem()).unwrap();
}

/// `rediss://` with the client's trust rules: a server whose CA is only in
/// `NODE_EXTRA_CA_CERTS` is trusted when that variable names it, and refused (fallback, one
/// warning) when it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_trusts_node_extra_ca_certs() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let dir = std::env::temp_dir().join(format!("createos-redis-tls-{}", uuid_like()));
    std::fs::create_dir_all(&dir).unwrap();
    write_test_pki(&dir);
    let port = free_port();
    let child = Command::new("redis-server")
        .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
        .args("--appendonly no --tls-cert-file srv.pem --tls-key-file srv.key".split(' '))
        .args("--tls-ca-cert-file ca.pem --tls-auth-clients no".split(' '))
        .current_dir(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut server = Server { child: Some(child), port, dir: dir.clone() };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "redis-server (TLS) did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let url = format!("rediss://localhost:{port}/0");
    let mode = PacingMode::Window { limit: 5, window: Duration::from_millis(200) };

    let ca = dir.join("ca.pem").to_string_lossy().into_owned();
    let with_env = |env: NetEnv| {
        let p = Pacer::with_key("tls", mode);
        p.set_store(Some(Arc::new(RedisStore::with_env(&url, &env).unwrap())));
        p
    };
    let trusted = with_env(NetEnv::from_pairs([("NODE_EXTRA_CA_CERTS", ca.as_str())]));
    trusted.acquire(&Ctx::new(Abort::new())).await.unwrap();
    assert!(!trusted.store().unwrap().is_down(), "TLS with the extra CA works");
    assert!(pacer::take_warnings().is_empty());

    let untrusted = with_env(NetEnv::default());
    untrusted.acquire(&Ctx::new(Abort::new())).await.unwrap();
    assert!(untrusted.store().unwrap().is_down(), "an unknown CA is refused");
    assert_eq!(pacer::take_warnings(), vec![STORE_DOWN]);
    server.kill();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Two "processes" (each its own connection) share one budget key; callers of both classes
    /// arrive in any order, some give up while they wait: no window over the limit (all starts
    /// together), and what was given up is gone from Redis.
    #[test]
    fn shared_callers_never_exceed_the_window(
        limit in 1usize..5,
        window_ms in 200u64..450,
        callers in proptest::collection::vec(
            (0u64..600, any::<bool>(), proptest::option::of(20u64..300), proptest::bool::weighted(0.3)), 4..24),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (starts, members, granted) = rt.block_on(async move {
            let _serial = SERIAL.lock().await;
            let server = Server::start();
            let key = "prop";
            let window = Duration::from_millis(window_ms);
            let mode = PacingMode::Window { limit, window };
            let pacers = [shared_pacer(&server.url(), key, mode), shared_pacer(&server.url(), key, mode)];
            let starts = Arc::new(Mutex::new(vec![]));
            let mut tasks = vec![];
            for (delay, which, give_up, cleanup) in callers {
                let p = pacers[usize::from(which)].clone();
                let starts = starts.clone();
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    let ctx = Ctx {
                        abort: Abort::new(),
                        deadline: give_up.map(|ms| Instant::now() + Duration::from_millis(ms)),
                        class: if cleanup { Class::Cleanup } else { Class::New },
                    };
                    if p.acquire(&ctx).await.is_ok() {
                        starts.lock().unwrap().push(Instant::now());
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let starts = starts.lock().unwrap().clone();
            let members = zcard(&server.url(), key).await;
            assert!(pacers.iter().all(|p| !p.store().unwrap().is_down()));
            let granted = starts.len();
            (starts, members, granted)
        });
        prop_assert!(max_in_window(&starts, Duration::from_millis(window_ms) - JITTER) <= limit);
        prop_assert!(usize::try_from(members).unwrap() <= granted, "cancelled members left in Redis");
    }
}

/// A password over plain `redis://` to a host that is not loopback is refused at config time,
/// with a fixed message that names `rediss://` and never the URL; loopback, TLS, no password,
/// and the explicit opt-in are accepted.
#[test]
fn a_password_in_clear_to_a_remote_host_is_refused() {
    use createos_execute_core::config::parse_config;
    use createos_execute_core::error::Error;
    use createos_execute_core::pacer::redis_store::{PLAINTEXT_PASSWORD, PLAINTEXT_PASSWORD_ENV};
    let cfg = |pacing: serde_json::Value, env: Option<&str>| {
        let mut c = serde_json::json!({"apiUrl": "https://x.io", "pacing": pacing});
        if let Some(e) = env {
            c["pacingStoreDefault"] = serde_json::json!(e);
        }
        parse_config(&c)
    };
    for url in [
        "redis://:hunter2@redis.internal:6379/0",
        "redis://app:hunter2@10.0.0.5/0",
        "redis://:hunter2@[2001:db8::1]:6379",
        "redis://:hunter2@localhost.example.com",
    ] {
        let err = cfg(serde_json::json!({"store": url}), None).err().unwrap();
        assert!(matches!(err, Error::Input(m) if m == PLAINTEXT_PASSWORD), "{url}");
        assert!(err.to_string().contains("rediss://") && !err.to_string().contains("hunter2"));
        let env = cfg(serde_json::json!("window"), Some(url)).err().unwrap();
        assert!(matches!(env, Error::Input(m) if m == PLAINTEXT_PASSWORD_ENV), "{url}");
        assert!(!env.to_string().contains("hunter2"));
        let opted = cfg(serde_json::json!({"store": url, "allowPlaintextPassword": true}), None);
        assert!(opted.is_ok(), "{url}: the opt-in allows it");
        let opted_env = cfg(serde_json::json!({"allowPlaintextPassword": true}), Some(url));
        assert!(opted_env.is_ok(), "{url}: the opt-in covers the environment's store");
    }
    for url in [
        "redis://:hunter2@127.0.0.1:6379/0",
        "redis://:hunter2@127.0.0.9",
        "redis://:hunter2@localhost:6379",
        "redis://:hunter2@[::1]:6379",
        "rediss://:hunter2@redis.internal:6380/0",
        "redis://redis.internal:6379/0",
    ] {
        assert!(cfg(serde_json::json!({"store": url}), None).is_ok(), "{url}");
    }
    assert!(cfg(serde_json::json!({"store": "redis://h", "allowPlaintextPassword": "yes"}), None).is_err());
}

/// Two processes on one store: one queues new work far beyond the budget, the other's cleanup
/// asks later and takes the next free slot ahead of all of it; the queue moves one slot, and
/// the window rule holds for all starts together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_of_one_process_overtakes_another_processes_queued_new_work() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let server = Server::start();
    let key = "priority-test";
    let window = Duration::from_millis(500);
    let mode = PacingMode::Window { limit: 2, window };
    let a = shared_pacer(&server.url(), key, mode);
    let b = shared_pacer(&server.url(), key, mode);
    b.acquire(&Ctx::new(Abort::new())).await.unwrap(); // b's connection is up
    let t0 = Instant::now();
    let starts = Arc::new(Mutex::new(vec![]));
    let mut tasks = vec![];
    for _ in 0..10 {
        let (a, starts) = (a.clone(), starts.clone());
        tasks.push(tokio::spawn(async move {
            a.acquire(&Ctx::new(Abort::new())).await.unwrap();
            starts.lock().unwrap().push(Instant::now());
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // a's ten hold slots out to ~2 s; b's cleanup asks now.
    b.acquire(&Ctx::cleanup(Duration::from_secs(5))).await.unwrap();
    let cleanup = Instant::now();
    starts.lock().unwrap().push(cleanup);
    for t in tasks {
        t.await.unwrap();
    }
    let starts = starts.lock().unwrap().clone();
    let waited = cleanup - t0;
    assert!(waited < window + Duration::from_millis(300), "the cleanup waited {waited:?} behind the queue");
    let last = *starts.iter().max().unwrap() - t0;
    assert!(last >= Duration::from_millis(2500) - JITTER, "the queue did not move: last start at {last:?}");
    assert!(max_in_window(&starts, window - JITTER) <= 2, "{:?}", starts.iter().map(|s| *s - t0).collect::<Vec<_>>());
    assert!(!a.store().unwrap().is_down() && !b.store().unwrap().is_down());
    assert!(pacer::take_warnings().is_empty());
}

/// A reservation that the store made after its decision gave up (the server stopped with the
/// op in its socket and ran it later) is released once the store answers again: no phantom
/// start counted for every process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_made_after_its_decision_gave_up_is_released() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let server = Server::start();
    let key = "late-reservation-test";
    let p = shared_pacer(&server.url(), key, PacingMode::Window { limit: 5, window: Duration::from_secs(30) });
    p.acquire(&Ctx::new(Abort::new())).await.unwrap();
    server.signal("-STOP");
    // Gives up after the decision's bound and starts on the local budget.
    p.acquire(&Ctx::new(Abort::new())).await.unwrap();
    assert!(p.store().unwrap().is_down());
    assert_eq!(p.store().unwrap().owed(), 1);
    server.signal("-CONT");
    // The server runs the reservation it had read; the probe (on its own timer) carries the
    // owed release and the start decided locally.
    let deadline = Instant::now() + Duration::from_secs(5);
    while p.store().unwrap().is_down() {
        assert!(Instant::now() < deadline, "the store was not probed again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    settles_at(&server.url(), key, 2, "the first start and the one decided locally; no phantom").await;
    p.acquire(&Ctx::new(Abort::new())).await.unwrap();
    assert!(!p.store().unwrap().is_down());
    settles_at(&server.url(), key, 3, "the three real starts; no phantom").await;
    assert_eq!(p.store().unwrap().owed(), 0);
    assert_eq!(pacer::take_warnings(), vec![STORE_DOWN, STORE_RESTORED]);
}

/// A waiter that gives up while the store does not answer owes its release; it is sent when
/// the store answers again, so the slot is free for every process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_store_did_not_take_is_sent_when_it_answers() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let server = Server::start();
    let key = "owed-release-test";
    let p = shared_pacer(&server.url(), key, PacingMode::Window { limit: 1, window: Duration::from_secs(30) });
    p.acquire(&Ctx::new(Abort::new())).await.unwrap();
    // Two waiters hold slots in Redis; the server stops; the first gives up (its release finds
    // no answer and marks the store down), then the second, while the store is marked down
    // (its release is not even sent).
    let w1 = {
        let p = p.clone();
        tokio::spawn(async move {
            p.acquire(&Ctx::with_deadline(Abort::new(), Instant::now() + Duration::from_millis(400))).await
        })
    };
    let abort2 = Abort::new();
    let w2 = {
        let (p, ctx) = (p.clone(), Ctx::new(abort2.clone()));
        tokio::spawn(async move { p.acquire(&ctx).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(zcard(&server.url(), key).await, 3, "the waiters hold slots");
    server.signal("-STOP");
    assert!(w1.await.unwrap().is_err());
    let deadline = Instant::now() + Duration::from_secs(3);
    while !p.store().unwrap().is_down() {
        assert!(Instant::now() < deadline, "the store was not marked down");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    abort2.abort(false);
    assert!(w2.await.unwrap().is_err());
    assert!(p.store().unwrap().owed() >= 1);
    server.signal("-CONT");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The next decision carries what is owed; its own waiter gives up too.
    let r = p.acquire(&Ctx::with_deadline(Abort::new(), Instant::now() + Duration::from_millis(300))).await;
    assert!(r.is_err());
    settles_at(&server.url(), key, 1, "a given-up slot is still held in Redis").await;
    assert_eq!(p.store().unwrap().owed(), 0);
    assert_eq!(pacer::take_warnings(), vec![STORE_DOWN, STORE_RESTORED]);
}

/// `confirm` answers from the member's state, so running it again (the one retry on a new
/// connection after a lost answer) gives the same answer: a waiter moved behind a pause is not
/// started inside it by the retry. `reserve` likewise keeps the slot it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_and_reserve_are_idempotent() {
    use createos_execute_core::pacer::redis_store::{new_member, Answer, Confirmed};
    use createos_execute_core::pacer::Rule;
    let _serial = SERIAL.lock().await;
    let server = Server::start();
    let key = "idempotent-test";
    let store = RedisStore::new(&server.url()).unwrap();
    let rule = Rule { limit: 5, window: Duration::from_secs(10) };
    let m = new_member(Class::New);
    assert!(matches!(store.reserve(key, rule, &m).await, Answer::Wait(w) if w.is_zero()));
    assert!(matches!(store.reserve(key, rule, &m).await, Answer::Wait(w) if w.is_zero()), "the same slot");
    assert_eq!(zcard(&server.url(), key).await, 1);
    store.pause(key, Duration::from_secs(2)).await;
    let moved = |c: Option<Confirmed>, what: &str| match c {
        Some(Confirmed::Moved(w)) => w,
        other => panic!("{what}: {other:?}"),
    };
    let first = moved(store.confirm(key, rule, &m).await, "moved behind the pause");
    let again = moved(store.confirm(key, rule, &m).await, "still behind the pause");
    assert!(first > Duration::from_millis(1500) && again > Duration::from_millis(1500), "{first:?} {again:?}");
    assert!(first.abs_diff(again) < Duration::from_millis(200));
    // A reservation repeated after it moved keeps the moved slot.
    let Answer::Wait(w) = store.reserve(key, rule, &m).await else { panic!("no answer") };
    assert!(w > Duration::from_millis(1500), "{w:?}");
    assert_eq!(zcard(&server.url(), key).await, 1);
}

/// A loopback TCP proxy to a Redis server that, once armed, drops the next answer the server
/// sends and closes that connection (the op ran; its answer was lost on the way).
struct LosingProxy {
    port: u16,
    arm: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl LosingProxy {
    async fn start(upstream: u16) -> LosingProxy {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let arm = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let armed = arm.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((down, _)) = listener.accept().await {
                let armed = armed.clone();
                conns.spawn(async move {
                    let Ok(up) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else { return };
                    let (mut dr, mut dw) = down.into_split();
                    let (mut ur, mut uw) = up.into_split();
                    let to_server = async move {
                        let _ = tokio::io::copy(&mut dr, &mut uw).await;
                    };
                    let to_client = async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match ur.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if armed.swap(false, Ordering::SeqCst) {
                                return; // the answer is lost and the connection ends
                            }
                            if dw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    tokio::select! {
                        () = to_server => {}
                        () = to_client => {}
                    }
                });
            }
        });
        LosingProxy { port, arm, task }
    }
}

impl Drop for LosingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A waiter's slot comes inside a pause another process began: its `confirm` moves it behind
/// the pause, and that answer is lost with its connection. The one retry on a new connection
/// asks again and must get the same answer, not "start now" inside the pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_confirm_answer_retried_on_a_new_connection_does_not_start_inside_a_pause() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let server = Server::start();
    let proxy = LosingProxy::start(server.port).await;
    let key = "lost-answer-test";
    let mode = PacingMode::Window { limit: 1, window: Duration::from_millis(400) };
    let a = shared_pacer(&format!("redis://127.0.0.1:{}/0", proxy.port), key, mode);
    let other = shared_pacer(&server.url(), key, mode);
    a.acquire(&Ctx::new(Abort::new())).await.unwrap();
    let waiter = spawn_waiter(&a);
    tokio::time::sleep(Duration::from_millis(150)).await;
    settles_at(&server.url(), key, 2, "the waiter holds the next slot").await;
    // Another process sees a 429; its pause reaches the store before the waiter's slot comes.
    let paused_at = Instant::now();
    other.pause(Duration::from_millis(1500)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.arm.store(true, std::sync::atomic::Ordering::SeqCst);
    let started = waiter.await.unwrap();
    assert!(!proxy.arm.load(std::sync::atomic::Ordering::SeqCst), "an answer was dropped");
    assert!(
        started >= paused_at + Duration::from_millis(1500) - JITTER,
        "started {:?} after the pause began (a 1.5 s pause)",
        started - paused_at
    );
    assert!(!a.store().unwrap().is_down(), "the retry on a new connection answered");
    assert!(pacer::take_warnings().is_empty());
}

/// Three "processes" (each a pacer with its own store connection) × four lanes at 12 starts
/// per 3 s: each lane starts a request as soon as its pacer allows, until `stop` is aborted.
/// Every start is taken as the caller saw it.
const FLEET_LIMIT: usize = 12;
const FLEET_WINDOW: Duration = Duration::from_secs(3);

struct Fleet {
    pacers: Vec<Arc<Pacer>>,
    stop: Abort,
    starts: Arc<Mutex<Vec<Instant>>>,
    lanes: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    fn start(url: &str, key: &str) -> Fleet {
        let mode = PacingMode::Window { limit: FLEET_LIMIT, window: FLEET_WINDOW };
        let pacers: Vec<Arc<Pacer>> = (0..3).map(|_| shared_pacer(url, key, mode)).collect();
        let stop = Abort::new();
        let starts = Arc::new(Mutex::new(vec![]));
        let mut lanes = vec![];
        for p in &pacers {
            for _ in 0..4 {
                let (p, stop, starts) = (p.clone(), stop.clone(), starts.clone());
                lanes.push(tokio::spawn(async move {
                    while p.acquire(&Ctx::new(stop.clone())).await.is_ok() {
                        starts.lock().unwrap().push(Instant::now());
                    }
                }));
            }
        }
        Fleet { pacers, stop, starts, lanes }
    }

    /// Waits (up to 10 s) for the first window's starts; returns the first of them.
    async fn first_burst(&self) -> Instant {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.starts.lock().unwrap().clone();
            if s.len() >= FLEET_LIMIT {
                return *s.iter().min().unwrap();
            }
            assert!(Instant::now() < deadline, "the fleet did not start: {} starts", s.len());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Ends every lane; returns the starts, sorted.
    async fn finish(self) -> Vec<Instant> {
        self.stop.abort(false);
        for l in self.lanes {
            l.await.unwrap();
        }
        let mut s = self.starts.lock().unwrap().clone();
        s.sort();
        s
    }
}

/// The starts as offsets from the first, in ms (for a failure message).
fn offsets(starts: &[Instant]) -> Vec<u128> {
    starts.iter().map(|s| (*s - starts[0]).as_millis()).collect()
}

/// The store answers 200 ms late (the server stopped with `SIGSTOP`, inside the decision's
/// bound), just as the second and the third window's waiters confirm their slots: the starts
/// happen late, and the store counts them where they happened, so the next window's are placed
/// from there. No window of 3 s at the callers holds more than the limit (+ 2 for the clocks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_answer_does_not_let_the_fleet_exceed_its_budget() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let server = Server::start();
    let fleet = Fleet::start(&server.url(), "stall-test");
    let first = fleet.first_burst().await;
    for n in 1..=2u32 {
        tokio::time::sleep_until(first + FLEET_WINDOW * n - Duration::from_millis(50)).await;
        server.signal("-STOP");
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.signal("-CONT");
    }
    tokio::time::sleep_until(first + FLEET_WINDOW * 3 + Duration::from_millis(500)).await;
    let pacers = fleet.pacers.clone();
    let starts = fleet.finish().await;
    let most = max_in_window(&starts, FLEET_WINDOW);
    eprintln!("{} starts, at most {most} in one window of 3 s (limit {FLEET_LIMIT})", starts.len());
    assert!(starts.len() >= 2 * FLEET_LIMIT, "{} starts", starts.len());
    assert!(most <= FLEET_LIMIT + 2, "{most} starts in one window of 3 s: {:?}", offsets(&starts));
    drop(pacers);
    let _ = pacer::take_warnings();
}

/// Redis killed just before the second window's waiters confirm, and restarted 300 ms later on
/// the same port (empty): while it is down each process keeps to its share of the limit, and
/// the restarted store learns the starts of the window that spans the outage. No window of 3 s
/// at the callers holds more than the limit (+ 2), and every process uses the store again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_the_same_port_does_not_let_the_fleet_exceed_its_budget() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let mut server = Server::start();
    let fleet = Fleet::start(&server.url(), "restart-test");
    let first = fleet.first_burst().await;
    tokio::time::sleep_until(first + FLEET_WINDOW - Duration::from_millis(50)).await;
    server.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.spawn();
    tokio::time::sleep_until(first + FLEET_WINDOW * 3 + Duration::from_millis(500)).await;
    let pacers = fleet.pacers.clone();
    let starts = fleet.finish().await;
    let most = max_in_window(&starts, FLEET_WINDOW);
    eprintln!("{} starts, at most {most} in one window of 3 s (limit {FLEET_LIMIT})", starts.len());
    assert!(starts.len() >= 2 * FLEET_LIMIT, "{} starts", starts.len());
    assert!(most <= FLEET_LIMIT + 2, "{most} starts in one window of 3 s: {:?}", offsets(&starts));
    let deadline = Instant::now() + Duration::from_secs(10);
    while pacers.iter().any(|p| p.store().unwrap().is_down()) {
        assert!(Instant::now() < deadline, "a process did not use the store again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = pacer::take_warnings();
}

/// 1,100 waiters at 10 per 2 s (slots out to 220 s) are cancelled while the store does not
/// answer: more releases than are owed per key, so some members stay in Redis for waiters that
/// are gone. Once it answers again, every owed release goes with the next op on the key (at the
/// latest the fresh caller's), and the members left count only in their own windows: a fresh
/// caller on the idle budget starts within one window, not behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_with_many_cancelled_waiters_a_fresh_caller_starts_within_a_window() {
    use createos_execute_core::pacer::redis_store::MAX_OWED;
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let server = Server::start();
    let key = "phantom-test";
    let window = Duration::from_secs(2);
    let mode = PacingMode::Window { limit: 10, window };
    let store = Arc::new(RedisStore::new(&server.url()).unwrap());
    let p = Arc::new(Pacer::with_key(key, mode));
    p.set_store(Some(store.clone()));
    // Another budget key on the same store: its decisions show when the store answers again.
    let other = Pacer::with_key("phantom-test-other", mode);
    other.set_store(Some(store));
    p.acquire(&Ctx::new(Abort::new())).await.unwrap(); // the connection is up
    let waiters = 1_100usize;
    let mut aborts = vec![];
    let mut tasks = vec![];
    // They arrive 100 at a time (a loaded machine answers a burst of 1,100 more slowly than
    // the decision's bound), each hundred once the one before holds its members.
    let deadline = Instant::now() + Duration::from_secs(60);
    for batch in 1..=waiters / 100 {
        for _ in 0..100 {
            let (p, abort) = (p.clone(), Abort::new());
            aborts.push(abort.clone());
            tasks.push(tokio::spawn(async move { p.acquire(&Ctx::new(abort)).await }));
        }
        // Every waiter holds a member (9 of them start at once, in the first window, and
        // leave the set a window later).
        loop {
            let members = zcard(&server.url(), key).await;
            if members >= i64::try_from(batch * 100 - 9).unwrap() {
                break;
            }
            let down = p.store().unwrap().is_down();
            assert!(Instant::now() < deadline, "the waiters did not reserve: {members} members, store down: {down}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(!p.store().unwrap().is_down(), "every waiter reserved in the store");
    server.signal("-STOP");
    for a in &aborts {
        a.abort(false);
    }
    let mut started = 0;
    for t in tasks {
        if t.await.unwrap().is_ok() {
            started += 1;
        }
    }
    assert!(started <= 10, "{started} waiters started");
    // Their releases find no answer and are owed (at most MAX_OWED per key).
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.store().unwrap().owed() < MAX_OWED.min(waiters - started) {
        assert!(Instant::now() < deadline, "{} releases owed", p.store().unwrap().owed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(p.store().unwrap().is_down());
    // Idle: the outage lasts longer than the window.
    tokio::time::sleep(window).await;
    server.signal("-CONT");
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.store().unwrap().is_down() {
        assert!(Instant::now() < deadline, "the store was not used again");
        other.acquire(&Ctx::new(Abort::new())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // For one window after its return the store only learns the starts made meanwhile (each
    // process keeps to its share); then it decides again.
    tokio::time::sleep(window + Duration::from_millis(200)).await;
    let t = Instant::now();
    let fresh = p.acquire(&Ctx::with_deadline(Abort::new(), t + Duration::from_secs(20))).await;
    let waited = t.elapsed();
    assert!(fresh.is_ok() && waited < window, "the fresh caller waited {waited:?} (a window is {window:?})");
    assert!(!p.store().unwrap().is_down(), "the fresh caller was placed by the store");
    assert_eq!(p.store().unwrap().owed(), 0, "every owed release was sent");
    let left = usize::try_from(zcard(&server.url(), key).await).unwrap();
    assert!(left <= 1 + 10 + (waiters - MAX_OWED), "{left} members left: the owed releases were not all sent");
    let _ = pacer::take_warnings();
}

/// Killed, then restarted on the same port: no decision is made after the restart, and the
/// probe on its own timer notices the store within 2 s, warns once, and writes back the starts
/// of the window (the one before the kill, lost with the restart, and the one made meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_is_probed_on_its_own_timer_and_learns_the_outages_starts() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let mut server = Server::start();
    let key = "probe-test";
    let p = shared_pacer(&server.url(), key, PacingMode::Window { limit: 5, window: Duration::from_secs(30) });
    p.acquire(&Ctx::new(Abort::new())).await.unwrap();
    server.kill();
    p.acquire(&Ctx::new(Abort::new())).await.unwrap();
    assert!(p.store().unwrap().is_down());
    assert_eq!(pacer::take_warnings(), vec![STORE_DOWN]);
    // Long enough for the probes to back off to their longest gap.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.spawn();
    let back = Instant::now();
    let deadline = back + Duration::from_secs(10);
    while p.store().unwrap().is_down() {
        assert!(Instant::now() < deadline, "the store was not probed again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let noticed = back.elapsed();
    assert!(noticed <= Duration::from_secs(2), "restored noticed {noticed:?} after the store's return");
    assert_eq!(pacer::take_warnings(), vec![STORE_RESTORED]);
    settles_at(&server.url(), key, 2, "the window's two starts were written back").await;
}

/// A process whose only reservation waited for its slot while the store restarted empty never
/// saw the outage. When its slot comes the store no longer holds the reservation: the process
/// keeps to its share for a window and writes its starts of the window back, so the store
/// (and every other process) counts them again. Before, the store placed the lost
/// reservation anew, knowing none of the window's starts, and a process that had taken the
/// window before the restart took a second full one beside the others' (15 and 16 of 12 in
/// the bench's restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_lost_in_an_unseen_restart_settles_and_writes_the_window_back() {
    let _serial = SERIAL.lock().await;
    let _ = pacer::take_warnings();
    let mut server = Server::start();
    let key = "unseen-restart-test";
    let window = Duration::from_secs(3);
    let a = shared_pacer(&server.url(), key, PacingMode::Window { limit: 4, window });
    let t0 = Instant::now();
    for _ in 0..2 {
        a.acquire(&Ctx::new(Abort::new())).await.unwrap();
    }
    tokio::time::sleep_until(t0 + Duration::from_millis(1500)).await;
    for _ in 0..2 {
        a.acquire(&Ctx::new(Abort::new())).await.unwrap();
    }
    // The window is full: the next waiter's slot is a window after the first starts.
    let waiter = spawn_waiter(&a);
    settles_at(&server.url(), key, 5, "four starts and the waiter's reservation").await;
    tokio::time::sleep_until(t0 + Duration::from_millis(2000)).await;
    server.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.spawn();
    let started = waiter.await.unwrap();
    assert!(started >= t0 + window - JITTER, "started {:?} after the first start", started - t0);
    let store = a.store().unwrap();
    assert!(store.settling(key), "the lost reservation settles the process for a window");
    assert!(!store.is_down(), "the store answered throughout");
    // The two starts of 1.5 s and the waiter's go back to the store.
    settles_at(&server.url(), key, 3, "the window's starts written back").await;
    assert!(pacer::take_warnings().is_empty(), "no outage was seen");
}

/// `INFO commandstats`'s count of calls of `command` (the script's calls count too).
async fn command_calls(url: &str, command: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_a_huge_limit_a_decision_reads_no_window_and_seldom_measures_the_share() {
    use createos_execute_core::pacer::redis_store::{new_member, Answer};
    use createos_execute_core::pacer::Rule;
    let _serial = SERIAL.lock().await;
    let server = Server::start();
    let key = "huge-limit-test";
    let rule = Rule { limit: 1_000_000, window: Duration::from_secs(60) };
    // 2,000 starts of four other clients in the last second: far below the limit, and more
    // than a measure reads.
    {
        let client = redis::Client::open(server.url()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
        let now = secs * 1_000_000 + micros;
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(format!("{KEY_PREFIX}{{{key}}}:starts"));
        for i in 0..2000u64 {
            zadd.arg(now - 1_000_000 + i * 400).arg(format!("n:other{}:{i}", i % 4));
        }
        let _: () = zadd.query_async(&mut c).await.unwrap();
    }
    let store = RedisStore::new(&server.url()).unwrap();
    let reserve = |m: String| {
        let store = &store;
        async move { assert!(matches!(store.reserve(key, rule, &m).await, Answer::Wait(w) if w.is_zero())) }
    };
    // The first decision measures (nothing measured yet) and finds the read full.
    reserve(new_member(Class::New)).await;
    let before = command_calls(&server.url(), "zrevrangebyscore").await;
    assert!(before >= 1, "the first decision measured the share");
    let reads_before = command_calls(&server.url(), "zrangebyscore").await;
    let t0 = Instant::now();
    let n = 64;
    for _ in 0..n {
        reserve(new_member(Class::New)).await;
    }
    let measures = command_calls(&server.url(), "zrevrangebyscore").await - before;
    // Every eighth decision, and one per 250 ms: a read that reached the cap counts as full
    // (with the limit alone as the mark, every decision measured, reading every member).
    let timer = u64::try_from(t0.elapsed().as_millis() / 250).unwrap() + 1;
    assert!(measures <= n / 8 + timer, "{measures} measures in {n} decisions ({:?})", t0.elapsed());
    // Far below the limit, a placement is one ZCOUNT: no decision pages through the window.
    let reads = command_calls(&server.url(), "zrangebyscore").await - reads_before;
    assert_eq!(reads, 0, "window reads in {n} decisions");
}
