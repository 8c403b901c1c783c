//! Pairing a trace's allocs with its frees: which free event frees each
//! block (see [`super::FreePoint`]), and which blocks were live before
//! recording began. Every map and vector is charged to the program's
//! memory budget.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use super::ops::{FreePoint, Op, Ops, WHAT};
use super::{Action, BlockState, MemoryBudget, Segment, TraceEvent};
use crate::Result;

/// Bytes charged per hash-map entry (key, value and the table's overhead).
const MAP_ENTRY_BYTES: u64 = 48;

/// What the builder knows about one address.
#[derive(Clone, Copy, Default)]
struct AddrState {
    /// Id of the live block at this address.
    live: Option<u32>,
    /// The block here was freed at a `free_requested`; the matching
    /// `free_completed` is still to come and must be ignored.
    awaiting_completed: bool,
}

/// What follows a `free_requested` on its address.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// A `free_completed`: that one frees the block.
    Completed,
    /// An `alloc` (the completion was not recorded) or nothing at all.
    Alloc,
    /// Nothing: the free was still pending at the dump.
    End,
}

/// Inserts into a map after a fallible reservation, charging new entries.
pub(super) fn insert<K: Eq + Hash, V>(
    map: &mut HashMap<K, V>,
    k: K,
    v: V,
    budget: &mut MemoryBudget,
) -> Result<()> {
    if map.len() == map.capacity() {
        budget.charge(MAP_ENTRY_BYTES * (map.len() as u64 / 2 + 16), WHAT)?;
        map.try_reserve(map.len() / 2 + 16)
            .map_err(|_| budget.exceeded(WHAT, u64::MAX))?;
    }
    map.insert(k, v);
    Ok(())
}

/// For each `free_requested` event (by index) on `device`: what comes next
/// on its address. One backward pass.
pub(crate) fn next_on_addr(
    events: &[TraceEvent],
    device: u32,
    budget: &mut MemoryBudget,
) -> Result<Vec<Next>> {
    let mut out = budget.vec_of(events.len(), Next::End, WHAT)?;
    let mut seen: HashMap<u64, Next> = HashMap::new();
    for (i, e) in events.iter().enumerate().rev() {
        if e.device != device {
            continue;
        }
        match e.action {
            Action::FreeCompleted => insert(&mut seen, e.addr, Next::Completed, budget)?,
            Action::Alloc => insert(&mut seen, e.addr, Next::Alloc, budget)?,
            Action::FreeRequested => {
                out[i] = seen.get(&e.addr).copied().unwrap_or(Next::End);
            }
            _ => {}
        }
    }
    Ok(out)
}

/// One pass of pairing over the events.
pub(super) struct Pass {
    pub(super) ops: Ops,
    /// Frees of addresses with no live block: `(addr, size, event)`, once
    /// per block.
    pub(super) unmatched: Vec<(u64, u64, u64)>,
    /// Address -> id of the blocks live at the end.
    pub(super) live: HashMap<u64, u32>,
}

/// Pairs allocs with frees; `seeds` maps the index of a free event that
/// finds no live block to the block live before recording it frees (its
/// alloc already in `base`).
pub(super) fn pair(
    events: &[TraceEvent],
    device: u32,
    free_point: FreePoint,
    base: Ops,
    seeds: &HashMap<u64, u32>,
    budget: &mut MemoryBudget,
) -> Result<Pass> {
    let mut out = base;
    let next = match free_point {
        FreePoint::Completed => next_on_addr(events, device, budget)?,
        FreePoint::FirstFree => Vec::new(),
    };
    // A trace with no completions at all (an old or hand-made one) frees
    // at the request; otherwise a request still pending at the end keeps
    // its block live to the end, as the memory was not reusable yet.
    let completes = events
        .iter()
        .any(|e| e.device == device && e.action == Action::FreeCompleted);
    let mut addrs: HashMap<u64, AddrState> = HashMap::new();
    let mut unmatched = Vec::new();

    for (i, e) in events.iter().enumerate() {
        if e.device != device {
            continue;
        }
        let (event, time) = (i as u64, e.time_us);
        if !addrs.contains_key(&e.addr)
            && matches!(
                e.action,
                Action::Alloc | Action::FreeRequested | Action::FreeCompleted
            )
        {
            insert(&mut addrs, e.addr, AddrState::default(), budget)?;
        }
        match e.action {
            Action::Alloc => {
                let Ok(id) = u32::try_from(out.sizes.len()) else {
                    out.truncated_at_event = Some(event);
                    break;
                };
                let st = addrs.entry(e.addr).or_default();
                let prev = st.live.take();
                *st = AddrState {
                    live: Some(id),
                    awaiting_completed: false,
                };
                if let Some(prev) = prev {
                    out.implicit_frees += 1;
                    out.push(Op::Free { id: prev }, event, time, budget)?;
                }
                budget.reserve(&mut out.sizes, 1, WHAT)?;
                out.sizes.push(e.size);
                out.allocs += 1;
                out.push(Op::Alloc { id, size: e.size }, event, time, budget)?;
                continue;
            }
            Action::FreeRequested => {
                match next.get(i) {
                    // The free_completed that follows frees it.
                    Some(Next::Completed) => continue,
                    Some(Next::End) if completes => {
                        out.pending_at_end += 1;
                        let st = addrs.entry(e.addr).or_default();
                        if st.live.is_none() {
                            st.awaiting_completed = true;
                            budget.reserve(&mut unmatched, 1, WHAT)?;
                            unmatched.push((e.addr, e.size, event));
                        }
                        continue;
                    }
                    _ => {}
                }
                addrs.entry(e.addr).or_default().awaiting_completed = true;
            }
            Action::FreeCompleted => {
                let st = addrs.entry(e.addr).or_default();
                if std::mem::take(&mut st.awaiting_completed) {
                    // The companion of a free_requested already paired.
                    continue;
                }
            }
            _ => continue,
        }
        // A free: of the block live at the address, or of the one live
        // before recording that this event frees.
        let st = addrs.entry(e.addr).or_default();
        match st.live.take().or_else(|| seeds.get(&event).copied()) {
            Some(id) => {
                out.frees += 1;
                out.push(Op::Free { id }, event, time, budget)?;
            }
            None => {
                out.skipped_frees += 1;
                budget.reserve(&mut unmatched, 1, WHAT)?;
                unmatched.push((e.addr, e.size, event));
            }
        }
    }
    let mut live = HashMap::new();
    for (a, s) in addrs {
        if let Some(id) = s.live {
            insert(&mut live, a, id, budget)?;
        }
    }
    Ok(Pass {
        ops: out,
        unmatched,
        live,
    })
}

/// The blocks live when recording began, as `(address, size, freed at)`:
/// freed in the trace without an alloc (each free its own block, `Some(event)`),
/// or active in `segments` at the dump at an address the trace left no
/// block of (`None`). Also the sizes `segments` give the active blocks.
pub(crate) struct Initial {
    pub(crate) blocks: Vec<(u64, u64, Option<u64>)>,
    /// Address -> block size of the blocks active in `segments` at the dump.
    pub(crate) active: HashMap<u64, u64>,
}

/// Finds the blocks live before recording began on `device` (see
/// [`Initial`]).
pub(crate) fn initial_blocks(
    events: &[TraceEvent],
    segments: Option<&[Segment]>,
    device: u32,
    free_point: FreePoint,
    budget: &mut MemoryBudget,
) -> Result<Initial> {
    let fresh = Ops {
        device,
        ..Ops::default()
    };
    // First pass: which blocks the trace frees without having allocated
    // them, and which it leaves live. Its program is dropped at once.
    let mut first = pair(events, device, free_point, fresh, &HashMap::new(), budget)?;
    drop(std::mem::take(&mut first.ops));

    // A block pending free at the dump that the trace never mentions was
    // freed by its tensor before recording, but its memory stayed in use
    // throughout: live from the start when frees are placed where memory
    // is reusable.
    let mut blocks = Vec::new();
    budget.reserve(&mut blocks, first.unmatched.len(), WHAT)?;
    blocks.extend(
        first
            .unmatched
            .iter()
            .map(|&(addr, size, event)| (addr, size, Some(event))),
    );
    let mut from_frees: HashSet<u64> = HashSet::new();
    budget.charge(MAP_ENTRY_BYTES * first.unmatched.len() as u64, WHAT)?;
    from_frees
        .try_reserve(first.unmatched.len())
        .map_err(|_| budget.exceeded(WHAT, u64::MAX))?;
    from_frees.extend(first.unmatched.iter().map(|u| u.0));
    let mut active: HashMap<u64, u64> = HashMap::new();
    for seg in segments.unwrap_or_default() {
        if seg.device != device {
            continue;
        }
        for b in seg.blocks.iter().filter(|b| b.state.is_active()) {
            insert(&mut active, b.address, b.size, budget)?;
            let held = match b.state {
                BlockState::ActiveAllocated => true,
                _ => free_point == FreePoint::Completed,
            };
            if held && !first.live.contains_key(&b.address) && !from_frees.contains(&b.address) {
                budget.reserve(&mut blocks, 1, WHAT)?;
                blocks.push((b.address, b.size, None));
            }
        }
    }
    blocks.sort_unstable_by_key(|b| (b.0, b.2));
    Ok(Initial { blocks, active })
}
