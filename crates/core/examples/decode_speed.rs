//! The decoder alone (issue 13 §5): `Output::write` (UTF-8 decoding into the 4 Mi-character
//! tail) over 64 KiB reads of ASCII, multi-byte UTF-8 and random bytes, in MB/s of input.
//!
//! ```text
//! cargo run --release -p createos_execute_core --example decode_speed -- [mib] [runs]
//! ```
//!
//! Prints one JSON line: `{"ASCII":[MB/s per run],"multi-byte UTF-8":[...],"random":[...],...}`,
//! then the same three through `Utf8Decoder::decode` alone (no tail), the decoded multi-byte and
//! random text converted to UTF-16 for JS (`output::to_utf16` and std's `encode_utf16`), and std's
//! `String::from_utf8_lossy` of the random reads as a reference row.

use std::time::Instant;

use createos_execute_core::output::{to_utf16, Output, Utf8Decoder};
use createos_execute_core::stream::StreamKind;

/// A UTF-8 to UTF-16 conversion.
type Convert = fn(&str) -> Vec<u16>;

fn random_bytes(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect()
}

/// MB/s of `input_len` bytes for each of `runs` calls of `once`, as a JSON array's items.
fn timed(runs: usize, input_len: usize, mut once: impl FnMut()) -> String {
    let speeds: Vec<String> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            once();
            format!("{:.1}", input_len as f64 / 1e6 / t.elapsed().as_secs_f64())
        })
        .collect();
    speeds.join(",")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args.get(1).map_or(Ok(64), |s| s.parse())?;
    let runs: usize = args.get(2).map_or(Ok(5), |s| s.parse())?;
    let n = mib << 20;
    let inputs: [(&str, Vec<u8>); 3] = [
        ("ASCII", "abcdefghijklmnopqrstuvwxyz0123456789\n".bytes().cycle().take(n).collect()),
        ("multi-byte UTF-8", "é€😀ü中文\n".bytes().cycle().take(n).collect()),
        ("random", random_bytes(n)),
    ];
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let mut json = Vec::new();
    for (name, bytes) in &inputs {
        let speeds = timed(runs, bytes.len(), || {
            let captured = rt.block_on(async {
                let mut output = Output::new(None);
                for chunk in bytes.chunks(64 * 1024) {
                    output.write(StreamKind::Stdout, chunk).await.expect("write");
                }
                output.finish().await
            });
            std::hint::black_box(captured);
        });
        json.push(format!("\"{name}\":[{speeds}]"));
    }
    // The decoder alone (no tail), into one reused string.
    for (name, bytes) in &inputs {
        let speeds = timed(runs, bytes.len(), || {
            let mut decoder = Utf8Decoder::default();
            let mut text = String::new();
            let mut total = 0;
            for chunk in bytes.chunks(64 * 1024) {
                text.clear();
                decoder.decode(chunk, &mut text);
                total += text.len();
            }
            decoder.finish_into(&mut text);
            std::hint::black_box(total);
        });
        json.push(format!("\"{name}, Utf8Decoder without the tail\":[{speeds}]"));
    }
    // Straight to UTF-16 (`Utf8Decoder::decode_utf16`, what `log` gets for reads that are not
    // ASCII), into one reused buffer.
    for (name, bytes) in &inputs[1..] {
        let speeds = timed(runs, bytes.len(), || {
            let mut decoder = Utf8Decoder::default();
            let mut units = Vec::new();
            let mut total = 0;
            for chunk in bytes.chunks(64 * 1024) {
                units.clear();
                decoder.decode_utf16(chunk, &mut units);
                total += units.len();
            }
            decoder.finish_utf16(&mut units);
            std::hint::black_box(total);
        });
        json.push(format!("\"{name}, straight to UTF-16 (decode_utf16)\":[{speeds}]"));
    }
    // Handing the decoded text to JS as UTF-16 (`output::to_utf16`, what `log` and the result
    // get when the text is not ASCII), in MB/s of the raw input; std's `encode_utf16` beside it.
    for (name, bytes) in &inputs[1..] {
        let text = String::from_utf8_lossy(bytes).into_owned();
        let pieces: Vec<&str> = {
            let (mut v, mut at) = (Vec::new(), 0);
            while at < text.len() {
                let mut end = (at + (1 << 20)).min(text.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                v.push(&text[at..end]);
                at = end;
            }
            v
        };
        let convs: [(&str, Convert); 2] =
            [("to_utf16", to_utf16), ("std encode_utf16", |s| s.encode_utf16().collect())];
        for (conv, f) in convs {
            let speeds = timed(runs, bytes.len(), || {
                let units: usize = pieces.iter().map(|p| f(p).len()).sum();
                std::hint::black_box(units);
            });
            json.push(format!("\"{name}, its text to UTF-16, {conv}\":[{speeds}]"));
        }
    }
    // The reference: std's lossy conversion of the same random reads (what the decoder must
    // equal), one allocation per read.
    let random = &inputs[2].1;
    let speeds = timed(runs, random.len(), || {
        let total: usize = random.chunks(64 * 1024).map(|c| String::from_utf8_lossy(c).len()).sum();
        std::hint::black_box(total);
    });
    json.push(format!("\"random, std String::from_utf8_lossy (reference)\":[{speeds}]"));
    println!("{{{}}}", json.join(","));
    Ok(())
}
