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
//! Cost of a decision: one targeted plan and the full plan's bytes (the
//! price the rules compare, counted without building the plan), both
//! O(live blocks); the full plan is built only when chosen.
//! The pacer itself is three counters.
//!
//! Neither rule can make an allocation fail: the arena still falls back to
//! a full compaction whenever the plan it ran left no hole for the request
//! and a full one would make one, so a request fits whenever it fits in the
//! free bytes of one gap between pinned blocks (with no pins: whenever its
//! size is at most the free bytes).

use super::planner::{
    full_bytes_moved, largest_hole_after_full, plan_full, plan_targeted, LiveBlock, Request,
};
use super::Plan;

/// Block visits of planning allowed per allocation or free served.
pub const WORK_PER_OP: u64 = 8;

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
        let full_bytes = full_bytes_moved(blocks, capacity);
        self.work = self.work.saturating_add(n);
        // A full plan is only a candidate if it moves something and leaves
        // a hole for the request (with pins it may not, where a targeted
        // evacuation across gaps would).
        let full_serves =
            || full_bytes > 0 && largest_hole_after_full(blocks, capacity, req.align) >= req.size;
        if self.work.saturating_add(n) > budget && full_serves() {
            self.escalations += 1;
            self.rent = 0;
            let full = plan_full(blocks, capacity);
            self.moved = self.moved.saturating_add(full.move_count() as u64);
            return Some((full, Reason::Budget));
        }
        self.work = self.work.saturating_add(n);
        let targeted = plan_targeted(blocks, capacity, req)?;
        let t = targeted.bytes_moved();
        if t.saturating_mul(2) >= full_bytes && full_serves() {
            self.rent = 0;
            let full = plan_full(blocks, capacity);
            self.moved = self.moved.saturating_add(full.move_count() as u64);
            return Some((full, Reason::Buy));
        }
        self.rent = self.rent.saturating_add(t);
        self.moved = self.moved.saturating_add(targeted.move_count() as u64);
        Some((targeted, Reason::Targeted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlanKind;

    fn blk(key: u64, offset: u64, len: u64) -> LiveBlock {
        LiveBlock {
            key,
            offset,
            len,
            copy_len: len,
            align: 1,
            pinned: false,
        }
    }

    /// `n` blocks of 256 B with a 256 B hole after each.
    fn checkerboard(n: u64) -> (Vec<LiveBlock>, u64) {
        ((0..n).map(|i| blk(i, 512 * i, 256)).collect(), 512 * n)
    }

    /// Largest free span after applying `plan`.
    fn largest_after(blocks: &[LiveBlock], plan: &Plan, capacity: u64) -> u64 {
        plan.validate_against(blocks, capacity).expect("valid plan");
        let mut layout: Vec<(u64, u64)> = blocks.iter().map(|b| (b.offset, b.len)).collect();
        for m in plan.moves() {
            let i = blocks.iter().position(|b| b.key == m.key).expect("block");
            layout[i].0 = m.dst;
        }
        layout.sort_unstable();
        let (mut best, mut cursor) = (0, 0);
        for &(o, l) in layout.iter().chain(std::iter::once(&(capacity, 0))) {
            best = best.max(o.saturating_sub(cursor));
            cursor = o + l;
        }
        best
    }

    const REQ: Request = Request {
        size: 512,
        align: 1,
    };

    #[test]
    fn cheap_targeted_plans_are_kept() {
        let (blocks, cap) = checkerboard(100);
        let mut p = Pacer::new();
        let (plan, why) = p.plan(&blocks, cap, REQ, 1_000).expect("plan");
        assert_eq!((why, plan.kind), (Reason::Targeted, PlanKind::Targeted));
        assert_eq!(plan.bytes_moved(), 256);
        assert!(largest_after(&blocks, &plan, cap) >= 512);
    }

    #[test]
    fn a_targeted_plan_worth_half_a_full_one_buys_the_full_one() {
        // Two blocks with holes between: making 3 KiB slides one block
        // of 1 KiB, and the full compaction moves 2 KiB.
        let blocks = [blk(0, 1024, 1024), blk(1, 3072, 1024)];
        let mut p = Pacer::new();
        let req = Request {
            size: 3072,
            align: 1,
        };
        let (plan, why) = p.plan(&blocks, 5120, req, 10).expect("plan");
        assert_eq!((why, plan.kind), (Reason::Buy, PlanKind::Full));
        assert!(largest_after(&blocks, &plan, 5120) >= 3072);
    }

    #[test]
    fn an_exhausted_budget_escalates_to_a_full_compaction() {
        let (blocks, cap) = checkerboard(10_000);
        let mut p = Pacer::new();
        let mut reasons = Vec::new();
        // Requests arriving one op apart: the budget runs out quickly.
        for ops in 0..20 {
            let (plan, why) = p.plan(&blocks, cap, REQ, ops).expect("plan");
            assert!(largest_after(&blocks, &plan, cap) >= 512);
            reasons.push(why);
        }
        assert_eq!(reasons[0], Reason::Targeted);
        assert!(reasons.contains(&Reason::Budget), "{reasons:?}");
        let budget = reasons.iter().filter(|r| **r == Reason::Budget).count();
        assert_eq!(p.escalations(), budget as u64);
    }

    #[test]
    fn a_full_plan_that_cannot_serve_is_never_chosen() {
        // A pin splits the free space: the full compaction moves block 0
        // down but leaves two 256 B holes, while evacuating block 0 past
        // the pin frees 512 B. Even with no budget left the pacer must take
        // the targeted plan.
        let blocks = [
            blk(0, 256, 256),
            LiveBlock {
                pinned: true,
                ..blk(1, 512, 256)
            },
        ];
        let mut p = Pacer {
            work: u64::MAX / 2,
            ..Pacer::new()
        };
        assert!(plan_full(&blocks, 1024).bytes_moved() > 0);
        let (plan, why) = p.plan(&blocks, 1024, REQ, 0).expect("plan");
        assert_eq!(why, Reason::Targeted);
        assert!(largest_after(&blocks, &plan, 1024) >= 512);
        assert_eq!(p.escalations(), 0);
    }

    /// Random unpinned layouts and any pacer state: whenever the request
    /// fits in the free bytes (alignment 1), the chosen plan is valid and
    /// leaves a hole for it.
    #[test]
    fn every_choice_serves_a_request_the_free_bytes_allow() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for case in 0..2_000 {
            let n = 1 + rnd() % 40;
            let mut blocks = Vec::new();
            let mut off = 0;
            for k in 0..n {
                off += rnd() % 3 * 64;
                let len = 64 * (1 + rnd() % 8);
                blocks.push(blk(k, off, len));
                off += len;
            }
            let cap = off + rnd() % 4 * 64;
            let live: u64 = blocks.iter().map(|b| b.len).sum();
            let free = cap - live;
            if free == 0 {
                continue;
            }
            let req = Request {
                size: 1 + rnd() % free,
                align: 1,
            };
            let mut p = Pacer {
                work: if case % 2 == 0 { 0 } else { u64::MAX / 2 },
                ..Pacer::new()
            };
            if let Some((plan, _)) = p.plan(&blocks, cap, req, rnd() % 100) {
                assert!(
                    largest_after(&blocks, &plan, cap) >= req.size,
                    "case {case}: {blocks:?} {req:?}"
                );
            } else {
                // No targeted plan: the arena falls back to a full one,
                // which with no pins always makes the room.
                let full = plan_full(&blocks, cap);
                assert!(largest_after(&blocks, &full, cap) >= req.size);
            }
        }
    }
}
