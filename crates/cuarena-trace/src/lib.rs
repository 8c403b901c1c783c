//! Tooling beside the allocator (feature `tools`): trace readers, replays,
//! pictures and test scenarios. Nothing in the core imports from here.
//!
//! - [`trace`]: PyTorch memory snapshots and CSV traces, read with bounded
//!   memory, turned into alloc/free programs and replayed on an arena.
//! - [`viz`]: SVG timelines and memory maps.
//! - [`fragment`]: fragmentation shapes that stress the compaction policy.
//! - [`scenario`]: the demo's seeded program of variable-size tensors.
//! - `gpu` (with `cuda`): the real-bytes replay on the GPU, its pattern
//!   kernels, and the `cuMemAlloc` / CUDA memory-pool baselines.

mod error;
pub mod fragment;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod gpu;
pub mod scenario;
pub mod trace;
pub mod viz;

pub use error::{Result, ToolError};
