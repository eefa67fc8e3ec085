//! The one error type of the crate.
//!
//! Every message is fixed text: no URL, query, body, key or provider text ever reaches it.
//! Variants carry data (status, operation, cleanup report) so the JS edge can build the right
//! class; the JS edge is the only place that turns a variant into a JS error.

use std::fmt;

/// A fixed label for each kind of request, used in error messages instead of the URL.
/// The labels of operations the TypeScript module had are its labels, word for word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    FileTransfer,
    ProcessCreation,
    StdinClose,
    ProcessInput,
    OutputConnection,
    ProcessCleanup,
    ProcessStatus,
    WorkspaceCommand,
    SandboxLifecycle,
}

impl Operation {
    pub fn label(self) -> &'static str {
        match self {
            Operation::FileTransfer => "file transfer",
            Operation::ProcessCreation => "process creation",
            Operation::StdinClose => "stdin close",
            Operation::ProcessInput => "process input",
            Operation::OutputConnection => "output connection",
            Operation::ProcessCleanup => "process cleanup",
            Operation::ProcessStatus => "process status",
            Operation::WorkspaceCommand => "workspace command",
            Operation::SandboxLifecycle => "sandbox lifecycle",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Why containment could not be proven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CleanupReason {
    CreationUnconfirmed,
    TerminationUnconfirmed,
}

impl CleanupReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CleanupReason::CreationUnconfirmed => "creation-unconfirmed",
            CleanupReason::TerminationUnconfirmed => "termination-unconfirmed",
        }
    }
}

/// One step of a cleanup or recovery, with what it got. `outcome` is built only from fixed
/// words and numbers (statuses, booleans), never from provider text.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub step: &'static str,
    pub grace_ms: Option<u64>,
    pub outcome: String,
    pub at_ms: f64,
}

/// What a host needs to react to an unproven containment.
#[derive(Debug, Clone, PartialEq)]
pub struct CleanupReport {
    pub reason: CleanupReason,
    pub sandbox_id: String,
    pub process_id: Option<String>,
    pub attempts: Vec<Attempt>,
}

/// What a host learns when a sandbox could not be proven destroyed.
#[derive(Debug, Clone, PartialEq)]
pub struct DestroyReport {
    pub sandbox_id: String,
    pub attempts: Vec<Attempt>,
    /// The HTTP status of the final answer that ended the attempts (a 401, a 403…), when one
    /// did; `None` when the deadline ended them. The message names it.
    pub status: Option<u16>,
}

pub const DESTROY_UNCONFIRMED: &str = "CreateOS sandbox destruction could not be confirmed.";
pub const CREATION_UNCONFIRMED: &str =
    "CreateOS process creation could not be confirmed; destroy the lease before reusing it.";
pub const TERMINATION_UNCONFIRMED: &str = "CreateOS command cleanup failed; process termination is unconfirmed.";
/// The `Internal` text of a caught panic.
pub const PANIC: &str = "a panic in native code";
pub const CANCELLED: &str = "CreateOS command was cancelled.";
pub const UNTRUSTED_CERTIFICATE: &str = "CreateOS TLS certificate is not trusted.";
pub const NOT_STARTED: &str = "CreateOS command did not start; its start gate could not be opened.";
pub const PROXY_REFUSED: &str = "CreateOS proxy refused the connection.";
pub const PROXY_UNREACHABLE: &str = "CreateOS proxy could not be reached.";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input from the caller, found before any request is sent.
    #[error("{0}")]
    Input(&'static str),
    /// The server answered a non-2xx status.
    #[error("CreateOS request failed (HTTP {status}) during {op}.")]
    Api { status: u16, op: Operation },
    /// No usable answer: the connection failed, was reset, or timed out.
    #[error("CreateOS connection failed.")]
    Connection { op: Operation, maybe_sent: bool },
    /// The server's TLS certificate did not verify against the trusted roots (bundled web
    /// roots, `NODE_EXTRA_CA_CERTS`, the system store with `NODE_USE_SYSTEM_CA=1`,
    /// `caCertPem`). Nothing was sent: the handshake failed before any request byte.
    #[error("CreateOS TLS certificate is not trusted.")]
    UntrustedCertificate { op: Operation },
    /// The proxy answered the `CONNECT` with something other than 200: a 407 (its
    /// credentials are missing or wrong; `status` is then 407), a 403, a 502 when it cannot
    /// reach CreateOS itself, … (`status` is `None`: the HTTP stack only tells a 407 apart),
    /// or it closed the connection instead of answering. Nothing reached CreateOS.
    #[error("{}", proxy_refused_message(*.status))]
    ProxyRefused { op: Operation, status: Option<u16> },
    /// The proxy itself could not be reached (connection refused, unknown host, timed out,
    /// TLS to an `https://` proxy failed), or the connection to it broke before it answered
    /// the `CONNECT`. Nothing reached CreateOS.
    #[error("{PROXY_UNREACHABLE}")]
    ProxyUnreachable { op: Operation },
    /// The command never ran: its start gate could not be opened (the gate upload failed
    /// with an answer that proves it was not written, or the gate deadline passed first).
    /// Its process was ended and proven gone before this is returned.
    #[error("CreateOS command did not start; its start gate could not be opened.")]
    NotStarted,
    /// A 3xx answer. Redirects are refused, never followed.
    #[error("CreateOS answered with a redirect, which is refused.")]
    Redirect { op: Operation },
    /// The host's fetch is an interception library's (undici `MockAgent`, nock, msw) and no
    /// mock matched the request: nothing was sent (the JS edge keeps the library's error as
    /// the `cause`, cleaned of the key and of URL queries).
    #[error("CreateOS request was not sent: no mock of the host's fetch answered the {op} request.")]
    Unmatched { op: Operation },
    /// The answer or the stream broke the protocol (fixed messages, see `stream.rs`).
    #[error("{0}")]
    Protocol(&'static str),
    /// The caller's signal fired with a reason other than a timeout.
    #[error("CreateOS command was cancelled.")]
    Cancelled,
    /// The caller's signal fired with a `TimeoutError` reason. `execute` turns this into a
    /// `timedOut` result; other entry points report it as a cancellation.
    #[error("CreateOS command timed out.")]
    TimedOut,
    /// Containment is unproven: the host must destroy the sandbox.
    #[error("{}", cleanup_message(.0.reason))]
    Cleanup(Box<CleanupReport>),
    /// `destroySandbox` could not prove the sandbox gone within its deadline.
    #[error("{}", destroy_message(.0.status))]
    DestroyUnconfirmed(Box<DestroyReport>),
    /// A bug of ours (a panic, an impossible state). Fixed text only.
    #[error("createos-execute internal error: {0}.")]
    Internal(&'static str),
}

fn destroy_message(status: Option<u16>) -> std::borrow::Cow<'static, str> {
    match status {
        Some(status) => format!("CreateOS sandbox destruction could not be confirmed (HTTP {status}).").into(),
        None => DESTROY_UNCONFIRMED.into(),
    }
}

fn cleanup_message(reason: CleanupReason) -> &'static str {
    match reason {
        CleanupReason::CreationUnconfirmed => CREATION_UNCONFIRMED,
        CleanupReason::TerminationUnconfirmed => TERMINATION_UNCONFIRMED,
    }
}

fn proxy_refused_message(status: Option<u16>) -> &'static str {
    match status {
        Some(407) => "CreateOS proxy refused the connection (HTTP 407).",
        _ => PROXY_REFUSED,
    }
}

impl Error {
    /// The HTTP status, for API errors.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The JS `code` of errors that have their own (index.js uses `CREATEOS_ERROR` otherwise).
    pub fn code(&self) -> Option<&'static str> {
        match self {
            Error::UntrustedCertificate { .. } => Some("CREATEOS_TLS_UNTRUSTED"),
            Error::NotStarted => Some("CREATEOS_NOT_STARTED"),
            Error::ProxyRefused { .. } => Some("CREATEOS_PROXY_REFUSED"),
            Error::ProxyUnreachable { .. } => Some("CREATEOS_PROXY_UNREACHABLE"),
            Error::Unmatched { .. } => Some("CREATEOS_FETCH_UNMATCHED"),
            _ => None,
        }
    }

    /// True when the caller's signal ended the work (timed out or cancelled).
    pub fn is_abort(&self) -> bool {
        matches!(self, Error::Cancelled | Error::TimedOut)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_fixed_and_match_the_typescript_module() {
        let e = Error::Api { status: 503, op: Operation::ProcessCleanup };
        assert_eq!(e.to_string(), "CreateOS request failed (HTTP 503) during process cleanup.");
        let report = CleanupReport {
            reason: CleanupReason::TerminationUnconfirmed,
            sandbox_id: "sb".into(),
            process_id: None,
            attempts: vec![],
        };
        assert_eq!(Error::Cleanup(Box::new(report)).to_string(), TERMINATION_UNCONFIRMED);
        assert_eq!(Error::Cancelled.to_string(), CANCELLED);
        assert_eq!(Error::UntrustedCertificate { op: Operation::ProcessCreation }.to_string(), UNTRUSTED_CERTIFICATE);
        assert_eq!(Error::NotStarted.to_string(), NOT_STARTED);
        assert_eq!(Error::NotStarted.code(), Some("CREATEOS_NOT_STARTED"));
        let op = Operation::ProcessCreation;
        let e = Error::ProxyRefused { op, status: Some(407) };
        assert_eq!(e.to_string(), "CreateOS proxy refused the connection (HTTP 407).");
        assert_eq!(e.code(), Some("CREATEOS_PROXY_REFUSED"));
        assert_eq!(Error::ProxyRefused { op, status: None }.to_string(), PROXY_REFUSED);
        assert_eq!(Error::ProxyUnreachable { op }.to_string(), PROXY_UNREACHABLE);
        assert_eq!(Error::ProxyUnreachable { op }.code(), Some("CREATEOS_PROXY_UNREACHABLE"));
        let e = Error::Unmatched { op };
        assert_eq!(
            e.to_string(),
            "CreateOS request was not sent: no mock of the host's fetch answered the process creation request."
        );
        assert_eq!(e.code(), Some("CREATEOS_FETCH_UNMATCHED"));
        let destroy = |status| {
            Error::DestroyUnconfirmed(Box::new(DestroyReport { sandbox_id: "sb".into(), attempts: vec![], status }))
        };
        assert_eq!(destroy(None).to_string(), DESTROY_UNCONFIRMED);
        assert_eq!(destroy(Some(401)).to_string(), "CreateOS sandbox destruction could not be confirmed (HTTP 401).");
    }
}
