//! Naive compact-on-failure's layout, kept as metadata beside the arena's
//! own while the default policy is in its free mode (`bounded.rs`), and
//! which blocks are *away*: where the arena has them at another offset
//! than naive (their bytes, `M` of the bound, are what a handover to
//! naive's layout would move).

use crate::arena::block::{set_owner, Owner};
use crate::handle::BlockKey;
use crate::placement::{Allocation, FreeIndex, PlacementError};
use crate::plan::planner::{self, LiveBlock};

/// A block a plan moves: its key, final offset and data bytes.
pub(super) type Moved = (BlockKey, u64, u64);

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Shadow {
    pub(super) index: FreeIndex,
    /// Per shadow node slot, its block (as the arena's owners).
    pub(super) owners: Vec<Owner>,
    /// Per block slot, its shadow node.
    pub(super) nodes: Vec<Option<Allocation>>,
    /// Per block slot, whether the block is away (see the module docs).
    away: Vec<bool>,
    /// Bytes (data) of the blocks away: `M`.
    pub(super) away_bytes: u64,
    /// The shadow node of the request being placed, until the block has a
    /// key (or the handover makes it the arena's own node).
    pub(super) pending: Option<Allocation>,
    live: Vec<LiveBlock>,
    spans: Vec<(u64, u64)>,
}

impl Shadow {
    /// Naive's layout as `index` (taken from the arena, with its owners
    /// and its blocks' nodes `nodes`), every block at naive's place.
    pub(super) fn new(
        index: FreeIndex,
        owners: Vec<Owner>,
        nodes: Vec<Option<Allocation>>,
    ) -> Self {
        let away = vec![false; nodes.len()];
        Self {
            index,
            owners,
            nodes,
            away,
            away_bytes: 0,
            pending: None,
            live: Vec::new(),
            spans: Vec::new(),
        }
    }

    /// Where naive has block `key`.
    pub(super) fn offset_of(&self, key: BlockKey) -> Option<u64> {
        self.nodes
            .get(key.slot() as usize)
            .and_then(Option::as_ref)
            .map(Allocation::offset)
    }

    /// Records whether block `key` (of `bytes` data) is at `arena_offset`
    /// in the arena, away from naive's place or not.
    pub(super) fn note(&mut self, key: BlockKey, bytes: u64, arena_offset: u64) {
        let away = self.offset_of(key) != Some(arena_offset);
        let i = key.slot() as usize;
        if self.away.len() <= i {
            self.away.resize(i + 1, false);
        }
        if self.away[i] != away {
            self.away[i] = away;
            if away {
                self.away_bytes = self.away_bytes.saturating_add(bytes);
            } else {
                self.away_bytes = self.away_bytes.saturating_sub(bytes);
            }
        }
    }

    /// Whether block `key` is away.
    pub(super) fn is_away(&self, key: BlockKey) -> bool {
        self.away.get(key.slot() as usize).copied().unwrap_or(false)
    }

    /// Naive's placement of a request (`None`: no hole in its layout).
    pub(super) fn place(&mut self, reserved: u64, align: u64) -> Option<u64> {
        let node = self.index.alloc(reserved, align)?;
        let offset = node.offset();
        self.pending = Some(node);
        Some(offset)
    }

    /// Gives the pending node to the block just made as `key`.
    pub(super) fn commit(&mut self, key: BlockKey, size: u64, align: u32, arena_offset: u64) {
        let Some(node) = self.pending.take() else {
            return;
        };
        let owner = Owner {
            key,
            size,
            align,
            pinned: false,
        };
        set_owner(&mut self.owners, node.slot(), owner);
        let i = key.slot() as usize;
        if self.nodes.len() <= i {
            self.nodes.resize_with(i + 1, || None);
        }
        self.nodes[i] = Some(node);
        self.note(key, size, arena_offset);
    }

    /// Undoes the pending placement (the request failed).
    pub(super) fn abandon(&mut self) {
        if let Some(node) = self.pending.take() {
            let _ = self.index.free(node);
        }
    }

    /// Frees block `key` (of `bytes` data).
    pub(super) fn free(&mut self, key: BlockKey, bytes: u64) -> Result<(), PlacementError> {
        if self.is_away(key) {
            self.away[key.slot() as usize] = false;
            self.away_bytes = self.away_bytes.saturating_sub(bytes);
        }
        match self
            .nodes
            .get_mut(key.slot() as usize)
            .and_then(Option::take)
        {
            Some(node) => self.index.free(node),
            None => Ok(()),
        }
    }

    /// Mirrors a block's pin state (naive's compaction keeps pinned blocks
    /// where they are, too).
    pub(super) fn pin(&mut self, key: BlockKey, pinned: bool) {
        if let Some(Some(node)) = self.nodes.get(key.slot() as usize) {
            if let Some(o) = self.owners.get_mut(node.slot() as usize) {
                o.pinned = pinned;
            }
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

    /// Naive's full compaction for a request of `reserved` at `align`, if
    /// it would make room: the moved blocks' keys and new offsets, and its
    /// bytes, without applying it. `None`: naive fails the request.
    #[allow(clippy::type_complexity)] // (moves as (key, from, to), bytes)
    pub(super) fn naive_compaction(
        &mut self,
        reserved: u64,
        align: u64,
    ) -> Option<(Vec<Moved>, u64)> {
        let capacity = self.index.capacity();
        if reserved > self.index.free_bytes() {
            return None;
        }
        self.collect_live();
        if planner::largest_hole_after_full(&self.live, capacity, align) < reserved {
            return None;
        }
        let plan = planner::plan_full(&self.live, capacity);
        let moved = final_offsets(&plan, &self.live);
        Some((moved, plan.bytes_moved()))
    }

    /// Naive's evacuation of the blocks above `cut` into holes below it
    /// (naive trims as the arena does): the moved blocks and its bytes,
    /// without applying it; `None` if there is no such plan.
    pub(super) fn naive_evacuation(&mut self, cut: u64) -> Option<(Vec<Moved>, u64)> {
        self.collect_live();
        let plan = crate::plan::planner::evacuate::plan_evacuate(&self.live, cut)?;
        let moved = final_offsets(&plan, &self.live);
        Some((moved, plan.bytes_moved()))
    }

    /// Applies naive's compaction (`moved` from
    /// [`naive_compaction`](Self::naive_compaction)): the shadow's index is
    /// rebuilt as naive's is.
    pub(super) fn apply(&mut self, moved: &[(BlockKey, u64, u64)]) -> Result<(), PlacementError> {
        self.collect_live();
        let at: std::collections::HashMap<u64, u64> =
            moved.iter().map(|&(k, o, _)| (k.to_bits(), o)).collect();
        for l in &mut self.live {
            if let Some(&o) = at.get(&l.key) {
                l.offset = o;
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
        })
    }
}

/// Each block a plan moves, by key: its final offset and data bytes.
fn final_offsets(plan: &crate::plan::Plan, live: &[LiveBlock]) -> Vec<Moved> {
    let index: std::collections::HashMap<u64, usize> =
        live.iter().enumerate().map(|(i, l)| (l.key, i)).collect();
    match crate::plan::track::final_offsets(plan, live, |k| index.get(&k).copied()) {
        Ok(finals) => finals
            .into_iter()
            .map(|(i, f)| (BlockKey::from_bits(live[i].key), f, live[i].copy_len))
            .collect(),
        // Unreachable: naive's own plan over its own layout.
        Err(_) => Vec::new(),
    }
}
