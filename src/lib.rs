// The README is the crate's documentation (its examples run as doc tests);
// its CUDA examples need the `cuda` feature.
#![cfg_attr(feature = "cuda", doc = include_str!("../README.md"))]
#![cfg_attr(
    not(feature = "cuda"),
    doc = "A compacting tensor arena with handle indirection (built without the `cuda` \
           feature: the host-only core). The README, with the full documentation, is the \
           crate's documentation when `cuda` is on."
)]
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(clippy::undocumented_unsafe_blocks)]

mod arena;
pub mod backend;
mod config;
mod dtype;
mod error;
mod handle;
mod placement;
pub mod plan;
mod slots;
mod storage;
mod stream;

/// The guide: the model, threads, errors, spilling, kernels on arena
/// tensors, streams, several GPUs, the GPU suite and safety, in detail
/// (`docs/guide.md`; its examples run as doc tests, and its CUDA examples
/// need the `cuda` feature).
#[cfg(feature = "cuda")]
#[doc = include_str!("../docs/guide.md")]
pub mod guide {
    // The names the guide links to.
    #[allow(unused_imports)]
    use crate::*;
}

/// The compaction policies: what each moves and promises, with the proofs
/// (`docs/policies.md`).
#[doc = include_str!("../docs/policies.md")]
pub mod policies {}

#[cfg(feature = "cuda")]
pub use arena::cuda::{args::KernelArgs, graph};
pub use arena::{fmt_bytes, Arena, CompactionReport, PolicyStats, SharedArena, Stats};
pub use config::{ArenaConfig, CompactionPolicy};
pub use dtype::{DType, Element};
pub use error::{BackendError, Error, Result};
pub use handle::{BlockInfo, Handle};
pub use storage::{AsRange, BlockRange, Storage, StorageSlice};
pub use stream::StreamId;

/// The bytemuck this crate is built with: typed calls take its `Pod` types.
pub use bytemuck;
/// The half this crate is built with: its `f16` and `bf16` are the
/// elements of [`DType::F16`] and [`DType::BF16`].
pub use half;
