//! Property tests (issue 6, part 2), run by `cargo test --no-default-features`:
//!
//! - `script::shell_quote` round-trips any string without NUL through real `/bin/bash`: as a
//!   command argument, as an environment value (through `script::command_script`), and as a
//!   working directory (a temp dir of that name, where the OS allows the name);
//! - `output::Utf8Decoder` across arbitrary splits equals `String::from_utf8_lossy` of the
//!   whole (short byte soups, random bytes, and long streams mixing text and random bursts);
//! - `output::to_utf16` equals std's `encode_utf16` for any text and decoded binary output;
//! - `output::Tail` keeps the last N UTF-16 units of the whole for any chunking (one unit
//!   fewer exactly when the cut would start inside a surrogate pair).
//!
//! The bash properties spawn one bash per case, so they run 64 cases each.

use std::path::PathBuf;
use std::process::Command as Proc;

use createos_execute_core::output::{to_utf16, utf16_len, Tail, Utf8Decoder};
use createos_execute_core::script::{command_script, shell_quote, Command};
use proptest::prelude::*;

// ---------------------------------------------------------------------------
// Strategies

/// Characters bash treats specially, plus control characters and multi-byte ones.
const NASTY: &[char] = &[
    '\'', '"', '\\', '$', '`', '!', '*', '?', '[', ']', '{', '}', '(', ')', '<', '>', '|', '&', ';', '#', '~', '=',
    '%', '^', ' ', '\t', '\n', '\r', '\x01', '\x1b', '\x7f', '-', '\u{85}', '\u{a0}', 'é', '€', '😀', '\u{fffd}',
    '\u{feff}', '\u{202e}',
];

fn nasty_char() -> impl Strategy<Value = char> {
    prop_oneof![
        3 => prop::sample::select(NASTY),
        2 => any::<char>(),
        1 => prop::char::range('a', 'z'),
    ]
    .prop_filter("no NUL", |c| *c != '\0')
}

/// Any string without NUL, biased towards shell metacharacters.
fn shell_string() -> impl Strategy<Value = String> {
    prop::collection::vec(nasty_char(), 0..40).prop_map(|v| v.into_iter().collect())
}

/// Byte streams that mix valid multi-byte sequences, their fragments, and junk.
fn utf8ish_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        3 => any::<String>().prop_map(String::into_bytes),
        2 => prop::sample::select(vec!["é", "€", "😀", "\u{10ffff}", "\u{fffd}", "a"]).prop_map(|s| s.as_bytes().to_vec()),
        2 => prop::sample::select(vec![
            &b"\xe2\x82"[..], b"\xf0\x9f\x98", b"\xf0\x9f", b"\xc3", b"\xed\xa0\x80", b"\xed\xbf\xbf",
            b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80", b"\xf5", b"\xff", b"\x80", b"\xbf",
        ]).prop_map(<[u8]>::to_vec),
        1 => prop::collection::vec(any::<u8>(), 0..8),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
}

/// Splits `len` bytes at sorted cut points.
fn cuts(len: usize, raw: &[prop::sample::Index]) -> Vec<usize> {
    let mut c: Vec<usize> = raw.iter().map(|i| i.index(len + 1)).collect();
    c.push(0);
    c.push(len);
    c.sort_unstable();
    c.dedup();
    c
}

// ---------------------------------------------------------------------------
// bash helpers

fn bash(script: &str) -> std::process::Output {
    Proc::new("/bin/bash").arg("-c").arg(script).env("LC_ALL", "C").output().expect("spawn /bin/bash")
}

fn stdout_of(out: &std::process::Output) -> &[u8] {
    assert!(out.status.success(), "bash failed: {:?} stderr={}", out.status, String::from_utf8_lossy(&out.stderr));
    &out.stdout
}

/// A fresh directory under the system temp dir for one case; removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let p = std::env::temp_dir().join(format!("cos-prop-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------
// shell_quote through bash

/// Pushes `chunks` into a tail of `cap` units and checks it against the whole.
fn check_chunks(chunks: &[String], cap: usize) -> Result<(), TestCaseError> {
    let mut t = Tail::new(cap);
    for c in chunks {
        t.push(c);
    }
    let truncated = t.truncated();
    check_tail(&chunks.concat(), cap, truncated, &t.into_text().to_string())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn shell_quote_round_trips_as_an_argument(value in shell_string()) {
        let q = shell_quote(&value).unwrap();
        // Two words: a sentinel proves the value stayed one word even when it is empty.
        let out = bash(&format!("printf '%s|' {q} end"));
        let want = format!("{value}|end|");
        prop_assert_eq!(stdout_of(&out), want.as_bytes());
    }

    #[test]
    fn shell_quote_round_trips_as_an_env_value_through_command_script(value in shell_string()) {
        let env = vec![("COS_PROP_VALUE".to_string(), value.clone())];
        let args = vec!["-c".to_string(), "printf '%s' \"$COS_PROP_VALUE\"".to_string()];
        let cmd = Command { command: "/bin/bash", args: &args, cwd: None, env: &env };
        let script = command_script(&cmd, None).unwrap();
        let out = bash(&script);
        prop_assert_eq!(stdout_of(&out), value.as_bytes());
    }

    #[test]
    fn shell_quote_round_trips_as_a_cwd_through_command_script(
        name in shell_string().prop_filter("a name the OS allows", |s| {
            !s.is_empty() && s != "." && s != ".." && !s.contains('/') && s.len() <= 255
        })
    ) {
        let base = TempDir::new("cwd");
        let dir = base.0.join(&name);
        std::fs::create_dir(&dir).expect("the OS allows this name");
        let dir_str = dir.to_str().expect("utf-8 path").to_owned();
        // `pwd -P` prints the physical directory the command really runs in.
        let args = vec!["-c".to_string(), "pwd -P".to_string()];
        let cmd = Command { command: "/bin/bash", args: &args, cwd: Some(&dir_str), env: &[] };
        let out = bash(&command_script(&cmd, None).unwrap());
        let physical = std::fs::canonicalize(&dir).unwrap();
        let mut want = physical.to_str().unwrap().as_bytes().to_vec();
        want.push(b'\n');
        prop_assert_eq!(stdout_of(&out), want.as_slice());
    }
}

#[test]
fn shell_quote_refuses_nul() {
    assert!(shell_quote("a\0b").is_err());
    assert!(shell_quote("\0").is_err());
}

// ---------------------------------------------------------------------------
// UTF-8 decoding and the tail

fn decode_split(bytes: &[u8], cut: &[usize], tail: Option<&mut Tail>) -> String {
    let mut d = Utf8Decoder::default();
    let mut out = String::new();
    let mut tail = tail;
    let mut emit = |s: &str| {
        out.push_str(s);
        if let Some(t) = tail.as_deref_mut() {
            t.push(s);
        }
    };
    for w in cut.windows(2) {
        d.write(&bytes[w[0]..w[1]], &mut emit);
    }
    d.finish(&mut emit);
    out
}

/// Checks a tail of `cap` units against the whole text.
fn check_tail(whole: &str, cap: usize, truncated: bool, kept: &str) -> Result<(), TestCaseError> {
    let units: Vec<u16> = whole.encode_utf16().collect();
    prop_assert_eq!(utf16_len(whole), units.len());
    prop_assert_eq!(truncated, units.len() > cap, "truncated flag");
    let want = &units[units.len().saturating_sub(cap)..];
    let got: Vec<u16> = kept.encode_utf16().collect();
    if got.as_slice() != want {
        // The documented rule: never start inside a surrogate pair.
        prop_assert!(
            !want.is_empty() && (0xDC00..0xE000).contains(&want[0]) && got.as_slice() == &want[1..],
            "tail of {} units: got {} units, want {} (or one fewer at a pair)",
            cap,
            got.len(),
            want.len()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn utf8_decoding_across_any_splits_equals_lossy_decoding_of_the_whole(
        bytes in utf8ish_bytes(),
        raw_cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let cut = cuts(bytes.len(), &raw_cuts);
        let got = decode_split(&bytes, &cut, None);
        prop_assert_eq!(got, String::from_utf8_lossy(&bytes).into_owned());
    }

    #[test]
    fn utf8_decoding_byte_by_byte_equals_lossy_decoding(bytes in utf8ish_bytes()) {
        let cut: Vec<usize> = (0..=bytes.len()).collect();
        prop_assert_eq!(decode_split(&bytes, &cut, None), String::from_utf8_lossy(&bytes).into_owned());
    }

    #[test]
    fn tail_keeps_the_last_units_for_any_chunking(
        chunks in prop::collection::vec(any::<String>(), 0..16),
        cap in 0usize..64,
    ) {
        check_chunks(&chunks, cap)?;
    }

    #[test]
    fn decoder_feeding_a_tail_keeps_the_last_units_of_the_lossy_whole(
        bytes in utf8ish_bytes(),
        raw_cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        cap in 0usize..48,
    ) {
        let cut = cuts(bytes.len(), &raw_cuts);
        let mut t = Tail::new(cap);
        let whole = decode_split(&bytes, &cut, Some(&mut t));
        let truncated = t.truncated();
        check_tail(&whole, cap, truncated, &t.into_text().to_string())?;
    }
}

proptest! {
    // Large inputs: several 64 KiB pieces, so whole pieces are dropped from the front.
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn tail_keeps_the_last_units_across_many_pieces(
        parts in prop::collection::vec((prop::sample::select(vec!["a", "é", "€", "😀", "ab😀", "\u{fffd}x"]), 1usize..30_000), 1..10),
        cap in prop_oneof![0usize..10, 60_000usize..140_000, 200_000usize..400_000],
    ) {
        let chunks: Vec<String> = parts.iter().map(|(s, n)| s.repeat(*n)).collect();
        check_chunks(&chunks, cap)?;
    }
}

// ---------------------------------------------------------------------------
// Binary output (issue 13 §5): `Utf8Decoder::decode` into one string, and `Output`'s one
// log string per write, for any bytes (fully random ones too) and any read boundaries.

fn decode_into_split(bytes: &[u8], cut: &[usize]) -> String {
    let mut d = Utf8Decoder::default();
    let mut out = String::new();
    for w in cut.windows(2) {
        d.decode(&bytes[w[0]..w[1]], &mut out);
    }
    d.finish_into(&mut out);
    out
}

/// [`decode_into_split`] through `Utf8Decoder::decode_utf16`.
fn decode_utf16_split(bytes: &[u8], cut: &[usize]) -> Vec<u16> {
    let mut d = Utf8Decoder::default();
    let mut out = Vec::new();
    for w in cut.windows(2) {
        d.decode_utf16(&bytes[w[0]..w[1]], &mut out);
    }
    d.finish_utf16(&mut out);
    out
}

/// Runs `Output` over the reads, returning (stdout, one log string per non-empty write).
fn output_over_reads(bytes: &[u8], cut: &[usize], cap: usize) -> (String, bool, Vec<String>) {
    use createos_execute_core::output::Output;
    use createos_execute_core::stream::StreamKind;
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel(cut.len() + 2);
        let mut out = Output::with_cap(cap, Some(tx));
        for w in cut.windows(2) {
            out.write(StreamKind::Stdout, &bytes[w[0]..w[1]]).await.expect("write");
        }
        let captured = out.finish().await;
        let mut logged = Vec::new();
        while let Ok((stream, text)) = rx.try_recv() {
            assert_eq!(stream, StreamKind::Stdout);
            logged.push(text.to_string());
        }
        (captured.stdout.to_string(), captured.truncated, logged)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn decoding_random_bytes_across_any_splits_equals_lossy_decoding(
        bytes in prop_oneof![prop::collection::vec(any::<u8>(), 0..4096), utf8ish_bytes()],
        raw_cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
    ) {
        let cut = cuts(bytes.len(), &raw_cuts);
        let whole = String::from_utf8_lossy(&bytes).into_owned();
        prop_assert_eq!(decode_into_split(&bytes, &cut), whole.clone());
        prop_assert_eq!(decode_utf16_split(&bytes, &cut), whole.encode_utf16().collect::<Vec<_>>());
    }

    #[test]
    fn output_logs_at_most_one_string_per_write_and_captures_the_lossy_whole(
        bytes in prop_oneof![prop::collection::vec(any::<u8>(), 0..4096), utf8ish_bytes()],
        raw_cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
    ) {
        let cut = cuts(bytes.len(), &raw_cuts);
        let whole = String::from_utf8_lossy(&bytes).into_owned();
        let (stdout, truncated, logged) = output_over_reads(&bytes, &cut, usize::MAX);
        prop_assert!(!truncated);
        prop_assert_eq!(&stdout, &whole);
        // One log string per read (plus one for a dangling sequence at the end), none empty.
        prop_assert!(logged.len() < cut.len() + 1, "{} log strings for {} reads", logged.len(), cut.len() - 1);
        prop_assert!(logged.iter().all(|t| !t.is_empty()));
        prop_assert_eq!(logged.concat(), whole);
    }
}

/// Long streams: runs of text (ASCII or multi-byte), bursts of random bytes and fragments,
/// so the decoder switches between its SIMD check and its block decoder at many places, and
/// hands the block decoder's output over in several runs.
fn long_mixed_bytes() -> impl Strategy<Value = Vec<u8>> {
    let run = prop_oneof![
        (prop::sample::select(vec!["a", "é", "€", "😀", "abc\n"]), 1usize..3000)
            .prop_map(|(s, n)| s.repeat(n).into_bytes()),
        prop::collection::vec(any::<u8>(), 1..20_000),
        utf8ish_bytes(),
    ];
    prop::collection::vec(run, 1..12).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn decoding_long_mixed_streams_across_any_splits_equals_lossy_decoding(
        bytes in long_mixed_bytes(),
        raw_cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let cut = cuts(bytes.len(), &raw_cuts);
        let whole = String::from_utf8_lossy(&bytes).into_owned();
        prop_assert_eq!(decode_into_split(&bytes, &cut), whole.clone());
        prop_assert_eq!(decode_utf16_split(&bytes, &cut), whole.encode_utf16().collect::<Vec<_>>());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The UTF-16 handed to JS: any text, and decoded binary output (dense with U+FFFD, which
    /// takes the byte-by-byte conversion), equals std's `encode_utf16`.
    #[test]
    fn to_utf16_equals_std_encode_utf16(
        s in prop_oneof![
            any::<String>(),
            prop::collection::vec(any::<u8>(), 0..3000).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
            long_mixed_bytes().prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        ],
    ) {
        prop_assert_eq!(to_utf16(&s), s.encode_utf16().collect::<Vec<u16>>());
    }
}

#[test]
fn a_megabyte_of_random_bytes_in_odd_reads_equals_lossy_decoding() {
    // A fixed xorshift stream, so the case is the same on every run.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let bytes: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect();
    let cut: Vec<usize> = (0..bytes.len()).step_by(4093).chain([bytes.len()]).collect();
    let (stdout, _, logged) = output_over_reads(&bytes, &cut, usize::MAX);
    assert_eq!(stdout, String::from_utf8_lossy(&bytes));
    assert_eq!(logged.len(), cut.len() - 1);
}
