//! Tuning of the move kernels, and what the driver reports about them.

use crate::error::{Error, Result};

/// Tuning of the move kernel. The defaults were chosen by measurement
/// (`benches/moves.rs`); other values are for experiments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CudaOptions {
    /// Threads per CTA (a power of two, 32..=1024).
    pub threads_per_cta: u32,
    /// 16-byte vectors each thread holds in registers per tile (a power of
    /// two, 1..=16).
    pub vectors_per_thread: u32,
    /// CTAs per multiprocessor; `None` takes the occupancy the driver
    /// reports for the kernel.
    pub ctas_per_sm: Option<u32>,
    /// Tiles each CTA keeps in flight through shared memory with the bulk
    /// copy engine (`kernels/bulk.cu`, Hopper and later): 0 selects the
    /// register kernel (`kernels/moves.cu`), which every device runs;
    /// otherwise 2..=16, lowered to what fits in a CTA's shared memory. On
    /// devices before Hopper, and with 32 threads per CTA (the bulk kernel
    /// gives a whole warp to loading), the register kernel runs whatever
    /// this says.
    pub bulk_stages: u32,
}

/// Most tiles in flight per CTA (`CUARENA_MAX_STAGES` in `kernels/bulk.cu`).
pub(crate) const MAX_BULK_STAGES: u32 = 16;

/// The register kernel by default. Against the reworked (warp-specialised)
/// bulk kernel in the same runs (2026-11-25, BENCHMARKS.md, ratios to
/// `cuMemcpyDtoDAsync`; large / 100k blocks / 1-byte alignment / 4 GiB
/// slide): on an H100 the register kernel (256x16) gave 1.00 / 0.92 /
/// 0.90 / 0.95 and the best bulk shapes 1.00-1.01 / 0.91-0.92 /
/// 0.89-0.90 / 0.92, so only the register kernel meets every H100 target.
/// On an H200 the bulk kernel wins on small blocks (256x8b6: 1.00 / 0.90
/// / 0.85 / 0.85 against 0.99 / 0.87 / 0.79 / 0.89) but loses the slide,
/// where each tile's store waits for the previous tile's load and a CTA's
/// in-order ring adds to that wait; neither meets the H200 slide target.
const DEFAULT_BULK_STAGES: u32 = 0;

impl Default for CudaOptions {
    fn default() -> Self {
        // 256 threads x 16 vectors (64 KiB tiles, 2 CTAs per SM): best on
        // an H100 across the move benchmarks in a sweep of four shapes
        // (2026-11-23, BENCHMARKS.md); a slide pays one flag wait per tile,
        // so big tiles help it, and 100,000 small blocks lose little.
        Self {
            threads_per_cta: 256,
            vectors_per_thread: 16,
            ctas_per_sm: None,
            bulk_stages: DEFAULT_BULK_STAGES,
        }
    }
}

impl CudaOptions {
    /// Sets the threads per CTA (a power of two, 32..=1024).
    pub fn with_threads_per_cta(mut self, threads: u32) -> Self {
        self.threads_per_cta = threads;
        self
    }

    /// Sets the 16-byte vectors each thread holds per tile (a power of two,
    /// 1..=16).
    pub fn with_vectors_per_thread(mut self, vectors: u32) -> Self {
        self.vectors_per_thread = vectors;
        self
    }

    /// Sets the CTAs per multiprocessor (`None`: the driver's occupancy).
    pub fn with_ctas_per_sm(mut self, ctas: Option<u32>) -> Self {
        self.ctas_per_sm = ctas;
        self
    }

    /// Sets the tiles in flight per CTA of the bulk kernel (0: the register
    /// kernel; else 2..=16).
    pub fn with_bulk_stages(mut self, stages: u32) -> Self {
        self.bulk_stages = stages;
        self
    }

    /// Bytes of one tile: `threads_per_cta * vectors_per_thread * 16`.
    pub fn tile_bytes(&self) -> u64 {
        u64::from(self.threads_per_cta) * u64::from(self.vectors_per_thread) * 16
    }

    pub(super) fn validate(&self) -> Result<()> {
        let ok = (32..=1024).contains(&self.threads_per_cta)
            && self.threads_per_cta.is_power_of_two()
            && (1..=16).contains(&self.vectors_per_thread)
            && self.vectors_per_thread.is_power_of_two()
            && self.ctas_per_sm.is_none_or(|c| c >= 1)
            && (self.bulk_stages == 0 || (2..=MAX_BULK_STAGES).contains(&self.bulk_stages));
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidConfig {
                reason: format!(
                    "CUDA kernel options out of range: {self:?} (threads_per_cta a power of two \
                     in 32..=1024, vectors_per_thread a power of two in 1..=16, ctas_per_sm >= 1, \
                     bulk_stages 0 or 2..=16)"
                ),
            })
        }
    }
}

/// What the driver reports about the move kernel as loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MoveKernelInfo {
    /// Registers per thread.
    pub registers: i32,
    /// Local (stack/spill) bytes per thread; 0 when nothing spills.
    pub local_bytes: i32,
    /// CTAs resident per multiprocessor.
    pub ctas_per_sm: u32,
    /// CTAs of a full launch (multiprocessors × CTAs per multiprocessor).
    pub grid: u32,
    /// Bytes of one tile.
    pub tile_bytes: u64,
    /// Tiles in flight per CTA of the bulk kernel; 0 when the register
    /// kernel runs.
    pub bulk_stages: u32,
    /// Dynamic shared memory per CTA (the bulk kernel's slots), bytes.
    pub shared_bytes: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_stages_are_zero_or_two_to_sixteen() {
        let base = CudaOptions::default();
        for ok in [0, 2, 3, MAX_BULK_STAGES] {
            assert!(base.with_bulk_stages(ok).validate().is_ok(), "{ok}");
        }
        for bad in [1, MAX_BULK_STAGES + 1, u32::MAX] {
            match base.with_bulk_stages(bad).validate() {
                Err(Error::InvalidConfig { reason }) => {
                    assert!(reason.contains("bulk_stages"), "{reason}")
                }
                other => panic!("{bad} stages: {other:?}"),
            }
        }
    }
}
