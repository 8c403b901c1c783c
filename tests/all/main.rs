//! All integration tests in one binary (one link, one run), a module per topic.
//! Modules that need the CUDA backend are compiled only with it, so
//! `cargo test -p cuarena --no-default-features` runs the host-only core's.
//! The trace readers', replays' and the command's tests live with their
//! crates (`crates/cuarena-trace`, `crates/cuarena-cli`). What the modules
//! share with each other and with the benches is in `tests/support`.
#[cfg(feature = "cuda")]
mod abi;
mod arena;
mod bound;
#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
mod gpu_graph;
#[cfg(feature = "cuda")]
mod gpu_skip;
#[cfg(feature = "cuda")]
mod gpu_spill;
#[cfg(feature = "cuda")]
mod gpu_streams;
mod guarantee;
mod model;
#[cfg(feature = "nccl")]
mod nccl;
mod pins;
mod shared;
mod spill;
#[path = "../support/mod.rs"]
mod support;
mod threads;
