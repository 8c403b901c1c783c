//! The targeted mechanism the policies share: making room for one request
//! on the layout as it is, by the cheapest plan the pacer
//! (`src/plan/pacer.rs`) picks, else a full compaction, else emptying the
//! gap between pinned blocks that can hold the most. Every block must be
//! at its index entry (no deferred moves) when it runs.

use std::time::Instant;

use crate::arena::core::Core;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::placement::Allocation;
use crate::plan::pacer::Pacer;
use crate::plan::planner::{self, Request};
use crate::plan::Plan;

/// Room for `reserved` bytes at `align` by the targeted mechanism, each
/// plan run only if `affords(plan)` says so. `Err(OutOfMemory)`, with
/// nothing changed, when no plan it may run makes room (`counted`: count
/// the failure in the statistics).
pub(crate) fn make_room<B: Backend>(
    core: &mut Core<B>,
    pacer: &mut Pacer,
    reserved: u64,
    align: u64,
    mut affords: impl FnMut(&mut Core<B>, &Plan) -> bool,
) -> Result<Allocation> {
    let capacity = core.capacity();
    if reserved <= core.index.free_bytes() {
        let req = Request {
            size: reserved,
            align,
        };
        let t0 = Instant::now();
        core.collect_live();
        let ops = core.counters.allocs.saturating_add(core.counters.frees);
        let plan = pacer.plan(&core.live, capacity, req, ops);
        core.counters.planning += t0.elapsed();
        if let Some((plan, _)) = plan.filter(|(p, _)| affords(core, p)) {
            core.run(plan, t0)?;
            if let Some(node) = core.index.alloc(reserved, align) {
                return Ok(node);
            }
        }
        // Targeted could not (pins, or holes too small for evacuees): a
        // full compaction, if it would make a hole big enough.
        let t0 = Instant::now();
        core.collect_live();
        if planner::largest_hole_after_full(&core.live, capacity, align) >= reserved {
            let plan = planner::plan_full(&core.live, capacity);
            if let Some(node) = run_whole(core, pacer, plan, t0, req, &mut affords)? {
                return Ok(node);
            }
        }
        // Pins leave the room in gaps the full compaction fills: empty
        // the gap that can hold the most for this request.
        let t0 = Instant::now();
        core.collect_live();
        if let Some(plan) = planner::plan_gap(&core.live, capacity, req) {
            if let Some(node) = run_whole(core, pacer, plan, t0, req, &mut affords)? {
                return Ok(node);
            }
        }
    }
    Err(out_of_memory(core, reserved, align, true))
}

/// The error of a request of `reserved` bytes at `align` that found no
/// room: what was asked, the free bytes, the largest hole, and the
/// largest hole compaction could reach (`gaps`: counting the gap packing
/// across pins, which a manual arena's `compact` does not run).
pub(crate) fn out_of_memory<B: Backend>(
    core: &mut Core<B>,
    reserved: u64,
    align: u64,
    gaps: bool,
) -> Error {
    let capacity = core.capacity();
    core.collect_live();
    let mut reachable = planner::largest_hole_after_full(&core.live, capacity, align);
    if gaps {
        reachable = reachable.max(planner::largest_hole_by_gaps(&core.live, capacity, align));
    }
    Error::OutOfMemory {
        requested_bytes: reserved,
        free_bytes: core.index.free_bytes(),
        largest_free_bytes: core.index.largest_free(),
        reachable_bytes: reachable,
    }
}

/// Runs `plan`, one that passes over every live block (planned from
/// `t0`), if `affords` it; then the request's node, if it has room.
fn run_whole<B: Backend>(
    core: &mut Core<B>,
    pacer: &mut Pacer,
    plan: Plan,
    t0: Instant,
    req: Request,
    affords: &mut impl FnMut(&mut Core<B>, &Plan) -> bool,
) -> Result<Option<Allocation>> {
    core.counters.planning += t0.elapsed();
    if !affords(core, &plan) {
        return Ok(None);
    }
    // Two passes: the reach and the plan.
    pacer.full_ran(plan.move_count(), 2 * core.live.len() as u64);
    core.run(plan, t0)?;
    Ok(core.index.alloc(req.size, req.align))
}
