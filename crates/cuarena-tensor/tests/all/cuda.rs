//! The same tests on a CUDA arena, and kernel arguments taken by many
//! threads at once. Ignored by default; asked for (`--include-ignored`)
//! where no CUDA driver or device is present, each fails with "no CUDA GPU".
#![cfg(feature = "cuda")]

use cuarena::backend::cuda::CudaBackend;
use cuarena::{Arena, ArenaConfig, SharedArena, StreamId};
use cuarena_tensor::Tensor;

use crate::threads::{concurrent_launches, host_launch};
use crate::{dtypes, threads, views};

/// A CUDA arena of `capacity` bytes on device 0, or `None` after printing
/// why there is none: the test kit's GPU check, which fails instead where
/// the GPU tests were asked for (`--include-ignored`).
fn cuda_arena(capacity: u64) -> Option<SharedArena<CudaBackend>> {
    cuarena_testkit::gpu_available()
        .then(|| SharedArena::new(Arena::cuda(ArenaConfig::new(capacity), 0).expect("CUDA arena")))
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn random_views_on_cuda() {
    let Some(arena) = cuda_arena(64 << 20) else {
        return;
    };
    for seed in 10..12 {
        views::random_views(&arena, seed, 60);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn strides_offsets_and_both_copy_paths_on_cuda() {
    let Some(arena) = cuda_arena(64 << 20) else {
        return;
    };
    views::strides_offsets_and_copy_paths(&arena);
    views::overlapping_copies(&arena);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn dtypes_reinterpret_and_check_on_cuda() {
    let Some(arena) = cuda_arena(16 << 20) else {
        return;
    };
    dtypes::dtypes_reinterpret_and_check(&arena);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn drops_on_other_threads_free_the_blocks_on_cuda() {
    let Some(arena) = cuda_arena(16 << 20) else {
        return;
    };
    threads::drops_on_other_threads_free_the_blocks(&arena);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn four_threads_at_full_fill_on_cuda() {
    let Some(arena) = cuda_arena(16 << 20) else {
        return;
    };
    threads::fragmentation_at_full_fill(&arena, 4, 300, 2);
}

/// A stream of its own for a launcher thread.
fn register_stream(arena: &SharedArena<CudaBackend>) -> StreamId {
    arena
        .with_mut(|a| {
            let stream = a.backend().stream().context().new_stream().expect("stream");
            a.register_stream(stream)
        })
        .expect("lock")
        .expect("register_stream")
}

/// Kernel arguments for the tensor on the thread's stream, under the
/// shared lock (the view is the tensor's span), then the host launch's
/// checks.
fn kernel_args_launch(
    arena: &SharedArena<CudaBackend>,
    stream: &StreamId,
    t: &Tensor<CudaBackend>,
    want: &[u32],
) {
    arena
        .with_kernel_args(*stream, &[t], |args| {
            let view = args.input::<u32>(t)?;
            assert_eq!(view.len() as u64, t.span().numel(), "the view is the span");
            Ok(())
        })
        .expect("kernel arguments");
    host_launch(arena, &(), t, want);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn eight_threads_take_kernel_arguments_while_another_compacts_on_cuda() {
    let Some(arena) = cuda_arena(512 << 10) else {
        return;
    };
    concurrent_launches(&arena, 8, register_stream, kernel_args_launch);
}
