//! The arena: one region, a table of handles, placement, and compaction.
//!
//! The arena owns the [`FreeIndex`] (where every block is), the slot table
//! (what every handle is), and a [`Backend`] (where the bytes are). An
//! allocation that fits in no hole but in the free bytes triggers a targeted
//! compaction (under [`CompactionPolicy::Auto`]); its plan is executed by the
//! backend, then the index is rebuilt from the new offsets.
//!
//! Every method that returns an error leaves the arena as it was, with one
//! exception: if the backend fails while executing a plan, device memory and
//! the table may disagree, so the arena poisons itself and every later call
//! returns [`Error::Poisoned`].

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod spill;
mod stats;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytemuck::Pod;
use slotmap::{Key, KeyData, SlotMap};

pub use stats::{fmt_bytes, CompactionReport, Stats};

use crate::backend::{Backend, HostBackend, MetaBackend};
use crate::config::{ArenaConfig, CompactionPolicy, MAX_ALIGN};
use crate::error::{Error, Result};
use crate::handle::{BlockInfo, BlockKey, ElemType, Handle, TableEntry};
use crate::placement::{FreeIndex, NodeId};
use crate::plan::planner::{self, LiveBlock, Request};
use crate::plan::{Plan, PlanKind};

/// Ids of arenas, so handles of one are rejected by another.
static NEXT_ARENA_ID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

/// Where a block's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// In the region: the placement node holds the offset (nowhere else does).
    Device(NodeId),
    /// Spilled to the host tier: the node of the tier's own index.
    Host(NodeId),
}

#[derive(Debug)]
struct Block {
    place: Place,
    size: u64,
    reserved: u64,
    align: u64,
    elem: Option<ElemType>,
    pins: u32,
    /// Position in the planner's live list during a compaction.
    scratch: u32,
    /// Tick of the last use (resolved for a kernel, a transfer or a pin):
    /// the spill policy evicts the least recently used block first.
    last_use: AtomicU64,
}

#[derive(Debug, Clone, Default)]
struct Counters {
    requested_bytes: u64,
    pinned_blocks: usize,
    peak_allocated_bytes: u64,
    evictions: u64,
    restores: u64,
    bytes_evicted: u64,
    bytes_restored: u64,
    allocs: u64,
    frees: u64,
    failed_allocs: u64,
    targeted: u64,
    full: u64,
    moves: u64,
    bytes_moved: u64,
    planning: std::time::Duration,
    compaction: std::time::Duration,
}

/// A compacting tensor arena over a backend `B`.
///
/// See the crate docs for the model. In short: [`alloc`](Arena::alloc)
/// returns a [`Handle`]; the block's offset may change at any call that
/// takes `&mut self` and can compact (allocations and
/// [`compact`](Arena::compact)), unless the block is pinned.
#[derive(Debug)]
pub struct Arena<B: Backend = HostBackend> {
    id: u32,
    config: ArenaConfig,
    backend: B,
    index: FreeIndex,
    blocks: SlotMap<BlockKey, Block>,
    /// Owner of each used placement node (entries of free nodes are stale).
    owners: Vec<BlockKey>,
    counters: Counters,
    poisoned: Option<String>,
    /// The host tier's index when spilling is on (`spill_host_bytes > 0`).
    tier: Option<FreeIndex>,
    /// Use clock for the spill policy's LRU.
    clock: AtomicU64,
    /// Slot -> (offset, version): what kernels read to resolve handles.
    table: Vec<TableEntry>,
    /// Slots changed since the backend's copy was last synced.
    dirty: Option<(usize, usize)>,
    // Reused between compactions.
    live: Vec<LiveBlock>,
    layout: Vec<(u64, u64, BlockKey)>,
    spans: Vec<(u64, u64)>,
    nodes: Vec<NodeId>,
}

impl Arena<HostBackend> {
    /// An arena in host memory: the backend of tests, docs and CI.
    pub fn host(config: ArenaConfig) -> Result<Self> {
        config.validate()?;
        let backend = HostBackend::new(config.capacity_bytes)?;
        Self::with_backend(config, backend)
    }
}

impl Arena<MetaBackend> {
    /// An arena that stores no bytes (placement and planning only).
    pub fn metadata(config: ArenaConfig) -> Result<Self> {
        config.validate()?;
        Self::with_backend(config.clone(), MetaBackend::new(config.capacity_bytes))
    }
}

impl<B: Backend> Arena<B> {
    /// An arena over `backend`, whose region must hold `config.capacity_bytes`.
    pub fn with_backend(config: ArenaConfig, mut backend: B) -> Result<Self> {
        config.validate()?;
        let tier = if config.spill_host_bytes > 0 {
            backend.reserve_host_tier(config.spill_host_bytes)?;
            Some(FreeIndex::new(config.spill_host_bytes))
        } else {
            None
        };
        if backend.capacity_bytes() < config.capacity_bytes {
            return Err(Error::BackendTooSmall {
                backend_bytes: backend.capacity_bytes(),
                capacity_bytes: config.capacity_bytes,
            });
        }
        Ok(Self {
            id: NEXT_ARENA_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            index: FreeIndex::new(config.capacity_bytes),
            config,
            backend,
            blocks: SlotMap::with_key(),
            owners: Vec::new(),
            counters: Counters::default(),
            poisoned: None,
            tier,
            clock: AtomicU64::new(0),
            table: Vec::new(),
            dirty: None,
            live: Vec::new(),
            layout: Vec::new(),
            spans: Vec::new(),
            nodes: Vec::new(),
        })
    }

    /// This arena's id (handles carry it).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The configuration.
    pub fn config(&self) -> &ArenaConfig {
        &self.config
    }

    /// Sets the compaction policy (for example to run a non-moving baseline).
    pub fn set_compaction(&mut self, policy: CompactionPolicy) {
        self.config.compaction = policy;
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, mutably: for backend extensions inside the crate only,
    /// since moving bytes behind the arena's back would corrupt it.
    #[allow(dead_code)]
    pub(crate) fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    fn check_usable(&self) -> Result<()> {
        match &self.poisoned {
            Some(reason) => Err(Error::Poisoned {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn block(&self, h: Handle) -> Result<&Block> {
        self.check_usable()?;
        if h.arena != self.id {
            return Err(Error::ForeignHandle {
                handle_arena: h.arena,
                arena: self.id,
            });
        }
        self.blocks.get(h.key).ok_or(Error::StaleHandle)
    }

    fn block_mut(&mut self, h: Handle) -> Result<&mut Block> {
        self.block(h)?;
        self.blocks.get_mut(h.key).ok_or(Error::StaleHandle)
    }

    /// The offset of a resident block (and a use, for the LRU).
    fn device_offset(&self, b: &Block) -> Result<u64> {
        b.last_use.store(self.tick(), Ordering::Relaxed);
        match b.place {
            Place::Device(node) => Ok(self.index.offset(node)),
            Place::Host(_) => Err(Error::NotResident),
        }
    }

    /// The current offset of a resident block, counted as a use; the
    /// resolution that views and pointers are built from.
    /// [`Error::NotResident`] for a spilled block: call
    /// [`make_resident`](Arena::make_resident) first.
    ///
    /// The offset is a plain number and goes stale at the next call that
    /// can compact; for kernels, take views (they borrow the arena, so no
    /// compaction can happen while they live) or pin the block.
    pub fn resolve(&self, h: Handle) -> Result<u64> {
        let b = self.block(h)?;
        self.device_offset(b)
    }

    // ---- allocation -------------------------------------------------------

    /// Allocates `bytes` at the arena's default alignment.
    pub fn alloc(&mut self, bytes: u64) -> Result<Handle> {
        self.alloc_impl(bytes, self.config.alignment_bytes, None)
    }

    /// Allocates `bytes` at `align_bytes` (a power of two; the arena's
    /// alignment is the floor).
    pub fn alloc_aligned(&mut self, bytes: u64, align_bytes: u64) -> Result<Handle> {
        self.alloc_impl(bytes, align_bytes, None)
    }

    /// Allocates `n` elements of `T`; the handle remembers `T`.
    pub fn alloc_elems<T: Pod>(&mut self, n: usize) -> Result<Handle> {
        let elem = std::mem::size_of::<T>() as u64;
        let bytes = (n as u64).checked_mul(elem).ok_or(Error::SizeOverflow {
            requested_bytes: n as u64,
            align_bytes: elem,
        })?;
        let align = (std::mem::align_of::<T>() as u64).max(self.config.alignment_bytes);
        self.alloc_impl(bytes, align, Some(ElemType::of::<T>()))
    }

    fn alloc_impl(&mut self, bytes: u64, align: u64, elem: Option<ElemType>) -> Result<Handle> {
        self.check_usable()?;
        if bytes == 0 {
            return Err(Error::ZeroSize);
        }
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(Error::InvalidAlignment {
                align_bytes: align,
                max_align_bytes: MAX_ALIGN,
            });
        }
        let align = align.max(self.config.alignment_bytes);
        let granule = self.config.alignment_bytes;
        let reserved = bytes
            .checked_add(granule - 1)
            .map(|b| b & !(granule - 1))
            .ok_or(Error::SizeOverflow {
                requested_bytes: bytes,
                align_bytes: granule,
            })?;
        if reserved > self.config.capacity_bytes {
            return Err(Error::TooLarge {
                requested_bytes: reserved,
                capacity_bytes: self.config.capacity_bytes,
            });
        }
        let node = self.place_on_device(reserved, align, &[])?;
        let key = self.blocks.insert(Block {
            place: Place::Device(node),
            size: bytes,
            reserved,
            align,
            elem,
            pins: 0,
            scratch: 0,
            last_use: AtomicU64::new(self.tick()),
        });
        self.set_owner(node, key);
        self.set_entry(key, Some((self.index.offset(node), bytes)));
        let c = &mut self.counters;
        c.allocs += 1;
        c.requested_bytes += bytes;
        let allocated = self.config.capacity_bytes - self.index.free_bytes();
        c.peak_allocated_bytes = c.peak_allocated_bytes.max(allocated);
        Ok(Handle {
            key,
            arena: self.id,
        })
    }

    /// Records a slot's new state: `Some((offset, bytes))` live, `None` freed.
    fn set_entry(&mut self, key: BlockKey, live: Option<(u64, u64)>) {
        let bits = key.data().as_ffi();
        let slot = (bits & 0xFFFF_FFFF) as usize;
        if self.table.len() <= slot {
            self.table.resize(slot + 1, TableEntry::default());
        }
        self.table[slot] = match live {
            Some((offset, bytes)) => TableEntry {
                offset,
                version: (bits >> 32) as u32,
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
    /// Kernels see the backend's copy, which matches it after every
    /// compaction and after [`flush_table`](Arena::flush_table).
    pub fn handle_table(&self) -> &[TableEntry] {
        &self.table
    }

    /// Sends the table's changed slots to the backend (on the CUDA backend:
    /// enqueued on the arena stream). Call before launching kernels that
    /// resolve handles allocated since the last compaction.
    pub fn flush_table(&mut self) -> Result<()> {
        self.check_usable()?;
        if let Some((lo, hi)) = self.dirty.take() {
            if let Err(e) = self.backend.sync_table(&self.table[lo..hi], lo) {
                self.dirty = Some((lo, hi));
                return Err(e);
            }
        }
        Ok(())
    }

    fn set_owner(&mut self, node: NodeId, key: BlockKey) {
        let i = node as usize;
        if self.owners.len() <= i {
            self.owners.resize(i + 1, BlockKey::null());
        }
        self.owners[i] = key;
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// Space for `reserved` bytes in the region: a hole, else a compaction,
    /// else (spilling on) evicting least recently used blocks not in `keep`.
    fn place_on_device(&mut self, reserved: u64, align: u64, keep: &[BlockKey]) -> Result<NodeId> {
        if let Some((node, _)) = self.index.alloc(reserved, align) {
            return Ok(node);
        }
        match self.alloc_by_compacting(reserved, align) {
            Err(Error::OutOfMemory { .. }) if self.tier.is_some() => {
                self.alloc_by_spilling(reserved, align, keep)
            }
            r => r,
        }
    }

    /// The slow path: compact (if allowed and useful), then place.
    fn alloc_by_compacting(&mut self, reserved: u64, align: u64) -> Result<NodeId> {
        let capacity = self.config.capacity_bytes;
        if self.config.compaction == CompactionPolicy::Auto && reserved <= self.index.free_bytes() {
            let req = Request {
                size: reserved,
                align,
            };
            let t0 = Instant::now();
            self.collect_live();
            let plan = planner::plan_targeted(&self.live, capacity, req);
            self.counters.planning += t0.elapsed();
            if let Some(plan) = plan {
                self.execute(plan, t0)?;
                if let Some((node, _)) = self.index.alloc(reserved, align) {
                    return Ok(node);
                }
            }
            // Targeted could not (pins, or holes too small for evacuees):
            // a full compaction, if it would make a hole big enough.
            let t0 = Instant::now();
            self.collect_live();
            if planner::largest_hole_after_full(&self.live, capacity, align) >= reserved {
                let plan = planner::plan_full(&self.live, capacity);
                self.counters.planning += t0.elapsed();
                self.execute(plan, t0)?;
                if let Some((node, _)) = self.index.alloc(reserved, align) {
                    return Ok(node);
                }
            }
        }
        if self.tier.is_none() {
            self.counters.failed_allocs += 1;
        }
        self.collect_live();
        Err(Error::OutOfMemory {
            requested_bytes: reserved,
            free_bytes: self.index.free_bytes(),
            largest_free_bytes: self.index.largest_free(),
            reachable_bytes: planner::largest_hole_after_full(&self.live, capacity, align),
        })
    }

    /// Frees a block. Pinned blocks cannot be freed.
    pub fn free(&mut self, h: Handle) -> Result<()> {
        let b = self.block(h)?;
        if b.pins > 0 {
            return Err(Error::Pinned { pins: b.pins });
        }
        let (place, size) = (b.place, b.size);
        match place {
            Place::Device(node) => self.index.free(node),
            Place::Host(node) => {
                if let Some(tier) = self.tier.as_mut() {
                    tier.free(node);
                }
            }
        }
        self.blocks.remove(h.key);
        self.set_entry(h.key, None);
        self.counters.frees += 1;
        self.counters.requested_bytes -= size;
        Ok(())
    }

    // ---- queries ------------------------------------------------------------

    /// Everything known about a live block.
    pub fn info(&self, h: Handle) -> Result<BlockInfo> {
        let b = self.block(h)?;
        Ok(self.info_of(h, b))
    }

    fn info_of(&self, handle: Handle, b: &Block) -> BlockInfo {
        let (offset, resident) = match b.place {
            Place::Device(node) => (self.index.offset(node), true),
            Place::Host(_) => (0, false),
        };
        BlockInfo {
            handle,
            offset,
            resident,
            size_bytes: b.size,
            reserved_bytes: b.reserved,
            align_bytes: b.align,
            elem: b.elem,
            pins: b.pins,
        }
    }

    /// Bytes asked for when the block was allocated.
    pub fn size_bytes(&self, h: Handle) -> Result<u64> {
        Ok(self.block(h)?.size)
    }

    /// Alignment of the block's offset.
    pub fn align_bytes(&self, h: Handle) -> Result<u64> {
        Ok(self.block(h)?.align)
    }

    /// Element type, for blocks from [`alloc_elems`](Arena::alloc_elems).
    pub fn elem_type(&self, h: Handle) -> Result<Option<ElemType>> {
        Ok(self.block(h)?.elem)
    }

    /// True if the handle names a live block of this arena.
    pub fn contains(&self, h: Handle) -> bool {
        h.arena == self.id && self.blocks.contains_key(h.key)
    }

    /// Live blocks in address order.
    pub fn blocks(&self) -> Vec<BlockInfo> {
        self.index
            .regions()
            .filter_map(|r| r.node)
            .filter_map(|node| {
                let key = *self.owners.get(node as usize)?;
                let b = self.blocks.get(key)?;
                Some(self.info_of(
                    Handle {
                        key,
                        arena: self.id,
                    },
                    b,
                ))
            })
            .collect()
    }

    /// Free regions `(offset, len)` in address order.
    pub fn free_regions(&self) -> Vec<(u64, u64)> {
        self.index
            .regions()
            .filter(|r| r.node.is_none())
            .map(|r| (r.offset, r.size))
            .collect()
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> Stats {
        let r = self.index.report();
        let c = &self.counters;
        Stats {
            capacity_bytes: self.config.capacity_bytes,
            allocated_bytes: self.config.capacity_bytes - r.free_bytes,
            requested_bytes: c.requested_bytes,
            free_bytes: r.free_bytes,
            largest_free_bytes: r.largest_free_bytes,
            fragmentation: if r.free_bytes == 0 {
                0.0
            } else {
                1.0 - r.largest_free_bytes as f64 / r.free_bytes as f64
            },
            live_blocks: self.blocks.len(),
            free_regions: r.free_regions,
            pinned_blocks: c.pinned_blocks,
            peak_allocated_bytes: c.peak_allocated_bytes,
            allocs: c.allocs,
            frees: c.frees,
            failed_allocs: c.failed_allocs,
            targeted_compactions: c.targeted,
            full_compactions: c.full,
            moves: c.moves,
            bytes_moved: c.bytes_moved,
            planning_time: c.planning,
            compaction_time: c.compaction,
            evictions: c.evictions,
            restores: c.restores,
            bytes_evicted: c.bytes_evicted,
            bytes_restored: c.bytes_restored,
            host_tier_used_bytes: self
                .tier
                .as_ref()
                .map_or(0, |t| t.capacity() - t.free_bytes()),
        }
    }

    /// The statistics as a readable table.
    pub fn summary(&self) -> String {
        self.stats().summary()
    }

    // ---- data -----------------------------------------------------------------

    fn check_type<T: Pod>(b: &Block) -> Result<()> {
        let want = ElemType::of::<T>();
        match b.elem {
            Some(e) if e.id != want.id => Err(Error::TypeMismatch {
                block_type: e.name,
                requested_type: want.name,
            }),
            _ => Ok(()),
        }
    }

    /// Writes `data` into the block; `data` must be exactly the block's size.
    pub fn write<T: Pod>(&mut self, h: Handle, data: &[T]) -> Result<()> {
        self.block(h)?;
        self.make_resident(&[h])?;
        let b = self.block(h)?;
        Self::check_type::<T>(b)?;
        let bytes: &[u8] = bytemuck::cast_slice(data);
        if bytes.len() as u64 != b.size {
            return Err(Error::LengthMismatch {
                block_bytes: b.size,
                slice_bytes: bytes.len() as u64,
            });
        }
        let offset = self.device_offset(b)?;
        self.backend.write(offset, bytes)
    }

    /// Reads the block into `out`, which must be exactly the block's size.
    pub fn read_into<T: Pod>(&mut self, h: Handle, out: &mut [T]) -> Result<()> {
        self.block(h)?;
        self.make_resident(&[h])?;
        let b = self.block(h)?;
        Self::check_type::<T>(b)?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        if bytes.len() as u64 != b.size {
            return Err(Error::LengthMismatch {
                block_bytes: b.size,
                slice_bytes: bytes.len() as u64,
            });
        }
        let offset = self.device_offset(b)?;
        self.backend.read(offset, bytes)
    }

    /// Reads the block as a `Vec<T>`.
    pub fn read<T: Pod>(&mut self, h: Handle) -> Result<Vec<T>> {
        let b = self.block(h)?;
        Self::check_type::<T>(b)?;
        let elem = std::mem::size_of::<T>() as u64;
        if elem == 0 || b.size % elem != 0 {
            return Err(Error::NotWholeElements {
                block_bytes: b.size,
                elem_bytes: elem,
            });
        }
        let n = usize::try_from(b.size / elem).map_err(|_| Error::TooLarge {
            requested_bytes: b.size,
            capacity_bytes: usize::MAX as u64,
        })?;
        let mut out = vec![T::zeroed(); n];
        self.read_into(h, &mut out)?;
        Ok(out)
    }

    // ---- pinning ----------------------------------------------------------------

    /// Pins a block: it never moves until every pin is released. Pins nest.
    /// A spilled block is brought back first.
    pub fn pin(&mut self, h: Handle) -> Result<u32> {
        self.block(h)?;
        self.make_resident(&[h])?;
        let b = self.block_mut(h)?;
        b.pins = b
            .pins
            .checked_add(1)
            .ok_or(Error::PinOverflow { pins: b.pins })?;
        let pins = b.pins;
        if pins == 1 {
            self.counters.pinned_blocks += 1;
        }
        Ok(pins)
    }

    /// Releases one pin; returns the pins left.
    pub fn unpin(&mut self, h: Handle) -> Result<u32> {
        let b = self.block_mut(h)?;
        if b.pins == 0 {
            return Err(Error::NotPinned);
        }
        b.pins -= 1;
        let pins = b.pins;
        if pins == 0 {
            self.counters.pinned_blocks -= 1;
        }
        Ok(pins)
    }

    // ---- compaction ---------------------------------------------------------------

    /// Fills `self.live` with the live blocks in address order.
    fn collect_live(&mut self) {
        self.live.clear();
        for r in self.index.regions() {
            let Some(node) = r.node else { continue };
            let Some(&key) = self.owners.get(node as usize) else {
                continue;
            };
            if let Some(b) = self.blocks.get_mut(key) {
                b.scratch = self.live.len() as u32;
                self.live.push(LiveBlock {
                    key: key.data().as_ffi(),
                    offset: r.offset,
                    len: b.reserved,
                    copy_len: b.size,
                    align: b.align,
                    pinned: b.pins > 0,
                });
            }
        }
    }

    /// The plan a full compaction would run now (for inspection).
    pub fn plan_full(&mut self) -> Plan {
        self.collect_live();
        planner::plan_full(&self.live, self.config.capacity_bytes)
    }

    /// Compacts fully: afterwards the free space between pinned blocks is one
    /// region per gap (one region in all without pins).
    pub fn compact(&mut self) -> Result<CompactionReport> {
        self.check_usable()?;
        let t0 = Instant::now();
        let plan = self.plan_full();
        self.counters.planning += t0.elapsed();
        self.execute(plan, t0)
    }

    /// Runs a plan made from `self.live` and moves the table to match.
    fn execute(&mut self, plan: Plan, t0: Instant) -> Result<CompactionReport> {
        let planning = t0.elapsed();
        let t1 = Instant::now();
        if let Err(e) = self.backend.execute(&plan) {
            self.poisoned = Some(format!("compaction failed part-way: {e}"));
            return Err(e);
        }
        let execution = t1.elapsed();
        // New layout: every live block at its old or new offset.
        self.layout.clear();
        self.layout.extend(
            self.live
                .iter()
                .map(|l| (l.offset, l.len, BlockKey::from(KeyData::from_ffi(l.key)))),
        );
        for m in plan.moves() {
            let key = BlockKey::from(KeyData::from_ffi(m.key));
            if let Some(b) = self.blocks.get(key) {
                self.layout[b.scratch as usize].0 = m.dst;
                let size = b.size;
                self.set_entry(key, Some((m.dst, size)));
            }
        }
        if !self.layout.windows(2).all(|w| w[0].0 <= w[1].0) {
            self.layout.sort_unstable_by_key(|e| e.0);
        }
        self.spans.clear();
        self.spans.extend(self.layout.iter().map(|e| (e.0, e.1)));
        self.index.rebuild(&self.spans, &mut self.nodes);
        for i in 0..self.layout.len() {
            let (key, node) = (self.layout[i].2, self.nodes[i]);
            if let Some(b) = self.blocks.get_mut(key) {
                b.place = Place::Device(node);
            }
            self.set_owner(node, key);
        }
        // The table's new offsets follow the moves in stream order.
        if let Err(e) = self.flush_table() {
            self.poisoned = Some(format!(
                "handle table update failed after a compaction: {e}"
            ));
            return Err(e);
        }
        let c = &mut self.counters;
        match plan.kind {
            PlanKind::Targeted => c.targeted += 1,
            PlanKind::Full => c.full += 1,
        }
        c.moves += plan.move_count() as u64;
        c.bytes_moved += plan.bytes_moved();
        c.compaction += t0.elapsed();
        Ok(CompactionReport {
            kind: plan.kind,
            moves: plan.move_count(),
            waves: plan.waves.len(),
            bytes_moved: plan.bytes_moved(),
            planning,
            execution,
        })
    }
}
