//! Shell quoting and the bash script a command runs as.
//!
//! The managed process is `/bin/bash -lc <script>`. The script (1) waits for the start-gate
//! file, so the output stream is attached before the command can print, (2) removes the gate,
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

/// The start gate and staged stdin of a managed-process script.
pub struct Gate<'a> {
    pub gate_path: &'a str,
    pub stdin_path: Option<&'a str>,
    pub timeout_s: u64,
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
        let stdin_q = g.stdin_path.map(shell_quote).transpose()?;
        let remove_stdin = stdin_q.as_ref().map(|s| format!("rm -f -- {s}; ")).unwrap_or_default();
        lines.push(format!("__cos_end=$((SECONDS+{}))", g.timeout_s.max(1)));
        lines.push("__cos_nap=0.01".into());
        lines.push(format!("while [ ! -s {gate_q} ]; do"));
        lines.push(format!(
            "  if [ \"$SECONDS\" -ge \"$__cos_end\" ]; then {remove_stdin}rm -f -- {gate_q}; exit {GATE_TIMEOUT_EXIT}; fi"
        ));
        lines.push("  read -r -t 0.02 __cos_x 2>/dev/null".into());
        lines.push("  if [ $? -le 128 ]; then sleep \"$__cos_nap\"; case $__cos_nap in 0.01) __cos_nap=0.05;; 0.05) __cos_nap=0.25;; esac; fi".into());
        lines.push("done".into());
        lines.push(format!("rm -f -- {gate_q}"));
        match stdin_q {
            Some(s) => {
                lines.push(format!("exec 0< {s} || exit 126"));
                lines.push(format!("rm -f -- {s}"));
            }
            None => lines.push("exec 0</dev/null".into()),
        }
        lines.push("unset __cos_end __cos_nap __cos_x".into());
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
        let g = Gate { gate_path: gate.to_str().unwrap(), stdin_path: Some(stdin.to_str().unwrap()), timeout_s: 10 };
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
        let g = Gate { gate_path: gate.to_str().unwrap(), stdin_path: Some(stdin.to_str().unwrap()), timeout_s: 1 };
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
}
