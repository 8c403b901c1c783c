//! The allocator's state when recording began, reconstructed from the
//! snapshot: the segments at the dump less those the trace allocated, plus
//! those it freed (for expandable segments, the mapped pages likewise), and
//! in them the blocks live before recording (as the alloc/free program
//! finds them), every gap between them a free block.

use std::collections::{BTreeMap, HashMap};

use super::blocks::{Block, Id};
use super::caching::{Expandable, Model, LARGE_BUFFER, SMALL_BUFFER};
use crate::trace::pairing::Initial;
use crate::trace::{Action, Trace};
use crate::Result;

/// A block live when recording began.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LiveBlock {
    pub(crate) addr: u64,
    /// Its block size (from `segments`, else the request rounded).
    pub(crate) size: u64,
    /// Bytes asked for (a fresh start allocates these).
    pub(crate) requested: u64,
    pub(crate) stream: u64,
}

/// The blocks live when recording began, in address order, from the
/// program builder's [`Initial`] and the snapshot's `segments`.
pub(crate) fn live_blocks(
    trace: &Trace,
    device: u32,
    initial: &Initial,
    model: &Model,
) -> Vec<LiveBlock> {
    let mut dump: HashMap<u64, (u64, u64, u64)> = HashMap::new();
    for s in trace
        .segments
        .iter()
        .flatten()
        .filter(|s| s.device == device)
    {
        for b in &s.blocks {
            dump.insert(b.address, (b.size, b.requested_size, s.stream as u64));
        }
    }
    initial
        .blocks
        .iter()
        .map(|&(addr, size, freed_at)| match freed_at {
            // Freed in the trace: the free event gives the request.
            Some(event) => {
                let stream = trace
                    .events
                    .get(event as usize)
                    .map_or(0, |e| e.stream as u64);
                LiveBlock {
                    addr,
                    size: model.settings.round_size(size),
                    requested: size,
                    stream,
                }
            }
            None => {
                let (bsize, requested, stream) =
                    dump.get(&addr).copied().unwrap_or((size, size, 0));
                LiveBlock {
                    addr,
                    size: bsize,
                    requested,
                    stream,
                }
            }
        })
        .collect()
}

/// A range of a segment being laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    Live,
    Free,
    Unmapped,
}

/// A segment (or an expandable segment's pool) at the start.
#[derive(Debug, Clone)]
struct SegmentStart {
    addr: u64,
    size: u64,
    stream: u64,
    small: bool,
}

/// The non-expandable segments of `device` when recording began.
fn segments_at_start(trace: &Trace, device: u32) -> Vec<SegmentStart> {
    let mut segs: BTreeMap<u64, SegmentStart> = BTreeMap::new();
    for s in trace.segments.iter().flatten() {
        if s.device == device && !s.expandable {
            segs.insert(
                s.address,
                SegmentStart {
                    addr: s.address,
                    size: s.total_size,
                    stream: s.stream as u64,
                    small: s.is_small.unwrap_or(s.total_size == SMALL_BUFFER),
                },
            );
        }
    }
    for e in trace.events.iter().rev().filter(|e| e.device == device) {
        match e.action {
            Action::SegmentAlloc => {
                segs.remove(&e.addr);
            }
            // A small pool's segments are 2 MiB, a large pool's never are.
            Action::SegmentFree => {
                segs.insert(
                    e.addr,
                    SegmentStart {
                        addr: e.addr,
                        size: e.size,
                        stream: e.stream as u64,
                        small: e.size == SMALL_BUFFER,
                    },
                );
            }
            _ => {}
        }
    }
    segs.into_values().collect()
}

/// Per `(stream, small pool)`: the lowest address seen and the mapped
/// ranges (start -> end).
type Groups = BTreeMap<(u64, bool), (u64, BTreeMap<u64, u64>)>;

/// The expandable segments of `device` when recording began: per stream
/// and pool, the lowest address seen (taken as the range's start) and the
/// mapped ranges `(start, end)`.
fn expandable_at_start(trace: &Trace, device: u32) -> Vec<(SegmentStart, Vec<(u64, u64)>)> {
    let mut groups: Groups = BTreeMap::new();
    let seen = |g: &mut Groups, key, addr| {
        let e = g.entry(key).or_insert((u64::MAX, BTreeMap::new()));
        e.0 = e.0.min(addr);
    };
    for s in trace.segments.iter().flatten() {
        if s.device == device && s.expandable {
            let key = (s.stream as u64, s.is_small.unwrap_or(false));
            seen(&mut groups, key, s.address);
            if let Some(g) = groups.get_mut(&key) {
                add_range(&mut g.1, s.address, s.address + s.total_size);
            }
        }
    }
    let dev = || trace.events.iter().filter(|e| e.device == device);
    // A small pool maps one 2 MiB page per request, a large pool 20 MiB
    // multiples: maps name their pool.
    for e in dev().filter(|e| e.action == Action::SegmentMap) {
        seen(
            &mut groups,
            (e.stream as u64, e.size < LARGE_BUFFER),
            e.addr,
        );
    }
    // Unmaps go to the pool of the stream whose range starts closest below.
    let pool_of = |groups: &Groups, stream: u64, addr: u64| {
        groups
            .iter()
            .filter(|((s, _), (min, _))| *s == stream && *min <= addr)
            .max_by_key(|(_, (min, _))| *min)
            .map(|(k, _)| *k)
            .unwrap_or((stream, false))
    };
    for e in trace.events.iter().rev().filter(|e| e.device == device) {
        let stream = e.stream as u64;
        match e.action {
            Action::SegmentMap => {
                let key = (stream, e.size < LARGE_BUFFER);
                if let Some(g) = groups.get_mut(&key) {
                    remove_range(&mut g.1, e.addr, e.addr + e.size);
                }
            }
            Action::SegmentUnmap => {
                let key = pool_of(&groups, stream, e.addr);
                seen(&mut groups, key, e.addr);
                if let Some(g) = groups.get_mut(&key) {
                    add_range(&mut g.1, e.addr, e.addr + e.size);
                }
            }
            _ => {}
        }
    }
    groups
        .into_iter()
        .map(|((stream, small), (base, ranges))| {
            let seg = SegmentStart {
                addr: base,
                size: 0,
                stream,
                small,
            };
            (seg, ranges.into_iter().collect())
        })
        .collect()
}

fn add_range(set: &mut BTreeMap<u64, u64>, mut a: u64, mut e: u64) {
    let touching: Vec<(u64, u64)> = set
        .range(..=e)
        .filter(|&(&s, &t)| t >= a && s <= e)
        .map(|(&s, &t)| (s, t))
        .collect();
    for (s, t) in touching {
        set.remove(&s);
        a = a.min(s);
        e = e.max(t);
    }
    set.insert(a, e);
}

fn remove_range(set: &mut BTreeMap<u64, u64>, a: u64, e: u64) {
    let overlapping: Vec<(u64, u64)> = set
        .range(..e)
        .filter(|&(_, &t)| t > a)
        .map(|(&s, &t)| (s, t))
        .collect();
    for (s, t) in overlapping {
        set.remove(&s);
        if s < a {
            set.insert(s, a);
        }
        if t > e {
            set.insert(e, t);
        }
    }
}

/// Lays out `[start, end)` of one segment as pieces: the live blocks in it
/// (clipped to what follows), free gaps between them. Returns the pieces
/// and the live blocks used (index into `live`).
fn lay_out(
    start: u64,
    end: u64,
    live: &[LiveBlock],
    used: &mut [bool],
    out: &mut Vec<(u64, u64, Piece, Option<usize>)>,
) {
    let from = live.partition_point(|b| b.addr < start);
    let mut cursor = start;
    for (i, b) in live.iter().enumerate().skip(from) {
        if b.addr >= end {
            break;
        }
        if b.addr < cursor || used[i] {
            continue;
        }
        if b.addr > cursor {
            out.push((cursor, b.addr - cursor, Piece::Free, None));
        }
        let next = live
            .get(i + 1)
            .map_or(end, |n| n.addr.clamp(b.addr + 1, end));
        let stop = b.addr.saturating_add(b.size.max(1)).min(next).min(end);
        out.push((b.addr, stop - b.addr, Piece::Live, Some(i)));
        used[i] = true;
        cursor = stop;
    }
    if cursor < end {
        out.push((cursor, end - cursor, Piece::Free, None));
    }
}

/// Makes the blocks of one segment from its pieces, linked in address
/// order; live ones are handed out, the others go to the pool. Returns the
/// live blocks' ids by index into `live`.
fn make_chain(
    model: &mut Model,
    pieces: &[(u64, u64, Piece, Option<usize>)],
    stream: u64,
    small: bool,
    expandable: Option<u32>,
    ids: &mut HashMap<usize, Id>,
) -> Result<()> {
    let mut prev: Option<Id> = None;
    for &(addr, size, piece, live) in pieces {
        let mut b = Block::new(addr, size, stream, small);
        b.expandable = expandable;
        b.mapped = piece != Piece::Unmapped;
        b.allocated = piece == Piece::Live;
        b.prev = prev;
        let id = model.blocks.add(b)?;
        if let Some(p) = prev {
            model.blocks.get_mut(p).next = Some(id);
        }
        prev = Some(id);
        if let Some(i) = live {
            ids.insert(i, id);
            model.allocated += size;
        }
    }
    // Into the pools once the links are final (a pool orders by size).
    let mut cur = prev;
    while let Some(id) = cur {
        if !model.blocks.get(id).allocated {
            model.blocks.insert(id);
        }
        cur = model.blocks.get(id).prev;
    }
    Ok(())
}

/// The model's state when recording began, for the settings it was
/// recorded with: returns the live blocks' ids by address, and the live
/// blocks that fit in no segment (allocated afresh by the caller).
pub(crate) fn recorded_start(
    model: &mut Model,
    trace: &Trace,
    device: u32,
    live: &[LiveBlock],
) -> Result<(HashMap<u64, Id>, Vec<LiveBlock>)> {
    let mut used = vec![false; live.len()];
    let mut ids: HashMap<usize, Id> = HashMap::new();
    let mut pieces = Vec::new();
    for seg in segments_at_start(trace, device) {
        pieces.clear();
        lay_out(seg.addr, seg.addr + seg.size, live, &mut used, &mut pieces);
        make_chain(model, &pieces, seg.stream, seg.small, None, &mut ids)?;
        model.add_segment(seg.addr, seg.size);
    }
    for (seg, ranges) in expandable_at_start(trace, device) {
        let page = if seg.small {
            SMALL_BUFFER
        } else {
            LARGE_BUFFER
        };
        let es = u32::try_from(model.expandable.len()).unwrap_or(u32::MAX);
        model.expandable.push(Expandable {
            base: seg.addr,
            page,
        });
        pieces.clear();
        let mut cursor = seg.addr;
        for &(a, e) in &ranges {
            if a > cursor {
                pieces.push((cursor, a - cursor, Piece::Unmapped, None));
            }
            lay_out(a, e, live, &mut used, &mut pieces);
            model.reserved += e - a;
            cursor = e;
        }
        let space = super::expandable::address_space(page);
        if cursor < seg.addr + space {
            pieces.push((cursor, seg.addr + space - cursor, Piece::Unmapped, None));
        }
        make_chain(model, &pieces, seg.stream, seg.small, Some(es), &mut ids)?;
    }
    let placed = ids.into_iter().map(|(i, id)| (live[i].addr, id)).collect();
    let unplaced = live
        .iter()
        .zip(&used)
        .filter(|(_, u)| !**u)
        .map(|(b, _)| *b)
        .collect();
    Ok((placed, unplaced))
}
