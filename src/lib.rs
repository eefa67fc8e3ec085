//! createos-execute: run commands in CreateOS sandboxes and prove every process is gone.
//!
//! The core (every module but `binding`) knows nothing about JavaScript; `binding` is the
//! napi glue, built with the default `node` feature.

pub mod abort;
pub mod cleanup;
pub mod client;
pub mod config;
pub mod emulator;
pub mod error;
pub mod execute;
pub mod follow;
pub mod output;
pub mod pacer;
pub mod script;
pub mod stream;

#[cfg(feature = "node")]
mod binding;
