//! When to compact how much: the policy between the arena and the planner.
//!
//! The arena calls [`Pacer::plan`] when a request fits in the free bytes
//! but in no hole. The pacer returns a targeted plan (one hole, fewest
//! bytes) or a full one (every gap packed), by two rules:
//!
//! 1. **Rent or buy (bytes).** A targeted compaction is rent, a full one a
//!    purchase: afterwards the free space of each gap is one region and the
//!    requests that follow fit without moving anything until it is used up.
//!    The pacer buys when the targeted plan, plus the targeted bytes paid
//!    since the last full compaction, reaches half of what the full plan
//!    would move now. So a request that needs nearly all free space, spread
//!    over many holes (the targeted plan is then almost a full one), gets
//!    the full compaction at once rather than a near-full compaction now
//!    and another one at the next request; and a run of small targeted
//!    compactions never pays more than about the full price before the
//!    layout is packed. While targeted compactions stay cheap against a full
//!    one, nothing changes: they are what keeps bytes moved below a naive
//!    compact-on-failure allocator.
//! 2. **Amortised planning (time).** Planning is linear in live blocks:
//!    collecting them, the planners, and rebuilding the index after the
//!    moves. The pacer keeps a budget of [`WORK_PER_OP`] block visits per
//!    allocation and free the arena has served (plus [`WORK_FLOOR`]); a
//!    compaction that would overdraw it is a full one, which serves every
//!    request that fits in the merged free space without planning again.
//!    Heavy fragmentation (blocks freed every other one, then requests twice
//!    their size) thus costs a bounded number of targeted compactions and
//!    one full one instead of one targeted compaction per request, and the
//!    planning work of a whole program is at most `WORK_PER_OP` per op plus
//!    `WORK_FLOOR`, plus the full compactions (which a naive
//!    compact-on-failure allocator would run as well).
//!
//! Cost of a decision: one targeted plan and one full plan, both
//! O(live blocks) (the full plan's bytes are the price the rules compare).
//! The pacer itself is three counters.
//!
//! Neither rule can make an allocation fail: the arena still falls back to
//! a full compaction whenever the plan it ran left no hole for the request
//! and a full one would make one, so a request fits whenever it fits in the
//! free bytes of one gap between pinned blocks (with no pins: whenever its
//! size is at most the free bytes).

use super::planner::{largest_hole_after_full, plan_full, plan_targeted, LiveBlock, Request};
use super::Plan;

/// Block visits of planning allowed per allocation or free served.
pub const WORK_PER_OP: u64 = 16;

/// Block visits of planning allowed regardless of ops: small arenas never
/// escalate for time.
pub const WORK_FLOOR: u64 = 1 << 16;

/// The policy's state: planning work done and targeted bytes paid since
/// the last full compaction. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct Pacer {
    /// Block visits spent planning so far.
    work: u64,
    /// Bytes moved by targeted compactions since the last full one.
    rent: u64,
    /// Blocks moved by the compactions the pacer planned or was told of.
    moved: u64,
    /// Full compactions chosen for time (rule 2).
    escalations: u64,
}

/// Which rule chose a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The targeted plan was cheap enough.
    Targeted,
    /// Rule 1: the targeted bytes reached half the full price.
    Buy,
    /// Rule 2: the planning budget is spent.
    Budget,
}

impl Pacer {
    /// A fresh pacer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Full compactions chosen for time so far.
    pub fn escalations(&self) -> u64 {
        self.escalations
    }

    /// Tells the pacer a full compaction of `moves` moves ran (the
    /// caller's own, not one [`Pacer::plan`] returned).
    pub fn full_ran(&mut self, moves: usize) {
        self.rent = 0;
        self.moved = self.moved.saturating_add(moves as u64);
    }

    /// The plan to run for `req`, given the live blocks and the number of
    /// allocations and frees served so far, and why; `None` when no targeted
    /// plan exists (the caller's fallback, a full compaction if it makes
    /// room, decides).
    pub fn plan(
        &mut self,
        blocks: &[LiveBlock],
        capacity: u64,
        req: Request,
        ops: u64,
    ) -> Option<(Plan, Reason)> {
        let n = blocks.len() as u64;
        let budget = WORK_PER_OP
            .saturating_mul(ops.saturating_add(self.moved))
            .saturating_add(WORK_FLOOR);
        let full = plan_full(blocks, capacity);
        self.work = self.work.saturating_add(n);
        let full_bytes = full.bytes_moved();
        // A full plan is only a candidate if it moves something and leaves
        // a hole for the request (with pins it may not, where a targeted
        // evacuation across gaps would).
        let full_serves =
            || full_bytes > 0 && largest_hole_after_full(blocks, capacity, req.align) >= req.size;
        if self.work.saturating_add(n) > budget && full_serves() {
            self.escalations += 1;
            self.rent = 0;
            self.moved = self.moved.saturating_add(full.move_count() as u64);
            return Some((full, Reason::Budget));
        }
        self.work = self.work.saturating_add(n);
        let Some(targeted) = plan_targeted(blocks, capacity, req) else {
            return None;
        };
        let t = targeted.bytes_moved();
        if t.saturating_mul(2) >= full_bytes && full_serves() {
            self.rent = 0;
            self.moved = self.moved.saturating_add(full.move_count() as u64);
            return Some((full, Reason::Buy));
        }
        self.rent = self.rent.saturating_add(t);
        self.moved = self.moved.saturating_add(targeted.move_count() as u64);
        Some((targeted, Reason::Targeted))
    }
}
