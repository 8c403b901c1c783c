//! An exact best-fit allocator in one region of fixed capacity: each
//! request takes the smallest free range that holds it (the lowest address
//! among equal ones), at its start; a freed block merges with free
//! neighbours. Nothing moves. It is what a non-moving allocator without
//! a caching allocator's rounding and segments needs, the middle figure
//! between PyTorch's reserved bytes and a compacting arena's.
//!
//! Sizes are rounded up to the alignment, as the arena rounds them.

use std::collections::{BTreeMap, BTreeSet};

use crate::trace::{MemoryBudget, Op, Ops};
use crate::{Result, ToolError};

/// What the budget calls the best-fit replay's memory.
const WHAT: &str = "memory for the best-fit replay, in bytes";
/// Bytes charged per free range (two B-tree entries) and per block.
const RANGE_BYTES: u64 = 64;

/// How a best-fit replay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BestFit {
    /// The region's size.
    pub capacity_bytes: u64,
    /// The op that found no free range large enough (`None`: every op ran).
    pub failed_op: Option<usize>,
}

impl BestFit {
    /// True when every op ran.
    pub fn completed(&self) -> bool {
        self.failed_op.is_none()
    }
}

fn round(size: u64, align: u64) -> u64 {
    size.div_ceil(align.max(1)).saturating_mul(align.max(1))
}

/// Replays `ops` on a best-fit region of `capacity` bytes, sizes rounded up
/// to `align` (a zero-byte alloc takes no space). Its memory is charged to
/// (a copy of) `budget` (a trace's [`crate::trace::Trace::memory_budget`]).
pub fn replay_best_fit(
    ops: &Ops,
    capacity: u64,
    align: u64,
    budget: &MemoryBudget,
) -> Result<BestFit> {
    let mut budget = budget.clone();
    let mut by_size: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut by_addr: BTreeMap<u64, u64> = BTreeMap::new();
    let mut at: Vec<Option<u64>> = budget.vec_of(ops.sizes.len(), None, WHAT)?;
    if capacity > 0 {
        by_size.insert((capacity, 0));
        by_addr.insert(0, capacity);
    }
    for (i, op) in ops.ops.iter().enumerate() {
        match *op {
            Op::Alloc { id, size } => {
                let need = round(size, align);
                if need == 0 {
                    continue;
                }
                let Some(&(free, addr)) = by_size.range((need, 0)..).next() else {
                    return Ok(BestFit {
                        capacity_bytes: capacity,
                        failed_op: Some(i),
                    });
                };
                by_size.remove(&(free, addr));
                by_addr.remove(&addr);
                if free > need {
                    budget.charge(RANGE_BYTES, WHAT)?;
                    by_size.insert((free - need, addr + need));
                    by_addr.insert(addr + need, free - need);
                }
                let slot = at.get_mut(id as usize).ok_or_else(|| ToolError::Program {
                    reason: format!("op names block {id}, beyond the program's sizes"),
                })?;
                *slot = Some(addr);
            }
            Op::Free { id } => {
                let Some(addr) = at.get_mut(id as usize).and_then(Option::take) else {
                    continue;
                };
                let mut start = addr;
                let mut len = round(ops.sizes[id as usize], align);
                // Merge with the free range that ends here and the one
                // that starts where this one ends.
                if let Some((&a, &s)) = by_addr.range(..addr).next_back() {
                    if a + s == addr {
                        by_addr.remove(&a);
                        by_size.remove(&(s, a));
                        start = a;
                        len += s;
                    }
                }
                if let Some(&s) = by_addr.get(&(addr + round(ops.sizes[id as usize], align))) {
                    let a = addr + round(ops.sizes[id as usize], align);
                    by_addr.remove(&a);
                    by_size.remove(&(s, a));
                    len += s;
                }
                budget.charge(RANGE_BYTES, WHAT)?;
                by_size.insert((len, start));
                by_addr.insert(start, len);
            }
        }
    }
    Ok(BestFit {
        capacity_bytes: capacity,
        failed_op: None,
    })
}

/// The smallest capacity (a multiple of `align`) under which best fit
/// completes `ops`, searched as [`crate::trace::find_min_capacity_with`]
/// searches the arena's: from peak live bytes (rounded), growing by a
/// doubling step until a replay completes, then narrowed to one alignment
/// unit. Best fit needs not be monotone in the capacity; this is the
/// smallest the search finds. `None` when nothing up to 64 times the bytes
/// ever allocated completes.
pub fn find_min_best_fit(ops: &Ops, align: u64, budget: &MemoryBudget) -> Result<Option<u64>> {
    let align = align.max(1);
    let lower = round(ops.peak_live_rounded(align).max(align), align);
    if replay_best_fit(ops, lower, align, budget)?.completed() {
        return Ok(Some(lower));
    }
    let total = ops
        .sizes
        .iter()
        .fold(0u64, |a, &s| a.saturating_add(round(s, align)));
    let limit = total.max(lower).saturating_mul(64);
    let mut step = round((lower / 1024).max(align), align);
    let mut failed = lower;
    let mut ok = loop {
        let cap = round(lower.saturating_add(step), align);
        if cap > limit {
            return Ok(None);
        }
        if replay_best_fit(ops, cap, align, budget)?.completed() {
            break cap;
        }
        failed = cap;
        step = step.saturating_mul(2);
    };
    while ok - failed > align {
        let mid = failed + ((ok - failed) / 2 / align).max(1) * align;
        if replay_best_fit(ops, mid, align, budget)?.completed() {
            ok = mid;
        } else {
            failed = mid;
        }
    }
    Ok(Some(ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mib() -> MemoryBudget {
        MemoryBudget::for_input(0, "test")
    }

    #[test]
    fn best_fit_takes_the_smallest_hole() {
        // Holes of 512 and 256 B at 0 and 768: a 256 B request takes the
        // one that fits exactly, so the 512 B one still serves 512 B.
        let ops = Ops::from_ops([
            Op::Alloc { id: 0, size: 512 },
            Op::Alloc { id: 1, size: 256 },
            Op::Alloc { id: 2, size: 256 },
            Op::Alloc { id: 3, size: 256 },
            Op::Free { id: 0 },
            Op::Free { id: 2 },
            Op::Alloc { id: 4, size: 256 },
            Op::Alloc { id: 5, size: 512 },
        ]);
        let r = replay_best_fit(&ops, 1280, 256, &mib()).unwrap();
        assert!(r.completed(), "{r:?}");
        assert_eq!(find_min_best_fit(&ops, 256, &mib()).unwrap(), Some(1280));
    }

    #[test]
    fn fragmentation_needs_more_than_peak_live() {
        // Two 256 B holes apart cannot hold 512 B without moving a block.
        let ops = Ops::from_ops([
            Op::Alloc { id: 0, size: 256 },
            Op::Alloc { id: 1, size: 256 },
            Op::Alloc { id: 2, size: 256 },
            Op::Free { id: 0 },
            Op::Free { id: 2 },
            Op::Alloc { id: 3, size: 512 },
        ]);
        assert_eq!(ops.peak_live_rounded(256), 768);
        let r = replay_best_fit(&ops, 768, 256, &mib()).unwrap();
        assert_eq!(r.failed_op, Some(5));
        assert_eq!(find_min_best_fit(&ops, 256, &mib()).unwrap(), Some(1024));
        // Freed neighbours merge: after both frees, one 768 B range.
        let merged = Ops::from_ops([
            Op::Alloc { id: 0, size: 256 },
            Op::Alloc { id: 1, size: 256 },
            Op::Free { id: 0 },
            Op::Free { id: 1 },
            Op::Alloc { id: 2, size: 512 },
        ]);
        assert!(replay_best_fit(&merged, 512, 256, &mib())
            .unwrap()
            .completed());
        // Under a budget too small for the block table: the limit, named.
        let none = MemoryBudget::for_input(0, "test").with_limit(1);
        assert!(matches!(
            replay_best_fit(&ops, 768, 256, &none),
            Err(ToolError::Limit { .. })
        ));
    }
}
