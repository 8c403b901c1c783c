//! Compaction's mechanics: the live blocks collected in address order, a
//! plan checked against them, executed, and the index and the handle table
//! moved to match. The decisions (when, which plan) are the callers'.

use std::time::Instant;

use super::block::{set_owner, Owner, Place};
use super::{Arena, CompactionReport};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::handle::BlockKey;
use crate::plan::planner::LiveBlock;
use crate::plan::{Plan, PlanKind};

/// Fills `arena.live` with the live blocks in address order.
pub(super) fn collect_live<B: Backend>(arena: &mut Arena<B>) {
    arena.live.clear();
    // Exact sizes up front, here and for the other per-compaction
    // tables: growing them by doubling copies them and leaves freed
    // chunks behind (fresh pages, page faults, on large arenas).
    arena.live.reserve(arena.blocks.len());
    if arena.live_pos.len() < arena.blocks.slot_count() {
        arena.live_pos.resize(arena.blocks.slot_count(), 0);
    }
    for r in arena.index.regions() {
        let Some(slot) = r.slot else { continue };
        // A used node's owner is its live block (see `Owner`), and the
        // node's size is the block's reservation.
        let Some(o) = arena.owners.get(slot as usize) else {
            continue;
        };
        debug_assert!(arena.blocks.contains_key(o.key), "stale owner {o:?}");
        if let Some(p) = arena.live_pos.get_mut(o.key.slot() as usize) {
            *p = arena.live.len() as u32;
        }
        arena.live.push(o.live_block(r.offset, r.size));
    }
}

/// Runs a plan made from `arena.live` and moves the table to match.
/// The plan's final layout is checked first (every move names a live,
/// unpinned block where it is, keeps its alignment, and the blocks end
/// disjoint and inside the region): a plan that fails the check is
/// refused with [`Error::InvalidInput`] and nothing changes.
pub(super) fn execute<B: Backend>(
    arena: &mut Arena<B>,
    plan: Plan,
    t0: Instant,
) -> Result<CompactionReport> {
    let planning = t0.elapsed();
    let used_on_streams = check_final_layout(arena, &plan)?;
    // Nothing moves under a kernel still using it on another stream.
    if used_on_streams {
        for m in plan.moves() {
            arena.wait_uses(BlockKey::from_bits(m.key))?;
        }
    }
    arena.epoch += 1;
    let t1 = Instant::now();
    if let Err(e) = arena.backend.execute(&plan) {
        arena.poison(format!("compaction failed part-way: {e}"));
        return Err(e);
    }
    let execution = t1.elapsed();
    // The check matched every move to its block: `m.len` is its size.
    for m in plan.moves() {
        arena.set_entry(BlockKey::from_bits(m.key), Some((m.dst, m.len)));
    }
    rebuild_index(arena)?;
    // The table's new offsets follow the moves in stream order.
    if let Err(e) = arena.flush_table() {
        arena.poison(format!(
            "handle table update failed after a compaction: {e}"
        ));
        return Err(e);
    }
    let c = &mut arena.counters;
    match plan.kind {
        PlanKind::Targeted => c.targeted += 1,
        PlanKind::Full => c.full += 1,
    }
    c.moves = c.moves.saturating_add(plan.move_count() as u64);
    c.bytes_moved = c.bytes_moved.saturating_add(plan.bytes_moved());
    c.compaction += t0.elapsed();
    Ok(CompactionReport {
        kind: plan.kind,
        moves: plan.move_count() as u64,
        waves: plan.waves.len() as u64,
        bytes_moved: plan.bytes_moved(),
        planning,
        execution,
    })
}

/// Rebuilds the index from `arena.live` (the layout a checked plan left,
/// sorted by offset), each block's new allocation going straight to its
/// owner entry and block. Poisons the arena if it fails (unreachable:
/// the layout was checked).
pub(super) fn rebuild_index<B: Backend>(arena: &mut Arena<B>) -> Result<()> {
    arena.spans.clear();
    arena
        .spans
        .extend(arena.live.iter().map(|l| (l.offset, l.len)));
    // Each block's new allocation goes straight to its owner and block.
    let Arena {
        index,
        spans,
        live,
        owners,
        blocks,
        ..
    } = arena;
    let rebuilt = index.rebuild_with(spans, |i, a| {
        let owner = Owner::of_live(&live[i]);
        let key = owner.key;
        set_owner(owners, a.slot(), owner);
        // Live: the list was collected from the live blocks just now.
        if let Some(b) = blocks.get_mut_live_slot(key) {
            b.place = Place::Device(a);
        }
    });
    if let Err(e) = rebuilt {
        // Unreachable: the layout was checked before.
        return Err(arena.broken("rebuilding the index after a compaction failed", e));
    }
    Ok(())
}

/// Turns `arena.live` into the layout after `plan` (offsets moved,
/// sorted by offset; it is scratch, recollected before every plan) and
/// checks it; see [`Arena::execute`]. O(blocks + moves). Returns whether
/// a moved block was used on other streams (so that execution reads
/// each moved block's records once, here, in the common case).
pub(super) fn check_final_layout<B: Backend>(arena: &mut Arena<B>, plan: &Plan) -> Result<bool> {
    let invalid = |reason: String| {
        Err(Error::InvalidInput {
            input: "plan",
            reason,
        })
    };
    let mut used_on_streams = false;
    arena.moved.0.clear();
    for m in plan.moves() {
        let key = BlockKey::from_bits(m.key);
        // A key whose position holds that very key (version included)
        // names a block of the live list, so a live block.
        let i = match arena.live_pos.get(key.slot() as usize) {
            Some(&i) => i as usize,
            None => return invalid(format!("move {m:?} names no live block")),
        };
        if arena.other_streams {
            used_on_streams |= arena.blocks.get(key).is_some_and(|b| !b.uses().is_empty());
        }
        let Some(l) = arena.live.get_mut(i).filter(|l| l.key == m.key) else {
            return invalid(format!(
                "move {m:?} names a block outside the plan's live set"
            ));
        };
        if l.pinned || l.offset != m.src || m.len != l.copy_len || m.dst % l.align != 0 {
            return invalid(format!(
                "move {m:?} does not match its block (pinned {}, at {}, {} B to copy, \
                 alignment {})",
                l.pinned, l.offset, l.copy_len, l.align
            ));
        }
        l.offset = m.dst;
        arena.moved.0.push(i as u32);
    }
    if !arena.live.windows(2).all(|w| w[0].offset <= w[1].offset) {
        let (positions, entries) = &mut arena.moved;
        sort_moved(&mut arena.live, positions, entries);
    }
    let capacity = arena.config.capacity_bytes;
    let mut cursor = 0u64;
    for &LiveBlock { offset, len, .. } in &arena.live {
        let end = offset.checked_add(len).filter(|&e| e <= capacity);
        match end {
            Some(end) if offset >= cursor => cursor = end,
            _ => {
                return invalid(format!(
                    "after the plan a block at {offset} of {len} B overlaps the one below \
                     (ending at {cursor}) or leaves the region of {capacity} B"
                ))
            }
        }
    }
    Ok(used_on_streams)
}

/// Sorts `live` by offset when only the entries at `moved` (positions in
/// any order, maybe repeated) can be out of order, the rest ascending: the
/// moved entries are taken out (into `out`), sorted, and merged back.
/// O(n + k log k) for k moves, where sorting the whole list is O(n log n)
/// on every targeted evacuation (its few evacuees land out of order).
fn sort_moved(live: &mut [LiveBlock], moved: &mut Vec<u32>, out: &mut Vec<LiveBlock>) {
    moved.sort_unstable();
    moved.dedup();
    out.clear();
    let mut next = moved.iter().copied().peekable();
    let mut kept = 0;
    for r in 0..live.len() {
        if next.peek() == Some(&(r as u32)) {
            next.next();
            out.push(live[r]);
        } else {
            live[kept] = live[r];
            kept += 1;
        }
    }
    out.sort_unstable_by_key(|l| l.offset);
    // Merge from the top down into the room the moved entries left.
    let (mut i, mut j) = (kept, out.len());
    for k in (0..live.len()).rev() {
        let take_kept = j == 0 || (i > 0 && live[i - 1].offset > out[j - 1].offset);
        if take_kept {
            live[k] = live[i - 1];
            i -= 1;
        } else {
            live[k] = out[j - 1];
            j -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blk(offset: u64) -> LiveBlock {
        LiveBlock {
            key: offset,
            offset,
            len: 1,
            copy_len: 1,
            align: 1,
            pinned: false,
        }
    }

    proptest::proptest! {
        /// Moving any few blocks anywhere and merging them back gives what a
        /// full sort gives.
        #[test]
        fn merging_the_moved_blocks_back_sorts_the_list(
            n in 1usize..40,
            picks in proptest::collection::vec((0usize..40, 0u64..420), 0..6),
        ) {
            let mut live: Vec<LiveBlock> = (0..n as u64).map(|i| blk(10 * i)).collect();
            let mut moved = Vec::new();
            for (i, offset) in picks {
                let i = i % n;
                live[i].offset = offset % (10 * n as u64 + 20);
                moved.push(i as u32);
            }
            let mut want: Vec<u64> = live.iter().map(|l| l.offset).collect();
            want.sort_unstable();
            sort_moved(&mut live, &mut moved, &mut Vec::new());
            let got: Vec<u64> = live.iter().map(|l| l.offset).collect();
            proptest::prop_assert_eq!(got, want);
        }
    }
}
