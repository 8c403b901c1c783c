//! cuarena: a compacting GPU tensor arena with handle indirection.
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod backend;
pub mod config;
pub mod error;
pub mod placement;
pub mod plan;
pub mod trace;
pub mod viz;

pub use config::{ArenaConfig, CompactionPolicy};
pub use error::{Error, Result};
