//! From events to an alloc/free program.
//!
//! PyTorch records a free twice: `free_requested` when the tensor lets go
//! (its `allocated_bytes` drops there) and `free_completed` when the block
//! is reusable (later, if other streams still used it). Each alloc is paired
//! with exactly one of them, chosen by [`FreePoint`]; the other is ignored,
//! so a block is never freed twice. Addresses are reused after a free, so
//! pairing is by address *and* order: an alloc pairs with the next free of
//! its address.

use std::collections::HashMap;

use super::pairing::{initial_blocks, insert, pair, Initial};
use super::MemoryBudget;
use super::{Action, Segment, TraceEvent};
use crate::Result;

/// What the budget calls the program's memory.
pub(super) const WHAT: &str = "memory for the alloc/free program, in bytes";

/// Where a program frees a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FreePoint {
    /// At the `free_completed` that follows the alloc, where the memory is
    /// reusable; at the `free_requested` when no `free_completed` follows
    /// (before the next alloc of that address). The honest replay: a block
    /// still used by another stream must not be reused (or moved).
    #[default]
    Completed,
    /// At the first free event of the block, whichever kind; the second is
    /// ignored. This matches PyTorch's `allocated_bytes` accounting.
    FirstFree,
}

/// One step of an alloc/free program. Ids are dense, `0..allocs`, in alloc
/// order, so a replay maps them to handles with a `Vec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Allocate block `id` of `size` bytes (as recorded; 0 is possible).
    Alloc {
        /// Dense block id.
        id: u32,
        /// Bytes as recorded.
        size: u64,
    },
    /// Free block `id`.
    Free {
        /// Dense block id of an earlier [`Op::Alloc`].
        id: u32,
    },
}

/// An alloc/free program with the event each op came from and summary
/// numbers. `ops`, `event_index` and `time_us` are parallel arrays.
#[derive(Debug, Clone, Default)]
pub struct Ops {
    /// Device the program was built for.
    pub device: u32,
    /// The program.
    pub ops: Vec<Op>,
    /// For each op, the index in [`super::Trace::events`] of its event.
    pub event_index: Vec<u64>,
    /// For each op, the event's `time_us`.
    pub time_us: Vec<i64>,
    /// Size of each block, indexed by id.
    pub sizes: Vec<u64>,
    /// Number of [`Op::Alloc`].
    pub allocs: u64,
    /// Number of [`Op::Free`] that came from a free event.
    pub frees: u64,
    /// Free events of addresses not live; skipped. A trace's program matches
    /// them against blocks live before recording (see `initial_blocks`), so
    /// only [`Ops::from_ops`] counts any.
    pub skipped_frees: u64,
    /// Allocs of an address that was still live: the earlier block's free
    /// was not recorded, so it is freed just before (an [`Op::Free`]).
    pub implicit_frees: u64,
    /// Blocks never freed; they stay live to the end.
    pub live_at_end: u64,
    /// Peak of the sum of live sizes, as recorded.
    pub peak_live_bytes: u64,
    /// Index in `ops` just after which the peak was first reached.
    pub peak_op: usize,
    /// Sum of all allocation sizes, as recorded.
    pub total_alloc_bytes: u64,
    /// The first event not turned into an op because ids ran past `u32`
    /// (`None`: the whole trace was used).
    pub truncated_at_event: Option<u64>,
    /// Blocks live when recording began: the program's first
    /// `initial_blocks` allocs (ids `0..initial_blocks`, at the device's
    /// first event).
    pub initial_blocks: u64,
    /// Their bytes.
    pub initial_bytes: u64,
    /// Of those, the ones found active in `segments` at the dump that the
    /// trace never frees (the others are freed in the trace).
    pub initial_from_segments: u64,
    /// Frees in the trace matched against blocks live before recording.
    pub initial_frees: u64,
    /// `free_requested` events with no `free_completed` by the end of the
    /// trace ([`FreePoint::Completed`]): their blocks stay live to the end.
    pub pending_at_end: u64,
    /// Blocks live at the end given the larger size `segments` holds for
    /// them.
    pub resized_at_end: u64,
    /// Bytes live at the end of the program.
    pub live_bytes_at_end: u64,
}

impl Ops {
    /// Number of ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True for an empty program.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Peak live bytes with every size rounded up to a multiple of `align`
    /// (0 or 1: as recorded). Saturates at `u64::MAX`.
    pub fn peak_live_rounded(&self, align: u64) -> u64 {
        let round = |s: u64| round_up(s, align);
        let mut live: u64 = 0;
        let mut peak: u64 = 0;
        for op in &self.ops {
            match *op {
                Op::Alloc { size, .. } => {
                    live = live.saturating_add(round(size));
                    peak = peak.max(live);
                }
                Op::Free { id } => {
                    let size = self.sizes.get(id as usize).copied().unwrap_or(0);
                    live = live.saturating_sub(round(size));
                }
            }
        }
        peak
    }

    /// Recomputes the summary from the ops and sizes: each alloc takes its
    /// block's size, then peak, totals and what is live at the end.
    pub(crate) fn finish(&mut self, budget: &mut MemoryBudget) -> Result<()> {
        let mut live_flag = budget.vec_of(self.sizes.len(), false, WHAT)?;
        let mut live: u64 = 0;
        self.peak_live_bytes = 0;
        self.peak_op = 0;
        self.total_alloc_bytes = 0;
        for (i, op) in self.ops.iter_mut().enumerate() {
            match op {
                Op::Alloc { id, size } => {
                    let s = self.sizes.get(*id as usize).copied().unwrap_or(*size);
                    *size = s;
                    if let Some(f) = live_flag.get_mut(*id as usize) {
                        *f = true;
                    }
                    live = live.saturating_add(s);
                    self.total_alloc_bytes = self.total_alloc_bytes.saturating_add(s);
                }
                Op::Free { id } => {
                    if let Some(f) = live_flag.get_mut(*id as usize) {
                        if std::mem::take(f) {
                            live = live.saturating_sub(self.sizes[*id as usize]);
                        }
                    }
                }
            }
            if live > self.peak_live_bytes {
                self.peak_live_bytes = live;
                self.peak_op = i;
            }
        }
        self.live_at_end = live_flag.iter().filter(|&&f| f).count() as u64;
        self.live_bytes_at_end = live;
        Ok(())
    }

    /// Appends one op made from event `event` (at `time_us`), with room
    /// reserved in the three parallel arrays first.
    pub(super) fn push(
        &mut self,
        op: Op,
        event: u64,
        time_us: i64,
        budget: &mut MemoryBudget,
    ) -> Result<()> {
        budget.reserve(&mut self.ops, 1, WHAT)?;
        budget.reserve(&mut self.event_index, 1, WHAT)?;
        budget.reserve(&mut self.time_us, 1, WHAT)?;
        self.ops.push(op);
        self.event_index.push(event);
        self.time_us.push(time_us);
        Ok(())
    }

    /// Builds a program from explicit ops (synthetic workloads, tests).
    /// Ids must be dense and in alloc order (an alloc whose id is not the
    /// next one is dropped); a free of an unknown or freed id is dropped and
    /// counted in `skipped_frees`. Event indices are the
    /// op indices, times zero.
    pub fn from_ops(ops: impl IntoIterator<Item = Op>) -> Ops {
        let mut out = Ops::default();
        let mut live_flag: Vec<bool> = Vec::new();
        let mut live: u64 = 0;
        for op in ops {
            match op {
                Op::Alloc { id, size } if id as usize == out.sizes.len() => {
                    out.sizes.push(size);
                    live_flag.push(true);
                    out.allocs += 1;
                    out.total_alloc_bytes = out.total_alloc_bytes.saturating_add(size);
                    live = live.saturating_add(size);
                }
                // An id out of order would break the dense id -> handle map.
                Op::Alloc { .. } => continue,
                Op::Free { id } => match live_flag.get_mut(id as usize) {
                    Some(flag) if *flag => {
                        *flag = false;
                        out.frees += 1;
                        live = live.saturating_sub(out.sizes[id as usize]);
                    }
                    _ => {
                        out.skipped_frees += 1;
                        continue;
                    }
                },
            }
            out.event_index.push(out.ops.len() as u64);
            out.time_us.push(0);
            out.ops.push(op);
            if live > out.peak_live_bytes {
                out.peak_live_bytes = live;
                out.peak_op = out.ops.len() - 1;
            }
        }
        out.live_at_end = live_flag.iter().filter(|&&f| f).count() as u64;
        out.live_bytes_at_end = live;
        out
    }

    /// The program run `passes` times in a row, as a longer run of the same
    /// workload: each pass first frees what the pass before left live, takes
    /// ids after the pass before's, and starts one millisecond after the
    /// pass before ended (on the program's own clock; a program without
    /// time stays without). `None` where the ids would not fit in `u32` or
    /// the memory for `passes` times the program's ops cannot be reserved.
    pub fn repeated(&self, passes: u32) -> Option<Ops> {
        let n = u32::try_from(self.sizes.len()).ok()?;
        n.checked_mul(passes)?;
        let timed = self.time_us.len() == self.ops.len();
        let first = self.time_us.first().copied().unwrap_or(0);
        let last = self.time_us.iter().copied().max().unwrap_or(0);
        let span = last.saturating_sub(first).saturating_add(1000);
        // Each pass: its ops, and at most one free per id of the pass before.
        let total = (self.ops.len() + self.sizes.len()).checked_mul(passes as usize)?;
        let mut ops = Vec::new();
        ops.try_reserve_exact(total).ok()?;
        let mut times: Vec<i64> = Vec::new();
        times.try_reserve_exact(total).ok()?;
        let mut live = vec![false; n as usize];
        for pass in 0..passes {
            let base = pass * n;
            let shift = span.saturating_mul(i64::from(pass));
            // What the pass before left live goes first.
            for (id, l) in live.iter_mut().enumerate() {
                if std::mem::take(l) {
                    ops.push(Op::Free {
                        id: base - n + id as u32,
                    });
                    times.push(shift.saturating_add(first));
                }
            }
            for (i, &op) in self.ops.iter().enumerate() {
                ops.push(match op {
                    Op::Alloc { id, size } => {
                        live[id as usize] = true;
                        Op::Alloc {
                            id: base + id,
                            size,
                        }
                    }
                    Op::Free { id } => {
                        live[id as usize] = false;
                        Op::Free { id: base + id }
                    }
                });
                times.push(shift.saturating_add(self.time_us.get(i).copied().unwrap_or(0)));
            }
        }
        let mut out = Ops::from_ops(ops);
        out.device = self.device;
        if timed && out.ops.len() == times.len() {
            out.time_us = times;
        }
        Some(out)
    }
}

/// `size` rounded up to a multiple of `align` (0 or 1: unchanged),
/// saturating.
pub(crate) fn round_up(size: u64, align: u64) -> u64 {
    if align <= 1 {
        return size;
    }
    match size % align {
        0 => size,
        r => size.saturating_add(align - r),
    }
}

pub(super) fn build(
    events: &[TraceEvent],
    segments: Option<&[Segment]>,
    device: u32,
    free_point: FreePoint,
    budget: &mut MemoryBudget,
) -> Result<Ops> {
    // A program holds, per alloc, an op, its event index and time, and a
    // size (40 bytes): refused before any work when those alone pass the
    // budget.
    let allocs = events
        .iter()
        .filter(|e| e.device == device && e.action == Action::Alloc)
        .count() as u64;
    let alloc_bytes = (std::mem::size_of::<Op>() + 24) as u64;
    if allocs.saturating_mul(alloc_bytes) > budget.limit() {
        return Err(budget.exceeded(WHAT, allocs.saturating_mul(alloc_bytes)));
    }
    let Initial {
        blocks: initial,
        active,
    } = initial_blocks(events, segments, device, free_point, budget)?;

    let mut base = Ops {
        device,
        ..Ops::default()
    };
    let (first_event, first_time) = events
        .iter()
        .enumerate()
        .find(|(_, e)| e.device == device)
        .map_or((0, 0), |(i, e)| (i as u64, e.time_us));
    let mut seeds = HashMap::new();
    for (id, &(_, size, freed_at)) in initial.iter().enumerate() {
        let Ok(id) = u32::try_from(id) else { break };
        budget.reserve(&mut base.sizes, 1, WHAT)?;
        base.sizes.push(size);
        base.push(Op::Alloc { id, size }, first_event, first_time, budget)?;
        base.initial_blocks += 1;
        base.initial_bytes = base.initial_bytes.saturating_add(size);
        match freed_at {
            Some(event) => insert(&mut seeds, event, id, budget)?,
            None => base.initial_from_segments += 1,
        }
    }
    drop(initial);
    let k = base.initial_blocks;
    let mut second = pair(events, device, free_point, base, &seeds, budget)?;
    let mut out = std::mem::take(&mut second.ops);

    // Blocks live at the dump take the block size `segments` gives them.
    for (addr, id) in &second.live {
        let Some(&held) = active.get(addr) else {
            continue;
        };
        if let Some(size) = out.sizes.get_mut(*id as usize) {
            if held > *size && u64::from(*id) >= k {
                *size = held;
                out.resized_at_end += 1;
            }
        }
    }
    out.initial_frees = out
        .ops
        .iter()
        .filter(|op| matches!(op, Op::Free { id } if u64::from(*id) < k))
        .count() as u64;
    out.finish(budget)?;
    Ok(out)
}
#[cfg(test)]
mod tests {
    use super::*;

    /// The program, under a budget as for a 1 MiB file.
    fn b(events: &[TraceEvent], segments: Option<&[Segment]>, device: u32, at: FreePoint) -> Ops {
        let mut budget = MemoryBudget::for_input(1 << 20, "test");
        build(events, segments, device, at, &mut budget).unwrap()
    }

    fn ev(action: &str, addr: u64, size: u64) -> TraceEvent {
        TraceEvent {
            action: Action::parse(action).unwrap(),
            addr,
            size,
            stream: 0,
            time_us: 0,
            device: 0,
        }
    }

    fn block(address: u64, size: u64, state: BlockState) -> Block {
        Block {
            address,
            size,
            requested_size: size,
            state,
        }
    }

    use super::super::{Block, BlockState};

    #[test]
    fn pairs_each_alloc_once_in_both_modes() {
        let events = vec![
            ev("free_requested", 9, 8), // allocated before recording
            ev("free_completed", 9, 8),
            ev("alloc", 1, 100),
            ev("alloc", 2, 50),
            ev("free_requested", 1, 100),
            ev("alloc", 3, 10),
            ev("free_completed", 1, 100),
            ev("alloc", 1, 30), // address reused
            ev("free_requested", 1, 30),
            ev("free_completed", 1, 30),
            ev("free_requested", 3, 10), // still pending at the end
        ];
        let done = b(&events, None, 0, FreePoint::Completed);
        let first = b(&events, None, 0, FreePoint::FirstFree);
        for ops in [&done, &first] {
            assert_eq!(ops.allocs, 4);
            assert_eq!(ops.initial_blocks, 1);
            assert_eq!(ops.initial_bytes, 8);
            assert_eq!(ops.initial_frees, 1);
            assert_eq!(ops.skipped_frees, 0);
            assert_eq!(ops.implicit_frees, 0);
            assert_eq!(ops.ops.len(), ops.event_index.len());
            assert_eq!(ops.ops[0], Op::Alloc { id: 0, size: 8 });
        }
        // Completed: block 3's free is still pending at the end.
        assert_eq!(
            (done.frees, done.pending_at_end, done.live_at_end),
            (3, 1, 2)
        );
        assert_eq!(done.live_bytes_at_end, 60);
        assert_eq!((first.frees, first.live_at_end), (4, 1));
        // Block 1 (100 B) is reusable only at event 6, after alloc 3; the
        // initial 8 B are freed at event 1 (Completed) or 0 (first free).
        assert_eq!(done.peak_live_bytes, 160);
        assert_eq!(first.peak_live_bytes, 150);
        assert_eq!(done.event_index[5], 6);
        assert_eq!(first.event_index[1], 0);
    }

    #[test]
    fn segments_give_the_blocks_live_before_recording() {
        use super::super::Segment;
        let events = vec![
            ev("alloc", 1000, 100),
            ev("free_requested", 500, 40), // initial, freed
            ev("free_completed", 500, 40),
            ev("alloc", 2000, 10), // live at the end, a 512 B block
        ];
        let seg = Segment {
            device: 0,
            address: 0,
            total_size: 4096,
            stream: 0,
            expandable: false,
            is_small: None,
            blocks: vec![
                block(0, 300, BlockState::ActiveAllocated), // weights: initial
                block(500, 40, BlockState::Inactive),
                block(1000, 100, BlockState::Inactive),
                block(2000, 512, BlockState::ActiveAllocated),
            ],
        };
        // Event 0's block is freed with no record: the segment says inactive.
        let ops = b(
            &events,
            Some(std::slice::from_ref(&seg)),
            0,
            FreePoint::Completed,
        );
        assert_eq!(ops.initial_blocks, 2);
        assert_eq!(ops.initial_from_segments, 1);
        assert_eq!(ops.initial_bytes, 340);
        assert_eq!(ops.initial_frees, 1);
        assert_eq!(ops.resized_at_end, 1);
        // Live at the end: 300 (initial) + 512 (resized) + 100 (never freed).
        assert_eq!(ops.live_bytes_at_end, 912);
        assert_eq!(ops.peak_live_bytes, 300 + 40 + 100 + 512 - 40);
        let other = Segment { device: 1, ..seg };
        let ops = b(&events, Some(&[other]), 0, FreePoint::Completed);
        assert_eq!((ops.initial_blocks, ops.resized_at_end), (1, 0));
    }

    #[test]
    fn implicit_free_and_rounding() {
        let events = vec![ev("alloc", 1, 100), ev("alloc", 1, 300), ev("alloc", 2, 1)];
        let ops = b(&events, None, 0, FreePoint::Completed);
        assert_eq!(ops.implicit_frees, 1);
        assert_eq!(ops.peak_live_bytes, 301);
        assert_eq!(ops.peak_live_rounded(256), 512 + 256);
        assert_eq!(ops.peak_live_rounded(0), 301);
        assert!(b(&events, None, 1, FreePoint::Completed).is_empty());
    }

    #[test]
    fn a_repeated_program_frees_each_pass_and_follows_its_clock() {
        let mut ops = Ops::from_ops([
            Op::Alloc { id: 0, size: 10 },
            Op::Alloc { id: 1, size: 5 },
            Op::Free { id: 0 },
        ]);
        ops.time_us = vec![100, 200, 300];
        let r = ops.repeated(3).unwrap();
        assert_eq!(r.len(), 3 * 3 + 2);
        assert_eq!(r.peak_live_bytes, 15);
        assert_eq!(r.live_at_end, 1);
        assert_eq!(r.skipped_frees, 0);
        // The second pass frees the first's block 1, then runs 1200 us on.
        assert_eq!(r.ops[3], Op::Free { id: 1 });
        assert_eq!(r.ops[4], Op::Alloc { id: 2, size: 10 });
        assert_eq!(&r.time_us[3..7], &[1300, 1300, 1400, 1500]);
        assert!(ops.repeated(u32::MAX).is_none());
    }

    #[test]
    fn from_ops_drops_bad_frees() {
        let ops = Ops::from_ops([
            Op::Alloc { id: 0, size: 10 },
            Op::Free { id: 0 },
            Op::Free { id: 0 },
            Op::Free { id: 7 },
            Op::Alloc { id: 1, size: 5 },
        ]);
        assert_eq!(ops.len(), 3);
        assert_eq!(ops.skipped_frees, 2);
        assert_eq!(ops.peak_live_bytes, 10);
        assert_eq!(ops.live_at_end, 1);
        assert_eq!(ops.live_bytes_at_end, 5);
    }
}
