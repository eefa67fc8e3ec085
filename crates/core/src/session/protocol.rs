//! The supervisor's protocol: the records the client writes to its stdin and the markers it
//! writes around each command's output (see the module doc of `session`).
//!
//! ```text
//! record (stdin):   <token> <script, \xHH-escaped> <base64 stdin | ->\n
//! before:           \0 \x1e cos-begin:<token> \n                     (stdout and stderr)
//! after:            \0 \x1e cos-end:<token>:<status>:<0|1> \n        (stdout and stderr)
//! ```

use std::time::Duration;

use base64::Engine as _;

use crate::config::Params;
use crate::error::Result;
use crate::script;
use crate::stream::ProcessExit;

/// The supervisor exited (a command killed it, or it refused a record) before the command's
/// end marker: the command's exit is unknown. Its tree was ended and proven gone.
pub const SUPERVISOR_ENDED: &str = "CreateOS session supervisor ended before the command's exit status.";
/// A marker was malformed, carried another token, or had output before it.
pub const MARKER_INVALID: &str = "CreateOS session marker is invalid.";

/// The largest record (script and stdin, base64) sent as one input; a bigger command runs
/// in the default mode.
pub const MAX_RECORD_BYTES: usize = 96 * 1024;

/// The supervisor script (see the module doc of `session`).
pub const SUPERVISOR_SCRIPT: &str = include_str!("supervisor.sh");

/// The environment variable every command of a supervisor carries (and passes on to what it
/// starts), whose value names that supervisor: the supervisor's leftover scan looks for it.
pub const SESSION_ENV: &str = "CREATEOS_SESSION_ID";

const BEGIN: &[u8] = b"\0\x1ecos-begin:";
const END: &[u8] = b"\0\x1ecos-end:";
/// The longest end marker after its prefix: token, `:`, status (≤ 3 digits), `:`, flag, `\n`.
const END_TAIL_MAX: usize = 32 + 1 + 3 + 1 + 1 + 1;

/// One command's record line (without its newline) and token, or `None` when it is too big
/// for one input (then the command runs in the default mode). The script is sent with every
/// byte outside `[A-Za-z0-9_./=+-]` as `\xHH`, which the supervisor decodes with bash's
/// builtin `printf -v … %b` (no process is spawned for it); stdin, which may hold any byte, as
/// base64 into a file.
pub fn record(params: &Params) -> Result<Option<(String, String)>> {
    let script = script::command_script(&params.command(), None)?;
    let stdin_len = params.stdin.as_ref().map_or(0, String::len);
    if script.len().saturating_mul(4).saturating_add(stdin_len / 3 * 4).saturating_add(64) > MAX_RECORD_BYTES {
        return Ok(None);
    }
    let token = uuid::Uuid::new_v4().simple().to_string();
    let b64 = base64::engine::general_purpose::STANDARD;
    let stdin = params.stdin.as_ref().map_or_else(|| "-".to_owned(), |s| b64.encode(s.as_bytes()));
    Ok(Some((format!("{token} {} {stdin}", escape(&script)), token)))
}

/// `\xHH` for every byte outside `[A-Za-z0-9_./=+-]` (see [`record`]).
fn escape(script: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(script.len() * 2);
    for b in script.bytes() {
        if b.is_ascii_alphanumeric() || b"_./=+-".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// The supervisor's script for creation attempt `attempt`: its first line names the attempt
/// (`script::attempt_prefix`, found by the list recovery), then its marker path (list
/// recovery, cancel file, staged stdin), its session id ([`SESSION_ENV`]) and how long it
/// waits for a record before it exits on its own: twice the idle time and a minute (a
/// client that went away without ending it).
pub fn supervisor_script(marker: &str, session_id: &str, attempt: u32, idle: Duration) -> Result<String> {
    let idle_s = idle.as_secs().saturating_mul(2).saturating_add(60);
    Ok(format!(
        "{}__cos_marker={}\n__cos_sid={}\n__cos_idle={idle_s}\n{SUPERVISOR_SCRIPT}",
        script::attempt_prefix(attempt),
        script::shell_quote(marker)?,
        script::shell_quote(session_id)?,
    ))
}

/// The marker state of one stream of one command.
#[derive(Default)]
pub struct Lane {
    begun: bool,
    /// Bytes held back: part of the begin marker, or a possible start of the end marker.
    held: Vec<u8>,
    /// The end marker's status and leftover flag, once it came.
    pub end: Option<(i32, bool)>,
    /// Bytes came after the end marker: something of the command still writes (a leftover
    /// the supervisor's scan did not see). They are not the command's output.
    pub trailing: bool,
}

impl Lane {
    /// Whether any byte of this command's stream came (its begin marker, or a part of it).
    pub fn begun(&self) -> bool {
        self.begun || !self.held.is_empty()
    }

    /// Takes one chunk; returns the command's bytes in it. Err = doubt (the marker framing
    /// was broken: bytes before the begin marker, a malformed or foreign end marker). Each
    /// byte is looked at once (`memmem`), and copied once; only a possible start of the end
    /// marker (at most its length) is held back between chunks.
    pub fn push(&mut self, bytes: &[u8], token: &str) -> std::result::Result<Vec<u8>, ()> {
        if self.end.is_some() {
            self.trailing |= !bytes.is_empty();
            return Ok(Vec::new());
        }
        if !self.begun {
            self.held.extend_from_slice(bytes);
            let begin: Vec<u8> = [BEGIN, token.as_bytes(), b"\n"].concat();
            let n = self.held.len().min(begin.len());
            if self.held[..n] != begin[..n] {
                return Err(());
            }
            if self.held.len() < begin.len() {
                return Ok(Vec::new());
            }
            self.begun = true;
            let rest = self.held.split_off(begin.len());
            self.held = Vec::new();
            return self.scan(&rest, token);
        }
        if self.held.is_empty() {
            return self.scan(bytes, token);
        }
        let mut data = std::mem::take(&mut self.held);
        data.extend_from_slice(bytes);
        self.scan(&data, token)
    }

    /// Looks for the end marker in `data` (nothing held before it).
    fn scan(&mut self, data: &[u8], token: &str) -> std::result::Result<Vec<u8>, ()> {
        if let Some(i) = memchr::memmem::find(data, END) {
            let tail = &data[i + END.len()..];
            let Some(nl) = memchr::memchr(b'\n', tail) else {
                if tail.len() > END_TAIL_MAX {
                    return Err(());
                }
                self.held = data[i..].to_vec();
                return Ok(data[..i].to_vec());
            };
            self.end = Some(parse_end(&tail[..nl], token).ok_or(())?);
            self.trailing = nl + 1 != tail.len();
            return Ok(data[..i].to_vec());
        }
        // Hold back the longest suffix that may begin the end marker.
        let keep = (1..END.len()).rev().find(|&k| data.ends_with(&END[..k])).unwrap_or(0);
        let cut = data.len() - keep;
        self.held = data[cut..].to_vec();
        Ok(data[..cut].to_vec())
    }
}

/// `<token>:<status>:<0|1>` → (status, leftover), for our token only.
fn parse_end(tail: &[u8], token: &str) -> Option<(i32, bool)> {
    let s = std::str::from_utf8(tail).ok()?;
    let mut parts = s.split(':');
    let (t, rc, left) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || t != token || rc.is_empty() || rc.len() > 3 || !rc.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let rc: i32 = rc.parse().ok()?;
    let left = match left {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    (rc <= 255).then_some((rc, left))
}

/// A wait status as bash reports it: above 128 a signal (bash cannot tell `exit 137` from
/// SIGKILL), else the exit code.
pub fn exit_of(rc: i32) -> ProcessExit {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match usize::try_from(rc - 129).ok().and_then(|i| NAMES.get(i)) {
        Some(name) => ProcessExit { exit_code: None, signal: Some((*name).to_owned()) },
        None => ProcessExit { exit_code: Some(rc), signal: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOK: &str = "0123456789abcdef0123456789abcdef";

    fn begin() -> Vec<u8> {
        [BEGIN, TOK.as_bytes(), b"\n"].concat()
    }

    type Lanes = (Vec<u8>, std::result::Result<Option<(i32, bool)>, ()>, bool);

    fn run(chunks: &[&[u8]]) -> Lanes {
        let mut lane = Lane::default();
        let mut out = Vec::new();
        for c in chunks {
            match lane.push(c, TOK) {
                Ok(b) => out.extend(b),
                Err(()) => return (out, Err(()), lane.trailing),
            }
        }
        (out, Ok(lane.end), lane.trailing)
    }

    #[test]
    fn markers_are_found_whatever_the_split() {
        let mut all = begin();
        all.extend_from_slice(b"no newline at the end\0\x1e");
        all.extend_from_slice(END);
        all.extend_from_slice(format!("{TOK}:3:1\n").as_bytes());
        for cut in 0..all.len() {
            for cut2 in cut..all.len() {
                let (out, end, trailing) = run(&[&all[..cut], &all[cut..cut2], &all[cut2..]]);
                assert_eq!(out, b"no newline at the end\0\x1e", "cuts {cut} {cut2}");
                assert_eq!(end, Ok(Some((3, true))));
                assert!(!trailing);
            }
        }
    }

    #[test]
    fn forged_or_malformed_markers_are_doubt() {
        let other = "f".repeat(32);
        let cases: Vec<Vec<u8>> = vec![
            [&begin()[..], END, format!("{other}:0:0\n").as_bytes()].concat(),
            [&begin()[..], END, format!("{TOK}:x:0\n").as_bytes()].concat(),
            [&begin()[..], END, format!("{TOK}:0:2\n").as_bytes()].concat(),
            [&begin()[..], END, "a".repeat(80).as_bytes()].concat(),
            [b"stray".as_slice(), &begin()[..]].concat(),
        ];
        for c in cases {
            assert_eq!(run(&[&c]).1, Err(()));
        }
    }

    #[test]
    fn bytes_after_the_end_marker_are_a_leftover_not_output() {
        let all = [&begin()[..], b"out", END, format!("{TOK}:0:0\nchatty").as_bytes()].concat();
        let (out, end, trailing) = run(&[&all]);
        assert_eq!((out.as_slice(), end, trailing), (b"out".as_slice(), Ok(Some((0, false))), true));
        // In a later chunk too.
        let first = [&begin()[..], END, format!("{TOK}:0:0\n").as_bytes()].concat();
        let (out, end, trailing) = run(&[&first, b"later"]);
        assert_eq!((out.as_slice(), end, trailing), (b"".as_slice(), Ok(Some((0, false))), true));
    }

    #[test]
    fn escaped_scripts_decode_in_bash_unchanged() {
        for v in ["plain", "a b\tc\nd\n\n", "it's \\x41 \\c %s %b", "é😀\u{1e}", "-n", "\\", "x\\"] {
            let out = std::process::Command::new("/bin/bash")
                .args(["-c", "printf -v s '%b' \"$1\"; printf %s \"$s\"", "_", &escape(v)])
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), v);
            assert!(!escape(v).contains(' '));
        }
    }

    /// The supervisor script itself, fed records on its stdin: a token it already ran is not
    /// run again, a command sees its session id, and `end` ends it.
    #[test]
    fn the_supervisor_runs_a_token_once_and_ends_on_end() {
        use std::io::Write as _;
        let dir = std::env::temp_dir().join(format!("cos-supervisor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let marker = dir.join("m").to_str().unwrap().to_owned();
        let script = supervisor_script(&marker, "sid-1", 1, Duration::from_secs(5)).unwrap();
        let mut child = std::process::Command::new("/bin/bash")
            .args(["-c", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let cmd = escape("printf 'ran:%s\\n' \"$CREATEOS_SESSION_ID\"");
        let rec = format!("{TOK} {cmd} -\n");
        let stdin = child.stdin.as_mut().unwrap();
        stdin.write_all(format!("{rec}{rec}end\n").as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let want = format!("\0\x1ecos-begin:{TOK}\nran:sid-1\n\0\x1ecos-end:{TOK}:0:0\n");
        assert_eq!(text, want, "the second record with the same token is not run");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn statuses() {
        assert_eq!(exit_of(0), ProcessExit { exit_code: Some(0), signal: None });
        assert_eq!(exit_of(137).signal.as_deref(), Some("SIGKILL"));
        assert_eq!(exit_of(128).exit_code, Some(128));
        assert_eq!(exit_of(200).exit_code, Some(200));
    }
}
