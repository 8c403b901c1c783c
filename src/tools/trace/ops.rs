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

use super::{Action, TraceEvent};

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
    /// Free events of addresses not live (allocated before recording began,
    /// or by a lost event); skipped. Counted once per block even when both
    /// free events appear.
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
        out
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

/// What the builder knows about one address.
#[derive(Clone, Copy, Default)]
struct AddrState {
    /// Id of the live block at this address.
    live: Option<u32>,
    /// The block here was freed at a `free_requested`; the matching
    /// `free_completed` is still to come and must be ignored.
    awaiting_completed: bool,
}

/// For each `free_requested` event (by index) on `device`: whether a
/// `free_completed` of the same address follows before the next alloc of
/// that address. One backward pass.
fn completed_follows(events: &[TraceEvent], device: u32) -> Vec<bool> {
    let mut out = vec![false; events.len()];
    let mut seen: HashMap<u64, bool> = HashMap::new();
    for (i, e) in events.iter().enumerate().rev() {
        if e.device != device {
            continue;
        }
        match e.action {
            Action::FreeCompleted => {
                seen.insert(e.addr, true);
            }
            Action::Alloc => {
                seen.insert(e.addr, false);
            }
            Action::FreeRequested => {
                out[i] = seen.get(&e.addr).copied().unwrap_or(false);
            }
            _ => {}
        }
    }
    out
}

pub(super) fn build(events: &[TraceEvent], device: u32, free_point: FreePoint) -> Ops {
    let mut out = Ops {
        device,
        ..Ops::default()
    };
    let has_completed = match free_point {
        FreePoint::Completed => completed_follows(events, device),
        FreePoint::FirstFree => Vec::new(),
    };
    let mut addrs: HashMap<u64, AddrState> = HashMap::new();
    let mut live_bytes: u64 = 0;

    // Emits one op; keeps the parallel arrays and the peak in step.
    fn push(out: &mut Ops, op: Op, event: usize, time_us: i64, live_bytes: u64) {
        out.ops.push(op);
        out.event_index.push(event as u64);
        out.time_us.push(time_us);
        if live_bytes > out.peak_live_bytes {
            out.peak_live_bytes = live_bytes;
            out.peak_op = out.ops.len() - 1;
        }
    }
    fn free(out: &mut Ops, id: u32, event: usize, time_us: i64, live_bytes: &mut u64) {
        let size = out.sizes.get(id as usize).copied().unwrap_or(0);
        *live_bytes = live_bytes.saturating_sub(size);
        push(out, Op::Free { id }, event, time_us, *live_bytes);
    }

    for (i, e) in events.iter().enumerate() {
        if e.device != device {
            continue;
        }
        match e.action {
            Action::Alloc => {
                let Ok(id) = u32::try_from(out.sizes.len()) else {
                    out.truncated_at_event = Some(i as u64);
                    break;
                };
                let st = addrs.entry(e.addr).or_default();
                if let Some(prev) = st.live.take() {
                    out.implicit_frees += 1;
                    free(&mut out, prev, i, e.time_us, &mut live_bytes);
                }
                let st = addrs.entry(e.addr).or_default();
                *st = AddrState {
                    live: Some(id),
                    awaiting_completed: false,
                };
                out.sizes.push(e.size);
                out.allocs += 1;
                out.total_alloc_bytes = out.total_alloc_bytes.saturating_add(e.size);
                live_bytes = live_bytes.saturating_add(e.size);
                push(
                    &mut out,
                    Op::Alloc { id, size: e.size },
                    i,
                    e.time_us,
                    live_bytes,
                );
            }
            Action::FreeRequested => {
                if has_completed.get(i).copied().unwrap_or(false) {
                    // Completed mode: the free_completed that follows frees it.
                    continue;
                }
                let st = addrs.entry(e.addr).or_default();
                st.awaiting_completed = true;
                match st.live.take() {
                    Some(id) => {
                        out.frees += 1;
                        free(&mut out, id, i, e.time_us, &mut live_bytes);
                    }
                    None => out.skipped_frees += 1,
                }
            }
            Action::FreeCompleted => {
                let st = addrs.entry(e.addr).or_default();
                if std::mem::take(&mut st.awaiting_completed) {
                    // The companion of a free_requested already paired.
                    continue;
                }
                match st.live.take() {
                    Some(id) => {
                        out.frees += 1;
                        free(&mut out, id, i, e.time_us, &mut live_bytes);
                    }
                    None => out.skipped_frees += 1,
                }
            }
            _ => {}
        }
    }
    out.live_at_end = addrs.values().filter(|s| s.live.is_some()).count() as u64;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(action: &str, addr: u64, size: u64) -> TraceEvent {
        TraceEvent {
            action: Action::parse(action),
            addr,
            size,
            stream: 0,
            time_us: 0,
            device: 0,
        }
    }

    #[test]
    fn pairs_each_alloc_once_in_both_modes() {
        let events = vec![
            ev("free_requested", 9, 0), // allocated before recording
            ev("free_completed", 9, 0),
            ev("alloc", 1, 100),
            ev("alloc", 2, 50),
            ev("free_requested", 1, 100),
            ev("alloc", 3, 10),
            ev("free_completed", 1, 100),
            ev("alloc", 1, 30), // address reused
            ev("free_requested", 1, 30),
            ev("free_completed", 1, 30),
            ev("free_requested", 3, 10), // no free_completed follows
        ];
        for fp in [FreePoint::Completed, FreePoint::FirstFree] {
            let ops = build(&events, 0, fp);
            assert_eq!(ops.allocs, 4, "{fp:?}");
            assert_eq!(ops.frees, 3, "{fp:?}");
            assert_eq!(ops.skipped_frees, 1, "{fp:?}");
            assert_eq!(ops.live_at_end, 1, "{fp:?}");
            assert_eq!(ops.implicit_frees, 0);
            assert_eq!(ops.ops.len(), ops.event_index.len());
        }
        let done = build(&events, 0, FreePoint::Completed);
        let first = build(&events, 0, FreePoint::FirstFree);
        // Block 1 (100 B) is reusable only at event 6, after alloc 3.
        assert_eq!(done.peak_live_bytes, 160);
        assert_eq!(first.peak_live_bytes, 150);
        assert_eq!(done.event_index[3], 6);
        assert_eq!(first.event_index[2], 4);
    }

    #[test]
    fn implicit_free_and_rounding() {
        let events = vec![ev("alloc", 1, 100), ev("alloc", 1, 300), ev("alloc", 2, 1)];
        let ops = build(&events, 0, FreePoint::Completed);
        assert_eq!(ops.implicit_frees, 1);
        assert_eq!(ops.peak_live_bytes, 301);
        assert_eq!(ops.peak_live_rounded(256), 512 + 256);
        assert_eq!(ops.peak_live_rounded(0), 301);
        assert!(build(&events, 1, FreePoint::Completed).is_empty());
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
    }
}
