//! The seam under `client.rs`: one HTTP exchange (a request; the answer's head; its body as
//! a stream; abort by dropping; a per-request deadline), over one of two transports.
//!
//! - [`Transport::Native`]: the process's reqwest client (`net.rs`: Node's proxy and trust
//!   rules, no redirects, HTTP/2). The default.
//! - [`Transport::Host`]: a [`HostFetch`], which the addon's glue implements over the host's
//!   `globalThis.fetch` (the core knows nothing of JS). Used when the host replaced `fetch` or
//!   installed its own dispatcher, so its interception, proxy, certificates and tracing apply.
//!
//! Everything above the seam (pacing, retries, the proof, cleanup, events, the rule that no
//! secret reaches a message) is the same for both: `client.rs` sees a [`Response`] and a
//! [`SendError`] whichever transport carried the request.
//!
//! Abort is a drop: dropping the future of [`Transport::send`] before the head arrived, or a
//! [`Response`] or [`BodyStream`] before the body ended, cancels the exchange (reqwest closes
//! or resets the stream; the host bridge aborts the request's `AbortController`, which
//! cancels the body the host's stream is producing). Deadlines are the caller's timeouts
//! around these futures; the host request also carries the deadline, as a backstop.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

pub use bytes::Bytes;
use futures_util::Stream;
use reqwest::header::{HeaderValue, CONTENT_TYPE};
use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};

use crate::net;

/// Why a request got no answer. Fixed facts only: no URL, no body, no text from the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// No connection was made: nothing was sent.
    NotSent,
    /// The connection broke (or an abort/deadline hit) after the request may have left.
    Lost,
    /// The answer was a redirect, refused (`redirect: 'error'` on the host's side).
    Redirect,
    /// The server's certificate did not verify (nothing was sent).
    Untrusted,
    /// A proxy refused the tunnel (`Some(status)` when it is known).
    ProxyRefused(Option<u16>),
    /// The proxy could not be reached.
    ProxyUnreachable,
    /// The key cannot be sent as a header value.
    BadKey,
    /// The host's fetch is an interception library's (undici `MockAgent`, nock, msw) and it
    /// said that no mock matched the request: nothing was sent.
    Unmatched,
}

/// Whether an API key can be a header value by the rules Node's `Headers` (and undici under
/// it) applies: every character a tab, a visible ASCII character, a space, or one of
/// U+0080..=U+00FF (a byte). Both transports refuse the others the same way, before anything
/// is sent (natively the HTTP stack would refuse a control character or DEL too).
pub fn key_is_sendable(key: &str) -> bool {
    key.chars().all(|c| matches!(c, '\t' | ' '..='~' | '\u{80}'..='\u{ff}'))
}

/// A request body, as the TypeScript module sent it: JSON as text, uploads as their content.
pub enum Payload {
    Empty,
    /// Serialized JSON (`Content-Type: application/json`).
    Json(Bytes),
    /// An upload (`Content-Type: application/octet-stream`).
    Octets(Bytes),
}

/// One request: method, the full URL, the key (sent as `X-Api-Key`) and the body.
pub struct Request<'a> {
    pub method: &'a Method,
    pub url: String,
    pub key: &'a SecretString,
    pub payload: Payload,
    /// When the answer's head must have arrived (the caller also enforces it).
    pub timeout: Option<Duration>,
}

/// The request as the host's `fetch` gets it. It holds the key and a URL with its query:
/// it never formats.
pub struct HostRequest {
    pub method: &'static str,
    /// `<origin>/v1<path>`, a string, as the TypeScript module built it.
    pub url: String,
    /// In the TypeScript module's order: `Content-Type` (when there is a body), `X-Api-Key`.
    pub headers: Vec<(&'static str, String)>,
    pub body: HostBody,
    pub timeout: Option<Duration>,
}

impl std::fmt::Debug for HostRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostRequest(<redacted>)")
    }
}

/// A host request's body: JSON and uploads of text as strings (as the TypeScript module sent
/// them), any other upload as bytes.
pub enum HostBody {
    None,
    Text(String),
    Bytes(Bytes),
}

/// A body chunk stream the host bridge produces; `Err` = the body broke.
pub type HostStream = Pin<Box<dyn Stream<Item = Result<Bytes, BodyBroken>> + Send>>;

/// The host's answer: status, headers (lowercase names) and the body.
pub struct HostResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: HostStream,
}

/// The host's `fetch`, as the addon bridges it. Dropping the returned future aborts the
/// request; dropping the body stream cancels the body.
pub trait HostFetch: Send + Sync {
    fn fetch(&self, request: HostRequest) -> Pin<Box<dyn Future<Output = Result<HostResponse, SendError>> + Send>>;

    /// False once the host can no longer run a request (its JS environment is going away):
    /// the requests still to be sent, a cleanup's DELETE above all, then go natively.
    fn usable(&self) -> bool {
        true
    }
}

/// The body broke before its end (a lost connection, a stream error on the host's side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyBroken;

/// How a client sends its requests.
#[derive(Clone)]
pub enum Transport {
    Native(net::Http),
    /// The host's fetch, and the native client for when the host is no longer usable.
    Host(Arc<dyn HostFetch>, net::Http),
}

impl Transport {
    pub fn is_host(&self) -> bool {
        matches!(self, Transport::Host(..))
    }

    /// Sends a request; resolves with the answer's head (any status).
    pub async fn send(&self, req: Request<'_>) -> Result<Response, SendError> {
        match self {
            Transport::Native(http) => send_native(http, req).await,
            Transport::Host(host, fallback) if !host.usable() => send_native(fallback, req).await,
            Transport::Host(host, _) => {
                let r = host.fetch(host_request(req)?).await?;
                let status = StatusCode::from_u16(r.status).map_err(|_| SendError::Lost)?;
                Ok(Response { status, inner: Inner::Host { headers: r.headers, body: r.body }, slot: None })
            }
        }
    }
}

fn host_request(req: Request<'_>) -> Result<HostRequest, SendError> {
    let key = req.key.expose_secret();
    if !key_is_sendable(key) {
        return Err(SendError::BadKey);
    }
    let mut headers = Vec::with_capacity(2);
    let body = match req.payload {
        Payload::Empty => HostBody::None,
        Payload::Json(b) => {
            headers.push(("Content-Type", "application/json".to_owned()));
            text_or_bytes(b)
        }
        Payload::Octets(b) => {
            headers.push(("Content-Type", "application/octet-stream".to_owned()));
            text_or_bytes(b)
        }
    };
    headers.push(("X-Api-Key", key.to_owned()));
    Ok(HostRequest {
        method: crate::client::method_label(req.method),
        url: req.url,
        headers,
        body,
        timeout: req.timeout,
    })
}

fn text_or_bytes(b: Bytes) -> HostBody {
    match String::from_utf8(b.to_vec()) {
        Ok(s) => HostBody::Text(s),
        Err(_) => HostBody::Bytes(b),
    }
}

async fn send_native(http: &net::Http, req: Request<'_>) -> Result<Response, SendError> {
    if !key_is_sendable(req.key.expose_secret()) {
        return Err(SendError::BadKey);
    }
    let mut key = HeaderValue::from_str(req.key.expose_secret()).map_err(|_| SendError::BadKey)?;
    key.set_sensitive(true);
    let (http, slot) = http.lane(&req.url);
    let mut r = http.request(req.method.clone(), req.url).header("X-Api-Key", key);
    r = match req.payload {
        Payload::Empty => r,
        Payload::Json(b) => r.header(CONTENT_TYPE, "application/json").body(b),
        Payload::Octets(b) => r.header(CONTENT_TYPE, "application/octet-stream").body(b),
    };
    let opening = match &slot {
        Some(s) => Some(s.first(true).await),
        None => None,
    };
    let resp = r.send().await.map_err(|e| native_send_error(&e))?;
    if let Some(s) = &slot {
        s.answered();
    }
    drop(opening);
    if let Some(hint) = resp.headers().get("keep-alive").and_then(|v| v.to_str().ok()) {
        net::note_keep_alive(&resp.url().origin().ascii_serialization(), hint);
    }
    Ok(Response::native(resp).holding(slot))
}

/// A failed native send: a proxy that refused the tunnel or could not be reached, an
/// untrusted certificate (nothing was sent in either case), or a lost connection.
pub fn native_send_error(e: &reqwest::Error) -> SendError {
    match net::proxy_failure(e) {
        Some(net::ProxyFailure::Refused { status }) => return SendError::ProxyRefused(status),
        Some(net::ProxyFailure::Unreachable) => return SendError::ProxyUnreachable,
        None => {}
    }
    if net::is_untrusted_certificate(e) {
        return SendError::Untrusted;
    }
    if e.is_connect() {
        SendError::NotSent
    } else {
        SendError::Lost
    }
}

/// An answer's head, and its body to be read.
pub struct Response {
    status: StatusCode,
    inner: Inner,
    /// Its place on an HTTP/2 lane (`net::Http::lane`), given back with the body.
    slot: Option<net::Slot>,
}

enum Inner {
    Native(reqwest::Response),
    Host { headers: Vec<(String, String)>, body: HostStream },
}

impl Response {
    pub fn native(resp: reqwest::Response) -> Self {
        Response { status: resp.status(), inner: Inner::Native(resp), slot: None }
    }

    /// The same answer, holding `slot` until its body is dropped.
    pub fn holding(mut self, slot: Option<net::Slot>) -> Self {
        self.slot = slot;
        self
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The first value of a header (`name` in lowercase), when it is text.
    pub fn header(&self, name: &str) -> Option<&str> {
        match &self.inner {
            Inner::Native(r) => r.headers().get(name)?.to_str().ok(),
            Inner::Host { headers, .. } => {
                headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
            }
        }
    }

    /// The body, read as a stream of chunks (backpressure: nothing is read ahead of the
    /// consumer beyond the transport's own window).
    pub fn into_body(self) -> BodyStream {
        let slot = self.slot;
        match self.inner {
            Inner::Native(r) => BodyStream(BodyInner::Native(reqwest::Body::from(r)), slot),
            Inner::Host { body, .. } => BodyStream(BodyInner::Host(body), slot),
        }
    }
}

/// An answer's body as chunks; dropping it before the end cancels the exchange.
pub struct BodyStream(BodyInner, Option<net::Slot>);

enum BodyInner {
    Native(reqwest::Body),
    Host(HostStream),
}

impl Stream for BodyStream {
    type Item = Result<Bytes, BodyBroken>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match &mut this.0 {
            BodyInner::Native(body) => loop {
                return match std::task::ready!(http_body::Body::poll_frame(Pin::new(&mut *body), cx)) {
                    None => {
                        // Read to its end: the stream is closed, its lane has room again.
                        this.1 = None;
                        Poll::Ready(None)
                    }
                    Some(Err(_)) => Poll::Ready(Some(Err(BodyBroken))),
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => Poll::Ready(Some(Ok(data))),
                        Err(_) => continue, // trailers
                    },
                };
            },
            BodyInner::Host(s) => s.as_mut().poll_next(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(method: &'a Method, key: &'a SecretString, payload: Payload) -> Request<'a> {
        Request {
            method,
            url: "https://api.test/v1/sandboxes/sb/files?path=%2Ftmp%2Fx".to_owned(),
            key,
            payload,
            timeout: None,
        }
    }

    #[test]
    fn host_requests_look_as_the_typescript_module_made_them() {
        let key = SecretString::from("k-1".to_owned());
        let r = host_request(request(&Method::POST, &key, Payload::Json(Bytes::from_static(br#"{"a":1}"#)))).unwrap();
        assert_eq!(r.method, "POST");
        assert_eq!(r.url, "https://api.test/v1/sandboxes/sb/files?path=%2Ftmp%2Fx");
        let names: Vec<_> = r.headers.iter().map(|(k, _)| *k).collect();
        assert_eq!(names, ["Content-Type", "X-Api-Key"]);
        assert_eq!(r.headers[0].1, "application/json");
        assert!(matches!(r.body, HostBody::Text(ref t) if t == r#"{"a":1}"#));
        let r = host_request(request(&Method::GET, &key, Payload::Empty)).unwrap();
        assert_eq!(r.headers.len(), 1);
        assert!(matches!(r.body, HostBody::None));
        let r = host_request(request(&Method::PUT, &key, Payload::Octets(Bytes::from_static(b"\xff\x00")))).unwrap();
        assert_eq!(r.headers[0].1, "application/octet-stream");
        assert!(matches!(r.body, HostBody::Bytes(_)), "an upload that is not UTF-8 goes as bytes");
        assert_eq!(format!("{r:?}"), "HostRequest(<redacted>)", "the key and the query never format");
    }

    #[test]
    fn a_key_that_cannot_be_a_header_is_refused_before_the_host_sees_it() {
        for bad in ["a\nb", "a\rb", "a\0b", "a\u{1}b", "a\u{7f}b", "a\u{100}b", "a\u{1b}b"] {
            let key = SecretString::from(bad.to_owned());
            assert!(!key_is_sendable(bad), "{bad:?}");
            assert!(matches!(host_request(request(&Method::GET, &key, Payload::Empty)), Err(SendError::BadKey)));
        }
        for good in ["sk-1", "a b\tc", "caf\u{e9}"] {
            assert!(key_is_sendable(good), "{good:?}");
        }
    }
}
