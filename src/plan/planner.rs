//! The compaction planner: live blocks in, a [`Plan`] out.
//!
//! Pure data: no backend, no arena, no unsafe. Two modes:
//!
//! - [`plan_full`] packs every unpinned block as low as it can go: into the
//!   lowest gap between pinned blocks that still has room, or down within its
//!   own gap. Every move goes down, in address order, so the whole plan is
//!   one wave under the wave rule (a destination only ever covers the sources
//!   of blocks that come earlier).
//! - [`plan_targeted`] makes one hole for a request while moving as few bytes
//!   as it can. It weighs two candidates and takes the cheaper:
//!   *evacuate* the cheapest window of the request's size (its blocks go to
//!   holes elsewhere, best fit, largest first), and *slide* the shortest run
//!   of holes whose free bytes add up to the request (the blocks between
//!   them slide down so the holes merge at the top of the run).
//!
//! Both take blocks in ascending address order with their alignment and
//! pin state; pinned blocks never move.
#![deny(unsafe_code)]

use std::collections::BTreeMap;

use smallvec::smallvec;

use super::{Move, Plan, PlanKind, Wave};
use crate::error::{Error, Result};

/// A live block as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveBlock {
    /// Opaque identifier carried into the [`Move`]s.
    pub key: u64,
    /// Current offset.
    pub offset: u64,
    /// Bytes the block occupies (its reservation).
    pub len: u64,
    /// Bytes that hold data and must be copied (`<= len`).
    pub copy_len: u64,
    /// Alignment its offset must keep (power of two).
    pub align: u64,
    /// Pinned blocks never move.
    pub pinned: bool,
}

impl LiveBlock {
    /// End of the block (exclusive); saturating, so a block that
    /// [`check_live`] would refuse cannot wrap around.
    fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

/// Checks the planners' input: blocks ascending and disjoint inside
/// `[0, capacity)`, each of `len > 0`, `copy_len <= len`, alignment a power
/// of two and offset a multiple of it. The planners never panic or
/// overflow on other input, but their plans are only meaningful for input
/// that passes; [`crate::plan::Plan::validate_against`] runs this first.
///
/// # Errors
///
/// [`Error::InvalidLayout`] naming the first block that breaks a rule.
pub fn check_live(blocks: &[LiveBlock], capacity: u64) -> Result<()> {
    let mut cursor = 0u64;
    for (i, b) in blocks.iter().enumerate() {
        let end = b.offset.checked_add(b.len).filter(|&e| e <= capacity);
        let ok = b.len > 0
            && b.copy_len <= b.len
            && b.align.is_power_of_two()
            && b.offset % b.align == 0
            && b.offset >= cursor;
        match end {
            Some(end) if ok => cursor = end,
            _ => {
                return Err(Error::InvalidLayout {
                    reason: format!(
                        "live block {i} ({b:?}) is empty, misaligned, copies more than it holds, \
                         overlaps the block before it (ending at {cursor}) or leaves the region \
                         of {capacity} B"
                    ),
                })
            }
        }
    }
    Ok(())
}

/// A request the targeted planner must make room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Bytes, already rounded to the arena's alignment.
    pub size: u64,
    /// Alignment of the request (power of two).
    pub align: u64,
}

/// `x` rounded up to a multiple of `align` (a power of two), or `None` if
/// that is past `u64::MAX`: near 2^64 (metadata arenas) a wrapped or
/// saturated result would lie below `x` and overlap the block there.
fn align_up(x: u64, align: u64) -> Option<u64> {
    let mask = align.max(1) - 1;
    x.checked_add(mask).map(|v| v & !mask)
}

/// Where [`plan_full`] puts each unpinned block, and the plan.
fn pack_full(blocks: &[LiveBlock], capacity: u64) -> (Plan, Vec<(u64, u64)>) {
    // Gaps between pinned blocks, each with a fill cursor.
    let mut gaps: Vec<(u64, u64)> = Vec::new(); // (cursor, end)
    let mut start = 0;
    for b in blocks.iter().filter(|b| b.pinned) {
        gaps.push((start, b.offset));
        start = b.end();
    }
    gaps.push((start, capacity));

    let mut moves = Vec::new();
    let mut layout = Vec::with_capacity(blocks.len()); // final (offset, len), unsorted
    let mut own_gap = 0;
    let mut first_open = 0;
    for b in blocks {
        if b.pinned {
            own_gap += 1;
            layout.push((b.offset, b.len));
            continue;
        }
        let mut dst = None;
        for (k, gap) in gaps
            .iter_mut()
            .enumerate()
            .take(own_gap + 1)
            .skip(first_open)
        {
            let Some(pos) = align_up(gap.0, b.align) else {
                continue;
            };
            if pos.checked_add(b.len).is_some_and(|e| e <= gap.1) {
                // Invariant: in its own gap the cursor never passes the block,
                // so `pos <= b.offset` and every move goes down.
                let d = if k == own_gap { pos.min(b.offset) } else { pos };
                gap.0 = d.saturating_add(b.len);
                dst = Some(d);
                break;
            }
        }
        // Found no place (only for input `check_live` refuses): the block
        // stays, and nothing later in its gap may land on it.
        let dst = dst.unwrap_or_else(|| {
            if let Some(gap) = gaps.get_mut(own_gap) {
                gap.0 = gap.0.max(b.end());
            }
            b.offset
        });
        while first_open < own_gap && gaps[first_open].0 >= gaps[first_open].1 {
            first_open += 1;
        }
        if dst != b.offset {
            moves.push(Move {
                key: b.key,
                src: b.offset,
                dst,
                len: b.copy_len,
            });
        }
        layout.push((dst, b.len));
    }
    let mut plan = Plan::empty(PlanKind::Full);
    if !moves.is_empty() {
        plan.waves.push(Wave { moves });
    }
    (plan, layout)
}

/// Plans a full compaction: afterwards the free space of each gap between
/// pinned blocks is one region at the top of the gap (with no pins: one
/// region in all), except for padding that blocks aligned above their
/// neighbours need. One wave.
pub fn plan_full(blocks: &[LiveBlock], capacity: u64) -> Plan {
    pack_full(blocks, capacity).0
}

/// Largest free region (in bytes) after a full compaction, and whether a
/// request would fit in it. Used to report what compaction could reach.
pub fn largest_hole_after_full(blocks: &[LiveBlock], capacity: u64, align: u64) -> u64 {
    let (_, mut layout) = pack_full(blocks, capacity);
    layout.sort_unstable();
    largest_aligned_hole(&layout, capacity, align)
}

/// Largest `align`-aligned free span in a sorted, non-overlapping layout.
fn largest_aligned_hole(layout: &[(u64, u64)], capacity: u64, align: u64) -> u64 {
    let mut best = 0;
    let mut cursor = 0;
    for &(off, len) in layout.iter().chain(std::iter::once(&(capacity, 0))) {
        if let Some(start) = align_up(cursor, align) {
            if off > start {
                best = best.max(off - start);
            }
        }
        cursor = cursor.max(off.saturating_add(len));
    }
    best
}

/// Plans a targeted compaction that leaves one hole holding `req`, moving
/// as few bytes as it can. `None` when neither evacuating a window nor
/// sliding a run of holes can make room (pins in the way, or holes too
/// small to take the evacuees); the caller then tries [`plan_full`].
pub fn plan_targeted(blocks: &[LiveBlock], capacity: u64, req: Request) -> Option<Plan> {
    if req.size == 0 || req.size > capacity {
        return None;
    }
    let holes = holes_of(blocks, capacity);
    let slide = plan_slide(blocks, &holes, req);
    let evac = plan_evacuate(
        blocks,
        &holes,
        capacity,
        req,
        slide.as_ref().map(|p| p.bytes_moved()),
    );
    match (slide, evac) {
        (Some(s), Some(e)) => Some(if e.bytes_moved() < s.bytes_moved() {
            e
        } else {
            s
        }),
        (s, e) => s.or(e),
    }
}

/// Free regions `(start, end)` in address order; `before[i]` is the number
/// of blocks that lie below hole `i`.
struct Holes {
    spans: Vec<(u64, u64)>,
    before: Vec<usize>,
}

fn holes_of(blocks: &[LiveBlock], capacity: u64) -> Holes {
    let mut spans = Vec::new();
    let mut before = Vec::new();
    let mut cursor = 0;
    for (i, b) in blocks.iter().enumerate() {
        if b.offset > cursor {
            spans.push((cursor, b.offset));
            before.push(i);
        }
        cursor = b.end();
    }
    if capacity > cursor {
        spans.push((cursor, capacity));
        before.push(blocks.len());
    }
    Holes { spans, before }
}

/// Slide: pick holes `a..=b` (no pinned block between them) whose sizes sum
/// to the request with the fewest block bytes between them; those blocks
/// slide down to the start of hole `a`, merging the holes at the top.
fn plan_slide(blocks: &[LiveBlock], holes: &Holes, req: Request) -> Option<Plan> {
    let n = holes.spans.len();
    if n == 0 {
        return None;
    }
    // Prefix sums over blocks: copied bytes and pin counts.
    let mut copied = Vec::with_capacity(blocks.len() + 1);
    let mut pins = Vec::with_capacity(blocks.len() + 1);
    copied.push(0u64);
    pins.push(0u32);
    for b in blocks {
        copied.push(
            copied
                .last()
                .copied()
                .unwrap_or(0)
                .saturating_add(b.copy_len),
        );
        pins.push(pins.last().copied().unwrap_or(0) + u32::from(b.pinned));
    }
    let mut best: Option<(u64, usize, usize)> = None; // (cost, a, b)
    let mut free = 0u64;
    let mut b = 0;
    for a in 0..n {
        if b < a {
            b = a;
            free = 0;
        }
        // Extend b until the merged free bytes suffice (with slack for
        // alignment padding, checked exactly when the plan is built).
        while b < n && free < req.size {
            free = free.saturating_add(holes.spans[b].1 - holes.spans[b].0);
            b += 1;
        }
        if free < req.size {
            break;
        }
        let (first, last) = (holes.before[a], holes.before[b - 1]);
        if pins[last] == pins[first] {
            let cost = copied[last] - copied[first];
            if best.is_none_or(|(c, _, _)| cost < c) {
                best = Some((cost, a, b - 1));
            }
        }
        free -= holes.spans[a].1 - holes.spans[a].0;
    }
    let (_, a, b) = best?;
    let (first, last) = (holes.before[a], holes.before[b]);
    let mut cursor = holes.spans[a].0;
    let mut moves = Vec::new();
    for blk in &blocks[first..last] {
        let dst = align_up(cursor, blk.align).map_or(blk.offset, |p| p.min(blk.offset));
        if dst != blk.offset {
            moves.push(Move {
                key: blk.key,
                src: blk.offset,
                dst,
                len: blk.copy_len,
            });
        }
        cursor = dst.saturating_add(blk.len);
    }
    let hole_end = holes.spans[b].1;
    if align_up(cursor, req.align)?.checked_add(req.size)? > hole_end {
        return None; // alignment padding ate the slack
    }
    let mut plan = Plan::empty(PlanKind::Targeted);
    plan.waves = smallvec![Wave { moves }];
    Some(plan)
}

/// Evacuate: find the windows `[x, x + size)` (x aligned, no pinned block
/// inside) with the fewest block bytes, and move those blocks into holes
/// outside the window. Tries a few of the cheapest windows, since the best
/// may not pack.
fn plan_evacuate(
    blocks: &[LiveBlock],
    holes: &Holes,
    capacity: u64,
    req: Request,
    beat: Option<u64>,
) -> Option<Plan> {
    const CANDIDATES: usize = 4;
    // Candidate starts: every region start (hole or block), in address
    // order, aligned up. Keep the cheapest few windows in one pass.
    let mut best: smallvec::SmallVec<[(u64, u64, usize, usize); CANDIDATES]> =
        smallvec::SmallVec::new();
    let (mut lo, mut hi) = (0usize, 0usize);
    let mut cost = 0u64;
    let mut pinned_inside = 0u32;
    let mut consider =
        |s: u64, lo: &mut usize, hi: &mut usize, cost: &mut u64, pinned: &mut u32| -> bool {
            let Some(x) = align_up(s, req.align) else {
                return false;
            };
            let Some(end) = x.checked_add(req.size).filter(|&e| e <= capacity) else {
                return false;
            };
            while *hi < blocks.len() && blocks[*hi].offset < end {
                *cost += blocks[*hi].copy_len;
                *pinned += u32::from(blocks[*hi].pinned);
                *hi += 1;
            }
            while *lo < *hi && blocks[*lo].end() <= x {
                *cost -= blocks[*lo].copy_len;
                *pinned -= u32::from(blocks[*lo].pinned);
                *lo += 1;
            }
            if *pinned == 0 && beat.is_none_or(|b| *cost < b) {
                let cand = (*cost, x, *lo, *hi);
                if best.len() < CANDIDATES {
                    best.push(cand);
                } else if let Some(worst) = best.iter_mut().max_by_key(|c| (c.0, c.1)) {
                    if (cand.0, cand.1) < (worst.0, worst.1) {
                        *worst = cand;
                    }
                }
            }
            true
        };
    let mut cursor = 0;
    let mut ended = false;
    for b in blocks {
        if b.offset > cursor && !consider(cursor, &mut lo, &mut hi, &mut cost, &mut pinned_inside) {
            ended = true;
            break;
        }
        if !consider(b.offset, &mut lo, &mut hi, &mut cost, &mut pinned_inside) {
            ended = true;
            break;
        }
        cursor = b.end();
    }
    if !ended && capacity > cursor {
        consider(cursor, &mut lo, &mut hi, &mut cost, &mut pinned_inside);
    }
    best.sort_unstable_by_key(|c| (c.0, c.1));
    best.iter()
        .find_map(|&(_, x, lo, hi)| pack_evacuees(blocks, holes, x, x + req.size, lo, hi))
}

/// Best-fit the blocks `lo..hi` (largest first) into free space outside
/// `[win_lo, win_hi)`. Few evacuees scan a flat list of free pieces (no
/// index to build); many use an ordered map.
fn pack_evacuees(
    blocks: &[LiveBlock],
    holes: &Holes,
    win_lo: u64,
    win_hi: u64,
    lo: usize,
    hi: usize,
) -> Option<Plan> {
    if lo == hi {
        return Some(Plan::empty(PlanKind::Targeted)); // the window is already free
    }
    // Free space outside the window as (start, end) pieces.
    let mut free: Vec<(u64, u64)> = Vec::with_capacity(holes.spans.len() + 1);
    for &(s, e) in &holes.spans {
        for (a, b) in [(s, e.min(win_lo)), (s.max(win_hi), e)] {
            if b > a {
                free.push((a, b));
            }
        }
    }
    let mut order: Vec<usize> = (lo..hi).collect();
    order.sort_unstable_by_key(|&i| std::cmp::Reverse(blocks[i].len));
    let mut moves = Vec::with_capacity(order.len());
    let fits = |(start, end): (u64, u64), b: &LiveBlock| {
        align_up(start, b.align)
            .and_then(|p| p.checked_add(b.len))
            .is_some_and(|e| e <= end)
    };
    if order.len() <= 16 {
        for i in order {
            let b = &blocks[i];
            // Smallest piece that holds the block at its alignment.
            let (k, _) = free
                .iter()
                .enumerate()
                .filter(|(_, &p)| fits(p, b))
                .min_by_key(|(_, p)| p.1 - p.0)?;
            let (start, end) = free[k];
            let dst = align_up(start, b.align)?;
            free[k] = (dst + b.len, end);
            if dst > start {
                free.push((start, dst));
            }
            moves.push(Move {
                key: b.key,
                src: b.offset,
                dst,
                len: b.copy_len,
            });
        }
    } else {
        let mut by_size: BTreeMap<(u64, u64), ()> =
            free.iter().map(|&(s, e)| ((e - s, s), ())).collect();
        for i in order {
            let b = &blocks[i];
            let found = by_size
                .range((b.len, 0)..)
                .map(|(&k, _)| k)
                .find(|&(size, start)| fits((start, start + size), b))?;
            by_size.remove(&found);
            let (size, start) = found;
            let dst = align_up(start, b.align)?;
            if dst > start {
                by_size.insert((dst - start, start), ());
            }
            let rest = start + size - (dst + b.len);
            if rest > 0 {
                by_size.insert((rest, dst + b.len), ());
            }
            moves.push(Move {
                key: b.key,
                src: b.offset,
                dst,
                len: b.copy_len,
            });
        }
    }
    moves.sort_unstable_by_key(|m| m.src);
    let mut plan = Plan::empty(PlanKind::Targeted);
    plan.waves.push(Wave { moves });
    Some(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn pinned(key: u64, offset: u64, len: u64) -> LiveBlock {
        LiveBlock {
            pinned: true,
            ..blk(key, offset, len)
        }
    }

    /// Applies a plan to a layout and returns the sorted result, checking
    /// the plan's validity and that nothing overlaps afterwards.
    fn apply(blocks: &[LiveBlock], plan: &Plan, capacity: u64) -> Vec<(u64, u64, u64)> {
        plan.validate_against(blocks, capacity)
            .expect("plan breaks the wave rule");
        let mut out: Vec<(u64, u64, u64)> =
            blocks.iter().map(|b| (b.offset, b.len, b.key)).collect();
        for m in plan.moves() {
            let e = out
                .iter_mut()
                .find(|e| e.2 == m.key)
                .expect("move of unknown block");
            assert_eq!(e.0, m.src, "move source is not where the block is");
            e.0 = m.dst;
        }
        out.sort_unstable();
        for w in out.windows(2) {
            assert!(
                w[0].0 + w[0].1 <= w[1].0,
                "blocks overlap after plan: {w:?}"
            );
        }
        out
    }

    #[test]
    fn full_slides_everything_down_in_one_wave() {
        let blocks = [blk(1, 100, 50), blk(2, 200, 300), blk(3, 600, 10)];
        let plan = plan_full(&blocks, 1000);
        assert_eq!(plan.waves.len(), 1);
        let out = apply(&blocks, &plan, 1000);
        assert_eq!(out, vec![(0, 50, 1), (50, 300, 2), (350, 10, 3)]);
    }

    #[test]
    fn four_gib_block_sliding_down_by_256_bytes() {
        let g = 4u64 << 30;
        let blocks = [LiveBlock {
            align: 256,
            ..blk(7, 256, g)
        }];
        let plan = plan_full(&blocks, g + 256);
        assert_eq!(plan.move_count(), 1);
        let m = plan.moves().next().copied().expect("one move");
        assert_eq!((m.src, m.dst, m.len), (256, 0, g));
        apply(&blocks, &plan, g + 256);
    }

    #[test]
    fn chain_where_each_destination_covers_the_previous_source() {
        // Adjacent blocks after a small hole: every destination covers the
        // previous block's source; still one wave.
        let blocks: Vec<_> = (0..100).map(|i| blk(i, 16 + i * 1000, 1000)).collect();
        let plan = plan_full(&blocks, 200_000);
        assert_eq!(plan.waves.len(), 1);
        let out = apply(&blocks, &plan, 200_000);
        assert_eq!(out[99].0, 99_000);
    }

    #[test]
    fn holes_between_pins_become_one_region_per_gap() {
        let blocks = [
            blk(1, 10, 10),
            pinned(2, 40, 10),
            blk(3, 60, 10),
            blk(4, 80, 5),
            pinned(5, 90, 10),
        ];
        let plan = plan_full(&blocks, 120);
        let out = apply(&blocks, &plan, 120);
        // Gap [0,40): block 1 at 0 and block 3 moves past the pin into it.
        assert!(out.contains(&(40, 10, 2)) && out.contains(&(90, 10, 5)));
        assert!(out.contains(&(0, 10, 1)));
        let layout: Vec<(u64, u64)> = out.iter().map(|e| (e.0, e.1)).collect();
        // Free space per gap is one region: count free regions.
        let mut regions = 0;
        let mut cursor = 0;
        for &(o, l) in layout.iter().chain(std::iter::once(&(120, 0))) {
            regions += usize::from(o > cursor);
            cursor = o + l;
        }
        assert!(regions <= 3, "{layout:?}");
    }

    #[test]
    fn all_blocks_pinned_moves_nothing() {
        let blocks = [pinned(1, 10, 10), pinned(2, 40, 10)];
        assert!(plan_full(&blocks, 100).is_empty());
        assert_eq!(
            plan_targeted(&blocks, 100, Request { size: 60, align: 1 }),
            None
        );
        assert_eq!(largest_hole_after_full(&blocks, 100, 1), 50);
    }

    #[test]
    fn targeted_moves_less_than_full() {
        // Many small blocks with holes; a request of 3 holes' worth.
        let mut blocks = Vec::new();
        for i in 0..100u64 {
            blocks.push(blk(i, i * 200, 100));
        }
        let cap = 20_000;
        let req = Request {
            size: 300,
            align: 1,
        };
        let t = plan_targeted(&blocks, cap, req).expect("targeted plan");
        let f = plan_full(&blocks, cap);
        assert!(
            t.bytes_moved() < f.bytes_moved() / 10,
            "{} vs {}",
            t.bytes_moved(),
            f.bytes_moved()
        );
        let out = apply(&blocks, &t, cap);
        let layout: Vec<(u64, u64)> = out.iter().map(|e| (e.0, e.1)).collect();
        assert!(largest_aligned_hole(&layout, cap, 1) >= 300);
    }

    #[test]
    fn targeted_respects_pins_and_alignment() {
        let blocks = [
            blk(1, 0, 256),
            pinned(2, 512, 256),
            blk(3, 1024, 256),
            blk(4, 1536, 256),
        ];
        let req = Request {
            size: 1024,
            align: 512,
        };
        let t = plan_targeted(&blocks, 4096, req).expect("plan");
        let out = apply(&blocks, &t, 4096);
        assert!(out.contains(&(512, 256, 2)));
        let layout: Vec<(u64, u64)> = out.iter().map(|e| (e.0, e.1)).collect();
        assert!(largest_aligned_hole(&layout, 4096, 512) >= 1024);
    }

    #[test]
    fn targeted_falls_back_to_none_when_pins_split_space() {
        let blocks = [pinned(1, 100, 100), pinned(2, 300, 100)];
        assert_eq!(
            plan_targeted(
                &blocks,
                500,
                Request {
                    size: 150,
                    align: 1
                }
            ),
            None
        );
    }

    #[test]
    fn align_up_never_wraps() {
        assert_eq!(align_up(u64::MAX - 5, 1 << 62), None);
        assert_eq!(align_up(3 << 62, 1 << 62), Some(3 << 62));
        assert_eq!(align_up((3 << 62) + 1, 1 << 62), None);
        assert_eq!(align_up(u64::MAX, 1), Some(u64::MAX));
    }

    #[test]
    fn near_two_to_the_64() {
        // A region of 2^64 - 2^20 B: blocks of 2^62 B aligned to 2^62, a
        // request whose alignment cannot be met above the last block.
        let cap = u64::MAX - ((1 << 20) - 1);
        let q = 1u64 << 62;
        let a = |key, offset, len, align| LiveBlock {
            align,
            ..blk(key, offset, len)
        };
        let blocks = [a(1, q, q, q), a(2, 3 * q, q - (1 << 20), q)];
        check_live(&blocks, cap).expect("valid input");
        let full = plan_full(&blocks, cap);
        let out = apply(&blocks, &full, cap);
        assert_eq!(out[0], (0, q, 1));
        for req in [
            Request { size: q, align: q },
            Request {
                size: 2 * q,
                align: q,
            },
            Request {
                size: q + 1,
                align: 1 << 40,
            },
            Request {
                size: (1 << 20) + 1,
                align: 256,
            },
        ] {
            if let Some(p) = plan_targeted(&blocks, cap, req) {
                apply(&blocks, &p, cap);
            }
        }
        // Packed: [0, q) and [q, 2q - 2^20); the aligned hole starts at 2q.
        assert_eq!(largest_hole_after_full(&blocks, cap, q), 2 * q - (1 << 20));
        assert_eq!(
            largest_hole_after_full(&blocks, cap, 1 << 63),
            2 * q - (1 << 20)
        );
        // Bad input is refused by the check, and the planners stay total.
        let bad = [a(1, 0, q, 1), a(2, q - 1, 2, 1)];
        assert!(check_live(&bad, cap).is_err());
        let _ = plan_full(&bad, cap);
        let _ = plan_targeted(&bad, cap, Request { size: 10, align: 1 });
        let wrap = [a(1, u64::MAX - 1, 10, 1)];
        assert!(check_live(&wrap, u64::MAX).is_err());
        let _ = plan_full(&wrap, u64::MAX);
        let _ = largest_hole_after_full(&wrap, u64::MAX, 1 << 63);
    }
}
