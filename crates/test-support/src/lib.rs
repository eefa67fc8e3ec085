//! The one helper the Rust integration tests share (the model: reqwest's `tests/support`).
//!
//! [`with_emulator`] starts an emulator on 127.0.0.1, runs the test body under a time limit,
//! and closes the emulator — which SIGKILLs and reaps every process it started — whether the
//! body returned, timed out or panicked. A panic is re-raised after the close.
//!
//! [`DelayProxy`] puts a network with a round trip in front of a loopback server (the tests of
//! the shared pacing store use it for a Redis across a network).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

pub use createos_emulator::{self as emulator, Emulator, EmulatorOptions, FaultRule, Profile, TerminationScope};
use futures_util::FutureExt;

/// How long one test body may run before it fails as "timed out".
pub const TEST_LIMIT: Duration = Duration::from_secs(40);

/// Emulator options for tests: no rate limit (tests measure the client, not the limiter).
#[must_use]
pub fn unlimited() -> EmulatorOptions {
    EmulatorOptions { rate_limit_per_minute: None, ..Default::default() }
}

/// Runs `body` against a fresh emulator started with `opts`, within [`TEST_LIMIT`], and closes
/// the emulator on every path. A test that names no profile (`opts.profile` `None`) gets the one
/// `CREATEOS_EMULATOR_PROFILE` names (`full` or `documented`; unset: full), so a suite runs
/// under either.
///
/// # Panics
/// When the emulator cannot start, when the body panics (re-raised after the close), or when
/// the body runs longer than [`TEST_LIMIT`].
pub async fn with_emulator<F, Fut>(opts: EmulatorOptions, body: F)
where
    F: FnOnce(Emulator) -> Fut,
    Fut: Future<Output = ()>,
{
    let emu = start(opts).await.expect("the emulator starts");
    let outcome = AssertUnwindSafe(tokio::time::timeout(TEST_LIMIT, body(emu.clone()))).catch_unwind().await;
    emu.close().await;
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(_)) => panic!("test timed out after {TEST_LIMIT:?}"),
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Starts an emulator as [`with_emulator`] does (the profile from `CREATEOS_EMULATOR_PROFILE`
/// when `opts` names none), for a test that closes it itself.
///
/// # Errors
/// When the emulator cannot start.
pub async fn start(mut opts: EmulatorOptions) -> std::io::Result<Emulator> {
    if opts.profile.is_none() {
        opts.profile = Profile::from_env();
    }
    emulator::start(opts).await
}

/// Waits (up to 2 s) until the emulator sees no live process it started.
///
/// # Panics
/// When processes are still alive after 2 s.
pub async fn assert_nothing_alive(emu: &Emulator) {
    assert_only_alive(emu, &[]).await;
}

/// Waits (up to 2 s) until the live processes the emulator started are exactly `pids`.
///
/// # Panics
/// When they are not, after 2 s.
pub async fn assert_only_alive(emu: &Emulator, pids: &[i32]) {
    let mut want = pids.to_vec();
    want.sort_unstable();
    let live = || {
        let mut l = emu.live_pids();
        l.sort_unstable();
        l
    };
    for _ in 0..100 {
        if live() == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("processes alive: {:?}, expected only {want:?}", live());
}

/// A TCP proxy on 127.0.0.1 that delivers every byte `one_way` after it was read, in both
/// directions: a network with a round trip of `2 × one_way` in front of a loopback server.
/// The server's first `slow_answers` answers (reads) on each connection come `extra` later
/// still: a server or a path that is slow to start. Dropping it stops accepting and ends every
/// connection it carries.
pub struct DelayProxy {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards each connection to `127.0.0.1:upstream`.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start(upstream: u16, one_way: Duration, slow_answers: usize, extra: Duration) -> DelayProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a free loopback port");
        let port = listener.local_addr().expect("its address").port();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((down, _)) = listener.accept().await {
                conns.spawn(async move {
                    let Ok(up) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else { return };
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    tokio::join!(
                        delayed_copy(dr, uw, one_way, 0, Duration::ZERO),
                        delayed_copy(ur, dw, one_way, slow_answers, extra)
                    );
                });
            }
        });
        DelayProxy { port, task }
    }

    /// The proxy's port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection's task.
        self.task.abort();
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read (the first `slow` chunks
/// `extra` later still). Reading goes on meanwhile (up to 256 chunks in flight), so the delay
/// is latency, not a throughput cap.
async fn delayed_copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    mut slow: usize,
    extra: Duration,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(tokio::time::Instant, Vec<u8>)>(256);
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let mut at = tokio::time::Instant::now() + delay;
            if slow > 0 {
                slow -= 1;
                at += extra;
            }
            if tx.send((at, buf[..n].to_vec())).await.is_err() {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

/// A `sleep` duration no other test uses (`<base>.<counter><pid><µs>`), so a /proc scan by
/// command line ([`sleepers`]) finds exactly the sleepers of one test.
#[must_use]
pub fn unique_sleep(base: u32) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{base}.{n}{:05}{:06}", std::process::id() % 100_000, nanos / 1000)
}

/// Whether `pid` is gone: no longer in /proc, a zombie (an orphan re-parented to an init that
/// does not reap stays one, but runs no more) or already in `exit` ([`createos_emulator::stat_live`]).
#[must_use]
pub fn pid_gone(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| !createos_emulator::stat_live(&s))
}

/// Live pids ([`createos_emulator::stat_live`]: not a zombie, not in `exit`) whose command line is
/// exactly `sleep <arg>`, read from /proc (not from the emulator's records, which the tests check).
#[must_use]
pub fn sleepers(arg: &str) -> Vec<i32> {
    let want = format!("sleep\0{arg}\0");
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for d in dir.flatten() {
        let Some(pid) = d.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if std::fs::read(format!("/proc/{pid}/cmdline")).ok().as_deref() != Some(want.as_bytes()) {
            continue;
        }
        if std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| createos_emulator::stat_live(&s)) {
            out.push(pid);
        }
    }
    out
}

/// The emulator's request log without the reads of a process record that the documented profile
/// adds after an exit frame (its exit frames carry no `newest_seq`, so the client reads the
/// record once to learn it): for tests whose subject is the transport, not the profile, the
/// requests of one command are then the same under both profiles. Under the full profile the
/// log is returned as it is.
#[must_use]
pub fn command_requests(emu: &Emulator) -> Vec<emulator::RequestRecord> {
    let mut reqs = emu.requests();
    if emu.profile() == Profile::Documented {
        reqs.retain(|r| r.route != "getProcess");
    }
    reqs
}
