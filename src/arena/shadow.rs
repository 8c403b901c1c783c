//! The budget of [`CompactionPolicy::Budgeted`]: a metadata shadow of naive
//! compact-on-failure, and the one relayout that hands the arena over to
//! it. The argument is in `src/plan/lag.rs` ("Two phases").
//!
//! While the shadow runs, the arena places blocks with naive's own calls
//! (best fit, from the bottom), so the two layouts are equal until the
//! first request that fits in no hole. There naive runs its full
//! compaction on the shadow, and the arena runs the targeted policy's
//! plan instead, if its bytes fit in what naive has moved more than the
//! arena so far. When they do not (or the targeted plan cannot serve a
//! request naive serves), the arena moves every block to where the
//! shadow has it, in one plan, and from then on its own index *is*
//! naive's: the shadow's index takes its place and deferred moves
//! (`src/plan/lag.rs`) carry on from there.

use std::time::{Duration, Instant};

use super::{set_owner, Arena, CompactionReport, Owner, Place};
use crate::backend::Backend;
use crate::error::Result;
use crate::handle::BlockKey;
use crate::placement::PlacementError;
use crate::placement::{Allocation, FreeIndex};
use crate::plan::planner::{self, LiveBlock};
use crate::plan::relayout::plan_relayout;
use crate::plan::PlanKind;

/// Naive compact-on-failure's layout, kept beside the arena's own.
#[derive(Debug)]
pub(super) struct Shadow {
    index: FreeIndex,
    /// Per shadow node slot, its block (as `Arena::owners`).
    owners: Vec<Owner>,
    /// Per block slot, its shadow node.
    nodes: Vec<Option<Allocation>>,
    /// The shadow node of the request being placed, until the block has a
    /// key (or the handover makes it the arena's own node).
    pending: Option<Allocation>,
    live: Vec<LiveBlock>,
    spans: Vec<(u64, u64)>,
}

impl Shadow {
    pub(super) fn new(capacity: u64) -> Self {
        Self {
            index: FreeIndex::new(capacity),
            owners: Vec::new(),
            nodes: Vec::new(),
            pending: None,
            live: Vec::new(),
            spans: Vec::new(),
        }
    }

    /// The live blocks of the shadow, in address order.
    fn collect_live(&mut self) {
        self.live.clear();
        for r in self.index.regions() {
            let Some(slot) = r.slot else { continue };
            let Some(o) = self.owners.get(slot as usize) else {
                continue;
            };
            self.live.push(o.live_block(r.offset, r.size));
        }
    }

    /// Naive's full compaction, applied to the shadow (nothing to copy):
    /// its bytes moved. `None` if it would leave no hole for `reserved` at
    /// `align` (naive fails the request).
    fn compact_for(
        &mut self,
        reserved: u64,
        align: u64,
        capacity: u64,
    ) -> std::result::Result<Option<u64>, PlacementError> {
        self.collect_live();
        if planner::largest_hole_after_full(&self.live, capacity, align) < reserved {
            return Ok(None);
        }
        let plan = planner::plan_full(&self.live, capacity);
        // Final offsets: a block moved twice (through a free spot) ends at
        // its last move's destination.
        for m in plan.moves() {
            if let Ok(i) = self.live.binary_search_by_key(&m.src, |l| l.offset) {
                if self.live[i].key == m.key {
                    self.live[i].offset = m.dst;
                    continue;
                }
            }
            if let Some(l) = self.live.iter_mut().find(|l| l.key == m.key) {
                l.offset = m.dst;
            }
        }
        self.live.sort_unstable_by_key(|l| l.offset);
        self.spans.clear();
        self.spans
            .extend(self.live.iter().map(|l| (l.offset, l.len)));
        let Self {
            index,
            owners,
            nodes,
            live,
            spans,
            ..
        } = self;
        index.rebuild_with(spans, |i, a| {
            let owner = Owner::of_live(&live[i]);
            set_owner(owners, a.slot(), owner);
            if let Some(n) = nodes.get_mut(owner.key.slot() as usize) {
                *n = Some(a);
            }
        })?;
        Ok(Some(plan.bytes_moved()))
    }
}

/// What [`Arena::shadow_handover`] did.
pub(super) enum Handover {
    /// The arena's layout and index are naive's now; `pending` is the node
    /// naive placed the request being served at, `report` the plan run.
    Done {
        pending: Option<Allocation>,
        report: Option<CompactionReport>,
    },
    /// Nothing changed.
    NotNow,
}

/// Naive's placement of the next request (compacting the shadow first
/// if it fits in no hole), kept pending until the block has a key.
/// Where naive fails the request, the shadow ends (the bound holds for
/// what naive serves) and the arena goes on alone.
pub(super) fn place<B: Backend>(arena: &mut Arena<B>, reserved: u64, align: u64) -> Result<()> {
    let capacity = arena.config.capacity_bytes;
    let Some(s) = arena.shadow.as_mut() else {
        return Ok(());
    };
    if let Some(node) = s.index.alloc(reserved, align) {
        s.pending = Some(node);
        return Ok(());
    }
    let moved = if reserved <= s.index.free_bytes() {
        match s.compact_for(reserved, align, capacity) {
            Ok(moved) => moved,
            Err(e) => return Err(arena.broken("naive's compaction in the shadow failed", e)),
        }
    } else {
        None
    };
    let node = moved.and_then(|_| s.index.alloc(reserved, align));
    match (moved, node) {
        (Some(moved), Some(node)) => {
            s.pending = Some(node);
            arena.counters.naive_bytes_moved =
                arena.counters.naive_bytes_moved.saturating_add(moved);
        }
        _ => {
            arena.counters.naive_failures += 1;
            arena.shadow = None;
        }
    }
    Ok(())
}

/// Gives the pending shadow node to the block just inserted as `key`.
pub(super) fn commit<B: Backend>(arena: &mut Arena<B>, key: BlockKey, size: u64, align: u32) {
    let Some(s) = arena.shadow.as_mut() else {
        return;
    };
    let Some(node) = s.pending.take() else {
        return;
    };
    let owner = Owner {
        key,
        size,
        align,
        pinned: false,
    };
    set_owner(&mut s.owners, node.slot(), owner);
    let i = key.slot() as usize;
    if s.nodes.len() <= i {
        s.nodes.resize_with(i + 1, || None);
    }
    s.nodes[i] = Some(node);
}

/// Undoes [`Arena::shadow_place`]'s placement when the request fails
/// (naive's compaction, if it ran, stays counted: naive ran it).
pub(super) fn abandon<B: Backend>(arena: &mut Arena<B>) {
    if let Some(s) = arena.shadow.as_mut() {
        if let Some(node) = s.pending.take() {
            let _ = s.index.free(node);
        }
    }
}

/// Frees block `key` in the shadow.
pub(super) fn free<B: Backend>(
    arena: &mut Arena<B>,
    key: BlockKey,
) -> std::result::Result<(), PlacementError> {
    let Some(s) = arena.shadow.as_mut() else {
        return Ok(());
    };
    match s.nodes.get_mut(key.slot() as usize).and_then(Option::take) {
        Some(node) => s.index.free(node),
        None => Ok(()),
    }
}

/// Mirrors a block's pin state in the shadow (naive's compaction keeps
/// pinned blocks where they are, too).
pub(super) fn pin<B: Backend>(arena: &mut Arena<B>, key: BlockKey, pinned: bool) {
    if let Some(s) = arena.shadow.as_mut() {
        if let Some(Some(node)) = s.nodes.get(key.slot() as usize) {
            if let Some(o) = s.owners.get_mut(node.slot() as usize) {
                o.pinned = pinned;
            }
        }
    }
}

/// Bytes the arena may move now without ever having moved more than
/// naive: what naive has moved beyond it. `None` outside the first
/// phase (no budget applies).
pub(super) fn budget<B: Backend>(arena: &Arena<B>) -> Option<u64> {
    arena.shadow.as_ref().map(|_| {
        let c = &arena.counters;
        c.naive_bytes_moved.saturating_sub(c.bytes_moved)
    })
}

/// Whether naive placed the request being served (so the handover can
/// serve it too).
pub(super) fn has_pending<B: Backend>(arena: &Arena<B>) -> bool {
    arena.shadow.as_ref().is_some_and(|s| s.pending.is_some())
}

/// The handover: moves every block to its place in the shadow, in one
/// plan, and makes the shadow's index the arena's. `Handover::NotNow`,
/// with nothing changed, when a pinned block is not where the shadow
/// has it or the plan finds no free spot for a move it cannot order.
pub(super) fn handover<B: Backend>(arena: &mut Arena<B>) -> Result<Handover> {
    let capacity = arena.config.capacity_bytes;
    let t0 = Instant::now();
    super::defer::settle(arena)?;
    super::compaction::collect_live(arena);
    let Some(s) = arena.shadow.as_ref() else {
        return Ok(Handover::NotNow);
    };
    let mut targets = Vec::with_capacity(arena.live.len());
    for l in &arena.live {
        let key = BlockKey::from_bits(l.key);
        let Some(Some(node)) = s.nodes.get(key.slot() as usize) else {
            return Ok(Handover::NotNow); // unreachable: every block has one
        };
        if l.pinned && node.offset() != l.offset {
            return Ok(Handover::NotNow);
        }
        targets.push(node.offset());
    }
    let Some(plan) = plan_relayout(&arena.live, &targets, capacity, PlanKind::Full) else {
        return Ok(Handover::NotNow);
    };
    let moved = plan.bytes_moved();
    let report = if plan.move_count() > 0 {
        Some(super::compaction::execute(arena, plan, t0)?)
    } else {
        None
    };
    let Some(mut s) = arena.shadow.take() else {
        return Ok(Handover::NotNow); // unreachable: checked above
    };
    // The layouts are equal now: the shadow's index, with its history
    // (free lists, node slots), becomes the arena's.
    for (i, node) in s.nodes.iter_mut().enumerate() {
        let Some(node) = node.take() else { continue };
        let Some(key) = s.owners.get(node.slot() as usize).map(|o| o.key) else {
            continue;
        };
        debug_assert_eq!(key.slot() as usize, i);
        if let Some(b) = arena.blocks.get_mut(key) {
            b.place = Place::Device(node);
        }
    }
    arena.index = s.index;
    arena.owners = s.owners;
    arena.counters.handover_bytes = moved;
    Ok(Handover::Done {
        pending: s.pending.take(),
        report,
    })
}

/// An explicit full compaction in the first phase: naive runs its own
/// (on the shadow), and the arena takes its layout. `None` if the
/// arena cannot (a pinned block away from naive's place): the shadow
/// ends, counted as a request naive's bound no longer covers.
pub(super) fn compact<B: Backend>(arena: &mut Arena<B>) -> Result<Option<CompactionReport>> {
    let capacity = arena.config.capacity_bytes;
    let Some(s) = arena.shadow.as_mut() else {
        return Ok(None);
    };
    let moved = match s.compact_for(0, 1, capacity) {
        Ok(moved) => moved.unwrap_or(0),
        Err(e) => return Err(arena.broken("naive's compaction in the shadow failed", e)),
    };
    arena.counters.naive_bytes_moved = arena.counters.naive_bytes_moved.saturating_add(moved);
    match handover(arena)? {
        Handover::Done { report, .. } => Ok(Some(report.unwrap_or(CompactionReport {
            kind: PlanKind::Full,
            moves: 0,
            waves: 0,
            bytes_moved: 0,
            planning: Duration::ZERO,
            execution: Duration::ZERO,
        }))),
        Handover::NotNow => {
            arena.counters.naive_failures += 1;
            arena.shadow = None;
            Ok(None)
        }
    }
}
