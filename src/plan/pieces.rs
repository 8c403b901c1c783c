//! Relayouts that always stage: blocks moved in pieces through whatever
//! space is free.
//!
//! [`super::relayout`] moves whole blocks and routes a move it cannot
//! order (a cycle, or a block sliding up over its own bytes) through a
//! free spot as large as the block; at a full arena there may be none.
//! This planner needs only one free byte range of any size (the arena's
//! alignment, at the least), and copies every byte at most twice. It works
//! on *pieces*: byte ranges of blocks, each at its current place, split as
//! needed. It runs in rounds, one wave each:
//!
//! 1. **Direct moves.** Every piece whose final range (its block's target
//!    plus its offset in the block) has free bytes now moves the part that
//!    lands on them there, split off the rest. All such parts of one round
//!    form one wave: their destinations are free now (so they cover no
//!    source) and disjoint (final ranges are). A piece whose whole final
//!    range is free but for its own bytes, below them, slides down in one
//!    move, which the wave rule allows.
//! 2. **Evictions**, when no piece has a free byte in its final range (a
//!    deadlock): into each free range, part of a piece not yet in place
//!    (as much as the range holds).
//!
//! Why evictions never copy a byte a third time, and why it ends: in a
//! deadlock the final ranges of the pieces not in place are covered by the
//! current places of those pieces (nothing else is there: pieces in place
//! and unmoved blocks sit on their own final ranges, which are disjoint
//! from the others'). Both sets hold the same bytes, so they are equal:
//! every free byte now is free in the target layout too, and no evicted
//! piece exists (it would lie in free target space, outside that set). So
//! an evicted piece is never in anybody's way and is never evicted again;
//! it next moves to its final place. And every eviction frees a byte of
//! some final range, so the next round moves at least one piece home.
//!
//! Pieces carry only a block's data (`copy_len`): the padding up to its
//! reservation is placed with it but never copied. Pure data, no unsafe.
#![deny(unsafe_code)]

use std::collections::BTreeMap;

use super::live::LiveBlock;
use super::{Move, Plan, PlanKind, Wave};

/// Bytes `[boff, boff + len)` of block `block`'s reservation, now at `pos`.
#[derive(Debug, Clone, Copy)]
struct Piece {
    block: usize,
    boff: u64,
    len: u64,
    pos: u64,
    /// In its final place (it stays, as an obstacle for the others).
    done: bool,
    /// Copied once already, out of the way (parked or evicted): its next
    /// copy must be to its final place.
    parked: bool,
}

/// What occupies a range of the region while planning.
#[derive(Debug, Clone, Copy)]
enum Occ {
    /// A block that does not move (pinned, or already at its target).
    Fixed { end: u64 },
    /// A piece (index into the pieces).
    Piece(usize),
}

struct State<'a> {
    blocks: &'a [LiveBlock],
    target: &'a [u64],
    capacity: u64,
    pieces: Vec<Piece>,
    /// Occupied ranges by start.
    occ: BTreeMap<u64, Occ>,
    /// Pieces moved so far (progress).
    steps: u64,
    /// The ranges free in the target layout, ascending.
    target_free: Vec<(u64, u64)>,
    /// The pieces not in place, by the start of their final range (final
    /// ranges are disjoint).
    pending: BTreeMap<u64, usize>,
    /// Pieces to look at next round: those whose final range had bytes
    /// vacated (only they can have gained a free byte there).
    woken: Vec<usize>,
}

impl State<'_> {
    fn end_of(&self, start: u64, o: Occ) -> u64 {
        match o {
            Occ::Fixed { end } => end,
            Occ::Piece(p) => start + self.pieces[p].len,
        }
    }

    /// The free sub-ranges of `[lo, hi)`, treating piece `own` as absent.
    fn free_parts(&self, lo: u64, hi: u64, own: Option<usize>) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut cursor = lo;
        // The last range starting below `lo` may reach into it.
        let below = self.occ.range(..lo).next_back().map(|(&s, &o)| (s, o));
        for (s, o) in below
            .into_iter()
            .chain(self.occ.range(lo..hi).map(|(&s, &o)| (s, o)))
        {
            if matches!(o, Occ::Piece(p) if Some(p) == own) {
                continue;
            }
            let e = self.end_of(s, o);
            if e <= cursor {
                continue;
            }
            if s > cursor {
                out.push((cursor, s.min(hi)));
            }
            cursor = cursor.max(e);
            if cursor >= hi {
                break;
            }
        }
        if cursor < hi {
            out.push((cursor, hi));
        }
        out
    }

    /// Final offset of piece `p`.
    fn final_pos(&self, p: usize) -> u64 {
        let pc = &self.pieces[p];
        self.target[pc.block] + pc.boff
    }

    /// Moves bytes `[from, from + len)` of piece `p` (offsets in the
    /// piece) to `dst`, splitting the piece; records the copy in `moves`
    /// (its data part only). The moved part keeps index `p`; returns the
    /// index of the part below it, if any.
    fn move_part(
        &mut self,
        p: usize,
        from: u64,
        len: u64,
        dst: u64,
        moves: &mut Vec<Move>,
    ) -> Option<usize> {
        self.steps += 1;
        let pc = self.pieces[p];
        self.occ.remove(&pc.pos);
        self.pending.remove(&(self.target[pc.block] + pc.boff));
        let b = &self.blocks[pc.block];
        // Data bytes of the moved part (padding is not copied).
        let data_lo = pc.boff + from;
        let data_hi = (pc.boff + from + len).min(b.copy_len);
        if data_hi > data_lo {
            moves.push(Move {
                key: b.key,
                src: pc.pos + from,
                dst,
                len: data_hi - data_lo,
            });
        }
        let mut below = None;
        if from > 0 {
            self.pieces.push(Piece {
                block: pc.block,
                boff: pc.boff,
                len: from,
                pos: pc.pos,
                done: false,
                parked: pc.parked,
            });
            below = Some(self.pieces.len() - 1);
            self.occ.insert(pc.pos, Occ::Piece(self.pieces.len() - 1));
            self.pending
                .insert(self.target[pc.block] + pc.boff, self.pieces.len() - 1);
            // A wake for the whole piece may have been meant for this part.
            self.woken.push(self.pieces.len() - 1);
        }
        if from + len < pc.len {
            self.pieces.push(Piece {
                block: pc.block,
                boff: pc.boff + from + len,
                len: pc.len - from - len,
                pos: pc.pos + from + len,
                done: false,
                parked: pc.parked,
            });
            self.occ
                .insert(pc.pos + from + len, Occ::Piece(self.pieces.len() - 1));
            self.pending.insert(
                self.target[pc.block] + pc.boff + from + len,
                self.pieces.len() - 1,
            );
            self.woken.push(self.pieces.len() - 1);
        }
        self.pieces[p] = Piece {
            block: pc.block,
            boff: pc.boff + from,
            len,
            pos: dst,
            done: false,
            // Moved anywhere but home, it has been copied out of the way.
            parked: true,
        };
        self.occ.insert(dst, Occ::Piece(p));
        let home = self.target[pc.block] + pc.boff + from;
        if dst != home {
            self.pending.insert(home, p);
            self.woken.push(p);
        }
        // Whoever's final range held the vacated bytes may move now.
        self.wake(pc.pos + from, pc.pos + from + len);
        below
    }

    /// Queues the pieces whose final ranges overlap `[lo, hi)`.
    fn wake(&mut self, lo: u64, hi: u64) {
        for (&f, &q) in self.pending.range(..hi).rev() {
            if f + self.pieces[q].len <= lo {
                break;
            }
            self.woken.push(q);
        }
    }

    /// Round 1: every direct move possible now. Returns the moves.
    /// All are planned against the occupancy at the round's start, so
    /// every destination is free before the wave (it covers no source of
    /// the wave), but for a piece sliding down over its own bytes.
    fn direct(&mut self) -> Vec<Move> {
        // (piece, final ranges free now, descending; or one slide)
        let mut planned: Vec<(usize, Vec<(u64, u64)>)> = Vec::new();
        let mut woken = std::mem::take(&mut self.woken);
        woken.sort_unstable();
        woken.dedup();
        for p in woken {
            let pc = self.pieces[p];
            if pc.done || pc.pos == self.final_pos(p) {
                continue;
            }
            let f = self.final_pos(p);
            let (lo, hi) = (f, f + pc.len);
            // Sliding down over its own bytes with the rest of the final
            // range free: one move.
            if lo < pc.pos && pc.pos < hi {
                let parts = self.free_parts(lo, hi, Some(p));
                if parts.len() == 1 && parts[0] == (lo, hi) {
                    planned.push((p, parts));
                    continue;
                }
            }
            let mut parts = self.free_parts(lo, hi, None);
            if !parts.is_empty() {
                parts.reverse();
                planned.push((p, parts));
            }
        }
        // Where parts may wait without ever being in the way: free now and
        // free in the target layout (see `park`).
        // Only where a piece climbs (a scan of the region), and before any
        // move of the round: a span is safe if free at the round's start.
        let climbs = planned.iter().any(|&(p, _)| {
            let pc = self.pieces[p];
            let lo = self.final_pos(p);
            lo > pc.pos && lo < pc.pos + pc.len && !pc.parked
        });
        let mut safe = climbs.then(|| self.safe_spans());
        let mut moves = Vec::new();
        for (p, parts) in planned {
            let (base, lo) = (self.pieces[p].boff, self.final_pos(p));
            let pc = self.pieces[p];
            // Sliding up over its own bytes.
            let climbing = lo > pc.pos && lo < pc.pos + pc.len && !pc.parked;
            let step = parts.iter().map(|&(a, b)| b - a).sum::<u64>();
            // From the highest part down, so that the rest stays in the
            // part below (`move_part` returns it).
            let mut at = Some(p);
            for (a, b) in parts {
                let Some(cur) = at else { break };
                let from = a - lo - (self.pieces[cur].boff - base);
                at = self.move_part(cur, from, b - a, a, &mut moves);
                self.pieces[cur].done = true;
            }
            // A piece sliding up over its own bytes moves `step` bytes a
            // round; park the next part of what is left in a safe span
            // instead of waiting for many rounds.
            if let Some(rest) = at {
                if climbing && self.pieces[rest].len > 2 * step {
                    if let Some(safe) = safe.as_mut() {
                        self.park(rest, safe, &mut moves);
                    }
                }
            }
        }
        moves
    }

    /// Ranges free now and free in the target layout, largest first: a
    /// part parked there is in nobody's way, now or later, so it moves
    /// once more, to its final place (two copies in all).
    fn safe_spans(&self) -> Vec<(u64, u64)> {
        let now = self.free_parts(0, self.capacity, None);
        let mut out = Vec::new();
        let (mut i, mut j) = (0, 0);
        while i < now.len() && j < self.target_free.len() {
            let (a, b) = (now[i], self.target_free[j]);
            let (lo, hi) = (a.0.max(b.0), a.1.min(b.1));
            if hi > lo {
                out.push((lo, hi));
            }
            if a.1 < b.1 {
                i += 1;
            } else {
                j += 1;
            }
        }
        out.sort_unstable_by_key(|&(a, b)| std::cmp::Reverse(b - a));
        out
    }

    /// Moves the top of piece `p` (as much as the largest safe span
    /// holds) into that span.
    fn park(&mut self, p: usize, safe: &mut Vec<(u64, u64)>, moves: &mut Vec<Move>) {
        let Some(&(s, e)) = safe.first() else { return };
        let pc = self.pieces[p];
        let len = pc.len.min(e - s);
        if len == 0 {
            return;
        }
        self.move_part(p, pc.len - len, len, s, moves);
        safe[0].0 += len;
        safe.retain(|&(a, b)| b > a);
        safe.sort_unstable_by_key(|&(a, b)| std::cmp::Reverse(b - a));
    }

    /// Round 2: evictions into free ranges (a deadlock). Returns the moves.
    fn evict(&mut self) -> Vec<Move> {
        let free = self.free_parts(0, self.capacity, None);
        // In a deadlock no piece is parked (module docs); the filter only
        // keeps a bug from copying a byte a third time.
        let mut pending: Vec<usize> = self
            .pending
            .values()
            .copied()
            .filter(|&p| !self.pieces[p].parked)
            .collect();
        // Largest pieces first: fewest evictions.
        pending.sort_unstable_by_key(|&p| std::cmp::Reverse(self.pieces[p].len));
        let mut moves = Vec::new();
        for ((s, e), p) in free.into_iter().zip(pending) {
            let len = self.pieces[p].len.min(e - s);
            self.move_part(p, 0, len, s, &mut moves);
        }
        moves
    }
}

/// The complement of the target layout (reserved lengths) in the region,
/// ascending; `None` if it overlaps itself, leaves the region or does not
/// give one offset per block.
fn target_free(blocks: &[LiveBlock], target: &[u64], capacity: u64) -> Option<Vec<(u64, u64)>> {
    if target.len() != blocks.len() {
        return None;
    }
    let mut used: Vec<(u64, u64)> = blocks
        .iter()
        .zip(target)
        .map(|(b, &t)| (t, b.len))
        .collect();
    used.sort_unstable();
    let mut free = Vec::new();
    let mut cursor = 0u64;
    for (t, len) in used {
        if t < cursor {
            return None;
        }
        if t > cursor {
            free.push((cursor, t));
        }
        cursor = t.checked_add(len).filter(|&e| e <= capacity)?;
    }
    if capacity > cursor {
        free.push((cursor, capacity));
    }
    Some(free)
}

/// Rounds (waves) a plan in pieces may take beyond `16 (n + 1)` for `n`
/// blocks: see [`plan_in_pieces`].
pub const MAX_ROUNDS: u64 = 1 << 10;

/// Plans moving `blocks` (ascending, valid) to `target[i]` each (pinned
/// blocks must keep their offset), a valid layout inside `capacity`, in
/// pieces (see the module docs). `None` if the input is not such a pair of
/// layouts, if no byte is free, or past `MAX_ROUNDS + 16 (n + 1)`
/// rounds: the rounds are at most twice the granules that move, so that
/// happens only where little space is free for many bytes.
pub fn plan_in_pieces(
    blocks: &[LiveBlock],
    target: &[u64],
    capacity: u64,
    kind: PlanKind,
) -> Option<Plan> {
    // `target_free` also refuses a target of another length.
    let mut st = State {
        blocks,
        target,
        capacity,
        pieces: Vec::new(),
        occ: BTreeMap::new(),
        steps: 0,
        target_free: target_free(blocks, target, capacity)?,
        pending: BTreeMap::new(),
        woken: Vec::new(),
    };
    for (i, b) in blocks.iter().enumerate() {
        if b.pinned && target[i] != b.offset {
            return None;
        }
        if target[i] == b.offset {
            st.occ.insert(
                b.offset,
                Occ::Fixed {
                    end: b.offset.checked_add(b.len)?,
                },
            );
        } else {
            st.pieces.push(Piece {
                block: i,
                boff: 0,
                len: b.len,
                pos: b.offset,
                done: false,
                parked: false,
            });
            st.occ.insert(b.offset, Occ::Piece(st.pieces.len() - 1));
            st.pending.insert(target[i], st.pieces.len() - 1);
            st.woken.push(st.pieces.len() - 1);
        }
    }
    let mut plan = Plan::empty(kind);
    // Each round copies at least one granule and no byte is copied more
    // than twice (the module docs), so the rounds are at most twice the
    // granules that move: few where free space is ample, but a huge block
    // sliding through a few free bytes needs a wave per few bytes. Past
    // this cap the planner gives up (bounded work: a plan is a wave per
    // GPU launch), and the caller keeps a layout it can reach without
    // staging (address order).
    let cap_rounds = MAX_ROUNDS.saturating_add(16 * (blocks.len() as u64 + 1));
    let mut rounds = 0u64;
    while !st.pending.is_empty() {
        rounds += 1;
        if rounds > cap_rounds {
            return None;
        }
        let before = st.steps;
        let mut moves = if st.woken.is_empty() {
            Vec::new()
        } else {
            st.direct()
        };
        if st.steps == before {
            moves = st.evict();
            if st.steps == before {
                return None; // no byte free: nothing can move
            }
        }
        if !moves.is_empty() {
            moves.sort_unstable_by_key(|m| m.src);
            plan.waves.push(Wave { moves });
        }
    }
    plan.validate_against(blocks, capacity).ok()?;
    Some(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, HostBackend};

    fn rnd(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// Random layouts, random targets (the blocks shuffled and packed
    /// anywhere, pinned ones kept) with as little as one free granule:
    /// the plan, run on the strict host backend (random interleavings of
    /// chunk copies), leaves every block's data whole at its target, and
    /// copies at most twice the data of the blocks that move.
    #[test]
    fn pieces_relayout_anything_with_one_free_granule() {
        let mut x = 0x51_7cc1_b727_220au64;
        let mut waves_max = 0;
        for case in 0..1_500 {
            let g = 16u64; // granule
            let n = 1 + rnd(&mut x) % 16;
            let mut blocks: Vec<LiveBlock> = Vec::new();
            let mut cursor = 0u64;
            for k in 0..n {
                let align = g << (rnd(&mut x) % 3 * (rnd(&mut x) % 2));
                cursor = (cursor + rnd(&mut x) % 2 * g).div_ceil(align) * align;
                let len = g * (1 + rnd(&mut x) % 8);
                let copy_len = len - rnd(&mut x) % g;
                let pinned = rnd(&mut x) % 9 == 0;
                blocks.push(LiveBlock {
                    key: k,
                    offset: cursor,
                    len,
                    copy_len,
                    align,
                    pinned,
                });
                cursor += len;
            }
            let total: u64 = blocks.iter().map(|b| b.len).sum();
            let cap = cursor.max(total + g) + rnd(&mut x) % 3 * g;
            // Targets: unpinned blocks in a random order, first fit around
            // the pinned ones (at their alignment), from a random start.
            let mut order: Vec<usize> = (0..blocks.len()).filter(|&i| !blocks[i].pinned).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, (rnd(&mut x) % (i as u64 + 1)) as usize);
            }
            let mut taken: Vec<(u64, u64)> = blocks
                .iter()
                .filter(|b| b.pinned)
                .map(|b| (b.offset, b.offset + b.len))
                .collect();
            let mut target: Vec<u64> = blocks.iter().map(|b| b.offset).collect();
            let mut ok = true;
            let mut at = rnd(&mut x) % (cap - total + 1) / g * g;
            for &i in &order {
                let b = &blocks[i];
                let mut pos = at.div_ceil(b.align) * b.align;
                while let Some(&(_, e)) = taken.iter().find(|&&(s, e)| s < pos + b.len && pos < e) {
                    pos = e.div_ceil(b.align) * b.align;
                }
                if pos + b.len > cap {
                    ok = false;
                    break;
                }
                target[i] = pos;
                taken.push((pos, pos + b.len));
                at = pos + b.len;
            }
            if !ok {
                continue;
            }
            let moving: u64 = blocks
                .iter()
                .zip(&target)
                .filter(|(b, &t)| b.offset != t)
                .map(|(b, _)| b.copy_len)
                .sum();
            let plan = plan_in_pieces(&blocks, &target, cap, PlanKind::Full).unwrap_or_else(|| {
                panic!("case {case}: no plan for {blocks:?} -> {target:?} in {cap}")
            });
            assert!(plan.bytes_moved() <= 2 * moving, "case {case}");
            waves_max = waves_max.max(plan.waves().len());
            // Run it for real on the strict backend, without its up-front
            // validation: the bytes must end where the targets say.
            let mut host = HostBackend::new(cap)
                .expect("host")
                .with_seed(case)
                .with_validation(false);
            for b in &blocks {
                let data: Vec<u8> = (0..b.copy_len)
                    .map(|j| (b.key as u8) ^ (j as u8).wrapping_mul(7))
                    .collect();
                host.write(b.offset, &data).expect("write");
            }
            host.execute(&plan).expect("execute");
            for (b, &t) in blocks.iter().zip(&target) {
                let mut got = vec![0u8; b.copy_len as usize];
                host.read(t, &mut got).expect("read");
                let want: Vec<u8> = (0..b.copy_len)
                    .map(|j| (b.key as u8) ^ (j as u8).wrapping_mul(7))
                    .collect();
                assert_eq!(got, want, "case {case}: block {b:?} at {t}");
            }
        }
        println!("most waves in one plan: {waves_max}");
    }

    /// A large block sliding up by one granule, with room elsewhere: its
    /// parts are parked, so the waves stay few (one granule a wave would
    /// take 4096).
    #[test]
    fn a_long_slide_up_parks_its_parts() {
        let b = LiveBlock {
            key: 0,
            offset: 64 << 10,
            len: 1 << 20,
            copy_len: 1 << 20,
            align: 256,
            pinned: false,
        };
        let cap = (64 << 10) + (1 << 20) + 256;
        let plan = plan_in_pieces(&[b], &[(64 << 10) + 256], cap, PlanKind::Full).expect("plan");
        assert!(plan.waves().len() <= 40, "{} waves", plan.waves().len());
        assert!(plan.bytes_moved() <= 2 << 20);
    }

    /// A swap of two blocks with one granule free: only pieces can do it.
    #[test]
    fn a_full_swap_goes_through_one_granule() {
        let blk = |key, offset, len| LiveBlock::at(key, offset, len, 16);
        let blocks = [blk(0, 0, 64), blk(1, 64, 96)];
        assert!(
            crate::plan::relayout::plan_whole(&blocks, &[96, 0], 176, PlanKind::Full).is_none()
        );
        let plan = plan_in_pieces(&blocks, &[96, 0], 176, PlanKind::Full).expect("plan");
        assert!(plan.bytes_moved() <= 2 * 160);
        assert!(plan.moves().all(|m| m.len <= 96));
        // No byte free: no plan.
        assert!(plan_in_pieces(&blocks, &[96, 0], 160, PlanKind::Full).is_none());
    }
}
