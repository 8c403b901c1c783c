//! [`CompactionPolicy::Bounded`](crate::CompactionPolicy::Bounded), the
//! default: cheap targeted compactions while a potential allows them,
//! naive's layout when it does not. The guarantee and its proof are in the
//! [`policies`](crate::policies) docs; in short, with `N` the bytes naive
//! compact-on-failure has moved, `P` the peak live bytes so far and `A`
//! the bytes the arena has moved,
//!
//! > `A + R <= N + 2P` after every operation,
//!
//! where `R` is what reaching naive's layout from the arena's would cost
//! (at most): the deferred bytes `D` in *mirror* mode, twice the bytes of
//! the blocks away from naive's place (`2M`) in *free* mode.
//!
//! - **Mirror mode** is [`Strict`]: the arena's index is naive's.
//! - At a request naive compacts for, the arena may enter **free mode**:
//!   naive's index goes to a [`Shadow`], the arena's index is rebuilt
//!   from where the bytes are, and the request gets the targeted
//!   mechanism's plan instead of naive's compaction, if the potential
//!   affords it.
//! - In free mode every operation whose effect on `A + R` the slack
//!   `N + 2P - A - R` cannot cover is preceded by a **handover**: one
//!   relayout (`src/plan/relayout.rs`, always staged, at most `2M`
//!   bytes) to the shadow's layout, whose index becomes the arena's:
//!   mirror mode again.

use std::time::Instant;

use super::shadow::Shadow;
use super::strict::Strict;
use super::targeted;
use crate::arena::block::{Owner, Place};
use crate::arena::core::Core;
use crate::arena::CompactionReport;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::handle::BlockKey;
use crate::placement::Allocation;
use crate::plan::planner::{self, LiveBlock, Request};
use crate::plan::relayout::plan_relayout;
use crate::plan::{track, Plan, PlanKind};

/// The state of the default policy. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Bounded {
    /// Mirror mode's machinery, `N` and the pacer.
    pub(super) mirror: Strict,
    /// Free mode: naive's layout. `None` in mirror mode.
    pub(super) free: Option<Box<Shadow>>,
    /// The comparison with naive has ended (naive failed a request, or
    /// spilling ran): the arena goes on with the targeted mechanism.
    pub(super) ended: bool,
    /// Never enter free mode (spilling is on: residency changes that
    /// naive has no counterpart for).
    pub(super) mirror_only: bool,
    pub(super) handovers: u64,
    pub(super) handover_bytes: u64,
    /// Times free mode was entered.
    pub(super) free_entries: u64,
}

/// What a step costs the potential: bytes that `A + R` may grow by.
pub(super) fn fits(slack: u64, cost: u64) -> bool {
    // A planted bug for the tests (`tests/all/bound.rs`): no budget.
    #[cfg(cuarena_plant = "skip-budget")]
    {
        let _ = (slack, cost);
        return true;
    }
    #[allow(unreachable_code)]
    {
        cost <= slack
    }
}

/// How much `plan` (made from `core.live`) would add to the bytes away
/// from naive's place (0 if it brings as many back); `None` if it cannot
/// be followed (a plan the core would refuse anyway).
fn away_change<B: Backend>(core: &Core<B>, shadow: &Shadow, plan: &Plan) -> Option<u64> {
    let live = &core.live;
    let pos: std::collections::HashMap<u64, usize> =
        live.iter().enumerate().map(|(i, l)| (l.key, i)).collect();
    let finals = track::final_offsets(plan, live, |k| pos.get(&k).copied()).ok()?;
    let (mut grows, mut shrinks) = (0u64, 0u64);
    for (i, f) in finals {
        let key = BlockKey::from_bits(live[i].key);
        let now = shadow.is_away(key);
        let then = shadow.offset_of(key) != Some(f);
        match (now, then) {
            (false, true) => grows = grows.saturating_add(live[i].copy_len),
            (true, false) => shrinks = shrinks.saturating_add(live[i].copy_len),
            _ => {}
        }
    }
    Some(grows.saturating_sub(shrinks))
}

impl Bounded {
    /// A fresh state; `mirror_only`: never leave naive's layout.
    pub(super) fn new(mirror_only: bool) -> Self {
        Self {
            mirror_only,
            ..Self::default()
        }
    }

    /// `N + 2P`, the bound `A + R` stays under.
    pub(super) fn bound<B: Backend>(&self, core: &Core<B>) -> u64 {
        self.mirror
            .naive_bytes
            .saturating_add(core.counters.peak_allocated_bytes.saturating_mul(2))
    }

    /// `R`: the most reaching naive's layout would move now.
    pub(super) fn owed(&self) -> u64 {
        match &self.free {
            Some(s) => s.away_bytes.saturating_mul(2),
            None => self.mirror.lag.deferred_bytes(),
        }
    }

    /// Naive's layout in free mode (`None` in mirror mode).
    pub(super) fn shadow_index(&mut self) -> Option<&mut crate::placement::FreeIndex> {
        self.free.as_mut().map(|s| &mut s.index)
    }

    /// `M`: the bytes of the blocks away from naive's place.
    pub(super) fn away_bytes(&self) -> u64 {
        self.free.as_ref().map_or(0, |s| s.away_bytes)
    }

    /// `N + 2P - A - R`.
    pub(super) fn slack<B: Backend>(&self, core: &Core<B>) -> u64 {
        self.bound(core)
            .saturating_sub(core.counters.bytes_moved.saturating_add(self.owed()))
    }

    /// Space for `reserved` bytes at `align` (see the module docs).
    pub(super) fn place<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        req: Request,
    ) -> Result<Allocation> {
        if self.ended {
            // Deferred moves may remain from mirror mode: a hole over
            // their bytes sends them home.
            return match core.index.alloc(req.size, req.align) {
                Some(node) => self.cleared(core, node, false),
                None => self.mirror.fallback(core, req.size, req.align),
            };
        }
        if self.free.is_some() {
            self.place_free(core, req.size, req.align)
        } else {
            self.place_mirror(core, req.size, req.align)
        }
    }

    /// Ends the comparison (naive fails this request) and serves it with
    /// the targeted mechanism.
    fn end_with<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        reserved: u64,
        align: u64,
    ) -> Result<Allocation> {
        self.mirror.naive_failures += 1;
        self.end();
        self.mirror.fallback(core, reserved, align)
    }

    /// Ends the comparison (the handover cannot be planned) and serves the
    /// request with the targeted mechanism.
    fn end_unstaged<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        reserved: u64,
        align: u64,
    ) -> Result<Allocation> {
        self.end();
        self.mirror.fallback(core, reserved, align)
    }

    /// Ends the comparison: the arena keeps its own layout.
    pub(super) fn end(&mut self) {
        self.ended = true;
        self.free = None;
    }

    fn place_mirror<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        reserved: u64,
        align: u64,
    ) -> Result<Allocation> {
        if let Some(node) = core.index.alloc(reserved, align) {
            return self.cleared(core, node, false);
        }
        core.check_usable()?;
        if reserved > core.index.free_bytes() {
            return self.end_with(core, reserved, align);
        }
        let t0 = Instant::now();
        core.collect_live();
        let capacity = core.capacity();
        if planner::largest_hole_after_full(&core.live, capacity, align) < reserved {
            return self.end_with(core, reserved, align);
        }
        let naive = planner::plan_full(&core.live, capacity);
        if !self.mirror_only {
            if let Some(node) = self.try_free(core, &naive, reserved, align, t0)? {
                return Ok(node);
            }
        }
        let node = self
            .mirror
            .naive_compaction(core, naive, reserved, align, t0)?;
        self.cleared(core, node, true)
    }

    /// `node`, with the deferred bytes in its way sent home.
    fn cleared<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        node: Allocation,
        at_compaction: bool,
    ) -> Result<Allocation> {
        self.mirror.cleared(core, node, at_compaction)
    }

    /// At a request naive compacts for (its plan `naive`, made from
    /// `core.live`, the index's layout): enters free mode and serves the
    /// request with a targeted plan, if the potential affords what that
    /// costs; `None`, with nothing changed, if not.
    fn try_free<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        naive: &Plan,
        reserved: u64,
        align: u64,
        t0: Instant,
    ) -> Result<Option<Allocation>> {
        let capacity = core.capacity();
        // Naive's offsets after its compaction.
        let index_live = core.live.clone();
        let pos: std::collections::HashMap<u64, usize> = index_live
            .iter()
            .enumerate()
            .map(|(i, l)| (l.key, i))
            .collect();
        let Ok(moved) = track::final_offsets(naive, &index_live, |k| pos.get(&k).copied()) else {
            return Ok(None);
        };
        let mut naive_at: Vec<u64> = index_live.iter().map(|l| l.offset).collect();
        for (i, f) in moved {
            naive_at[i] = f;
        }
        // Where the bytes are (lagging blocks above their entries).
        let mut real: Vec<LiveBlock> = index_live
            .iter()
            .map(|l| {
                let b = core.blocks.get(BlockKey::from_bits(l.key));
                let at = b.and_then(|b| b.real_offset()).unwrap_or(l.offset);
                LiveBlock { offset: at, ..*l }
            })
            .collect();
        real.sort_unstable_by_key(|l| l.offset);
        // The targeted plan the arena would run on its own layout.
        let ops = core.counters.allocs.saturating_add(core.counters.frees);
        let req = Request {
            size: reserved,
            align,
        };
        let Some((plan, _)) = self.mirror.pacer.plan(&real, capacity, req, ops) else {
            return Ok(None);
        };
        // Leave naive's layout only for a plan that saves at least half of
        // its compaction: one that moves nearly as much keeps nothing and
        // leaves a layout that costs a handover later.
        if plan.bytes_moved().saturating_mul(2) > naive.bytes_moved() {
            return Ok(None);
        }
        // Where each block ends after it, against naive's place.
        let mut arena_at: std::collections::HashMap<u64, u64> =
            real.iter().map(|l| (l.key, l.offset)).collect();
        let rpos: std::collections::HashMap<u64, usize> =
            real.iter().enumerate().map(|(i, l)| (l.key, i)).collect();
        let Ok(finals) = track::final_offsets(&plan, &real, |k| rpos.get(&k).copied()) else {
            return Ok(None);
        };
        for (i, f) in finals {
            arena_at.insert(real[i].key, f);
        }
        let away: u64 = index_live
            .iter()
            .zip(&naive_at)
            .filter(|(l, &n)| arena_at.get(&l.key) != Some(&n))
            .map(|(l, _)| l.copy_len)
            .fold(0, u64::saturating_add);
        // Affordable: naive's bytes come in, the plan's go out, and every
        // block away (and the request, which may be) may cost twice its
        // bytes to bring back.
        let t = plan.bytes_moved();
        let slack = self
            .bound(core)
            .saturating_add(naive.bytes_moved())
            .saturating_sub(core.counters.bytes_moved);
        let cost = t
            .saturating_add(away.saturating_mul(2))
            .saturating_add(reserved.saturating_mul(2));
        if !fits(slack, cost) {
            return Ok(None);
        }
        // Enter: naive's index goes to the shadow, with the blocks' nodes;
        // the arena's index is rebuilt from where the bytes are.
        let (index, owners, nodes) = core.rebuild_from(&real)?;
        for l in &index_live {
            if let Some(b) = core.blocks.get_mut(BlockKey::from_bits(l.key)) {
                b.lag = None;
            }
        }
        self.mirror.lag = Default::default();
        let mut shadow = Box::new(Shadow::new(index, owners, nodes));
        let Some((moved, bytes)) = shadow.naive_compaction(reserved, align) else {
            // Unreachable: checked above on the same layout.
            return Err(core.broken("naive's compaction in the shadow", "it no longer fits"));
        };
        if let Err(e) = shadow.apply(&moved) {
            return Err(core.broken("naive's compaction in the shadow failed", e));
        }
        self.mirror.naive_bytes = self.mirror.naive_bytes.saturating_add(bytes);
        if shadow.place(reserved, align).is_none() {
            return Err(core.broken(
                "naive's placement in the shadow",
                "no hole after its compaction",
            ));
        }
        for l in &index_live {
            let key = BlockKey::from_bits(l.key);
            if let Some(Place::Device(a)) = core.blocks.get(key).map(|b| &b.place) {
                let at = a.offset();
                shadow.note(key, l.copy_len, at);
            }
        }
        self.free = Some(shadow);
        self.free_entries += 1;
        // The plan, made on the layout the index now has.
        if !plan.is_empty() {
            // Planning time counts from the request (`t0`): the plan was
            // made above.
            core.collect_live();
            core.run(plan, t0)?;
            self.note_all(core);
        }
        self.arena_step(core, reserved, align).map(Some)
    }

    fn place_free<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        reserved: u64,
        align: u64,
    ) -> Result<Allocation> {
        let Some(shadow) = self.free.as_mut() else {
            return self.place_mirror(core, reserved, align);
        };
        if shadow.place(reserved, align).is_none() {
            // Naive compacts for this request, or fails it.
            let Some((moved, bytes)) = shadow.naive_compaction(reserved, align) else {
                return self.end_with(core, reserved, align);
            };
            if !self.affords_naive(core, &moved, bytes) {
                // Naive's layout now, then naive's compaction in mirror
                // mode (deferred), which the potential always affords.
                if self.handover(core)?.is_some() {
                    return self.place_mirror(core, reserved, align);
                }
                // The relayout could not be planned (no byte free, which
                // a request that fits rules out, or past the planner's cap
                // on waves): the comparison ends, naive did not fail.
                return self.end_unstaged(core, reserved, align);
            }
            if !self.naive_moved(core, &moved, bytes)? {
                return self.place_mirror(core, reserved, align);
            }
            let Some(shadow) = self.free.as_mut() else {
                return self.place_mirror(core, reserved, align);
            };
            if shadow.place(reserved, align).is_none() {
                return Err(core.broken(
                    "naive's placement in the shadow",
                    "no hole after its compaction",
                ));
            }
        }
        self.arena_step(core, reserved, align)
    }

    /// Free mode, naive's placement pending: the arena's own placement, a
    /// targeted plan the potential affords, or the handover.
    fn arena_step<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        reserved: u64,
        align: u64,
    ) -> Result<Allocation> {
        let naive_at = self
            .free
            .as_ref()
            .and_then(|s| s.pending.as_ref())
            .map(Allocation::offset);
        if let Some(node) = core.index.alloc(reserved, align) {
            let away = Some(node.offset()) != naive_at;
            if !away || fits(self.slack(core), reserved.saturating_mul(2)) {
                return Ok(node);
            }
            core.give_back(node)?;
            return self.hand_over_for(core, reserved, align);
        }
        let mut budget = self.slack(core);
        let before = core.counters.bytes_moved;
        let Bounded { mirror, free, .. } = self;
        let shadow = free.as_deref();
        let placed = targeted::make_room(core, &mut mirror.pacer, reserved, align, |core, plan| {
            // The plan's bytes, the change in the bytes away it makes, and
            // the request (which may land away).
            let Some(delta) = shadow.and_then(|s| away_change(core, s, plan)) else {
                return false;
            };
            let t = plan.bytes_moved();
            let cost = t
                .saturating_add(delta.saturating_mul(2))
                .saturating_add(reserved.saturating_mul(2));
            let ok = fits(budget, cost);
            if ok {
                budget -= t.saturating_add(delta.saturating_mul(2));
            }
            ok
        });
        if core.counters.bytes_moved != before {
            self.note_all(core);
        }
        match placed {
            Ok(node) => {
                let away = Some(node.offset()) != naive_at;
                if !away || fits(self.slack(core), reserved.saturating_mul(2)) {
                    return Ok(node);
                }
                core.give_back(node)?;
                self.hand_over_for(core, reserved, align)
            }
            Err(Error::OutOfMemory { .. }) => self.hand_over_for(core, reserved, align),
            Err(e) => Err(e),
        }
    }

    /// Recomputes which blocks are away (after the arena's own plans).
    /// Whether the potential affords naive's `moved` (of `bytes`, which
    /// count in `N`): blocks it takes away from where the arena has them
    /// cost twice their bytes in `R`, blocks it brings back free as much.
    pub(super) fn affords_naive<B: Backend>(
        &self,
        core: &Core<B>,
        moved: &[super::shadow::Moved],
        bytes: u64,
    ) -> bool {
        let Some(shadow) = self.free.as_ref() else {
            return false;
        };
        let mut grows = 0u64;
        let mut shrinks = 0u64;
        for &(key, at, len) in moved {
            let arena_at = match core.blocks.get(key).map(|b| &b.place) {
                Some(Place::Device(a)) => a.offset(),
                _ => continue,
            };
            match (shadow.is_away(key), arena_at != at) {
                (false, true) => grows = grows.saturating_add(len),
                (true, false) => shrinks = shrinks.saturating_add(len),
                _ => {}
            }
        }
        let slack = self
            .slack(core)
            .saturating_add(bytes)
            .saturating_add(shrinks.saturating_mul(2));
        fits(slack, grows.saturating_mul(2))
    }

    /// Naive's layout after its `moved` (of `bytes`, counted in `N`), and
    /// which blocks are away from it now; `false` in mirror mode.
    pub(super) fn naive_moved<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        moved: &[super::shadow::Moved],
        bytes: u64,
    ) -> Result<bool> {
        let Some(shadow) = self.free.as_mut() else {
            return Ok(false);
        };
        if let Err(e) = shadow.apply(moved) {
            return Err(core.broken("naive's moves in the shadow failed", e));
        }
        self.mirror.naive_bytes = self.mirror.naive_bytes.saturating_add(bytes);
        for &(key, _, len) in moved {
            if let Some(Place::Device(a)) = core.blocks.get(key).map(|b| &b.place) {
                shadow.note(key, len, a.offset());
            }
        }
        Ok(true)
    }

    pub(super) fn note_all<B: Backend>(&mut self, core: &Core<B>) {
        let Some(shadow) = self.free.as_mut() else {
            return;
        };
        for (key, b) in core.blocks.iter() {
            if let Place::Device(a) = &b.place {
                shadow.note(key, b.size, a.offset());
            }
        }
    }

    /// The handover, then the request at naive's place.
    fn hand_over_for<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        reserved: u64,
        align: u64,
    ) -> Result<Allocation> {
        match self.handover(core)? {
            Some(Some(node)) => Ok(node),
            // Naive placed the request: the pending node always comes
            // back; the handover cannot run without a byte free (which a
            // request that fits rules out) or past the planner's cap on
            // waves.
            _ => self.end_unstaged(core, reserved, align),
        }
    }

    /// Moves every block to its place in the shadow (one staged relayout)
    /// and makes the shadow's index the arena's: mirror mode. Returns the
    /// pending request's node, if any; `None` (nothing changed) when the
    /// relayout cannot be staged (no byte free) or outside free mode.
    pub(super) fn handover<B: Backend>(
        &mut self,
        core: &mut Core<B>,
    ) -> Result<Option<Option<Allocation>>> {
        let Some(shadow) = self.free.take() else {
            return Ok(None);
        };
        let t0 = Instant::now();
        core.collect_live();
        let targets: Option<Vec<u64>> = core
            .live
            .iter()
            .map(|l| shadow.offset_of(BlockKey::from_bits(l.key)))
            .collect();
        let plan =
            targets.and_then(|t| plan_relayout(&core.live, &t, core.capacity(), PlanKind::Full));
        let Some(plan) = plan else {
            self.free = Some(shadow);
            return Ok(None);
        };
        let before = core.counters.bytes_moved;
        if !plan.is_empty() {
            core.run_keeping_index(&plan, t0)?;
        }
        let Shadow {
            index,
            owners,
            mut nodes,
            mut pending,
            ..
        } = *shadow;
        core.adopt(index, owners, |key| {
            nodes.get_mut(key.slot() as usize).and_then(Option::take)
        });
        self.handovers += 1;
        self.handover_bytes = self
            .handover_bytes
            .saturating_add(core.counters.bytes_moved - before);
        Ok(Some(pending.take()))
    }

    /// The request failed after `place`: naive's placement is undone.
    pub(super) fn abandon(&mut self) {
        if let Some(s) = self.free.as_mut() {
            s.abandon();
        }
    }

    /// Block `key` was made at `offset` for the pending request.
    pub(super) fn commit(&mut self, key: BlockKey, size: u64, align: u32, offset: u64) {
        if let Some(s) = self.free.as_mut() {
            s.commit(key, size, align, offset);
        }
    }

    /// Block `key` (of `size` bytes) is freed.
    pub(super) fn free<B: Backend>(
        &mut self,
        core: &Core<B>,
        key: BlockKey,
        size: u64,
    ) -> Result<()> {
        if let Some(s) = self.free.as_mut() {
            if let Err(e) = s.free(key, size) {
                return Err(core.broken("freeing a block in naive's shadow failed", e));
            }
        }
        Ok(())
    }

    /// Block `key` is about to be pinned: it must be at naive's place (a
    /// pinned block never moves), so a block away is brought there by the
    /// handover; without a byte free to stage it, the comparison ends.
    pub(super) fn before_pin<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        key: BlockKey,
    ) -> Result<()> {
        if self.free.as_ref().is_some_and(|s| s.is_away(key)) && self.handover(core)?.is_none() {
            self.end();
        }
        self.mirror.bring_home(core, key)
    }

    /// A block's pin state changed (naive keeps pinned blocks in place).
    pub(super) fn pinned(&mut self, key: BlockKey, pinned: bool) {
        if let Some(s) = self.free.as_mut() {
            s.pin(key, pinned);
        }
    }

    /// An explicit full compaction: naive runs its own; the arena takes
    /// naive's layout (the handover) and runs the same. With no byte free
    /// both layouts are packed and nothing moves.
    pub(super) fn compact<B: Backend>(&mut self, core: &mut Core<B>) -> Result<CompactionReport> {
        if !self.ended && self.free.is_some() && self.handover(core)?.is_none() {
            return Ok(CompactionReport {
                kind: PlanKind::Full,
                moves: 0,
                waves: 0,
                bytes_moved: 0,
                planning: std::time::Duration::ZERO,
                execution: std::time::Duration::ZERO,
            });
        }
        self.mirror.compact(core)
    }
}

impl<B: Backend> Core<B> {
    /// Rebuilds the index from `real` (every block where its bytes are,
    /// sorted by offset): the old index comes back with its owners and
    /// each block's old node (by block slot), for a shadow to keep.
    pub(super) fn rebuild_from(
        &mut self,
        real: &[LiveBlock],
    ) -> Result<(
        crate::placement::FreeIndex,
        Vec<Owner>,
        Vec<Option<Allocation>>,
    )> {
        let capacity = self.capacity();
        let fit = self.index.fit();
        let old = std::mem::replace(
            &mut self.index,
            crate::placement::FreeIndex::new(capacity).with_fit(fit),
        );
        let old_owners = std::mem::take(&mut self.owners);
        let spans: Vec<(u64, u64)> = real.iter().map(|l| (l.offset, l.len)).collect();
        let mut nodes: Vec<Option<Allocation>> = Vec::new();
        let Core {
            index,
            owners,
            blocks,
            ..
        } = self;
        let rebuilt = index.rebuild_with(&spans, |i, a| {
            let owner = Owner::of_live(&real[i]);
            crate::arena::block::set_owner(owners, a.slot(), owner);
            let slot = owner.key.slot() as usize;
            if let Some(b) = blocks.get_mut_live_slot(owner.key) {
                if let Place::Device(old_node) = std::mem::replace(&mut b.place, Place::Device(a)) {
                    if nodes.len() <= slot {
                        nodes.resize_with(slot + 1, || None);
                    }
                    nodes[slot] = Some(old_node);
                }
            }
        });
        if let Err(e) = rebuilt {
            return Err(self.broken("rebuilding the index from the bytes' layout failed", e));
        }
        Ok((old, old_owners, nodes))
    }
}
