//! Shell quoting and the bash script a command runs as.
//!
//! The managed process is `/bin/bash -lc <script>`. The script (1) waits for the start-gate
//! file, so the output stream is attached before the command can print, (2) claims the gate,
//! (3) takes its stdin from the staged file (or `/dev/null`) and removes that file once it is
//! open, (4) changes directory, exports the environment, and `exec`s the command. Steps 2 and 3
//! are why a successful command needs no extra requests to close stdin or remove files.
//!
//! The staged stdin file is opened only in step 3, after the gate: `execute` uploads it while
//! the process is being created, and opens the gate only once that upload succeeded, so the
//! script never reads a file that is missing or half written.
//!
//! The gate is open when its file has content ([`GATE_CONTENT`], `[ -s gate ]`), not merely
//! when it exists: `execute` sends the gate's request ahead and its content only once the
//! stream is attached (see `Client::put_file_held`), and a server that creates a file as an
//! upload starts streaming, or keeps an abandoned upload's empty file, must not open it.
//!
//! **Attempts.** Each creation attempt of one call has its own script: its first line names the
//! attempt ([`attempt_prefix`]), and it runs only while the call's cancel file
//! ([`cancel_path`]) does not cancel it. `execute` writes the number of the last cancelled
//! attempt there before it sends a creation again, and before it gives a verdict while a
//! creation's fate is unknown, so an attempt the server applies late (whatever the order)
//! exits at once with [`CANCELLED_EXIT`], without running anything and without touching the
//! gate or the staged stdin. The gate is claimed in one atomic step (the exclusive creation of
//! a claim file, [`claim_path`], with bash's `noclobber`): of two processes that see it open,
//! only one can pass. The
//! gate's content is written only for the attempt whose creation was answered, after every
//! earlier attempt was cancelled, so a process that sees the gate open and reads the cancel
//! file after it sees every cancellation that came before.
//!
//! The gate wait is quiet: it blocks in bash's builtin `read -t` on the process's own stdin
//! pipe (which CreateOS keeps open and we never write to), so it spawns nothing. If stdin is
//! not a pipe that blocks (EOF at once), it falls back to `sleep` with a backoff to 0.25 s.
//! The wait is bounded: after `gate_timeout_s` the script removes its staged files and exits 125.

use crate::error::{Error, Result};

pub const NUL_IN_VALUE: &str = "Sandbox command values cannot contain NUL.";
pub const COMMAND_REQUIRED: &str = "A sandbox command is required.";
pub const INVALID_ENV: &str = "Invalid sandbox environment variable.";

/// What the gate file holds once it is open (one byte: it arrives whole or not at all).
pub const GATE_CONTENT: &[u8] = b"1";

/// Exit status of a script whose start gate never opened.
pub const GATE_TIMEOUT_EXIT: i32 = 125;

/// Exit status of a script whose attempt was cancelled, or whose gate another process claimed:
/// it ran nothing.
pub const CANCELLED_EXIT: i32 = 124;

/// Exit status of a script that got SIGTERM before it passed its gate (the DELETE of a
/// cleanup: its grace starts with SIGTERM): it ran nothing and removed its staged stdin, its
/// gate and its claim file first. A cleanup that reads this status in the terminated record
/// knows no staged file of the call remains (see [`staged_files_remain`]).
pub const STAGED_REMOVED_EXIT: i32 = 122;

/// How a terminated process ended, as its record (the DELETE's answer, or `wait`'s) says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum End {
    /// No record said (a 404, an answer without the fields).
    #[default]
    Unknown,
    Exit(i64),
    Signal(String),
}

/// Whether staged files of a call (its stdin, gate, claim) may remain after its process
/// ended as `end`, given whether the gate's content may have been sent. Past its gate the
/// script removes them; at its gate a SIGTERM makes it remove them ([`STAGED_REMOVED_EXIT`]),
/// and so does its own gate timeout ([`GATE_TIMEOUT_EXIT`]). An exit status after the gate was
/// sent is the command's own (it ran: the script was past its gate). A death by a signal may
/// be the command's, or the script's before it could act: still in its login shell, where a
/// SIGTERM finds no trap yet, or a SIGKILL from a server whose DELETE sends no SIGTERM first.
/// The record cannot tell them apart, so they may remain; so may they after an unknown end.
pub fn staged_files_remain(end: &End, gate_sent: bool) -> bool {
    match end {
        End::Exit(c) if *c == i64::from(STAGED_REMOVED_EXIT) || *c == i64::from(GATE_TIMEOUT_EXIT) => false,
        End::Exit(_) => !gate_sent,
        End::Signal(_) | End::Unknown => true,
    }
}

/// The call's cancel file, next to its gate: it holds the number of the last cancelled
/// attempt (see the module doc).
pub fn cancel_path(gate_path: &str) -> String {
    format!("{gate_path}.cancelled")
}

/// The claim file next to the gate: created exclusively by the one process that passes it.
pub fn claim_path(gate_path: &str) -> String {
    format!("{gate_path}.claimed")
}

/// How the script of attempt `attempt` begins (a list entry whose script starts so is that
/// attempt's process).
pub fn attempt_prefix(attempt: u32) -> String {
    format!("__cos_attempt={attempt}\n")
}

/// Quotes `value` for bash as one word: `'…'`, with each `'` written as `'"'"'`.
pub fn shell_quote(value: &str) -> Result<String> {
    if value.contains('\0') {
        return Err(Error::Input(NUL_IN_VALUE));
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        if c == '\'' {
            out.push_str("'\"'\"'");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    Ok(out)
}

/// An environment variable name: `^[A-Za-z_][A-Za-z0-9_]*$`.
pub fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// What the script runs.
pub struct Command<'a> {
    pub command: &'a str,
    pub args: &'a [String],
    pub cwd: Option<&'a str>,
    pub env: &'a [(String, String)],
}

/// The start gate and staged stdin of a managed-process script, and which attempt it is.
pub struct Gate<'a> {
    pub gate_path: &'a str,
    pub stdin_path: Option<&'a str>,
    pub timeout_s: u64,
    /// The creation attempt (1 for the first): see the module doc.
    pub attempt: u32,
}

/// Checks a command before anything is sent.
pub fn validate(cmd: &Command<'_>) -> Result<()> {
    if cmd.command.is_empty() {
        return Err(Error::Input(COMMAND_REQUIRED));
    }
    for (name, _) in cmd.env {
        if !is_env_name(name) {
            return Err(Error::Input(INVALID_ENV));
        }
    }
    let values = std::iter::once(cmd.command)
        .chain(cmd.args.iter().map(String::as_str))
        .chain(cmd.cwd)
        .chain(cmd.env.iter().map(|(_, v)| v.as_str()));
    for v in values {
        if v.contains('\0') {
            return Err(Error::Input(NUL_IN_VALUE));
        }
    }
    Ok(())
}

/// The bash script for `cmd`, with a start gate when `gate` is given (managed processes)
/// and without one for `/exec` (whose stdin is sent in the request body).
pub fn command_script(cmd: &Command<'_>, gate: Option<&Gate<'_>>) -> Result<String> {
    validate(cmd)?;
    let mut lines: Vec<String> = Vec::new();
    if let Some(g) = gate {
        let gate_q = shell_quote(g.gate_path)?;
        let cancel_q = shell_quote(&cancel_path(g.gate_path))?;
        let claim_q = shell_quote(&claim_path(g.gate_path))?;
        let stdin_q = g.stdin_path.map(shell_quote).transpose()?;
        let remove_stdin = stdin_q.as_ref().map(|s| format!("rm -f -- {s}; ")).unwrap_or_default();
        let attempt = g.attempt.max(1);
        // The first line names the attempt (see `attempt_prefix`); nothing precedes it.
        lines.push(format!("__cos_attempt={attempt}"));
        lines.push(format!("__cos_end=$((SECONDS+{}))", g.timeout_s.max(1)));
        lines.push("__cos_nap=0.01".into());
        // Cancelled when the cancel file names this attempt or a later one (anything but a
        // number cancels every attempt: the file is only ever ours).
        lines.push(format!(
            "__cos_cancelled() {{ [ -s {cancel_q} ] || return 1; __cos_c=; read -r __cos_c < {cancel_q}; \
             case $__cos_c in ''|*[!0-9]*) return 0;; esac; [ \"$__cos_c\" -ge {attempt} ]; }}"
        ));
        // A SIGTERM before the gate is passed (a cleanup's DELETE) removes what was staged for
        // this call, unless this attempt is cancelled (the files may be a later attempt's).
        lines.push(format!(
            "trap 'if __cos_cancelled; then exit {CANCELLED_EXIT}; fi; rm -f -- {remove_all}; exit {STAGED_REMOVED_EXIT}' TERM",
            remove_all = [Some(&gate_q), Some(&claim_q), stdin_q.as_ref()].into_iter().flatten().cloned().collect::<Vec<_>>().join(" ")
        ));
        lines.push("while :; do".into());
        lines.push(format!("  if __cos_cancelled; then exit {CANCELLED_EXIT}; fi"));
        // Open: the cancel file is read again after the gate was seen open (every cancellation
        // was written before the gate's content), then the gate is claimed in one step: the
        // claim file is created with O_EXCL (bash's noclobber), which only one process can win.
        lines.push(format!(
            "  if [ -s {gate_q} ]; then if __cos_cancelled; then exit {CANCELLED_EXIT}; fi; \
             {{ set -C; : > {claim_q}; }} 2>/dev/null || exit {CANCELLED_EXIT}; set +C; rm -f -- {gate_q} {claim_q}; break; fi"
        ));
        lines.push(format!(
            "  if [ \"$SECONDS\" -ge \"$__cos_end\" ]; then {remove_stdin}rm -f -- {gate_q}; exit {GATE_TIMEOUT_EXIT}; fi"
        ));
        lines.push("  read -r -t 0.02 __cos_x 2>/dev/null".into());
        lines.push("  if [ $? -le 128 ]; then sleep \"$__cos_nap\"; case $__cos_nap in 0.01) __cos_nap=0.05;; 0.05) __cos_nap=0.25;; esac; fi".into());
        lines.push("done".into());
        match stdin_q {
            Some(s) => {
                lines.push(format!("exec 0< {s} || exit 126"));
                lines.push(format!("rm -f -- {s}"));
            }
            None => lines.push("exec 0</dev/null".into()),
        }
        // Nothing staged remains: the command gets SIGTERM's default action.
        lines.push("trap - TERM".into());
        lines.push("unset -f __cos_cancelled".into());
        lines.push("unset __cos_attempt __cos_end __cos_nap __cos_x __cos_c".into());
    }
    if let Some(cwd) = cmd.cwd.filter(|c| !c.is_empty()) {
        lines.push(format!("cd -- {} || exit", shell_quote(cwd)?));
    }
    for (name, value) in cmd.env {
        lines.push(format!("export {name}={}", shell_quote(value)?));
    }
    let mut exec = String::from("exec --");
    for word in std::iter::once(cmd.command).chain(cmd.args.iter().map(String::as_str)) {
        exec.push(' ');
        exec.push_str(&shell_quote(word)?);
    }
    lines.push(exec);
    Ok(lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command as Proc;

    fn bash(script: &str) -> std::process::Output {
        Proc::new("/bin/bash").arg("-c").arg(script).output().unwrap()
    }

    #[test]
    fn quotes_round_trip_through_bash() {
        for v in ["", "plain", "it's", "a b\tc\nd", "$HOME `id` $(id) \\ \" '' ' '", "é😀", "-n", "*"] {
            let out = bash(&format!("printf %s {}", shell_quote(v).unwrap()));
            assert_eq!(String::from_utf8(out.stdout).unwrap(), v);
        }
        assert!(matches!(shell_quote("a\0b"), Err(Error::Input(NUL_IN_VALUE))));
    }

    #[test]
    fn env_names() {
        for ok in ["A", "_", "a_1", "PATH"] {
            assert!(is_env_name(ok));
        }
        for bad in ["", "1A", "A-B", "A B", "É", "A=B"] {
            assert!(!is_env_name(bad));
        }
    }

    #[test]
    fn validation_rejects_bad_input() {
        let env = vec![("BAD-NAME".to_string(), "x".to_string())];
        let c = Command { command: "echo", args: &[], cwd: None, env: &env };
        assert!(matches!(command_script(&c, None), Err(Error::Input(INVALID_ENV))));
        let c = Command { command: "", args: &[], cwd: None, env: &[] };
        assert!(matches!(command_script(&c, None), Err(Error::Input(COMMAND_REQUIRED))));
        let args = vec!["a\0".to_string()];
        let c = Command { command: "echo", args: &args, cwd: None, env: &[] };
        assert!(matches!(command_script(&c, None), Err(Error::Input(NUL_IN_VALUE))));
    }

    #[test]
    fn script_runs_the_command_with_env_cwd_and_odd_words() {
        let args = ["=x".to_string(), "-n".to_string(), "it's".to_string()];
        let env = vec![("FOO".to_string(), "b a'r".to_string())];
        let inner = ["-c".to_string(), "printf '%s|' \"$FOO\" \"$PWD\" \"$@\"".to_string(), "_".to_string()];
        let all: Vec<String> = inner.iter().cloned().chain(args.iter().cloned()).collect();
        let c = Command { command: "/bin/bash", args: &all, cwd: Some("/tmp"), env: &env };
        let out = bash(&command_script(&c, None).unwrap());
        assert_eq!(String::from_utf8(out.stdout).unwrap(), "b a'r|/tmp|=x|-n|it's|");
    }

    #[test]
    fn gate_waits_then_runs_with_staged_stdin_and_removes_both_files() {
        let dir = std::env::temp_dir().join(format!("cos-script-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let gate = dir.join("gate");
        let stdin = dir.join("stdin");
        std::fs::write(&stdin, "from stdin\n").unwrap();
        let args = vec![];
        let c = Command { command: "cat", args: &args, cwd: None, env: &[] };
        let g = Gate {
            gate_path: gate.to_str().unwrap(),
            stdin_path: Some(stdin.to_str().unwrap()),
            timeout_s: 10,
            attempt: 1,
        };
        let script = command_script(&c, Some(&g)).unwrap();
        // stdin of the script is a pipe nobody writes to: the quiet wait path.
        let mut child = Proc::new("/bin/bash")
            .arg("-c")
            .arg(&script)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(150));
        assert!(child.try_wait().unwrap().is_none(), "must wait for the gate");
        // An empty gate file (an upload whose content has not arrived) does not open it.
        std::fs::write(&gate, "").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(150));
        assert!(child.try_wait().unwrap().is_none(), "an empty gate must not open");
        std::fs::write(&gate, GATE_CONTENT).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), "from stdin\n");
        assert!(!gate.exists() && !stdin.exists());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn gate_times_out_and_removes_the_staged_stdin() {
        let dir = std::env::temp_dir().join(format!("cos-script-to-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let stdin = dir.join("stdin");
        std::fs::write(&stdin, "x").unwrap();
        let c = Command { command: "true", args: &[], cwd: None, env: &[] };
        let gate = dir.join("gate");
        std::fs::write(&gate, "").unwrap();
        let g = Gate {
            gate_path: gate.to_str().unwrap(),
            stdin_path: Some(stdin.to_str().unwrap()),
            timeout_s: 1,
            attempt: 1,
        };
        // stdin at EOF: the sleep fallback path.
        let out = Proc::new("/bin/bash")
            .arg("-c")
            .arg(command_script(&c, Some(&g)).unwrap())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(GATE_TIMEOUT_EXIT));
        assert!(!stdin.exists());
        assert!(!gate.exists(), "an abandoned (empty) gate file is removed too");
        std::fs::remove_dir_all(&dir).ok();
    }

    fn gated(dir: &std::path::Path, attempt: u32, marker_file: &std::path::Path) -> std::process::Child {
        gated_for(dir, attempt, marker_file, 30)
    }

    fn gated_for(
        dir: &std::path::Path,
        attempt: u32,
        marker_file: &std::path::Path,
        timeout_s: u64,
    ) -> std::process::Child {
        let args = vec!["-c".to_string(), format!("echo ran >> {}", marker_file.display())];
        let c = Command { command: "/bin/bash", args: &args, cwd: None, env: &[] };
        let gate = dir.join("gate");
        let g = Gate { gate_path: gate.to_str().unwrap(), stdin_path: None, timeout_s, attempt };
        Proc::new("/bin/bash")
            .arg("-c")
            .arg(command_script(&c, Some(&g)).unwrap())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn fresh_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("cos-script-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_cancelled_attempt_exits_at_once_and_runs_nothing() {
        let dir = fresh_dir("cancel");
        let ran = dir.join("ran");
        let gate = dir.join("gate");
        std::fs::write(cancel_path(gate.to_str().unwrap()), "1").unwrap();
        // Attempt 1 started after its cancellation: it exits without waiting, even with the
        // gate open (a late process must never take the gate of a later attempt).
        std::fs::write(&gate, GATE_CONTENT).unwrap();
        let started = std::time::Instant::now();
        let st = gated(&dir, 1, &ran).wait().unwrap();
        assert_eq!(st.code(), Some(CANCELLED_EXIT));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert!(!ran.exists(), "the command never ran");
        assert!(gate.exists(), "the gate is left to the attempt it is for");
        // Attempt 2 is not cancelled by "1": it takes the gate and runs.
        let st = gated(&dir, 2, &ran).wait().unwrap();
        assert_eq!(st.code(), Some(0));
        assert_eq!(std::fs::read_to_string(&ran).unwrap(), "ran\n");
        assert!(!gate.exists());
        // A cancellation written while an attempt waits ends it within a poll.
        let mut waiting = gated(&dir, 3, &ran);
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(waiting.try_wait().unwrap().is_none());
        std::fs::write(cancel_path(gate.to_str().unwrap()), "3").unwrap();
        assert_eq!(waiting.wait().unwrap().code(), Some(CANCELLED_EXIT));
        assert_eq!(std::fs::read_to_string(&ran).unwrap(), "ran\n", "still once");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn of_two_waiters_on_one_open_gate_only_one_runs() {
        let dir = fresh_dir("two");
        let ran = dir.join("ran");
        for _ in 0..3 {
            let _ = std::fs::remove_file(&ran);
            // The same attempt twice (a server that applied one creation twice): the loser
            // either lost the claim or never saw the gate open (then it waits out its gate).
            let mut a = gated_for(&dir, 1, &ran, 3);
            let mut b = gated_for(&dir, 1, &ran, 3);
            std::thread::sleep(std::time::Duration::from_millis(100));
            std::fs::write(dir.join("gate"), GATE_CONTENT).unwrap();
            let mut codes = [a.wait().unwrap().code(), b.wait().unwrap().code()];
            codes.sort();
            assert!(matches!(codes, [Some(0), Some(CANCELLED_EXIT | GATE_TIMEOUT_EXIT)]), "{codes:?}");
            let gate = dir.join("gate");
            assert!(!gate.exists() && !std::path::Path::new(&claim_path(gate.to_str().unwrap())).exists());
            assert_eq!(std::fs::read_to_string(&ran).unwrap(), "ran\n");
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    fn term(child: &std::process::Child) {
        let st = Proc::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
        assert!(st.success());
    }

    #[test]
    fn a_sigterm_at_the_gate_removes_what_was_staged_and_says_so() {
        for (stdin_mode, name) in [(std::process::Stdio::piped(), "pipe"), (std::process::Stdio::null(), "eof")] {
            let dir = fresh_dir(&format!("term-{name}"));
            let (gate, stdin) = (dir.join("gate"), dir.join("stdin"));
            std::fs::write(&stdin, "secret").unwrap();
            std::fs::write(&gate, "").unwrap();
            let claim = claim_path(gate.to_str().unwrap());
            let c = Command { command: "true", args: &[], cwd: None, env: &[] };
            let g = Gate {
                gate_path: gate.to_str().unwrap(),
                stdin_path: Some(stdin.to_str().unwrap()),
                timeout_s: 30,
                attempt: 1,
            };
            let mut child = Proc::new("/bin/bash")
                .arg("-c")
                .arg(command_script(&c, Some(&g)).unwrap())
                .stdin(stdin_mode)
                .spawn()
                .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(200));
            assert!(child.try_wait().unwrap().is_none(), "{name}: waiting at its gate");
            term(&child);
            let started = std::time::Instant::now();
            let st = child.wait().unwrap();
            assert_eq!(st.code(), Some(STAGED_REMOVED_EXIT), "{name}");
            assert!(started.elapsed() < std::time::Duration::from_secs(2), "{name}: within a poll");
            assert!(!stdin.exists() && !gate.exists() && !std::path::Path::new(&claim).exists(), "{name}");
            std::fs::remove_dir_all(&dir).ok();
        }
    }

    #[test]
    fn a_sigterm_leaves_a_cancelled_attempts_files_and_the_commands_own_default() {
        // Cancelled (a later attempt may own the staged files): nothing is removed.
        let dir = fresh_dir("term-cancelled");
        let ran = dir.join("ran");
        let gate = dir.join("gate");
        let mut waiting = gated(&dir, 1, &ran);
        std::thread::sleep(std::time::Duration::from_millis(150));
        std::fs::write(&gate, "").unwrap();
        std::fs::write(cancel_path(gate.to_str().unwrap()), "1").unwrap();
        term(&waiting);
        assert_eq!(waiting.wait().unwrap().code(), Some(CANCELLED_EXIT));
        assert!(gate.exists(), "a cancelled attempt touches nothing");
        // Past its gate the command has SIGTERM's default action, not the trap.
        let c = Command { command: "sleep", args: &["30".to_string()], cwd: None, env: &[] };
        let gate2 = dir.join("gate2");
        std::fs::write(&gate2, GATE_CONTENT).unwrap();
        let g = Gate { gate_path: gate2.to_str().unwrap(), stdin_path: None, timeout_s: 30, attempt: 1 };
        let mut child = Proc::new("/bin/bash").arg("-c").arg(command_script(&c, Some(&g)).unwrap()).spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        term(&child);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(15));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn which_ends_may_leave_staged_files() {
        assert!(!staged_files_remain(&End::Exit(STAGED_REMOVED_EXIT.into()), false));
        assert!(!staged_files_remain(&End::Exit(GATE_TIMEOUT_EXIT.into()), false));
        assert!(!staged_files_remain(&End::Exit(0), true));
        assert!(staged_files_remain(&End::Exit(0), false));
        assert!(staged_files_remain(&End::Signal("SIGTERM".into()), true));
        assert!(staged_files_remain(&End::Signal("SIGTERM".into()), false));
        assert!(staged_files_remain(&End::Signal("SIGKILL".into()), true));
        assert!(staged_files_remain(&End::Unknown, true));
    }

    #[test]
    fn the_script_begins_with_its_attempt() {
        let c = Command { command: "true", args: &[], cwd: None, env: &[] };
        let g = Gate { gate_path: "/tmp/g", stdin_path: None, timeout_s: 1, attempt: 2 };
        assert!(command_script(&c, Some(&g)).unwrap().starts_with(&attempt_prefix(2)));
    }
}
