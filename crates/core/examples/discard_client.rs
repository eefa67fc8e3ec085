//! The baseline of the throughput bench (issue 5 §1): a minimal reqwest + tokio client that GETs
//! one URL and reads and discards every byte of the answer, as fast as it can.
//!
//! ```text
//! cargo run --release --no-default-features --example discard_client -- <base-url> <api-key> <path> [runs] [mode]
//! ```
//!
//! `<path>` is appended to `<base-url>` (for example
//! `/v1/sandboxes/<sb>/processes/<pid>/connect?after=0`). Each run opens a new request on the
//! same keep-alive client and prints one JSON line:
//! `{"run":i,"mode":"raw","status":200,"bytes":N,"frames":F,"ms":T}`, where `ms` covers sending
//! the request until the last byte was read (and handled, in the modes below).
//!
//! `mode` (default `raw`) adds the crate's own steps one at a time, to see where a
//! command's time goes (the bench's sub-step profile):
//! - `raw`: read and discard; no parsing, no decoding: the ceiling of this HTTP stack;
//! - `split`: + the NDJSON line splitter (`stream::LineSplitter`);
//! - `parse`: + frame parsing and base64 decoding (`stream::parse_process_frame`);
//! - `capture`: + UTF-8 decoding into the 4 Mi-character tails (`output::Output`);
//! - `execute`: the crate's whole `execute::execute` from Rust (no Node.js); `<path>` is then
//!   the sandbox id, and the command is `true` (the bench arms a fast-stream fault first).
//!
//! `discard_client micro [mib] [frame_bytes]` needs no server: it builds the same lines the
//! emulator's fast stream sends in memory and times each step of the client's pipeline on
//! them alone (one JSON line per step, MB/s of decoded output).

use std::time::Instant;

use createos_execute_core::output::Output;
use createos_execute_core::stream::{self, LineSplitter, ProcessFrame, StreamKind};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().nth(1).as_deref() == Some("micro") {
        let mib: usize = std::env::args().nth(2).map(|m| m.parse()).transpose()?.unwrap_or(256);
        let frame: usize = std::env::args().nth(3).map(|m| m.parse()).transpose()?.unwrap_or(65536);
        return micro(mib, frame).await;
    }
    let mut args = std::env::args().skip(1);
    let usage = "usage: discard_client <base-url> <api-key> <path> [runs] [raw|split|parse|capture|execute]";
    let base = args.next().ok_or(usage)?;
    let key = args.next().ok_or(usage)?;
    let path = args.next().ok_or(usage)?;
    let runs: u32 = args.next().map(|r| r.parse()).transpose()?.unwrap_or(1);
    let mode = args.next().unwrap_or_else(|| "raw".into());
    if !["raw", "split", "parse", "capture", "execute"].contains(&mode.as_str()) {
        return Err(usage.into());
    }
    let url = format!("{}{}", base.trim_end_matches('/'), path);
    let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
    for run in 0..runs {
        let started = Instant::now();
        if mode == "execute" {
            let bytes = execute(&base, &key, &path).await?;
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            println!(r#"{{"run":{run},"mode":"{mode}","status":200,"bytes":{bytes},"frames":0,"ms":{ms:.3}}}"#);
            continue;
        }
        let mut resp = http.get(&url).header("x-api-key", &key).send().await?;
        let status = resp.status().as_u16();
        let mut bytes: u64 = 0;
        let mut frames: u64 = 0;
        let mut lines = LineSplitter::new();
        let mut output = Output::new(None);
        while let Some(chunk) = resp.chunk().await? {
            bytes += chunk.len() as u64;
            if mode == "raw" {
                continue;
            }
            lines.push(&chunk);
            while let Some(line) = lines.next_line()? {
                frames += 1;
                if mode == "split" {
                    continue;
                }
                let Some(payload) = stream::payload(&line) else { continue };
                if let ProcessFrame::Data { bytes, .. } = stream::parse_process_frame(payload)? {
                    if mode == "capture" {
                        output.write(StreamKind::Stdout, &bytes).await?;
                    }
                }
            }
        }
        let captured = output.finish().await;
        std::hint::black_box(captured);
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        println!(r#"{{"run":{run},"mode":"{mode}","status":{status},"bytes":{bytes},"frames":{frames},"ms":{ms:.3}}}"#);
    }
    Ok(())
}

/// The crate's `execute` of `true` on sandbox `sandbox_id`, unpaced; returns the stdout length.
async fn execute(base: &str, key: &str, sandbox_id: &str) -> Result<u64, Box<dyn std::error::Error>> {
    use createos_execute_core::{abort::Abort, config, execute};
    let cfg = config::parse_config(&serde_json::json!({
        "apiUrl": base, "apiKey": key, "timeoutMs": 600_000, "pacing": "off"
    }))?;
    let params = config::parse_params(&serde_json::json!({ "sandboxId": sandbox_id, "command": "true" }))?;
    let result = execute::execute(&cfg, &params, Abort::new(), None).await?;
    if result.exit_code != Some(0) {
        return Err(format!("exit code {:?}", result.exit_code).into());
    }
    Ok(result.stdout.to_string().len() as u64)
}

/// In-memory timings of each step on the fast stream's lines (see the module doc).
async fn micro(mib: usize, frame_bytes: usize) -> Result<(), Box<dyn std::error::Error>> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let payload = vec![b'x'; frame_bytes];
    let enc = b64.encode(&payload);
    let n = (mib * 1024 * 1024).div_ceil(frame_bytes);
    let mut wire = Vec::with_capacity(n * (enc.len() + 80));
    for seq in 1..=n {
        wire.extend_from_slice(
            format!(r#"{{"type":"data","seq":{seq},"stream":"stdout","data_base64":"{enc}"}}"#).as_bytes(),
        );
        wire.push(b'\n');
    }
    let decoded = (n * frame_bytes) as f64;
    let report = |step: &str, t: Instant| {
        let s = t.elapsed().as_secs_f64();
        println!(r#"{{"step":"{step}","ms":{:.3},"MBps":{:.1}}}"#, s * 1000.0, decoded / 1e6 / s);
    };
    // Chunks as hyper tends to hand them over (16 KiB reads here).
    let chunks: Vec<&[u8]> = wire.chunks(16 * 1024).collect();

    let t = Instant::now();
    let mut lines = LineSplitter::new();
    let mut count = 0usize;
    for c in &chunks {
        lines.push(c);
        while let Some(l) = lines.next_line()? {
            count += l.len();
        }
    }
    std::hint::black_box(count);
    report("split", t);

    let all_lines: Vec<&[u8]> = wire.split(|&b| b == b'\n').filter(|l| !l.is_empty()).collect();
    #[derive(serde::Deserialize)]
    struct Raw<'a> {
        #[serde(borrow)]
        _data_base64: Option<&'a serde_json::value::RawValue>,
    }
    let t = Instant::now();
    for l in &all_lines {
        let r: Raw<'_> = serde_json::from_slice(l)?;
        std::hint::black_box(r._data_base64);
    }
    report("serde_json RawValue scan only", t);

    let t = Instant::now();
    let mut out = Vec::with_capacity(frame_bytes);
    for _ in 0..n {
        out.clear();
        b64.decode_vec(enc.as_bytes(), &mut out)?;
        std::hint::black_box(&out);
    }
    report("base64 decode only (reused buffer)", t);

    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(b64.decode(enc.as_bytes())?);
    }
    report("base64 decode only (new Vec each)", t);

    let t = Instant::now();
    for l in &all_lines {
        std::hint::black_box(stream::parse_process_frame(l)?);
    }
    report("parse_process_frame (parse + decode)", t);

    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(std::str::from_utf8(std::hint::black_box(&payload))?);
    }
    report("str::from_utf8 only", t);

    let t = Instant::now();
    let s = std::str::from_utf8(&payload)?;
    for _ in 0..n {
        std::hint::black_box(createos_execute_core::output::utf16_len(std::hint::black_box(s)));
    }
    report("output::utf16_len only", t);

    // A candidate replacement, checked against the crate's on ASCII and on non-ASCII text.
    fn utf16_len_fast(s: &str) -> usize {
        if s.is_ascii() {
            return s.len();
        }
        s.chars().count() + s.bytes().filter(|&b| b >= 0xF0).count()
    }
    let mixed: String = "aé€😀".repeat(frame_bytes / 10 + 1);
    assert_eq!(utf16_len_fast(s), createos_execute_core::output::utf16_len(s));
    assert_eq!(utf16_len_fast(&mixed), createos_execute_core::output::utf16_len(&mixed));
    assert_eq!(utf16_len_fast(&mixed), mixed.encode_utf16().count());
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(utf16_len_fast(std::hint::black_box(s)));
    }
    report("candidate utf16_len (is_ascii fast path), ASCII", t);
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(createos_execute_core::output::utf16_len(std::hint::black_box(&mixed)));
    }
    report("output::utf16_len, non-ASCII text of the same size", t);
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(utf16_len_fast(std::hint::black_box(&mixed)));
    }
    report("candidate utf16_len (chars().count()), non-ASCII", t);

    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(std::hint::black_box(s).to_owned());
    }
    report("String copy of a frame", t);

    let t = Instant::now();
    let mut output = Output::new(None);
    for _ in 0..n {
        output.write(StreamKind::Stdout, &payload).await?;
    }
    std::hint::black_box(output.finish().await);
    report("Output::write (UTF-8 decode + tail)", t);

    let t = Instant::now();
    let mut output = Output::new(None);
    let mut lines = LineSplitter::new();
    for c in &chunks {
        lines.push(c);
        while let Some(l) = lines.next_line()? {
            if let ProcessFrame::Data { bytes, .. } = stream::parse_process_frame(&l)? {
                output.write(StreamKind::Stdout, &bytes).await?;
            }
        }
    }
    std::hint::black_box(output.finish().await);
    report("whole client pipeline (split + parse + capture)", t);
    Ok(())
}
