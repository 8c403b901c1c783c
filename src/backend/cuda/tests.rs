//! Unit tests of the CUDA backend's options and kernels (the latter skip
//! without a device).

use super::*;

#[test]
fn options_are_checked() {
    assert!(CudaOptions::default().validate().is_ok());
    assert_eq!(CudaOptions::default().tile_bytes(), 32 * 1024);
    // A bad shape for large moves is caught too.
    let bad_large = CudaOptions {
        large_moves: Some(LargeMoves::new(512, 3, 2, 1)),
        ..CudaOptions::default()
    };
    assert!(bad_large.validate().is_err());
    let bad = CudaOptions {
        threads_per_cta: 100,
        ..CudaOptions::default()
    };
    assert!(bad.validate().is_err());
}

/// The bulk kernel runs with the stages asked for where they fit in shared
/// memory (2 and 16 here), fewer where they do not, and on Hopper only.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn bulk_kernel_takes_the_stages_that_fit() {
    if !cuarena_testkit::usable(CudaBackend::available()) {
        return;
    }
    let default = CudaOptions::default();
    let small = default.with_threads_per_cta(128).with_vectors_per_thread(4);
    for (options, want) in [
        (default.with_bulk_stages(2), 2),
        (small.with_bulk_stages(16), 16),
        // 64 KiB tiles: three fit in 227 KiB.
        (default.with_vectors_per_thread(16).with_bulk_stages(16), 3),
        // One warp: no room for a producer warp.
        (small.with_threads_per_cta(32).with_bulk_stages(4), 0),
    ] {
        let b = CudaBackend::with_options(0, CudaCapacity::Bytes(64 << 20), options)
            .expect("CUDA backend");
        let hopper = b
            .arch()
            .trim_start_matches("sm_")
            .trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse::<u32>()
            .is_ok_and(|cc| cc >= 90);
        let got = b.move_kernel_info().bulk_stages;
        println!("{options:?}: {} stages on {}", got, b.arch());
        assert_eq!(got, if hopper { want } else { 0 }, "{options:?}");
        // The default's kernel for large moves: 2 stages of 64 KiB.
        let large = b
            .large_move_kernel_info()
            .expect("a second shape by default");
        assert_eq!(large.tile_bytes, 64 << 10);
        assert_eq!(large.bulk_stages, if hopper { 2 } else { 0 });
    }
}
