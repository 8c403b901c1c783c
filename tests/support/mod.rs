//! What the integration tests (`tests/all`) and the benches share: one
//! deterministic generator, plan builders, and the loader of test kernels.
//! Each includes this module by path and uses a part of it.
#![allow(dead_code)]

use cuarena::plan::{Move, Plan, PlanKind};

/// splitmix64: small, deterministic, no dependency; any seed will do.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The sequence of `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// `len` bytes that depend on `seed` only.
pub fn bytes(seed: u64, len: u64) -> Vec<u8> {
    Rng::new(seed).bytes(len as usize)
}

/// A move of `len` bytes from `src` to `dst`, keyed by its source.
pub fn mv(src: u64, dst: u64, len: u64) -> Move {
    Move {
        key: src,
        src,
        dst,
        len,
    }
}

/// A full plan of `waves` in order, empty ones left out.
pub fn plan_of(waves: Vec<Vec<Move>>) -> Plan {
    Plan::new(PlanKind::Full, waves)
}

/// `name`'s value as a number, if set to one.
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// The middle of `times` (sorted in place).
pub fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

#[cfg(feature = "cuda")]
#[allow(unused_imports)] // as `dead_code` above
pub use self::cuda::*;

#[cfg(feature = "cuda")]
mod cuda {
    use std::sync::Arc;

    use cuarena::backend::cuda::cudarc::driver::{CudaModule, DriverError};
    use cuarena::backend::cuda::{compile, CudaBackend};
    use cuarena::{Error, Result};

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
        let reps = super::env_u64("CUARENA_BENCH_REPS").unwrap_or(default);
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
