//! Output capture: a streaming UTF-8 decoder per stream, a fixed-size tail kept in UTF-16
//! units (what JavaScript's `string.length` counts), and the log sink.
//!
//! Memory is bounded by design: the tail keeps pieces of at most [`PIECE_BYTES`] and drops
//! whole pieces from the front once the rest already holds the cap, so nothing is re-copied
//! per chunk; the exact cut happens once, in [`Tail::into_string`].

use std::collections::VecDeque;

use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::stream::StreamKind;

/// Each stream keeps only its last 4,194,304 JavaScript characters.
pub const MAX_CAPTURE_UNITS: usize = 4_194_304;
const PIECE_BYTES: usize = 64 * 1024;

/// UTF-16 code units of valid UTF-8 text: one per char, two for chars outside the BMP.
pub fn utf16_len(s: &str) -> usize {
    // The common case, at memory speed: ASCII is one unit per byte.
    if s.is_ascii() {
        return s.len();
    }
    let b = s.as_bytes();
    let continuation = b.iter().filter(|&&x| (x & 0xC0) == 0x80).count();
    let four_byte = b.iter().filter(|&&x| x >= 0xF0).count();
    b.len() - continuation + four_byte
}

/// Decodes a byte stream as UTF-8 like Node's `StringDecoder`: a sequence split across
/// chunks is joined, invalid bytes become U+FFFD (one per maximal invalid subpart).
#[derive(Default)]
pub struct Utf8Decoder {
    pending: Vec<u8>,
}

impl Utf8Decoder {
    /// Decodes `bytes`, calling `emit` with each run of text (in order).
    pub fn write(&mut self, mut bytes: &[u8], emit: &mut impl FnMut(&str)) {
        // Finish a sequence left over from the previous chunk with as few bytes as it needs.
        while !self.pending.is_empty() && !bytes.is_empty() {
            let expected = sequence_len(self.pending[0]);
            let take = expected.saturating_sub(self.pending.len()).min(bytes.len());
            let mut head = std::mem::take(&mut self.pending);
            head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            self.decode(&head, emit);
        }
        if !bytes.is_empty() {
            self.decode(bytes, emit);
        }
    }

    fn decode(&mut self, bytes: &[u8], emit: &mut impl FnMut(&str)) {
        if let Ok(s) = std::str::from_utf8(bytes) {
            if !s.is_empty() {
                emit(s);
            }
            return;
        }
        let mut chunks = bytes.utf8_chunks().peekable();
        while let Some(chunk) = chunks.next() {
            if !chunk.valid().is_empty() {
                emit(chunk.valid());
            }
            let invalid = chunk.invalid();
            if invalid.is_empty() {
                continue;
            }
            let last = chunks.peek().is_none();
            if last && is_incomplete_prefix(invalid) {
                self.pending.extend_from_slice(invalid);
            } else {
                emit("\u{FFFD}");
            }
        }
    }

    /// Ends the stream: an incomplete trailing sequence becomes U+FFFD.
    pub fn finish(&mut self, emit: &mut impl FnMut(&str)) {
        if !self.pending.is_empty() {
            self.pending.clear();
            emit("\u{FFFD}");
        }
    }
}

/// True when `b` is the start of a valid UTF-8 sequence that only lacks bytes.
fn sequence_len(lead: u8) -> usize {
    match lead {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => 1,
    }
}

fn is_incomplete_prefix(b: &[u8]) -> bool {
    let Some(&lead) = b.first() else { return false };
    let len = sequence_len(lead);
    if len == 1 || b.len() >= len {
        return false;
    }
    // Check the second byte's range rules, then continuation bytes.
    for (i, &x) in b.iter().enumerate().skip(1) {
        let ok = if i == 1 {
            match lead {
                0xE0 => (0xA0..=0xBF).contains(&x),
                0xED => (0x80..=0x9F).contains(&x),
                0xF0 => (0x90..=0xBF).contains(&x),
                0xF4 => (0x80..=0x8F).contains(&x),
                _ => (0x80..=0xBF).contains(&x),
            }
        } else {
            (0x80..=0xBF).contains(&x)
        };
        if !ok {
            return false;
        }
    }
    true
}

/// The last `cap` UTF-16 units of everything appended.
pub struct Tail {
    cap: usize,
    pieces: VecDeque<String>,
    units: VecDeque<usize>,
    total: usize,
    truncated: bool,
}

impl Tail {
    pub fn new(cap: usize) -> Self {
        Tail { cap, pieces: VecDeque::new(), units: VecDeque::new(), total: 0, truncated: false }
    }

    pub fn push(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        let n = utf16_len(s);
        match (self.pieces.back_mut(), self.units.back_mut()) {
            (Some(last), Some(u)) if last.len() + s.len() <= PIECE_BYTES => {
                last.push_str(s);
                *u += n;
            }
            _ => {
                self.pieces.push_back(s.to_owned());
                self.units.push_back(n);
            }
        }
        self.total += n;
        if self.total > self.cap {
            self.truncated = true;
        }
        while self.units.len() > 1 && self.total - self.units[0] >= self.cap {
            self.total -= self.units.pop_front().unwrap_or(0);
            self.pieces.pop_front();
        }
    }

    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The kept text: at most `cap` units, never starting inside a surrogate pair.
    pub fn into_string(mut self) -> String {
        let mut skip = self.total.saturating_sub(self.cap);
        if let Some(front) = self.pieces.front_mut() {
            if skip > 0 {
                let mut cut = front.len();
                for (i, c) in front.char_indices() {
                    if skip == 0 {
                        cut = i;
                        break;
                    }
                    // A char outside the BMP is two units: dropping half of it drops all.
                    skip = skip.saturating_sub(c.len_utf16());
                }
                front.drain(..cut);
            }
        }
        let len = self.pieces.iter().map(String::len).sum();
        let mut out = String::with_capacity(len);
        for p in &self.pieces {
            out.push_str(p);
        }
        out
    }
}

/// A chunk of decoded text for the caller's `log(stream, text)`.
pub type LogLine = (StreamKind, String);

/// One stream's decoder and tail.
struct Capture {
    decoder: Utf8Decoder,
    tail: Tail,
}

/// Captures stdout and stderr and forwards every decoded chunk, in order, to the log sink.
/// The sink is a bounded channel: a slow consumer slows the reader (backpressure).
pub struct Output {
    stdout: Capture,
    stderr: Capture,
    sink: Option<mpsc::Sender<LogLine>>,
    scratch: Vec<(StreamKind, String)>,
}

/// What a finished capture holds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Captured {
    pub stdout: String,
    pub stderr: String,
    pub truncated: bool,
}

impl Output {
    pub fn new(sink: Option<mpsc::Sender<LogLine>>) -> Self {
        Self::with_cap(MAX_CAPTURE_UNITS, sink)
    }

    pub fn with_cap(cap: usize, sink: Option<mpsc::Sender<LogLine>>) -> Self {
        let capture = || Capture { decoder: Utf8Decoder::default(), tail: Tail::new(cap) };
        Output { stdout: capture(), stderr: capture(), sink, scratch: Vec::new() }
    }

    fn capture(&mut self, stream: StreamKind) -> &mut Capture {
        match stream {
            StreamKind::Stderr => &mut self.stderr,
            _ => &mut self.stdout,
        }
    }

    /// Decodes and records `bytes` of `stream`; waits while the log sink is full.
    pub async fn write(&mut self, stream: StreamKind, bytes: &[u8]) -> Result<()> {
        let logging = self.sink.is_some();
        let mut texts = std::mem::take(&mut self.scratch);
        {
            let cap = self.capture(stream);
            let Capture { decoder, tail } = cap;
            decoder.write(bytes, &mut |s: &str| {
                tail.push(s);
                if logging {
                    texts.push((stream, s.to_owned()));
                }
            });
        }
        self.send(&mut texts).await;
        self.scratch = texts;
        Ok(())
    }

    async fn send(&mut self, texts: &mut Vec<LogLine>) {
        let Some(sink) = &self.sink else {
            texts.clear();
            return;
        };
        let mut closed = false;
        for line in texts.drain(..) {
            // A closed consumer (the host stopped listening) stops logging, not capturing.
            if !closed && sink.send(line).await.is_err() {
                closed = true;
            }
        }
        if closed {
            self.sink = None;
        }
    }

    /// Flushes the decoders (a dangling partial sequence becomes U+FFFD) and returns the tails.
    pub async fn finish(mut self) -> Captured {
        let mut texts = Vec::new();
        for stream in [StreamKind::Stdout, StreamKind::Stderr] {
            let logging = self.sink.is_some();
            let Capture { decoder, tail } = self.capture(stream);
            decoder.finish(&mut |s: &str| {
                tail.push(s);
                if logging {
                    texts.push((stream, s.to_owned()));
                }
            });
        }
        self.send(&mut texts).await;
        let truncated = self.stdout.tail.truncated() || self.stderr.tail.truncated();
        Captured { stdout: self.stdout.tail.into_string(), stderr: self.stderr.tail.into_string(), truncated }
    }
}

/// Rejects text written to the wrong stream kind (a pipe process must not send PTY output).
pub fn pipe_stream(stream: StreamKind) -> Result<StreamKind> {
    match stream {
        StreamKind::Pty => Err(Error::Protocol("CreateOS pipe process returned PTY output.")),
        s => Ok(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_chunks(chunks: &[&[u8]]) -> String {
        let mut d = Utf8Decoder::default();
        let mut out = String::new();
        for c in chunks {
            d.write(c, &mut |s| out.push_str(s));
        }
        d.finish(&mut |s| out.push_str(s));
        out
    }

    #[test]
    fn decodes_sequences_split_across_chunks() {
        let text = "aé€😀z";
        let bytes = text.as_bytes();
        for i in 0..bytes.len() {
            for j in i..bytes.len() {
                let got = decode_chunks(&[&bytes[..i], &bytes[i..j], &bytes[j..]]);
                assert_eq!(got, text, "split at {i},{j}");
            }
        }
        // Byte by byte.
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(decode_chunks(&singles), text);
    }

    #[test]
    fn invalid_bytes_become_replacement_characters_like_lossy_decoding() {
        let cases: &[&[u8]] = &[
            b"a\xffb",
            b"\xe2\x82",
            b"\xf0\x9f\x98",
            b"\xc0\xaf",
            b"\xed\xa0\x80",
            b"ok\xe2\x82(",
            b"\xf4\x90\x80\x80",
        ];
        for bytes in cases {
            let whole = String::from_utf8_lossy(bytes).into_owned();
            assert_eq!(decode_chunks(&[bytes]), whole, "{bytes:?}");
            let singles: Vec<&[u8]> = bytes.chunks(1).collect();
            assert_eq!(decode_chunks(&singles), whole, "bytewise {bytes:?}");
        }
    }

    #[test]
    fn tail_keeps_the_last_units_and_never_splits_a_pair() {
        let mut t = Tail::new(5);
        t.push("abc");
        t.push("def");
        assert!(t.truncated());
        assert_eq!(t.into_string(), "bcdef");
        let mut t = Tail::new(3);
        t.push("a😀b"); // 4 units: dropping "a" keeps exactly 3
        assert_eq!(t.into_string(), "😀b");
        let mut t = Tail::new(3);
        t.push("😀ab"); // keeping 3 would split the pair → keep "ab" only
        assert_eq!(t.into_string(), "ab");
        let mut t = Tail::new(4);
        t.push("a😀b");
        assert!(!t.truncated());
        assert_eq!(t.into_string(), "a😀b");
    }

    #[test]
    fn utf16_len_matches_std() {
        for s in ["", "abc", "é", "€", "😀", "a😀é€"] {
            assert_eq!(utf16_len(s), s.encode_utf16().count());
        }
    }

    #[tokio::test]
    async fn output_logs_in_order_and_bounds_the_tail() {
        let (tx, mut rx) = mpsc::channel(4);
        let mut out = Output::with_cap(4, Some(tx));
        let reader = tokio::spawn(async move {
            let mut seen = vec![];
            while let Some(l) = rx.recv().await {
                seen.push(l);
            }
            seen
        });
        out.write(StreamKind::Stdout, b"hello ").await.unwrap();
        out.write(StreamKind::Stderr, b"\xe2\x82").await.unwrap();
        out.write(StreamKind::Stderr, b"\xac").await.unwrap();
        out.write(StreamKind::Stdout, b"world").await.unwrap();
        let c = out.finish().await;
        assert_eq!(c.stdout, "orld");
        assert_eq!(c.stderr, "€");
        assert!(c.truncated);
        let seen = reader.await.unwrap();
        let joined: Vec<String> = seen.iter().map(|(s, t)| format!("{}:{}", s.as_str(), t)).collect();
        assert_eq!(joined, vec!["stdout:hello ", "stderr:€", "stdout:world"]);
    }
}
