//! `output::Utf8Decoder` + `output::Tail` on any bytes cut into any chunks.
//!
//! Input layout: byte 0 = tail cap (0..=255 UTF-16 units, or 4 MiB when 255), byte 1 =
//! chunking seed, rest = the stream. Checks: the decoded text equals
//! `String::from_utf8_lossy` of the whole stream; the tail equals the last `cap` UTF-16
//! units of it, or one unit fewer when the cut would split a surrogate pair; `truncated`
//! exactly when the whole is longer than `cap`.
#![no_main]

use createos_execute_core::output::{utf16_len, Tail, Utf8Decoder, MAX_CAPTURE_UNITS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let cap = if data[0] == 255 { MAX_CAPTURE_UNITS } else { usize::from(data[0]) };
    let mut state = u32::from(data[1]) | 1;
    let bytes = &data[2..];

    let mut decoder = Utf8Decoder::default();
    let mut tail = Tail::new(cap);
    let mut text = String::new();
    let mut pos = 0;
    while pos < bytes.len() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let n = (state as usize >> 4) % 7 + if state % 3 == 0 { 0 } else { 1 };
        let end = (pos + n).min(bytes.len());
        decoder.write(&bytes[pos..end], &mut |s: &str| {
            assert!(!s.is_empty());
            text.push_str(s);
            tail.push(s);
        });
        pos = end;
    }
    decoder.finish(&mut |s: &str| {
        text.push_str(s);
        tail.push(s);
    });
    let whole = String::from_utf8_lossy(bytes);
    assert_eq!(text, whole, "decoding across chunks differs from lossy decoding of the whole");

    let units: Vec<u16> = whole.encode_utf16().collect();
    assert_eq!(utf16_len(&whole), units.len());
    let truncated = tail.truncated();
    let kept = tail.into_text().to_string();
    assert_eq!(truncated, units.len() > cap, "truncated flag");
    let kept_units: Vec<u16> = kept.encode_utf16().collect();
    let start = units.len().saturating_sub(cap);
    let want = &units[start..];
    if kept_units.as_slice() != want {
        // Only allowed: the cut fell inside a surrogate pair, so the low half is dropped too.
        assert!(
            (0xDC00..0xE000).contains(&want[0]) && kept_units.as_slice() == &want[1..],
            "tail is not the last {cap} units"
        );
    }
});
