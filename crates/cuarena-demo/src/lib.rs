//! The demo's program (`cargo run --release --example demo` at the
//! repository root): the fragmentation scenario of every bug report, run on
//! a compacting arena and on a non-moving one of the same capacity.
//!
//! Not published: a newcomer's first run, kept to the core's public API
//! (and the trace crate's memory-map picture).
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod scenario;

use std::fmt;

/// `Result` with [`DemoError`] as its default error.
pub type Result<T, E = DemoError> = std::result::Result<T, E>;

/// Why the scenario stopped.
#[derive(Debug)]
pub enum DemoError {
    /// An arena call of the compacting arena failed.
    Arena(cuarena::Error),
    /// The baseline arena given to the scenario compacts: it must be made
    /// with `CompactionPolicy::Manual`.
    BaselineCompacts,
    /// The loop left the free memory in one piece: there is nothing to
    /// demonstrate (too few steps for the capacity).
    NoFragmentation,
    /// A live tensor did not hold its bytes after the compaction.
    DataMismatch {
        /// Bytes of the tensor.
        tensor_bytes: u64,
        /// 32-bit words that differ.
        mismatched_words: u64,
    },
}

impl fmt::Display for DemoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DemoError::Arena(e) => e.fmt(f),
            DemoError::BaselineCompacts => {
                f.write_str("the baseline arena must not compact (CompactionPolicy::Manual)")
            }
            DemoError::NoFragmentation => {
                f.write_str("the loop left no fragmentation to demonstrate; use more steps")
            }
            DemoError::DataMismatch {
                tensor_bytes,
                mismatched_words,
            } => write!(
                f,
                "data mismatch: {mismatched_words} words of a live tensor of {} changed",
                cuarena::fmt_bytes(*tensor_bytes)
            ),
        }
    }
}

impl std::error::Error for DemoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DemoError::Arena(e) => Some(e),
            _ => None,
        }
    }
}

impl From<cuarena::Error> for DemoError {
    fn from(e: cuarena::Error) -> Self {
        DemoError::Arena(e)
    }
}
