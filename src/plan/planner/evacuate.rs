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

/// The plan that gives back the most of the region's top moving at most
/// `budget` bytes, and the cut it reaches: the lowest of `cuts`
/// (ascending: where the mapping can end; the highest block ends above the
/// last) at or above `floor` that the highest block then ends at or below.
/// Two ways to lower the top, each within the budget: evacuating the
/// blocks above a cut into holes below it ([`plan_evacuate`]), or sliding
/// the blocks at the top down onto the ones below them (which works where
/// the holes are each too small for the blocks above, as when blocks that
/// grow one step at a time outgrow the holes they leave). `None` where
/// neither reaches a cut.
pub(crate) fn plan_trim(
    blocks: &[LiveBlock],
    cuts: &[u64],
    floor: u64,
    budget: u64,
) -> Option<(Plan, u64)> {
    let reached = |end: u64| cuts.iter().copied().find(|&c| c >= end.max(floor));
    let evacuation = affordable_cut(blocks, cuts, floor, budget).and_then(|cut| {
        let plan = plan_evacuate(blocks, cut)?;
        (plan.bytes_moved() <= budget).then_some((plan, cut))
    });
    let slide = plan_slide_top(blocks, budget).and_then(|(plan, end)| Some((plan, reached(end)?)));
    match (evacuation, slide) {
        (Some(e), Some(s)) => Some(if (s.1, s.0.bytes_moved()) < (e.1, e.0.bytes_moved()) {
            s
        } else {
            e
        }),
        (e, s) => e.or(s),
    }
}

/// The lowest of `cuts` (ascending) at or above `floor` that an
/// evacuation reaches moving at most `budget` bytes: the blocks ending
/// above a cut are the ones that move, so a cut is out of reach once they
/// weigh more than the budget or one of them is pinned. Whether they fit
/// in the holes below is [`plan_evacuate`]'s to say.
fn affordable_cut(blocks: &[LiveBlock], cuts: &[u64], floor: u64, budget: u64) -> Option<u64> {
    let mut best = None;
    let mut movers = blocks.len();
    let mut cost = 0u64;
    for &cut in cuts.iter().rev() {
        if cut < floor {
            break;
        }
        while movers > 0 && blocks[movers - 1].end() > cut {
            movers -= 1;
            let b = &blocks[movers];
            cost = cost.saturating_add(b.copy_len);
            if b.pinned || cost > budget {
                return best;
            }
        }
        best = Some(cut);
    }
    best
}

/// The longest run of unpinned blocks at the top weighing at most
/// `budget` bytes, slid down onto the block below it (one wave, every
/// move down): the plan and where the highest block then ends. `None` if
/// that moves nothing.
fn plan_slide_top(blocks: &[LiveBlock], budget: u64) -> Option<(Plan, u64)> {
    let mut first = blocks.len();
    let mut cost = 0u64;
    while first > 0 {
        let b = &blocks[first - 1];
        cost = cost.saturating_add(b.copy_len);
        if b.pinned || cost > budget {
            break;
        }
        first -= 1;
    }
    let mut cursor = first.checked_sub(1).map_or(0, |i| blocks[i].end());
    let mut moves = Vec::new();
    for b in &blocks[first..] {
        let align = b.align.max(1);
        let at = cursor.div_ceil(align).saturating_mul(align).min(b.offset);
        if at < b.offset {
            moves.push(Move {
                key: b.key,
                src: b.offset,
                dst: at,
                len: b.copy_len,
            });
        }
        cursor = at.saturating_add(b.len);
    }
    (!moves.is_empty()).then(|| (Plan::new(PlanKind::Targeted, [moves]), cursor))
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

    #[test]
    fn the_cut_goes_as_low_as_the_budget_moves() {
        let live = [
            blk(1, 0, 64),
            blk(2, 128, 64),
            blk(3, 512, 32),
            blk(4, 600, 48),
        ];
        let cuts = [256, 512, 576, 768];
        // Every block above 256 moves: 80 bytes.
        assert_eq!(affordable_cut(&live, &cuts, 0, 80), Some(256));
        assert_eq!(affordable_cut(&live, &cuts, 300, 80), Some(512));
        // 48 bytes: the top block alone, down to the end of the one below.
        assert_eq!(affordable_cut(&live, &cuts, 0, 48), Some(576));
        // Nothing moves: only cuts above every block.
        assert_eq!(affordable_cut(&live, &cuts, 0, 0), Some(768));
        assert_eq!(affordable_cut(&live, &cuts[..3], 0, 0), None);
        // A pinned block stops the cut at its end.
        let mut pinned = live;
        pinned[2].pinned = true;
        assert_eq!(affordable_cut(&pinned, &cuts, 0, 1000), Some(576));
    }

    #[test]
    fn a_trim_slides_the_top_down_where_the_holes_are_too_small() {
        // Holes of 32 bytes below blocks of 48: no evacuation fits.
        let live = [
            blk(1, 0, 64),
            blk(2, 96, 48),
            blk(3, 176, 48),
            blk(4, 256, 48),
        ];
        let cuts = [128, 192, 256, 320];
        // Sliding the top two down onto block 2: 96 bytes, the top at 240.
        let (plan, cut) = plan_trim(&live, &cuts, 0, 96).expect("a slide");
        plan.validate(320).expect("a valid wave");
        assert_eq!((plan.bytes_moved(), cut), (96, 256));
        // Everything above the first hole: the top at 208.
        let (plan, cut) = plan_trim(&live, &cuts, 0, 1000).expect("a slide");
        assert_eq!((plan.bytes_moved(), cut), (144, 256));
        // Not below the floor.
        assert!(plan_trim(&live, &cuts[..3], 300, 1000).is_none());
        // Too little budget to reach a cut below the top.
        assert!(plan_trim(&live, &cuts[..3], 0, 40).is_none());
    }
}
