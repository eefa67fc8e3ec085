//! createos-execute's core: run commands in CreateOS sandboxes and prove every process is gone.
//!
//! Knows nothing about JavaScript or the emulator: the napi addon (the workspace root) is a thin
//! layer over [`execute::execute`] and friends, and the emulator is the other side of the wire.
#![forbid(unsafe_code)]
// A panic in a call must never skip a cleanup: the core does not unwrap what it did not check.
#![warn(clippy::unwrap_used)]

pub mod abort;
pub mod cleanup;
pub mod client;
pub mod config;
pub mod create;
pub mod error;
pub mod events;
pub mod execute;
pub mod follow;
pub mod hooks;
pub mod net;
pub mod output;
pub mod pacer;
pub mod result;
pub mod script;
pub mod session;
pub mod stream;
pub mod transport;
pub mod warnings;
