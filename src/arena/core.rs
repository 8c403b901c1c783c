//! The arena's core: where every block is, and how a plan is run.
//!
//! [`Core`] owns the placement index (where blocks are placed), the block
//! table (what every handle is), the owner of each index node, the handle
//! table (where each block's bytes are, as kernels read it), the backend
//! and the counters of what moved. The compaction policies
//! (`super::policy`) and spilling decide; the core carries out: it
//! collects the live blocks, checks a plan against them, has the backend
//! execute it, and moves the index and the tables to match.
//!
//! A block's bytes are where its index entry says, except under a policy
//! that defers moves (`src/plan/lag.rs`): then `Block::lag` says where they
//! are, and the handle table follows the bytes.
//!
//! Every method that returns an error leaves the core as it was, except a
//! backend failure while executing a plan: device memory and the tables
//! may then disagree, so the core poisons itself and every later call
//! returns [`Error::Poisoned`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::block::{set_owner, Block, Counters, Owner, Place};
use super::order::StreamOrder;
use super::CompactionReport;
use crate::backend::Backend;
use crate::error::{BackendError, Error, Result};
use crate::handle::{BlockKey, Handle, TableEntry};
use crate::placement::{Allocation, Fit, FreeIndex};
use crate::plan::planner::LiveBlock;
use crate::plan::{track, Plan, PlanKind};
use crate::slots::Slots;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Core<B: Backend> {
    /// The arena's id (handles carry it).
    pub(super) id: u64,
    pub(super) backend: B,
    pub(super) index: FreeIndex,
    pub(super) blocks: Slots<Block>,
    /// Owner of each used placement node (entries of free nodes are stale);
    /// kept in step with the block's pins.
    pub(super) owners: Vec<Owner>,
    pub(super) counters: Counters,
    /// Set once, by the first failure that leaves device memory and the
    /// tables in doubt (a fault the GPU found included); never cleared.
    poisoned: std::sync::OnceLock<String>,
    /// What other streams must wait for.
    pub(super) order: StreamOrder,
    /// Slot -> (offset of the bytes, version): what kernels read to
    /// resolve handles.
    table: Vec<TableEntry>,
    /// Slots changed since the backend's copy was last synced.
    dirty: Option<(usize, usize)>,
    /// The live blocks, collected for a plan (scratch, reused).
    pub(super) live: Vec<LiveBlock>,
    /// Per block slot, its position in `live` during a compaction.
    live_pos: Vec<u32>,
    /// The positions in `live` of a plan's moved blocks, and room to sort
    /// them (see `sort_moved`).
    moved: (Vec<u32>, Vec<LiveBlock>),
    /// A checked plan's moved blocks: key, final offset, data bytes.
    finals: Vec<(BlockKey, u64, u64)>,
    /// Whether the plan last checked moves blocks in pieces.
    pieces: bool,
    spans: Vec<(u64, u64)>,
    /// Use clock for the spill policy's LRU.
    pub(super) clock: AtomicU64,
}

impl<B: Backend> Core<B> {
    pub(super) fn new(id: u64, backend: B, capacity: u64, fit: Fit) -> Self {
        // Streams the backend had registered before it was given to the
        // arena have their entries too.
        let streams = backend.stream_count();
        Self {
            id,
            index: FreeIndex::new(capacity).with_fit(fit),
            backend,
            blocks: Slots::default(),
            owners: Vec::new(),
            counters: Counters::default(),
            poisoned: std::sync::OnceLock::new(),
            order: StreamOrder::new(streams),
            table: Vec::new(),
            dirty: None,
            live: Vec::new(),
            live_pos: Vec::new(),
            moved: (Vec::new(), Vec::new()),
            finals: Vec::new(),
            pieces: false,
            spans: Vec::new(),
            clock: AtomicU64::new(0),
        }
    }

    /// Bytes the index manages.
    pub(super) fn capacity(&self) -> u64 {
        self.index.capacity()
    }

    pub(super) fn check_usable(&self) -> Result<()> {
        match self.poisoned.get() {
            Some(reason) => Err(Error::Poisoned {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Marks the arena unusable; the first reason sticks.
    pub(super) fn poison(&self, reason: String) {
        let _ = self.poisoned.set(reason);
    }

    /// Poisons the arena for a failure that leaves its records in doubt
    /// (`what` failed with `e`: the placement index or the planner refused
    /// the arena's own input, which is a bug) and returns the error that
    /// every later call reports.
    pub(super) fn broken(&self, what: &str, e: impl std::fmt::Display) -> Error {
        self.poison(format!("{what}: {e}"));
        Error::Poisoned {
            reason: self.poisoned.get().cloned().unwrap_or_default(),
        }
    }

    /// Passes `r` through, poisoning the arena on a fault the device
    /// reported: its bytes are undefined from then on.
    pub(super) fn sticky<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(Error::Backend(BackendError::DeviceFault { reason })) = &r {
            self.poison(format!("device fault: {reason}"));
        }
        r
    }

    /// A usable arena, and `h` is this arena's.
    fn check_handle(&self, h: Handle) -> Result<()> {
        self.check_usable()?;
        if h.arena != self.id {
            return Err(Error::Foreign {
                kind: "handle",
                owner: h.arena,
                arena: self.id,
            });
        }
        Ok(())
    }

    // Matches rather than `ok_or(Error::StaleHandle)`, which builds the
    // error and drops it on every successful lookup (a call: `Error` owns
    // strings).
    pub(super) fn block(&self, h: Handle) -> Result<&Block> {
        self.check_handle(h)?;
        match self.blocks.get(h.key) {
            Some(b) => Ok(b),
            None => Err(Error::StaleHandle),
        }
    }

    pub(super) fn block_mut(&mut self, h: Handle) -> Result<&mut Block> {
        self.check_handle(h)?;
        match self.blocks.get_mut(h.key) {
            Some(b) => Ok(b),
            None => Err(Error::StaleHandle),
        }
    }

    /// The offset of a resident block's bytes (and a use, for the LRU).
    pub(super) fn device_offset(&self, b: &Block) -> Result<u64> {
        b.last_use.store(self.tick(), Ordering::Relaxed);
        b.real_offset().ok_or(Error::NotResident)
    }

    pub(super) fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// [`Core::tick`] without the atomic read-modify-write, under `&mut`.
    pub(super) fn tick_mut(&mut self) -> u64 {
        let clock = self.clock.get_mut();
        let now = *clock;
        *clock = now.wrapping_add(1);
        now
    }

    /// Records a slot's new state: `Some((offset, bytes))` live, `None` freed.
    pub(super) fn set_entry(&mut self, key: BlockKey, live: Option<(u64, u64)>) {
        let slot = key.slot() as usize;
        if self.table.len() <= slot {
            self.table.resize(slot + 1, TableEntry::default());
        }
        self.table[slot] = match live {
            Some((offset, bytes)) => TableEntry {
                offset,
                version: key.version(),
                len: u32::try_from(bytes).unwrap_or(u32::MAX),
            },
            None => TableEntry::default(),
        };
        self.dirty = Some(match self.dirty {
            Some((lo, hi)) => (lo.min(slot), hi.max(slot + 1)),
            None => (slot, slot + 1),
        });
    }

    /// The handle table (slot -> offset, version) as the arena sees it now.
    #[cfg_attr(not(any(test, feature = "cuda")), allow(dead_code))]
    pub(super) fn handle_table(&self) -> &[TableEntry] {
        &self.table
    }

    /// Sends the table's changed slots to the backend (on the CUDA backend:
    /// enqueued on the arena stream).
    pub(super) fn flush_table(&mut self) -> Result<()> {
        self.check_usable()?;
        if let Some((lo, hi)) = self.dirty.take() {
            // Other streams resolving handles must see the update.
            self.order.queued();
            let r = self.backend.sync_table(&self.table[lo..hi], lo);
            if let Err(e) = self.sticky(r) {
                self.dirty = Some((lo, hi));
                return Err(e);
            }
        }
        Ok(())
    }

    /// Records block `key` (live) as the owner of placement node `slot`.
    pub(super) fn set_owner(&mut self, slot: u32, key: BlockKey) {
        let Some(b) = self.blocks.get(key) else {
            return;
        };
        let owner = Owner {
            key,
            size: b.size,
            align: b.align,
            pinned: b.pins > 0,
        };
        set_owner(&mut self.owners, slot, owner);
    }

    /// Copies block `key`'s pin state to its node's owner entry (a block
    /// in the host tier has none).
    pub(super) fn sync_pinned(&mut self, key: BlockKey) {
        if let Some(b) = self.blocks.get(key) {
            if let Place::Device(a) = &b.place {
                if let Some(o) = self.owners.get_mut(a.slot() as usize) {
                    o.pinned = b.pins > 0;
                }
            }
        }
    }

    /// Makes the arena stream wait for the streams that used block `key`.
    pub(super) fn wait_uses(&self, key: BlockKey) -> Result<()> {
        if let Some(b) = self.blocks.get(key) {
            for s in b.uses() {
                self.backend.wait_stream(s)?;
            }
        }
        Ok(())
    }

    /// Gives a placement back (the arena's own node: unreachable failure).
    pub(super) fn give_back(&mut self, node: Allocation) -> Result<()> {
        self.index
            .free(node)
            .map_err(|e| self.broken("giving a placement back failed", e))
    }

    // ---- plans --------------------------------------------------------

    /// Fills `live` with the live blocks in address order of their index
    /// entries.
    pub(super) fn collect_live(&mut self) {
        self.live.clear();
        // Exact sizes up front, here and for the other per-compaction
        // tables: growing them by doubling copies them and leaves freed
        // chunks behind (fresh pages, page faults, on large arenas).
        self.live.reserve(self.blocks.len());
        if self.live_pos.len() < self.blocks.slot_count() {
            self.live_pos.resize(self.blocks.slot_count(), 0);
        }
        for r in self.index.regions() {
            let Some(slot) = r.slot else { continue };
            // A used node's owner is its live block (see `Owner`), and the
            // node's size is the block's reservation.
            let Some(o) = self.owners.get(slot as usize) else {
                continue;
            };
            debug_assert!(self.blocks.contains_key(o.key), "stale owner {o:?}");
            if let Some(p) = self.live_pos.get_mut(o.key.slot() as usize) {
                *p = self.live.len() as u32;
            }
            self.live.push(o.live_block(r.offset, r.size));
        }
    }

    /// Runs `plan`, made from `live` (the index's layout, every block at
    /// its entry), and moves the index and the tables to match. The plan's
    /// final layout is checked first (every move names a live, unpinned
    /// block and copies its data, whole or in pieces; the blocks end whole,
    /// aligned, disjoint and inside the region): a plan that fails the
    /// check is refused with [`Error::InvalidInput`] and nothing changes.
    pub(super) fn run(&mut self, plan: Plan, t0: Instant) -> Result<CompactionReport> {
        let report = self.run_keeping_index(&plan, t0)?;
        self.rebuild_index()?;
        Ok(report)
    }

    /// [`run`](Self::run) without rebuilding the index: for a caller that
    /// puts another index in its place (`adopt`), which must describe the
    /// final layout (`live`, sorted by offset, after the call).
    pub(super) fn run_keeping_index(
        &mut self,
        plan: &Plan,
        t0: Instant,
    ) -> Result<CompactionReport> {
        let planning = t0.elapsed();
        let used_on_streams = self.check_final_layout(plan)?;
        // Nothing moves under a kernel still using it on another stream.
        if used_on_streams {
            for &(key, _, _) in &self.finals {
                self.wait_uses(key)?;
            }
        }
        let report = self.execute(plan, t0, planning)?;
        if self.pieces {
            self.counters.piece_plans += 1;
        }
        // In plan order: a block moved twice ends at its last move.
        let finals = std::mem::take(&mut self.finals);
        for &(key, offset, bytes) in &finals {
            self.set_entry(key, Some((offset, bytes)));
        }
        self.finals = finals;
        self.flush_after_moves()?;
        Ok(report)
    }

    /// Runs moves whose blocks' index entries do not change (deferred
    /// moves going home): the caller has checked them and waited for
    /// their uses; `finals` gives each moved block's new bytes offset.
    pub(super) fn run_moves(
        &mut self,
        plan: &Plan,
        finals: &[(BlockKey, u64, u64)],
        t0: Instant,
    ) -> Result<CompactionReport> {
        let report = self.execute(plan, t0, t0.elapsed())?;
        for &(key, offset, bytes) in finals {
            self.set_entry(key, Some((offset, bytes)));
        }
        self.flush_after_moves()?;
        Ok(report)
    }

    /// Has the backend execute `plan` and counts it.
    fn execute(
        &mut self,
        plan: &Plan,
        t0: Instant,
        planning: std::time::Duration,
    ) -> Result<CompactionReport> {
        self.order.queued();
        let t1 = Instant::now();
        if let Err(e) = self.backend.execute(plan) {
            self.poison(format!("compaction failed part-way: {e}"));
            return Err(e);
        }
        let execution = t1.elapsed();
        let c = &mut self.counters;
        match plan.kind() {
            PlanKind::Targeted => c.targeted += 1,
            PlanKind::Full => c.full += 1,
        }
        c.moves = c.moves.saturating_add(plan.move_count() as u64);
        c.bytes_moved = c.bytes_moved.saturating_add(plan.bytes_moved());
        c.compaction += t0.elapsed();
        Ok(CompactionReport {
            kind: plan.kind(),
            moves: plan.move_count() as u64,
            waves: plan.waves().len() as u64,
            bytes_moved: plan.bytes_moved(),
            planning,
            execution,
        })
    }

    /// The table's new offsets follow the moves in stream order.
    fn flush_after_moves(&mut self) -> Result<()> {
        if let Err(e) = self.flush_table() {
            self.poison(format!("handle table update failed after moves: {e}"));
            return Err(e);
        }
        Ok(())
    }

    /// Rebuilds the index from `live` (the layout a checked plan left,
    /// sorted by offset), each block's new allocation going straight to
    /// its owner entry and block. Poisons the arena if it fails
    /// (unreachable: the layout was checked).
    pub(super) fn rebuild_index(&mut self) -> Result<()> {
        self.spans.clear();
        self.spans
            .extend(self.live.iter().map(|l| (l.offset, l.len)));
        let Core {
            index,
            spans,
            live,
            owners,
            blocks,
            ..
        } = self;
        let rebuilt = index.rebuild_with(spans, |i, a| {
            let owner = Owner::of_live(&live[i]);
            let key = owner.key;
            set_owner(owners, a.slot(), owner);
            // Live: the list was collected from the live blocks just now.
            if let Some(b) = blocks.get_mut_live_slot(key) {
                b.place = Place::Device(a);
            }
        });
        if let Err(e) = rebuilt {
            // Unreachable: the layout was checked before.
            return Err(self.broken("rebuilding the index after a compaction failed", e));
        }
        Ok(())
    }

    /// Puts `index` (with `owners`, its node owners) in place of the
    /// arena's own, each block taking its node from `node_of`: an index
    /// that describes the layout the bytes are in now, with its own
    /// history (free lists, node slots), so that it goes on placing as
    /// the index it was taken from would.
    pub(super) fn adopt(
        &mut self,
        index: FreeIndex,
        owners: Vec<Owner>,
        mut node_of: impl FnMut(BlockKey) -> Option<Allocation>,
    ) {
        for o in index
            .regions()
            .filter_map(|r| r.slot)
            .filter_map(|s| owners.get(s as usize))
        {
            // Only a live block takes its node: a region's owner entry can
            // be stale (the pending request's region keeps its previous
            // owner until the commit), and asking for a stale key's node
            // would take the node of the live block in its slot.
            if let Some(b) = self.blocks.get_mut(o.key) {
                if let Some(node) = node_of(o.key) {
                    b.place = Place::Device(node);
                }
            }
        }
        self.index = index;
        self.owners = owners;
    }

    /// Turns `live` into the layout after `plan` (offsets moved, sorted
    /// by offset; it is scratch, recollected before every plan) and checks
    /// it (see [`run`](Self::run)); `finals` gets each moved block's key,
    /// final offset and data bytes. O(blocks + moves) for whole-block
    /// plans. Returns whether a moved block was used on other streams (so
    /// that execution reads each moved block's records once, here).
    pub(super) fn check_final_layout(&mut self, plan: &Plan) -> Result<bool> {
        let invalid = |reason: String| {
            Err(Error::InvalidInput {
                input: "plan",
                reason,
            })
        };
        self.moved.0.clear();
        self.finals.clear();
        let mut pieces = false;
        for m in plan.moves() {
            let key = BlockKey::from_bits(m.key);
            // A key whose position holds that very key (version included)
            // names a block of the live list, so a live block.
            let i = match self.live_pos.get(key.slot() as usize) {
                Some(&i) => i as usize,
                None => return invalid(format!("move {m:?} names no live block")),
            };
            let Some(l) = self.live.get_mut(i).filter(|l| l.key == m.key) else {
                return invalid(format!(
                    "move {m:?} names a block outside the plan's live set"
                ));
            };
            if m.len != l.copy_len {
                // A piece of a block: followed piece by piece below.
                pieces = true;
                break;
            }
            if l.pinned || l.offset != m.src || m.dst % l.align != 0 {
                return invalid(format!(
                    "move {m:?} does not match its block (pinned {}, at {}, alignment {})",
                    l.pinned, l.offset, l.align
                ));
            }
            l.offset = m.dst;
            self.moved.0.push(i as u32);
            self.finals.push((key, m.dst, m.len));
        }
        if pieces {
            self.follow_pieces(plan)?;
        }
        self.pieces = pieces;
        let mut used_on_streams = false;
        if self.order.other_streams {
            for &(key, _, _) in &self.finals {
                used_on_streams |= self.blocks.get(key).is_some_and(|b| !b.uses().is_empty());
            }
        }
        if !self.live.windows(2).all(|w| w[0].offset <= w[1].offset) {
            let (positions, entries) = &mut self.moved;
            sort_moved(&mut self.live, positions, entries);
        }
        let capacity = self.capacity();
        let mut cursor = 0u64;
        for &LiveBlock { offset, len, .. } in &self.live {
            let end = offset.checked_add(len).filter(|&e| e <= capacity);
            match end {
                Some(end) if offset >= cursor => cursor = end,
                _ => {
                    return invalid(format!(
                        "after the plan a block at {offset} of {len} B overlaps the one below \
                         (ending at {cursor}) or leaves the region of {capacity} B"
                    ))
                }
            }
        }
        Ok(used_on_streams)
    }

    /// The piece-by-piece check of [`check_final_layout`]: re-collects
    /// `live` (the plan was made from the index layout) and moves each
    /// block to the final offset its pieces give.
    fn follow_pieces(&mut self, plan: &Plan) -> Result<()> {
        self.collect_live();
        let live_pos = &self.live_pos;
        let finals = track::final_offsets(plan, &self.live, |k| {
            let key = BlockKey::from_bits(k);
            live_pos.get(key.slot() as usize).map(|&i| i as usize)
        })
        .map_err(|e| Error::InvalidInput {
            input: "plan",
            reason: e.to_string(),
        })?;
        self.moved.0.clear();
        self.finals.clear();
        for (i, f) in finals {
            let l = &mut self.live[i];
            l.offset = f;
            self.moved.0.push(i as u32);
            self.finals
                .push((BlockKey::from_bits(l.key), f, l.copy_len));
        }
        Ok(())
    }
}

/// Sorts `live` by offset when only the entries at `moved` (positions in
/// any order, maybe repeated) can be out of order, the rest ascending: the
/// moved entries are taken out (into `out`), sorted, and merged back.
/// O(n + k log k) for k moves, where sorting the whole list is O(n log n)
/// on every targeted evacuation (its few evacuees land out of order).
fn sort_moved(live: &mut [LiveBlock], moved: &mut Vec<u32>, out: &mut Vec<LiveBlock>) {
    moved.sort_unstable();
    moved.dedup();
    out.clear();
    let mut next = moved.iter().copied().peekable();
    let mut kept = 0;
    for r in 0..live.len() {
        if next.peek() == Some(&(r as u32)) {
            next.next();
            out.push(live[r]);
        } else {
            live[kept] = live[r];
            kept += 1;
        }
    }
    out.sort_unstable_by_key(|l| l.offset);
    // Merge from the top down into the room the moved entries left.
    let (mut i, mut j) = (kept, out.len());
    for k in (0..live.len()).rev() {
        let take_kept = j == 0 || (i > 0 && live[i - 1].offset > out[j - 1].offset);
        if take_kept {
            live[k] = live[i - 1];
            i -= 1;
        } else {
            live[k] = out[j - 1];
            j -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blk(offset: u64) -> LiveBlock {
        LiveBlock {
            key: offset,
            offset,
            len: 1,
            copy_len: 1,
            align: 1,
            pinned: false,
        }
    }

    proptest::proptest! {
        /// Moving any few blocks anywhere and merging them back gives what a
        /// full sort gives.
        #[test]
        fn merging_the_moved_blocks_back_sorts_the_list(
            n in 1usize..40,
            picks in proptest::collection::vec((0usize..40, 0u64..420), 0..6),
        ) {
            let mut live: Vec<LiveBlock> = (0..n as u64).map(|i| blk(10 * i)).collect();
            let mut moved = Vec::new();
            for (i, offset) in picks {
                let i = i % n;
                live[i].offset = offset % (10 * n as u64 + 20);
                moved.push(i as u32);
            }
            let mut want: Vec<u64> = live.iter().map(|l| l.offset).collect();
            want.sort_unstable();
            sort_moved(&mut live, &mut moved, &mut Vec::new());
            let got: Vec<u64> = live.iter().map(|l| l.offset).collect();
            proptest::prop_assert_eq!(got, want);
        }
    }
}
