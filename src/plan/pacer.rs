//! When to compact how much for the targeted mechanism: the plans the
//! default policy runs in its free mode, and the fallback of every policy
//! for the requests naive cannot serve (`crate::policies`).
//!
//! The arena calls [`Pacer::plan`] when a request fits in the free bytes
//! but in no hole. The pacer returns a targeted plan (one hole, fewest
//! bytes) or a full one (every gap packed), by two rules:
//!
//! 1. **Full when it costs enough (bytes).** A targeted compaction is
//!    rent, a full one a purchase: afterwards the free space of each gap is
//!    one region. The pacer buys only when the targeted plan would move
//!    at least as many bytes as the full plan would now (`for_placement`
//!    keeps the other price, half the full one, which moved more on the
//!    recorded traces once blocks are placed as naive places them).
//!    (Counting the targeted bytes paid since the last full compaction as
//!    well moved more.) Cheap targeted compactions are what keeps bytes
//!    moved below a naive compact-on-failure allocator.
//! 2. **Amortised planning (time).** Planning is linear in live blocks:
//!    collecting them, the planners, and rebuilding the index after the
//!    moves. A request that needs a compaction therefore costs O(live
//!    blocks), and a program that sends many such requests in a row (blocks
//!    freed every other one, then requests twice their size) would cost
//!    O(requests x live blocks). The pacer keeps a budget of
//!    [`WORK_PER_OP`] block visits per allocation and free the arena has
//!    served (and per block moved); a compaction that would overdraw it is
//!    a full one, which serves every request that fits in the merged free
//!    space without planning again. The charge is the planners' passes over
//!    the live blocks (one visit per block per pass), but only for plans
//!    over more than [`SMALL_PLAN`] blocks: a smaller plan costs a bounded
//!    amount (tens of microseconds), and charging it would turn the cheap
//!    targeted compactions of a workload with few, large blocks into full
//!    ones that copy far more bytes, for no gain in time worth having.
//!    There is no floor of free work: with one, small programs never
//!    escalated and large ones did, so time per op changed with size. Now
//!    the planning work of a whole program is at most `WORK_PER_OP` per op
//!    (plus one overdraw and the full compactions, which a naive
//!    compact-on-failure allocator runs as well) once plans are large, and
//!    at most `SMALL_PLAN` passes' worth per compaction before: either way
//!    a bound per op that does not grow with the live blocks.
//!
//!    **Bursts.** Credit saved up is capped at [`BURST_PLANS`] targeted
//!    plans over the current live blocks: a run of requests that each
//!    need a compaction (closer together than the budget refills) gets
//!    at most that many targeted plans, then the full one, however long the
//!    program ran before. Without the cap the count was the saved credit
//!    divided by the plan's cost, a ratio of ops to live blocks: a long
//!    history bought a long burst, and a program freeing every other block
//!    (3 ops per live block, 3 plans' credit) sat exactly on the line
//!    between two and three plans, so a few requests more or less that
//!    fitted in holes changed the count from one size to the next. With the
//!    cap the count is `BURST_PLANS` whenever the program saved that much
//!    (roughly, once it has freed half as many blocks as are live), and
//!    the bound above holds for any stretch of the program, not only the
//!    whole, with the cap added. On the fragmentation programs of
//!    `cuarena_trace::fragment` this is two targeted compactions and one
//!    full one at every size from 10k to 320k blocks, so replay time grows
//!    linearly.
//!
//! Cost of a decision: one targeted plan and the full plan's bytes (the
//! price the rules compare, counted without building the plan), both
//! O(live blocks); the full plan is built only when chosen. The pacer
//! itself is a few counters; [`Pacer::visits`] counts every planner pass
//! (charged or not), a deterministic measure of planning time.
//!
//! What it is not: planning whose cost is independent of the live blocks.
//! That needs a hole index kept up to date as blocks come, go and move (the
//! placement index is rebuilt after every compaction, and the planners scan
//! the whole layout to find the cheapest window); the budget bounds the
//! number of such scans instead.
//!
//! Neither rule can make an allocation fail: the arena still falls back to
//! a full compaction whenever the plan it ran left no hole for the request
//! and a full one would make one, so a request fits whenever it fits in the
//! free bytes of one gap between pinned blocks (with no pins: whenever its
//! size is at most the free bytes).

use super::planner::{
    full_bytes_moved, largest_hole_after_full_in, plan_full, plan_targeted_in, LiveBlock, Request,
    Scratch,
};
use super::Plan;

/// Block visits of planning allowed per allocation or free served (and per
/// block moved). A targeted plan over `n` blocks costs two passes, `2 * n`
/// visits: the credit of `n` ops.
pub const WORK_PER_OP: u64 = 2;

/// Targeted plans that saved credit can pay for in a row (the cap of rule
/// 2 in the module docs). Two: a lone pair of requests needing room keeps
/// its cheap plans; from the third in a row the program is fragmenting
/// faster than it earns credit, and one full compaction serves the rest of
/// the burst.
pub const BURST_PLANS: u64 = 2;

/// Plans over at most this many live blocks are not charged to the budget
/// (see the module docs): below it, a targeted compaction costs a bounded
/// amount, and escalating would trade a few microseconds for bytes copied.
pub const SMALL_PLAN: u64 = 4096;

/// The policy's state: planning work done and the price rule 1 buys at.
/// See the module docs.
#[derive(Debug, Clone)]
pub struct Pacer {
    /// Block visits charged to the budget so far, raised where saved
    /// credit lapses (the cap of rule 2).
    work: u64,
    /// Block visits of every planner pass, charged or not.
    visits: u64,
    /// Rule 1 buys a full compaction when the targeted plan costs
    /// `1 / buy_divisor` of it: 1 with large blocks kept apart, else 2.
    buy_divisor: u64,
    /// Blocks moved by the compactions the pacer planned or was told of.
    moved: u64,
    /// Full compactions chosen for time (rule 2).
    escalations: u64,
    /// Plans over at most this many blocks are free ([`SMALL_PLAN`]).
    small_plan: u64,
    /// The planners' tables, reused from one compaction to the next.
    scratch: Scratch,
}

impl Default for Pacer {
    fn default() -> Self {
        Self {
            work: 0,
            visits: 0,
            buy_divisor: 1,
            moved: 0,
            escalations: 0,
            small_plan: SMALL_PLAN,
            scratch: Scratch::default(),
        }
    }
}

/// Which rule chose a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The targeted plan was cheap enough.
    Targeted,
    /// Rule 1: the targeted plan would move as much as the full one.
    Buy,
    /// Rule 2: the planning budget is spent.
    Budget,
}

impl Pacer {
    /// A fresh pacer.
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    /// A fresh pacer for an arena that keeps large blocks apart at the top
    /// of the region (`large_apart`) or not: the price rule 1 buys at.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn for_placement(large_apart: bool) -> Self {
        Self {
            buy_divisor: if large_apart { 1 } else { 2 },
            ..Self::default()
        }
    }

    /// Full compactions chosen for time so far.
    pub fn escalations(&self) -> u64 {
        self.escalations
    }

    /// Block visits of planning so far: live blocks per planner pass, over
    /// every plan the pacer made or was told of, charged or not.
    pub fn visits(&self) -> u64 {
        self.visits
    }

    /// Counts a pass of a planner over `n` live blocks; returns what it
    /// charges to the budget.
    fn pass(&mut self, n: u64) -> u64 {
        self.visits = self.visits.saturating_add(n);
        if n > self.small_plan {
            self.work = self.work.saturating_add(n);
            n
        } else {
            0
        }
    }

    /// Tells the pacer a full compaction of `moves` moves ran (the
    /// caller's own, not one [`Pacer::plan`] returned), whose planning
    /// visited `visits` blocks (not charged: the caller's full compactions
    /// are the fallback and explicit ones, which a budget must not refuse).
    pub fn full_ran(&mut self, moves: usize, visits: u64) {
        self.moved = self.moved.saturating_add(moves as u64);
        self.visits = self.visits.saturating_add(visits);
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
        let budget = WORK_PER_OP.saturating_mul(ops.saturating_add(self.moved));
        // Rule 2's cap: credit past `BURST_PLANS` plans over these blocks
        // lapses.
        let cap = BURST_PLANS.saturating_mul(2 * n);
        self.work = self.work.max(budget.saturating_sub(cap));
        let full_bytes = full_bytes_moved(blocks, capacity);
        let charge = self.pass(n);
        // A full plan is only a candidate if it moves something and leaves
        // a hole for the request (with pins it may not, where a targeted
        // evacuation across gaps would).
        let full_serves = |scratch: &mut Scratch| {
            full_bytes > 0
                && largest_hole_after_full_in(blocks, capacity, req.align, scratch) >= req.size
        };
        // The targeted pass would charge as much as the one above.
        if charge > 0 && self.work.saturating_add(charge) > budget && full_serves(&mut self.scratch)
        {
            self.escalations += 1;
            let full = plan_full(blocks, capacity);
            self.moved = self.moved.saturating_add(full.move_count() as u64);
            // Its pass and the one of `full_serves`.
            self.visits = self.visits.saturating_add(2 * n);
            return Some((full, Reason::Budget));
        }
        self.pass(n);
        let targeted = plan_targeted_in(blocks, capacity, req, &mut self.scratch)?;
        let t = targeted.bytes_moved();
        if t.saturating_mul(self.buy_divisor) >= full_bytes && full_serves(&mut self.scratch) {
            let full = plan_full(blocks, capacity);
            self.moved = self.moved.saturating_add(full.move_count() as u64);
            self.visits = self.visits.saturating_add(2 * n);
            return Some((full, Reason::Buy));
        }
        self.moved = self.moved.saturating_add(targeted.move_count() as u64);
        Some((targeted, Reason::Targeted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlanKind;

    fn blk(key: u64, offset: u64, len: u64) -> LiveBlock {
        LiveBlock::at(key, offset, len, 1)
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
    fn a_targeted_plan_as_dear_as_the_full_one_buys_it() {
        let plan_for = |blocks: &[LiveBlock], cap, size| {
            let req = Request { size, align: 1 };
            let (plan, why) = Pacer::new().plan(blocks, cap, req, 10).expect("plan");
            assert!(largest_after(blocks, &plan, cap) >= size);
            (why, plan.kind)
        };
        // Two blocks with three 1 KiB holes: making 2 KiB slides one block
        // of 1 KiB, and the full compaction moves 2 KiB: targeted.
        let two = [blk(0, 1024, 1024), blk(1, 3072, 1024)];
        assert_eq!(
            plan_for(&two, 5120, 2048),
            (Reason::Targeted, PlanKind::Targeted)
        );
        // One block between two holes, all free space asked for: the
        // targeted plan moves the block, as the full one does: full.
        let one = [blk(0, 1024, 1024)];
        assert_eq!(plan_for(&one, 4096, 3072), (Reason::Buy, PlanKind::Full));
    }

    #[test]
    fn without_large_blocks_apart_half_the_full_price_buys_it() {
        // The two blocks of the test above: making 2 KiB moves 1 KiB, half
        // of the full compaction's 2 KiB.
        let blocks = [blk(0, 1024, 1024), blk(1, 3072, 1024)];
        let req = Request {
            size: 2048,
            align: 1,
        };
        for (apart, want) in [(true, Reason::Targeted), (false, Reason::Buy)] {
            let (plan, why) = Pacer::for_placement(apart)
                .plan(&blocks, 5120, req, 10)
                .expect("plan");
            assert_eq!(why, want, "large blocks apart: {apart}");
            assert!(largest_after(&blocks, &plan, 5120) >= 2048);
        }
    }

    #[test]
    fn an_exhausted_budget_escalates_to_a_full_compaction() {
        let (blocks, cap) = checkerboard(10_000);
        let mut p = Pacer::new();
        let mut reasons = Vec::new();
        // Requests arriving one op apart after 15k ops: the budget saved up
        // pays a few targeted compactions, then runs out.
        for ops in 15_000..15_020 {
            let (plan, why) = p.plan(&blocks, cap, REQ, ops).expect("plan");
            assert!(largest_after(&blocks, &plan, cap) >= 512);
            reasons.push(why);
        }
        assert_eq!(reasons[0], Reason::Targeted);
        assert!(reasons.contains(&Reason::Budget), "{reasons:?}");
        let budget = reasons.iter().filter(|r| **r == Reason::Budget).count();
        assert_eq!(p.escalations(), budget as u64);
    }

    /// The budget is per op with no floor, a plan is charged by its blocks,
    /// and saved credit is capped per block: a burst of requests gets
    /// `BURST_PLANS` targeted compactions before the full one at every size
    /// and after any history that saved that much (a few ops either side
    /// of 3 per block, where the uncapped budget flipped between two and
    /// three plans, or a long one), so planning work per op does not
    /// depend on size (what makes replay time linear).
    #[test]
    fn targeted_compactions_before_escalating_depend_on_neither_size_nor_history() {
        for n in [5_000, 10_000, 20_000, 40_000, 80_000] {
            let (blocks, cap) = checkerboard(n);
            for start in [3 * n - 8, 3 * n, 3 * n + 8, 100 * n] {
                let mut p = Pacer::new();
                let mut ops = start;
                let mut targeted = 0;
                while let Some((_, Reason::Targeted)) = p.plan(&blocks, cap, REQ, ops) {
                    targeted += 1;
                    ops += 1;
                    assert!(targeted < 100, "n {n}: never escalates");
                }
                assert_eq!(p.escalations(), 1);
                assert_eq!(targeted, BURST_PLANS, "n {n}, {start} ops before");
                // The burst's visits: its plans and the escalation's 3 passes.
                assert_eq!(p.visits(), (2 * BURST_PLANS + 3) * n);
            }
        }
    }

    /// After a burst the credit refills with the ops that follow, up to the
    /// cap: a later burst gets `BURST_PLANS` targeted plans again.
    #[test]
    fn credit_refills_after_a_burst() {
        let n = 10_000;
        let (blocks, cap) = checkerboard(n);
        let mut p = Pacer::new();
        let mut ops = 3 * n;
        for burst in 0..3 {
            let mut targeted = 0;
            while let Some((_, Reason::Targeted)) = p.plan(&blocks, cap, REQ, ops) {
                targeted += 1;
                ops += 1;
            }
            assert_eq!(targeted, BURST_PLANS, "burst {burst}");
            ops += 50 * n;
        }
        assert_eq!(p.escalations(), 3);
    }

    /// Plans over few blocks are not charged: a workload of few large
    /// blocks keeps its cheap targeted compactions however many it needs.
    #[test]
    fn small_plans_never_escalate() {
        let (blocks, cap) = checkerboard(SMALL_PLAN);
        let mut p = Pacer::new();
        for _ in 0..1_000 {
            let (_, why) = p.plan(&blocks, cap, REQ, 0).expect("plan");
            assert_eq!(why, Reason::Targeted);
        }
        assert_eq!(p.escalations(), 0);
        assert_eq!(p.visits(), 2 * 1_000 * SMALL_PLAN);
        // One block more and the same requests with no ops to pay for
        // them escalate at once.
        let (blocks, cap) = checkerboard(SMALL_PLAN + 1);
        let (_, why) = Pacer::new().plan(&blocks, cap, REQ, 0).expect("plan");
        assert_eq!(why, Reason::Budget);
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
            small_plan: 0,
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
                small_plan: if case % 2 == 0 { SMALL_PLAN } else { 0 },
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
