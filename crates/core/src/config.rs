//! The caller's input, checked before anything is sent: the client configuration (from
//! `client.config` plus the key) and the command parameters. All checks on input live here
//! and in `script.rs` (which owns the rules for command words and environment names).

use std::time::Duration;

use serde_json::{Map, Value};

use crate::cleanup::CleanupPolicy;
use crate::client::{self, Client, NetOptions};
use crate::error::{Error, Result};
use crate::events::EventSink;
use crate::follow::FollowOptions;
use crate::hooks::Phase;
use crate::net;
use crate::pacer::{redis_store, PacingConfig, PacingMode, StoreChoice};
use crate::script;

pub const INVALID_SANDBOX_ID: &str = "Invalid sandbox ID.";
pub const INVALID_PROCESS_ID: &str = "Invalid process ID.";
pub const INVALID_TIMEOUT: &str = "timeoutMs must be an integer between 1 and 86400000.";
pub const INVALID_ARGS: &str = "args must be an array of strings.";
pub const INVALID_CWD: &str = "cwd must be a string.";
pub const INVALID_STDIN: &str = "Sandbox stdin must be a string.";
pub const INVALID_PACING: &str = "pacing must be 'window', 'spacing', 'off' or an object { limit, windowMs, store, key } or { intervalMs, store, key }.";
pub const INVALID_PACING_LIMIT: &str = "pacing.limit must be an integer between 1 and 1000000.";
pub const INVALID_PACING_WINDOW: &str = "pacing.windowMs must be an integer between 1 and 3600000.";
pub const INVALID_PACING_INTERVAL: &str = "pacing.intervalMs must be an integer between 0 and 600000.";
pub const INVALID_LEGACY: &str = "legacyCleanup must be true or false.";
pub const INVALID_PACING_STORE: &str = "pacing.store must be a redis:// or rediss:// URL, or false.";
pub const INVALID_PACING_STORE_ENV: &str = "CREATEOS_PACING_STORE must be a redis:// or rediss:// URL.";
pub const INVALID_PACING_KEY: &str =
    "pacing.key must be 1 to 200 printable ASCII characters without spaces or braces, and must not contain the API key.";
pub const INVALID_GRACE: &str = "cleanupGraceMs must be a non-empty array of integers between 0 and 600000.";
pub const INVALID_DEADLINE: &str = "cleanupDeadlineMs must be an integer between 1 and 86400000.";
pub const INVALID_CONFIRM: &str = "confirmPollMs must be an integer between 1 and 600000.";
pub const INVALID_LEFTOVER: &str = "leftoverProcesses must be 'keep' or 'terminate'.";
pub const INVALID_IDLE: &str = "streamIdleTimeoutMs must be an integer between 1000 and 3600000.";
pub const INVALID_PANIC_AT: &str = "__panicAt must be 'create', 'follow' or 'cleanup'.";
pub const INVALID_CONFIG: &str = "client.config must be an object.";
pub const INVALID_PARAMS: &str = "params must be an object with lease and command.";

pub const INVALID_SESSION: &str = "session must be true, false or an object { idleMs }.";
pub const INVALID_SESSION_IDLE: &str = "session.idleMs must be an integer between 1000 and 3600000.";
pub const INVALID_BYPASS_SESSION: &str = "bypassSession must be true or false.";

/// The idle time of `session: true`.
pub const DEFAULT_SESSION_IDLE: Duration = Duration::from_secs(30);

/// `config.session`, parsed (see `session/mod.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOptions {
    pub idle: Duration,
}

/// `session`: absent, null or false = off; true = on with [`DEFAULT_SESSION_IDLE`]; `{ idleMs }`.
pub fn parse_session(v: Option<&Value>) -> Result<Option<SessionOptions>> {
    match v {
        None | Some(Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(SessionOptions { idle: DEFAULT_SESSION_IDLE })),
        Some(Value::Object(o)) => {
            let idle = match opt(o, "idleMs") {
                None => DEFAULT_SESSION_IDLE,
                Some(i) => {
                    Duration::from_millis(integer(i, 1000, 3_600_000).ok_or(Error::Input(INVALID_SESSION_IDLE))?)
                }
            };
            Ok(Some(SessionOptions { idle }))
        }
        Some(_) => Err(Error::Input(INVALID_SESSION)),
    }
}

/// What to do with processes a command leaves behind after it exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Leftover {
    #[default]
    Keep,
    Terminate,
}

pub struct Config {
    pub api_url: String,
    pub api_key: String,
    pub timeout: Duration,
    /// Mode, store and budget key; unconfigured parts keep what the budget has.
    pub pacing: PacingConfig,
    pub cleanup: CleanupPolicy,
    pub leftover: Leftover,
    pub follow: FollowOptions,
    /// `proxy` and `caCertPem` (see `net.rs`).
    pub net: NetOptions,
    /// Test hook (`test-hooks` feature only): panic at this phase.
    pub panic_at: Option<Phase>,
    /// Hears every request attempt and cleanup step (set by the caller, never parsed).
    pub events: Option<EventSink>,
    /// The host's `fetch`, when requests go through it (set by the caller, never parsed;
    /// see `transport.rs`). `None`: the native client.
    pub host_fetch: Option<std::sync::Arc<dyn crate::transport::HostFetch>>,
    /// `session` (see `session/mod.rs`): `None` = off, the default.
    pub session: Option<SessionOptions>,
}

impl Config {
    pub fn client(&self) -> Result<Client> {
        Client::new(&self.api_url, &self.api_key, self.timeout, &self.pacing, &self.net)
            .map(|c| c.with_events(self.events.clone()).with_host_fetch(self.host_fetch.clone()))
    }
}

/// `proxy` (an `http://` or `https://` URL; needs an `https://` apiUrl) and `caCertPem` (a PEM
/// string with at least one certificate).
fn parse_net(m: &Map<String, Value>, api_url: &str) -> Result<NetOptions> {
    let proxy = match opt(m, "proxy") {
        None => None,
        Some(Value::String(s)) => Some(net::ProxyUrl::parse(s).ok_or(Error::Input(net::INVALID_PROXY))?),
        Some(_) => return Err(Error::Input(net::INVALID_PROXY)),
    };
    if proxy.is_some() && !api_url.trim().to_ascii_lowercase().starts_with("https:") {
        return Err(Error::Input(net::PROXY_NEEDS_HTTPS));
    }
    let ca_cert_pem = match opt(m, "caCertPem") {
        None => None,
        Some(Value::String(s)) if net::pem_certificates(s.as_bytes()).is_some() => Some(shared_pem(s)),
        Some(_) => return Err(Error::Input(net::INVALID_CA_PEM)),
    };
    Ok(NetOptions { proxy, ca_cert_pem })
}

/// One copy of the `caCertPem` a host passes on every call: each command in flight holds its
/// config, and would otherwise hold its own copy of the PEM (docs/benchmarks.md §14). The last
/// PEM seen is remembered weakly, so nothing outlives the commands that use it.
fn shared_pem(pem: &str) -> std::sync::Arc<str> {
    use std::sync::{Arc, Mutex, PoisonError, Weak};
    static LAST: Mutex<Option<Weak<str>>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(same) = last.as_ref().and_then(Weak::upgrade).filter(|p| **p == *pem) {
        return same;
    }
    let fresh: Arc<str> = Arc::from(pem);
    *last = Some(Arc::downgrade(&fresh));
    fresh
}

fn integer(v: &Value, min: u64, max: u64) -> Option<u64> {
    let n = v.as_f64()?;
    (n.fract() == 0.0 && n >= min as f64 && n <= max as f64).then_some(n as u64)
}

fn opt<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.get(key).filter(|v| !v.is_null())
}

fn pacing_mode(v: &Value) -> Result<PacingMode> {
    match v {
        Value::String(s) => Ok(match s.as_str() {
            "window" => PacingMode::default(),
            "spacing" => PacingMode::spacing_default(),
            "off" => PacingMode::Off,
            _ => return Err(Error::Input(INVALID_PACING)),
        }),
        Value::Object(p) => {
            if let Some(i) = opt(p, "intervalMs") {
                let ms = integer(i, 0, 600_000).ok_or(Error::Input(INVALID_PACING_INTERVAL))?;
                return Ok(PacingMode::Spacing { interval: Duration::from_millis(ms) });
            }
            let limit = opt(p, "limit")
                .map_or(Some(300), |l| integer(l, 1, 1_000_000))
                .ok_or(Error::Input(INVALID_PACING_LIMIT))?;
            let window = opt(p, "windowMs")
                .map_or(Some(60_000), |w| integer(w, 1, 3_600_000))
                .ok_or(Error::Input(INVALID_PACING_WINDOW))?;
            Ok(PacingMode::Window { limit: limit as usize, window: Duration::from_millis(window) })
        }
        _ => Err(Error::Input(INVALID_PACING)),
    }
}

/// `pacing` (mode, `store`, `key`) and `pacingStoreDefault` (index.js passes
/// `CREATEOS_PACING_STORE` there). Store: `pacing.store` (a URL, or `false` = in-process), else
/// the default, else in-process when `pacing` was given, else whatever the budget has.
fn parse_pacing(m: &Map<String, Value>, api_key: &str) -> Result<PacingConfig> {
    let given = opt(m, "pacing");
    let mode = given.map(pacing_mode).transpose()?;
    let obj = given.and_then(Value::as_object);
    let default_store = match opt(m, "pacingStoreDefault") {
        None => None,
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) if redis_store::valid_url(s.trim()) => Some(s.trim().to_owned()),
        Some(_) => return Err(Error::Input(INVALID_PACING_STORE_ENV)),
    };
    let store = match obj.and_then(|p| opt(p, "store")) {
        Some(Value::String(s)) if redis_store::valid_url(s.trim()) => StoreChoice::Redis(s.trim().to_owned()),
        Some(Value::Bool(false)) => StoreChoice::Local,
        Some(_) => return Err(Error::Input(INVALID_PACING_STORE)),
        None => match default_store {
            Some(url) => StoreChoice::Redis(url),
            None if given.is_some() => StoreChoice::Local,
            None => StoreChoice::Keep,
        },
    };
    // A password over plain redis:// to a remote host (see `redis_store::password_in_clear`).
    let allow_clear = match obj.and_then(|p| opt(p, "allowPlaintextPassword")) {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(Error::Input(INVALID_PACING)),
    };
    if let StoreChoice::Redis(url) = &store {
        if !allow_clear && redis_store::password_in_clear(url) {
            let from_env = obj.is_none_or(|p| opt(p, "store").is_none());
            return Err(Error::Input(if from_env {
                redis_store::PLAINTEXT_PASSWORD_ENV
            } else {
                redis_store::PLAINTEXT_PASSWORD
            }));
        }
    }
    let key = match obj.and_then(|p| opt(p, "key")) {
        None => None,
        Some(Value::String(k))
            if !k.is_empty()
                && k.len() <= 200
                && k.bytes().all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
                && (api_key.is_empty() || !k.contains(api_key)) =>
        {
            Some(k.clone())
        }
        Some(_) => return Err(Error::Input(INVALID_PACING_KEY)),
    };
    Ok(PacingConfig { mode, store, key })
}

/// Parses the client object index.js builds: `{ apiUrl, apiKey, timeoutMs, ...options }`.
pub fn parse_config(v: &Value) -> Result<Config> {
    let m = v.as_object().ok_or(Error::Input(INVALID_CONFIG))?;
    let api_url = opt(m, "apiUrl").and_then(Value::as_str).ok_or(Error::Input(client::INVALID_URL))?;
    client::api_origin(api_url)?;
    let api_key = opt(m, "apiKey").and_then(Value::as_str).unwrap_or("").trim().to_owned();
    let timeout_ms = match opt(m, "timeoutMs") {
        None => 300_000,
        Some(t) => integer(t, 1, 86_400_000).ok_or(Error::Input(INVALID_TIMEOUT))?,
    };
    let pacing = parse_pacing(m, &api_key)?;
    let panic_at = panic_hook(m)?;
    // The verdict comes within 30 s by default, however long the command may run.
    let deadline = Duration::from_millis(timeout_ms).min(crate::cleanup::DEFAULT_DEADLINE);
    let mut cleanup = CleanupPolicy { deadline, panic_at, ..CleanupPolicy::default() };
    if let Some(g) = opt(m, "cleanupGraceMs") {
        let graces = g.as_array().filter(|a| !a.is_empty() && a.len() <= 16).ok_or(Error::Input(INVALID_GRACE))?;
        cleanup.graces_ms =
            graces.iter().map(|x| integer(x, 0, 600_000)).collect::<Option<_>>().ok_or(Error::Input(INVALID_GRACE))?;
    }
    if let Some(d) = opt(m, "cleanupDeadlineMs") {
        cleanup.deadline = Duration::from_millis(integer(d, 1, 86_400_000).ok_or(Error::Input(INVALID_DEADLINE))?);
    }
    if let Some(c) = opt(m, "confirmPollMs") {
        cleanup.confirm_ms = integer(c, 1, 600_000).ok_or(Error::Input(INVALID_CONFIRM))?;
    }
    cleanup.legacy = match opt(m, "legacyCleanup") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(Error::Input(INVALID_LEGACY)),
    };
    let leftover = match opt(m, "leftoverProcesses").map(|v| v.as_str()) {
        None | Some(Some("keep")) => Leftover::Keep,
        Some(Some("terminate")) => Leftover::Terminate,
        _ => return Err(Error::Input(INVALID_LEFTOVER)),
    };
    let mut follow =
        FollowOptions { request_timeout: Duration::from_millis(timeout_ms), panic_at, ..FollowOptions::default() };
    if let Some(i) = opt(m, "streamIdleTimeoutMs") {
        follow.idle_timeout = Duration::from_millis(integer(i, 1000, 3_600_000).ok_or(Error::Input(INVALID_IDLE))?);
    }
    let net = parse_net(m, api_url)?;
    let session = parse_session(opt(m, "session"))?;
    Ok(Config {
        session,
        net,
        api_url: api_url.to_owned(),
        api_key,
        timeout: Duration::from_millis(timeout_ms),
        pacing,
        cleanup,
        leftover,
        follow,
        panic_at,
        events: None,
        host_fetch: None,
    })
}

/// `__panicAt` (test hook): honoured only with the `test-hooks` feature, ignored otherwise.
#[cfg(feature = "test-hooks")]
fn panic_hook(m: &Map<String, Value>) -> Result<Option<Phase>> {
    match opt(m, "__panicAt") {
        None => Ok(None),
        Some(v) => v.as_str().and_then(Phase::parse).map(Some).ok_or(Error::Input(INVALID_PANIC_AT)),
    }
}

#[cfg(not(feature = "test-hooks"))]
#[allow(clippy::unnecessary_wraps)]
fn panic_hook(_: &Map<String, Value>) -> Result<Option<Phase>> {
    Ok(None)
}

/// A command to run.
#[derive(Debug, Clone, Default)]
pub struct Params {
    pub sandbox_id: String,
    pub command: String,
    pub args: Vec<String>,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Option<String>,
    /// `bypassSession` (the SDK's per-command opt-out): this command runs in the default
    /// mode even when `config.session` is on.
    pub bypass_session: bool,
}

impl Params {
    pub fn command(&self) -> script::Command<'_> {
        script::Command { command: &self.command, args: &self.args, cwd: self.cwd.as_deref(), env: &self.env }
    }
}

fn identifier(v: Option<&Value>, invalid: &'static str) -> Result<String> {
    match v.and_then(Value::as_str) {
        Some(s) if client::is_identifier(s) => Ok(s.to_owned()),
        _ => Err(Error::Input(invalid)),
    }
}

pub fn sandbox_id(v: Option<&Value>) -> Result<String> {
    identifier(v, INVALID_SANDBOX_ID)
}

pub fn process_id(v: Option<&Value>) -> Result<String> {
    identifier(v, INVALID_PROCESS_ID)
}

/// Parses `{ sandboxId, command, args?, cwd?, env?, stdin? }` and checks every value.
pub fn parse_params(v: &Value) -> Result<Params> {
    let m = v.as_object().ok_or(Error::Input(INVALID_PARAMS))?;
    let sandbox_id = sandbox_id(m.get("sandboxId"))?;
    let command = match opt(m, "command") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err(Error::Input(script::COMMAND_REQUIRED)),
    };
    let args = match opt(m, "args") {
        None => vec![],
        Some(Value::Array(a)) => {
            a.iter().map(|x| x.as_str().map(str::to_owned)).collect::<Option<_>>().ok_or(Error::Input(INVALID_ARGS))?
        }
        Some(_) => return Err(Error::Input(INVALID_ARGS)),
    };
    let cwd = match opt(m, "cwd") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()).filter(|s| !s.is_empty()),
        Some(_) => return Err(Error::Input(INVALID_CWD)),
    };
    let env = match opt(m, "env") {
        None => vec![],
        Some(Value::Object(e)) => e
            .iter()
            .map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
            .collect::<Option<_>>()
            .ok_or(Error::Input(script::INVALID_ENV))?,
        Some(_) => return Err(Error::Input(script::INVALID_ENV)),
    };
    let stdin = match opt(m, "stdin") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(Error::Input(INVALID_STDIN)),
    };
    let bypass_session = match opt(m, "bypassSession") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(Error::Input(INVALID_BYPASS_SESSION)),
    };
    let p = Params { sandbox_id, command, args, cwd, env, stdin, bypass_session };
    script::validate(&p.command())?;
    if p.stdin.as_deref().is_some_and(|s| s.contains('\0')) {
        // Staged as a file, so NUL would be fine on the wire; the TypeScript module's rule
        // ("NUL anywhere is rejected") is kept for every value the caller passes.
        return Err(Error::Input(script::NUL_IN_VALUE));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_defaults_and_errors() {
        let c = parse_config(&json!({"apiUrl": "http://127.0.0.1:1", "apiKey": "k"})).unwrap();
        assert_eq!(c.timeout, Duration::from_secs(300));
        assert_eq!(c.pacing, PacingConfig::default());
        assert_eq!(c.cleanup.graces_ms, vec![1000, 5000]);
        assert_eq!(c.cleanup.deadline, Duration::from_secs(30), "min(timeoutMs, 30000)");
        let short = parse_config(&json!({"apiUrl": "https://x.io", "timeoutMs": 2500})).unwrap();
        assert_eq!(short.cleanup.deadline, Duration::from_millis(2500));
        let long = parse_config(&json!({"apiUrl": "https://x.io", "cleanupDeadlineMs": 90000})).unwrap();
        assert_eq!(long.cleanup.deadline, Duration::from_secs(90), "an explicit deadline wins");
        assert!(parse_config(&json!({"apiUrl": "http://example.com"})).is_err());
        assert!(parse_config(&json!({"apiUrl": "https://x.io", "timeoutMs": 0})).is_err());
        assert!(parse_config(&json!({"apiUrl": "https://x.io", "pacing": "fast"})).is_err());
        let c = parse_config(&json!({"apiUrl": "https://x.io", "pacing": {"intervalMs": 300}, "cleanupGraceMs": [100, 200], "legacyCleanup": true})).unwrap();
        assert_eq!(c.pacing.mode, Some(PacingMode::Spacing { interval: Duration::from_millis(300) }));
        assert_eq!(c.pacing.store, StoreChoice::Local);
        assert!(c.cleanup.legacy);
    }

    #[test]
    fn each_bad_field_is_named() {
        let bad = |extra: Value| {
            let mut c = json!({"apiUrl": "https://x.io"});
            c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            match parse_config(&c) {
                Err(Error::Input(m)) => m,
                _ => panic!("{extra}"),
            }
        };
        assert_eq!(bad(json!({"pacing": {"limit": 0}})), INVALID_PACING_LIMIT);
        assert_eq!(bad(json!({"pacing": {"limit": 1.5}})), INVALID_PACING_LIMIT);
        assert_eq!(bad(json!({"pacing": {"windowMs": "1s"}})), INVALID_PACING_WINDOW);
        assert_eq!(bad(json!({"pacing": {"intervalMs": -1}})), INVALID_PACING_INTERVAL);
        assert_eq!(bad(json!({"pacing": "fast"})), INVALID_PACING);
        assert_eq!(bad(json!({"legacyCleanup": "yes"})), INVALID_LEGACY);
        for m in [INVALID_PACING_LIMIT, INVALID_PACING_WINDOW, INVALID_PACING_INTERVAL, INVALID_LEGACY] {
            assert!(m.split(' ').next().unwrap().chars().all(|c| c.is_ascii_alphabetic() || c == '.'), "{m}");
        }
    }

    #[test]
    fn the_same_pem_is_held_once() {
        let a = shared_pem("pem one");
        let b = shared_pem("pem one");
        assert!(std::sync::Arc::ptr_eq(&a, &b));
        let c = shared_pem("pem two");
        assert!(!std::sync::Arc::ptr_eq(&a, &c));
        assert_eq!(&*c, "pem two");
        // Remembered weakly: once the commands that held it are gone, so is the PEM.
        let remembered = std::sync::Arc::downgrade(&c);
        drop((a, b, c));
        assert!(remembered.upgrade().is_none());
        assert_eq!(&*shared_pem("pem two"), "pem two");
    }

    #[test]
    fn proxy_and_ca_fields() {
        let c = parse_config(&json!({"apiUrl": "https://x.io", "proxy": "http://u:p@proxy:3128"})).unwrap();
        assert!(c.net.proxy.is_some());
        let bad = |v: Value| match parse_config(&v) {
            Err(Error::Input(m)) => m,
            _ => panic!("{v}"),
        };
        assert_eq!(bad(json!({"apiUrl": "https://x.io", "proxy": "socks5://p:1"})), net::INVALID_PROXY);
        assert_eq!(bad(json!({"apiUrl": "https://x.io", "proxy": 5})), net::INVALID_PROXY);
        assert_eq!(bad(json!({"apiUrl": "http://127.0.0.1:1", "proxy": "http://p:1"})), net::PROXY_NEEDS_HTTPS);
        assert_eq!(bad(json!({"apiUrl": "https://x.io", "caCertPem": "nope"})), net::INVALID_CA_PEM);
        assert_eq!(bad(json!({"apiUrl": "https://x.io", "caCertPem": 1})), net::INVALID_CA_PEM);
        let c = parse_config(&json!({"apiUrl": "https://x.io", "proxy": null, "caCertPem": null})).unwrap();
        assert!(c.net.proxy.is_none() && c.net.ca_cert_pem.is_none());
    }

    #[test]
    fn pacing_store_and_key() {
        let base = |pacing: Value, env: Option<&str>| {
            let mut c = json!({"apiUrl": "https://x.io", "apiKey": "sekrit-key", "pacing": pacing});
            if let Some(e) = env {
                c["pacingStoreDefault"] = json!(e);
            }
            parse_config(&c)
        };
        let url = "redis://:pw@127.0.0.1:6379/0";
        let c = base(json!({"limit": 20, "windowMs": 2000, "store": url, "key": "nat-1"}), None).unwrap();
        assert_eq!(c.pacing.mode, Some(PacingMode::Window { limit: 20, window: Duration::from_secs(2) }));
        assert_eq!(c.pacing.store, StoreChoice::Redis(url.into()));
        assert_eq!(c.pacing.key.as_deref(), Some("nat-1"));
        assert!(!format!("{:?}", c.pacing).contains("pw"));
        assert_eq!(
            base(json!("window"), Some("rediss://h:1")).unwrap().pacing.store,
            StoreChoice::Redis("rediss://h:1".into())
        );
        assert_eq!(base(json!({"store": false}), Some("redis://h")).unwrap().pacing.store, StoreChoice::Local);
        let c = parse_config(&json!({"apiUrl": "https://x.io", "pacingStoreDefault": url})).unwrap();
        assert_eq!((c.pacing.mode, c.pacing.store), (None, StoreChoice::Redis(url.into())));
        for (bad, msg) in [
            (json!({"store": "http://h"}), INVALID_PACING_STORE),
            (json!({"store": "redis://:pw@"}), INVALID_PACING_STORE),
            (json!({"store": 1}), INVALID_PACING_STORE),
            (json!({"key": ""}), INVALID_PACING_KEY),
            (json!({"key": "a b"}), INVALID_PACING_KEY),
            (json!({"key": "x-sekrit-key"}), INVALID_PACING_KEY),
        ] {
            assert!(matches!(base(bad.clone(), None), Err(Error::Input(m)) if m == msg), "{bad}");
        }
        assert!(matches!(base(json!("window"), Some("memcached://h")), Err(Error::Input(INVALID_PACING_STORE_ENV))));
    }

    #[test]
    fn params_are_checked() {
        let ok = json!({"sandboxId": "sb-1", "command": "echo", "args": ["a"], "env": {"A": "b"}, "stdin": "x"});
        assert_eq!(parse_params(&ok).unwrap().args, vec!["a"]);
        for bad in [
            json!({"sandboxId": "sb/1", "command": "echo"}),
            json!({"command": "echo"}),
            json!({"sandboxId": "sb", "command": ""}),
            json!({"sandboxId": "sb", "command": "echo", "env": {"A-B": "x"}}),
            json!({"sandboxId": "sb", "command": "echo", "env": {"A": 1}}),
            json!({"sandboxId": "sb", "command": "echo", "args": [1]}),
            json!({"sandboxId": "sb", "command": "echo", "cwd": 5}),
            json!({"sandboxId": "sb", "command": "ec\u{0}ho"}),
            json!({"sandboxId": "sb", "command": "echo", "stdin": "a\u{0}"}),
        ] {
            assert!(matches!(parse_params(&bad), Err(Error::Input(_))), "{bad}");
        }
    }
}
