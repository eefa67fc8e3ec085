//! HTTP to the CreateOS API: one `reqwest::Client` per (proxy, trust) configuration and
//! process (rustls, no redirects, Node's proxy and trust rules: `net.rs`), the
//! `X-Api-Key` header, the JSend envelope, typed errors with fixed operation labels, the
//! pacer, and the retry rules.
//!
//! Secrets stay here: the key is a [`SecretString`] sent as a sensitive header; no URL, query,
//! body or provider text is ever put into an error.
//!
//! Retries (bounded: at most [`MAX_RETRIES`], each wait bounded by the caller's context):
//! - 429 on any method, after `Retry-After` (which also pauses the whole origin's pacer);
//! - 503 on any method but process creation (see `Retry::Creation`);
//! - a connection that could not be made (nothing was sent) on any method, creation included;
//! - 502, 504 and failed connections only for GET/PUT/DELETE (idempotent), and never for
//!   streams, whose reconnects `follow.rs` owns.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::header::{HeaderValue, CONTENT_TYPE};
use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::abort::Ctx;
use crate::error::{Error, Operation, Result};
use crate::events::{self, Event, EventSink, RequestEvent};
use crate::net;
use crate::pacer::{self, Pacer, PacingConfig};
use crate::transport::{self, HostFetch, Payload, Response, SendError, Transport};

pub const MAX_RETRIES: u32 = 3;
/// The largest JSON answer read (a process list of many records fits easily).
pub const MAX_JSON_BYTES: usize = 16 * 1024 * 1024;
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

pub const INVALID_JSON: &str = "CreateOS returned invalid JSON.";
pub const UNSUCCESSFUL: &str = "CreateOS returned an unsuccessful response.";
pub const INVALID_RESPONSE: &str = "CreateOS returned an invalid response.";
pub const INVALID_URL: &str =
    "CreateOS API URL must be an HTTPS origin (optionally ending in /v1); HTTP is allowed on loopback only.";
pub const INVALID_KEY: &str = "CreateOS requires an API key in the environment config or CREATEOS_API_KEY.";

/// Which retries a request may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The rules in the module doc.
    Safe,
    /// `POST /processes`: only 429. A 503 could come after the process was created, and a
    /// second creation would wait on the same start gate and run the command twice.
    Creation,
    /// Only 429 (streams: the caller owns reconnects).
    RateLimitOnly,
    /// Only what proves the server never took the request (no connection was made): a
    /// session's `input`, which a 429 or a 5xx answered after applying it would run twice.
    Unsent,
}

pub enum Body {
    Empty,
    Json(Value),
    Bytes(Bytes),
}

/// How a client reaches the API: an explicit proxy and extra trusted roots (the process's
/// environment adds its own, see `net.rs`).
#[derive(Debug, Clone, Default)]
pub struct NetOptions {
    pub proxy: Option<net::ProxyUrl>,
    pub ca_cert_pem: Option<Arc<str>>,
}

/// Checks an API URL and returns its origin (`scheme://host[:port]`): HTTPS, or HTTP on
/// loopback; no credentials, query or fragment; path empty, `/`, `/v1` or `/v1/`.
pub fn api_origin(api_url: &str) -> Result<String> {
    let url = url::Url::parse(api_url.trim()).map_err(|_| Error::Input(INVALID_URL))?;
    let host = url.host_str().unwrap_or("");
    let loopback = matches!(host, "localhost" | "127.0.0.1" | "[::1]" | "::1");
    let scheme_ok = url.scheme() == "https" || (url.scheme() == "http" && loopback);
    if !scheme_ok
        || host.is_empty()
        || !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
        || !matches!(url.path(), "" | "/" | "/v1" | "/v1/")
    {
        return Err(Error::Input(INVALID_URL));
    }
    Ok(url.origin().ascii_serialization())
}

/// A sandbox or process id: `^[A-Za-z0-9_-]{1,200}$`.
pub fn is_identifier(s: &str) -> bool {
    !s.is_empty() && s.len() <= 200 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

pub struct Client {
    transport: Transport,
    base: String,
    key: SecretString,
    pacer: Arc<Pacer>,
    request_timeout: Duration,
    events: Option<EventSink>,
}

impl Client {
    pub fn new(
        api_url: &str,
        api_key: &str,
        request_timeout: Duration,
        pacing: &PacingConfig,
        net_opts: &NetOptions,
    ) -> Result<Self> {
        let origin = api_origin(api_url)?;
        if api_key.trim().is_empty() || !transport::key_is_sendable(api_key) {
            return Err(Error::Input(INVALID_KEY));
        }
        let target = url::Url::parse(&origin).map_err(|_| Error::Input(INVALID_URL))?;
        let proxy = net::choose_proxy(net_opts.proxy.as_ref(), net::NetEnv::process(), &target)?;
        Ok(Client {
            transport: Transport::Native(net::http_client(
                proxy.as_ref(),
                net_opts.ca_cert_pem.as_deref(),
                net::pool_idle_for(&target.origin().ascii_serialization()),
            )?),
            pacer: pacer::for_budget(&origin, pacing),
            base: format!("{origin}/v1"),
            key: SecretString::from(api_key.to_owned()),
            request_timeout,
            events: None,
        })
    }

    /// The client with an event sink (see `events.rs`); `None` = no events.
    #[must_use]
    pub fn with_events(mut self, events: Option<EventSink>) -> Self {
        self.events = events;
        self
    }

    /// The client over the host's `fetch` (see `transport.rs`); `None` keeps the native one.
    #[must_use]
    pub fn with_host_fetch(mut self, host: Option<Arc<dyn HostFetch>>) -> Self {
        if let (Some(h), Transport::Native(native)) = (host, &self.transport) {
            self.transport = Transport::Host(h, native.clone());
        }
        self
    }

    pub fn events(&self) -> Option<&EventSink> {
        self.events.as_ref()
    }

    /// Reports one attempt to the sink, when there is one: `answer` is the status that came
    /// back or the error; `timing` is (when pacing began, when the request was handed over).
    fn observe(
        &self,
        op: Operation,
        method: &Method,
        attempt: u32,
        timing: (Option<Instant>, Instant),
        answer: std::result::Result<u16, &Error>,
    ) {
        let (paced, sent) = timing;
        let pacing_wait = paced.map_or(Duration::ZERO, |p| sent.saturating_duration_since(p));
        self.observe_timed(op, method, attempt, pacing_wait, sent.elapsed(), answer);
    }

    /// [`Client::observe`] with the two durations given.
    fn observe_timed(
        &self,
        op: Operation,
        method: &Method,
        attempt: u32,
        pacing_wait: Duration,
        duration: Duration,
        answer: std::result::Result<u16, &Error>,
    ) {
        let Some(sink) = &self.events else { return };
        let (status, outcome) = match answer {
            Ok(status) => (Some(status), "ok"),
            Err(Error::Api { status, .. }) => (Some(*status), "http error"),
            Err(Error::Connection { .. }) => (None, "no response"),
            Err(Error::Redirect { .. }) => (None, "redirect refused"),
            Err(Error::Unmatched { .. }) => (None, "no mock answered"),
            Err(Error::UntrustedCertificate { .. }) => (None, "untrusted certificate"),
            Err(Error::ProxyRefused { .. }) => (None, "proxy refused"),
            Err(Error::ProxyUnreachable { .. }) => (None, "proxy unreachable"),
            Err(Error::Cancelled | Error::TimedOut) => (None, "aborted"),
            Err(_) => (None, "failed"),
        };
        let event = RequestEvent {
            operation: op.label(),
            method: method_label(method),
            status,
            outcome,
            attempt,
            duration_ms: events::millis(duration),
            pacing_wait_ms: events::millis(pacing_wait),
        };
        sink(Event::Request(&event));
    }

    pub fn pacer(&self) -> &Arc<Pacer> {
        &self.pacer
    }

    fn key_header(&self) -> Result<HeaderValue> {
        let mut v = HeaderValue::from_str(self.key.expose_secret()).map_err(|_| Error::Input(INVALID_KEY))?;
        v.set_sensitive(true);
        Ok(v)
    }

    /// Sends one request (already paced) over the transport and maps the status. `timeout`
    /// bounds the arrival of the answer's head; `None` = only the context bounds it.
    async fn transmit(
        &self,
        op: Operation,
        method: &Method,
        path: &str,
        body: &Body,
        ctx: &Ctx,
        timeout: Option<Duration>,
    ) -> Result<Response> {
        let payload = match body {
            Body::Empty => Payload::Empty,
            Body::Json(v) => Payload::Json(
                serde_json::to_vec(v).map_err(|_| Error::Internal("a request body could not be encoded"))?.into(),
            ),
            Body::Bytes(b) => Payload::Octets(b.clone()),
        };
        let req =
            transport::Request { method, url: format!("{}{}", self.base, path), key: &self.key, payload, timeout };
        let send = async { self.transport.send(req).await.map_err(|e| send_error(e, op)) };
        let resp = match timeout {
            Some(t) => {
                ctx.run(async {
                    tokio::time::timeout(t, send).await.unwrap_or(Err(Error::Connection { op, maybe_sent: true }))
                })
                .await?
            }
            None => ctx.run(send).await?,
        };
        self.answer(resp, op).await
    }

    /// Maps an answer's status: a 2xx is the response; a redirect is refused; a 429 pauses
    /// the origin's pacer for its `Retry-After` before it is returned as the API error.
    async fn answer(&self, resp: Response, op: Operation) -> Result<Response> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        if status.is_redirection() {
            return Err(Error::Redirect { op });
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            let wait = retry_after(&resp).unwrap_or(DEFAULT_RETRY_AFTER).min(MAX_RETRY_AFTER);
            // Before the retry reserves: in a shared store the pause holds every process.
            self.pacer.pause(wait).await;
        }
        Err(Error::Api { status: status.as_u16(), op })
    }

    /// `POST /sandboxes/{id}/processes`, with what its failure means (see [`Creation`]): a
    /// failed creation may have reached the server (then a process may exist) once the
    /// request was handed to the connection, unless the answer proves it was refused (4xx) or
    /// the connection was never made.
    ///
    /// The caller's abort is honoured while the request waits for the pacer (nothing was
    /// sent). Once it is on the wire, the answer is still awaited after the abort, for at most
    /// `answer_after_abort` (the cleanup's share of its deadline: the cleanup begins at the
    /// abort), so the process it created is known and can be terminated rather than looked for
    /// in a list that may not show it yet. The command cannot start meanwhile: it waits on its
    /// start gate.
    pub async fn create_process(
        &self,
        sandbox_id: &str,
        body: Value,
        ctx: &Ctx,
        answer_after_abort: Duration,
    ) -> Creation {
        let path = format!("/sandboxes/{sandbox_id}/processes");
        let op = Operation::ProcessCreation;
        let body = Body::Json(body);
        let mut attempt = 0;
        loop {
            let paced = self.events.as_ref().map(|_| Instant::now());
            if let Err(e) = self.pacer.acquire(ctx).await {
                return Creation { result: Err(e), maybe_created: false, unanswered: false };
            }
            let started = Instant::now();
            let in_flight = Ctx::cleanup(self.request_timeout + Duration::from_secs(1));
            let request = async {
                let sent = self.transmit(op, &Method::POST, &path, &body, &in_flight, None);
                match tokio::time::timeout(self.request_timeout, sent).await {
                    Err(_) => (Err(Error::Connection { op, maybe_sent: true }), false),
                    Ok(Err(e)) => {
                        // The connection ended before any answer came (not our deadline).
                        let unanswered = matches!(e, Error::Connection { maybe_sent: true, .. });
                        (Err(e), unanswered)
                    }
                    Ok(Ok(resp)) => {
                        let left = self.request_timeout.saturating_sub(started.elapsed());
                        (read_envelope(resp, op, &in_flight, left).await, false)
                    }
                }
            };
            let abandoned = async {
                ctx.abort.aborted().await;
                tokio::time::sleep(answer_after_abort).await;
            };
            let (result, unanswered) = tokio::select! {
                biased;
                r = request => r,
                () = abandoned => (Err(Error::TimedOut), false),
            };
            self.observe(op, &Method::POST, attempt + 1, (paced, started), result.as_ref().map(|_| 201));
            let maybe_created = match &result {
                Ok(_) => return Creation { result, maybe_created: true, unanswered: false },
                Err(Error::Api { status, .. }) => *status >= 500,
                Err(Error::Connection { maybe_sent, .. }) => *maybe_sent,
                Err(
                    Error::Redirect { .. }
                    | Error::Unmatched { .. }
                    | Error::Input(_)
                    | Error::Internal(_)
                    | Error::UntrustedCertificate { .. }
                    | Error::ProxyRefused { .. }
                    | Error::ProxyUnreachable { .. },
                ) => false,
                Err(_) => true, // an abort in flight, or a 2xx whose body broke
            };
            attempt += 1;
            let err = result.expect_err("handled above");
            if attempt > MAX_RETRIES || !retryable(&err, &Method::POST, Retry::Creation) {
                return Creation { result: Err(err), maybe_created, unanswered };
            }
            // 429 waits in the pacer; a connection that could not be made backs off briefly.
            if !matches!(err, Error::Api { status: 429, .. })
                && ctx.sleep(Duration::from_millis(200 * u64::from(attempt))).await.is_err()
            {
                return Creation { result: Err(err), maybe_created: false, unanswered: false };
            }
        }
    }

    /// Sends with the retry rules; returns a 2xx response.
    #[allow(clippy::too_many_arguments)]
    pub async fn send(
        &self,
        op: Operation,
        method: Method,
        path: &str,
        body: Body,
        ctx: &Ctx,
        retry: Retry,
        timeout: Option<Duration>,
    ) -> Result<Response> {
        self.send_tracked(op, method, path, body, ctx, retry, timeout, 0, &mut || {}).await.0
    }

    /// [`Client::send`], and whether a failed request may still have been applied: true when
    /// some attempt left without an answer that proves it was not (a lost connection after
    /// sending, a deadline or abort while on the wire, any 5xx). A 4xx, a refused connection
    /// or an untrusted certificate prove nothing was applied. `attempts_done` attempts of the same request were already made (they
    /// count against [`MAX_RETRIES`]); `on_send` is called each time an attempt, past the
    /// pacer, is handed to the connection.
    #[allow(clippy::too_many_arguments)]
    async fn send_tracked(
        &self,
        op: Operation,
        method: Method,
        path: &str,
        body: Body,
        ctx: &Ctx,
        retry: Retry,
        timeout: Option<Duration>,
        attempts_done: u32,
        on_send: &mut (dyn FnMut() + Send),
    ) -> (Result<Response>, bool) {
        let mut attempt = attempts_done;
        let mut maybe_applied = false;
        loop {
            let paced = self.events.as_ref().map(|_| Instant::now());
            if let Err(e) = self.pacer.acquire(ctx).await {
                return (Err(e), maybe_applied);
            }
            let sent = Instant::now();
            on_send();
            let result = self.transmit(op, &method, path, &body, ctx, timeout).await;
            self.observe(op, &method, attempt + 1, (paced, sent), result.as_ref().map(|r| r.status().as_u16()));
            let err = match result {
                Ok(r) => return (Ok(r), true),
                Err(e) => e,
            };
            maybe_applied |= may_have_applied(&err);
            attempt += 1;
            if attempt > MAX_RETRIES || !retryable(&err, &method, retry) {
                return (Err(err), maybe_applied);
            }
            // 429 waits in the pacer (paused until Retry-After); others back off briefly.
            if !matches!(err, Error::Api { status: 429, .. }) {
                if let Err(e) = ctx.sleep(Duration::from_millis(200 * u64::from(attempt))).await {
                    return (Err(e), maybe_applied);
                }
            }
        }
    }

    /// A JSON request; returns the JSend `data` object.
    pub async fn json(
        &self,
        op: Operation,
        method: Method,
        path: &str,
        body: Option<Value>,
        ctx: &Ctx,
    ) -> Result<Map<String, Value>> {
        self.json_with(op, method, path, body, ctx, Retry::Safe, self.request_timeout).await
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn json_with(
        &self,
        op: Operation,
        method: Method,
        path: &str,
        body: Option<Value>,
        ctx: &Ctx,
        retry: Retry,
        timeout: Duration,
    ) -> Result<Map<String, Value>> {
        let started = Instant::now();
        let body = body.map_or(Body::Empty, Body::Json);
        let resp = self.send(op, method, path, body, ctx, retry, Some(timeout)).await?;
        read_envelope(resp, op, ctx, timeout.saturating_sub(started.elapsed())).await
    }

    /// Opens a stream (NDJSON); no total timeout, the reader applies an idle timeout.
    /// `on_send` is called when the request (past the pacer) is handed to the connection.
    pub async fn open_stream(
        &self,
        op: Operation,
        method: Method,
        path: &str,
        body: Body,
        ctx: &Ctx,
        on_send: &mut (dyn FnMut() + Send),
    ) -> Result<Response> {
        let timeout = Some(self.request_timeout);
        self.send_tracked(op, method, path, body, ctx, Retry::RateLimitOnly, timeout, 0, on_send).await.0
    }

    /// Uploads `bytes` to `path` inside the sandbox (PUT /files).
    pub async fn put_file(&self, sandbox_id: &str, path: &str, bytes: Bytes, ctx: &Ctx) -> Result<()> {
        self.put_file_after(sandbox_id, path, bytes, ctx, 0).await.0
    }

    /// [`Client::put_file`] after `attempts_done` attempts of the same upload (a held one:
    /// [`Client::put_file_held`]), and whether a failed upload may still have been written
    /// (see [`Client::send_tracked`]).
    pub async fn put_file_after(
        &self,
        sandbox_id: &str,
        path: &str,
        bytes: Bytes,
        ctx: &Ctx,
        attempts_done: u32,
    ) -> (Result<()>, bool) {
        let query: String = url::form_urlencoded::Serializer::new(String::new()).append_pair("path", path).finish();
        let (resp, maybe_applied) = self
            .send_tracked(
                Operation::FileTransfer,
                Method::PUT,
                &format!("/sandboxes/{sandbox_id}/files?{query}"),
                Body::Bytes(bytes),
                ctx,
                Retry::Safe,
                Some(self.request_timeout),
                attempts_done,
                &mut || {},
            )
            .await;
        (resp.map(drop), maybe_applied)
    }

    /// Uploads `content` to `path` in two steps: the request (paced, head and connection)
    /// goes out now, its content only when `release` fires. So a connection is opened, or
    /// taken from the pool, ahead of the moment the content must arrive, and the upload then
    /// costs half a round trip. Dropping `release` (or this future) abandons the upload
    /// before any content was sent: a server that writes uploads as they stream keeps at most
    /// an empty file. One attempt, no retries (the body cannot be replayed): the caller
    /// falls back to [`Client::put_file_after`]. Only the pacer wait and the caller's abort
    /// bound this future; the caller bounds the wait for the answer once it released.
    pub async fn put_file_held(
        &self,
        sandbox_id: &str,
        path: &str,
        content: Bytes,
        release: tokio::sync::oneshot::Receiver<()>,
        ctx: &Ctx,
    ) -> HeldUpload {
        let op = Operation::FileTransfer;
        let query: String = url::form_urlencoded::Serializer::new(String::new()).append_pair("path", path).finish();
        let url = format!("{}/sandboxes/{sandbox_id}/files?{query}", self.base);
        let paced = self.events.as_ref().map(|_| Instant::now());
        if self.pacer.acquire(ctx).await.is_err() {
            return HeldUpload::Unsent { attempted: false };
        }
        let http = match &self.transport {
            Transport::Native(http) => http,
            Transport::Host(host, http) if !host.usable() => http,
            // The host's fetch takes a complete body: the request goes out at the release.
            Transport::Host(..) => return self.put_file_released(url, content, release, ctx, paced).await,
        };
        let Ok(key) = self.key_header() else { return HeldUpload::Unsent { attempted: false } };
        let sent = Arc::new(std::sync::OnceLock::new());
        let body = HeldBody { len: content.len() as u64, content: Some(content), release, sent: Arc::clone(&sent) };
        // Its lane's slot is held until the upload ended (this function's end).
        let (http, slot) = http.lane(&url);
        if let Some(s) = &slot {
            drop(s.first(false).await);
        }
        let req = http
            .request(Method::PUT, url)
            .header("X-Api-Key", key)
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(reqwest::Body::wrap(body));
        let started = Instant::now();
        let result = ctx
            .run(async {
                let resp = req.send().await.map_err(|e| send_error(transport::native_send_error(&e), op))?;
                if let Some(s) = &slot {
                    s.answered();
                }
                self.answer(Response::native(resp), op).await.map(drop)
            })
            .await;
        // The duration counts from the release (the request was complete then), or, for an
        // upload that ended unsent, from when it was handed over.
        let pacing_wait = paced.map_or(Duration::ZERO, |p| started.saturating_duration_since(p));
        let duration = sent.get().copied().unwrap_or(started).elapsed();
        self.observe_timed(op, &Method::PUT, 1, pacing_wait, duration, result.as_ref().map(|()| 200));
        if sent.get().is_none() {
            return HeldUpload::Unsent { attempted: true };
        }
        let maybe_written = result.as_ref().err().is_none_or(may_have_applied);
        HeldUpload::Sent(result, maybe_written)
    }

    /// [`Client::put_file_held`] over the host's `fetch`: waits (already paced) for the
    /// release, then sends the whole upload. Never released = never sent.
    async fn put_file_released(
        &self,
        url: String,
        content: Bytes,
        release: tokio::sync::oneshot::Receiver<()>,
        ctx: &Ctx,
        paced: Option<Instant>,
    ) -> HeldUpload {
        let op = Operation::FileTransfer;
        let started = Instant::now();
        let released = tokio::select! {
            biased;
            () = ctx.abort.aborted() => false,
            r = release => r.is_ok(),
        };
        if !released {
            return HeldUpload::Unsent { attempted: false };
        }
        let sent = Instant::now();
        let req = transport::Request {
            method: &Method::PUT,
            url,
            key: &self.key,
            payload: Payload::Octets(content),
            timeout: Some(self.request_timeout),
        };
        let result = ctx
            .run(async {
                let resp = self.transport.send(req).await.map_err(|e| send_error(e, op))?;
                self.answer(resp, op).await.map(drop)
            })
            .await;
        let pacing_wait = paced.map_or(Duration::ZERO, |p| started.saturating_duration_since(p));
        self.observe_timed(op, &Method::PUT, 1, pacing_wait, sent.elapsed(), result.as_ref().map(|()| 200));
        let maybe_written = result.as_ref().err().is_none_or(may_have_applied);
        HeldUpload::Sent(result, maybe_written)
    }
}

/// What a `POST /processes` gave ([`Client::create_process`]).
#[derive(Debug)]
pub struct Creation {
    pub result: Result<Map<String, Value>>,
    /// A failed creation may have reached the server: a process may exist.
    pub maybe_created: bool,
    /// The connection ended after the request was sent and before any answer came (neither
    /// a status nor our deadline): a pooled connection the server closed as it was reused
    /// looks like this. Only a conclusive process list can say whether it created anything.
    pub unanswered: bool,
}

/// How a held upload ([`Client::put_file_held`]) ended.
#[derive(Debug)]
pub enum HeldUpload {
    /// It ended before its content was released (an early answer, a lost connection, an
    /// abort): the content was never sent, so nothing can have been written. `attempted`:
    /// the request went out (it counts against the retry budget of the upload that follows).
    Unsent { attempted: bool },
    /// The content was sent: the answer, and whether a failed upload may have been written.
    Sent(Result<()>, bool),
}

/// The body of a held upload: nothing until `release` fires, then its content, then the end.
/// Its exact size is known up front, so the request head carries `Content-Length` and the
/// server does not consider the upload complete before the content arrives.
struct HeldBody {
    content: Option<Bytes>,
    release: tokio::sync::oneshot::Receiver<()>,
    /// When the content was released (set once).
    sent: Arc<std::sync::OnceLock<Instant>>,
    len: u64,
}

impl http_body::Body for HeldBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::result::Result<http_body::Frame<Bytes>, std::io::Error>>> {
        use std::task::Poll;
        if self.content.is_none() {
            return Poll::Ready(None);
        }
        match std::pin::Pin::new(&mut self.release).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => {
                let _ = self.sent.set(Instant::now());
                Poll::Ready(self.content.take().map(|b| Ok(http_body::Frame::data(b))))
            }
            // Never released: the upload is abandoned without its content.
            Poll::Ready(Err(_)) => Poll::Ready(Some(Err(std::io::Error::other("upload abandoned")))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.content.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.len)
    }
}

/// Whether a failed upload may be sent again (the retry rules of the module doc, for PUT).
pub fn upload_retryable(err: &Error) -> bool {
    retryable(err, &Method::PUT, Retry::Safe)
}

/// Whether a request that failed with `err` may still have been applied. Not when the answer
/// refused it (a 4xx), a redirect was refused, the certificate did not verify, or nothing was
/// sent. Any 5xx may have come after the request was applied (a server that wrote an upload
/// and then failed, a gateway that lost the answer), as a lost connection or a deadline after
/// the request left may: the same rule as for a process creation.
/// Whether a failed request provably never reached a handler that could apply it: no
/// connection was made, a proxy or a certificate stopped it, a redirect was refused (the answer
/// was the redirect), or our own checks refused it. A 4xx is not counted: a server may answer
/// 429 (or another refusal) after it applied a request.
pub fn never_applied(err: &Error) -> bool {
    matches!(
        err,
        Error::Connection { maybe_sent: false, .. }
            | Error::Redirect { .. }
            | Error::ProxyRefused { .. }
            | Error::ProxyUnreachable { .. }
            | Error::UntrustedCertificate { .. }
            | Error::Unmatched { .. }
            | Error::Input(_)
    )
}

fn may_have_applied(err: &Error) -> bool {
    match err {
        Error::Api { status, .. } => *status >= 500,
        Error::Connection { maybe_sent, .. } => *maybe_sent,
        Error::UntrustedCertificate { .. }
        | Error::ProxyRefused { .. }
        | Error::ProxyUnreachable { .. }
        | Error::Redirect { .. }
        | Error::Unmatched { .. }
        | Error::Input(_)
        | Error::Internal(_) => false,
        _ => true,
    }
}

/// A failed send as the error of `op`: a proxy that refused the tunnel or could not be
/// reached, an untrusted certificate (nothing was sent in either case), a refused redirect,
/// or a lost connection. The same for both transports.
fn send_error(e: SendError, op: Operation) -> Error {
    match e {
        SendError::ProxyRefused(status) => Error::ProxyRefused { op, status },
        SendError::ProxyUnreachable => Error::ProxyUnreachable { op },
        SendError::Untrusted => Error::UntrustedCertificate { op },
        SendError::Redirect => Error::Redirect { op },
        SendError::BadKey => Error::Input(INVALID_KEY),
        SendError::Unmatched => Error::Unmatched { op },
        SendError::NotSent => Error::Connection { op, maybe_sent: false },
        SendError::Lost => Error::Connection { op, maybe_sent: true },
    }
}

/// The method as a fixed word: for diagnostics events, and for the host's `fetch` (which is
/// only ever given the methods named here).
pub(crate) fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::PATCH => "PATCH",
        _ => "OTHER",
    }
}

fn retryable(err: &Error, method: &Method, retry: Retry) -> bool {
    let idempotent = matches!(*method, Method::GET | Method::PUT | Method::DELETE | Method::HEAD);
    match (err, retry) {
        // Provably never received (no connection was made): safe for a creation too.
        (Error::Connection { maybe_sent: false, .. } | Error::ProxyUnreachable { .. }, Retry::Unsent) => true,
        (_, Retry::Unsent) => false,
        (Error::Api { status: 429, .. }, _) => true,
        (_, Retry::RateLimitOnly) => false,
        (Error::Connection { maybe_sent: false, .. } | Error::ProxyUnreachable { .. }, Retry::Creation) => true,
        (Error::Api { status: 503, .. }, Retry::Safe) => true,
        (Error::Api { status: 502 | 504, .. }, Retry::Safe) => idempotent,
        (Error::Connection { maybe_sent: false, .. } | Error::ProxyUnreachable { .. }, Retry::Safe) => true,
        (Error::Connection { maybe_sent: true, .. }, Retry::Safe) => idempotent,
        _ => false,
    }
}

/// `Retry-After` as delta-seconds or an HTTP date, clamped to [`MAX_RETRY_AFTER`].
///
/// Server-supplied, so never trusted: a number too large for `u64`, a date `httpdate`
/// rejects (a year beyond 9999, day 00, a malformed field) or a date in the past all give a
/// bounded answer without any unchecked arithmetic (`None` = use the default).
pub fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        // All digits: delta-seconds; more digits than fit in u64 is "very long" = the cap.
        let secs = v.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER));
    }
    let when = httpdate::parse_http_date(v).ok()?;
    Some(when.duration_since(std::time::SystemTime::now()).unwrap_or(Duration::ZERO).min(MAX_RETRY_AFTER))
}

fn retry_after(resp: &Response) -> Option<Duration> {
    parse_retry_after(resp.header("retry-after")?)
}

/// Reads a JSON answer (bounded in size and time) and returns its JSend `data`.
async fn read_envelope(resp: Response, op: Operation, ctx: &Ctx, left: Duration) -> Result<Map<String, Value>> {
    let left = left.max(Duration::from_millis(1));
    let bytes = ctx
        .run(async {
            tokio::time::timeout(left, read_limited(resp, MAX_JSON_BYTES, op))
                .await
                .unwrap_or(Err(Error::Connection { op, maybe_sent: true }))
        })
        .await?;
    envelope_data(&bytes)
}

async fn read_limited(resp: Response, limit: usize, op: Operation) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut body = resp.into_body();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|_| Error::Connection { op, maybe_sent: true })?;
        if out.len() + chunk.len() > limit {
            return Err(Error::Protocol(INVALID_RESPONSE));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The `data` object of a JSend success envelope.
pub fn envelope_data(bytes: &[u8]) -> Result<Map<String, Value>> {
    let v: Value = serde_json::from_slice(bytes).map_err(|_| Error::Protocol(INVALID_JSON))?;
    let Value::Object(mut env) = v else { return Err(Error::Protocol(INVALID_JSON)) };
    if env.get("status").and_then(Value::as_str) != Some("success") {
        return Err(Error::Protocol(UNSUCCESSFUL));
    }
    match env.remove("data") {
        Some(Value::Object(data)) => Ok(data),
        _ => Err(Error::Protocol(INVALID_RESPONSE)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_urls() {
        assert_eq!(api_origin("https://api.sb.createos.sh").unwrap(), "https://api.sb.createos.sh");
        assert_eq!(api_origin("https://api.sb.createos.sh/v1/").unwrap(), "https://api.sb.createos.sh");
        assert_eq!(api_origin("http://127.0.0.1:8080").unwrap(), "http://127.0.0.1:8080");
        assert_eq!(api_origin("http://localhost:1/v1").unwrap(), "http://localhost:1");
        assert_eq!(api_origin("http://[::1]:9").unwrap(), "http://[::1]:9");
        for bad in [
            "http://example.com",
            "ftp://x",
            "https://u:p@x.com",
            "https://x.com/?k=1",
            "https://x.com/#f",
            "https://x.com/api",
            "nope",
            "",
        ] {
            assert!(matches!(api_origin(bad), Err(Error::Input(INVALID_URL))), "{bad}");
        }
    }

    #[test]
    fn identifiers() {
        assert!(is_identifier("sb-01H_x"));
        assert!(!is_identifier(""));
        assert!(!is_identifier("a/b"));
        assert!(!is_identifier(&"a".repeat(201)));
        assert!(is_identifier(&"a".repeat(200)));
    }

    #[test]
    fn envelopes() {
        assert_eq!(envelope_data(br#"{"status":"success","data":{"a":1}}"#).unwrap()["a"], 1);
        assert!(matches!(envelope_data(b"nope"), Err(Error::Protocol(INVALID_JSON))));
        assert!(matches!(envelope_data(br#"{"status":"fail","data":{}}"#), Err(Error::Protocol(UNSUCCESSFUL))));
        assert!(matches!(envelope_data(br#"{"status":"success","data":[1]}"#), Err(Error::Protocol(INVALID_RESPONSE))));
    }

    #[test]
    fn retry_rules() {
        let api = |status| Error::Api { status, op: Operation::ProcessCreation };
        assert!(retryable(&api(429), &Method::POST, Retry::Creation));
        assert!(!retryable(&api(503), &Method::POST, Retry::Creation));
        assert!(retryable(&api(503), &Method::POST, Retry::Safe));
        assert!(!retryable(&api(502), &Method::POST, Retry::Safe));
        assert!(retryable(&api(502), &Method::DELETE, Retry::Safe));
        assert!(!retryable(&api(500), &Method::GET, Retry::Safe));
        assert!(!retryable(&api(404), &Method::GET, Retry::Safe));
        assert!(!retryable(&api(503), &Method::GET, Retry::RateLimitOnly));
        let conn = |maybe_sent| Error::Connection { op: Operation::ProcessCreation, maybe_sent };
        assert!(!retryable(&conn(true), &Method::POST, Retry::Creation));
        assert!(retryable(&conn(false), &Method::POST, Retry::Creation), "nothing was sent");
        assert!(!retryable(&conn(false), &Method::GET, Retry::RateLimitOnly));
        assert!(retryable(&conn(true), &Method::GET, Retry::Safe));
    }

    #[test]
    fn retry_after_is_bounded_whatever_the_server_sends() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("99999999999999999999999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT"), Some(MAX_RETRY_AFTER));
        for bad in [
            "Sun, 06 Nov 400000000000 08:49:37 GMT",
            "Sun, 00 Nov 1994 08:49:37 GMT",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 25:49:37 GMT",
            "Sun, 06 Nov 1969 08:49:37 GMT",
            "-5",
            "1.5",
            "soon",
            "",
        ] {
            assert_eq!(parse_retry_after(bad), None, "{bad}");
        }
    }
}
