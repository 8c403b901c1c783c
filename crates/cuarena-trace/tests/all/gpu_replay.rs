//! The real-bytes replay on the GPU (`cuarena_trace::gpu`). Ignored by
//! default; asked for (`--include-ignored`) where no GPU is usable, it fails
//! with "no CUDA GPU" (the test kit's check).

use cuarena::backend::cuda::CudaOptions;
use cuarena::ArenaConfig;
use cuarena_testkit::gpu_available;

/// A synthetic trace under pressure, replayed on the GPU with real bytes at
/// its peak live bytes: completes with every pattern intact; a deliberately
/// corrupted block is caught; the capped pool baseline runs on the same ops.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn gpu_trace_replay_keeps_every_pattern_and_catches_corruption() {
    use cuarena_trace::gpu::replay::{replay_gpu, GpuReplayOptions};
    use cuarena_trace::trace::replay::Outcome;
    if !gpu_available() {
        return;
    }
    // Sizes 256 B..1 MiB; frees in random order keep ~64 MiB live.
    let ops = crate::trace::steady(6000, 64 << 20);
    let cap = ops.peak_live_rounded(256);
    let config = ArenaConfig::new(cap);
    // The default kernels, and registers with no side buffer.
    let default = CudaOptions::default();
    let registers = default
        .with_large_moves(false)
        .with_bulk_stages(0)
        .with_vectors_per_thread(16);
    // (The other kernels without the warm-up pass: the test's time goes to
    // the delays the replay enqueues to time each compaction.)
    for (name, cuda, warmup) in [
        ("default", default, 1),
        (
            "registers, no side buffer",
            registers.with_side_buffer_bytes(0),
            0,
        ),
    ] {
        let t0 = std::time::Instant::now();
        let options = GpuReplayOptions::default()
            .with_cuda_options(cuda)
            .with_warmup_passes(warmup);
        let r = replay_gpu(&ops, &config, &options).expect("replay");
        println!(
            "{name}: {:?} in {:.1?}, {} compactions",
            r.outcome,
            t0.elapsed(),
            r.timed.compaction.count()
        );
        assert!(
            matches!(r.outcome, Outcome::Completed),
            "{name}: {:?}",
            r.outcome
        );
        assert_eq!(r.mismatched_words, 0, "{name}");
        assert!(r.timed.compaction.count() > 0, "no compaction exercised");
    }
    let bad = GpuReplayOptions::default().with_corrupt_block(Some(3));
    let r = replay_gpu(&ops, &config, &bad).expect("replay");
    assert!(
        matches!(
            r.outcome,
            Outcome::Failed {
                error: cuarena_trace::ToolError::DataMismatch { .. },
                ..
            }
        ),
        "{:?}",
        r.outcome
    );
    let pool = cuarena_trace::gpu::baselines::replay_pool(
        &ops,
        &cuarena_trace::gpu::baselines::PoolOptions::default().with_max_size_bytes(2 * cap),
    )
    .expect("pool");
    assert!(
        matches!(pool.outcome, Outcome::Completed),
        "{:?}",
        pool.outcome
    );
}
