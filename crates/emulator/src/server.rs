//! HTTP front: routing, auth, rate limit, fault layer, request log, and the handlers.

// Handlers return ready-made error responses from small helpers; their size does not matter.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri, Version};
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::Engine;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::faults::{self, FaultAction, Fired};
use super::model::{self, Proc, Sandbox};
use super::net::{self, ConnHandle, NetConfig};
use super::streams::{self, ExecReq, Out};
use super::{procfs, Inner, Profile, RequestRecord};

const MAX_BODY: usize = 1 << 30;
const EXEC_TIMEOUT: Duration = Duration::from_secs(60);
const WAIT_DEFAULT_MS: u64 = 30_000;
const WAIT_MAX_MS: u64 = 300_000;
const DELETE_GRACE_DEFAULT_MS: u64 = 1_000;
const DELETE_GRACE_MAX_MS: u64 = 600_000;
const LIST_DEFAULT: usize = 50;
const LIST_MAX: usize = 500;
const STREAM_CHANNEL: usize = 8;
pub(crate) const FAULT_SECRET: &str = "secret-body-token";

pub(crate) fn spawn_server(inner: Arc<Inner>, listener: TcpListener, cfg: NetConfig) -> JoinHandle<()> {
    let app = Router::new().fallback(dispatch).with_state(inner.clone());
    tokio::spawn(net::serve(listener, cfg, app, inner.shutdown.clone(), inner.connections.clone()))
}

// ---------------------------------------------------------------- envelopes

pub(crate) fn ok(status: StatusCode, data: Value) -> Response {
    (status, axum::Json(json!({"status":"success","data":data}))).into_response()
}

pub(crate) fn fail(status: StatusCode, data: Value) -> Response {
    (status, axum::Json(json!({"status":"fail","data":data}))).into_response()
}

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"status":"error","message":message,"code":status.as_u16()}))).into_response()
}

fn fault_response(status: u16, retry_after: Option<&str>) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = if code.as_u16() >= 500 {
        (
            code,
            axum::Json(
                json!({"status":"error","message":format!("injected fault ({FAULT_SECRET})"),"code":code.as_u16()}),
            ),
        )
            .into_response()
    } else {
        (code, axum::Json(json!({"status":"fail","data":{"fault":"injected","token":FAULT_SECRET}}))).into_response()
    };
    if code == StatusCode::TOO_MANY_REQUESTS || code == StatusCode::SERVICE_UNAVAILABLE {
        let value = retry_after.and_then(|v| HeaderValue::from_str(v).ok()).unwrap_or(HeaderValue::from_static("1"));
        resp.headers_mut().insert(header::RETRY_AFTER, value);
    }
    resp
}

// ---------------------------------------------------------------- routing

struct RouteMatch {
    name: &'static str,
    sandbox: Option<String>,
    process: Option<String>,
}

fn classify(method: &Method, path: &str) -> RouteMatch {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let m = method.as_str();
    let mut r = RouteMatch { name: "unknown", sandbox: None, process: None };
    if segs.first() != Some(&"v1") {
        return r;
    }
    let s = &segs[1..];
    let own = |x: &str| Some(x.to_string());
    r.name = match (m, s) {
        ("GET", ["whoami"]) => "whoami",
        ("POST", ["sandboxes"]) => "createSandbox",
        ("GET", ["sandboxes", id]) => {
            r.sandbox = own(id);
            "getSandbox"
        }
        ("DELETE", ["sandboxes", id]) => {
            r.sandbox = own(id);
            "deleteSandbox"
        }
        (_, ["sandboxes", id, rest @ ..]) => {
            r.sandbox = own(id);
            match (m, rest) {
                ("PUT", ["files"]) => "putFile",
                ("GET", ["files"]) => "getFile",
                ("POST", ["exec"]) => "exec",
                ("POST", ["processes"]) => "createProcess",
                ("GET", ["processes"]) => "listProcesses",
                (_, ["processes", pid, tail @ ..]) => {
                    r.process = own(pid);
                    match (m, tail) {
                        ("GET", []) => "getProcess",
                        ("DELETE", []) => "deleteProcess",
                        ("GET", ["connect"]) => "connect",
                        ("POST", ["input"]) => "input",
                        ("POST", ["stdin", "close"]) => "stdinClose",
                        ("POST", ["signal"]) => "signal",
                        ("GET", ["wait"]) => "wait",
                        _ => "unknown",
                    }
                }
                _ => "unknown",
            }
        }
        _ => "unknown",
    };
    r
}

fn query_map(uri: &Uri) -> HashMap<String, String> {
    Query::<HashMap<String, String>>::try_from_uri(uri).map(|q| q.0).unwrap_or_default()
}

fn version_name(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "unknown",
    }
}

fn truthy(v: Option<&String>) -> bool {
    matches!(v.map(String::as_str), Some("true" | "1" | "yes"))
}

// ---------------------------------------------------------------- front layer

fn push_record(inner: &Inner, rec: RequestRecord) -> (u64, usize) {
    let mut g = inner.requests.lock().unwrap();
    g.1.push(rec);
    (g.0, g.1.len() - 1)
}

fn finish_record(inner: &Inner, slot: (u64, usize), route: &'static str, status: u16, duration_ms: f64) {
    let mut g = inner.requests.lock().unwrap();
    if g.0 == slot.0 {
        if let Some(r) = g.1.get_mut(slot.1) {
            r.route = route;
            r.status = status;
            r.duration_ms = duration_ms;
        }
    }
}

/// Retry-After seconds when over the limit.
fn rate_check(inner: &Inner, key: &str) -> Option<u64> {
    let limit = inner.rate_limit? as usize;
    let now = Instant::now();
    let mut g = inner.rate.lock().unwrap();
    let q = g.entry(key.to_string()).or_default();
    while q.front().is_some_and(|t| now.duration_since(*t) >= inner.rate_window) {
        q.pop_front();
    }
    if q.len() >= limit {
        let free_at = *q.front().unwrap() + inner.rate_window;
        let secs = free_at.saturating_duration_since(now).as_secs_f64().ceil() as u64;
        return Some(secs.max(1));
    }
    q.push_back(now);
    None
}

async fn dispatch(
    State(inner): State<Arc<Inner>>,
    axum::Extension(conn): axum::Extension<ConnHandle>,
    req: Request,
) -> Response {
    let arrival = Instant::now();
    let at_ms = inner.now_ms();
    let (parts, body) = req.into_parts();
    let mut rm = classify(&parts.method, parts.uri.path());
    let record = |route, received_ms| RequestRecord {
        method: parts.method.as_str().to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or("").to_string(),
        route,
        status: 0,
        at_ms,
        received_ms,
        duration_ms: 0.0,
        http_version: version_name(parts.version),
        connection: conn.id,
        applied_ms: None,
    };
    // The head is checked as it arrives (key, rate limit); the request enters the log once
    // it has arrived in full, so the log is in the order the server received requests.
    let mut incomplete = false;
    let (slot, result) = match head_check(&inner, &parts) {
        Some(resp) => (push_record(&inner, record(rm.name, Some(at_ms))), Some(resp)),
        None => match axum::body::to_bytes(body, MAX_BODY).await {
            Ok(body) => {
                let slot = push_record(&inner, record(rm.name, Some(inner.now_ms())));
                (slot, front(&inner, &parts, body, &mut rm, slot).await)
            }
            // The body never arrived in full (the client gave up on it, or it is too large):
            // logged with `received_ms: None`, nothing handled.
            Err(_) => {
                incomplete = true;
                let slot = push_record(&inner, record(rm.name, None));
                (slot, Some(fail(StatusCode::BAD_REQUEST, json!({"body":"incomplete or too large"}))))
            }
        },
    };
    let request_id = format!("req_{}", uuid::Uuid::new_v4().simple());
    let elapsed = arrival.elapsed().as_secs_f64() * 1000.0;
    match result {
        Some(mut resp) => {
            if let Ok(v) = HeaderValue::from_str(&request_id) {
                resp.headers_mut().insert("x-request-id", v);
            }
            let status = if incomplete { 0 } else { resp.status().as_u16() };
            finish_record(&inner, slot, rm.name, status, elapsed);
            resp
        }
        None => {
            finish_record(&inner, slot, rm.name, 0, elapsed);
            conn.token.cancel();
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// The checks made on a request's head: the key, then the rate limit.
fn head_check(inner: &Inner, parts: &axum::http::request::Parts) -> Option<Response> {
    let key = parts.headers.get("x-api-key").and_then(|v| v.to_str().ok()).unwrap_or("");
    if key.is_empty() || key != inner.api_key {
        return Some(fail(StatusCode::UNAUTHORIZED, json!({"auth":"invalid api key"})));
    }
    if let Some(secs) = rate_check(inner, key) {
        let mut r = fail(StatusCode::TOO_MANY_REQUESTS, json!({"rate":"limited"}));
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return Some(r);
    }
    None
}

/// Note when a late creation was applied in its request's record (if the log was not cleared
/// since).
fn note_applied(inner: &Inner, slot: (u64, usize), at_ms: f64) {
    let mut g = inner.requests.lock().unwrap();
    if g.0 == slot.0 {
        if let Some(r) = g.1.get_mut(slot.1) {
            r.applied_ms = Some(at_ms);
        }
    }
}

/// [`FaultAction::ApplyLate`]: the creation is applied by a task of its own, at the moment the
/// rule names, whether or not the client is still there. `Some` only with `hold`, once applied
/// and if this request's future was not dropped meanwhile (the client left).
async fn apply_late(
    inner: &Arc<Inner>,
    late: faults::ApplyLate,
    sandbox: Option<String>,
    body: Bytes,
    slot: (u64, usize),
) -> Option<Response> {
    let list_rx = match (&sandbox, late.after_list) {
        (Some(sb), true) => {
            let (fire, rx) = tokio::sync::oneshot::channel();
            inner.late.lock().unwrap().push(crate::LateCreation { sandbox: sb.clone(), fire });
            Some(rx)
        }
        _ => None,
    };
    let (answer_tx, answer_rx) = tokio::sync::oneshot::channel::<Response>();
    let inner2 = inner.clone();
    tokio::spawn(async move {
        let list = async {
            match list_rx {
                // A list answer that was dropped unsent fires too (the sender goes away).
                Some(rx) => {
                    let _ = rx.await;
                }
                None => std::future::pending().await,
            }
        };
        let timer = async {
            match late.ms {
                Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                None => std::future::pending().await,
            }
        };
        if late.after_list || late.ms.is_some() {
            tokio::select! {
                () = list => {}
                () = timer => {}
                () = inner2.shutdown.cancelled() => return,
            }
        }
        // Logged first: whoever sees the process (a list) sees the record say it was applied.
        note_applied(&inner2, slot, inner2.now_ms());
        let resp = match sandbox.as_deref().and_then(|id| inner2.sandbox(id)) {
            Some(sb) => create_process(&inner2, &sb, body),
            None => not_found_sandbox(),
        };
        let _ = answer_tx.send(resp);
    });
    if !late.hold {
        return None;
    }
    answer_rx.await.ok()
}

/// A list answer's body that, once it was sent (or dropped unsent), fires the creations that
/// waited for it ([`FaultAction::ApplyLate`] `after_list`).
struct FireAfterBody {
    data: Option<Bytes>,
    fire: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl FireAfterBody {
    fn fire(&mut self) {
        for f in self.fire.drain(..) {
            let _ = f.send(());
        }
    }
}

impl http_body::Body for FireAfterBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        match self.data.take() {
            Some(d) => std::task::Poll::Ready(Some(Ok(http_body::Frame::data(d)))),
            None => {
                self.fire();
                std::task::Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

impl Drop for FireAfterBody {
    fn drop(&mut self) {
        self.fire();
    }
}

/// Hand the creations waiting for a list answer of this sandbox to the answer's body.
async fn fire_after_list(inner: &Inner, sandbox: Option<&str>, resp: Response) -> Response {
    let Some(sandbox) = sandbox else { return resp };
    let fire: Vec<_> = {
        let mut late = inner.late.lock().unwrap();
        let (mine, rest): (Vec<_>, Vec<_>) = late.drain(..).partition(|l| l.sandbox == sandbox);
        *late = rest;
        mine.into_iter().map(|l| l.fire).collect()
    };
    if fire.is_empty() {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    // A list answer is a small JSON document made in memory.
    let data = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
    Response::from_parts(parts, Body::new(FireAfterBody { data: Some(data), fire }))
}

/// `None` = drop the connection without a response.
async fn front(
    inner: &Arc<Inner>,
    parts: &axum::http::request::Parts,
    body: Bytes,
    rm: &mut RouteMatch,
    slot: (u64, usize),
) -> Option<Response> {
    let query = query_map(&parts.uri);
    if rm.name == "exec" {
        let body_stream = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("stream").and_then(Value::as_bool))
            .unwrap_or(false);
        if truthy(query.get("stream")) || body_stream {
            rm.name = "execStream";
        }
    }
    let exit_sent = match (&rm.sandbox, &rm.process) {
        (Some(sb), Some(p)) => {
            inner.sandbox(sb).and_then(|sb| sb.process(p)).is_some_and(|p| p.exit_sent.load(Ordering::SeqCst))
        }
        _ => false,
    };
    let fired = {
        let mut slots = inner.faults.lock().unwrap();
        faults::evaluate(&mut slots, rm.name, parts.method.as_str(), exit_sent)
    };
    if fired.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(fired.delay_ms)).await;
    }
    match &fired.response {
        Some(FaultAction::Status { status, after_handler: false, retry_after }) => {
            return Some(fault_response(*status, retry_after.as_deref()))
        }
        Some(FaultAction::DropConnection { after_handler: false }) => return None,
        Some(FaultAction::Redirect { location }) => {
            let mut r = StatusCode::TEMPORARY_REDIRECT.into_response();
            if let Ok(v) = HeaderValue::from_str(location) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            return Some(r);
        }
        _ => {}
    }
    if let Some(late) = fired.apply_late {
        return apply_late(inner, late, rm.sandbox.clone(), body, slot).await;
    }
    let resp = handle(inner, rm, &query, body, &fired).await;
    match &fired.response {
        Some(FaultAction::Status { status, after_handler: true, retry_after }) => {
            drop(resp);
            Some(fault_response(*status, retry_after.as_deref()))
        }
        Some(FaultAction::DropConnection { after_handler: true }) => {
            drop(resp);
            None
        }
        _ if rm.name == "listProcesses" && resp.status().is_success() => {
            Some(fire_after_list(inner, rm.sandbox.as_deref(), resp).await)
        }
        _ => Some(resp),
    }
}

// ---------------------------------------------------------------- handlers

fn not_found_sandbox() -> Response {
    fail(StatusCode::NOT_FOUND, json!({"sandbox":"not found"}))
}

fn not_found_process() -> Response {
    fail(StatusCode::NOT_FOUND, json!({"process":"not found"}))
}

fn parse_json(body: &Bytes) -> Result<Value, Response> {
    if body.is_empty() {
        return Ok(json!({}));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        _ => Err(fail(StatusCode::BAD_REQUEST, json!({"body":"expected a JSON object"}))),
    }
}

fn str_list(v: Option<&Value>, field: &str) -> Result<Vec<String>, Response> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| fail(StatusCode::BAD_REQUEST, json!({field: "must be an array of strings"}))),
        _ => Err(fail(StatusCode::BAD_REQUEST, json!({field: "must be an array of strings"}))),
    }
}

fn str_map(v: Option<&Value>, field: &str) -> Result<HashMap<String, String>, Response> {
    match v {
        None | Some(Value::Null) => Ok(HashMap::new()),
        Some(Value::Object(o)) => o
            .iter()
            .map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
            .collect::<Option<HashMap<_, _>>>()
            .ok_or_else(|| fail(StatusCode::BAD_REQUEST, json!({field: "must map strings to strings"}))),
        _ => Err(fail(StatusCode::BAD_REQUEST, json!({field: "must map strings to strings"}))),
    }
}

fn opt_str(v: Option<&Value>, field: &str) -> Result<Option<String>, Response> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        _ => Err(fail(StatusCode::BAD_REQUEST, json!({field: "must be a string"}))),
    }
}

fn req_cmd(v: &Value) -> Result<String, Response> {
    match v.get("cmd") {
        Some(Value::String(s)) if !s.is_empty() && !s.contains('\0') => Ok(s.clone()),
        _ => Err(fail(StatusCode::BAD_REQUEST, json!({"cmd":"required (non-empty string)"}))),
    }
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(r) => return r,
        }
    };
}

async fn handle(
    inner: &Arc<Inner>,
    rm: &RouteMatch,
    query: &HashMap<String, String>,
    body: Bytes,
    fired: &Fired,
) -> Response {
    if rm.name == "whoami" {
        return ok(StatusCode::OK, json!({"user":"emulator"}));
    }
    if rm.name == "createSandbox" {
        let v = tri!(parse_json(&body));
        let shape = v.get("shape").cloned().unwrap_or(Value::Null);
        return match model::create_sandbox(inner, shape) {
            Ok(sb) => ok(StatusCode::CREATED, json!({"id":sb.id,"status":"running","shape":sb.shape})),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("cannot create sandbox dir: {e}")),
        };
    }
    if rm.name == "unknown" {
        return fail(StatusCode::NOT_FOUND, json!({"route":"not found"}));
    }
    let Some(sb) = rm.sandbox.as_deref().and_then(|id| inner.sandbox(id)) else {
        return not_found_sandbox();
    };
    match rm.name {
        "getSandbox" => ok(StatusCode::OK, json!({"id":sb.id,"status":"running","shape":sb.shape})),
        "deleteSandbox" => delete_sandbox(inner, sb).await,
        "putFile" => put_file(&sb, query, body, inner.profile).await,
        "getFile" => get_file(&sb, query).await,
        "exec" | "execStream" => exec(inner, &sb, query, body, rm.name == "execStream", fired).await,
        "createProcess" => create_process(inner, &sb, body),
        "listProcesses" if inner.profile == Profile::Documented => list_all_processes(&sb, fired),
        "listProcesses" => list_processes(&sb, query, fired),
        _ => {
            let Some(p) = rm.process.as_deref().and_then(|id| sb.process(id)) else {
                return not_found_process();
            };
            match rm.name {
                "getProcess" => ok(StatusCode::OK, p.to_json()),
                "deleteProcess" => delete_process(inner, p, query, fired).await,
                "connect" => connect(inner, p, query, fired).await,
                "input" => input(p, body).await,
                "stdinClose" => stdin_close(p).await,
                "signal" => signal(inner, p, body),
                "wait" => wait(inner, p, query).await,
                _ => fail(StatusCode::NOT_FOUND, json!({"route":"not found"})),
            }
        }
    }
}

/// `GET …/processes?limit=&offset=`: pages of at most 500 (default 50, as the API's other
/// lists), oldest first, with `pagination { total, limit, offset, count }`.
fn list_processes(sb: &Sandbox, query: &HashMap<String, String>, fired: &Fired) -> Response {
    let number = |k: &str, default: usize| match query.get(k) {
        None => Ok(default),
        Some(s) => {
            s.parse::<usize>().map_err(|_| fail(StatusCode::BAD_REQUEST, json!({k: "must be a non-negative integer"})))
        }
    };
    let asked = tri!(number("limit", LIST_DEFAULT)).clamp(1, LIST_MAX);
    let limit = asked.min(fired.page_size.unwrap_or(usize::MAX));
    let offset = tri!(number("offset", 0));
    // A faulty server may serve every page from the start.
    let from = if fired.ignore_offset { 0 } else { offset };
    let procs = sb.procs.lock().unwrap();
    let page: Vec<Value> = procs.iter().skip(from).take(limit).map(|p| p.to_json()).collect();
    let pagination = if fired.no_total {
        json!({"limit": asked, "offset": offset, "count": page.len()})
    } else {
        json!({"total": procs.len(), "limit": limit, "offset": offset, "count": page.len()})
    };
    ok(StatusCode::OK, json!({"processes": page, "pagination": pagination}))
}

/// The documented profile's list: `data.processes[]`, every retained process, oldest first,
/// whatever `limit`/`offset` say, with no `pagination` (the API notes document none). A
/// `pageSize` fault cuts it to its first `limit` processes (a server that caps silently).
fn list_all_processes(sb: &Sandbox, fired: &Fired) -> Response {
    let cap = fired.page_size.unwrap_or(usize::MAX);
    let page: Vec<Value> = sb.procs.lock().unwrap().iter().take(cap).map(|p| p.to_json()).collect();
    ok(StatusCode::OK, json!({ "processes": page }))
}

async fn delete_sandbox(inner: &Arc<Inner>, sb: Arc<Sandbox>) -> Response {
    inner.sandboxes.lock().unwrap().remove(&sb.id);
    procfs::kill_until_gone(sb.filter(inner), Instant::now() + Duration::from_secs(5)).await;
    let procs = sb.procs.lock().unwrap().clone();
    for ctl in procs.iter().filter_map(|p| p.virt.as_ref()) {
        ctl.deliver(nix::sys::signal::Signal::SIGKILL);
    }
    for p in procs {
        let leader = p.st.lock().unwrap().leader_exited;
        if !leader {
            // Give the waiter a moment to reap the leader.
            let mut rx = p.tx.subscribe();
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                loop {
                    rx.borrow_and_update();
                    if p.st.lock().unwrap().leader_exited {
                        break;
                    }
                    if rx.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await;
        }
        p.st.lock().unwrap().tree_exited_real = true;
        p.bump();
    }
    model::forget_retained(inner, &sb.procs.lock().unwrap());
    let dir = sb.dir.clone();
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
    // Reclaimed inline: `destroyed` (the API answers `destroying` when it reclaims later).
    ok(StatusCode::OK, json!({"id":sb.id,"status":"destroyed"}))
}

async fn put_file(sb: &Sandbox, query: &HashMap<String, String>, body: Bytes, profile: Profile) -> Response {
    let Some(p) = query.get("path") else {
        return fail(StatusCode::BAD_REQUEST, json!({"path":"required"}));
    };
    let host = match sb.file_path(p) {
        Ok(h) => h,
        Err(e) => return fail(StatusCode::BAD_REQUEST, json!({"path": e})),
    };
    match host.parent() {
        Some(parent) if parent.is_dir() => {}
        _ => return fail(StatusCode::NOT_FOUND, json!({"path":"parent directory does not exist"})),
    }
    if host.is_dir() {
        return fail(StatusCode::BAD_REQUEST, json!({"path":"is a directory"}));
    }
    let n = body.len();
    let written = tokio::fs::write(&host, &body).await;
    sb.files.notify_waiters();
    match written {
        // The shape of an upload's `data` is not documented: the documented profile sends none.
        Ok(()) if profile == Profile::Documented => ok(StatusCode::OK, json!({})),
        Ok(()) => ok(StatusCode::OK, json!({"path": p, "bytes": n})),
        Err(e) => fail(StatusCode::BAD_REQUEST, json!({"path": format!("cannot write: {e}")})),
    }
}

async fn get_file(sb: &Sandbox, query: &HashMap<String, String>) -> Response {
    let Some(p) = query.get("path") else {
        return fail(StatusCode::BAD_REQUEST, json!({"path":"required"}));
    };
    let host = match sb.file_path(p) {
        Ok(h) => h,
        Err(e) => return fail(StatusCode::BAD_REQUEST, json!({"path": e})),
    };
    if host.is_dir() {
        return fail(StatusCode::BAD_REQUEST, json!({"path":"is a directory"}));
    }
    match tokio::fs::read(&host).await {
        Ok(data) => Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(Body::from(data))
            .unwrap(),
        Err(_) => fail(StatusCode::NOT_FOUND, json!({"path":"not found"})),
    }
}

async fn exec(
    inner: &Arc<Inner>,
    sb: &Arc<Sandbox>,
    _query: &HashMap<String, String>,
    body: Bytes,
    stream: bool,
    fired: &Fired,
) -> Response {
    let v = tri!(parse_json(&body));
    let cmd = tri!(req_cmd(&v));
    let timeout = match v.get("timeout_ms").and_then(Value::as_u64) {
        Some(ms) if ms > 0 => Duration::from_millis(ms),
        _ => EXEC_TIMEOUT,
    };
    let req = ExecReq {
        cmd,
        args: tri!(str_list(v.get("args"), "args")),
        env: tri!(str_map(v.get("env"), "env")),
        cwd: tri!(opt_str(v.get("cwd"), "cwd")),
        stdin: tri!(opt_str(v.get("stdin"), "stdin")),
        timeout,
    };
    let started = Instant::now();
    let run = streams::exec_spawn(inner, sb, &req);
    if stream {
        let (tx, rx) = mpsc::channel(STREAM_CHANNEL);
        let out = Out::new(tx, fired.stream.sse_noise);
        match run {
            Ok(run) => {
                tokio::spawn(streams::exec_stream_task(inner.clone(), run, req.timeout, out));
            }
            Err(msg) => {
                tokio::spawn(async move {
                    let line = json!({"error": msg}).to_string();
                    let _ = out.tx.send(Ok(Bytes::from(format!("{line}\n{{\"exit_code\":127}}\n")))).await;
                });
            }
        }
        return streams::ndjson_response(rx);
    }
    let (code, o, e, err) = match run {
        Ok(run) => {
            let h = tokio::spawn(streams::exec_buffered(inner.clone(), run, req.timeout));
            match h.await {
                Ok((code, o, e, timed_out)) => {
                    (code, o, e, if timed_out { Some("exec timed out; killed".to_string()) } else { None })
                }
                Err(_) => return error(StatusCode::INTERNAL_SERVER_ERROR, "exec task failed"),
            }
        }
        Err(msg) => (127, Vec::new(), Vec::new(), Some(msg)),
    };
    let so = String::from_utf8_lossy(&o).into_owned();
    let se = String::from_utf8_lossy(&e).into_owned();
    let exec_ms = started.elapsed().as_secs_f64() * 1000.0;
    let mut result = json!({"exit_code": code, "stdout": so, "stderr": se});
    if let Some(err) = &err {
        result["error"] = json!(err);
    }
    // Documented: `data.result` and `data.exec_ms`; the full profile also copies the result's
    // fields to the top of `data`.
    let mut data = if inner.profile == Profile::Documented { json!({}) } else { result.clone() };
    data["result"] = result;
    data["exec_ms"] = json!(exec_ms);
    ok(StatusCode::OK, data)
}

fn create_process(inner: &Arc<Inner>, sb: &Arc<Sandbox>, body: Bytes) -> Response {
    let v = tri!(parse_json(&body));
    if v.get("pty").is_some_and(|p| !p.is_null()) {
        return fail(
            StatusCode::BAD_REQUEST,
            json!({"pty":"not supported by the emulator (pipe-backed processes only)"}),
        );
    }
    let cmd = tri!(req_cmd(&v));
    let args = tri!(str_list(v.get("args"), "args"));
    let env = tri!(str_map(v.get("env"), "env"));
    let cwd = tri!(opt_str(v.get("cwd"), "cwd"));
    match model::start_process(inner, sb, &cmd, args, cwd.as_deref(), &env) {
        Ok(p) => ok(StatusCode::CREATED, p.to_json()),
        Err(msg) => fail(StatusCode::BAD_REQUEST, json!({"cmd": msg})),
    }
}

async fn delete_process(inner: &Arc<Inner>, p: Arc<Proc>, query: &HashMap<String, String>, fired: &Fired) -> Response {
    let grace = match query.get("grace_ms") {
        None => DELETE_GRACE_DEFAULT_MS,
        Some(s) => match s.parse::<u64>() {
            Ok(ms) => ms.min(DELETE_GRACE_MAX_MS),
            Err(_) => return fail(StatusCode::BAD_REQUEST, json!({"grace_ms":"must be a non-negative integer"})),
        },
    };
    if fired.delete.tree_exited_false {
        p.st.lock().unwrap().tree_hold = true;
        p.bump();
        return ok(StatusCode::OK, p.to_json());
    }
    if let Some(ms) = fired.delete.tree_exits_after {
        p.st.lock().unwrap().tree_hold = true;
        p.bump();
        let answer = p.to_json();
        let p2 = p.clone();
        let inner2 = inner.clone();
        let shutdown = inner.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                _ = shutdown.cancelled() => {}
            }
            model::kill_now(&inner2, &p2).await;
            p2.st.lock().unwrap().tree_hold = false;
            p2.bump();
        });
        return ok(StatusCode::OK, answer);
    }
    // A DELETE without a fault tells the truth again (an earlier stubborn answer is over).
    p.st.lock().unwrap().tree_hold = false;
    if fired.delete.kill_only {
        model::kill_now(inner, &p).await;
        return ok(StatusCode::OK, p.to_json());
    }
    model::terminate(inner, &p, Duration::from_millis(grace)).await;
    ok(StatusCode::OK, p.to_json())
}

async fn connect(inner: &Arc<Inner>, p: Arc<Proc>, query: &HashMap<String, String>, fired: &Fired) -> Response {
    let after = match query.get("after") {
        None => 0,
        Some(s) => match s.parse::<u64>() {
            Ok(n) => n,
            Err(_) => return fail(StatusCode::BAD_REQUEST, json!({"after":"must be a non-negative integer"})),
        },
    };
    if fired.stream.fast.is_none() {
        if let model::Read::Expired { oldest } = p.journal.lock().unwrap().read_after(after, 0) {
            return fail(StatusCode::GONE, json!({"error":"output_offset_expired","oldest_available_seq":oldest}));
        }
    }
    let (tx, mut rx) = mpsc::channel(STREAM_CHANNEL);
    let out = Out::new(tx, fired.stream.sse_noise);
    tokio::spawn(streams::connect_task(inner.clone(), p, after, fired.stream.clone(), out));
    if inner.hold_headers {
        // Like a Node `http` server: the head goes out with the first body write. The task
        // writes a frame at the latest after one heartbeat interval, so this wait is bounded.
        let first = tokio::select! {
            f = rx.recv() => f,
            () = inner.shutdown.cancelled() => None,
        };
        return streams::ndjson_response_after(first, rx);
    }
    streams::ndjson_response(rx)
}

async fn input(p: Arc<Proc>, body: Bytes) -> Response {
    let v = tri!(parse_json(&body));
    let Some(b64) = v.get("data_base64").and_then(Value::as_str) else {
        return fail(StatusCode::BAD_REQUEST, json!({"data_base64":"required"}));
    };
    let Ok(data) = base64::engine::general_purpose::STANDARD.decode(b64) else {
        return fail(StatusCode::BAD_REQUEST, json!({"data_base64":"invalid base64"}));
    };
    if p.stdin_closed.load(Ordering::SeqCst) {
        return fail(StatusCode::CONFLICT, json!({"stdin":"closed"}));
    }
    let mut guard = p.stdin.lock().await;
    let Some(w) = guard.as_mut() else {
        return fail(StatusCode::CONFLICT, json!({"stdin":"closed"}));
    };
    let res = tokio::time::timeout(Duration::from_secs(30), async {
        w.write_all(&data).await?;
        w.flush().await
    })
    .await;
    match res {
        Ok(Ok(())) => {
            let seq = p.input_seq.fetch_add(1, Ordering::SeqCst) + 1;
            ok(StatusCode::OK, json!({"input_seq": seq}))
        }
        Ok(Err(_)) => fail(StatusCode::CONFLICT, json!({"stdin":"closed"})),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "stdin write timed out (process is not reading)"),
    }
}

async fn stdin_close(p: Arc<Proc>) -> Response {
    if p.stdin_closed.swap(true, Ordering::SeqCst) {
        return fail(StatusCode::CONFLICT, json!({"stdin":"already closed"}));
    }
    *p.stdin.lock().await = None;
    ok(StatusCode::OK, p.to_json())
}

fn signal(inner: &Inner, p: Arc<Proc>, body: Bytes) -> Response {
    let v = tri!(parse_json(&body));
    let Some(sig) = v.get("signal").and_then(Value::as_str).and_then(procfs::parse_signal) else {
        return fail(StatusCode::BAD_REQUEST, json!({"signal":"unknown or missing signal name"}));
    };
    let leader_exited = p.st.lock().unwrap().leader_exited;
    if let Some(ctl) = &p.virt {
        if !leader_exited {
            ctl.deliver(sig);
        }
        return ok(StatusCode::OK, p.to_json());
    }
    let group_live = inner.groups.lock().unwrap().contains_key(&p.pid);
    let pid = nix::unistd::Pid::from_raw(p.pid);
    if group_live && nix::sys::signal::killpg(pid, sig).is_err() && !leader_exited {
        let _ = nix::sys::signal::kill(pid, sig);
    }
    ok(StatusCode::OK, p.to_json())
}

async fn wait(inner: &Arc<Inner>, p: Arc<Proc>, query: &HashMap<String, String>) -> Response {
    let tree = match query.get("scope").map(String::as_str) {
        None | Some("leader") => false,
        Some("tree") => true,
        Some(_) => return fail(StatusCode::BAD_REQUEST, json!({"scope":"must be leader or tree"})),
    };
    let ms = match query.get("timeout_ms") {
        None => WAIT_DEFAULT_MS,
        Some(s) => match s.parse::<u64>() {
            Ok(ms) => ms.min(WAIT_MAX_MS),
            Err(_) => return fail(StatusCode::BAD_REQUEST, json!({"timeout_ms":"must be a non-negative integer"})),
        },
    };
    let deadline = tokio::time::Instant::now() + Duration::from_millis(ms);
    let mut rx = p.tx.subscribe();
    loop {
        rx.borrow_and_update();
        let done = {
            let st = p.st.lock().unwrap();
            if tree {
                st.tree_exited()
            } else {
                st.leader_exited
            }
        };
        if done {
            return ok(StatusCode::OK, p.to_json());
        }
        tokio::select! {
            r = tokio::time::timeout_at(deadline, rx.changed()) => {
                if r.is_err() {
                    return fail(StatusCode::REQUEST_TIMEOUT, json!({"wait":"timeout"}));
                }
            }
            _ = inner.shutdown.cancelled() => {
                return error(StatusCode::SERVICE_UNAVAILABLE, "emulator closing");
            }
        }
    }
}
