//! All integration tests in one binary (one link, one run), a module per topic.
//! Modules that need the CUDA backend are compiled only with it, so
//! `cargo test -p cuarena --no-default-features` runs the host-only core's.
//! The trace readers', replays' and the command's tests live with their
//! crates (`crates/cuarena-trace`, `crates/cuarena-cli`). What the modules
//! share with the other crates' tests and the benches (the generator, the
//! GPU check, the test kernels) is in `crates/cuarena-testkit`.
#[cfg(feature = "cuda")]
mod abi;
mod arena;
mod bound;
mod elastic;
mod errors;
#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
mod gpu_elastic;
#[cfg(feature = "cuda")]
mod gpu_graph;
#[cfg(feature = "cuda")]
mod gpu_spill;
#[cfg(feature = "cuda")]
mod gpu_streams;
mod guarantee;
mod model;
#[cfg(feature = "nccl")]
mod nccl;
#[cfg(feature = "nccl")]
mod nccl_elastic;
mod pins;
mod shared;
mod spill;
mod threads;

/// Free regions `(offset, len)` of `a`'s region, in address order: the
/// gaps between its resident blocks, where their bytes are (a block whose
/// move is deferred counts where its bytes lie).
pub(crate) fn free_regions<B: cuarena::backend::Backend>(a: &cuarena::Arena<B>) -> Vec<(u64, u64)> {
    let mut used: Vec<(u64, u64)> = a
        .blocks()
        .iter()
        .filter(|b| b.resident)
        .map(|b| (b.offset, b.reserved_bytes))
        .collect();
    used.sort_unstable();
    let mut free = Vec::new();
    let mut cursor = 0;
    let capacity = a.config().capacity_bytes;
    for (offset, len) in used.into_iter().chain([(capacity, 0)]) {
        if offset > cursor {
            free.push((cursor, offset - cursor));
        }
        cursor = cursor.max(offset + len);
    }
    free
}
