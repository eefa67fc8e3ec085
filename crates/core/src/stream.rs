//! NDJSON streams: bytes → bounded lines → typed frames.
//!
//! Two kinds of stream share the line splitter: the managed-process `connect` stream
//! ([`ProcessFrame`]) and the `/exec?stream=true` stream ([`ExecFrame`]). Lines longer than
//! [`MAX_LINE_BYTES`] are rejected before they are buffered further. Blank lines, `:` comments
//! and SSE control lines (`event:`, `id:`, `retry:`) are skipped and a leading `data:` is
//! stripped, as the vendor's own parsers do.

use std::borrow::Cow;

use bytes::{Buf, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::{Error, Result};

/// The largest frame (one NDJSON line, without its newline) accepted.
pub const MAX_LINE_BYTES: usize = 1_048_576;

pub const FRAME_TOO_LARGE: &str = "CreateOS process frame is too large.";
pub const INVALID_FRAME: &str = "CreateOS returned an invalid process frame.";
pub const INVALID_SEQ: &str = "CreateOS process sequence is invalid.";
pub const INVALID_OUTPUT: &str = "CreateOS process output is invalid.";
pub const EXIT_STATUS_MISSING: &str = "CreateOS process exit status is missing.";
pub const OUTPUT_EVICTED: &str = "CreateOS process output was evicted before it could be read.";
pub const STREAM_ERROR: &str = "CreateOS process stream reported an error.";
pub const UNKNOWN_EVENT: &str = "CreateOS returned an unknown process event.";
pub const EXEC_STREAM_ERROR: &str = "CreateOS command stream reported an error.";
pub const INVALID_EXEC_EVENT: &str = "CreateOS returned an invalid command stream event.";

/// Splits a byte stream into lines of at most [`MAX_LINE_BYTES`].
#[derive(Default)]
pub struct LineSplitter {
    buf: BytesMut,
    /// How far `buf` has been searched for a newline already.
    scanned: usize,
}

impl LineSplitter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete line (without `\n` or a trailing `\r`), if one is buffered.
    pub fn next_line(&mut self) -> Result<Option<BytesMut>> {
        match memchr::memchr(b'\n', &self.buf[self.scanned..]) {
            Some(i) => {
                let end = self.scanned + i;
                self.scanned = 0;
                if end > MAX_LINE_BYTES + 1 {
                    return Err(Error::Protocol(FRAME_TOO_LARGE));
                }
                let mut line = self.buf.split_to(end);
                self.buf.advance(1);
                if line.last() == Some(&b'\r') {
                    line.truncate(line.len() - 1);
                }
                if line.len() > MAX_LINE_BYTES {
                    return Err(Error::Protocol(FRAME_TOO_LARGE));
                }
                Ok(Some(line))
            }
            None => {
                self.scanned = self.buf.len();
                if self.buf.len() > MAX_LINE_BYTES + 1 {
                    return Err(Error::Protocol(FRAME_TOO_LARGE));
                }
                Ok(None)
            }
        }
    }

    /// What is left when the stream ends (a last line without a newline), if anything.
    pub fn finish(&mut self) -> Result<Option<BytesMut>> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let mut line = std::mem::take(&mut self.buf);
        self.scanned = 0;
        if line.last() == Some(&b'\r') {
            line.truncate(line.len() - 1);
        }
        if line.len() > MAX_LINE_BYTES {
            return Err(Error::Protocol(FRAME_TOO_LARGE));
        }
        Ok(Some(line))
    }
}

/// The JSON payload of a line, or `None` for a line to skip (blank, SSE comment or control).
pub fn payload(line: &[u8]) -> Option<&[u8]> {
    let trimmed = line.trim_ascii();
    if trimmed.is_empty() || trimmed[0] == b':' {
        return None;
    }
    for control in [&b"event:"[..], b"id:", b"retry:"] {
        if trimmed.starts_with(control) {
            return None;
        }
    }
    if let Some(rest) = trimmed.strip_prefix(b"data:") {
        let rest = rest.trim_ascii();
        return if rest.is_empty() { None } else { Some(rest) };
    }
    Some(trimmed)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    Stdout,
    Stderr,
    Pty,
}

impl StreamKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StreamKind::Stdout => "stdout",
            StreamKind::Stderr => "stderr",
            StreamKind::Pty => "pty",
        }
    }
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessExit {
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
}

/// One frame of a managed-process `connect` stream.
#[derive(Debug, PartialEq)]
pub enum ProcessFrame {
    Data {
        seq: u64,
        stream: StreamKind,
        bytes: Vec<u8>,
    },
    Heartbeat,
    /// The process exited. `tree_exited` and `newest_seq` (the last data seq) are used when
    /// the server sends them; the vendor documents neither, so a client asks when they are
    /// missing.
    Exit {
        exit: ProcessExit,
        tree_exited: Option<bool>,
        newest_seq: Option<u64>,
    },
    /// An `error` frame. `evicted` when the server says the output was evicted.
    Error {
        evicted: bool,
    },
}

#[derive(Deserialize)]
struct RawProcessFrame<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow)]
    seq: Option<&'a RawValue>,
    #[serde(borrow)]
    stream: Option<&'a RawValue>,
    #[serde(borrow)]
    data_base64: Option<&'a RawValue>,
    #[serde(borrow)]
    exit_code: Option<&'a RawValue>,
    #[serde(borrow)]
    signal: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
    #[serde(borrow)]
    tree_exited: Option<&'a RawValue>,
    #[serde(borrow)]
    newest_seq: Option<&'a RawValue>,
}

/// A JSON string value without copying when it has no escapes.
fn raw_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    let s = raw.get();
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains('\\') {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(s).ok().map(Cow::Owned)
}

fn raw_value(raw: Option<&RawValue>) -> serde_json::Value {
    raw.and_then(|r| serde_json::from_str(r.get()).ok()).unwrap_or(serde_json::Value::Null)
}

/// A JSON number that is a safe integer (|n| ≤ 2^53 − 1), as JavaScript's
/// `Number.isSafeInteger` would accept it.
fn safe_integer(v: &serde_json::Value) -> Option<i64> {
    const MAX_SAFE: f64 = 9_007_199_254_740_991.0;
    let n = v.as_number()?;
    if let Some(i) = n.as_i64() {
        return (i.unsigned_abs() <= MAX_SAFE as u64).then_some(i);
    }
    let f = n.as_f64()?;
    (f.fract() == 0.0 && f.abs() <= MAX_SAFE).then_some(f as i64)
}

/// A signal name such as `SIGKILL`.
pub fn is_signal_name(s: &str) -> bool {
    s.len() > 3
        && s.len() <= 32
        && s.starts_with("SIG")
        && s[3..].bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
}

/// The exit status from `exit_code`/`signal` values; at least one must be valid.
pub fn exit_status(exit_code: &serde_json::Value, signal: &serde_json::Value) -> Result<ProcessExit> {
    let code = safe_integer(exit_code).and_then(|c| i32::try_from(c).ok());
    let sig = signal.as_str().filter(|s| is_signal_name(s)).map(str::to_owned);
    if code.is_none() && sig.is_none() {
        return Err(Error::Protocol(EXIT_STATUS_MISSING));
    }
    Ok(ProcessExit { exit_code: code, signal: sig })
}

/// A frame is a JSON object (serde would also read a struct from an array).
fn is_object(payload: &[u8]) -> bool {
    payload.trim_ascii_start().first() == Some(&b'{')
}

/// Parses one `connect` frame (the payload of a line).
pub fn parse_process_frame(payload: &[u8]) -> Result<ProcessFrame> {
    if !is_object(payload) {
        return Err(Error::Protocol(INVALID_FRAME));
    }
    let raw: RawProcessFrame<'_> = serde_json::from_slice(payload).map_err(|_| Error::Protocol(INVALID_FRAME))?;
    let kind = raw.kind.and_then(raw_str);
    match kind.as_deref() {
        Some("heartbeat") => Ok(ProcessFrame::Heartbeat),
        Some("data") => {
            let seq = safe_integer(&raw_value(raw.seq)).filter(|s| *s >= 1).ok_or(Error::Protocol(INVALID_SEQ))? as u64;
            let stream = match raw.stream.and_then(raw_str).as_deref() {
                Some("stdout") => StreamKind::Stdout,
                Some("stderr") => StreamKind::Stderr,
                Some("pty") => StreamKind::Pty,
                _ => return Err(Error::Protocol(INVALID_OUTPUT)),
            };
            let data = raw.data_base64.and_then(raw_str).ok_or(Error::Protocol(INVALID_OUTPUT))?;
            let bytes =
                base64_simd::STANDARD.decode_to_vec(data.as_bytes()).map_err(|_| Error::Protocol(INVALID_OUTPUT))?;
            Ok(ProcessFrame::Data { seq, stream, bytes })
        }
        Some("exit") => {
            let exit = exit_status(&raw_value(raw.exit_code), &raw_value(raw.signal))?;
            let tree_exited = raw_value(raw.tree_exited).as_bool();
            let newest_seq = match raw.newest_seq {
                None => None,
                Some(n) => {
                    Some(safe_integer(&raw_value(Some(n))).filter(|n| *n >= 0).ok_or(Error::Protocol(INVALID_SEQ))?
                        as u64)
                }
            };
            Ok(ProcessFrame::Exit { exit, tree_exited, newest_seq })
        }
        Some("error") => {
            let evicted = raw.error.and_then(raw_str).as_deref() == Some("output_offset_expired");
            Ok(ProcessFrame::Error { evicted })
        }
        _ => Err(Error::Protocol(UNKNOWN_EVENT)),
    }
}

/// One frame of an `/exec?stream=true` stream. One frame may carry several fields; they are
/// reported in this order: stdout, stderr, error, exit code.
#[derive(Debug, Default, PartialEq)]
pub struct ExecFrame {
    pub heartbeat: bool,
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    pub error: bool,
    pub exit_code: Option<i32>,
}

#[derive(Deserialize)]
struct RawExecFrame {
    #[serde(default)]
    hb: serde_json::Value,
    #[serde(default)]
    stdout: serde_json::Value,
    #[serde(default)]
    stderr: serde_json::Value,
    #[serde(default)]
    error: serde_json::Value,
    #[serde(default)]
    exit_code: serde_json::Value,
}

pub fn parse_exec_frame(payload: &[u8]) -> Result<ExecFrame> {
    if !is_object(payload) {
        return Err(Error::Protocol(INVALID_EXEC_EVENT));
    }
    let raw: RawExecFrame = serde_json::from_slice(payload).map_err(|_| Error::Protocol(INVALID_EXEC_EVENT))?;
    let text = |v: serde_json::Value| match v {
        serde_json::Value::String(s) => Ok(Some(s)),
        serde_json::Value::Null => Ok(None),
        _ => Err(Error::Protocol(INVALID_EXEC_EVENT)),
    };
    let frame = ExecFrame {
        heartbeat: raw.hb == serde_json::Value::Bool(true),
        stdout: text(raw.stdout)?,
        stderr: text(raw.stderr)?,
        error: !raw.error.is_null(),
        exit_code: match &raw.exit_code {
            serde_json::Value::Null => None,
            v => Some(safe_integer(v).and_then(|c| i32::try_from(c).ok()).ok_or(Error::Protocol(INVALID_EXEC_EVENT))?),
        },
    };
    if !frame.heartbeat && frame.stdout.is_none() && frame.stderr.is_none() && !frame.error && frame.exit_code.is_none()
    {
        return Err(Error::Protocol(INVALID_EXEC_EVENT));
    }
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(chunks: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        let mut s = LineSplitter::new();
        let mut out = vec![];
        for c in chunks {
            s.push(c);
            while let Some(l) = s.next_line()? {
                out.push(l.to_vec());
            }
        }
        if let Some(l) = s.finish()? {
            out.push(l.to_vec());
        }
        Ok(out)
    }

    #[test]
    fn splits_across_chunks_and_strips_cr() {
        let got = lines(&[b"ab", b"c\r\nde", b"f\n\n", b"tail"]).unwrap();
        assert_eq!(got, vec![b"abc".to_vec(), b"def".to_vec(), vec![], b"tail".to_vec()]);
    }

    #[test]
    fn rejects_oversized_lines_without_buffering_them_whole() {
        let big = vec![b'x'; MAX_LINE_BYTES + 2];
        assert!(matches!(lines(&[&big]), Err(Error::Protocol(FRAME_TOO_LARGE))));
        let ok = vec![b'x'; MAX_LINE_BYTES];
        assert_eq!(lines(&[&ok, b"\n"]).unwrap().len(), 1);
        let mut over = vec![b'x'; MAX_LINE_BYTES + 1];
        over.push(b'\n');
        assert!(lines(&[&over]).is_err());
    }

    #[test]
    fn skips_sse_noise_and_strips_data_prefix() {
        assert_eq!(payload(b""), None);
        assert_eq!(payload(b"   "), None);
        assert_eq!(payload(b": keep-alive"), None);
        assert_eq!(payload(b"event: x"), None);
        assert_eq!(payload(b"id: 4"), None);
        assert_eq!(payload(b"retry: 10"), None);
        assert_eq!(payload(b"data: {\"a\":1}"), Some(&b"{\"a\":1}"[..]));
        assert_eq!(payload(b"{\"a\":1}"), Some(&b"{\"a\":1}"[..]));
    }

    #[test]
    fn parses_process_frames_strictly() {
        let f = parse_process_frame(br#"{"type":"data","seq":3,"stream":"stdout","data_base64":"aGk="}"#).unwrap();
        assert_eq!(f, ProcessFrame::Data { seq: 3, stream: StreamKind::Stdout, bytes: b"hi".to_vec() });
        assert_eq!(parse_process_frame(br#"{"type":"heartbeat"}"#).unwrap(), ProcessFrame::Heartbeat);
        let bad_seq = [
            r#"{"type":"data","seq":0,"stream":"stdout","data_base64":""}"#,
            r#"{"type":"data","seq":"1","stream":"stdout","data_base64":""}"#,
            r#"{"type":"data","seq":1.5,"stream":"stdout","data_base64":""}"#,
            r#"{"type":"data","seq":9007199254740992,"stream":"stdout","data_base64":""}"#,
            r#"{"type":"data","stream":"stdout","data_base64":""}"#,
        ];
        for b in bad_seq {
            assert!(matches!(parse_process_frame(b.as_bytes()), Err(Error::Protocol(INVALID_SEQ))), "{b}");
        }
        for b in [
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"a"}"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk"}"#,
            r#"{"type":"data","seq":1,"stream":"other","data_base64":"aGk="}"#,
            r#"{"type":"data","seq":1,"stream":"stdout","data_base64":5}"#,
        ] {
            assert!(matches!(parse_process_frame(b.as_bytes()), Err(Error::Protocol(INVALID_OUTPUT))), "{b}");
        }
        assert_eq!(
            parse_process_frame(br#"{"type":"exit","exit_code":null,"signal":"SIGKILL","tree_exited":true}"#).unwrap(),
            ProcessFrame::Exit {
                exit: ProcessExit { exit_code: None, signal: Some("SIGKILL".into()) },
                tree_exited: Some(true),
                newest_seq: None
            }
        );
        assert!(matches!(parse_process_frame(br#"{"type":"exit"}"#), Err(Error::Protocol(EXIT_STATUS_MISSING))));
        assert!(matches!(
            parse_process_frame(br#"{"type":"exit","signal":"kill"}"#),
            Err(Error::Protocol(EXIT_STATUS_MISSING))
        ));
        assert_eq!(
            parse_process_frame(br#"{"type":"error","error":"output_offset_expired"}"#).unwrap(),
            ProcessFrame::Error { evicted: true }
        );
        assert!(matches!(parse_process_frame(br#"{"type":"nope"}"#), Err(Error::Protocol(UNKNOWN_EVENT))));
        assert!(matches!(parse_process_frame(b"[1]"), Err(Error::Protocol(INVALID_FRAME))));
        // serde reads structs from arrays too; frames are objects only.
        assert!(matches!(
            parse_process_frame(br#"["data",1,"stdout","aGk=",null,null,null,null]"#),
            Err(Error::Protocol(INVALID_FRAME))
        ));
        assert!(parse_exec_frame(br#"["%",""]"#).is_err());
        assert!(matches!(
            parse_process_frame(br#"{"type":"exit","exit_code":0,"newest_seq":7}"#).unwrap(),
            ProcessFrame::Exit { newest_seq: Some(7), .. }
        ));
        assert!(parse_process_frame(br#"{"type":"exit","exit_code":0,"newest_seq":-1}"#).is_err());
        assert!(matches!(parse_process_frame(b"{"), Err(Error::Protocol(INVALID_FRAME))));
    }

    #[test]
    fn exec_frames_carry_every_field() {
        let f = parse_exec_frame(br#"{"stdout":"a","stderr":"b","exit_code":2}"#).unwrap();
        assert_eq!(f.stdout.as_deref(), Some("a"));
        assert_eq!(f.stderr.as_deref(), Some("b"));
        assert_eq!(f.exit_code, Some(2));
        assert!(parse_exec_frame(br#"{"hb":true}"#).unwrap().heartbeat);
        assert!(parse_exec_frame(br#"{"error":"x","exit_code":1}"#).unwrap().error);
        assert!(parse_exec_frame(br#"{"what":1}"#).is_err());
        assert!(parse_exec_frame(br#"{"exit_code":1.5}"#).is_err());
        assert!(parse_exec_frame(br#"{"stdout":7}"#).is_err());
    }
}
