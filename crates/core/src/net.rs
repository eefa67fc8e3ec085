//! Node's network conventions: which proxy a request goes through, which certificates are
//! trusted, and one HTTP client per distinct (proxy, trust) configuration.
//!
//! **Proxies.** reqwest never reads the environment by itself (`no_proxy()`). A proxy is used
//! only when
//! - the host passes `config.proxy` (explicit: used for every target, loopback included, and
//!   `NO_PROXY` does not apply), or
//! - Node's switch is on: `--use-env-proxy` on the command line (`process.execArgv`, handed
//!   over by `index.js`) or in `NODE_OPTIONS`, else `NODE_USE_ENV_PROXY=1` (Node ≥ 24; we
//!   honour it on every Node version). As in Node, `--no-use-env-proxy` turns it off, the last
//!   of the two flags wins, the command line wins over `NODE_OPTIONS`, and either flag wins
//!   over the variable. Then the proxy follows the rules of Node's `fetch` (undici's `EnvHttpProxyAgent`, what the TypeScript module
//!   used): an `https` target takes `https_proxy ?? HTTPS_PROXY`, else `http_proxy ??
//!   HTTP_PROXY` (the lowercase name wins when both are set, even when it is empty);
//!   `no_proxy ?? NO_PROXY` is a comma- or space-separated list of `host[:port]` entries,
//!   `*` bypasses every host, an entry starting with `.` or `*` matches by suffix, any other
//!   entry exactly. `ALL_PROXY` is not read (Node does not read it either). The target's host
//!   is compared as Node's `URL` writes it: lowercase, and an IPv6 literal in brackets in the
//!   WHATWG form (`[::ffff:10.0.0.1]` is `[::ffff:a00:1]`), so an entry copied from a URL
//!   matches.
//!
//! Two deliberate differences from Node, both safer: a loopback target (`localhost`,
//! `*.localhost`, `127.0.0.0/8`, `::1`) is never proxied from the environment, and an
//! environment proxy whose URL is not `http://` or `https://` (e.g. `socks5://`) or does not
//! parse is ignored (Node would fail the request). An explicit `config.proxy` of another
//! scheme is an input error.
//!
//! HTTPS goes through a proxy only as a `CONNECT` tunnel, so the key never crosses a proxy in
//! clear text: plain-HTTP targets (allowed on loopback only) are never proxied from the
//! environment, and an explicit proxy with a plain-HTTP `apiUrl` is an input error. Proxy
//! credentials (`http://user:pass@host`) are sent as `Proxy-Authorization` to the proxy only
//! and are secrets like the key: [`ProxyUrl`] never formats.
//!
//! **Trust.** The bundled web roots (Mozilla's, `webpki-root-certs`), plus every certificate
//! of the PEM bundle named by `NODE_EXTRA_CA_CERTS`, plus the system store
//! (rustls-native-certs) when `NODE_USE_SYSTEM_CA=1`, plus `config.caCertPem`. As in Node,
//! the environment is read once per process; a `NODE_EXTRA_CA_CERTS` file that cannot be read
//! or parsed is ignored (Node itself already printed a warning about it at start-up). A
//! certificate that does not verify is its own error,
//! [`Error::UntrustedCertificate`](crate::error::Error::UntrustedCertificate).
//!
//! **Keep-alive.** An idle pooled connection is dropped after [`POOL_IDLE`], 4 s: below the
//! 5 s after which Node's `http` server (and Apache, lighttpd, uvicorn by default) closes an
//! idle connection. A request sent on a connection the server is closing at that moment is
//! lost with no answer, and for a process creation that means "maybe created". undici (Node's
//! `fetch`) avoids it by honouring the server's `Keep-Alive: timeout=N` hint less a margin,
//! and keeps 4 s when there is none. hyper-util's pool, under reqwest, has one idle timeout
//! per client and reads no hint, and reqwest exposes no per-connection expiry, so the hint is
//! honoured per origin instead: an answer whose `Keep-Alive: timeout=N` is shorter than
//! [`POOL_IDLE`] plus [`KEEP_ALIVE_MARGIN`] is noted ([`note_keep_alive`]), and the clients
//! made for that origin from then on (every call makes its own; see [`http_client`]) keep idle
//! connections N s less the margin (no pooling at all below [`MIN_POOL_IDLE`]). A longer hint
//! never raises the 4 s. The cost: a connection idle for longer is made anew (one TCP and TLS
//! handshake); a call that began before the hint was seen keeps the pool it began with. HTTP/2
//! servers announce a close with `GOAWAY` first. hyper-util itself retries a request that a
//! reused connection failed before it was sent; one lost after it was sent is the caller's to
//! handle (a creation goes through the recovery, see `execute.rs`).
//!
//! **HTTP/2.** ALPN offers `h2` and `http/1.1`. A stream's flow-control window is 1 MiB and
//! the connection's 32 MiB: a stream whose reader stalls (a slow `log`) holds at most its own
//! 1 MiB of the connection's window, so up to 32 stalled streams cannot stall the others.
//!
//! **HTTP/2 lanes.** hyper-util's pool keeps one HTTP/2 connection per origin and multiplexes
//! every request on it; once the server's concurrent-stream limit is reached, further
//! requests wait inside the connection for a stream to end. The follows of commands in flight
//! hold their streams for as long as the commands run, so the 101st would wait minutes, and
//! so would a cleanup's DELETE: the proof must never queue behind them. So a configuration's
//! client is a set of lanes ([`Http`]), each a reqwest client with its own pool, hence its own
//! connection. An `https` request takes the first lane with fewer than
//! [`H2_STREAMS_PER_CONNECTION`] (100) requests in flight, counted from the send until its
//! answer's body is read to its end or dropped ([`Slot`]); when every lane is full a new lane
//! opens a new connection. 100 is RFC 9113's recommended minimum for the limit a server
//! announces (hyper's default is 200, nginx's 128, Go's 250); the announced value is not
//! exposed by hyper's client, so a server announcing less than 100 can still make requests
//! wait in its connection. Counts are per configuration, not per origin: a host that talks
//! to several `https` origins at once opens new connections sooner than it must, never
//! later. Over HTTP/1.1 (every plain `http` origin, and `https` servers that do not offer
//! `h2`) a request has a connection to itself anyway: the lanes only split the idle pool.
//! A new lane's pool does not know its origin speaks HTTP/2 until a TLS handshake's ALPN
//! said so, and opens a connection for every request of a burst meanwhile (1,000 commands
//! started at once: 1,000 connections, closed idle moments later). So a lane's first request
//! goes alone and the others wait for its answer ([`Slot::first`]): 251 commands at once open
//! 5 connections (`__test__/inflight.test.mjs`).

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::error::{Error, Result};

pub const INVALID_PROXY: &str = "proxy must be an http:// or https:// proxy URL.";
pub const PROXY_NEEDS_HTTPS: &str =
    "proxy requires an https:// apiUrl: the API key never crosses a proxy in clear text.";
pub const INVALID_CA_PEM: &str = "caCertPem must be a PEM string with at least one certificate.";

/// HTTP/2 flow-control windows (see the module doc).
pub const H2_STREAM_WINDOW: u32 = 1024 * 1024;
pub const H2_CONNECTION_WINDOW: u32 = 32 * 1024 * 1024;
/// Idle connections are kept this long (see "Keep-alive" in the module doc).
pub const POOL_IDLE: Duration = Duration::from_secs(4);
/// At most this many distinct (proxy, trust) clients are cached; beyond, clients are built per call.
const MAX_CACHED_CLIENTS: usize = 32;

/// What is taken off a server's `Keep-Alive: timeout=N` hint (see "Keep-alive" above).
pub const KEEP_ALIVE_MARGIN: Duration = Duration::from_secs(1);
/// Below this idle time connections are not pooled at all.
pub const MIN_POOL_IDLE: Duration = Duration::from_millis(250);
/// At most this many origins' hints are kept.
const MAX_LEARNED_ORIGINS: usize = 64;

fn learned() -> &'static Mutex<HashMap<String, Duration>> {
    static LEARNED: OnceLock<Mutex<HashMap<String, Duration>>> = OnceLock::new();
    LEARNED.get_or_init(Default::default)
}

/// The idle time a `Keep-Alive` header value asks for (`timeout=N`, N whole seconds, less
/// [`KEEP_ALIVE_MARGIN`]), when it is shorter than [`POOL_IDLE`]; `None` otherwise.
pub fn keep_alive_idle(header: &str) -> Option<Duration> {
    let secs: u64 = header.split(',').find_map(|part| {
        let (name, value) = part.split_once('=')?;
        name.trim().eq_ignore_ascii_case("timeout").then(|| value.trim().trim_matches('"').parse().ok())?
    })?;
    let idle = Duration::from_secs(secs.min(3600)).saturating_sub(KEEP_ALIVE_MARGIN);
    (idle < POOL_IDLE).then_some(idle)
}

/// Notes the `Keep-Alive` header of an answer from `origin` (see "Keep-alive" above).
pub fn note_keep_alive(origin: &str, header: &str) {
    let Some(idle) = keep_alive_idle(header) else { return };
    let mut m = learned().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if m.contains_key(origin) || m.len() < MAX_LEARNED_ORIGINS {
        m.insert(origin.to_owned(), idle);
    }
}

/// How long idle connections to `origin` are kept: [`POOL_IDLE`], or less when its server
/// said so.
pub fn pool_idle_for(origin: &str) -> Duration {
    learned().lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(origin).copied().unwrap_or(POOL_IDLE)
}

/// The environment variables this module reads.
pub const ENV_VARS: [&str; 10] = [
    "NODE_USE_ENV_PROXY",
    "NODE_OPTIONS",
    "https_proxy",
    "HTTPS_PROXY",
    "http_proxy",
    "HTTP_PROXY",
    "no_proxy",
    "NO_PROXY",
    "NODE_EXTRA_CA_CERTS",
    "NODE_USE_SYSTEM_CA",
];

/// A proxy URL. It may hold credentials, so it never formats.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ProxyUrl(String);

impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProxyUrl(<redacted>)")
    }
}

impl ProxyUrl {
    /// `http://` or `https://`, with a host; no query or fragment.
    pub fn parse(s: &str) -> Option<ProxyUrl> {
        let url = url::Url::parse(s.trim()).ok()?;
        let ok = matches!(url.scheme(), "http" | "https")
            && url.host_str().is_some_and(|h| !h.is_empty())
            && url.query().is_none()
            && url.fragment().is_none();
        ok.then(|| ProxyUrl(url.as_str().to_owned()))
    }
}

/// `--use-env-proxy` (`Some(true)`) or `--no-use-env-proxy` (`Some(false)`), whichever came
/// last on this process's command line; set once by the JS edge, which alone sees
/// `process.execArgv`.
static EXEC_ARGV_SWITCH: OnceLock<Option<bool>> = OnceLock::new();

/// Records the proxy switch of this process's command line (the first call wins: the
/// command line does not change). Must come before the first request, as `index.js` does
/// when it loads.
pub fn set_exec_argv_switch(on: Option<bool>) {
    let _ = EXEC_ARGV_SWITCH.set(on);
}

/// The variables of [`ENV_VARS`] that are set, and the command line's proxy switch (a
/// snapshot; tests build their own).
#[derive(Debug, Clone, Default)]
pub struct NetEnv {
    vars: HashMap<String, String>,
    argv_switch: Option<bool>,
}

impl NetEnv {
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        NetEnv { vars: pairs.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect(), argv_switch: None }
    }

    /// This snapshot with the command line's proxy switch.
    pub fn with_argv_switch(mut self, on: Option<bool>) -> Self {
        self.argv_switch = on;
        self
    }

    /// This process's environment, read once (as Node does).
    pub fn process() -> &'static NetEnv {
        static ENV: OnceLock<NetEnv> = OnceLock::new();
        ENV.get_or_init(|| NetEnv {
            vars: ENV_VARS.iter().filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v))).collect(),
            argv_switch: EXEC_ARGV_SWITCH.get().copied().flatten(),
        })
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.vars.get(k).map(String::as_str)
    }

    /// `a ?? b`: the first variable that is set, even when empty.
    fn first_set(&self, a: &str, b: &str) -> Option<&str> {
        self.get(a).or_else(|| self.get(b))
    }

    /// Node's proxy switch: the command line's flag, else `NODE_OPTIONS`'s, else
    /// `NODE_USE_ENV_PROXY=1`.
    pub fn use_env_proxy(&self) -> bool {
        self.argv_switch
            .or_else(|| env_proxy_switch(node_options_args(self.get("NODE_OPTIONS").unwrap_or(""))))
            .unwrap_or(self.get("NODE_USE_ENV_PROXY") == Some("1"))
    }

    pub fn use_system_ca(&self) -> bool {
        self.get("NODE_USE_SYSTEM_CA") == Some("1")
    }

    pub fn extra_ca_file(&self) -> Option<&str> {
        self.get("NODE_EXTRA_CA_CERTS").filter(|p| !p.is_empty())
    }
}

/// `NODE_OPTIONS` split into arguments as Node splits it: at spaces (only), except inside
/// double quotes, where a backslash escapes the next character; the quotes themselves are
/// dropped.
pub fn node_options_args(s: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut cur = String::new();
    let mut started = false;
    let mut quoted = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if started {
                    args.push(std::mem::take(&mut cur));
                    started = false;
                }
            }
            c => {
                cur.push(c);
                started = true;
            }
        }
    }
    if started {
        args.push(cur);
    }
    args
}

/// The last `--use-env-proxy` (true) or `--no-use-env-proxy` (false) among `args`; Node
/// reads `_` in an option's name as `-`.
pub fn env_proxy_switch<S: AsRef<str>>(args: impl IntoIterator<Item = S>) -> Option<bool> {
    let mut on = None;
    for a in args {
        match a.as_ref().replace('_', "-").as_str() {
            "--use-env-proxy" => on = Some(true),
            "--no-use-env-proxy" => on = Some(false),
            _ => {}
        }
    }
    on
}

/// Loopback: `localhost`, `*.localhost`, `127.0.0.0/8`, `::1` (and `::ffff:127.x`).
pub fn is_loopback(host: &url::Host<&str>) -> bool {
    match host {
        url::Host::Domain(d) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost" || d.ends_with(".localhost")
        }
        url::Host::Ipv4(ip) => is_loopback_ip(IpAddr::V4(*ip)),
        url::Host::Ipv6(ip) => is_loopback_ip(IpAddr::V6(*ip)),
    }
}

/// undici's `NO_PROXY` rule: true when `host:port` must not be proxied. `host` is lowercase,
/// IPv6 in brackets (as in a URL's host).
pub fn no_proxy_matches(no_proxy: &str, host: &str, port: u16) -> bool {
    if no_proxy == "*" {
        return true;
    }
    for entry in no_proxy.split([',', ' ', '\t', '\n', '\r']).filter(|e| !e.is_empty()) {
        let (name, entry_port) = match entry.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                (h, p.parse::<u32>().unwrap_or(u32::MAX))
            }
            _ => (entry, 0),
        };
        if entry_port != 0 && entry_port != u32::from(port) {
            continue;
        }
        let name = name.to_ascii_lowercase();
        if name.starts_with(['.', '*']) {
            if host.ends_with(name.trim_start_matches('*')) {
                return true;
            }
        } else if host == name {
            return true;
        }
    }
    false
}

/// The proxy the environment names for `target`, if Node's rules (plus ours: never for
/// loopback, never for plain HTTP, only `http`/`https` proxy URLs) say to use one.
pub fn env_proxy(env: &NetEnv, target: &url::Url) -> Option<ProxyUrl> {
    if !env.use_env_proxy() || target.scheme() != "https" {
        return None;
    }
    let host = target.host()?;
    if is_loopback(&host) {
        return None;
    }
    let raw = env
        .first_set("https_proxy", "HTTPS_PROXY")
        .filter(|v| !v.is_empty())
        .or_else(|| env.first_set("http_proxy", "HTTP_PROXY"))
        .filter(|v| !v.is_empty())?;
    // `url` writes hosts as WHATWG URLs do (and so Node's `URL`): IPv6 in brackets and in
    // its canonical WHATWG form (`[::ffff:a00:1]`, where Rust's std writes `::ffff:10.0.0.1`).
    let host_text = host.to_string().to_ascii_lowercase();
    let port = target.port_or_known_default().unwrap_or(443);
    if no_proxy_matches(env.first_set("no_proxy", "NO_PROXY").unwrap_or(""), &host_text, port) {
        return None;
    }
    ProxyUrl::parse(raw)
}

/// The proxy for `target`: the explicit one (which needs an HTTPS target), else the
/// environment's.
pub fn choose_proxy(explicit: Option<&ProxyUrl>, env: &NetEnv, target: &url::Url) -> Result<Option<ProxyUrl>> {
    match explicit {
        Some(_) if target.scheme() != "https" => Err(Error::Input(PROXY_NEEDS_HTTPS)),
        Some(p) => Ok(Some(p.clone())),
        None => Ok(env_proxy(env, target)),
    }
}

/// The certificates of a PEM text (at least one), or `None`.
pub fn pem_certificates(pem: &[u8]) -> Option<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem).collect::<std::result::Result<Vec<_>, _>>().ok()?;
    (!certs.is_empty()).then_some(certs)
}

/// The extra roots the environment asks for, loaded once per process.
fn env_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let env = NetEnv::process();
        let mut roots = Vec::new();
        if let Some(path) = env.extra_ca_file() {
            if let Some(certs) = std::fs::read(path).ok().as_deref().and_then(pem_certificates) {
                roots.extend(certs);
            }
        }
        if env.use_system_ca() {
            // One odd system certificate cannot make the client unbuildable: `tls_config`
            // adds only what rustls accepts as a root.
            roots.extend(rustls_native_certs::load_native_certs().certs);
        }
        roots
    })
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    proxy: Option<ProxyUrl>,
    ca_pem: Option<String>,
    idle: Duration,
}

const BUILD_FAILED: Error = Error::Internal("the HTTP client could not be built");

/// The TLS settings of a configuration, built once and shared by all its lanes: one root
/// store (the built-in roots, the environment's, `caCertPem`) and one session cache. Each
/// reqwest client otherwise builds its own, about 65 KB a lane (heaptrack: 20 lanes held
/// 1.4 MB while 1,000 commands waited over HTTP/2), and a lane could not resume a session
/// another lane made. What reqwest would set itself: TLS 1.2 and 1.3, SNI, ALPN `h2` then
/// `http/1.1`, no client certificate, the process's default crypto provider, else ring.
fn tls_config(key: &Key) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().cloned());
    // The environment's certificates that rustls cannot use are skipped (as Node does).
    roots.add_parsable_certificates(env_roots().iter().cloned());
    if let Some(pem) = &key.ca_pem {
        for der in pem_certificates(pem.as_bytes()).ok_or(Error::Input(INVALID_CA_PEM))? {
            roots.add(der).map_err(|_| BUILD_FAILED)?;
        }
    }
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .map_err(|_| BUILD_FAILED)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tls)
}

fn build(key: &Key, tls: &rustls::ClientConfig) -> Result<reqwest::Client> {
    let mut b = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(30))
        .pool_idle_timeout(key.idle)
        .tcp_nodelay(true)
        .https_only(false)
        .user_agent(concat!("createos-execute/", env!("CARGO_PKG_VERSION")))
        .use_preconfigured_tls(tls.clone())
        .http2_adaptive_window(false)
        .http2_initial_stream_window_size(H2_STREAM_WINDOW)
        .http2_initial_connection_window_size(H2_CONNECTION_WINDOW);
    if key.idle < MIN_POOL_IDLE {
        b = b.pool_max_idle_per_host(0);
    }
    if let Some(p) = &key.proxy {
        b = b.proxy(reqwest::Proxy::all(p.0.as_str()).map_err(|_| Error::Input(INVALID_PROXY))?);
    }
    b.build().map_err(|_| BUILD_FAILED)
}

/// Streams one HTTP/2 connection is given at most (see "HTTP/2 lanes" in the module doc).
pub const H2_STREAMS_PER_CONNECTION: usize = 100;
/// At most this many lanes per configuration; beyond, the least busy lane takes the request
/// (its connection may then queue it: 25,600 concurrent requests are far past any host's use).
const MAX_LANES: usize = 256;

/// The process's HTTP client for one (proxy, trust, idle keep-alive) configuration: one or
/// more reqwest clients ("lanes"), each with its own connection pool (see "HTTP/2 lanes" in
/// the module doc). Cloning shares the lanes.
#[derive(Clone)]
pub struct Http(Arc<Lanes>);

struct Lanes {
    key: Key,
    tls: rustls::ClientConfig,
    lanes: Mutex<Vec<Lane>>,
}

struct Lane {
    client: reqwest::Client,
    state: Arc<LaneState>,
}

#[derive(Default)]
struct LaneState {
    /// Requests in flight on the lane.
    busy: AtomicUsize,
    /// The lane has had an answer: its pool holds a connection whose protocol is known.
    known: AtomicBool,
    /// Held by the first request of a lane whose protocol is not known yet (see
    /// [`Slot::first`]).
    opening: tokio::sync::Mutex<()>,
}

/// How long a request waits for the first answer of its lane before it opens a connection of
/// its own.
const FIRST_ANSWER_WAIT: Duration = Duration::from_secs(10);

/// A request's place on its lane, held until its answer's body is dropped or read to its end.
pub struct Slot(Arc<LaneState>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Holds a lane for its first request until that request has an answer ([`Slot::first`]).
pub struct Opening<'a>(#[allow(dead_code)] Option<tokio::sync::MutexGuard<'a, ()>>);

impl Slot {
    /// Before a request is sent on a lane whose protocol is not known yet (no answer came on
    /// it): a pool that does not know yet that its origin speaks HTTP/2 (ALPN tells only once
    /// the TLS handshake is done) opens a connection for every request of a burst, and 1,000
    /// commands started at once would open 1,000 connections to be closed idle a moment later.
    /// So the first request of a lane goes alone: the others wait (at most
    /// [`FIRST_ANSWER_WAIT`]) until it has an answer, or until it failed (then the next one
    /// goes alone). The returned value is held until the answer came and [`Slot::answered`]
    /// was called. With `hold` false (a request whose answer comes late by design, like a
    /// held upload) the wait is the same but nothing is held: it never makes others wait.
    pub async fn first(&self, hold: bool) -> Opening<'_> {
        if self.0.known.load(Ordering::Acquire) {
            return Opening(None);
        }
        match tokio::time::timeout(FIRST_ANSWER_WAIT, self.0.opening.lock()).await {
            Ok(guard) if hold && !self.0.known.load(Ordering::Acquire) => Opening(Some(guard)),
            _ => Opening(None),
        }
    }

    /// An answer came on this lane: its pool knows the connection's protocol.
    pub fn answered(&self) {
        self.0.known.store(true, Ordering::Release);
    }
}

impl Http {
    fn new(key: Key) -> Result<Http> {
        let tls = tls_config(&key)?;
        let first = Lane { client: build(&key, &tls)?, state: Arc::default() };
        Ok(Http(Arc::new(Lanes { key, tls, lanes: Mutex::new(vec![first]) })))
    }

    /// The client a request to `url` goes through, and its slot. `https` requests (which
    /// may be multiplexed on one HTTP/2 connection) take the first lane with fewer than
    /// [`H2_STREAMS_PER_CONNECTION`] requests in flight, and a new lane when every lane is
    /// full; plain `http` (HTTP/1.1 only: one request per connection anyway) always takes
    /// the first.
    pub fn lane(&self, url: &str) -> (reqwest::Client, Option<Slot>) {
        let mut lanes = self.0.lanes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !url.starts_with("https:") {
            return (lanes[0].client.clone(), None);
        }
        let free = lanes.iter().position(|l| l.state.busy.load(Ordering::Relaxed) < H2_STREAMS_PER_CONNECTION);
        let i = match free {
            Some(i) => i,
            None if lanes.len() < MAX_LANES => match build(&self.0.key, &self.0.tls) {
                Ok(client) => {
                    lanes.push(Lane { client, state: Arc::default() });
                    lanes.len() - 1
                }
                Err(_) => least_busy(&lanes),
            },
            None => least_busy(&lanes),
        };
        let lane = &lanes[i];
        lane.state.busy.fetch_add(1, Ordering::Relaxed);
        (lane.client.clone(), Some(Slot(Arc::clone(&lane.state))))
    }

    /// How many lanes this configuration has opened (for tests and the bench).
    pub fn lanes(&self) -> usize {
        self.0.lanes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }
}

fn least_busy(lanes: &[Lane]) -> usize {
    (0..lanes.len()).min_by_key(|&i| lanes[i].state.busy.load(Ordering::Relaxed)).unwrap_or(0)
}

/// The process's HTTP client for this (proxy, trust, idle keep-alive) configuration.
pub fn http_client(proxy: Option<&ProxyUrl>, ca_pem: Option<&str>, idle: Duration) -> Result<Http> {
    static CLIENTS: OnceLock<Mutex<HashMap<Key, Http>>> = OnceLock::new();
    let key = Key { proxy: proxy.cloned(), ca_pem: ca_pem.map(str::to_owned), idle };
    let map = CLIENTS.get_or_init(Default::default);
    if let Some(c) = map.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key) {
        return Ok(c.clone());
    }
    let client = Http::new(key.clone())?;
    let mut m = map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(c) = m.get(&key) {
        return Ok(c.clone());
    }
    if m.len() < MAX_CACHED_CLIENTS {
        m.insert(key, client.clone());
    }
    Ok(client)
}

/// True when a request failed because the server's certificate did not verify.
pub fn is_untrusted_certificate(err: &(dyn std::error::Error + 'static)) -> bool {
    fn rustls_says(e: &(dyn std::error::Error + 'static)) -> Option<bool> {
        let r = e.downcast_ref::<rustls::Error>()?;
        Some(matches!(r, rustls::Error::InvalidCertificate(_)))
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    for _ in 0..32 {
        let Some(e) = cur else { break };
        if let Some(v) = rustls_says(e) {
            return v;
        }
        // io::Error's `source()` skips the error it wraps (often another io::Error): step
        // into it instead.
        cur = match e.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    false
}

/// How a proxy failed a request (see [`proxy_failure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyFailure {
    /// The proxy answered the `CONNECT` with another status than 200 (`Some(407)` for a 407,
    /// the only status the HTTP stack keeps), or closed the connection instead of answering.
    Refused { status: Option<u16> },
    /// The connection to the proxy could not be made, or broke before it answered.
    Unreachable,
}

/// Whether a request failed while its `CONNECT` tunnel was being set up, and how.
///
/// reqwest tunnels through hyper-util's `Tunnel`, whose error type is private: it can be
/// recognised only by its text, `tunnel error: <what>`, somewhere in the error's chain. The
/// status of a refusal other than a 407 is not kept (hyper-util maps every other answer to
/// "unsuccessful"). Every outcome here happened before a byte reached CreateOS: the target's
/// TLS handshake starts only once the tunnel is up. The proxy tests (`proxy.test.mjs`,
/// against a real squid) pin these texts: a hyper-util that changes them fails there.
pub fn proxy_failure(err: &(dyn std::error::Error + 'static)) -> Option<ProxyFailure> {
    const PREFIX: &str = "tunnel error: ";
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    for _ in 0..32 {
        let e = cur?;
        let text = e.to_string();
        if let Some(what) = text.strip_prefix(PREFIX) {
            return match what {
                "proxy authorization required" => Some(ProxyFailure::Refused { status: Some(407) }),
                "unsuccessful" | "proxy response headers too long" | "unexpected end of file" => {
                    Some(ProxyFailure::Refused { status: None })
                }
                "failed to create underlying connection" | "io error establishing tunnel" => {
                    Some(ProxyFailure::Unreachable)
                }
                _ => None,
            };
        }
        cur = match e.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

/// Whether an IP literal is loopback (for callers holding an `IpAddr`).
pub fn is_loopback_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_keep_alive_hint_lowers_the_idle_time_of_its_origin_only() {
        let ms = |v: u64| Some(Duration::from_millis(v));
        assert_eq!(keep_alive_idle("timeout=2"), ms(1000));
        assert_eq!(keep_alive_idle("max=100, timeout=3"), ms(2000));
        assert_eq!(keep_alive_idle(" Timeout = 1 "), ms(0));
        // Not shorter than ours, or not a number: no change.
        for h in ["timeout=5", "timeout=60", "timeout=x", "max=5", "", "timeout=-1", "timeout=99999999999999999999"] {
            assert_eq!(keep_alive_idle(h), None, "{h}");
        }
        let origin = "http://hint-test.invalid:1";
        assert_eq!(pool_idle_for(origin), POOL_IDLE);
        note_keep_alive(origin, "timeout=5");
        assert_eq!(pool_idle_for(origin), POOL_IDLE);
        note_keep_alive(origin, "timeout=2");
        assert_eq!(pool_idle_for(origin), Duration::from_secs(1));
        assert_eq!(pool_idle_for("http://other.invalid:1"), POOL_IDLE);
        // Clients with a lowered idle time, and without pooling, are built.
        assert!(http_client(None, None, Duration::from_secs(1)).is_ok());
        assert!(http_client(None, None, Duration::ZERO).is_ok());
    }

    fn url(s: &str) -> url::Url {
        url::Url::parse(s).unwrap()
    }

    fn env(pairs: &[(&str, &str)]) -> NetEnv {
        NetEnv::from_pairs(pairs.iter().copied())
    }

    const ALL_DEAD: [(&str, &str); 6] = [
        ("HTTP_PROXY", "http://127.0.0.1:9"),
        ("http_proxy", "http://127.0.0.1:9"),
        ("HTTPS_PROXY", "http://127.0.0.1:9"),
        ("https_proxy", "http://127.0.0.1:9"),
        ("ALL_PROXY", "socks5://127.0.0.1:9"),
        ("all_proxy", "socks5://127.0.0.1:9"),
    ];

    #[test]
    fn without_node_use_env_proxy_nothing_comes_from_the_environment() {
        let e = env(&ALL_DEAD);
        assert_eq!(env_proxy(&e, &url("https://api.example.com")), None);
        let e = env(&[("HTTPS_PROXY", "http://p:1"), ("NODE_USE_ENV_PROXY", "true")]);
        assert_eq!(env_proxy(&e, &url("https://api.example.com")), None, "only the value 1 turns it on");
    }

    #[test]
    fn https_proxy_then_http_proxy_lowercase_first() {
        let on = ("NODE_USE_ENV_PROXY", "1");
        let t = url("https://api.example.com");
        let p = |s: &str| ProxyUrl::parse(s);
        assert_eq!(env_proxy(&env(&[on, ("HTTPS_PROXY", "http://a:1")]), &t), p("http://a:1"));
        assert_eq!(
            env_proxy(&env(&[on, ("https_proxy", "http://b:1"), ("HTTPS_PROXY", "http://a:1")]), &t),
            p("http://b:1")
        );
        assert_eq!(
            env_proxy(&env(&[on, ("HTTP_PROXY", "http://c:1")]), &t),
            p("http://c:1"),
            "http_proxy serves https too"
        );
        assert_eq!(
            env_proxy(&env(&[on, ("https_proxy", ""), ("HTTPS_PROXY", "http://a:1")]), &t),
            None,
            "?? : an empty lowercase wins"
        );
        assert_eq!(
            env_proxy(&env(&[on, ("https_proxy", ""), ("HTTP_PROXY", "http://c:1")]), &t),
            p("http://c:1"),
            "an empty https proxy falls back to the http one"
        );
        assert_eq!(env_proxy(&env(&[on, ("ALL_PROXY", "http://a:1")]), &t), None, "ALL_PROXY is not read");
    }

    #[test]
    fn loopback_and_plain_http_are_never_proxied_from_the_environment() {
        let mut pairs = ALL_DEAD.to_vec();
        pairs.push(("NODE_USE_ENV_PROXY", "1"));
        let e = env(&pairs);
        for t in [
            "http://127.0.0.1:8080",
            "https://127.0.0.1:8443",
            "https://localhost:1",
            "https://a.localhost",
            "https://[::1]:9",
            "https://127.8.0.1",
            "http://localhost:1",
        ] {
            assert_eq!(env_proxy(&e, &url(t)), None, "{t}");
        }
        assert!(env_proxy(&e, &url("https://createos.test:4443")).is_some());
    }

    #[test]
    fn unsupported_environment_proxies_are_ignored() {
        let on = ("NODE_USE_ENV_PROXY", "1");
        let t = url("https://api.example.com");
        for bad in ["socks5://127.0.0.1:1080", "socks5h://x:1", "not a url", "ftp://x:1", "http://x:1/?q=1"] {
            assert_eq!(env_proxy(&env(&[on, ("HTTPS_PROXY", bad)]), &t), None, "{bad}");
        }
    }

    #[test]
    fn no_proxy_follows_undici() {
        assert!(no_proxy_matches("*", "a.b", 443));
        assert!(no_proxy_matches("x.com, *", "a.b", 443));
        assert!(no_proxy_matches("a.b", "a.b", 443));
        assert!(!no_proxy_matches("a.b", "x.a.b", 443), "exact entries do not match subdomains");
        assert!(no_proxy_matches(".a.b", "x.a.b", 443));
        assert!(!no_proxy_matches(".a.b", "a.b", 443), "a leading dot needs a subdomain");
        assert!(no_proxy_matches("*.a.b", "x.a.b", 443));
        assert!(no_proxy_matches("*a.b", "xa.b", 443));
        assert!(no_proxy_matches("a.b:443", "a.b", 443));
        assert!(!no_proxy_matches("a.b:8443", "a.b", 443));
        assert!(no_proxy_matches("x y\ta.b", "a.b", 443), "spaces separate too");
        assert!(no_proxy_matches("A.B", "a.b", 443), "case-insensitive");
        assert!(no_proxy_matches("[::2]:443", "[::2]", 443));
        assert!(!no_proxy_matches("", "a.b", 443));
        let e = env(&[
            ("NODE_USE_ENV_PROXY", "1"),
            ("HTTPS_PROXY", "http://p:1"),
            ("no_proxy", "example.com"),
            ("NO_PROXY", "*"),
        ]);
        assert!(env_proxy(&e, &url("https://api.example.com")).is_some(), "no_proxy wins over NO_PROXY");
        assert_eq!(env_proxy(&e, &url("https://example.com")), None);
        let e = env(&[("NODE_USE_ENV_PROXY", "1"), ("HTTPS_PROXY", "http://p:1"), ("NO_PROXY", "example.com:8443")]);
        assert_eq!(env_proxy(&e, &url("https://example.com:8443")), None);
        assert!(env_proxy(&e, &url("https://example.com")).is_some(), "the default port is 443");
    }

    #[test]
    fn explicit_proxy_applies_everywhere_but_only_to_https() {
        let p = ProxyUrl::parse("http://user:secret@proxy.corp:3128").unwrap();
        let none = NetEnv::default();
        assert_eq!(choose_proxy(Some(&p), &none, &url("https://localhost:1")).unwrap(), Some(p.clone()));
        let no = env(&[("NODE_USE_ENV_PROXY", "1"), ("NO_PROXY", "*")]);
        assert_eq!(
            choose_proxy(Some(&p), &no, &url("https://a.b")).unwrap(),
            Some(p.clone()),
            "NO_PROXY is for the environment's proxy"
        );
        assert!(matches!(
            choose_proxy(Some(&p), &none, &url("http://127.0.0.1:1")),
            Err(Error::Input(PROXY_NEEDS_HTTPS))
        ));
        assert_eq!(choose_proxy(None, &none, &url("https://a.b")).unwrap(), None);
        assert!(ProxyUrl::parse("socks5://x:1").is_none());
        assert!(ProxyUrl::parse("https://proxy:443").is_some());
        assert_eq!(format!("{p:?}"), "ProxyUrl(<redacted>)", "credentials never format");
    }

    #[test]
    fn node_options_and_the_command_line_turn_the_switch_on_and_off() {
        let t = url("https://api.example.com");
        let proxy = ("HTTPS_PROXY", "http://p:1");
        let on = |pairs: &[(&str, &str)], argv: Option<bool>| {
            let mut all = pairs.to_vec();
            all.push(proxy);
            env_proxy(&env(&all).with_argv_switch(argv), &t).is_some()
        };
        assert!(on(&[("NODE_OPTIONS", "--use-env-proxy")], None));
        assert!(on(&[("NODE_OPTIONS", "--max-old-space-size=100 --use_env_proxy")], None), "_ is -");
        assert!(on(&[("NODE_OPTIONS", "--require \"/a b/x.js\" --use-env-proxy")], None));
        assert!(!on(&[("NODE_OPTIONS", "--use-env-proxy --no-use-env-proxy")], None), "the last flag wins");
        assert!(!on(&[("NODE_OPTIONS", "--no-use-env-proxy"), ("NODE_USE_ENV_PROXY", "1")], None), "the flag wins");
        assert!(on(&[("NODE_OPTIONS", "--use-env-proxy"), ("NODE_USE_ENV_PROXY", "0")], None), "the flag wins");
        assert!(!on(&[("NODE_OPTIONS", "\"--title=--use-env-proxy\"")], None), "a value is not a flag");
        assert!(!on(&[("NODE_OPTIONS", "--use-env-proxyx")], None));
        assert!(on(&[], Some(true)));
        assert!(on(&[("NODE_OPTIONS", "--no-use-env-proxy")], Some(true)), "the command line wins");
        assert!(!on(&[("NODE_OPTIONS", "--use-env-proxy"), ("NODE_USE_ENV_PROXY", "1")], Some(false)));
        assert!(on(&[("NODE_USE_ENV_PROXY", "1")], None));
        assert!(!on(&[], None));
        assert_eq!(node_options_args(r#"  a  "b c" "d\"e" f"g"h "" "#), ["a", "b c", "d\"e", "fgh"]);
        assert_eq!(env_proxy_switch(["--use-env-proxy", "--no-use-env-proxy", "--use-env-proxy"]), Some(true));
        assert_eq!(env_proxy_switch(Vec::<String>::new()), None);
    }

    #[test]
    fn ipv6_hosts_are_matched_as_nodes_url_writes_them() {
        let e = |no: &str| env(&[("NODE_USE_ENV_PROXY", "1"), ("HTTPS_PROXY", "http://p:1"), ("NO_PROXY", no)]);
        let t = url("https://[::ffff:10.0.0.1]:8443");
        assert_eq!(t.host_str(), Some("[::ffff:a00:1]"), "as new URL() writes it");
        assert_eq!(env_proxy(&e("[::ffff:a00:1]"), &t), None);
        assert_eq!(env_proxy(&e("[::ffff:a00:1]:8443"), &t), None);
        assert!(env_proxy(&e("[::ffff:a00:1]:443"), &t).is_some());
        assert!(env_proxy(&e("[::ffff:10.0.0.1]"), &t).is_some(), "Rust's std form is not Node's");
        assert_eq!(env_proxy(&e("[2001:db8::1]"), &url("https://[2001:DB8:0:0::1]/")), None);
        assert_eq!(env_proxy(&e("*"), &t), None);
    }

    #[test]
    fn trust_switches() {
        let e = env(&[("NODE_USE_SYSTEM_CA", "1"), ("NODE_EXTRA_CA_CERTS", "/x.pem")]);
        assert!(e.use_system_ca());
        assert_eq!(e.extra_ca_file(), Some("/x.pem"));
        let e = env(&[("NODE_USE_SYSTEM_CA", "0"), ("NODE_EXTRA_CA_CERTS", "")]);
        assert!(!e.use_system_ca());
        assert_eq!(e.extra_ca_file(), None);
        assert!(pem_certificates(b"not pem").is_none());
        assert!(pem_certificates(b"").is_none());
    }

    #[test]
    fn loopback_hosts() {
        for h in ["localhost", "LOCALHOST", "x.localhost", "localhost."] {
            assert!(is_loopback(&url::Host::Domain(h)), "{h}");
        }
        assert!(!is_loopback(&url::Host::Domain("example.com")));
        assert!(is_loopback_ip("127.0.0.2".parse().unwrap()));
        assert!(is_loopback_ip("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!is_loopback_ip("10.0.0.1".parse().unwrap()));
    }
}
