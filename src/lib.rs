#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod arena;
pub mod backend;
pub mod config;
pub mod error;
mod handle;
pub mod placement;
pub mod plan;
pub mod scenario;
pub mod trace;
pub mod viz;

pub use arena::{fmt_bytes, Arena, CompactionReport, Stats};
pub use config::{ArenaConfig, CompactionPolicy};
pub use error::{Error, Result};
pub use handle::{BlockInfo, ElemType, Handle, TableEntry};
