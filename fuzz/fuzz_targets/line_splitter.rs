//! NDJSON line splitter + `payload`: any byte stream, cut into any chunks.
//!
//! Input layout: byte 0 = chunking seed; byte 1 bit 0 = "inflate" (an `0xFF n` pair in the
//! data becomes `n * 16 KiB` of `'x'`, so lines around `MAX_LINE_BYTES` are reachable from a
//! small input); the rest is the stream. Checked against a reference split of the whole
//! stream: same lines in the same order, an error exactly when a line is too long, every
//! line without `\n`, at most `MAX_LINE_BYTES` long, and `payload` a trimmed, non-empty
//! sub-slice of its line.
#![no_main]

use createos_execute_core::stream::{payload, LineSplitter, MAX_LINE_BYTES};
use libfuzzer_sys::fuzz_target;

fn build(data: &[u8]) -> (u8, Vec<u8>) {
    if data.len() < 2 {
        return (0, data.to_vec());
    }
    let seed = data[0];
    let inflate = data[1] & 1 == 1;
    let body = &data[2..];
    if !inflate {
        return (seed, body.to_vec());
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < body.len() {
        if body[i] == 0xFF && i + 1 < body.len() {
            let n = usize::from(body[i + 1] % 80);
            out.resize(out.len() + n * 16 * 1024, b'x');
            i += 2;
        } else {
            out.push(body[i]);
            i += 1;
        }
    }
    (seed, out)
}

/// The reference: lines of the whole stream; `Err(k)` = line k (0-based) is too long.
fn reference(stream: &[u8]) -> (Vec<&[u8]>, Option<usize>) {
    let mut lines = Vec::new();
    let mut parts: Vec<&[u8]> = stream.split(|&b| b == b'\n').collect();
    // `split` yields a trailing "" after a final '\n': that is no line.
    let last = parts.pop().unwrap_or(&[]);
    let has_tail = !last.is_empty();
    for p in parts.into_iter().chain(has_tail.then_some(last)) {
        let l = p.strip_suffix(b"\r").unwrap_or(p);
        if l.len() > MAX_LINE_BYTES {
            let k = lines.len();
            return (lines, Some(k));
        }
        lines.push(l);
    }
    (lines, None)
}

fn check_payload(line: &[u8]) {
    if let Some(p) = payload(line) {
        assert!(!p.is_empty());
        assert!(!p[0].is_ascii_whitespace() && !p[p.len() - 1].is_ascii_whitespace());
        let start = p.as_ptr() as usize - line.as_ptr() as usize;
        assert!(start + p.len() <= line.len(), "payload is not a sub-slice");
    }
}

fuzz_target!(|data: &[u8]| {
    let (seed, stream) = build(data);
    let (want, too_long) = reference(&stream);

    let mut splitter = LineSplitter::new();
    let mut got: Vec<Vec<u8>> = Vec::new();
    let mut error = false;
    let mut pos = 0;
    let mut state = u32::from(seed) | 1;
    'outer: while pos < stream.len() {
        // xorshift chunk sizes: mostly small, sometimes large.
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let n = match state % 4 {
            0 => 1,
            1 => (state as usize >> 8) % 16 + 1,
            2 => (state as usize >> 8) % 4096 + 1,
            _ => (state as usize >> 8) % (2 * MAX_LINE_BYTES) + 1,
        };
        let end = (pos + n).min(stream.len());
        splitter.push(&stream[pos..end]);
        pos = end;
        loop {
            match splitter.next_line() {
                Ok(Some(l)) => {
                    assert!(l.len() <= MAX_LINE_BYTES);
                    assert!(!l.contains(&b'\n'));
                    check_payload(&l);
                    got.push(l.to_vec());
                }
                Ok(None) => break,
                Err(_) => {
                    error = true;
                    break 'outer;
                }
            }
        }
    }
    if !error {
        match splitter.finish() {
            Ok(Some(l)) => {
                assert!(l.len() <= MAX_LINE_BYTES);
                check_payload(&l);
                got.push(l.to_vec());
            }
            Ok(None) => {}
            Err(_) => error = true,
        }
    }
    assert_eq!(error, too_long.is_some(), "error iff a line is too long");
    match too_long {
        // Lines before the oversized one all came out (the splitter may not have reached
        // them all when it stopped early only if they came after: they cannot).
        Some(k) => assert_eq!(got.len(), k),
        None => assert_eq!(got.len(), want.len()),
    }
    for (g, w) in got.iter().zip(want.iter()) {
        assert_eq!(g.as_slice(), *w);
    }
});
