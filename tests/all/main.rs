//! All integration tests in one binary (one link, one run), a module per topic.
//! Modules that need the CUDA backend or the tools are compiled only with
//! those features, so `cargo test --no-default-features` runs the core's.
#[cfg(feature = "cuda")]
mod abi;
mod arena;
mod bound;
#[cfg(feature = "tools")]
mod cli;
#[cfg(all(feature = "cuda", feature = "tools"))]
mod gpu;
#[cfg(feature = "cuda")]
mod gpu_graph;
#[cfg(feature = "cuda")]
mod gpu_skip;
#[cfg(all(feature = "cuda", feature = "tools"))]
mod gpu_spill;
#[cfg(feature = "cuda")]
mod gpu_streams;
mod guarantee;
#[cfg(feature = "tools")]
mod hostile;
mod model;
#[cfg(feature = "nccl")]
mod nccl;
mod pins;
mod shared;
#[cfg(feature = "tools")]
mod snapshots;
mod spill;
mod threads;
#[cfg(feature = "tools")]
mod trace;
