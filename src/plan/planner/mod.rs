//! The compaction planner: live blocks in, a [`Plan`] out.
//!
//! Pure data: no backend, no arena, no unsafe. Two modes:
//!
//! - [`plan_full`] packs every unpinned block as low as it can go: into the
//!   lowest gap between pinned blocks that still has room, or down within its
//!   own gap. Every move goes down, in address order, so the whole plan is
//!   one wave under the wave rule (a destination only ever covers the sources
//!   of blocks that come earlier). Where address order leaves alignment
//!   padding, each gap's blocks are packed in descending order of alignment
//!   instead when that pads less ([`pack`]): a plan of several waves.
//! - [`plan_gap`] empties the gap between pinned blocks that can hold the
//!   most for a request, moving its blocks into the room the other gaps
//!   have ([`pack`]).
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

pub(crate) mod evacuate;
pub mod pack;

use std::collections::BTreeMap;

use smallvec::smallvec;

pub use pack::{largest_hole_by_gaps, plan_gap};

pub use super::live::LiveBlock;
use super::PlanError;
use super::{Move, Plan, PlanKind, Wave};

/// Checks the planners' input: blocks ascending and disjoint inside
/// `[0, capacity)`, each of `len > 0`, `copy_len <= len`, alignment a power
/// of two and offset a multiple of it. The planners never panic or
/// overflow on other input, but their plans are only meaningful for input
/// that passes; [`crate::plan::Plan::validate_against`] runs this first.
///
/// # Errors
///
/// [`PlanError::Layout`] naming the first block that breaks a rule.
pub fn check_live(blocks: &[LiveBlock], capacity: u64) -> Result<(), PlanError> {
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
                return Err(PlanError::Layout(format!(
                    "live block {i} ({b:?}) is empty, misaligned, copies more than it holds, \
                     overlaps the block before it (ending at {cursor}) or leaves the region \
                     of {capacity} B"
                )))
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

/// Scratch tables of the planners, kept by a caller that plans again and
/// again ([`crate::plan::policy::Pacer`] keeps one per arena): a plan over
/// n blocks needs several tables of n entries, and allocating them afresh
/// for every compaction (growing them by doubling) costs, on arenas of
/// hundreds of thousands of blocks, fresh pages and copies on the order of
/// filling them.
#[derive(Debug, Clone, Default)]
pub struct Scratch {
    holes: Holes,
    /// Prefix sums over blocks for the slide: copied bytes and pin counts.
    copied: Vec<u64>,
    pins: Vec<u32>,
    /// The layout after a full compaction, `(offset, len)`.
    layout: Vec<(u64, u64)>,
}

/// The plan of [`plan_full`].
fn pack_full(blocks: &[LiveBlock], capacity: u64) -> Plan {
    let mut moves = Vec::new();
    pack_full_with(blocks, capacity, |b, dst| {
        if dst != b.offset {
            moves.push(Move {
                key: b.key,
                src: b.offset,
                dst,
                len: b.copy_len,
            });
        }
    });
    let mut plan = Plan::empty(PlanKind::Full);
    if !moves.is_empty() {
        plan.waves.push(Wave { moves });
    }
    plan
}

/// Bytes a full compaction would move now, without building its plan
/// (no allocation beyond one entry per pinned block) unless it reorders
/// blocks by alignment. O(blocks).
pub fn full_bytes_moved(blocks: &[LiveBlock], capacity: u64) -> u64 {
    if let Some((target, _)) = pack::full_reordered(blocks, capacity) {
        // Each moved block once (a staged one may be copied twice).
        return blocks
            .iter()
            .zip(&target)
            .filter(|(b, &t)| t != b.offset)
            .map(|(b, _)| b.copy_len)
            .fold(0, u64::saturating_add);
    }
    let mut bytes = 0u64;
    pack_full_with(blocks, capacity, |b, dst| {
        if dst != b.offset {
            bytes = bytes.saturating_add(b.copy_len);
        }
    });
    bytes
}

/// The packing of [`plan_full`]: calls `place(block, dst)` for every block
/// in address order (pinned ones at their own offset).
fn pack_full_with(blocks: &[LiveBlock], capacity: u64, mut place: impl FnMut(&LiveBlock, u64)) {
    // Gaps between pinned blocks, each with a fill cursor.
    let mut gaps: Vec<(u64, u64)> = Vec::new(); // (cursor, end)
    let mut start = 0;
    for b in blocks.iter().filter(|b| b.pinned) {
        gaps.push((start, b.offset));
        start = b.end();
    }
    gaps.push((start, capacity));

    let mut own_gap = 0;
    let mut first_open = 0;
    for b in blocks {
        if b.pinned {
            own_gap += 1;
            place(b, b.offset);
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
        place(b, dst);
    }
}

/// Plans a full compaction: afterwards the free space of each gap between
/// pinned blocks is one region at the top of the gap (with no pins: one
/// region in all), except for padding that blocks aligned above their
/// neighbours need. One wave, unless packing a gap's blocks by alignment
/// pads less than address order (see [`pack`]).
pub fn plan_full(blocks: &[LiveBlock], capacity: u64) -> Plan {
    match pack::full_reordered(blocks, capacity) {
        Some((_, plan)) => plan,
        None => pack_full(blocks, capacity),
    }
}

/// Largest free region (in bytes) after a full compaction, and whether a
/// request would fit in it. Used to report what compaction could reach.
pub fn largest_hole_after_full(blocks: &[LiveBlock], capacity: u64, align: u64) -> u64 {
    largest_hole_after_full_in(blocks, capacity, align, &mut Scratch::default())
}

/// [`largest_hole_after_full`] with its table in `scratch`.
pub fn largest_hole_after_full_in(
    blocks: &[LiveBlock],
    capacity: u64,
    align: u64,
    scratch: &mut Scratch,
) -> u64 {
    // The layout the compaction would reach: the reordered packing only
    // where its relayout is planned (as `plan_full` runs it).
    if let Some((target, _)) = pack::full_reordered(blocks, capacity) {
        return pack::largest_hole_of(blocks, &target, capacity, align);
    }
    let layout = &mut scratch.layout;
    layout.clear();
    layout.reserve(blocks.len());
    pack_full_with(blocks, capacity, |b, dst| layout.push((dst, b.len)));
    // Already sorted without pins (every block packs in address order).
    if !layout.windows(2).all(|w| w[0] <= w[1]) {
        layout.sort_unstable();
    }
    largest_aligned_hole(layout, capacity, align)
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
    plan_targeted_in(blocks, capacity, req, &mut Scratch::default())
}

/// [`plan_targeted`] with its tables in `scratch`.
pub fn plan_targeted_in(
    blocks: &[LiveBlock],
    capacity: u64,
    req: Request,
    scratch: &mut Scratch,
) -> Option<Plan> {
    if req.size == 0 || req.size > capacity {
        return None;
    }
    let Scratch {
        holes,
        copied,
        pins,
        ..
    } = scratch;
    holes_of(blocks, capacity, holes);
    let slide = plan_slide(blocks, holes, req, copied, pins);
    let evac = plan_evacuate(
        blocks,
        holes,
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
#[derive(Debug, Clone, Default)]
struct Holes {
    spans: Vec<(u64, u64)>,
    before: Vec<usize>,
}

/// Fills `holes` with the holes of `blocks`.
fn holes_of(blocks: &[LiveBlock], capacity: u64, holes: &mut Holes) {
    let Holes { spans, before } = holes;
    spans.clear();
    before.clear();
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
}

/// Slide: pick holes `a..=b` (no pinned block between them) whose sizes sum
/// to the request with the fewest block bytes between them; those blocks
/// slide down to the start of hole `a`, merging the holes at the top.
fn plan_slide(
    blocks: &[LiveBlock],
    holes: &Holes,
    req: Request,
    copied: &mut Vec<u64>,
    pins: &mut Vec<u32>,
) -> Option<Plan> {
    let n = holes.spans.len();
    if n == 0 {
        return None;
    }
    // Prefix sums over blocks: copied bytes and pin counts.
    copied.clear();
    pins.clear();
    copied.reserve(blocks.len() + 1);
    pins.reserve(blocks.len() + 1);
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
/// may not pack; windows whose blocks outweigh the free bytes outside them
/// cannot pack at all and are never among those few.
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
    // Bytes of the blocks overlapping the window, and of all holes: a
    // window whose blocks outweigh the free bytes outside it cannot be
    // evacuated, so it never takes a candidate's place.
    let mut inside_len = 0u64;
    let total_free = holes
        .spans
        .iter()
        .fold(0u64, |a, &(s, e)| a.saturating_add(e - s));
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
                inside_len += blocks[*hi].len;
                *pinned += u32::from(blocks[*hi].pinned);
                *hi += 1;
            }
            while *lo < *hi && blocks[*lo].end() <= x {
                *cost -= blocks[*lo].copy_len;
                inside_len -= blocks[*lo].len;
                *pinned -= u32::from(blocks[*lo].pinned);
                *lo += 1;
            }
            // Block bytes inside the window proper (edge blocks clipped),
            // hence the free bytes inside it and outside it.
            let feasible = *lo == *hi || {
                let over_lo = x.saturating_sub(blocks[*lo].offset);
                let over_hi = blocks[*hi - 1].end().saturating_sub(end);
                let clipped = inside_len.saturating_sub(over_lo).saturating_sub(over_hi);
                let free_inside = req.size.saturating_sub(clipped);
                inside_len <= total_free.saturating_sub(free_inside)
            };
            if *pinned == 0 && feasible && beat.is_none_or(|b| *cost < b) {
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
mod tests;
