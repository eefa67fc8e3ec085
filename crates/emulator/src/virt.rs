//! Virtual processes ([`crate::EmulatorOptions::virtual_processes`]): commands the emulator
//! plays itself, without starting a program, so that a test or a benchmark can hold ten
//! thousand commands in flight on a small machine (a real `sh` + `sleep` pair costs a few
//! hundred KB of memory and two pids; a virtual one, a task and its journal).
//!
//! A process is virtual when its command is `createos-virtual`, given directly (`cmd`) or as
//! the word after `exec --` on the last line of a `bash -c` script (how `createos-execute`
//! runs a command). Its arguments are steps, played in order:
//! `out:TEXT` (TEXT on stdout), `err:TEXT` (on stderr), `sleep:MS`, `exit:N` (end with status
//! N; without it the process ends with 0 after its last step). An unknown step writes a line
//! on stderr and ends the process with status 2.
//!
//! Everything the API shows is kept: the process record (a pid above any real pid, never
//! signalled), the output journal and its stream, `wait`, the retained output. Signals reach
//! it through the API alone (`DELETE`, `signal`, a sandbox DELETE, close): SIGCHLD, SIGCONT,
//! SIGURG, SIGWINCH, SIGSTOP and SIGTSTP are ignored, every other signal ends it at once with
//! that signal (a DELETE's SIGTERM, then SIGKILL after the grace if it still ran, which
//! cannot happen: a virtual process obeys at once). It has no descendants, so both
//! termination scopes end it whole, and `tree_exited` is true from its exit on.
//!
//! When it runs as the last line of a script with `createos-execute`'s start gate, the gate's
//! protocol is played as the script would (see the core crate's `script` module): wait for the
//! gate file to have content (woken by the Files API's writes to the sandbox, else looking
//! every 10 ms backing off to 250 ms), exit 124 when the cancel file names this attempt or a
//! later one, claim the gate with an exclusive create, remove the gate, the claim and the
//! staged stdin file, exit 125 past the gate's timeout, and on SIGTERM before the gate remove
//! the staged files and exit 122 (124 when cancelled). The script's other lines (`cd`,
//! `export`) do not matter to a virtual command and are not played.
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use nix::sys::signal::Signal;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::model::{self, Proc, Sandbox};
use super::Inner;

/// The command name that makes a process virtual.
pub(crate) const VIRTUAL_CMD: &str = "createos-virtual";

/// Virtual pids start above any real one (Linux's `pid_max` is at most 2^22).
const PID_BASE: i32 = 1 << 30;
static NEXT_PID: AtomicI32 = AtomicI32::new(0);

/// Status of a script whose start gate never opened, whose attempt was cancelled, and that got
/// SIGTERM before its gate (the values of the core crate's `script` module).
const GATE_TIMEOUT_EXIT: i32 = 125;
const CANCELLED_EXIT: i32 = 124;
const STAGED_REMOVED_EXIT: i32 = 122;

/// At most this much text per `out:`/`err:` step is one journal frame.
const FRAME: usize = model::FRAME_MAX;

pub(crate) enum Step {
    Out(u8, Bytes),
    Sleep(Duration),
    Exit(i32),
    Unknown(String),
}

/// The start gate of a `createos-execute` script, as its lines name it.
pub(crate) struct Gate {
    gate: String,
    stdin: Option<String>,
    attempt: u64,
    timeout: Duration,
}

pub(crate) struct Plan {
    gate: Option<Gate>,
    steps: Vec<Step>,
}

/// Signals sent to a virtual process, taken by its task.
#[derive(Default)]
pub(crate) struct Control {
    pending: Mutex<Option<Signal>>,
    wake: Notify,
}

impl Control {
    /// Deliver `sig` (a SIGKILL replaces a pending signal; others wait their turn behind it).
    pub fn deliver(&self, sig: Signal) {
        if ignored(sig) {
            return;
        }
        let mut p = self.pending.lock().unwrap();
        if p.is_none() || sig == Signal::SIGKILL {
            *p = Some(sig);
        }
        drop(p);
        self.wake.notify_one();
    }

    async fn signalled(&self) -> Signal {
        loop {
            if let Some(s) = self.pending.lock().unwrap().take() {
                return s;
            }
            self.wake.notified().await;
        }
    }

    fn take(&self) -> Option<Signal> {
        self.pending.lock().unwrap().take()
    }
}

fn ignored(sig: Signal) -> bool {
    matches!(
        sig,
        Signal::SIGCHLD | Signal::SIGCONT | Signal::SIGURG | Signal::SIGWINCH | Signal::SIGSTOP | Signal::SIGTSTP
    )
}

/// The words of a line of `createos-execute`'s quoting: single-quoted segments, `"'"` for a
/// quote, bare characters, separated by spaces. `None` for anything else.
fn words(line: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if let Some(w) = cur.take() {
                    out.push(w);
                }
            }
            '\'' => {
                let w = cur.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => w.push(c),
                    }
                }
            }
            '"' => {
                let w = cur.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' | '$' | '`' => return None,
                        c => w.push(c),
                    }
                }
            }
            '\n' | '\\' | '$' | '`' | ';' | '|' | '&' | '<' | '>' | '(' | ')' => return None,
            c => cur.get_or_insert_with(String::new).push(c),
        }
    }
    out.extend(cur);
    Some(out)
}

fn steps(args: &[String]) -> Vec<Step> {
    args.iter()
        .map(|a| {
            let (kind, value) = a.split_once(':').unwrap_or((a.as_str(), ""));
            let parsed = match kind {
                "out" => Some(Step::Out(0, Bytes::copy_from_slice(value.as_bytes()))),
                "err" => Some(Step::Out(1, Bytes::copy_from_slice(value.as_bytes()))),
                "sleep" => value.parse::<u64>().ok().map(|ms| Step::Sleep(Duration::from_millis(ms))),
                "exit" => value.parse::<i32>().ok().filter(|c| (0..=255).contains(c)).map(Step::Exit),
                _ => None,
            };
            parsed.unwrap_or_else(|| Step::Unknown(a.clone()))
        })
        .collect()
}

/// The gate a script names: `__cos_attempt=N` (its first line), `__cos_end=$((SECONDS+T))`,
/// `if [ -s GATE ]; then …` and `exec 0< STDIN || exit 126`.
fn gate(lines: &[&str]) -> Option<Gate> {
    let attempt = lines.first()?.strip_prefix("__cos_attempt=")?.parse().ok()?;
    let timeout =
        lines.iter().find_map(|l| l.strip_prefix("__cos_end=$((SECONDS+")?.strip_suffix("))")?.parse::<u64>().ok())?;
    let gate = lines.iter().find_map(|l| {
        let rest = l.trim_start().strip_prefix("if [ -s ")?;
        let (quoted, _) = rest.split_once(" ]; then")?;
        words(quoted)?.into_iter().next()
    })?;
    let stdin = lines.iter().find_map(|l| {
        let quoted = l.strip_prefix("exec 0< ")?.strip_suffix(" || exit 126")?;
        words(quoted)?.into_iter().next()
    });
    Some(Gate { gate, stdin, attempt, timeout: Duration::from_secs(timeout) })
}

/// What a creation runs when it is virtual; `None` for a real program.
pub(crate) fn plan(cmd: &str, args: &[String]) -> Option<Plan> {
    if cmd.rsplit('/').next() == Some(VIRTUAL_CMD) {
        return Some(Plan { gate: None, steps: steps(args) });
    }
    let script = args.last()?;
    if args.len() < 2 || !args[args.len() - 2].ends_with('c') || !args[args.len() - 2].starts_with('-') {
        return None;
    }
    // The command's words may hold newlines (inside quotes): the `exec` line is the first
    // `exec -- ` at a line start whose remainder is words and nothing else.
    let starts = std::iter::once(0).chain(script.match_indices('\n').map(|(i, _)| i + 1));
    let (at, last) = starts.filter_map(|i| Some((i, words(script[i..].strip_prefix("exec -- ")?)?))).next()?;
    let lines: Vec<&str> = script[..at].lines().collect();
    let (first, rest) = last.split_first()?;
    if first.rsplit('/').next() != Some(VIRTUAL_CMD) {
        return None;
    }
    let gate = if lines.first()?.starts_with("__cos_attempt=") { Some(gate(&lines)?) } else { None };
    Some(Plan { gate, steps: steps(rest) })
}

/// Start a virtual process (the caller checked the options and the plan).
pub(crate) fn start(
    inner: &Arc<Inner>,
    sb: &Arc<Sandbox>,
    cmd: &str,
    args: Vec<String>,
    cwd: String,
    plan: Plan,
) -> Arc<Proc> {
    let pid = PID_BASE + NEXT_PID.fetch_add(1, Ordering::Relaxed) % (i32::MAX - PID_BASE);
    let proc = Arc::new(Proc {
        virt: Some(Control::default()),
        ..Proc::fresh(inner, model::new_hex_id("proc_"), pid, cmd, args, cwd)
    });
    sb.procs.lock().unwrap().push(proc.clone());
    inner.live_virtual.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(run(inner.clone(), sb.clone(), proc.clone(), plan));
    proc
}

enum End {
    Code(i32),
    Signal(Signal),
}

async fn run(inner: Arc<Inner>, sb: Arc<Sandbox>, proc: Arc<Proc>, plan: Plan) {
    let Some(ctl) = proc.virt.as_ref() else { return };
    let end = play(&inner, &sb, &proc, ctl, plan).await;
    let (code, signal) = match end {
        End::Code(c) => (Some(c), None),
        End::Signal(s) => (None, Some(s.as_str().to_string())),
    };
    {
        let mut st = proc.st.lock().unwrap();
        st.leader_exited = true;
        st.finished_at = Some(model::rfc3339_now());
        st.exit_code = code;
        st.signal = signal;
        st.eof = [true, true];
        st.tree_exited_real = true;
    }
    model::retire(&inner, &proc);
    proc.st.lock().unwrap().exit_ready = true;
    inner.live_virtual.fetch_sub(1, Ordering::SeqCst);
    proc.bump();
}

async fn play(inner: &Inner, sb: &Sandbox, proc: &Proc, ctl: &Control, plan: Plan) -> End {
    if let Some(g) = &plan.gate {
        if let Err(end) = pass_gate(inner, sb, ctl, g).await {
            return end;
        }
    }
    for step in plan.steps {
        if let Some(sig) = ctl.take() {
            return End::Signal(sig);
        }
        match step {
            Step::Out(stream, data) => write(proc, stream, data),
            Step::Sleep(d) => {
                tokio::select! {
                    () = tokio::time::sleep(d) => {}
                    sig = ctl.signalled() => return End::Signal(sig),
                    () = inner.shutdown.cancelled() => return End::Signal(Signal::SIGKILL),
                }
            }
            Step::Exit(code) => return End::Code(code),
            Step::Unknown(s) => {
                write(proc, 1, Bytes::from(format!("{VIRTUAL_CMD}: unknown step {s:?}\n")));
                return End::Code(2);
            }
        }
    }
    ctl.take().map_or(End::Code(0), End::Signal)
}

/// A step's text, in frames of at most [`FRAME`] bytes.
fn write(proc: &Proc, stream: u8, mut data: Bytes) {
    while !data.is_empty() {
        proc.record(stream, data.split_to(data.len().min(FRAME)));
    }
}

fn host(sb: &Sandbox, p: &str) -> Option<PathBuf> {
    sb.map_path(p).ok()
}

fn remove(sb: &Sandbox, paths: &[Option<&str>]) {
    for p in paths.iter().flatten() {
        if let Some(h) = host(sb, p) {
            let _ = std::fs::remove_file(h);
        }
    }
}

/// Whether the cancel file names this attempt or a later one (anything but a number cancels).
fn cancelled(sb: &Sandbox, g: &Gate) -> bool {
    let Some(path) = host(sb, &format!("{}.cancelled", g.gate)) else { return true };
    match std::fs::read_to_string(path) {
        Ok(s) if !s.is_empty() => {
            let first = s.lines().next().unwrap_or("");
            first.parse::<u64>().map_or(true, |n| n >= g.attempt)
        }
        _ => false,
    }
}

async fn pass_gate(inner: &Inner, sb: &Sandbox, ctl: &Control, g: &Gate) -> Result<(), End> {
    let claim = format!("{}.claimed", g.gate);
    let deadline = Instant::now() + g.timeout;
    let mut nap = Duration::from_millis(10);
    loop {
        let written = sb.files.notified();
        tokio::pin!(written);
        written.as_mut().enable();
        if cancelled(sb, g) {
            return Err(End::Code(CANCELLED_EXIT));
        }
        let open = host(sb, &g.gate).and_then(|p| std::fs::metadata(p).ok()).is_some_and(|m| m.len() > 0);
        if open {
            if cancelled(sb, g) {
                return Err(End::Code(CANCELLED_EXIT));
            }
            let claimed = host(sb, &claim)
                .is_some_and(|p| std::fs::OpenOptions::new().write(true).create_new(true).open(p).is_ok());
            if !claimed {
                return Err(End::Code(CANCELLED_EXIT));
            }
            remove(sb, &[Some(&g.gate), Some(&claim), g.stdin.as_deref()]);
            return Ok(());
        }
        if Instant::now() >= deadline {
            remove(sb, &[g.stdin.as_deref(), Some(&g.gate)]);
            return Err(End::Code(GATE_TIMEOUT_EXIT));
        }
        tokio::select! {
            () = written => {}
            () = tokio::time::sleep(nap) => nap = (nap * 5).min(Duration::from_millis(250)),
            sig = ctl.signalled() => {
                if sig != Signal::SIGTERM {
                    return Err(End::Signal(sig));
                }
                if cancelled(sb, g) {
                    return Err(End::Code(CANCELLED_EXIT));
                }
                remove(sb, &[Some(&g.gate), Some(&claim), g.stdin.as_deref()]);
                return Err(End::Code(STAGED_REMOVED_EXIT));
            }
            () = inner.shutdown.cancelled() => return Err(End::Signal(Signal::SIGKILL)),
        }
    }
}

/// Wait (up to `deadline`) until a virtual process has exited.
async fn exited(p: &Proc, deadline: Instant) -> bool {
    let mut rx = p.tx.subscribe();
    loop {
        rx.borrow_and_update();
        if p.st.lock().unwrap().leader_exited {
            return true;
        }
        if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
            return p.st.lock().unwrap().leader_exited;
        }
    }
}

/// [`model::terminate`] of a virtual process: SIGTERM, the grace, SIGKILL, 2 s more.
pub(crate) async fn terminate(p: &Proc, ctl: &Control, grace: Duration) -> bool {
    if p.st.lock().unwrap().leader_exited {
        return true;
    }
    p.st.lock().unwrap().terminating = true;
    p.bump();
    ctl.deliver(Signal::SIGTERM);
    let mut gone = exited(p, Instant::now() + grace).await;
    if !gone {
        ctl.deliver(Signal::SIGKILL);
        gone = exited(p, Instant::now() + Duration::from_secs(2)).await;
    }
    p.st.lock().unwrap().terminating = false;
    p.bump();
    gone
}

/// [`model::kill_now`] of a virtual process.
pub(crate) async fn kill_now(p: &Proc, ctl: &Control) -> bool {
    ctl.deliver(Signal::SIGKILL);
    exited(p, Instant::now() + Duration::from_secs(2)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_of_our_quoting() {
        assert_eq!(words("'a b' 'it'\"'\"'s' c").unwrap(), vec!["a b", "it's", "c"]);
        assert_eq!(words("'out:x\n'").unwrap(), vec!["out:x\n"]);
        assert!(words("a; b").is_none());
        assert!(words("'open").is_none());
    }

    #[test]
    fn plans() {
        assert!(plan("sh", &["-c".into(), "echo hi".into()]).is_none());
        let p = plan("createos-virtual", &["out:a".into(), "sleep:5".into(), "exit:3".into(), "bogus".into()]).unwrap();
        assert!(p.gate.is_none());
        assert!(matches!(p.steps[..], [Step::Out(0, _), Step::Sleep(_), Step::Exit(3), Step::Unknown(_)]));
        let script = "__cos_attempt=2\n__cos_end=$((SECONDS+30))\n  if [ -s '/tmp/g' ]; then x; fi\nexec 0< '/tmp/in' || exit 126\ncd -- '/w' || exit\nexec -- 'createos-virtual' 'out:hi\n'";
        let p = plan("/bin/bash", &["-lc".into(), script.into()]).unwrap();
        let g = p.gate.unwrap();
        assert_eq!(
            (g.gate.as_str(), g.stdin.as_deref(), g.attempt, g.timeout),
            ("/tmp/g", Some("/tmp/in"), 2, Duration::from_secs(30))
        );
        assert!(plan("/bin/bash", &["-lc".into(), "exec -- 'sleep' '1'".into()]).is_none());
    }
}
