//! Fragmentation shapes: programs that leave the free space in many small
//! holes and then ask for blocks larger than any hole, at a capacity of
//! exactly the peak live bytes. Each request needs a compaction (or a
//! previous one that merged enough), so these measure how the compaction
//! policy's cost grows with the number of live blocks; the benches and
//! tests replay them at sizes from 10k to 320k blocks.
//!
//! - [`Shape::Checkerboard`]: `n` blocks of 256 B, every other one freed,
//!   then `n / 4` blocks of 512 B (the example).
//! - [`Shape::Mixed`]: `n` blocks of 256 B to 4 KiB, every other one freed,
//!   then blocks of 512 B to 8 KiB until the free bytes are used up.
//! - [`Shape::Pinned`]: the checkerboard with every 64th block pinned, so
//!   compactions work gap by gap, and requests for three quarters of the
//!   freed bytes (run on the arena directly: programs have no pins).

use std::time::{Duration, Instant};

use crate::trace::{Op, Ops};
use crate::{Result, ToolError};
use cuarena::{Arena, ArenaConfig, CompactionPolicy};

/// A fragmentation shape; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// 256 B blocks, every other freed, then 512 B requests.
    Checkerboard,
    /// Mixed sizes, every other freed, then requests twice as large.
    Mixed,
    /// The checkerboard with every 64th block pinned.
    Pinned,
}

impl Shape {
    /// All shapes.
    pub const ALL: [Shape; 3] = [Shape::Checkerboard, Shape::Mixed, Shape::Pinned];

    /// Short name.
    pub fn label(self) -> &'static str {
        match self {
            Shape::Checkerboard => "checkerboard",
            Shape::Mixed => "mixed",
            Shape::Pinned => "pinned",
        }
    }
}

/// What a fragmentation run did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FragmentReport {
    /// Wall time of the run (arena creation included, building the
    /// program not).
    pub wall: Duration,
    /// Allocations and frees run.
    pub ops: usize,
    /// Bytes moved.
    pub bytes_moved: u64,
    /// Targeted and full compactions.
    pub compactions: (u64, u64),
    /// Block visits of planning (see [`cuarena::PolicyStats::planning_visits`]):
    /// the deterministic counterpart of `wall`.
    pub planning_visits: u64,
}

/// A seeded xorshift.
fn rng(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// The program of `shape` over `n` initial blocks (for
/// [`Shape::Pinned`], the checkerboard's: the pins are added by [`run`]).
pub fn program(shape: Shape, n: usize) -> Ops {
    let n = u32::try_from(n).unwrap_or(u32::MAX / 2) & !1;
    let mut rnd = rng(0x9e37_79b9_7f4a_7c15);
    let mut ops = Vec::with_capacity(n as usize * 2);
    let mut sizes = Vec::with_capacity(n as usize);
    for id in 0..n {
        let size = match shape {
            Shape::Checkerboard | Shape::Pinned => 256,
            Shape::Mixed => 256 * (1 + rnd() % 16),
        };
        sizes.push(size);
        ops.push(Op::Alloc { id, size });
    }
    let mut freed = 0;
    for id in (1..n).step_by(2) {
        freed += sizes[id as usize];
        ops.push(Op::Free { id });
    }
    if shape == Shape::Pinned {
        // Blocks evacuated across pinned blocks can leave every gap an odd
        // number of 256 B units free: ask for three quarters of the space.
        freed = freed / 4 * 3;
    }
    let mut id = n;
    while freed > 0 {
        let size = match shape {
            Shape::Checkerboard | Shape::Pinned => 512,
            Shape::Mixed => 256 * (2 + rnd() % 31),
        }
        .min(freed);
        freed -= size;
        ops.push(Op::Alloc { id, size });
        id += 1;
    }
    Ops::from_ops(ops)
}

/// Runs `shape` over `n` blocks on a metadata arena of capacity equal to
/// the peak live bytes (256 B alignment), under the default compaction
/// policy. Errors if an allocation fails.
pub fn run(shape: Shape, n: usize) -> Result<FragmentReport> {
    run_program(shape, n, &program(shape, n))
}

/// [`run`] under `policy`.
pub fn run_with(shape: Shape, n: usize, policy: CompactionPolicy) -> Result<FragmentReport> {
    run_program_with(shape, n, &program(shape, n), policy)
}

/// Runs `ops`, the [`program`] of `shape` over `n` blocks, as [`run`]
/// does (for timing the run without building the program).
pub fn run_program(shape: Shape, n: usize, ops: &Ops) -> Result<FragmentReport> {
    run_program_with(shape, n, ops, CompactionPolicy::Auto)
}

/// [`run_program`] under `policy`.
pub fn run_program_with(
    shape: Shape,
    n: usize,
    ops: &Ops,
    policy: CompactionPolicy,
) -> Result<FragmentReport> {
    let cap = ops.peak_live_rounded(256).max(256);
    let config = ArenaConfig::new(cap)
        .with_alignment_bytes(256)
        .with_compaction(policy);
    let t0 = Instant::now();
    let mut arena = Arena::metadata(config)?;
    let mut handles = Vec::with_capacity(ops.sizes.len());
    for op in &ops.ops {
        match *op {
            Op::Alloc { id, size } => {
                let h = arena.alloc(size)?;
                if shape == Shape::Pinned && id % 64 == 0 && (id as usize) < n {
                    arena.pin(h)?;
                }
                handles.push(Some(h));
            }
            Op::Free { id } => {
                let h = handles
                    .get_mut(id as usize)
                    .and_then(Option::take)
                    .ok_or_else(|| ToolError::Usage {
                        reason: format!("free of unknown block {id}"),
                    })?;
                arena.free(h)?;
            }
        }
    }
    let wall = t0.elapsed();
    let st = arena.stats();
    Ok(FragmentReport {
        wall,
        ops: ops.ops.len(),
        bytes_moved: st.bytes_moved,
        compactions: (st.targeted_compactions, st.full_compactions),
        planning_visits: st.policy.planning_visits,
    })
}
