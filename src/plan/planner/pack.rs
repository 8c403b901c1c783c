//! Packings that reorder blocks: by alignment (the full compaction, when
//! address order leaves alignment padding) and across pinned blocks (the
//! gap packing, for a request no other plan makes room for). Both give
//! every block a target offset; [`crate::plan::relayout`] turns the targets
//! into waves.
//!
//! # Alignment
//!
//! Packing blocks in address order pads before every block whose alignment
//! the cursor does not meet: `alloc(256)` at 0 and `alloc_aligned(256,
//! 32 KiB)` at 32 KiB pack to the same layout, with 32,512 B of padding
//! between them and the free space split in two. In descending order of
//! alignment (ties in address order) the padding before a block is the
//! previous block's size rounded up to this block's alignment, minus that
//! size: none at all while every block but the first has the arena's
//! alignment, or a size that is a multiple of the next block's alignment.
//! It cannot always be none: two 256 B blocks aligned to 32 KiB in 64 KiB
//! lie at 0 and 32 KiB in every layout, so no hole exceeds 32,512 B.
//! Without pins the full compaction packs *by alignment class*
//! ([`packed_by_alignment`]): descending alignment, then length, each
//! block at the lowest offset of its alignment where it fits, the padding
//! filled with smaller blocks. The allocation guarantee is stated in it: a pin-free
//! request succeeds whenever that packing leaves a free range that holds
//! it. With pins, each gap is packed in the order that pads less.
//!
//! # Pins
//!
//! Between pinned blocks, the full compaction packs every block into the
//! lowest gap with room, in address order. A request may need a gap that
//! this leaves full. The gap packing tries each gap (largest first, until a
//! gap cannot beat the best found): the other gaps' blocks pack to the
//! bottom of their gaps, this gap's blocks move into the room left at the
//! top of the others (largest first, each into the smallest room that
//! holds it), and the ones that do not fit pack to the bottom of this gap.
//! It is an approximation of the best layout (which is a bin packing):
//! first fit decreasing. The tests compare it with an exhaustive search.
#![deny(unsafe_code)]

use std::collections::BTreeMap;

use super::{align_up, pack_full_with, LiveBlock, Request};
use crate::plan::relayout::plan_relayout;
use crate::plan::{Plan, PlanKind};

/// The gaps between pinned blocks, `(start, end)` ascending, and for each
/// block the gap it packs into under address-order first fit (pinned
/// blocks: `usize::MAX`).
fn gaps(blocks: &[LiveBlock], capacity: u64) -> Vec<(u64, u64)> {
    let mut gaps = Vec::new();
    let mut start = 0;
    for b in blocks.iter().filter(|b| b.pinned) {
        gaps.push((start, b.offset));
        start = b.offset.saturating_add(b.len);
    }
    gaps.push((start, capacity));
    gaps
}

/// The full compaction when it reorders by alignment: the targets and the
/// plan, or `None` when address order pads nothing (or, with pins, pads
/// no more), and [`pack_full_with`]'s single wave applies.
///
/// Without pins the packing is *by alignment class*
/// ([`packed_by_alignment`]): the rule the allocation guarantee is stated
/// in. With pins, each gap's blocks are sorted by alignment when that pads
/// less than address order (the gap packing is the rest of the story).
pub(super) fn full_reordered(blocks: &[LiveBlock], capacity: u64) -> Option<(Vec<u64>, Plan)> {
    let target = full_targets(blocks, capacity)?;
    let plan = plan_relayout(blocks, &target, capacity, PlanKind::Full)?;
    Some((target, plan))
}

/// The targets of [`full_reordered`], without planning the moves (for
/// what a full compaction would reach, or cost): `None` where address
/// order applies.
pub(super) fn full_targets(blocks: &[LiveBlock], capacity: u64) -> Option<Vec<u64>> {
    // No padding in address order where every block's length, and every
    // pinned block's place, is a multiple of the largest alignment of a
    // block that moves (the common case: everything at the arena's
    // alignment). One pass, no allocation.
    let amax = blocks
        .iter()
        .filter(|b| !b.pinned)
        .map(|b| b.align)
        .max()
        .unwrap_or(1)
        .max(1);
    if blocks
        .iter()
        .all(|b| b.len % amax == 0 && (!b.pinned || b.offset % amax == 0))
    {
        return None;
    }
    if !blocks.iter().any(|b| b.pinned) {
        // The packing by alignment class where it leaves a larger free
        // range than address order (even where it moves nothing: address
        // order from this layout could slide blocks into its padding).
        let canonical = packed_by_alignment(blocks, capacity)?;
        let mut address = Vec::with_capacity(blocks.len());
        pack_full_with(blocks, capacity, |_, dst| address.push(dst));
        let better = largest_hole_of(blocks, &canonical, capacity, 1)
            > largest_hole_of(blocks, &address, capacity, 1);
        return better.then_some(canonical);
    }
    // Address order: the targets, and the padding they leave.
    let mut target = Vec::with_capacity(blocks.len());
    pack_full_with(blocks, capacity, |_, dst| target.push(dst));
    let gaps = gaps(blocks, capacity);
    let gap_of = |offset: u64| gaps.partition_point(|g| g.1 <= offset).min(gaps.len() - 1);
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); gaps.len()];
    for (i, b) in blocks.iter().enumerate() {
        if !b.pinned {
            members[gap_of(target[i])].push(i);
        }
    }
    let padding = |order: &[usize], at: &[u64], start: u64| {
        let mut cursor = start;
        let mut pad = 0u64;
        for &i in order {
            pad = pad.saturating_add(at[i].saturating_sub(cursor));
            cursor = at[i].saturating_add(blocks[i].len);
        }
        pad
    };
    let mut sorted = target.clone();
    let mut better = false;
    for (g, m) in members.iter_mut().enumerate() {
        let before = padding(m, &target, gaps[g].0);
        if before == 0 {
            continue;
        }
        m.sort_by_key(|&i| (std::cmp::Reverse(blocks[i].align), blocks[i].offset));
        let mut cursor = gaps[g].0;
        let mut at = Vec::with_capacity(m.len());
        for &i in m.iter() {
            let Some(pos) = align_up(cursor, blocks[i].align) else {
                break;
            };
            at.push(pos);
            cursor = pos.saturating_add(blocks[i].len);
        }
        if at.len() != m.len() || cursor > gaps[g].1 {
            continue; // does not fit the gap in this order: keep address order
        }
        for (&i, &pos) in m.iter().zip(&at) {
            sorted[i] = pos;
        }
        if padding(m, &sorted, gaps[g].0) < before {
            better = true;
        } else {
            for &i in m.iter() {
                sorted[i] = target[i];
            }
        }
    }
    better.then_some(sorted)
}

/// The packing by alignment class of unpinned blocks (none pinned): in
/// descending order of alignment, then of length (ties in address order),
/// each block at the lowest offset of its alignment where it fits, so that
/// the padding a large alignment leaves is filled with smaller blocks. The
/// layout's shape depends on the blocks' alignments and lengths only, not
/// on where they are. `None` if the blocks do not fit in `capacity` (not
/// a valid layout).
pub fn packed_by_alignment(blocks: &[LiveBlock], capacity: u64) -> Option<Vec<u64>> {
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by_key(|&i| {
        let b = &blocks[i];
        (
            std::cmp::Reverse(b.align),
            std::cmp::Reverse(b.len),
            b.offset,
        )
    });
    // Free ranges `start -> end`, ascending: padding holes and the tail.
    let mut free: BTreeMap<u64, u64> = BTreeMap::new();
    free.insert(0, capacity);
    let mut target = vec![0u64; blocks.len()];
    for i in order {
        let b = &blocks[i];
        let found = free.iter().find_map(|(&s, &e)| {
            let pos = align_up(s, b.align)?;
            pos.checked_add(b.len)
                .filter(|&end| end <= e)
                .map(|end| (s, e, pos, end))
        });
        let (s, e, pos, end) = found?;
        free.remove(&s);
        if pos > s {
            free.insert(s, pos);
        }
        if e > end {
            free.insert(end, e);
        }
        target[i] = pos;
    }
    Some(target)
}

/// Largest `align`-aligned hole of a layout given as targets.
pub(super) fn largest_hole_of(
    blocks: &[LiveBlock],
    target: &[u64],
    capacity: u64,
    align: u64,
) -> u64 {
    let mut layout: Vec<(u64, u64)> = target
        .iter()
        .zip(blocks)
        .map(|(&t, b)| (t, b.len))
        .collect();
    layout.sort_unstable();
    super::largest_aligned_hole(&layout, capacity, align)
}

/// A gap emptied for a request: the hole it leaves, and where its blocks
/// that leave go (block, offset).
struct Candidate {
    hole: u64,
    gap: usize,
    placed: Vec<(usize, u64)>,
}

/// The gap packing (see the module docs) for `req`: the targets of the
/// best gap and the hole it leaves there. `None` without pins.
fn gap_targets(blocks: &[LiveBlock], capacity: u64, align: u64) -> Option<(Vec<u64>, u64)> {
    let gaps = gaps(blocks, capacity);
    if gaps.len() < 2 {
        return None;
    }
    // Each gap's own blocks packed to its bottom (address order): targets
    // and the room left at the top.
    let gap_of = |offset: u64| gaps.partition_point(|g| g.1 <= offset).min(gaps.len() - 1);
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); gaps.len()];
    for (i, b) in blocks.iter().enumerate() {
        if !b.pinned {
            members[gap_of(b.offset)].push(i);
        }
    }
    let mut own: Vec<u64> = blocks.iter().map(|b| b.offset).collect();
    let mut top: Vec<u64> = Vec::with_capacity(gaps.len()); // first free byte
    for (g, m) in members.iter().enumerate() {
        let mut cursor = gaps[g].0;
        for &i in m {
            let pos = align_up(cursor, blocks[i].align)
                .filter(|p| p.saturating_add(blocks[i].len) <= gaps[g].1)
                .unwrap_or(blocks[i].offset);
            own[i] = pos.min(blocks[i].offset);
            cursor = own[i].saturating_add(blocks[i].len);
        }
        top.push(cursor);
    }
    // Candidates, largest gap first; a gap no larger than the best hole
    // found cannot beat it. The room at the top of every gap, by (size,
    // start); each candidate takes from it and puts back what it took, so
    // that a candidate costs its own blocks, not the whole layout.
    let mut order: Vec<usize> = (0..gaps.len()).collect();
    order.sort_unstable_by_key(|&g| std::cmp::Reverse(gaps[g].1 - gaps[g].0));
    let mut room: BTreeMap<(u64, u64), ()> = (0..gaps.len())
        .filter(|&h| gaps[h].1 > top[h])
        .map(|h| ((gaps[h].1 - top[h], top[h]), ()))
        .collect();
    let mut best: Option<Candidate> = None;
    for g in order {
        if best
            .as_ref()
            .is_some_and(|b| b.hole >= gaps[g].1 - gaps[g].0)
        {
            break;
        }
        let own_room = (gaps[g].1 > top[g]).then(|| (gaps[g].1 - top[g], top[g]));
        if let Some(k) = own_room {
            room.remove(&k);
        }
        // What this candidate changed in `room`, in order: (key, taken).
        let mut journal: Vec<((u64, u64), bool)> = Vec::new();
        let mut leaving: Vec<usize> = members[g].clone();
        leaving.sort_by_key(|&i| (std::cmp::Reverse(blocks[i].len), blocks[i].offset));
        let mut placed = Vec::new();
        let mut stay_end = gaps[g].0;
        let mut stay = Vec::new();
        for i in leaving {
            let b = &blocks[i];
            let fit = room
                .range((b.len, 0)..)
                .map(|(&k, _)| k)
                .find(|&(size, start)| {
                    align_up(start, b.align)
                        .and_then(|p| p.checked_add(b.len))
                        .is_some_and(|e| e <= start + size)
                });
            match fit {
                Some((size, start)) => {
                    room.remove(&(size, start));
                    journal.push(((size, start), true));
                    let pos = align_up(start, b.align).unwrap_or(start);
                    placed.push((i, pos));
                    // The rest of that room: above the block (the padding
                    // below it is left unused).
                    let end = start + size;
                    if end > pos + b.len {
                        let rest = (end - pos - b.len, pos + b.len);
                        room.insert(rest, ());
                        journal.push((rest, false));
                    }
                }
                None => stay.push(i),
            }
        }
        stay.sort_unstable_by_key(|&i| blocks[i].offset);
        for &i in &stay {
            let pos = align_up(stay_end, blocks[i].align).unwrap_or(blocks[i].offset);
            stay_end = pos.min(blocks[i].offset).saturating_add(blocks[i].len);
        }
        let hole = align_up(stay_end, align)
            .filter(|&s| s < gaps[g].1)
            .map_or(0, |s| gaps[g].1 - s);
        if best.as_ref().is_none_or(|b| hole > b.hole) {
            best = Some(Candidate {
                hole,
                gap: g,
                placed,
            });
        }
        // Put the room back as it was, undoing in reverse order.
        for (k, taken) in journal.into_iter().rev() {
            if taken {
                room.insert(k, ());
            } else {
                room.remove(&k);
            }
        }
        if let Some(k) = own_room {
            room.insert(k, ());
        }
    }
    let Candidate {
        hole,
        gap: g,
        placed,
    } = best?;
    let mut target = own;
    for &(i, pos) in &placed {
        target[i] = pos;
    }
    // The blocks that stay pack to the bottom of their gap.
    let mut cursor = gaps[g].0;
    let mut gone = vec![false; blocks.len()];
    for &(i, _) in &placed {
        gone[i] = true;
    }
    let mut stay: Vec<usize> = members[g].iter().copied().filter(|&i| !gone[i]).collect();
    stay.sort_unstable_by_key(|&i| blocks[i].offset);
    for i in stay {
        let pos = align_up(cursor, blocks[i].align).unwrap_or(blocks[i].offset);
        target[i] = pos.min(blocks[i].offset);
        cursor = target[i].saturating_add(blocks[i].len);
    }
    Some((target, hole))
}

/// The hole the gap packing makes for a request at `align`, if its plan
/// can be staged; 0 without pins.
pub fn largest_hole_by_gaps(blocks: &[LiveBlock], capacity: u64, align: u64) -> u64 {
    match gap_targets(blocks, capacity, align) {
        Some((target, hole))
            if plan_relayout(blocks, &target, capacity, PlanKind::Full).is_some() =>
        {
            hole
        }
        _ => 0,
    }
}

/// The gap packing's plan for `req` (see the module docs), if it leaves a
/// hole for it and can be staged.
pub fn plan_gap(blocks: &[LiveBlock], capacity: u64, req: Request) -> Option<Plan> {
    let (target, hole) = gap_targets(blocks, capacity, req.align)?;
    if hole < req.size {
        return None;
    }
    plan_relayout(blocks, &target, capacity, PlanKind::Full)
}
