//! Deferred moves: how [`CompactionPolicy::Auto`] (and the default's
//! mirror mode) never moves more bytes than naive compact-on-failure.
//!
//! # The baseline
//!
//! *Naive* places every block by the arena's segregated fit ([`crate::placement::FreeIndex::alloc`],
//! carved from the bottom of its region) and, when a request fits in no
//! hole, runs one full compaction ([`super::planner::plan_full`]) and
//! places the request again. The replays call it
//! `Allocator::NaiveCompacting`: a [`CompactionPolicy::Manual`] arena whose
//! caller runs [`crate::Arena::compact`] on out-of-memory.
//!
//! # The design
//!
//! Under `Auto` the arena's placement index holds *naive's* layout: blocks
//! are placed by the same calls in the same order, and when a request fits
//! in no hole the arena plans naive's full compaction and applies it to the
//! index, so the index evolves exactly as naive's would (the same rebuilds,
//! the same free lists, the same later choices). What it does not do is
//! copy every byte that plan moves. A block whose bytes have not followed
//! its index entry yet is *lagging*: its bytes lie at `at`, its index entry
//! (its *home*) at `home < at`. The lagging blocks are kept here, by `at`.
//!
//! A block goes home (its bytes are copied to its index offset) only when
//! something needs the bytes at `at` out of the way:
//!
//! - the request naive compacted for is placed (at naive's offset) where
//!   lagging bytes lie: those blocks go home, and the lagging blocks in the
//!   way of *their* homes, and so on ([`Lag::closure`]); the rest keep
//!   lagging;
//! - the first time after that anything needs lagging bytes moved (a later
//!   request placed over them, a pin: a pinned block must not lag while it
//!   cannot move) or plans on the real layout (an explicit full
//!   compaction, spilling, a request naive cannot serve), every lagging
//!   block goes home, in one plan: the rest of naive's compaction. Going
//!   home piece by piece would move the same bytes, in one plan per
//!   allocation.
//!
//! A lagging block that is freed before then never moves at all: its move
//! is saved. A block that naive moves twice before it goes home moves
//! once.
//!
//! # Why it holds
//!
//! Let `N` be the bytes naive has moved (every plan applied to the index,
//! counted as [`Plan::bytes_moved`]), `A` the bytes the arena has moved,
//! and `D` the bytes of the lagging blocks (their `copy_len`, the unit
//! `bytes_moved` counts). Three invariants hold after every operation:
//!
//! 1. **Dominance**: every lagging block lies above its home (`at > home`).
//! 2. **A valid layout**: the blocks' real intervals (lagging ones at `at`,
//!    the rest at home) are disjoint and inside the region.
//! 3. **Credit**: `A + D <= N`.
//!
//! Invariant 3 is the bound: `A <= N - D <= N`, with no additive constant.
//! Each operation keeps all three:
//!
//! - *Placing a block* at its index offset `[lo, hi)`: that range is free
//!   in the index, so no block that is home overlaps it (homes are index
//!   entries); only lagging blocks can. [`Lag::closure`] collects those
//!   and, for each, the lagging blocks over its home (again no block at
//!   home can be there), until nothing new is found. Moving exactly that
//!   set home is one wave under the wave rule of [`crate::plan`]: every
//!   move goes down (1), and a destination `[home, home + len)` can only
//!   overlap the source of a block lying *below* this one's source
//!   (if it overlapped the source of a block above, at `y` with
//!   `home <= at < y < home + len`, the two real intervals would overlap,
//!   against 2), so it only ever covers sources listed before it. The
//!   final layout is valid: the moved blocks are at home, disjoint from
//!   every other home, and the closure left no lagging block over them.
//!   Each moved block costs its `copy_len` in `A` and removes as much from
//!   `D`: `A + D` is unchanged.
//! - *Freeing a block* removes it; if it lagged, `D` drops.
//! - *Naive's compaction*: [`super::planner::plan_full`] moves every block
//!   down or leaves it (without reordering), so every home goes down and
//!   dominance holds. A block the plan moves costs naive its `copy_len`
//!   (`N` grows by it) and adds at most as much to `D` (less if it already
//!   lagged, or if its new home is where its bytes are). A plan that is
//!   not one downward wave (a reordering one, for blocks aligned above the
//!   arena's alignment) is executed at once instead, after sending every
//!   block home: `A` grows by `D + X`, `N` by `X`, and `D` becomes 0.
//! - *Pinning, and planning on the real layout*: blocks go home as above.
//!
//! Invariant 2 is also what makes every block's real offset well defined:
//! the handle table and every resolution (views, kernel arguments, reads)
//! use `at` for a lagging block.
//!
//! Consequences. While naive never compacts nothing lags, the arena is
//! naive, and it never moves a byte: where a non-moving segregated fit serves
//! every request, so does naive, and the arena moves nothing. The bound
//! covers every prefix of every program that naive serves; a request naive
//! would fail (pins or alignment padding leave no hole after its full
//! compaction, or the request exceeds the free bytes) ends the comparison
//! (the arena may still serve it, by a targeted compaction across pins or
//! by spilling; `Stats::naive_failures` counts them).
//!
//! What it cannot do is move *fewer* bytes at a compaction than naive
//! would eventually move anyway: a request placed at naive's offset needs
//! every lagging block in the way of it, and the blocks in the way of
//! those, to go home, which on a fragmented layout is most of what naive
//! moved. Saving more needs the arena's layout to depart from naive's, and
//! any departure can be punished: a program that from then on sends only
//! requests naive serves without moving (naive's layout is packed after
//! its compaction) can force the arena to move bytes naive never does.
//! The default, [`CompactionPolicy::Bounded`], makes that bet within a
//! budget of twice the peak live bytes (`crate::policies` has its proof);
//! `Auto` does not bet.
//!
//! [`CompactionPolicy::Bounded`]: crate::CompactionPolicy::Bounded
//! [`CompactionPolicy::Auto`]: crate::CompactionPolicy::Auto
//! [`CompactionPolicy::Manual`]: crate::CompactionPolicy::Manual
#![deny(unsafe_code)]

use std::collections::BTreeMap;

use super::{Move, Plan, PlanKind, Wave};

/// A block whose bytes lie above its place in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lagging {
    /// Opaque block identifier (the arena's block key), carried into moves.
    pub key: u64,
    /// Where its bytes are.
    pub at: u64,
    /// Where the index has it (`home < at`).
    pub home: u64,
    /// Bytes it occupies (its reservation).
    pub len: u64,
    /// Bytes to copy when it goes home.
    pub copy_len: u64,
}

/// The lagging blocks of a layout, by real offset. See the module docs.
///
/// Invariant: entries are disjoint intervals `[at, at + len)`, each with
/// `home < at`; `deferred_bytes` is the sum of their `copy_len`.
#[derive(Debug, Clone, Default)]
pub struct Lag {
    by_at: BTreeMap<u64, Lagging>,
    deferred_bytes: u64,
}

impl Lag {
    /// No lagging blocks.
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    /// True when every block is home.
    pub fn is_empty(&self) -> bool {
        self.by_at.is_empty()
    }

    /// Number of lagging blocks.
    pub fn len(&self) -> usize {
        self.by_at.len()
    }

    /// Bytes whose moves are deferred (`D` of the module docs).
    pub fn deferred_bytes(&self) -> u64 {
        self.deferred_bytes
    }

    /// Records a lagging block. `l.home < l.at` and its real interval must
    /// not overlap another lagging block's (debug-asserted).
    pub fn insert(&mut self, l: Lagging) {
        debug_assert!(l.home < l.at, "a lagging block lies above its home: {l:?}");
        debug_assert!(
            self.overlapping(l.at, l.at.saturating_add(l.len))
                .next()
                .is_none(),
            "lagging blocks overlap: {l:?}"
        );
        self.deferred_bytes = self.deferred_bytes.saturating_add(l.copy_len);
        self.by_at.insert(l.at, l);
    }

    /// Forgets the lagging block whose bytes are at `at` (it went home, was
    /// freed, or naive moved it again); returns it.
    pub fn remove(&mut self, at: u64) -> Option<Lagging> {
        let l = self.by_at.remove(&at)?;
        self.deferred_bytes -= l.copy_len;
        Some(l)
    }

    /// Lagging blocks whose bytes overlap `[lo, hi)`, ascending.
    pub fn overlapping(&self, lo: u64, hi: u64) -> impl Iterator<Item = &Lagging> {
        // Entries are disjoint: only the last one starting below `lo` can
        // reach into the range from below.
        let below = self
            .by_at
            .range(..lo)
            .next_back()
            .map(|(_, l)| l)
            .filter(|l| l.at.saturating_add(l.len) > lo);
        below
            .into_iter()
            .chain(self.by_at.range(lo..hi.max(lo)).map(|(_, l)| l))
    }

    /// The lagging blocks that must go home before `[lo, hi)` holds no
    /// lagging bytes, together with the blocks at `seeds` (real offsets of
    /// lagging blocks that must go home anyway): those overlapping the
    /// range or a seed, and, transitively, those overlapping the home of
    /// one already taken. Sorted by real offset: moved home in that order
    /// they form one valid wave (see the module docs). O(k log n) for k
    /// blocks taken.
    pub fn closure(&self, lo: u64, hi: u64, seeds: &[u64]) -> Vec<Lagging> {
        let mut taken: Vec<Lagging> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut todo: Vec<(u64, u64)> = vec![(lo, hi)];
        for &s in seeds {
            if let Some(l) = self.by_at.get(&s) {
                if seen.insert(l.at) {
                    taken.push(*l);
                    todo.push((l.home, l.home.saturating_add(l.len)));
                }
            }
        }
        while let Some((lo, hi)) = todo.pop() {
            for l in self.overlapping(lo, hi) {
                if seen.insert(l.at) {
                    taken.push(*l);
                    todo.push((l.home, l.home.saturating_add(l.len)));
                }
            }
        }
        taken.sort_unstable_by_key(|l| l.at);
        taken
    }

    /// Every lagging block, as [`Lag::closure`] returns them (sorted): what
    /// must go home for the real layout to be the index's.
    pub fn everything(&self) -> Vec<Lagging> {
        self.by_at.values().copied().collect()
    }
}

/// The plan that sends `blocks` (a [`Lag::closure`], sorted by real offset)
/// home: one wave, ascending source, every move down. Empty for no blocks.
pub fn plan_home(blocks: &[Lagging], kind: PlanKind) -> Plan {
    let mut plan = Plan::empty(kind);
    let moves: Vec<Move> = blocks
        .iter()
        .map(|l| Move {
            key: l.key,
            src: l.at,
            dst: l.home,
            len: l.copy_len,
        })
        .collect();
    if !moves.is_empty() {
        plan.waves.push(Wave { moves });
    }
    plan
}

/// True when `plan` is one wave whose every move goes down (or nothing),
/// each block moving once: the shape [`super::planner::plan_full`] has
/// without reordering, which the arena can defer (see the module docs).
/// A plan that moves blocks in pieces (a block named twice) is not.
pub fn is_downward(plan: &Plan) -> bool {
    if plan.waves.len() > 1 || !plan.moves().all(|m| m.dst <= m.src) {
        return false;
    }
    let mut keys: Vec<u64> = plan.moves().map(|m| m.key).collect();
    keys.sort_unstable();
    keys.windows(2).all(|w| w[0] != w[1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::planner::LiveBlock;

    fn lag(key: u64, at: u64, home: u64, len: u64) -> Lagging {
        Lagging {
            key,
            at,
            home,
            len,
            copy_len: len,
        }
    }

    #[test]
    fn overlap_queries_find_the_block_reaching_in_from_below() {
        let mut l = Lag::new();
        l.insert(lag(1, 100, 0, 50));
        l.insert(lag(2, 200, 60, 30));
        let keys = |lo, hi| l.overlapping(lo, hi).map(|x| x.key).collect::<Vec<_>>();
        assert_eq!(keys(120, 130), vec![1]);
        assert_eq!(keys(150, 200), Vec::<u64>::new());
        assert_eq!(keys(149, 201), vec![1, 2]);
        assert_eq!(keys(0, 100), Vec::<u64>::new());
        assert_eq!(l.deferred_bytes(), 80);
        assert_eq!(l.remove(100).map(|x| x.key), Some(1));
        assert_eq!(l.deferred_bytes(), 30);
    }

    /// The layout of a full compaction deferred entirely: blocks of 16 at
    /// every other slot of 16 (`2k + 1`), homes packed (`k`). Clearing the
    /// slots from 16 up takes the blocks there, then those over their
    /// homes, halving each time: not the whole prefix.
    #[test]
    fn the_closure_follows_homes_down_and_stops_at_free_space() {
        let mut l = Lag::new();
        for k in 1..32u64 {
            l.insert(lag(k, 16 * (2 * k + 1), 16 * k, 16));
        }
        let c = l.closure(16 * 32, 16 * 48, &[]);
        let slots: Vec<u64> = c.iter().map(|x| x.at / 16).collect();
        assert_eq!(
            slots,
            vec![5, 9, 11, 17, 19, 21, 23, 33, 35, 37, 39, 41, 43, 45, 47]
        );
    }

    /// Random layouts with deferred moves: whatever range is cleared, the
    /// closure's plan is valid against the real layout (the wave rule and
    /// the final layout, by [`Plan::validate_against`]) and leaves no
    /// lagging bytes in the range.
    #[test]
    fn closures_are_valid_waves_that_clear_the_range() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for case in 0..3_000 {
            // Homes packed with holes; each block lags up by a random
            // amount, placed from the top down so that real intervals stay
            // disjoint and above their homes.
            let n = 1 + rnd() % 24;
            let mut homes = Vec::new();
            let mut cursor = 0;
            for k in 0..n {
                cursor += rnd() % 3 * 8;
                let len = 8 * (1 + rnd() % 6);
                homes.push((k, cursor, len));
                cursor += len;
            }
            let cap = cursor * 2 + 64;
            let mut real: Vec<(u64, u64, u64, u64)> = Vec::new(); // key, at, home, len
            let mut ceiling = cap;
            for &(k, home, len) in homes.iter().rev() {
                let room = ceiling - len - home; // highest start minus home
                let up = if rnd() % 3 == 0 {
                    0
                } else {
                    rnd() % (room + 1) / 8 * 8
                };
                let at = home + up;
                real.push((k, at, home, len));
                ceiling = at;
            }
            let mut l = Lag::new();
            let mut live = Vec::new();
            for &(key, at, home, len) in &real {
                if at > home {
                    l.insert(lag(key, at, home, len));
                }
                live.push(LiveBlock {
                    key,
                    offset: at,
                    len,
                    copy_len: len,
                    align: 8,
                    pinned: false,
                });
            }
            live.sort_unstable_by_key(|b| b.offset);
            let lo = rnd() % cap / 8 * 8;
            let hi = (lo + 8 * (1 + rnd() % 20)).min(cap);
            // The range must be free at home (as a placement is).
            if homes.iter().any(|&(_, h, len)| h < hi && lo < h + len) {
                continue;
            }
            let c = l.closure(lo, hi, &[]);
            let plan = plan_home(&c, PlanKind::Targeted);
            assert!(plan.waves.len() <= 1);
            plan.validate_against(&live, cap)
                .unwrap_or_else(|e| panic!("case {case}: {e} {real:?} [{lo}, {hi})"));
            for m in plan.moves() {
                assert!(l.remove(m.src).is_some());
            }
            assert!(l.overlapping(lo, hi).next().is_none(), "case {case}");
        }
    }
}
