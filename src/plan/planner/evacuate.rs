//! Evacuating the top of the region: every block that reaches above a cut
//! moved into holes below it, in one wave. What a trim runs when that moves
//! less than a full compaction: only the blocks in the way of giving memory
//! back move, not every block above a hole.

use super::LiveBlock;
use crate::plan::{Move, Plan, PlanKind};

/// Most blocks an evacuation places (best fit over the holes is
/// O(blocks × holes); beyond this the caller compacts fully).
const MAX_EVACUEES: usize = 4096;

/// The plan that moves every block of `blocks` (live, sorted by offset,
/// disjoint) ending above `cut` into the free space below `cut`, largest
/// first, each into the smallest hole that holds it at its alignment; one
/// wave (every destination is free space, so no move waits for another).
/// `None` if a block above the cut is pinned, or does not fit.
pub(crate) fn plan_evacuate(blocks: &[LiveBlock], cut: u64) -> Option<Plan> {
    let first = blocks.partition_point(|b| b.offset.saturating_add(b.len) <= cut);
    let movers = &blocks[first..];
    if movers.is_empty() {
        return Some(Plan::empty(PlanKind::Targeted));
    }
    if movers.len() > MAX_EVACUEES || movers.iter().any(|b| b.pinned) {
        return None;
    }
    // Holes below the cut: (start, end).
    let mut holes: Vec<(u64, u64)> = Vec::new();
    let mut cursor = 0u64;
    for b in &blocks[..first] {
        if b.offset > cursor {
            holes.push((cursor, b.offset));
        }
        cursor = b.offset + b.len;
    }
    let top = movers[0].offset.min(cut);
    if top > cursor {
        holes.push((cursor, top));
    }
    let mut order: Vec<usize> = (0..movers.len()).collect();
    order.sort_unstable_by_key(|&i| std::cmp::Reverse(movers[i].len));
    let mut moves = Vec::with_capacity(movers.len());
    for i in order {
        let b = &movers[i];
        let align = b.align.max(1);
        let fit = |&(s, e): &(u64, u64)| {
            let at = s.div_ceil(align) * align;
            (at.checked_add(b.len)? <= e).then_some(e - s)
        };
        let (h, _) = holes
            .iter()
            .enumerate()
            .filter_map(|(k, hole)| fit(hole).map(|size| (k, size)))
            .min_by_key(|&(_, size)| size)?;
        let (s, e) = holes[h];
        let at = s.div_ceil(align) * align;
        holes.swap_remove(h);
        if at > s {
            holes.push((s, at));
        }
        if at + b.len < e {
            holes.push((at + b.len, e));
        }
        moves.push(Move {
            key: b.key,
            src: b.offset,
            dst: at,
            len: b.copy_len,
        });
    }
    moves.sort_unstable_by_key(|m| m.src);
    Some(Plan::new(PlanKind::Targeted, [moves]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blk(key: u64, offset: u64, len: u64) -> LiveBlock {
        LiveBlock::at(key, offset, len, 16)
    }

    #[test]
    fn blocks_above_the_cut_go_into_holes_below() {
        let live = [
            blk(1, 0, 64),
            blk(2, 128, 64),
            blk(3, 512, 32),
            blk(4, 600, 48),
        ];
        let plan = plan_evacuate(&live, 256).expect("fits");
        plan.validate(1024).expect("a valid wave");
        assert_eq!(plan.bytes_moved(), 80);
        assert!(plan.moves().all(|m| m.dst + m.len <= 256 && m.src >= 256));
        // Nothing above the cut: nothing to do.
        assert!(plan_evacuate(&live[..2], 256).unwrap().is_empty());
        // No room below: no plan.
        assert!(plan_evacuate(&live, 160).is_none());
        let mut pinned = live;
        pinned[3].pinned = true;
        assert!(plan_evacuate(&pinned, 256).is_none());
    }
}
