//! NDJSON streams: process `connect` and streaming `exec`.
//!
//! Each stream is a spawned task writing lines into a small bounded channel that backs the
//! response body; the task ends when the client goes away (channel closed).

use std::collections::HashMap;
use std::io;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::Response;
use base64::Engine;
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::faults::StreamFaults;
use super::model::{self, Proc, Read, Sandbox, SpawnSpec};
use super::procfs;
use super::{Inner, Profile};

/// Raw bytes copied out of the journal per batch.
const BATCH_BYTES: usize = 256 * 1024;
/// Heartbeat interval during the `heartbeatsOnly` fault.
const FAULT_HEARTBEAT: Duration = Duration::from_millis(100);

type Item = Result<Bytes, io::Error>;

pub(crate) fn ndjson_response(rx: mpsc::Receiver<Item>) -> Response {
    ndjson_response_after(None, rx)
}

/// An NDJSON response whose body starts with `first` (already taken from `rx`), then the rest.
pub(crate) fn ndjson_response_after(first: Option<Item>, rx: mpsc::Receiver<Item>) -> Response {
    let rest = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    let stream = futures_util::stream::iter(first).chain(rest);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from_stream(stream))
        .unwrap()
}

const NOISE: [&str; 5] = [": keep-alive\n", "event: x\n", "id: 1\n", "retry: 5\n", "\n"];

pub(crate) struct Out {
    pub tx: mpsc::Sender<Item>,
    sse: bool,
    noise: usize,
    buf: Vec<u8>,
    last_write: Instant,
}

impl Out {
    pub fn new(tx: mpsc::Sender<Item>, sse: bool) -> Out {
        Out { tx, sse, noise: 0, buf: Vec::new(), last_write: Instant::now() }
    }

    /// Queue one frame line (SSE decoration applied).
    fn push_line(&mut self, line: &[u8]) {
        if self.sse {
            self.buf.extend_from_slice(NOISE[self.noise % NOISE.len()].as_bytes());
            self.noise += 1;
            self.buf.extend_from_slice(b"data: ");
        }
        self.buf.extend_from_slice(line);
        self.buf.push(b'\n');
    }

    fn push_raw(&mut self, raw: &[u8]) {
        self.buf.extend_from_slice(raw);
    }

    /// Send what is queued; false when the client is gone.
    async fn flush(&mut self) -> bool {
        if self.buf.is_empty() {
            return true;
        }
        let b = Bytes::from(std::mem::take(&mut self.buf));
        self.last_write = Instant::now();
        self.tx.send(Ok(b)).await.is_ok()
    }

    async fn line(&mut self, line: &[u8]) -> bool {
        self.push_line(line);
        self.flush().await
    }

    async fn start_noise(&mut self) -> bool {
        if self.sse {
            for n in NOISE {
                self.push_raw(n.as_bytes());
            }
        }
        self.flush().await
    }

    /// End the response abruptly (no terminating chunk).
    async fn abort(&mut self) {
        let _ = self.flush().await;
        // Let the server write out what was sent before the body fails (hyper drops buffered
        // bytes when the body errors).
        let end = Instant::now() + Duration::from_millis(500);
        while self.tx.capacity() < self.tx.max_capacity() && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = self.tx.send(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "fault: stream dropped"))).await;
    }
}

fn data_line(seq: i64, stream: u8, b64: &str) -> String {
    let s = if stream == 0 { "stdout" } else { "stderr" };
    format!(r#"{{"type":"data","seq":{seq},"stream":"{s}","data_base64":"{b64}"}}"#)
}

const HEARTBEAT_LINE: &[u8] = br#"{"type":"heartbeat"}"#;

fn exit_line(p: &Proc, profile: Profile) -> String {
    let newest = p.journal.lock().unwrap().newest_seq();
    let st = p.st.lock().unwrap();
    exit_json(profile, st.exit_code, st.signal.as_deref(), st.tree_exited(), newest.max(st.fake_newest))
}

/// Exit frame with `type` first (serde_json maps would sort the keys). In the full profile it
/// carries, besides the documented `exit_code`/`signal`, `tree_exited` and `newest_seq` (the
/// last data seq): fields a client may use when present and must ask for (GET the process)
/// when absent. The documented profile sends `exit_code` and, only when the process was
/// killed by a signal, `signal`.
fn exit_json(profile: Profile, code: Option<i32>, signal: Option<&str>, tree_exited: bool, newest_seq: u64) -> String {
    let code = code.map(|c| c.to_string()).unwrap_or_else(|| "null".into());
    let signal_json = signal.map(|s| json!(s).to_string());
    match profile {
        Profile::Full => format!(
            r#"{{"type":"exit","exit_code":{code},"signal":{},"tree_exited":{tree_exited},"newest_seq":{newest_seq}}}"#,
            signal_json.unwrap_or_else(|| "null".into()),
        ),
        Profile::Documented => match signal_json {
            Some(s) => format!(r#"{{"type":"exit","exit_code":{code},"signal":{s}}}"#),
            None => format!(r#"{{"type":"exit","exit_code":{code}}}"#),
        },
    }
}

/// The connect stream of a managed process.
pub(crate) async fn connect_task(inner: Arc<Inner>, proc: Arc<Proc>, after: u64, f: StreamFaults, mut out: Out) {
    let b64 = base64::engine::general_purpose::STANDARD;
    if !out.start_noise().await {
        return;
    }
    if f.drop_after == Some(0) {
        out.abort().await;
        return;
    }
    if let Some(e) = &f.error_frame {
        let _ = out.line(format!(r#"{{"type":"error","error":{}}}"#, json!(e)).as_bytes()).await;
        return;
    }
    if f.oversize {
        let pad = "x".repeat(1_100_000);
        if !out.line(format!(r#"{{"type":"heartbeat","padding":"{pad}"}}"#).as_bytes()).await {
            return;
        }
    }
    if let Some(ms) = f.heartbeats_only_ms {
        let end = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < end {
            if !out.line(HEARTBEAT_LINE).await {
                return;
            }
            tokio::time::sleep(FAULT_HEARTBEAT.min(end.saturating_duration_since(Instant::now()))).await;
        }
    }
    if let Some((mib, frame_bytes)) = f.fast {
        fast_stream(&proc, inner.profile, after, mib, frame_bytes, &mut out).await;
        return;
    }

    let mut cursor = after;
    let mut sent: u32 = 0;
    let mut gap_done = false;
    let mut malformed_done = false;
    let mut first_done = false;
    let mut rx = proc.tx.subscribe();
    loop {
        rx.borrow_and_update();
        let exit_ready = proc.st.lock().unwrap().exit_ready;
        let read = proc.journal.lock().unwrap().read_after(cursor, BATCH_BYTES);
        match read {
            Read::Expired { oldest } => {
                let _ = out
                    .line(
                        format!(
                            r#"{{"type":"error","error":"output_offset_expired","oldest_available_seq":{oldest}}}"#
                        )
                        .as_bytes(),
                    )
                    .await;
                return;
            }
            Read::Frames(frames) if !frames.is_empty() => {
                for fr in frames {
                    cursor = fr.seq;
                    if !gap_done && f.gap_after == Some(sent) {
                        gap_done = true;
                        continue;
                    }
                    if !malformed_done && f.malformed_after == Some(sent) {
                        malformed_done = true;
                        out.push_line(br#"{"type":"data","seq":"#);
                    }
                    let mut seq = i64::try_from(fr.seq).unwrap_or(i64::MAX);
                    let mut enc = b64.encode(&fr.data);
                    if !first_done {
                        first_done = true;
                        if f.bad_seq {
                            seq = -1;
                        }
                        if f.invalid_b64 {
                            enc = "@@not*base64@@".to_string();
                        }
                    }
                    let line = data_line(seq, fr.stream, &enc);
                    out.push_line(line.as_bytes());
                    if f.duplicate {
                        out.push_line(line.as_bytes());
                    }
                    sent += 1;
                    if f.drop_after == Some(sent) {
                        out.abort().await;
                        return;
                    }
                }
                if !out.flush().await {
                    return;
                }
                continue;
            }
            Read::Frames(_) => {}
        }
        if exit_ready {
            if out.line(exit_line(&proc, inner.profile).as_bytes()).await {
                proc.exit_sent.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            return;
        }
        let hb_at = tokio::time::Instant::from_std(out.last_write + inner.heartbeat);
        tokio::select! {
            _ = rx.changed() => {}
            _ = tokio::time::sleep_until(hb_at) => {
                if !out.line(HEARTBEAT_LINE).await { return; }
            }
            _ = out.tx.closed() => return,
            _ = inner.shutdown.cancelled() => return,
        }
    }
}

async fn fast_stream(proc: &Arc<Proc>, profile: Profile, after: u64, mib: u64, frame_bytes: usize, out: &mut Out) {
    let total = mib.saturating_mul(1024 * 1024);
    let n = total.div_ceil(frame_bytes as u64);
    {
        let mut st = proc.st.lock().unwrap();
        st.fake_newest = st.fake_newest.max(n);
    }
    proc.bump();
    let b64 = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; frame_bytes]);
    let head = r#"{"type":"data","seq":"#;
    let tail = format!(r#","stream":"stdout","data_base64":"{b64}"}}"#);
    let mut seq = after + 1;
    while seq <= n {
        while seq <= n && out.buf.len() < 1024 * 1024 {
            if out.sse {
                out.push_raw(b"data: ");
            }
            out.push_raw(head.as_bytes());
            out.push_raw(seq.to_string().as_bytes());
            out.push_raw(tail.as_bytes());
            out.push_raw(b"\n");
            seq += 1;
        }
        if !out.flush().await {
            return;
        }
    }
    let tree = proc.st.lock().unwrap().tree_exited();
    if out.line(exit_json(profile, Some(0), None, tree, n).as_bytes()).await {
        proc.exit_sent.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Length of an incomplete UTF-8 sequence at the end of `b` (0 when none).
fn incomplete_tail(b: &[u8]) -> usize {
    let n = b.len();
    for t in 1..=n.min(3) {
        let c = b[n - t];
        if c & 0xC0 == 0x80 {
            continue;
        }
        let need = if c >= 0xF0 {
            4
        } else if c >= 0xE0 {
            3
        } else if c >= 0xC0 {
            2
        } else {
            1
        };
        return if need > t { t } else { 0 };
    }
    0
}

/// Incremental lossy UTF-8 decoding that never splits a multi-byte character across chunks.
#[derive(Default)]
pub(crate) struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    pub fn push(&mut self, data: &[u8]) -> String {
        self.pending.extend_from_slice(data);
        let keep = incomplete_tail(&self.pending);
        let split = self.pending.len() - keep;
        let rest = self.pending.split_off(split);
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending = rest;
        s
    }

    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

pub(crate) struct ExecReq {
    pub cmd: String,
    pub args: Vec<String>,
    pub env: HashMap<String, String>,
    pub cwd: Option<String>,
    pub stdin: Option<String>,
    pub timeout: Duration,
}

pub(crate) struct ExecRun {
    pub child: tokio::process::Child,
    pub pid: i32,
    pub filter: procfs::Filter,
}

pub(crate) fn exec_spawn(inner: &Arc<Inner>, sb: &Arc<Sandbox>, req: &ExecReq) -> Result<ExecRun, String> {
    let cwd = sb.cwd_path(req.cwd.as_deref()).map_err(ToString::to_string)?;
    let id = model::new_hex_id("exec_");
    let stdin = if req.stdin.is_some() { Stdio::piped() } else { Stdio::null() };
    let (mut child, marker) = model::spawn_marked(
        inner,
        sb,
        &id,
        SpawnSpec { cmd: &req.cmd, args: &req.args, cwd, env: &req.env, stdin, private_view: false },
    )
    .map_err(|e| format!("cannot start {}: {e}", req.cmd))?;
    if let (Some(data), Some(mut w)) = (req.stdin.clone(), child.stdin.take()) {
        tokio::spawn(async move {
            let _ = w.write_all(data.as_bytes()).await;
            let _ = w.shutdown().await;
        });
    }
    let pid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(-1);
    let filter: procfs::Filter =
        Arc::new(move |e: &procfs::Entry| e.mark.as_deref() == Some(marker.as_str()) || e.pgid == pid);
    Ok(ExecRun { child, pid, filter })
}

fn shell_code(status: io::Result<std::process::ExitStatus>) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        Err(_) => -1,
    }
}

async fn kill_exec_tree(filter: &procfs::Filter) {
    procfs::kill_until_gone(filter.clone(), Instant::now() + Duration::from_secs(2)).await;
}

/// Buffered exec: (exit_code, stdout, stderr, timed_out).
pub(crate) async fn exec_buffered(
    inner: Arc<Inner>,
    mut run: ExecRun,
    timeout: Duration,
) -> (i32, Vec<u8>, Vec<u8>, bool) {
    let mut out_r = run.child.stdout.take();
    let mut err_r = run.child.stderr.take();
    let collect = async {
        let mut o = Vec::new();
        let mut e = Vec::new();
        let fo = async {
            if let Some(r) = out_r.as_mut() {
                let _ = read_capped(r, &mut o).await;
            }
        };
        let fe = async {
            if let Some(r) = err_r.as_mut() {
                let _ = read_capped(r, &mut e).await;
            }
        };
        tokio::join!(fo, fe);
        (o, e)
    };
    tokio::pin!(collect);
    let mut timed_out = false;
    let (o, e) = tokio::select! {
        r = &mut collect => r,
        _ = tokio::time::sleep(timeout) => {
            timed_out = true;
            kill_exec_tree(&run.filter).await;
            // The pipes close once the tree is gone; bound the wait anyway.
            tokio::time::timeout(Duration::from_secs(2), &mut collect).await.unwrap_or_default()
        }
        _ = inner.shutdown.cancelled() => {
            kill_exec_tree(&run.filter).await;
            (Vec::new(), Vec::new())
        }
    };
    let status = run.child.wait().await;
    model::note_reaped(&inner, run.pid);
    (shell_code(status), o, e, timed_out)
}

async fn read_capped<R: tokio::io::AsyncRead + Unpin>(r: &mut R, into: &mut Vec<u8>) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        let room = model::CAPTURE_CAP.saturating_sub(into.len());
        into.extend_from_slice(&buf[..n.min(room)]);
    }
}

/// Streaming exec: stdout/stderr text frames, `{"hb":true}` every heartbeat interval (default
/// 5 s), final `{"exit_code":N}`.
/// The client going away kills the exec'd tree.
pub(crate) async fn exec_stream_task(inner: Arc<Inner>, mut run: ExecRun, timeout: Duration, mut out: Out) {
    let mut out_r = run.child.stdout.take();
    let mut err_r = run.child.stderr.take();
    let mut carry = [Utf8Carry::default(), Utf8Carry::default()];
    let mut bo = vec![0u8; 64 * 1024];
    let mut be = vec![0u8; 64 * 1024];
    let deadline = tokio::time::Instant::now() + timeout;
    let mut client_gone = !out.start_noise().await;
    let mut killed = false;
    while !client_gone && (out_r.is_some() || err_r.is_some()) {
        let hb_at = tokio::time::Instant::from_std(out.last_write + inner.heartbeat);
        tokio::select! {
            r = async { out_r.as_mut().unwrap().read(&mut bo).await }, if out_r.is_some() => {
                match r {
                    Ok(n) if n > 0 => {
                        let s = carry[0].push(&bo[..n]);
                        if !s.is_empty() && !out.line(json!({"stdout": s}).to_string().as_bytes()).await { client_gone = true; }
                    }
                    _ => {
                        out_r = None;
                        let s = carry[0].finish();
                        if !s.is_empty() && !out.line(json!({"stdout": s}).to_string().as_bytes()).await { client_gone = true; }
                    }
                }
            }
            r = async { err_r.as_mut().unwrap().read(&mut be).await }, if err_r.is_some() => {
                match r {
                    Ok(n) if n > 0 => {
                        let s = carry[1].push(&be[..n]);
                        if !s.is_empty() && !out.line(json!({"stderr": s}).to_string().as_bytes()).await { client_gone = true; }
                    }
                    _ => {
                        err_r = None;
                        let s = carry[1].finish();
                        if !s.is_empty() && !out.line(json!({"stderr": s}).to_string().as_bytes()).await { client_gone = true; }
                    }
                }
            }
            _ = tokio::time::sleep_until(hb_at) => {
                if !out.line(br#"{"hb":true}"#).await { client_gone = true; }
            }
            _ = tokio::time::sleep_until(deadline), if !killed => {
                killed = true;
                let _ = out.line(json!({"error": "exec timed out; killed"}).to_string().as_bytes()).await;
                kill_exec_tree(&run.filter).await;
            }
            _ = out.tx.closed() => client_gone = true,
            _ = inner.shutdown.cancelled() => client_gone = true,
        }
    }
    if client_gone {
        kill_exec_tree(&run.filter).await;
    }
    let status = run.child.wait().await;
    model::note_reaped(&inner, run.pid);
    if !client_gone {
        let _ = out.line(json!({"exit_code": shell_code(status)}).to_string().as_bytes()).await;
    }
}
