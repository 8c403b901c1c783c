//! Relayout: any target layout of the live blocks as a valid [`Plan`].
//!
//! The full compaction's packings that reorder blocks (by alignment, see
//! [`super::planner::plan_full`]) and the packing that empties one gap
//! between pinned blocks for a request ([`super::planner::plan_gap`]) give
//! each block a target offset; this module orders the moves into waves
//! under the wave rule of [`crate::plan`]:
//!
//! - A move whose destination covers the source of another must run after
//!   that source is read: in a later wave if the other is listed after it
//!   (a higher source), in the same wave or later if listed before.
//! - Waves are the longest paths of those constraints. They hold no
//!   cycle of "same wave or later" alone (those point to strictly lower
//!   sources), so a cycle needs a strictly-later step somewhere.
//! - A move that cannot be ordered (one in a cycle, or one sliding *up*
//!   over its own source, which executors do not do) goes through a free
//!   spot: in the first wave it moves to space free both now and in the
//!   target layout (a temporary), and from there to its target once its
//!   constraints allow. Its bytes are copied twice, and
//!   [`Plan::bytes_moved`] counts both.
//!
//! When there is not enough such free space, the blocks go in pieces
//! instead ([`super::pieces`]), through whatever space is free. Pure data,
//! O(m log m) for m moves plus the constraints, which are few: each
//! destination covers a run of adjacent sources.
#![deny(unsafe_code)]

use super::live::LiveBlock;
use super::{Move, Plan, PlanKind, Wave};

/// Plans moving `blocks` (ascending, as [`super::planner::check_live`]
/// wants them) to `target[i]` each (pinned ones to their own offset), a
/// valid layout inside `capacity` whose offsets keep each block's
/// alignment. Whole blocks where a free spot holds every move that must
/// be routed, else in pieces ([`super::pieces`]): either way every byte
/// is copied at most twice. `None` only when no byte is free and a block
/// must be routed (or the input is not a pair of valid layouts).
pub fn plan_relayout(
    blocks: &[LiveBlock],
    target: &[u64],
    capacity: u64,
    kind: PlanKind,
) -> Option<Plan> {
    let whole = plan_whole(blocks, target, capacity, kind);
    // A planted bug for the tests (`tests/all/bound.rs`): no pieces.
    if cfg!(cuarena_plant = "no-split") {
        return whole;
    }
    whole.or_else(|| super::pieces::plan_in_pieces(blocks, target, capacity, kind))
}

/// [`plan_relayout`] with whole blocks only; `None` where a routed move
/// finds no free spot of its size.
pub(crate) fn plan_whole(
    blocks: &[LiveBlock],
    target: &[u64],
    capacity: u64,
    kind: PlanKind,
) -> Option<Plan> {
    if target.len() != blocks.len() {
        return None;
    }
    let steps: Vec<Step> = blocks
        .iter()
        .zip(target)
        .enumerate()
        .filter(|(_, (b, &t))| t != b.offset && !b.pinned)
        .map(|(i, (b, &t))| Step {
            block: i,
            src: b.offset,
            dst: t,
            len: b.len,
        })
        .collect();
    // Sliding up over itself: through a free spot.
    let mut temp: Vec<Option<u64>> = vec![None; steps.len()];
    let mut routed: Vec<bool> = steps
        .iter()
        .map(|m| m.dst > m.src && m.dst < m.src.saturating_add(m.len))
        .collect();
    let spans = Spans::of(blocks, target, capacity);
    let mut taken: Vec<(u64, u64)> = Vec::new();
    for _ in 0..=steps.len() {
        // Temporaries for the moves routed since the last round, largest
        // first: where nothing is now if possible, else where nothing
        // will be (after what is there now has left).
        let mut new: Vec<usize> = (0..steps.len())
            .filter(|&k| routed[k] && temp[k].is_none())
            .collect();
        new.sort_unstable_by_key(|&k| std::cmp::Reverse(steps[k].len));
        for k in new {
            let m = &steps[k];
            let align = blocks[m.block].align.max(1);
            let at = spans.find(m.len, align, (m.src, m.src.saturating_add(m.len)), &taken)?;
            taken.push((at, at + m.len));
            temp[k] = Some(at);
        }
        let hops = hops(&steps, &temp);
        match levels(&hops) {
            Ok(levels) => return waves(blocks, &hops, &levels, capacity, kind),
            Err(h) => {
                let k = hops[h].step;
                if routed[k] {
                    return None; // a cycle through temporaries: give up
                }
                routed[k] = true;
            }
        }
    }
    None
}

/// One block's move while planning.
#[derive(Debug, Clone, Copy)]
struct Step {
    block: usize,
    src: u64,
    dst: u64,
    len: u64,
}

/// One copy: a whole move, or one half of a routed one.
#[derive(Debug, Clone, Copy)]
struct Hop {
    step: usize,
    block: usize,
    read: u64,
    write: u64,
    len: u64,
    /// The hop that must run in an earlier wave (a routed move's first).
    after: Option<usize>,
    /// Half of a routed move.
    routed: bool,
}

fn hops(steps: &[Step], temp: &[Option<u64>]) -> Vec<Hop> {
    let mut hops = Vec::with_capacity(steps.len());
    for (k, m) in steps.iter().enumerate() {
        match temp[k] {
            Some(t) => {
                hops.push(Hop {
                    step: k,
                    block: m.block,
                    read: m.src,
                    write: t,
                    len: m.len,
                    after: None,
                    routed: true,
                });
                hops.push(Hop {
                    step: k,
                    block: m.block,
                    read: t,
                    write: m.dst,
                    len: m.len,
                    after: Some(hops.len() - 1),
                    routed: true,
                });
            }
            None => hops.push(Hop {
                step: k,
                block: m.block,
                read: m.src,
                write: m.dst,
                len: m.len,
                after: None,
                routed: false,
            }),
        }
    }
    hops
}

/// The wave of every hop, or `Err(h)`: hop `h` lies on a cycle of
/// constraints (route its move). A hop writing over bytes another reads
/// runs after that read: in a later wave if the other is listed after it
/// in a wave (a higher read offset), else in the same wave or later.
fn levels(hops: &[Hop]) -> Result<Vec<usize>, usize> {
    let n = hops.len();
    let mut by_read: Vec<usize> = (0..n).collect();
    by_read.sort_unstable_by_key(|&j| hops[j].read);
    let longest = hops.iter().map(|h| h.len).max().unwrap_or(0);
    // prereq[h]: (j, strict).
    let mut prereq: Vec<Vec<(usize, bool)>> = vec![Vec::new(); n];
    for (h, hop) in hops.iter().enumerate() {
        if let Some(first) = hop.after {
            prereq[h].push((first, true));
        }
        let end = hop.write.saturating_add(hop.len);
        // Reads may overlap each other (a temporary over a source), so
        // look back by the longest hop.
        let lo = by_read.partition_point(|&j| hops[j].read.saturating_add(longest) <= hop.write);
        let hi = by_read.partition_point(|&j| hops[j].read < end);
        for &j in &by_read[lo..hi] {
            let read_end = hops[j].read.saturating_add(hops[j].len);
            if j != h && read_end > hop.write && hops[j].step != hop.step {
                prereq[h].push((j, hops[j].read > hop.read));
            }
        }
    }
    // Longest paths by depth-first search, finding a cycle if any.
    let mut level = vec![0usize; n];
    let mut state = vec![0u8; n]; // 0 new, 1 on the stack, 2 done
    for root in 0..n {
        if state[root] != 0 {
            continue;
        }
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        state[root] = 1;
        while let Some(top) = stack.len().checked_sub(1) {
            let (h, next) = stack[top];
            if let Some(&(j, _)) = prereq[h].get(next) {
                stack[top].1 += 1;
                match state[j] {
                    0 => {
                        state[j] = 1;
                        stack.push((j, 0));
                    }
                    // A cycle: the hops on the stack from `j` up. Route
                    // the shortest move on it (the least temporary space).
                    1 => {
                        let from = stack.iter().position(|&(x, _)| x == j).unwrap_or(0);
                        let pick = stack[from..]
                            .iter()
                            .map(|&(x, _)| x)
                            .filter(|&x| !hops[x].routed)
                            .min_by_key(|&x| hops[x].len)
                            .unwrap_or(h);
                        return Err(pick);
                    }
                    _ => {}
                }
                continue;
            }
            level[h] = prereq[h]
                .iter()
                .map(|&(j, strict)| level[j] + usize::from(strict))
                .fold(0, usize::max);
            state[h] = 2;
            stack.pop();
        }
    }
    Ok(level)
}

/// The plan of `hops` at `levels`, checked against the blocks.
fn waves(
    blocks: &[LiveBlock],
    hops: &[Hop],
    levels: &[usize],
    capacity: u64,
    kind: PlanKind,
) -> Option<Plan> {
    let mut waves: Vec<Vec<Move>> = Vec::new();
    for (hop, &w) in hops.iter().zip(levels) {
        if waves.len() <= w {
            waves.resize_with(w + 1, Vec::new);
        }
        let b = &blocks[hop.block];
        waves[w].push(Move {
            key: b.key,
            src: hop.read,
            dst: hop.write,
            len: b.copy_len,
        });
    }
    let mut plan = Plan::empty(kind);
    for mut w in waves.into_iter().filter(|w| !w.is_empty()) {
        w.sort_unstable_by_key(|m| m.src);
        plan.waves.push(Wave { moves: w });
    }
    plan.validate_against(blocks, capacity).ok()?;
    Some(plan)
}

/// Where temporaries can go: spans free in the target layout, and those
/// of them free now too.
struct Spans {
    both: Vec<(u64, u64)>,
    target: Vec<(u64, u64)>,
}

impl Spans {
    fn of(blocks: &[LiveBlock], target: &[u64], capacity: u64) -> Spans {
        let complement = |mut used: Vec<(u64, u64)>| {
            used.sort_unstable();
            let mut free = Vec::new();
            let mut cursor = 0u64;
            for (offset, len) in used.into_iter().chain(std::iter::once((capacity, 0))) {
                if offset > cursor {
                    free.push((cursor, offset));
                }
                cursor = cursor.max(offset.saturating_add(len));
            }
            free
        };
        let target_used: Vec<(u64, u64)> = blocks
            .iter()
            .zip(target)
            .map(|(b, &t)| (t, b.len))
            .collect();
        let mut both_used = target_used.clone();
        both_used.extend(blocks.iter().map(|b| (b.offset, b.len)));
        Spans {
            both: complement(both_used),
            target: complement(target_used),
        }
    }

    /// The lowest `align`-aligned offset for `len` bytes in a span free
    /// now and in the target, else in one free in the target, avoiding
    /// `own` (the block's source) and the temporaries `taken`.
    fn find(&self, len: u64, align: u64, own: (u64, u64), taken: &[(u64, u64)]) -> Option<u64> {
        let clear = |at: u64| {
            let end = at + len;
            !taken
                .iter()
                .chain(std::iter::once(&own))
                .any(|&(s, e)| s < end && at < e)
        };
        for spans in [&self.both, &self.target] {
            for &(s, e) in spans {
                // Candidate starts: the span's, and just past each
                // obstacle inside it.
                let starts = std::iter::once(s).chain(
                    taken
                        .iter()
                        .chain(std::iter::once(&own))
                        .map(|&(_, end)| end)
                        .filter(|&x| x > s && x < e),
                );
                for start in starts {
                    let Some(at) = start.checked_add(align - 1).map(|v| v & !(align - 1)) else {
                        continue;
                    };
                    if at.checked_add(len).is_some_and(|end| end <= e) && clear(at) {
                        return Some(at);
                    }
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blk(key: u64, offset: u64, len: u64, align: u64) -> LiveBlock {
        LiveBlock::at(key, offset, len, align)
    }

    #[test]
    fn a_swap_with_room_goes_through_a_free_spot() {
        // [x][y] -> [y][x], with room above.
        let blocks = [blk(0, 0, 100, 1), blk(1, 100, 50, 1)];
        let plan = plan_relayout(&blocks, &[50, 0], 400, PlanKind::Full).expect("plan");
        assert!(plan.waves.len() >= 2);
        assert!(plan.bytes_moved() > 150, "one block copied twice");
        // No room for a whole block: no whole-block plan, and no byte free
        // at all: none in pieces either.
        assert_eq!(plan_whole(&blocks, &[50, 0], 150, PlanKind::Full), None);
        assert_eq!(plan_relayout(&blocks, &[50, 0], 150, PlanKind::Full), None);
        // One free byte range smaller than either block: in pieces.
        let plan = plan_relayout(&blocks, &[50, 0], 160, PlanKind::Full).expect("in pieces");
        assert!(plan.bytes_moved() <= 2 * 150);
    }

    #[test]
    fn the_issues_layout_reorders_in_one_wave() {
        // 256 B at 0, 256 B aligned to 32 KiB at 32 KiB: the aligned block
        // goes first, the other after it.
        let blocks = [blk(0, 0, 256, 256), blk(1, 32 << 10, 256, 32 << 10)];
        let plan = plan_relayout(&blocks, &[256, 0], 64 << 10, PlanKind::Full).expect("plan");
        assert_eq!(plan.waves.len(), 1);
        assert_eq!(plan.bytes_moved(), 512);
    }

    #[test]
    fn sliding_up_over_itself_is_routed() {
        let blocks = [blk(0, 0, 100, 1)];
        let plan = plan_relayout(&blocks, &[10], 300, PlanKind::Full).expect("plan");
        assert_eq!(plan.move_count(), 2);
    }

    /// Random permutations of random blocks into random packed targets:
    /// a plan comes back unless no byte is free, valid against the blocks
    /// (which `plan_relayout` checks itself), ending where asked, copying
    /// each byte at most twice.
    #[test]
    fn random_relayouts_are_valid_or_refused() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut planned, mut refused) = (0, 0);
        for _ in 0..3_000 {
            let n = 1 + rnd() % 10;
            let mut blocks = Vec::new();
            let mut cursor = 0;
            for k in 0..n {
                cursor += rnd() % 3 * 16;
                let len = 16 * (1 + rnd() % 6);
                blocks.push(blk(k, cursor, len, 16));
                cursor += len;
            }
            let cap = cursor + rnd() % 4 * 64;
            // A random order packed from a random start.
            let mut order: Vec<usize> = (0..blocks.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, (rnd() % (i as u64 + 1)) as usize);
            }
            let total: u64 = blocks.iter().map(|b| b.len).sum();
            let mut at = (rnd() % (cap - total + 1)) / 16 * 16;
            let mut target = vec![0; blocks.len()];
            for &i in &order {
                target[i] = at;
                at += blocks[i].len;
            }
            let moving: u64 = blocks
                .iter()
                .zip(&target)
                .filter(|(b, &t)| b.offset != t)
                .map(|(b, _)| b.copy_len)
                .sum();
            match plan_relayout(&blocks, &target, cap, PlanKind::Full) {
                Some(plan) => {
                    planned += 1;
                    // `plan_relayout` checked it against the blocks (the
                    // final layout included); here it must also end where
                    // asked, and copy each byte at most twice.
                    let finals =
                        crate::plan::track::final_offsets(&plan, &blocks, |k| Some(k as usize))
                            .expect("pieces end whole");
                    let mut end: Vec<u64> = blocks.iter().map(|b| b.offset).collect();
                    for (i, f) in finals {
                        end[i] = f;
                    }
                    assert_eq!(end, target);
                    assert!(plan.bytes_moved() <= 2 * moving);
                }
                None => {
                    // Only with no byte free.
                    assert_eq!(cap, total, "refused with {} B free", cap - total);
                    refused += 1;
                }
            }
        }
        println!("planned {planned}, refused {refused}");
        assert!(planned > 2_500, "planned {planned}, refused {refused}");
    }
}
