//! The shared store: the same sliding-window rule, decided atomically in Redis by one Lua
//! script on the server's clock (`TIME`), so every process and host that uses the store shares
//! one budget per key, whatever their own clocks say.
//!
//! Per budget key there are two Redis keys under a fixed prefix: a sorted set of starts (member
//! = one reservation, score = its start in µs of server time) and the pause (a 429's
//! `Retry-After` end, µs of server time). Reservations are appended like the local store's, a
//! cancelled waiter removes its member, and a waiter whose slot has come asks again (`confirm`)
//! so a pause that began meanwhile holds it too.
//!
//! A member's first character is its class (`c` = cleanup, `n` = new work): a cleanup's
//! reservation is placed over the starts made and the other cleanups, and every waiting member
//! of new work (of any process) is placed again behind it, never earlier than before; its
//! waiter learns the new slot when it confirms. The member is the id of every decision about
//! its reservation, and each op is idempotent for it: `reserve` of a member the set holds
//! answers its slot, `confirm` answers from the member's state alone (a slot still ahead = moved
//! there; a slot that came = start, unless a pause began before it), `release` is a `ZREM`. So
//! the one retry on a new connection after a lost answer gets the answer the first run gave,
//! and never starts a request inside a pause.
//!
//! No phantom starts: a reservation whose decision found no answer (it may run on the server
//! after the decision gave up) and a release the store did not take (no answer, or the store
//! marked down) are owed to the store, per budget key, at most [`MAX_OWED`], and sent with the
//! next op on that key (the probe, once the store answers again), which removes them before it
//! decides. Beyond the cap a member is left to expire: it counts for at most its window.
//!
//! Failure is not a stampede: every decision has [`DECISION_TIMEOUT`], and one made on a
//! connection that has not answered yet [`CONNECT_TIMEOUT`] more (a store across a network
//! needs several round trips before its first answer); the first failure marks the store down
//! (one warning, [`super::STORE_DOWN`]) and the pacer falls back to its local store; while
//! down, only one probe at a time goes to Redis, at most every backoff (100 ms, doubling to
//! 2 s); the first answer marks it up again ([`super::STORE_RESTORED`]). An abort or the
//! caller's deadline does not wait for a decision.
//!
//! The URL (it may hold a password) is kept only inside the redis client; it is never
//! formatted into an error, a warning or an event.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;

use super::{warn, Rule, STORE_DOWN, STORE_RESTORED};
use crate::abort::Class;
use crate::net::NetEnv;

/// The bound of one decision on a connection that has answered before.
pub const DECISION_TIMEOUT: Duration = Duration::from_millis(250);
/// What a decision on a new connection has on top of [`DECISION_TIMEOUT`]: TCP, the handshake
/// and the script's first load take about four round trips before the first answer (measured
/// over plain TCP; TLS adds one), more than one decision's bound once the store is ~60 ms away.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Every Redis key of this package starts with this.
pub const KEY_PREFIX: &str = "createos-execute:pacing:v1:";

const SCRIPT: &str = r"
-- KEYS[1] starts (sorted set, score = start in µs of server time), KEYS[2] pause (µs)
-- ARGV: op, limit, window µs, member, pause µs, then members owed a release
-- A member's first byte is its class: 'c' (cleanup) or 'n' (new work).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local op = ARGV[1]
local limit = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local member = ARGV[4]
for i = 6, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) end
local function n2s(x) return string.format('%.0f', x) end
local function paused()
  local p = redis.call('GET', KEYS[2])
  if p then return tonumber(p) end
  return 0
end
local function append(m, earliest)
  local n = redis.call('ZCARD', KEYS[1])
  local at = earliest
  if n > 0 then
    local last = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
    if last > at then at = last end
    if n >= limit then
      local kth = tonumber(redis.call('ZRANGE', KEYS[1], n - limit, n - limit, 'WITHSCORES')[2]) + window
      if kth > at then at = kth end
    end
  end
  redis.call('ZADD', KEYS[1], n2s(at), m)
  redis.call('PEXPIRE', KEYS[1], n2s(math.floor((at - now + window) / 1000) + 1000))
  return at
end
local function place(m)
  local earliest = now
  local p = paused()
  if p > earliest then earliest = p end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', n2s(earliest - window))
  if string.sub(m, 1, 1) ~= 'c' then return append(m, earliest) - now end
  -- A cleanup goes ahead of every waiting request of new work (of any process): those are
  -- placed again behind it, in their order; their waiters learn it when they confirm.
  -- Never earlier than before: their waiters sleep until their old slots.
  local waiting = {}
  local later = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. n2s(now), '+inf', 'WITHSCORES')
  for i = 1, #later, 2 do
    if string.sub(later[i], 1, 1) ~= 'c' then table.insert(waiting, {later[i], tonumber(later[i + 1])}) end
  end
  for _, w in ipairs(waiting) do redis.call('ZREM', KEYS[1], w[1]) end
  local at = append(m, earliest)
  for _, w in ipairs(waiting) do append(w[1], math.max(earliest, w[2])) end
  return at - now
end
if op == 'reserve' then
  -- Idempotent: a retry of a decision whose answer was lost gets the same slot.
  local s = redis.call('ZSCORE', KEYS[1], member)
  if s then return {0, math.max(0, tonumber(s) - now)} end
  return {0, place(member)}
elseif op == 'confirm' then
  -- Decided by the member's state alone, so a retry answers as the first run did.
  local s = redis.call('ZSCORE', KEYS[1], member)
  local p = paused()
  if s then
    s = tonumber(s)
    if s > now then return {1, s - now} end
    if p <= now or s >= p then return {0, 0} end
    redis.call('ZREM', KEYS[1], member)
  end
  return {1, place(member)}
elseif op == 'release' then
  redis.call('ZREM', KEYS[1], member)
  return {0, 0}
elseif op == 'pause' then
  local d = tonumber(ARGV[5])
  local u = now + d
  if paused() < u then redis.call('SET', KEYS[2], n2s(u), 'PX', n2s(math.floor(d / 1000) + 1)) end
  return {0, 0}
end
return redis.error_reply('unknown op')
";

struct Health {
    down: bool,
    probing: bool,
    next_probe: Instant,
    backoff: Duration,
}

/// A connection and whether it has answered yet (then a decision has only its own bound).
#[derive(Clone)]
struct Conn {
    manager: ConnectionManager,
    answered: Arc<AtomicBool>,
}

/// One Redis store (per URL), shared by every budget key that uses it.
pub struct RedisStore {
    client: redis::Client,
    conn: Mutex<Option<Conn>>,
    health: Mutex<Health>,
    script: redis::Script,
    /// Members whose release found no answer (or whose reservation may have been made after
    /// its decision gave up), per budget key: sent with the next op on that key.
    owed: Mutex<Owed>,
}

/// Releases owed to the store, at most [`MAX_OWED`] in all; beyond that a member is left to
/// expire (it counts for at most its window).
#[derive(Default)]
struct Owed {
    by_key: std::collections::HashMap<String, Vec<String>>,
    len: usize,
}

/// Most releases owed to a store at once.
pub const MAX_OWED: usize = 1024;
/// Most owed releases sent with one op.
const OWED_PER_CALL: usize = 64;

struct ProbeGuard<'a> {
    store: &'a RedisStore,
    armed: bool,
}

impl ProbeGuard<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            lock(&self.store.health).probing = false;
        }
    }
}

/// Owed releases taken for one op: given back to the queue unless the store answered.
struct OwedGuard<'a> {
    store: &'a RedisStore,
    key: &'a str,
    members: Vec<String>,
    armed: bool,
}

impl OwedGuard<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for OwedGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            for m in std::mem::take(&mut self.members) {
                self.store.owe(self.key, &m);
            }
        }
    }
}

/// What the store answered.
pub enum Answer {
    /// Start after this wait (µs of server time from the decision).
    Wait(Duration),
    /// The store did not answer in time: fall back.
    Unavailable,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A member name unique across processes: its class (`c` = cleanup, `n` = new work, read by
/// the script), a random process nonce and a counter. The member is the id of every decision
/// about its reservation, which makes each op idempotent.
pub fn new_member(class: Class) -> String {
    static NONCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nonce = NONCE.get_or_init(|| uuid::Uuid::new_v4().simple().to_string());
    let c = match class {
        Class::Cleanup => 'c',
        Class::New => 'n',
    };
    format!("{c}:{nonce}:{}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// The trust roots for `rediss://`, by the HTTP client's rules (`net.rs`): the bundled web
/// roots, the PEM bundle named by `NODE_EXTRA_CA_CERTS` (skipped when unreadable, as Node
/// does), and the system store with `NODE_USE_SYSTEM_CA=1`; as PEM, which is what redis-rs
/// takes. (`caCertPem` is per client and not applied to the process-wide store connection.)
fn tls_roots_pem(env: &NetEnv) -> Vec<u8> {
    use base64::Engine as _;
    let mut pem = String::new();
    let mut push = |der: &[u8]| {
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(std::str::from_utf8(line).unwrap_or_default());
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    };
    for der in webpki_root_certs::TLS_SERVER_ROOT_CERTS {
        push(der.as_ref());
    }
    if env.use_system_ca() {
        for der in rustls_native_certs::load_native_certs().certs {
            // Only what rustls accepts as a root: one odd system certificate must not make the
            // whole bundle unparsable.
            if rustls::RootCertStore::empty().add(der.clone()).is_ok() {
                push(der.as_ref());
            }
        }
    }
    let mut out = pem.into_bytes();
    if let Some(extra) = env.extra_ca_file().and_then(|path| std::fs::read(path).ok()) {
        if crate::net::pem_certificates(&extra).is_some() {
            out.push(b'\n');
            out.extend_from_slice(&extra);
        }
    }
    out
}

/// Whether `url` is a `redis://` or `rediss://` URL the client accepts (nothing is connected).
pub fn valid_url(url: &str) -> bool {
    let Ok(u) = url::Url::parse(url) else { return false };
    matches!(u.scheme(), "redis" | "rediss")
        && u.host_str().is_some_and(|h| !h.is_empty())
        && redis::IntoConnectionInfo::into_connection_info(url).is_ok()
}

/// A `redis://` password to a host that is not loopback would cross the network in clear.
pub const PLAINTEXT_PASSWORD: &str = "pacing.store would send its password in clear: a redis:// URL with a password must point at a loopback host; use rediss:// (TLS), or set pacing.allowPlaintextPassword to true on a private network you trust.";
pub const PLAINTEXT_PASSWORD_ENV: &str = "CREATEOS_PACING_STORE would send its password in clear: a redis:// URL with a password must point at a loopback host; use rediss:// (TLS), or set pacing.allowPlaintextPassword to true on a private network you trust.";

/// Whether `url` is a plain `redis://` URL that carries a password to a host that is not loopback (`localhost`, 127.0.0.0/8,
/// `::1`): its password would cross the network unencrypted. The API key is held to HTTPS; the
/// store's password is held to TLS the same way, unless the host opts in
/// (`pacing.allowPlaintextPassword`).
pub fn password_in_clear(url: &str) -> bool {
    let Ok(u) = url::Url::parse(url) else { return false };
    if u.scheme() != "redis" || u.password().is_none_or(str::is_empty) {
        return false;
    }
    match u.host() {
        // A redis:// host is opaque to the URL parser: an IPv4 address arrives as a "domain".
        Some(url::Host::Domain(d)) => match d.parse::<std::net::Ipv4Addr>() {
            Ok(ip) => !ip.is_loopback(),
            Err(_) => !d.eq_ignore_ascii_case("localhost"),
        },
        Some(url::Host::Ipv4(ip)) => !ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => !(ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())),
        None => false,
    }
}

impl RedisStore {
    /// `None` when the URL is not one the client accepts.
    pub fn new(url: &str) -> Option<Self> {
        Self::with_env(url, NetEnv::process())
    }

    /// As [`RedisStore::new`], with the trust variables of `env` (tests).
    pub fn with_env(url: &str, env: &NetEnv) -> Option<Self> {
        if !valid_url(url) {
            return None;
        }
        let client = if url.starts_with("rediss:") {
            let certs = redis::TlsCertificates { client_tls: None, root_cert: Some(tls_roots_pem(env)) };
            redis::Client::build_with_tls(url, certs).ok()?
        } else {
            redis::Client::open(url).ok()?
        };
        Some(RedisStore {
            client,
            conn: Mutex::new(None),
            health: Mutex::new(Health {
                down: false,
                probing: false,
                next_probe: Instant::now(),
                backoff: MIN_BACKOFF,
            }),
            script: redis::Script::new(SCRIPT),
            owed: Mutex::new(Owed::default()),
        })
    }

    /// Whether this decision may go to Redis: always while up; while down, one probe at a
    /// time once the backoff has passed. `Some(is_probe)`.
    fn enter(&self) -> Option<bool> {
        let mut h = lock(&self.health);
        if !h.down {
            return Some(false);
        }
        if h.probing || Instant::now() < h.next_probe {
            return None;
        }
        h.probing = true;
        Some(true)
    }

    /// Only a probe marks the store up again: an answer that was already on its way when the
    /// outage was seen (a slow server) does not end it, so a flapping server warns once.
    fn answered(&self, probe: bool) {
        let mut h = lock(&self.health);
        if !probe {
            return;
        }
        h.probing = false;
        if h.down {
            h.down = false;
            h.backoff = MIN_BACKOFF;
            warn(STORE_RESTORED);
        }
    }

    fn failed(&self, probe: bool) {
        let mut h = lock(&self.health);
        if probe {
            h.probing = false;
            h.backoff = (h.backoff * 2).min(MAX_BACKOFF);
        } else if h.down {
            return; // another decision already saw this outage
        } else {
            h.down = true;
            h.backoff = MIN_BACKOFF;
            warn(STORE_DOWN);
        }
        h.next_probe = Instant::now() + h.backoff;
        drop(h);
        // A fresh connection for the next probe (a stopped server can leave the old one stuck).
        *lock(&self.conn) = None;
    }

    /// Whether the store is marked down (for tests and the bench).
    pub fn is_down(&self) -> bool {
        lock(&self.health).down
    }

    fn connection(&self) -> Option<Conn> {
        let mut c = lock(&self.conn);
        if c.is_none() {
            // One attempt per connection: the store's own probes and backoff are the retries.
            // Each answer has the whole bound here (the handshake's answers come before the
            // first decision's); `call` bounds every decision as a whole.
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(CONNECT_TIMEOUT + DECISION_TIMEOUT))
                .set_number_of_retries(0);
            *c = ConnectionManager::new_lazy_with_config(self.client.clone(), config)
                .ok()
                .map(|manager| Conn { manager, answered: Arc::new(AtomicBool::new(false)) });
        }
        c.clone()
    }

    /// Runs one op of the script, bounded by [`DECISION_TIMEOUT`] (plus [`CONNECT_TIMEOUT`] on a
    /// connection that has not answered yet); a connection that answered before and fails at
    /// once gets one more try on a new connection. `None` = no answer.
    async fn call(&self, key: &str, op: &str, rule: Rule, member: &str, extra: u128) -> Option<(i64, i64)> {
        self.call_sent(key, op, rule, member, extra).await.ok()
    }

    /// [`RedisStore::call`]; `Err(true)` = the op was handed to a connection and got no answer
    /// in time (it may have run), `Err(false)` = it was not sent (the store is marked down).
    async fn call_sent(&self, key: &str, op: &str, rule: Rule, member: &str, extra: u128) -> Result<(i64, i64), bool> {
        let Some(probe) = self.enter() else { return Err(false) };
        // A decision dropped half-way (its caller was cancelled) must not leave the probe taken.
        let guard = ProbeGuard { store: self, armed: probe };
        // Releases owed on this key go with this op (removed before it decides); given back to
        // the queue unless the store answered.
        let owed = OwedGuard { store: self, key, members: self.take_owed(key), armed: true };
        let mut inv = self.script.prepare_invoke();
        inv.key(format!("{KEY_PREFIX}{{{key}}}:starts"))
            .key(format!("{KEY_PREFIX}{{{key}}}:pause"))
            .arg(op)
            .arg(rule.limit.max(1))
            .arg(u64::try_from(rule.window.as_micros()).unwrap_or(u64::MAX))
            .arg(member)
            .arg(u64::try_from(extra).unwrap_or(u64::MAX));
        for m in &owed.members {
            inv.arg(m);
        }
        let mut retried = false;
        let answer = loop {
            let Some(Conn { manager: mut conn, answered }) = self.connection() else { break None };
            let was_answered = answered.load(Ordering::Relaxed);
            let bound = if was_answered { DECISION_TIMEOUT } else { DECISION_TIMEOUT + CONNECT_TIMEOUT };
            match tokio::time::timeout(bound, inv.invoke_async::<(i64, i64)>(&mut conn)).await {
                Ok(Ok(v)) => {
                    answered.store(true, Ordering::Relaxed);
                    break Some(v);
                }
                // A connection that answered before and now fails at once is gone, not the
                // store: its server restarted, a proxy closed it while idle, or the async
                // runtime its tasks ran on was replaced (napi-rs ends it with the last Node
                // environment and starts a new one for the next, e.g. a worker thread). One
                // more try, on a new connection. Every op is idempotent for its member.
                Ok(Err(e)) if was_answered && !retried && e.is_io_error() => {
                    retried = true;
                    self.forget(&answered);
                }
                _ => break None,
            }
        };
        guard.disarm();
        match answer {
            Some(v) => {
                owed.disarm();
                self.answered(probe);
                Ok(v)
            }
            None => {
                self.failed(probe);
                Err(true)
            }
        }
    }

    /// Notes a release the store did not take (no answer, or the store is marked down): it goes
    /// with the next op on `key`, so a member the store holds for a waiter that gave up (or a
    /// reservation it made after its decision gave up) does not count as a start. Bounded by
    /// [`MAX_OWED`]; beyond it the member is left to expire with its window.
    pub fn owe(&self, key: &str, member: &str) {
        let mut o = lock(&self.owed);
        if o.len >= MAX_OWED {
            return;
        }
        o.len += 1;
        o.by_key.entry(key.to_owned()).or_default().push(member.to_owned());
    }

    fn take_owed(&self, key: &str) -> Vec<String> {
        let mut o = lock(&self.owed);
        let Some(list) = o.by_key.get_mut(key) else { return Vec::new() };
        let n = list.len().min(OWED_PER_CALL);
        let taken: Vec<String> = list.drain(..n).collect();
        if list.is_empty() {
            o.by_key.remove(key);
        }
        o.len -= taken.len();
        taken
    }

    /// Releases owed to the store and not sent yet (for tests and the bench).
    pub fn owed(&self) -> usize {
        lock(&self.owed).len
    }

    /// Drops the connection whose flag is `answered`, unless another decision replaced it first.
    fn forget(&self, answered: &Arc<AtomicBool>) {
        let mut c = lock(&self.conn);
        if c.as_ref().is_some_and(|c| Arc::ptr_eq(&c.answered, answered)) {
            *c = None;
        }
    }

    pub async fn reserve(&self, key: &str, rule: Rule, member: &str) -> Answer {
        match self.call_sent(key, "reserve", rule, member, 0).await {
            Ok((_, wait)) => Answer::Wait(Duration::from_micros(wait.max(0).unsigned_abs())),
            Err(sent) => {
                if sent {
                    // It may have been made after the decision gave up: no phantom start.
                    self.owe(key, member);
                }
                Answer::Unavailable
            }
        }
    }

    /// `Some(None)` = start now; `Some(Some(wait))` = moved behind a pause; `None` = no answer.
    pub async fn confirm(&self, key: &str, rule: Rule, member: &str) -> Option<Option<Duration>> {
        let (moved, wait) = self.call(key, "confirm", rule, member, 0).await?;
        Some((moved == 1).then(|| Duration::from_micros(wait.max(0).unsigned_abs())))
    }

    /// Removes `member`; without an answer (the store is down or slow) it is owed.
    pub async fn release(&self, key: &str, member: &str) {
        let rule = Rule { limit: 1, window: Duration::from_secs(1) };
        if self.call(key, "release", rule, member, 0).await.is_none() {
            self.owe(key, member);
        }
    }

    pub async fn pause(&self, key: &str, wait: Duration) {
        let rule = Rule { limit: 1, window: Duration::from_secs(1) };
        let _ = self.call(key, "pause", rule, "", wait.as_micros()).await;
    }
}

type Stores = Mutex<Vec<(String, Arc<RedisStore>)>>;

/// The process-wide store of `url` (one client and connection per URL).
pub fn for_url(url: &str) -> Option<Arc<RedisStore>> {
    static STORES: std::sync::OnceLock<Stores> = std::sync::OnceLock::new();
    let mut stores = lock(STORES.get_or_init(Default::default));
    if let Some((_, s)) = stores.iter().find(|(u, _)| u == url) {
        return Some(s.clone());
    }
    let store = Arc::new(RedisStore::new(url)?);
    stores.push((url.to_owned(), store.clone()));
    Some(store)
}
