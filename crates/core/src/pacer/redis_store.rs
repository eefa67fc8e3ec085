//! The shared store: the same sliding-window rule, decided atomically in Redis by one Lua
//! script on the server's clock (`TIME`), so every process and host that uses the store shares
//! one budget per key, whatever their own clocks say.
//!
//! Per budget key there are two Redis keys under a fixed prefix: a sorted set of starts (member
//! = one reservation, score = its start in µs of server time) and the pause (a 429's
//! `Retry-After` end, µs of server time). A cancelled waiter removes its member, and a waiter
//! whose slot has come asks again (`confirm`) so a pause that began meanwhile holds it too.
//!
//! **A start is counted when it happens.** When `confirm` says "start now" it rewrites the
//! member's score to the store's `TIME` (after the decision, so at or before the moment the
//! waiter really starts: a store that answered late counts the start late, never early), and
//! the waiting members placed after it are placed again from there (each moves later or stays).
//! A slot that came while the window is already full of real starts is placed again instead.
//!
//! **Placement by count.** A reservation takes the earliest moment at or after now at which no
//! window holding it would hold more than `limit` members, wherever the other members are: a
//! member far ahead (a waiter that is gone and whose release the store never got) takes one slot
//! of its own window and delays nobody beyond it.
//!
//! A member's first character is its class (`c` = cleanup, `n` = new work): a cleanup's
//! reservation is placed over the starts made and the other cleanups, and every waiting member
//! of new work (of any process) is placed again behind it, never earlier than before; its
//! waiter learns the new slot when it confirms. The member is the id of every decision about
//! its reservation, and each op is idempotent for it: `reserve` of a member the set holds
//! answers as `confirm` does, `confirm` answers from the member's state (a slot still ahead =
//! moved there; a slot that came = start, unless a pause began before it or the window is
//! full), `release` is a `ZREM`. So the one retry on a new connection after a lost answer never
//! starts a request inside a pause.
//!
//! No phantom starts: a reservation whose decision found no answer (it may run on the server
//! after the decision gave up) and a release the store did not take (no answer, or the store
//! marked down) are owed to the store, at most [`MAX_OWED`] per budget key, and all of them go
//! with the next op on that key (the probe, once the store answers again), which removes them
//! before it decides. Beyond the cap a member stays until its slot has passed by a window: it
//! counts as one start in its own window, like any member.
//!
//! **Outages.** Every decision has [`DECISION_TIMEOUT`], and one made on a connection that has
//! not answered yet [`CONNECT_TIMEOUT`] more (a store across a network needs several round
//! trips before its first answer); the first failure marks the store down (one warning,
//! [`super::STORE_DOWN`]) and the pacer falls back to its local store, with this process's
//! share of the limit only ([`RedisStore::fallback_rule`]): the share its members had among the
//! store's members of the last window (measured with every placement), at least a tenth of the
//! limit (and one start). Why a share: while the store is down no process knows what the others
//! start, and a full budget each lets N processes start N times the limit; the share the store
//! last saw is what this process would have got, so the fleet together stays near the limit
//! while its mix holds, and work goes on (a pause of new work would turn every blip of the
//! store into a stall). Cleanups keep their priority in the local store as in the shared one.
//! While down, no decision waits for Redis: a probe runs on its own timer ([`RedisStore::watch`])
//! every 100 ms, doubling to 400 ms, and the first answer marks the store up again
//! ([`super::STORE_RESTORED`]). The starts this process made in the last window (those decided
//! locally, and those the store decided, for a store that restarted empty) go with the probe
//! and with every later op until the store has them, so the window that spans the outage holds.
//! The other processes come back one by one, each with its own starts: for one window after the
//! return ([`RedisStore::settling`]) decisions stay at this process's share while the timer
//! writes its starts back, then the store decides again. A process that had no op in flight
//! while the store was down sees the restart when the store no longer holds a reservation whose
//! slot came ([`Confirmed::Lost`]) and settles the same way ([`RedisStore::lost`]).
//! An abort or the caller's deadline does not wait for a decision.
//!
//! The URL (it may hold a password) is kept only inside the redis client; it is never
//! formatted into an error, a warning or an event.

use std::collections::{HashMap, VecDeque};
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
/// The longest gap between two probes of a store that is down.
pub const MAX_BACKOFF: Duration = Duration::from_millis(400);
/// Every Redis key of this package starts with this.
pub const KEY_PREFIX: &str = "createos-execute:pacing:v1:";

/// Most releases owed per budget key; beyond it a member counts as one start in its window.
pub const MAX_OWED: usize = 1024;
/// Most own starts kept per budget key to tell a store that lost or missed them.
const MAX_RECENT: usize = 4096;
/// How often a reservation or a confirmation also measures this client's share of the store's
/// members: every [`SHARE_EVERY_N`]-th op, and the first op after [`SHARE_EVERY`] went by.
const SHARE_EVERY: Duration = Duration::from_millis(250);
const SHARE_EVERY_N: u32 = 8;

/// The most members a measure of the share reads (the script gets it as the measure flag):
/// a budget's last and next windows hold at most twice its limit, so below 512 a measure reads
/// them all, and above it the share is that of the newest members. Bounded, a measure costs
/// the same at a limit of a million as at 300 (the read was every member of two windows).
const SHARE_READ_CAP: u128 = 1024;
/// Most budget keys a store keeps owed releases and recent starts for.
const MAX_KEYS: usize = 256;

const SCRIPT: &str = r"
-- KEYS[1] starts (sorted set, score = start in µs of server time), KEYS[2] pause (µs),
-- KEYS[3] packed (µs: no new work fits anywhere between now and it)
-- ARGV: op, limit, window µs, member, pause µs (pause) or the most members a measure of the share
-- reads, 0 = no measure (reserve, confirm, sync),
-- n, n members owed a release, then pairs (member, age µs) of starts this client made that
-- the store may not hold.
-- A member's first byte is its class: 'c' (cleanup) or 'n' (new work).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local op = ARGV[1]
local limit = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local member = ARGV[4]
local nowed = tonumber(ARGV[6])
local function n2s(x) return string.format('%.0f', x) end
local packed = tonumber(redis.call('GET', KEYS[3]) or '0')
local packed0 = packed
-- A member left (or moved from) s: there may be room there again.
local function opened(s) if s < packed then packed = s end end
for i = 7, 6 + nowed do
  local s = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if s then
    opened(tonumber(s))
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', n2s(now - window))
local function paused()
  local p = redis.call('GET', KEYS[2])
  if p then return tonumber(p) end
  return 0
end
-- Sorted arrays of scores: the first index holding more than x.
local function above(arr, x)
  local lo, hi = 1, #arr + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if arr[mid] > x then hi = mid else lo = mid + 1 end
  end
  return lo
end
local function insert(arr, x) table.insert(arr, above(arr, x), x) end
-- The earliest moment c >= t0 such that no window [x, x + window) holds c and limit members
-- (get(j) = the j-th score, in order, of the members after t0 - window): limit consecutive
-- members closer than a window exclude (last - window, first + window).
local function earliest_from(get, t0)
  local c, j = t0, 1
  while true do
    local last = get(j + limit - 1)
    if last == nil or last - window >= c then return c end
    local first = get(j)
    if last - first < window and c < first + window then c = first + window end
    j = j + 1
  end
end
-- Fewer than `limit` members after x: no window from there on is full (one ZCOUNT, where
-- reading them would cost a read of every one at a large limit).
local function few_after(x)
  return tonumber(redis.call('ZCOUNT', KEYS[1], '(' .. n2s(x), '+inf')) < limit
end
local function feasible(arr, t0)
  local base = above(arr, t0 - window) - 1
  return earliest_from(function(j) return arr[base + j] end, t0)
end
-- The members after x, fetched as they are read: get(j) = (score, name) of the j-th.
local function lazy(x)
  local scores, names, offset, done = {}, {}, 0, false
  return function(j)
    while scores[j] == nil and not done do
      local r = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. n2s(x), '+inf', 'WITHSCORES', 'LIMIT', offset, 256)
      for i = 1, #r, 2 do
        names[#names + 1] = r[i]
        scores[#scores + 1] = tonumber(r[i + 1])
      end
      offset = offset + #r / 2
      if #r < 512 then done = true end
    end
    return scores[j], names[j]
  end
end
local function touch()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then
    local ms = n2s(math.floor((math.max(tonumber(last[2]), now) - now + window) / 1000) + 1000)
    redis.call('PEXPIRE', KEYS[1], ms)
    if packed > now then
      redis.call('SET', KEYS[3], n2s(packed), 'PX', ms)
    elseif packed0 > now then
      redis.call('DEL', KEYS[3])
    end
  end
end
-- Members after `changed` may now share a window with too many: each is placed again from its
-- own slot (never earlier), in order; one a window past every change is as it was.
local function reflow(changed)
  if few_after(now - window) then return end
  local arr = {}
  local r = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. n2s(now - window), n2s(now), 'WITHSCORES')
  for i = 2, #r, 2 do arr[#arr + 1] = tonumber(r[i]) end
  local get = lazy(now)
  local j, moves = 1, {}
  while true do
    local s, name = get(j)
    if s == nil or s >= changed + window then break end
    local at = feasible(arr, s)
    insert(arr, at)
    if at ~= s then
      moves[#moves + 1] = {name, at}
      opened(s)
      if at > changed then changed = at end
    end
    j = j + 1
  end
  -- Written once read (the reads page through the set).
  for _, m in ipairs(moves) do redis.call('ZADD', KEYS[1], n2s(m[2]), m[1]) end
end
-- Starts this client made that the store may not hold (decided while it did not answer, or
-- lost with a restart): counted where they happened, at the latest.
local changed = nil
for i = 7 + nowed, #ARGV - 1, 2 do
  local s = now - tonumber(ARGV[i + 1])
  if s > now - window then
    local e = redis.call('ZSCORE', KEYS[1], ARGV[i])
    if not e or tonumber(e) < s or tonumber(e) > now then
      if e then opened(tonumber(e)) end
      redis.call('ZADD', KEYS[1], n2s(s), ARGV[i])
      if not changed or s > changed then changed = s end
    end
  end
end
if changed then reflow(changed) end
local own, total, clients = -1, -1, -1
-- This client's share of the members of the last and the next window, this one included (the
-- nonce follows the class byte), and how many clients hold members there.
local function share(m, cap)
  local nonce = string.match(m, '^.:([^:]*):')
  own, total, clients = 1, 1, 1
  local seen = {}
  if nonce then seen[nonce] = true end
  -- The last window's members and the next window's, the newest first: enough to tell, and a
  -- bounded read.
  local names = redis.call('ZREVRANGEBYSCORE', KEYS[1], '(' .. n2s(now + window), '(' .. n2s(now - window), 'LIMIT', 0, math.min(4 * limit + 64, cap))
  for i = 1, #names do
    -- A confirm's member is already held: counted once, above.
    if names[i] ~= m then
      total = total + 1
      local n = string.match(names[i], '^.:([^:]*):')
      if n then
        if n == nonce then
          own = own + 1
        elseif not seen[n] then
          seen[n] = true
          clients = clients + 1
        end
      end
    end
  end
end
local function place(m)
  local earliest = now
  local p = paused()
  if p > earliest then earliest = p end
  local at
  if string.sub(m, 1, 1) ~= 'c' then
    -- Nothing fits before `packed`: the search starts there.
    local from = math.max(earliest, packed)
    if few_after(from - window) then at = from else at = earliest_from(lazy(from - window), from) end
    if earliest == now then packed = at end
  else
    -- A cleanup goes ahead of every waiting request of new work (of any process): those are
    -- placed again behind it, in their order, never earlier than before; their waiters learn
    -- it when they confirm.
    local r = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. n2s(now - window), '+inf', 'WITHSCORES')
    local fixed, waiting = {}, {}
    for i = 1, #r, 2 do
      local s = tonumber(r[i + 1])
      if s > now and string.sub(r[i], 1, 1) ~= 'c' then
        waiting[#waiting + 1] = {r[i], s}
      else
        fixed[#fixed + 1] = s
      end
    end
    at = feasible(fixed, earliest)
    insert(fixed, at)
    local moved = at
    for _, w in ipairs(waiting) do
      local s = w[2]
      if s >= moved + window then break end
      local n = feasible(fixed, math.max(earliest, s))
      insert(fixed, n)
      if n ~= s then
        redis.call('ZADD', KEYS[1], n2s(n), w[1])
        opened(s)
        if n > moved then moved = n end
      end
    end
  end
  redis.call('ZADD', KEYS[1], n2s(at), m)
  touch()
  return at - now
end
local measure = tonumber(ARGV[5]) or 0
if op == 'reserve' or op == 'confirm' then
  local s = redis.call('ZSCORE', KEYS[1], member)
  if op == 'reserve' and not s then
    if measure > 0 then share(member, measure) end
    local w = place(member)
    return {0, w, own, total, clients}
  end
  -- A reservation the store no longer holds: it came back empty (a restart the client did not
  -- see) and knows nothing of the window's starts. The client decides alone for a window, by
  -- the share it had (an empty store has no share to tell).
  if op == 'confirm' and not s then return {2, 0, -1, -1, -1} end
  -- A slot that comes measures the share too: a share measured before the other processes
  -- reserved (a process that took a whole window alone) must not outlive their arrival.
  if op == 'confirm' and measure > 0 then share(member, measure) end
  -- Decided by the member's state, so a retry answers as the first run did.
  if s then
    s = tonumber(s)
    if s > now then return {1, s - now, own, total, clients} end
    if paused() <= now then
      -- The slot has come: the start is counted now, when it happens, unless the window up to
      -- now is full of real starts already.
      local n = tonumber(redis.call('ZCOUNT', KEYS[1], '(' .. n2s(now - window), n2s(now))) - 1
      if n < limit then
        redis.call('ZADD', KEYS[1], n2s(now), member)
        reflow(now)
        touch()
        return {0, 0, own, total, clients}
      end
    end
    opened(s)
    redis.call('ZREM', KEYS[1], member)
  end
  local w = place(member)
  return {1, w, own, total, clients}
elseif op == 'release' then
  local s = redis.call('ZSCORE', KEYS[1], member)
  if s then
    opened(tonumber(s))
    redis.call('ZREM', KEYS[1], member)
  end
  touch()
  return {0, 0, own, total, clients}
elseif op == 'sync' then
  -- With a member of this client that the store does not hold: measure its share (counted
  -- as if reserved, then taken out again).
  if measure > 0 and member ~= '' and not redis.call('ZSCORE', KEYS[1], member) then
    share(member, measure)
    own, total = own - 1, total - 1
  end
  touch()
  return {0, 0, own, total, clients}
elseif op == 'pause' then
  local d = tonumber(ARGV[5])
  local u = now + d
  if paused() < u then redis.call('SET', KEYS[2], n2s(u), 'PX', n2s(math.floor(d / 1000) + 1)) end
  touch()
  return {0, 0, own, total, clients}
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

/// What a store keeps per budget key for the store's sake.
#[derive(Default)]
struct KeyState {
    /// The rule of the latest decision (the probe's op uses it).
    rule: Option<Rule>,
    /// Members whose release found no answer (or whose reservation may have been made after
    /// its decision gave up): all of them go with the next op on the key. At most [`MAX_OWED`].
    owed: Vec<String>,
    /// This process's starts of the last window (member, when), oldest first.
    recent: VecDeque<(String, Instant)>,
    /// Starts the store may not hold (decided locally, or made before an outage that may have
    /// emptied it): they go with the next op on the key.
    unsent: Vec<(String, Instant)>,
    /// This process's share of the store's members at the latest placement that measured it.
    share: Option<f64>,
    /// When the share was last asked for (it costs the script a read of the window).
    share_asked: Option<Instant>,
    /// Whether that measure saw at least a limit's worth of members.
    share_full: bool,
    /// Reservations since.
    since_share: u32,
    /// Until when decisions stay local after the store came back (see `answered`).
    settle_until: Option<Instant>,
}

impl KeyState {
    fn prune(&mut self, now: Instant) {
        let Some(rule) = self.rule else { return };
        while self.recent.front().is_some_and(|(_, at)| *at + rule.window <= now) {
            self.recent.pop_front();
        }
        self.unsent.retain(|(_, at)| *at + rule.window > now);
    }

    /// Every start of the last window goes to the store again with the next op (a store that
    /// may have come back empty).
    fn resend_window(&mut self, now: Instant) {
        self.prune(now);
        let mut all: Vec<(String, Instant)> = self.recent.iter().cloned().collect();
        all.append(&mut self.unsent);
        all.truncate(MAX_RECENT);
        self.unsent = all;
    }
}

/// One Redis store (per URL), shared by every budget key that uses it.
pub struct RedisStore {
    client: redis::Client,
    conn: Mutex<Option<Conn>>,
    health: Mutex<Health>,
    script: redis::Script,
    keys: Mutex<HashMap<String, KeyState>>,
    /// Whether the probe's timer runs (see [`RedisStore::watch`]).
    watching: AtomicBool,
    /// The nonce of this client's members (one client per URL in a process).
    nonce: String,
}

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

/// Owed releases and unsent starts taken for one op: given back unless the store answered.
struct Outbox<'a> {
    store: &'a RedisStore,
    key: &'a str,
    owed: Vec<String>,
    unsent: Vec<(String, Instant)>,
    armed: bool,
}

impl Outbox<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Outbox<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut keys = lock(&self.store.keys);
            if let Some(k) = keys.get_mut(self.key) {
                for m in std::mem::take(&mut self.owed) {
                    if k.owed.len() < MAX_OWED {
                        k.owed.push(m);
                    }
                }
                k.unsent.append(&mut self.unsent);
                k.unsent.truncate(MAX_RECENT);
            }
        }
    }
}

/// Clears the timer's flag when its task ends (also when its runtime is dropped). It holds the
/// store weakly: a store nobody uses any more (every pacer over it dropped) is not kept alive,
/// and not probed, by its own timer.
struct WatchGuard(std::sync::Weak<RedisStore>);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        if let Some(store) = self.0.upgrade() {
            store.watching.store(false, Ordering::SeqCst);
        }
    }
}

/// The store's word on a reservation whose slot has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmed {
    /// Start now (the store counted the start).
    Start,
    /// Wait this long: a cleanup took the slot, a pause began, or the window is full of real
    /// starts.
    Moved(Duration),
    /// The store no longer holds the reservation: it came back empty from a restart this
    /// process did not see, and holds none of the window's starts.
    Lost,
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
/// the script), a random nonce (of this process, or of one store client, see
/// [`RedisStore::member`]) and a counter. The member is the id of every decision about its
/// reservation, which makes each op idempotent; the nonce tells the script which members are
/// this client's (its share).
pub fn new_member(class: Class) -> String {
    static NONCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    member_of(NONCE.get_or_init(|| uuid::Uuid::new_v4().simple().to_string()), class)
}

fn member_of(nonce: &str, class: Class) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
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
            keys: Mutex::new(HashMap::new()),
            watching: AtomicBool::new(false),
            nonce: uuid::Uuid::new_v4().simple().to_string(),
        })
    }

    /// Whether this op may go to Redis: always while up; while down, only a probe (one at a
    /// time, once the backoff has passed), so no decision waits for a store that is down.
    /// `Some(is_probe)`.
    fn enter(&self, may_probe: bool) -> Option<bool> {
        let mut h = lock(&self.health);
        if !h.down {
            return Some(false);
        }
        if !may_probe || h.probing || Instant::now() < h.next_probe {
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
            drop(h);
            // The other processes come back one by one, each with the starts it made while
            // the store was down: for one window this process keeps to its share and only
            // writes its starts back, so the store decides again once it knows them all.
            let now = Instant::now();
            for k in lock(&self.keys).values_mut() {
                k.settle_until = k.rule.map(|r| now + r.window);
            }
        }
    }

    /// Whether decisions on `key` stay local for now: the window after the store came back.
    pub fn settling(&self, key: &str) -> bool {
        let now = Instant::now();
        lock(&self.keys).get(key).and_then(|k| k.settle_until).is_some_and(|t| t > now)
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
            drop(h);
            // The store may come back empty (a restart): every start of the last window goes
            // to it again once it answers.
            let now = Instant::now();
            for k in lock(&self.keys).values_mut() {
                k.resend_window(now);
            }
            h = lock(&self.health);
        }
        h.next_probe = Instant::now() + h.backoff;
        drop(h);
        // A fresh connection for the next probe (a stopped server can leave the old one stuck).
        *lock(&self.conn) = None;
    }

    /// A new member of this client (see [`new_member`]).
    pub fn member(&self, class: Class) -> String {
        member_of(&self.nonce, class)
    }

    /// Whether the store is marked down (for tests and the bench).
    pub fn is_down(&self) -> bool {
        lock(&self.health).down
    }

    /// Starts the probe's timer of a store that is down (one per store, on the current
    /// runtime): a probe every backoff (100 ms, doubling to [`MAX_BACKOFF`]) carries what is
    /// owed to `key`; once one answers, every key with starts or releases still to send gets
    /// an op of its own. Without a runtime the next decision starts it.
    pub fn watch(self: &Arc<Self>, key: &str, rule: Rule) {
        self.note_rule(key, rule);
        if !self.is_down() || self.watching.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.watching.store(false, Ordering::SeqCst);
            return;
        };
        let guard = WatchGuard(Arc::downgrade(self));
        let key = key.to_owned();
        rt.spawn(async move {
            loop {
                let next = {
                    let Some(store) = guard.0.upgrade() else { return };
                    let h = lock(&store.health);
                    if !h.down {
                        break;
                    }
                    h.next_probe
                };
                tokio::time::sleep_until(next.max(Instant::now() + Duration::from_millis(5))).await;
                let Some(store) = guard.0.upgrade() else { return };
                let _ = store.call_sent(&key, "sync", rule, "", 0, true).await;
            }
            let Some(store) = guard.0.upgrade() else { return };
            let store = &store;
            // Back: until the window after the return has passed, every key's starts and owed
            // releases go to the store on this timer (decisions stay local meanwhile).
            loop {
                let now = Instant::now();
                let (pending, settling): (Vec<(String, Rule)>, bool) = {
                    let keys = lock(&store.keys);
                    let settling = keys.values().any(|k| k.settle_until.is_some_and(|t| t > now));
                    let pending = keys
                        .iter()
                        .filter(|(_, k)| !k.owed.is_empty() || !k.unsent.is_empty())
                        .filter_map(|(key, k)| k.rule.map(|r| (key.clone(), r)))
                        .collect();
                    (pending, settling)
                };
                for (key, rule) in pending {
                    let _ = store.call_sent(&key, "sync", rule, "", 0, false).await;
                }
                if !settling || store.is_down() {
                    break;
                }
                tokio::time::sleep(MIN_BACKOFF).await;
            }
            drop(guard);
        });
    }

    fn note_rule(&self, key: &str, rule: Rule) {
        let mut keys = lock(&self.keys);
        if let Some(k) = keys.get_mut(key) {
            k.rule = Some(rule);
        } else if keys.len() < MAX_KEYS {
            keys.insert(key.to_owned(), KeyState { rule: Some(rule), ..KeyState::default() });
        }
    }

    /// Notes a start of this client on `key` (`member` names it in the store), when the caller
    /// really started it: it goes with the next op on the key, and the store counts it there if
    /// that is later than what it holds (an answer that came late, a start decided locally).
    /// Kept for one window, for a store that comes back empty.
    pub fn started(&self, key: &str, member: &str, at: Instant, rule: Rule) {
        self.note_rule(key, rule);
        let mut keys = lock(&self.keys);
        let Some(k) = keys.get_mut(key) else { return };
        k.prune(at);
        if k.recent.len() >= MAX_RECENT {
            k.recent.pop_front();
        }
        k.recent.push_back((member.to_owned(), at));
        if k.unsent.len() < MAX_RECENT {
            k.unsent.push((member.to_owned(), at));
        }
    }

    /// The rule of this process's own budget while the store is down: its share of `rule`'s
    /// limit (the share its members had at the store's latest placement on `key`), at least a
    /// tenth of the limit and one start; a tenth when the store never placed one of this
    /// process's reservations.
    pub fn fallback_rule(&self, key: &str, rule: Rule) -> Rule {
        let floor = (rule.limit / 10).max(1);
        let share = lock(&self.keys).get(key).and_then(|k| k.share);
        let limit = match share {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
            Some(f) => ((rule.limit as f64 * f).floor() as usize).max(floor),
            None => floor,
        };
        Rule { limit: limit.min(rule.limit), window: rule.window }
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
        self.call_sent(key, op, rule, member, extra, false).await.ok()
    }

    /// [`RedisStore::call`]; `Err(true)` = the op was handed to a connection and got no answer
    /// in time (it may have run), `Err(false)` = it was not sent (the store is marked down).
    /// `probe`: the op may go to a store that is down (the timer's).
    async fn call_sent(
        &self,
        key: &str,
        op: &str,
        rule: Rule,
        member: &str,
        extra: u128,
        probe: bool,
    ) -> Result<(i64, i64), bool> {
        let Some(probe) = self.enter(probe) else { return Err(false) };
        // A decision dropped half-way (its caller was cancelled) must not leave the probe taken.
        let guard = ProbeGuard { store: self, armed: probe };
        // Every release owed on this key and the starts the store may not hold go with this op
        // (applied before it decides); given back unless the store answered.
        let outbox = self.outbox(key);
        let sent_at = Instant::now();
        let mut inv = self.script.prepare_invoke();
        inv.key(format!("{KEY_PREFIX}{{{key}}}:starts"))
            .key(format!("{KEY_PREFIX}{{{key}}}:pause"))
            .key(format!("{KEY_PREFIX}{{{key}}}:packed"))
            .arg(op)
            .arg(rule.limit.max(1))
            .arg(u64::try_from(rule.window.as_micros()).unwrap_or(u64::MAX))
            .arg(member)
            .arg(u64::try_from(extra).unwrap_or(u64::MAX))
            .arg(outbox.owed.len());
        for m in &outbox.owed {
            inv.arg(m);
        }
        for (m, at) in &outbox.unsent {
            // The age when sent: the store counts the start at its TIME minus this, at or
            // after the moment it happened.
            inv.arg(m).arg(u64::try_from(sent_at.saturating_duration_since(*at).as_micros()).unwrap_or(0));
        }
        let mut retried = false;
        let answer = loop {
            let Some(Conn { manager: mut conn, answered }) = self.connection() else { break None };
            let was_answered = answered.load(Ordering::Relaxed);
            let bound = if was_answered { DECISION_TIMEOUT } else { DECISION_TIMEOUT + CONNECT_TIMEOUT };
            match tokio::time::timeout(bound, inv.invoke_async::<(i64, i64, i64, i64, i64)>(&mut conn)).await {
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
            Some((flag, wait, own, total, clients)) => {
                outbox.disarm();
                if total > 0 && own >= 0 && clients > 0 {
                    // Its part of the members, and no more than an even part among the clients
                    // that hold members: the fleet's shares add up to the limit at most.
                    #[allow(clippy::cast_precision_loss)]
                    let share = (own as f64 / total as f64).min(1.0 / clients as f64);
                    if let Some(k) = lock(&self.keys).get_mut(key) {
                        k.share = Some(share);
                        // Full: a limit's worth of members, or as many as a measure reads.
                        let full = rule.limit.min(usize::try_from(SHARE_READ_CAP).unwrap_or(usize::MAX));
                        k.share_full = usize::try_from(total).unwrap_or(0) >= full;
                    }
                }
                self.answered(probe);
                Ok((flag, wait))
            }
            None => {
                drop(outbox);
                self.failed(probe);
                Err(true)
            }
        }
    }

    /// Takes every owed release and every unsent start of `key` for one op.
    fn outbox<'a>(&'a self, key: &'a str) -> Outbox<'a> {
        let mut keys = lock(&self.keys);
        let (owed, unsent) = match keys.get_mut(key) {
            Some(k) => {
                k.prune(Instant::now());
                (std::mem::take(&mut k.owed), std::mem::take(&mut k.unsent))
            }
            None => (Vec::new(), Vec::new()),
        };
        Outbox { store: self, key, owed, unsent, armed: true }
    }

    /// Notes a release the store did not take (no answer, or the store is marked down): it goes
    /// with the next op on `key`, so a member the store holds for a waiter that gave up (or a
    /// reservation it made after its decision gave up) does not count as a start. At most
    /// [`MAX_OWED`] per key; beyond it the member counts as one start in its own window.
    pub fn owe(&self, key: &str, member: &str) {
        let mut keys = lock(&self.keys);
        if !keys.contains_key(key) && keys.len() >= MAX_KEYS {
            return;
        }
        let k = keys.entry(key.to_owned()).or_default();
        if k.owed.len() < MAX_OWED {
            k.owed.push(member.to_owned());
        }
    }

    /// Releases owed to the store and not sent yet (for tests and the bench).
    pub fn owed(&self) -> usize {
        lock(&self.keys).values().map(|k| k.owed.len()).sum()
    }

    /// Drops the connection whose flag is `answered`, unless another decision replaced it first.
    fn forget(&self, answered: &Arc<AtomicBool>) {
        let mut c = lock(&self.conn);
        if c.as_ref().is_some_and(|c| Arc::ptr_eq(&c.answered, answered)) {
            *c = None;
        }
    }

    /// Whether the next reservation or confirmation on `key` measures this process's share
    /// (the script's measure flag: [`SHARE_READ_CAP`], the most members it reads) or not (0):
    /// when the latest measure saw fewer members than the limit (or than the cap), every
    /// [`SHARE_EVERY_N`]-th op, and the first op after [`SHARE_EVERY`] went by.
    fn measure_due(&self, key: &str) -> u128 {
        let mut keys = lock(&self.keys);
        let now = Instant::now();
        match keys.get_mut(key) {
            // Also while the latest measure saw fewer members than the limit (too little
            // to tell a share by; the members are few, so the read is cheap).
            // Also every few reservations: a snapshot from before the others reserved says
            // nothing of them.
            Some(k)
                if !k.share_full
                    || k.since_share >= SHARE_EVERY_N
                    || k.share_asked.is_none_or(|t| now >= t + SHARE_EVERY) =>
            {
                k.share_asked = Some(now);
                k.since_share = 0;
                SHARE_READ_CAP
            }
            Some(k) => {
                k.since_share += 1;
                0
            }
            None => 0,
        }
    }

    pub async fn reserve(&self, key: &str, rule: Rule, member: &str) -> Answer {
        self.note_rule(key, rule);
        let measure = self.measure_due(key);
        match self.call_sent(key, "reserve", rule, member, measure, false).await {
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

    /// The store's word on a reservation whose slot has come; `None` = no answer.
    pub async fn confirm(&self, key: &str, rule: Rule, member: &str) -> Option<Confirmed> {
        let measure = self.measure_due(key);
        let (flag, wait) = self.call(key, "confirm", rule, member, measure).await?;
        Some(match flag {
            0 => Confirmed::Start,
            2 => Confirmed::Lost,
            _ => Confirmed::Moved(Duration::from_micros(wait.max(0).unsigned_abs())),
        })
    }

    /// Measures this process's share of the store's members on `key` again, when it is due
    /// (see [`RedisStore::measure_due`]): a waiter calls it while it waits for a slot, so the
    /// share a fallback would use counts the processes that reserved since the last measure
    /// (one that took a window alone before the others came would otherwise keep a share of
    /// the whole limit). No answer marks the store down, as any op does.
    pub async fn refresh_share(&self, key: &str, rule: Rule) {
        if self.is_down() || self.measure_due(key) == 0 {
            return;
        }
        let probe = self.member(Class::New);
        let _ = self.call(key, "sync", rule, &probe, SHARE_READ_CAP).await;
    }

    /// The store lost a reservation of this process on `key` (see [`Confirmed::Lost`]): as after
    /// an outage, for one window this process keeps to its share and its starts of the last
    /// window go back to the store, every [`MIN_BACKOFF`] while it settles, so the processes
    /// that saw the outage and this one count each other's starts again.
    pub fn lost(self: &Arc<Self>, key: &str, rule: Rule) {
        self.note_rule(key, rule);
        let now = Instant::now();
        {
            let mut keys = lock(&self.keys);
            let Some(k) = keys.get_mut(key) else { return };
            if k.settle_until.is_some_and(|t| t > now) {
                return;
            }
            k.resend_window(now);
            k.settle_until = Some(now + rule.window);
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let store = Arc::downgrade(self);
        let key = key.to_owned();
        rt.spawn(async move {
            loop {
                let Some(s) = store.upgrade() else { return };
                let _ = s.call_sent(&key, "sync", rule, "", 0, false).await;
                if !s.settling(&key) || s.is_down() {
                    return;
                }
                drop(s);
                tokio::time::sleep(MIN_BACKOFF).await;
            }
        });
    }

    /// Removes `member`; without an answer (the store is down or slow) it is owed.
    pub async fn release(&self, key: &str, member: &str) {
        let rule =
            lock(&self.keys).get(key).and_then(|k| k.rule).unwrap_or(Rule { limit: 1, window: Duration::from_secs(1) });
        if self.call(key, "release", rule, member, 0).await.is_none() {
            self.owe(key, member);
        }
    }

    pub async fn pause(&self, key: &str, wait: Duration) {
        let rule =
            lock(&self.keys).get(key).and_then(|k| k.rule).unwrap_or(Rule { limit: 1, window: Duration::from_secs(1) });
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
