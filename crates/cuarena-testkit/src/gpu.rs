//! Whether a GPU test runs: where the hardware or library it needs is
//! missing, it skips (prints why and passes) when it ran by default, and
//! fails when it was asked for.
//!
//! The GPU tests are `#[ignore]`d: a plain `cargo test` lists them as
//! ignored. Asked for (`--include-ignored` or `--ignored`, or
//! `CUARENA_REQUIRE_GPU=1`) where there is no device, each fails with "no
//! CUDA GPU: (reason)": a run that asked for them must not report them
//! passed when nothing ran. A test that is not ignored skips: it prints
//! `skipped: (reason)` (shown with `--nocapture`), and the first skip of
//! the process writes one line to its stderr, which libtest does not
//! capture.

use std::io::Write as _;
use std::sync::Once;

/// True when the test binary was asked to run ignored tests
/// (`--include-ignored`, `--ignored`) or `CUARENA_REQUIRE_GPU` is `1`.
pub fn forced() -> bool {
    std::env::args().any(|a| a == "--include-ignored" || a == "--ignored")
        || std::env::var("CUARENA_REQUIRE_GPU").is_ok_and(|v| v.trim() == "1")
}

/// `check` (a backend's `available()`: `Err(reason)` where the driver, a
/// device or a library is missing) as "run the test": true when it passed;
/// otherwise a panic "no CUDA GPU: (reason)" when the tests were asked for
/// ([`forced`]), else false after saying why.
pub fn usable(check: Result<(), String>) -> bool {
    let Err(reason) = check else {
        return true;
    };
    if forced() {
        panic!("no CUDA GPU: {reason} (GPU tests were asked for: --ignored or --include-ignored)");
    }
    println!("skipped: {reason}");
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = writeln!(
            std::io::stderr(),
            "cuarena: GPU tests skipped (no device): {reason}"
        );
    });
    false
}

#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    use std::sync::Arc;

    use cuarena::backend::cuda::cudarc::driver::{CudaModule, DriverError};
    use cuarena::backend::cuda::{compile, CudaBackend};
    use cuarena::{Error, Result};

    /// True when a CUDA driver, NVRTC and a device are present; otherwise
    /// as [`usable`](crate::usable): fails when GPU tests were asked for,
    /// else skips.
    pub fn gpu_available() -> bool {
        crate::usable(CudaBackend::available())
    }

    /// Pattern fill and check kernels of the move tests.
    pub const TESTING_CU: &str = include_str!("../kernels/testing.cu");

    /// Elementwise kernels taking handles or raw addresses (graph tests,
    /// handles bench).
    pub const GRAPH_TEST_CU: &str = include_str!("../kernels/graph_test.cu");

    /// The repetitions of a GPU bench (`CUARENA_BENCH_REPS`, else
    /// `default`; at least one), or `None` when it does not run: cargo
    /// asked for its list of benchmarks (`--list`), or no GPU is usable
    /// (said on stdout, and the bench passes).
    pub fn gpu_bench_reps(bench: &str, default: u64) -> Option<usize> {
        if std::env::args().any(|a| a == "--list") {
            return None;
        }
        if let Err(reason) = CudaBackend::available() {
            println!("{bench} bench skipped: {reason}");
            return None;
        }
        let reps = crate::env_u64("CUARENA_BENCH_REPS").unwrap_or(default);
        Some(usize::try_from(reps).unwrap_or(usize::MAX).max(1))
    }

    /// A driver error naming `call`.
    pub fn driver_err(call: &'static str) -> impl Fn(DriverError) -> Error {
        move |e| Error::from(cuarena::BackendError::driver(call, e))
    }

    /// `source` (which may include `cuarena.cuh`) compiled for `backend`'s
    /// device, through the crate's NVRTC path and cache, and loaded into
    /// its context.
    pub fn load_kernels(
        backend: &CudaBackend,
        name: &'static str,
        source: &str,
    ) -> Result<Arc<CudaModule>> {
        let image = compile(name, source, backend.arch(), &[])?;
        backend
            .context()
            .load_module(image)
            .map_err(driver_err("cuModuleLoadData"))
    }
}
