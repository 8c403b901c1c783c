//! Where a new or returning block goes when no hole fits it: the
//! compaction policies' slow path (naive's compaction applied to the index,
//! the targeted policy's plans within a budget or not, a gap emptied
//! across pins) and, spilling on, evictions.

use std::time::Instant;

use super::shadow::Handover;
use super::Arena;
use crate::backend::Backend;
use crate::config::CompactionPolicy;
use crate::error::{Error, Result};
use crate::handle::BlockKey;
use crate::placement::Allocation;
use crate::plan::lag;
use crate::plan::planner::{self, Request};

/// Space for `reserved` bytes in the region: a hole (carved from its
/// top if `high`), else a compaction, else (spilling on) evicting least
/// recently used blocks not in `keep`. The space is free of bytes too:
/// blocks whose moves were deferred there have gone home.
pub(super) fn place_on_device<B: Backend>(
    arena: &mut Arena<B>,
    reserved: u64,
    align: u64,
    keep: &[BlockKey],
    high: bool,
) -> Result<Allocation> {
    let hole = if high {
        arena.index.alloc_high(reserved, align)
    } else {
        arena.index.alloc(reserved, align)
    };
    let placed = match hole {
        Some(node) => Ok((node, false)),
        None => match alloc_by_compacting(arena, reserved, align) {
            Err(Error::OutOfMemory { .. }) if arena.tier.is_some() => {
                super::spill::alloc_by_spilling(arena, reserved, align, keep)
                    .map(|node| (node, false))
            }
            r => r,
        },
    };
    let (node, naive_compacted) = placed?;
    let (lo, hi) = (node.offset(), node.offset() + node.size());
    if let Err(e) = super::defer::clear_range(arena, lo, hi, naive_compacted) {
        // Nothing moved (or the arena is poisoned): give the space back.
        let _ = arena.index.free(node);
        return Err(e);
    }
    Ok(node)
}

/// The slow path: compact (if allowed and useful), then place. Returns
/// the node and whether it was placed after naive's own compaction
/// (deferred: the caller sends home what is in its way).
pub(super) fn alloc_by_compacting<B: Backend>(
    arena: &mut Arena<B>,
    reserved: u64,
    align: u64,
) -> Result<(Allocation, bool)> {
    // Compaction trusts the layout, which a poisoned arena does not.
    arena.check_usable()?;
    let capacity = arena.config.capacity_bytes;
    let policy = arena.config.compaction;
    if let Some(budget) = super::shadow::budget(arena) {
        // The first phase of `Budgeted`: the targeted policy within what
        // naive has moved beyond the arena, else naive's layout.
        match alloc_by_targeted(arena, reserved, align, Some(budget)) {
            Ok(node) => return Ok((node, false)),
            Err(Error::OutOfMemory { .. }) if super::shadow::has_pending(arena) => {}
            Err(e) => return Err(e),
        }
        if let Handover::Done {
            pending: Some(node),
            ..
        } = super::shadow::handover(arena)?
        {
            return Ok((node, false));
        }
        // No handover now (a pinned block away from naive's place, or
        // no free spot to stage a move): this request goes over budget.
        let before = arena.counters.bytes_moved;
        let node = alloc_by_targeted(arena, reserved, align, None)?;
        let over = arena.counters.bytes_moved.saturating_sub(before);
        arena.counters.overrun_bytes = arena.counters.overrun_bytes.saturating_add(over);
        return Ok((node, false));
    }
    if matches!(policy, CompactionPolicy::Budgeted | CompactionPolicy::Auto) {
        if reserved > arena.index.free_bytes() {
            arena.counters.naive_failures += 1;
        } else {
            let t0 = Instant::now();
            super::compaction::collect_live(arena);
            if planner::largest_hole_after_full(&arena.live, capacity, align) >= reserved {
                return alloc_after_naive(arena, reserved, align, t0).map(|n| (n, true));
            }
            // Naive's full compaction would leave no hole (pins, or
            // alignment padding): naive fails here, the arena goes on
            // as the targeted policy would.
            arena.counters.naive_failures += 1;
        }
    }
    alloc_by_targeted(arena, reserved, align, None).map(|n| (n, false))
}

/// Naive's compaction for a request it makes room for (`arena.live`
/// collected): applied to the index with the moves deferred when the
/// plan allows it, run at once otherwise (see `src/plan/lag.rs`).
pub(super) fn alloc_after_naive<B: Backend>(
    arena: &mut Arena<B>,
    reserved: u64,
    align: u64,
    t0: Instant,
) -> Result<Allocation> {
    let capacity = arena.config.capacity_bytes;
    let plan = planner::plan_full(&arena.live, capacity);
    arena.counters.planning += t0.elapsed();
    arena.pacer.full_ran(0, 2 * arena.live.len() as u64);
    if lag::is_downward(&plan) {
        super::defer::defer_full(arena, &plan)?;
    } else {
        arena.counters.naive_bytes_moved = arena
            .counters
            .naive_bytes_moved
            .saturating_add(plan.bytes_moved());
        // Sending the lagging blocks home changes no placement: the
        // plan, made from the index, still applies.
        super::defer::settle(arena)?;
        super::compaction::execute(arena, plan, t0)?;
    }
    arena.index.alloc(reserved, align).ok_or_else(|| {
        // Unreachable: the full compaction was checked to make the hole.
        let reason = "naive's full compaction did not make the hole it reaches";
        arena.poison(reason.to_string());
        Error::Poisoned {
            reason: reason.to_string(),
        }
    })
}

/// The slow path of the targeted policy (and of `Auto` where naive
/// fails): a targeted or full plan as the pacer chooses, falling back to
/// a full one. Plans are made on the index; one that runs first sends
/// every lagging block home, so that the bytes are where it planned
/// them (which changes no placement, so the plan still applies).
///
/// With a `budget`, no plan runs that would take the bytes moved for
/// this request past it (the request fails instead, uncounted).
pub(super) fn alloc_by_targeted<B: Backend>(
    arena: &mut Arena<B>,
    reserved: u64,
    align: u64,
    budget: Option<u64>,
) -> Result<Allocation> {
    let capacity = arena.config.capacity_bytes;
    let policy = arena.config.compaction;
    let mut left = budget;
    let mut affords = |bytes: u64| match left.as_mut() {
        None => true,
        Some(l) if bytes <= *l => {
            *l -= bytes;
            true
        }
        Some(_) => false,
    };
    if policy != CompactionPolicy::Manual && reserved <= arena.index.free_bytes() {
        let req = Request {
            size: reserved,
            align,
        };
        let t0 = Instant::now();
        super::compaction::collect_live(arena);
        let ops = arena.counters.allocs.saturating_add(arena.counters.frees);
        let plan = arena.pacer.plan(&arena.live, capacity, req, ops);
        arena.counters.planning += t0.elapsed();
        if let Some((plan, _)) = plan.filter(|(p, _)| affords(p.bytes_moved())) {
            super::defer::settle(arena)?;
            super::compaction::execute(arena, plan, t0)?;
            if let Some(node) = arena.index.alloc(reserved, align) {
                return Ok(node);
            }
        }
        // Targeted could not (pins, or holes too small for evacuees):
        // a full compaction, if it would make a hole big enough.
        let t0 = Instant::now();
        super::compaction::collect_live(arena);
        if planner::largest_hole_after_full(&arena.live, capacity, align) >= reserved {
            let plan = planner::plan_full(&arena.live, capacity);
            arena.counters.planning += t0.elapsed();
            if affords(plan.bytes_moved()) {
                // Two passes: the reach above and the plan.
                let visits = 2 * arena.live.len() as u64;
                arena.pacer.full_ran(plan.move_count(), visits);
                super::defer::settle(arena)?;
                super::compaction::execute(arena, plan, t0)?;
                if let Some(node) = arena.index.alloc(reserved, align) {
                    return Ok(node);
                }
            }
        }
        // Pins leave the room in gaps the full compaction fills: empty
        // the gap that can hold the most for this request.
        let t0 = Instant::now();
        super::compaction::collect_live(arena);
        let gap = planner::plan_gap(&arena.live, capacity, req);
        if let Some(plan) = gap.filter(|p| affords(p.bytes_moved())) {
            arena.counters.planning += t0.elapsed();
            arena
                .pacer
                .full_ran(plan.move_count(), 2 * arena.live.len() as u64);
            super::defer::settle(arena)?;
            super::compaction::execute(arena, plan, t0)?;
            if let Some(node) = arena.index.alloc(reserved, align) {
                return Ok(node);
            }
        }
    }
    if arena.tier.is_none() && budget.is_none() {
        arena.counters.failed_allocs += 1;
    }
    super::compaction::collect_live(arena);
    // What the last two plans above reach: the most this request's
    // compactions can make (a manual arena's: what `compact` makes).
    let mut reachable = planner::largest_hole_after_full(&arena.live, capacity, align);
    if policy != CompactionPolicy::Manual {
        reachable = reachable.max(planner::largest_hole_by_gaps(&arena.live, capacity, align));
    }
    Err(Error::OutOfMemory {
        requested_bytes: reserved,
        free_bytes: arena.index.free_bytes(),
        largest_free_bytes: arena.index.largest_free(),
        reachable_bytes: reachable,
    })
}
