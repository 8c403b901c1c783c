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
    /// Most bytes of device memory (besides the region) that a tile may
    /// use to store the part of its destination that covers an earlier
    /// tile's source instead of waiting for that tile: a block sliding
    /// down by a small shift (at most 4 KiB and 1/32 of a tile) would
    /// otherwise make every tile wait for the one before it. Allocated when
    /// a plan first needs it; tiles beyond it wait. 0 turns this off.
    pub side_buffer_bytes: u32,
    /// A second kernel shape for chunks of large moves (64 KiB tiles by
    /// default); `None`: one shape for every chunk. Big tiles move large
    /// blocks at the copy engine's speed but leave tiles half empty on
    /// small blocks, where smaller tiles with more in flight win. Set with
    /// [`with_large_moves`](CudaOptions::with_large_moves).
    pub(crate) large_moves: Option<LargeMoves>,
}

/// The kernel shape for chunks whose moves are large (see
/// `CudaOptions::large_moves`); CTAs per SM are the driver's occupancy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LargeMoves {
    /// Threads per CTA (as [`CudaOptions::threads_per_cta`]).
    pub(crate) threads_per_cta: u32,
    /// 16-byte vectors per thread (as [`CudaOptions::vectors_per_thread`]).
    pub(crate) vectors_per_thread: u32,
    /// Bulk stages (as [`CudaOptions::bulk_stages`]).
    pub(crate) bulk_stages: u32,
    /// A chunk (up to 65,536 moves of a wave) takes this shape when its
    /// moves' mean length is at least this many bytes.
    pub(crate) from_mean_bytes: u64,
}

impl LargeMoves {
    /// A shape for chunks of moves of `from_mean_bytes` or more on average.
    #[cfg(test)]
    pub(crate) fn new(
        threads_per_cta: u32,
        vectors_per_thread: u32,
        bulk_stages: u32,
        from_mean_bytes: u64,
    ) -> Self {
        Self {
            threads_per_cta,
            vectors_per_thread,
            bulk_stages,
            from_mean_bytes,
        }
    }

    /// As options of one shape (for compiling and validating it).
    pub(super) fn shape(&self) -> CudaOptions {
        CudaOptions {
            threads_per_cta: self.threads_per_cta,
            vectors_per_thread: self.vectors_per_thread,
            ctas_per_sm: None,
            bulk_stages: self.bulk_stages,
            side_buffer_bytes: 0,
            large_moves: None,
        }
    }
}

/// Most tiles in flight per CTA (`CUARENA_MAX_STAGES` in `kernels/bulk.cu`).
pub(crate) const MAX_BULK_STAGES: u32 = 16;

/// Room for a 4 GiB slide by 256 B in 64 KiB tiles (65,536 tiles of at
/// most 304 bytes: 19 MiB) with some to spare; a larger slide defers its
/// first 32 MiB worth of tiles and the rest wait.
const DEFAULT_SIDE_BUFFER_BYTES: u32 = 32 << 20;

/// Chunks whose moves average at least 256 KiB (four 64 KiB tiles, so that
/// partly filled tiles are at most an eighth of the bytes) take 64 KiB
/// tiles through the bulk kernel with 2 stages (512 threads of 8 vectors):
/// the best copy rate for large moves, better than 32 KiB tiles, but not
/// on 100,000 blocks of 4-64 KiB, where most tiles are half empty
/// (`BENCHMARKS.md#moves-our-kernel-against-cumemcpydtodasync`).
const DEFAULT_LARGE_MOVES: LargeMoves = LargeMoves {
    threads_per_cta: 512,
    vectors_per_thread: 8,
    bulk_stages: 2,
    from_mean_bytes: 256 << 10,
};

impl Default for CudaOptions {
    fn default() -> Self {
        // Small moves: 32 KiB tiles through the bulk kernel, 4 in flight
        // per CTA (256 x 8, 4 stages): 0.90-0.92 of one big memcpy on
        // 100,000 blocks of 4-64 KiB and 0.85-0.91 at 1-byte alignment, on
        // an H200 and an H100 (the register kernel, 256 x 16, gave 0.87
        // and 0.79 on the H200). Devices before Hopper run the register
        // kernel of the same tile.
        Self {
            threads_per_cta: 256,
            vectors_per_thread: 8,
            ctas_per_sm: None,
            bulk_stages: 4,
            side_buffer_bytes: DEFAULT_SIDE_BUFFER_BYTES,
            large_moves: Some(DEFAULT_LARGE_MOVES),
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

    /// Sets the most side-buffer bytes (0: every tile waits; see
    /// [`side_buffer_bytes`](Self::side_buffer_bytes)).
    pub fn with_side_buffer_bytes(mut self, bytes: u32) -> Self {
        self.side_buffer_bytes = bytes;
        self
    }

    /// Whether chunks of large moves get a kernel of their own, with 64 KiB
    /// tiles (the default: `true`); `false`: this shape for every chunk.
    pub fn with_large_moves(mut self, on: bool) -> Self {
        self.large_moves = on.then_some(DEFAULT_LARGE_MOVES);
        self
    }

    /// The shape of the kernel that moves a chunk whose moves' lengths sum
    /// to `bytes` over `moves` moves: `large_moves` when their mean
    /// reaches its threshold, else this one.
    pub(super) fn for_chunk(&self, bytes: u64, moves: u64) -> Option<&LargeMoves> {
        self.large_moves
            .as_ref()
            .filter(|l| moves > 0 && bytes / moves >= l.from_mean_bytes)
    }

    /// Bytes of one tile: `threads_per_cta * vectors_per_thread * 16`.
    pub fn tile_bytes(&self) -> u64 {
        u64::from(self.threads_per_cta) * u64::from(self.vectors_per_thread) * 16
    }

    pub(super) fn validate(&self) -> Result<()> {
        if let Some(l) = &self.large_moves {
            l.shape().validate()?;
        }
        let ok = (32..=1024).contains(&self.threads_per_cta)
            && self.threads_per_cta.is_power_of_two()
            && (1..=16).contains(&self.vectors_per_thread)
            && self.vectors_per_thread.is_power_of_two()
            && self.ctas_per_sm.is_none_or(|c| c >= 1)
            && (self.bulk_stages == 0 || (2..=MAX_BULK_STAGES).contains(&self.bulk_stages));
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidInput {
                input: "config",
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
pub(crate) struct MoveKernelInfo {
    /// Registers per thread.
    pub(crate) registers: i32,
    /// Local (stack/spill) bytes per thread; 0 when nothing spills.
    pub(crate) local_bytes: i32,
    /// CTAs resident per multiprocessor.
    pub(crate) ctas_per_sm: u32,
    /// CTAs of a full launch (multiprocessors × CTAs per multiprocessor).
    pub(crate) grid: u32,
    /// Bytes of one tile.
    pub(crate) tile_bytes: u64,
    /// Tiles in flight per CTA of the bulk kernel; 0 when the register
    /// kernel runs.
    pub(crate) bulk_stages: u32,
    /// Dynamic shared memory per CTA (the bulk kernel's slots), bytes.
    pub(crate) shared_bytes: u32,
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
                Err(Error::InvalidInput {
                    input: "config",
                    reason,
                }) => {
                    assert!(reason.contains("bulk_stages"), "{reason}")
                }
                other => panic!("{bad} stages: {other:?}"),
            }
        }
    }
}
