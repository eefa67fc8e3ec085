//! Output capture: a streaming UTF-8 decoder per stream, a fixed-size tail kept in UTF-16
//! units (what JavaScript's `string.length` counts), and the log sink.
//!
//! Memory is bounded by design: the tail keeps pieces of at most [`PIECE_BYTES`] and drops
//! whole pieces from the front once the rest already holds the cap, so nothing is re-copied
//! per chunk; the exact cut happens once, in [`Tail::into_text`].

use std::collections::VecDeque;
use std::fmt::Write as _;

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
    // One unit per lead byte, one more per 4-byte lead: at most 2 per byte, so a byte-wide
    // sum of 127 bytes cannot overflow (and vectorizes 16 or 32 lanes wide).
    s.as_bytes()
        .chunks(127)
        .map(|c| {
            let units = c.iter().fold(0u8, |n, &x| n + u8::from(x.cast_signed() >= -64) + u8::from(x >= 0xF0));
            usize::from(units)
        })
        .sum()
}

/// Bytes per block of [`to_utf16`].
const UTF16_BLOCK: usize = 256;

/// `s` as UTF-16 code units (what a JS string holds), for handing text to JS.
///
/// Text goes through std's `encode_utf16`, fast when character lengths follow a pattern (real
/// text); a block dense with U+FFFD (decoded binary output, where 1- and 3-byte characters
/// alternate at random) goes through a branch-free conversion byte by byte instead.
pub fn to_utf16(s: &str) -> Vec<u16> {
    // Exact, plus what one block's scratch room may add before it is cut back.
    let mut out = Vec::with_capacity(utf16_len(s) + UTF16_BLOCK + 8);
    let mut rest = s;
    while !rest.is_empty() {
        let mut end = UTF16_BLOCK.min(rest.len());
        while !rest.is_char_boundary(end) {
            end += 1;
        }
        let (block, tail) = rest.split_at(end);
        rest = tail;
        // (At most 87 EF bytes fit in a block of valid UTF-8: a byte-wide count.)
        if block.bytes().fold(0u8, |n, b| n + u8::from(b == 0xEF)) >= 8 {
            // At most one unit per byte, and room for the last 2-unit write.
            let o = out.len();
            out.resize(o + block.len() + 2, 0);
            let n = utf16_block(block.as_bytes(), &mut out[o..]);
            out.truncate(o + n);
        } else {
            out.extend(block.encode_utf16());
        }
    }
    out
}

/// UTF-16 of `bytes`, valid UTF-8 of at most `UTF16_BLOCK + 3` bytes, into `dst` (at least
/// `bytes.len() + 2` long); returns the units written. Every lane computes
/// what its byte would start (one unit, a surrogate pair, or nothing for a continuation byte)
/// from it and the three bytes after it; only the writes are sequential.
fn utf16_block(bytes: &[u8], dst: &mut [u16]) -> usize {
    let m = bytes.len();
    let mut win = [0u8; UTF16_BLOCK + 6];
    win[..m].copy_from_slice(bytes);
    let mut first = [0u16; UTF16_BLOCK + 3];
    let mut second = [0u16; UTF16_BLOCK + 3];
    let mut units = [0u8; UTF16_BLOCK + 3];
    for j in 0..m {
        let [b0, b1, b2, b3] = [win[j], win[j + 1], win[j + 2], win[j + 3]];
        let [w0, w1, w2, w3] = [b0, b1, b2, b3].map(u16::from);
        let two = (w0 & 0x1F) << 6 | (w1 & 0x3F);
        let three = (w0 & 0x0F) << 12 | (w1 & 0x3F) << 6 | (w2 & 0x3F);
        // U+10000.. as a pair: high = D800 + ((cp - 0x10000) >> 10), low = DC00 + (cp & 3FF).
        let high = 0xD7C0u16.wrapping_add((w0 & 0x07) << 8 | (w1 & 0x3F) << 2 | ((w2 >> 4) & 0x03));
        let low = 0xDC00 | (w2 & 0x0F) << 6 | (w3 & 0x3F);
        let is = |c: bool| 0u16.wrapping_sub(u16::from(c));
        let four = b0 >= 0xF0;
        first[j] = (w0 & is(b0 < 0x80))
            | (two & is((0xC0..0xE0).contains(&b0)))
            | (three & is((0xE0..0xF0).contains(&b0)))
            | (high & is(four));
        second[j] = low;
        units[j] = u8::from(b0 & 0xC0 != 0x80) + u8::from(four);
    }
    let mut o = 0;
    for j in 0..m {
        dst[o] = first[j];
        dst[o + 1] = second[j];
        o += usize::from(units[j]);
    }
    o
}

/// Decodes a byte stream as UTF-8 like Node's `StringDecoder`: a sequence split across
/// chunks is joined, invalid bytes become U+FFFD (one per maximal invalid subpart, exactly
/// what `String::from_utf8_lossy` of the whole stream gives).
///
/// Valid input is checked with SIMD (`simdutf8`) and copied once. Invalid input goes to a
/// branch-free block decoder ([`replace_block`]) that decides every byte of a block
/// independently, so random bytes decode at about the speed of text; after a block without
/// errors the SIMD check takes over again, so rare bad bytes in text cost one or two blocks.
#[derive(Default)]
pub struct Utf8Decoder {
    pending: Vec<u8>,
    /// Reused output of the block decoder: at most [`SCRATCH_BYTES`] plus one block.
    scratch: Vec<u8>,
}

/// Bytes decoded per block by [`replace_block`].
const BLOCK: usize = 256;
/// The block decoder's output is handed over to the string in runs of about this size.
const SCRATCH_BYTES: usize = 48 * 1024;

impl Utf8Decoder {
    /// Decodes `bytes`, appending the text to `out`. A sequence cut off at the end is kept
    /// for the next call.
    pub fn decode(&mut self, bytes: &[u8], out: &mut String) {
        self.feed(bytes, out, Self::decode_whole);
    }

    /// Feeds `bytes` to `whole` (which decodes bytes that start a sequence), after finishing
    /// a sequence left over from the previous chunk with as few bytes as it needs.
    fn feed<O: ?Sized>(&mut self, mut bytes: &[u8], out: &mut O, whole: fn(&mut Self, &[u8], &mut O)) {
        while !self.pending.is_empty() && !bytes.is_empty() {
            let expected = sequence_len(self.pending[0]);
            let take = expected.saturating_sub(self.pending.len()).min(bytes.len());
            let mut head = std::mem::take(&mut self.pending);
            head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            whole(self, &head, out);
        }
        if !bytes.is_empty() {
            whole(self, bytes, out);
        }
    }

    /// Decodes `bytes`, calling `emit` once with the text (when there is any).
    pub fn write(&mut self, bytes: &[u8], emit: &mut impl FnMut(&str)) {
        let mut out = String::new();
        self.decode(bytes, &mut out);
        if !out.is_empty() {
            emit(&out);
        }
    }

    /// Decodes `bytes` (which start a new sequence), keeping a valid but incomplete
    /// sequence at the very end as pending.
    fn decode_whole(&mut self, bytes: &[u8], out: &mut String) {
        // A read usually ends inside a multi-byte sequence: only that end waits for more.
        let body = &bytes[..incomplete_tail_start(bytes)];
        match simdutf8::basic::from_utf8(body) {
            Ok(s) => out.push_str(s),
            Err(_) => self.lossy(body, out),
        }
        self.pending.extend_from_slice(&bytes[body.len()..]);
    }

    /// `String::from_utf8_lossy(bytes)` appended to `out`, for `bytes` that start a new
    /// sequence and end one (no incomplete sequence at the end).
    fn lossy(&mut self, bytes: &[u8], out: &mut String) {
        // Random bytes decode to about twice their length (U+FFFD is 3 bytes): grow once.
        out.reserve(2 * bytes.len());
        let start_len = out.len();
        let mut at = 0;
        while at < bytes.len() {
            // The valid run, at SIMD speed.
            match simdutf8::compat::from_utf8(&bytes[at..]) {
                Ok(s) => {
                    out.push_str(s);
                    break;
                }
                Err(e) => {
                    let valid = &bytes[at..at + e.valid_up_to()];
                    if let Ok(s) = simdutf8::basic::from_utf8(valid) {
                        out.push_str(s);
                    }
                    at += valid.len();
                }
            }
            // The invalid part, block by block, until a block comes out clean.
            match self.replace_run(bytes, at, out) {
                Some(next) => at = next,
                None => {
                    // The block decoder produced invalid UTF-8: a bug. Redo it all exactly.
                    debug_assert!(false, "block decoder produced invalid UTF-8");
                    out.truncate(start_len);
                    out.push_str(&String::from_utf8_lossy(bytes));
                    return;
                }
            }
        }
    }

    /// Decodes blocks of `bytes` from `at` (at least one) until a block needs no U+FFFD or
    /// the input ends; returns where it stopped, or `None` if the output was not UTF-8.
    fn replace_run(&mut self, bytes: &[u8], mut at: usize, out: &mut String) -> Option<usize> {
        // Room for a full run plus one block (3 bytes per input byte at most, and the
        // 4-byte writes of the last one).
        if self.scratch.len() < SCRATCH_BYTES + 3 * BLOCK + 8 {
            self.scratch.resize(SCRATCH_BYTES + 3 * BLOCK + 8, 0);
        }
        let mut pos = 0;
        loop {
            let (written, replaced) = replace_block(bytes, at, &mut self.scratch[pos..]);
            pos += written;
            at = (at + BLOCK).min(bytes.len());
            // Back to the SIMD check after a clean block, where a sequence starts.
            let done = at == bytes.len() || (!replaced && bytes[at] & 0xC0 != 0x80);
            if done || pos > SCRATCH_BYTES {
                // A sequence the block boundary cuts in two waits in the scratch buffer.
                let keep = if done { pos } else { whole_sequences_end(&self.scratch[..pos]) };
                out.push_str(simdutf8::basic::from_utf8(&self.scratch[..keep]).ok()?);
                self.scratch.copy_within(keep..pos, 0);
                pos -= keep;
            }
            if done {
                return Some(at);
            }
        }
    }

    /// [`Utf8Decoder::decode`], but appending UTF-16 code units (what a JS string holds) to
    /// `out`: exactly `String::from_utf8_lossy(..).encode_utf16()` of the whole stream, in one
    /// pass over the bytes (no UTF-8 text in between). Used when the text goes to JS anyway
    /// (`log`), where converting decoded text to UTF-16 would cost more than decoding it.
    pub fn decode_utf16(&mut self, bytes: &[u8], out: &mut Vec<u16>) {
        self.feed(bytes, out, Self::decode_whole_utf16);
    }

    fn decode_whole_utf16(&mut self, bytes: &[u8], out: &mut Vec<u16>) {
        let body = &bytes[..incomplete_tail_start(bytes)];
        match simdutf8::basic::from_utf8(body) {
            Ok(s) => push_utf16(s, out),
            Err(_) => lossy_utf16(body, out),
        }
        self.pending.extend_from_slice(&bytes[body.len()..]);
    }

    /// [`Utf8Decoder::finish_into`] for [`Utf8Decoder::decode_utf16`].
    pub fn finish_utf16(&mut self, out: &mut Vec<u16>) {
        if !self.pending.is_empty() {
            self.pending.clear();
            out.push(0xFFFD);
        }
    }

    /// Ends the stream: an incomplete trailing sequence becomes U+FFFD.
    pub fn finish_into(&mut self, out: &mut String) {
        if !self.pending.is_empty() {
            self.pending.clear();
            out.push('\u{FFFD}');
        }
    }

    /// Ends the stream: an incomplete trailing sequence becomes U+FFFD.
    pub fn finish(&mut self, emit: &mut impl FnMut(&str)) {
        let mut out = String::new();
        self.finish_into(&mut out);
        if !out.is_empty() {
            emit(&out);
        }
    }
}

/// All ones when `c`, else zero: the lane masks of [`replace_block`].
#[inline(always)]
fn mask(c: bool) -> u8 {
    0u8.wrapping_sub(u8::from(c))
}

/// The block of [`replace_block`] and [`replace_block_utf16`], classified lane by lane.
struct Lanes {
    /// `win[i] = bytes[at - 3 + i]`; zero (ASCII) outside `bytes`.
    win: [u8; BLOCK + 6],
    /// Per lane: the lane's lead has a subpart of at least 2 / 3 / 4 bytes.
    reach1: [u8; BLOCK + 3],
    reach2: [u8; BLOCK + 3],
    reach3: [u8; BLOCK + 3],
    /// The lane starts a valid sequence.
    valid: [u8; BLOCK + 3],
    /// Lanes in use.
    n: usize,
}

impl Lanes {
    /// Classifies the block `bytes[at..at + BLOCK]` (or what is left of it), without branches.
    #[inline(always)]
    fn classify(bytes: &[u8], at: usize) -> Lanes {
        let mut win = [0u8; BLOCK + 6];
        let lo = at.saturating_sub(3);
        let hi = (at + BLOCK + 3).min(bytes.len());
        let off = lo + 3 - at;
        win[off..off + (hi - lo)].copy_from_slice(&bytes[lo..hi]);
        // As i8, -128..=-65 is a continuation byte.
        let mut reach1 = [0u8; BLOCK + 3];
        let mut reach2 = [0u8; BLOCK + 3];
        let mut reach3 = [0u8; BLOCK + 3];
        let mut valid = [0u8; BLOCK + 3];
        // Only the lanes in use: a short input (the end of a read, a sequence split across
        // reads) costs what it is long.
        let n = BLOCK.min(bytes.len() - at);
        for i in 0..n + 3 {
            let b = win[i].cast_signed();
            let b1 = win[i + 1].cast_signed();
            // Leads: C2..=DF, E0..=EF, F0..=F4 of 2, 3 and 4 bytes; then the second byte's
            // narrower ranges: E0 A0..=BF, ED 80..=9F, F0 90..=BF, F4 80..=8F.
            let ascii = mask(b >= 0);
            let lead2 = mask((-62..=-33).contains(&b));
            let lead3 = mask((-32..=-17).contains(&b));
            let lead4 = mask((-16..=-12).contains(&b));
            let narrow = mask(b == -32 && b1 < -96)
                | mask(b == -19 && b1 >= -96)
                | mask(b == -16 && b1 < -112)
                | mask(b == -12 && b1 >= -112);
            let r1 = mask(b1 < -64) & !narrow & (lead2 | lead3 | lead4);
            let r2 = r1 & mask(win[i + 2].cast_signed() < -64) & (lead3 | lead4);
            let r3 = r2 & mask(win[i + 3].cast_signed() < -64) & lead4;
            reach1[i] = r1;
            reach2[i] = r2;
            reach3[i] = r3;
            valid[i] = ascii | (lead2 & r1) | (lead3 & r2) | r3;
        }
        Lanes { win, reach1, reach2, reach3, valid, n }
    }
}

/// Lossy-decodes the block `bytes[at..at + BLOCK]` (or what is left of it) into `dst`,
/// returning (bytes written, whether any U+FFFD was written).
///
/// Every byte of a lossy decoding comes out as itself, as nothing, or as U+FFFD, and which
/// one depends only on the three bytes before it and the three after: a non-continuation
/// byte starts a unit (a valid sequence or a maximal invalid subpart: itself if valid, else
/// U+FFFD); a continuation byte is part of the unit of the lead at most three bytes before
/// it when that lead's subpart reaches it (itself if the unit is valid, nothing if not),
/// and a U+FFFD of its own otherwise. So the block is classified lane by lane without
/// branches (the compiler vectorizes it), and only writing the output is sequential.
///
/// `at` must start a unit or be inside one whose lead is within the three bytes before it,
/// and `bytes` must end a unit: bytes outside `bytes` count as ASCII.
fn replace_block(bytes: &[u8], at: usize, dst: &mut [u8]) -> (usize, bool) {
    let Lanes { win, reach1, reach2, reach3, valid, n } = Lanes::classify(bytes, at);
    // Output length per byte: 1 (itself), 0 (inside an invalid unit) or 3 (U+FFFD).
    let mut len = [0u8; BLOCK];
    for (i, l) in len[..n].iter_mut().enumerate() {
        let p = i + 3;
        let cont = mask(win[p].cast_signed() < -64);
        let (c1, c2, c3) = (reach1[p - 1], reach2[p - 2], reach3[p - 3]);
        let claimed = c1 | c2 | c3;
        let claimed_valid = (c1 & valid[p - 1]) | (c2 & valid[p - 2]) | (c3 & valid[p - 3]);
        let as_cont = (claimed & claimed_valid & 1) | (!claimed & 3);
        let as_lead = (valid[p] & 1) | (!valid[p] & 3);
        *l = (cont & as_cont) | (!cont & as_lead);
    }
    let replaced = len[..n].iter().fold(0, |acc, &l| acc | (l & 2)) != 0;

    let mut pos = 0;
    for (g, lens) in len[..n].chunks(8).enumerate() {
        let src = &win[3 + 8 * g..];
        if lens == [1; 8] {
            // Eight bytes that are all themselves (text) at once.
            dst[pos..pos + 8].copy_from_slice(&src[..8]);
            pos += 8;
            continue;
        }
        for (&l, &b) in lens.iter().zip(src) {
            let word = std::hint::select_unpredictable(l == 3, 0x00BD_BFEF_u32, u32::from(b));
            dst[pos..pos + 4].copy_from_slice(&word.to_le_bytes());
            pos += usize::from(l);
        }
    }
    (pos, replaced)
}

/// Valid text as UTF-16, appended (ASCII widened in one vectorized pass).
fn push_utf16(s: &str, out: &mut Vec<u16>) {
    if s.is_ascii() {
        out.extend(s.bytes().map(u16::from));
    } else {
        out.extend(s.encode_utf16());
    }
}

/// `String::from_utf8_lossy(bytes).encode_utf16()` appended to `out`, for `bytes` that start
/// and end a sequence: valid runs at SIMD speed, invalid parts by [`replace_block_utf16`]
/// until a block comes out clean.
fn lossy_utf16(bytes: &[u8], out: &mut Vec<u16>) {
    out.reserve(bytes.len());
    // At most one unit per byte, and room for the last 2-unit write.
    let mut block = [0u16; BLOCK + 2];
    let mut at = 0;
    while at < bytes.len() {
        match simdutf8::compat::from_utf8(&bytes[at..]) {
            Ok(s) => {
                push_utf16(s, out);
                break;
            }
            Err(e) => {
                let valid = &bytes[at..at + e.valid_up_to()];
                if let Ok(s) = simdutf8::basic::from_utf8(valid) {
                    push_utf16(s, out);
                }
                at += valid.len();
            }
        }
        loop {
            // Written on the stack, then copied: zeroing room in `out` first would cost a
            // pass over fresh memory.
            let (n, replaced) = replace_block_utf16(bytes, at, &mut block);
            out.extend_from_slice(&block[..n]);
            at = (at + BLOCK).min(bytes.len());
            // Back to the SIMD check after a clean block, where a sequence starts.
            if at == bytes.len() || (!replaced && bytes[at] & 0xC0 != 0x80) {
                break;
            }
        }
    }
}

/// [`replace_block`] with UTF-16 output: every lane decides what its byte starts — a
/// character (one unit, or a surrogate pair from a 4-byte lead), U+FFFD, or nothing (a byte
/// inside a unit whose lead already wrote it) — from the same three bytes each side, and
/// only the writes are sequential. A lead writes its whole character (it sees the three
/// bytes after it), so no sequence is ever cut at a block boundary. Returns (units
/// written, whether any U+FFFD was written).
fn replace_block_utf16(bytes: &[u8], at: usize, dst: &mut [u16; BLOCK + 2]) -> (usize, bool) {
    let Lanes { win, reach1, reach2, reach3, valid, n } = Lanes::classify(bytes, at);
    let wide = |c: bool| 0u16.wrapping_sub(u16::from(c));
    let mut first = [0u16; BLOCK];
    let mut second = [0u16; BLOCK];
    let mut units = [0u8; BLOCK];
    let mut replaced = 0u8;
    for i in 0..n {
        let p = i + 3;
        let b0 = win[p];
        let [w0, w1, w2, w3] = [win[p], win[p + 1], win[p + 2], win[p + 3]].map(u16::from);
        let cont = mask(b0.cast_signed() < -64);
        let claimed = reach1[p - 1] | reach2[p - 2] | reach3[p - 3];
        let ok = valid[p];
        // The character a valid lead starts (a 4-byte one as its high surrogate).
        let two = (w0 & 0x1F) << 6 | (w1 & 0x3F);
        let three = (w0 & 0x0F) << 12 | (w1 & 0x3F) << 6 | (w2 & 0x3F);
        let high = 0xD7C0u16.wrapping_add((w0 & 0x07) << 8 | (w1 & 0x3F) << 2 | ((w2 >> 4) & 0x03));
        let low = 0xDC00 | (w2 & 0x0F) << 6 | (w3 & 0x3F);
        let four = b0 >= 0xF0;
        let ch = (w0 & wide(b0 < 0x80))
            | (two & wide((0xC0..0xE0).contains(&b0)))
            | (three & wide((0xE0..0xF0).contains(&b0)))
            | (high & wide(four));
        // U+FFFD: a lead that starts no valid sequence, or a continuation byte no lead claims.
        let fffd = (!cont & !ok) | (cont & !claimed);
        replaced |= fffd;
        first[i] = (0xFFFD & wide(fffd != 0)) | (ch & wide(fffd == 0));
        second[i] = low;
        // Units: a continuation byte writes one only as U+FFFD; a lead two for a valid 4-byte one.
        units[i] = (cont & fffd & 1) | (!cont & (1 + (ok & u8::from(four))));
    }
    let mut o = 0;
    for i in 0..n {
        dst[o] = first[i];
        dst[o + 1] = second[i];
        o += usize::from(units[i]);
    }
    (o, replaced != 0)
}

/// Where the last sequence that `bytes` cuts off starts (`bytes.len()` when none is cut).
fn whole_sequences_end(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=3.min(n) {
        let b = bytes[n - back];
        if b & 0xC0 != 0x80 {
            // The last byte that is not a continuation byte: a lead whose sequence is longer
            // than what follows it is cut off.
            return if sequence_len(b) > back { n - back } else { n };
        }
    }
    n
}

/// Where a valid but incomplete sequence at the end of `bytes` starts (`bytes.len()` when
/// the last sequence is complete or invalid).
fn incomplete_tail_start(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=3.min(n) {
        if bytes[n - back] & 0xC0 != 0x80 {
            // The last byte that is not a continuation byte: a sequence is cut off only if
            // it starts there.
            return if is_incomplete_prefix(&bytes[n - back..]) { n - back } else { n };
        }
    }
    n
}

/// How many bytes a sequence starting with `lead` has (1 for a byte that starts none).
fn sequence_len(lead: u8) -> usize {
    match lead {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => 1,
    }
}

/// True when `b` is the start of a valid UTF-8 sequence that only lacks bytes.
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
    pieces: VecDeque<Piece>,
    units: VecDeque<usize>,
    total: usize,
    truncated: bool,
}

/// A piece of the tail: UTF-8 text, or UTF-16 units (text decoded for `log`, kept as it was
/// handed to JS rather than converted back).
enum Piece {
    Text(String),
    Wide(Vec<u16>),
}

impl Piece {
    fn bytes(&self) -> usize {
        match self {
            Piece::Text(s) => s.len(),
            Piece::Wide(w) => 2 * w.len(),
        }
    }
}

impl Tail {
    pub fn new(cap: usize) -> Self {
        Tail { cap, pieces: VecDeque::new(), units: VecDeque::new(), total: 0, truncated: false }
    }

    pub fn push(&mut self, s: &str) {
        if !self.merge(s) {
            self.add_piece(Piece::Text(s.to_owned()), utf16_len(s));
        }
    }

    /// Same as [`Tail::push`], keeping `s` itself as a piece when it starts one.
    pub fn push_owned(&mut self, s: String) {
        if !self.merge(&s) {
            let n = utf16_len(&s);
            self.add_piece(Piece::Text(s), n);
        }
    }

    /// Appends UTF-16 units (valid UTF-16: pairs whole).
    pub fn push_utf16(&mut self, w: &[u16]) {
        if w.is_empty() {
            return;
        }
        if let (Some(Piece::Wide(last)), Some(u)) = (self.pieces.back_mut(), self.units.back_mut()) {
            if 2 * (last.len() + w.len()) <= PIECE_BYTES {
                last.extend_from_slice(w);
                *u += w.len();
                self.grew(w.len());
                return;
            }
        }
        self.add_piece(Piece::Wide(w.to_vec()), w.len());
    }

    /// Appends `s` to the last piece when it fits (an empty `s` always "fits").
    fn merge(&mut self, s: &str) -> bool {
        if s.is_empty() {
            return true;
        }
        match (self.pieces.back_mut(), self.units.back_mut()) {
            (Some(Piece::Text(last)), Some(u)) if last.len() + s.len() <= PIECE_BYTES => {
                let n = utf16_len(s);
                last.push_str(s);
                *u += n;
                self.grew(n);
                true
            }
            _ => false,
        }
    }

    fn add_piece(&mut self, p: Piece, units: usize) {
        self.pieces.push_back(p);
        self.units.push_back(units);
        self.grew(units);
    }

    fn grew(&mut self, n: usize) {
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

    /// The kept text: at most `cap` units, never starting inside a surrogate pair. UTF-16
    /// when any piece is (what JS gets anyway: no round trip through UTF-8), else UTF-8.
    pub fn into_text(mut self) -> Text {
        let mut skip = self.total.saturating_sub(self.cap);
        match self.pieces.front_mut() {
            Some(Piece::Text(front)) if skip > 0 => {
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
            Some(Piece::Wide(front)) if skip > 0 => {
                let mut cut = skip.min(front.len());
                // Never start with the low half of a pair: drop it too.
                if front.get(cut).is_some_and(|u| (0xDC00..0xE000).contains(u)) {
                    cut += 1;
                }
                front.drain(..cut);
            }
            _ => {}
        }
        if self.pieces.iter().any(|p| matches!(p, Piece::Wide(_))) {
            let mut out = Vec::with_capacity(self.total.min(self.cap) + 1);
            for p in &self.pieces {
                match p {
                    Piece::Text(t) => push_utf16(t, &mut out),
                    Piece::Wide(w) => out.extend_from_slice(w),
                }
            }
            return Text::Utf16(out);
        }
        let mut out = String::with_capacity(self.pieces.iter().map(Piece::bytes).sum());
        for p in &self.pieces {
            if let Piece::Text(t) = p {
                out.push_str(t);
            }
        }
        Text::Utf8(out)
    }
}

/// A chunk of decoded text for the caller's `log(stream, text)`.
pub type LogLine = (StreamKind, Text);

/// Decoded text, in the form it was decoded to: UTF-8 (any text; ASCII is what a read of
/// ASCII gives), or UTF-16 units (text that was not ASCII, decoded for `log` straight to what
/// a JS string holds, and a tail that kept such pieces). Both forms hold valid text: the
/// UTF-16 comes from decoding bytes, and a tail never starts inside a surrogate pair.
/// Compare it with `&str` and print it with `Display`, whatever its form.
#[derive(Debug, Clone, Eq)]
pub enum Text {
    Utf8(String),
    Utf16(Vec<u16>),
}

impl Default for Text {
    fn default() -> Self {
        Text::Utf8(String::new())
    }
}

impl std::fmt::Display for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Text::Utf8(s) => f.write_str(s),
            Text::Utf16(w) => {
                char::decode_utf16(w.iter().copied()).try_for_each(|c| f.write_char(c.unwrap_or('\u{FFFD}')))
            }
        }
    }
}

impl PartialEq for Text {
    /// Equal text, whatever the forms.
    fn eq(&self, other: &Text) -> bool {
        match (self, other) {
            (Text::Utf8(a), Text::Utf8(b)) => a == b,
            (Text::Utf16(a), Text::Utf16(b)) => a == b,
            (Text::Utf8(s), Text::Utf16(w)) | (Text::Utf16(w), Text::Utf8(s)) => s.encode_utf16().eq(w.iter().copied()),
        }
    }
}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        match self {
            Text::Utf8(s) => s == other,
            Text::Utf16(w) => other.encode_utf16().eq(w.iter().copied()),
        }
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl PartialEq<String> for Text {
    fn eq(&self, other: &String) -> bool {
        *self == **other
    }
}

impl Text {
    pub fn is_empty(&self) -> bool {
        match self {
            Text::Utf8(s) => s.is_empty(),
            Text::Utf16(w) => w.is_empty(),
        }
    }

    /// Its size in memory, in bytes.
    pub fn size(&self) -> usize {
        match self {
            Text::Utf8(s) => s.len(),
            Text::Utf16(w) => 2 * w.len(),
        }
    }

    /// Appends `more` (as UTF-16 when either is), for joining chunks that wait for JS.
    pub fn append(&mut self, more: Text) {
        match (&mut *self, more) {
            (Text::Utf8(a), Text::Utf8(b)) => a.push_str(&b),
            (Text::Utf16(a), Text::Utf16(b)) => a.extend_from_slice(&b),
            (Text::Utf16(a), Text::Utf8(b)) => a.extend(b.encode_utf16()),
            (Text::Utf8(a), Text::Utf16(b)) => {
                let mut w: Vec<u16> = a.encode_utf16().collect();
                w.extend_from_slice(&b);
                *self = Text::Utf16(w);
            }
        }
    }
}

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
}

/// What a finished capture holds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Captured {
    pub stdout: Text,
    pub stderr: Text,
    pub truncated: bool,
}

impl Output {
    pub fn new(sink: Option<mpsc::Sender<LogLine>>) -> Self {
        Self::with_cap(MAX_CAPTURE_UNITS, sink)
    }

    pub fn with_cap(cap: usize, sink: Option<mpsc::Sender<LogLine>>) -> Self {
        let capture = || Capture { decoder: Utf8Decoder::default(), tail: Tail::new(cap) };
        Output { stdout: capture(), stderr: capture(), sink }
    }

    fn capture(&mut self, stream: StreamKind) -> &mut Capture {
        match stream {
            StreamKind::Stderr => &mut self.stderr,
            _ => &mut self.stdout,
        }
    }

    /// Decodes and records `bytes` of `stream`; waits while the log sink is full.
    /// The log gets one string per call, whatever the bytes.
    pub async fn write(&mut self, stream: StreamKind, bytes: &[u8]) -> Result<()> {
        if self.sink.is_some() && !bytes.is_ascii() {
            // For `log`, text that is not ASCII goes to JS as UTF-16: decode straight to it
            // (the tail keeps those units), rather than to UTF-8 and then convert.
            let mut wide = Vec::new();
            let c = self.capture(stream);
            c.decoder.decode_utf16(bytes, &mut wide);
            if !wide.is_empty() {
                c.tail.push_utf16(&wide);
                self.send((stream, Text::Utf16(wide))).await;
            }
            return Ok(());
        }
        let mut text = String::new();
        self.capture(stream).decoder.decode(bytes, &mut text);
        self.record(stream, text).await;
        Ok(())
    }

    async fn record(&mut self, stream: StreamKind, text: String) {
        if text.is_empty() {
            return;
        }
        if self.sink.is_none() {
            self.capture(stream).tail.push_owned(text);
        } else {
            self.capture(stream).tail.push(&text);
            self.send((stream, Text::Utf8(text))).await;
        }
    }

    async fn send(&mut self, line: LogLine) {
        let Some(sink) = &self.sink else { return };
        // A closed consumer (the host stopped listening) stops logging, not capturing.
        if sink.send(line).await.is_err() {
            self.sink = None;
        }
    }

    /// Flushes the decoders (a dangling partial sequence becomes U+FFFD) and returns the tails.
    /// Boxed: the future holds the whole `Output`, and a caller that awaits it in one branch
    /// would otherwise carry its size through every other await (a command in flight, too).
    pub fn finish(self) -> std::pin::Pin<Box<impl std::future::Future<Output = Captured> + Send>> {
        Box::pin(self.finish_now())
    }

    async fn finish_now(mut self) -> Captured {
        for stream in [StreamKind::Stdout, StreamKind::Stderr] {
            let mut text = String::new();
            self.capture(stream).decoder.finish_into(&mut text);
            self.record(stream, text).await;
        }
        let truncated = self.stdout.tail.truncated() || self.stderr.tail.truncated();
        Captured { stdout: self.stdout.tail.into_text(), stderr: self.stderr.tail.into_text(), truncated }
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

    /// A fixed xorshift byte stream from `seed` (the same bytes on every run).
    fn xorshift(mut x: u64) -> impl Iterator<Item = u8> {
        std::iter::repeat_with(move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
    }

    fn decode_chunks(chunks: &[&[u8]]) -> String {
        let mut d = Utf8Decoder::default();
        let mut out = String::new();
        for c in chunks {
            d.write(c, &mut |s| out.push_str(s));
        }
        d.finish(&mut |s| out.push_str(s));
        assert_eq!(decode_chunks_utf16(chunks), out.encode_utf16().collect::<Vec<_>>(), "UTF-16 of {chunks:x?}");
        out
    }

    /// The same chunks through [`Utf8Decoder::decode_utf16`].
    fn decode_chunks_utf16(chunks: &[&[u8]]) -> Vec<u16> {
        let mut d = Utf8Decoder::default();
        let mut out = Vec::new();
        for c in chunks {
            d.decode_utf16(c, &mut out);
        }
        d.finish_utf16(&mut out);
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
    fn decoding_matches_lossy_decoding_inside_long_input() {
        // Invalid sequences between and after valid text, at every alignment.
        let cases: &[&[u8]] = &[
            b"\xff",
            b"\xe2\x82",
            b"\xf0\x9f\x98",
            b"\xc0\xaf",
            b"\xed\xa0\x80",
            b"\xe2\x82(",
            b"\xf4\x90\x80\x80",
            b"\xe0\x80\xaf",
            b"\xf0\x8f\xbf\xbf",
            b"\xc3",
            b"\x80\x80",
            "é€😀".as_bytes(),
        ];
        for case in cases {
            for pre in 0..10 {
                let mut bytes = b"abcdefghij"[..pre].to_vec();
                bytes.extend_from_slice(case);
                bytes.extend_from_slice(b"klmnopqrstuvwxyz");
                bytes.extend_from_slice(case);
                bytes.extend_from_slice(b"0123");
                let want = String::from_utf8_lossy(&bytes).into_owned();
                assert_eq!(decode_chunks(&[&bytes]), want, "{bytes:?}");
            }
        }
    }

    /// Bytes at every boundary of the UTF-8 rules: ASCII, continuation ranges (80, 8F/90,
    /// 9F/A0, BF), non-leads C0/C1, 2-byte leads C2/DF, the 3-byte leads with narrow second
    /// bytes (E0, ED: surrogates) and wide ones, the 4-byte leads (F0 overlongs, F4 above
    /// U+10FFFF), and F5/FF that never lead.
    const EDGES: &[u8] = &[
        0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE,
        0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF,
    ];
    /// Fewer edges for 4-byte sequences, so the exhaustive loop stays quick in debug builds.
    const EDGES4: &[u8] = &[0x41, 0x80, 0x8F, 0x90, 0xA0, 0xBF, 0xE0, 0xED, 0xF0, 0xF4, 0xFF];

    fn all_sequences(edges: &[u8], len: usize) -> Vec<Vec<u8>> {
        let mut seqs = vec![vec![]];
        for _ in 0..len {
            seqs = seqs.iter().flat_map(|s| edges.iter().map(move |&b| [s.as_slice(), &[b]].concat())).collect();
        }
        seqs
    }

    /// `bytes` decoded in the chunks that the cut points `i <= j` make, by `decode`.
    fn decode_3(d: &mut Utf8Decoder, bytes: &[u8], i: usize, j: usize) -> String {
        let mut out = String::new();
        let mut wide = Vec::new();
        for chunk in [&bytes[..i], &bytes[i..j], &bytes[j..]] {
            d.decode(chunk, &mut out);
        }
        d.finish_into(&mut out);
        for chunk in [&bytes[..i], &bytes[i..j], &bytes[j..]] {
            d.decode_utf16(chunk, &mut wide);
        }
        d.finish_utf16(&mut wide);
        assert!(wide.iter().copied().eq(out.encode_utf16()), "UTF-16 of {bytes:x?} split at {i},{j}");
        out
    }

    #[test]
    fn every_short_sequence_at_every_split_equals_lossy_decoding() {
        let mut d = Utf8Decoder::default();
        let mut seqs: Vec<Vec<u8>> = (1..=3).flat_map(|n| all_sequences(EDGES, n)).collect();
        seqs.extend(all_sequences(EDGES4, 4));
        for seq in &seqs {
            let want = String::from_utf8_lossy(seq);
            for i in 0..=seq.len() {
                for j in i..=seq.len() {
                    assert_eq!(decode_3(&mut d, seq, i, j), want, "{seq:x?} split at {i},{j}");
                }
            }
        }
    }

    #[test]
    fn sequences_across_block_and_run_boundaries_equal_lossy_decoding() {
        // Text with each 1-3 byte edge sequence (and a few 4-byte ones) at every offset around
        // the block decoder's block boundary, after an error that starts the block decoder.
        let mut d = Utf8Decoder::default();
        let mut seqs: Vec<Vec<u8>> = (1..=2).flat_map(|n| all_sequences(EDGES, n)).collect();
        seqs.extend(all_sequences(EDGES4, 3));
        seqs.extend(
            [&b"\xf0\x9f\x98\x80"[..], b"\xf4\x8f\xbf\xbf", b"\xf0\x90\x80\x80", b"\xf4\x90\x80\x80"]
                .map(<[u8]>::to_vec),
        );
        for seq in &seqs {
            for at in [BLOCK - 3, BLOCK - 2, BLOCK - 1, BLOCK, BLOCK + 1] {
                let mut bytes = vec![b'x'; at + 8];
                bytes[0] = 0xFF;
                bytes[at..at + seq.len()].copy_from_slice(seq);
                let want = String::from_utf8_lossy(&bytes);
                let n = bytes.len();
                for (i, j) in [(n, n), (at + 1, n), (at + 2, at + 3)] {
                    assert_eq!(decode_3(&mut d, &bytes, i, j), want, "{seq:x?} at {at}, split at {i},{j}");
                }
            }
        }
    }

    #[test]
    fn errors_at_every_density_equal_lossy_decoding() {
        // Text with a bad byte every `gap` bytes: from random-like to rare, so the decoder
        // switches between the SIMD check and the block decoder at many places.
        let mut noise = xorshift(0x2545_F491_4F6C_DD1D);
        let mut d = Utf8Decoder::default();
        for gap in [1usize, 2, 3, 7, 60, 255, 256, 257, 600, 5000] {
            let text = "aé€😀z".repeat(40_000 / 10);
            let mut bytes = text.into_bytes();
            for k in (0..bytes.len()).step_by(gap) {
                bytes[k] = noise.next().unwrap_or(0);
            }
            let want = String::from_utf8_lossy(&bytes);
            let n = bytes.len();
            assert_eq!(decode_3(&mut d, &bytes, n / 3, n / 2), want, "bad byte every {gap}");
        }
    }

    #[test]
    fn tail_keeps_the_last_units_and_never_splits_a_pair() {
        let mut t = Tail::new(5);
        t.push("abc");
        t.push("def");
        assert!(t.truncated());
        assert_eq!(t.into_text(), "bcdef");
        let mut t = Tail::new(3);
        t.push("a😀b"); // 4 units: dropping "a" keeps exactly 3
        assert_eq!(t.into_text(), "😀b");
        let mut t = Tail::new(3);
        t.push("😀ab"); // keeping 3 would split the pair → keep "ab" only
        assert_eq!(t.into_text(), "ab");
        let mut t = Tail::new(4);
        t.push("a😀b");
        assert!(!t.truncated());
        assert_eq!(t.into_text(), "a😀b");
    }

    #[test]
    fn to_utf16_matches_std_for_text_and_decoded_binary() {
        let random: Vec<u8> = xorshift(0x9E37_79B9_7F4A_7C15).take(100_000).collect();
        let binary = String::from_utf8_lossy(&random).into_owned();
        let pairs = "\u{FFFD}😀a\u{10FFFF}é\u{10000}€\u{FFFD}\u{FFFF}".repeat(500);
        for s in ["", "abc", "é€😀", &"aé€😀z".repeat(3000), &binary, &pairs] {
            for start in [0, 1, 2, 3] {
                let Some(s) = s.get(start..) else { continue };
                assert_eq!(to_utf16(s), s.encode_utf16().collect::<Vec<u16>>());
            }
        }
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
        // Reads that are not ASCII go to the log as UTF-16.
        assert!(matches!(seen[1].1, Text::Utf16(_)), "{seen:?}");
        assert!(matches!(seen[0].1, Text::Utf8(_)), "{seen:?}");
    }

    #[test]
    fn log_texts_join_in_order_whatever_their_form() {
        let wide = |s: &str| Text::Utf16(s.encode_utf16().collect());
        for (a, b) in [
            (Text::Utf8("ab".into()), Text::Utf8("é".into())),
            (Text::Utf8("ab".into()), wide("é😀")),
            (wide("😀"), Text::Utf8("cd".into())),
            (wide("x"), wide("\u{FFFD}")),
        ] {
            let want = a.to_string() + &b.to_string();
            let mut joined = a;
            joined.append(b);
            assert_eq!(joined.to_string(), want);
            assert_eq!(
                joined.size(),
                if matches!(joined, Text::Utf16(_)) { 2 * want.encode_utf16().count() } else { want.len() }
            );
        }
    }

    #[test]
    fn text_compares_and_prints_the_same_in_either_form() {
        for s in ["", "abc", "é€😀", "a\u{FFFD}b"] {
            let wide = Text::Utf16(s.encode_utf16().collect());
            let narrow = Text::Utf8(s.to_owned());
            assert_eq!(wide, narrow);
            assert_eq!(wide, s);
            assert_eq!(narrow, s.to_owned());
            assert_eq!(wide.to_string(), s);
        }
        assert_ne!(Text::Utf16("ab".encode_utf16().collect()), Text::Utf8("abc".into()));
        assert_ne!(Text::Utf16("ab".encode_utf16().collect()), "a");
        // A tail of text pieces only stays UTF-8, its ASCII included.
        let mut t = Tail::new(4);
        t.push("ab");
        t.push("é€");
        assert_eq!(t.into_text(), Text::Utf8("abé€".into()));
        // One UTF-16 piece makes the whole kept text UTF-16, in order.
        let mut t = Tail::new(4);
        t.push("xab");
        t.push_utf16(&"😀".encode_utf16().collect::<Vec<_>>());
        let kept = t.into_text();
        assert!(matches!(kept, Text::Utf16(_)), "{kept:?}");
        assert_eq!(kept, "ab😀");
    }

    #[tokio::test]
    async fn a_tail_of_utf16_pieces_keeps_the_last_units_and_never_starts_inside_a_pair() {
        // With a log, non-ASCII reads are kept as UTF-16: the same tail as text would give.
        let (tx, mut rx) = mpsc::channel(64);
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let mut out = Output::with_cap(5, Some(tx));
        out.write(StreamKind::Stdout, "ab😀".as_bytes()).await.unwrap();
        out.write(StreamKind::Stdout, b"\xffcd").await.unwrap();
        out.write(StreamKind::Stdout, "x😀".as_bytes()).await.unwrap();
        let c = out.finish().await;
        // All: a b 😀(2) � c d x 😀(2) = 10 units; the last 5 are c d x 😀(2).
        assert_eq!(c.stdout, "cdx😀");
        // Kept as the UTF-16 it was decoded to (the binding hands it to JS as it is).
        assert!(matches!(c.stdout, Text::Utf16(_)), "{:?}", c.stdout);
        assert!(c.truncated);
        let mut t = Tail::new(2);
        t.push_utf16(&"a😀b".encode_utf16().collect::<Vec<_>>());
        // The last 2 units start with the low half of 😀: it is dropped whole.
        assert_eq!(t.into_text(), "b");
        drain.await.unwrap();
    }
}
