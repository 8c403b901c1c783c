//! Trace reading, replays and pictures for the [`cuarena`] compacting GPU
//! arena, built on its public API only.
//!
//! - [`trace`]: PyTorch memory snapshots and CSV traces, read with bounded
//!   memory, turned into alloc/free programs and replayed on a metadata-only
//!   arena against non-moving baselines.
//! - [`viz`]: SVG timelines and memory maps.
//! - [`bestfit`]: an exact best-fit allocator in one region, the
//!   non-moving reference beside the arena.
//! - [`fragment`]: fragmentation shapes that stress the compaction policy.
//! - [`pytorch`]: a model of PyTorch's CUDA caching allocator, to replay a
//!   trace under other `PYTORCH_CUDA_ALLOC_CONF` settings.
//! - `gpu` (feature `cuda`, on by default): the real-bytes replay on a CUDA
//!   GPU, its pattern kernels, and the `cuMemAlloc` / CUDA memory-pool
//!   baselines.
//!
//! The `cuarena` command (crate `cuarena-cli`) is the front end of these.
//!
//! ```
//! use cuarena::ArenaConfig;
//! use cuarena_trace::trace::{replay, Op, Ops};
//!
//! // Two blocks of 1 KiB, the first freed, then one of 2 KiB: 3 KiB hold
//! // it only if the arena moves the second block.
//! let ops = Ops::from_ops(vec![
//!     Op::Alloc { id: 0, size: 1024 },
//!     Op::Alloc { id: 1, size: 1024 },
//!     Op::Free { id: 0 },
//!     Op::Alloc { id: 2, size: 2048 },
//! ]);
//! let report = replay(&ops, &ArenaConfig::new(3072))?;
//! assert!(report.completed());
//! assert_eq!(report.compaction.bytes_moved, 1024);
//! # Ok::<(), cuarena_trace::ToolError>(())
//! ```
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod bestfit;
mod error;
pub mod fragment;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod gpu;
pub mod pytorch;
pub mod trace;
pub mod viz;

pub use error::{Result, ToolError};
