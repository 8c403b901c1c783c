//! The arena: one region, a table of handles, placement, and compaction.
//!
//! The arena owns the [`FreeIndex`] (where every block is), the slot table
//! (what every handle is), and a [`Backend`] (where the bytes are). An
//! allocation that fits in no hole but in the free bytes triggers a
//! compaction. Under [`CompactionPolicy::Auto`] it is naive's full
//! compaction applied to the index, with only the moves the request needs
//! executed and the rest deferred (`src/plan/lag.rs`): a block whose
//! bytes have not followed its index entry yet records where they are
//! (`Block::lag`). Under [`CompactionPolicy::Targeted`] it is targeted, or
//! full when the pacer of `src/plan/policy.rs` says so. A plan is
//! executed by the backend, then the index is rebuilt from the new offsets.
//!
//! Every method that returns an error leaves the arena as it was, with one
//! exception: if the backend fails while executing a plan, device memory and
//! the table may disagree, so the arena poisons itself and every later call
//! returns [`Error::Poisoned`].

mod alloc;
mod block;
mod bytes;
mod compaction;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod defer;
mod place;
mod relocate;
mod shadow;
mod shared;
mod spill;
mod stats;
mod stats_cell;
mod streams;
#[cfg(test)]
mod table_tests;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};

use crate::slots::Slots;
use block::{set_owner, Block, Counters, Owner, Place};

pub use shared::SharedArena;
pub use stats::{fmt_bytes, CompactionReport, Stats};

use crate::backend::{Backend, HostBackend, MetaBackend};
use crate::config::{ArenaConfig, CompactionPolicy};
use crate::error::{BackendError, Error, Result};
use crate::handle::{BlockInfo, BlockKey, Handle, TableEntry};
use crate::placement::{FreeIndex, Lifetimes};
use crate::plan::lag::Lag;
use crate::plan::planner::LiveBlock;
use crate::plan::policy::Pacer;

/// Ids of arenas, so handles of one are rejected by another: the next id
/// to hand out.
static NEXT_ARENA_ID: AtomicU64 = AtomicU64::new(1);

/// Takes the next id from `counter`, or refuses once they are all used: an
/// id is never handed out twice, so no arena accepts another's handles.
/// 64 bits: a process making an arena every nanosecond runs out after 584
/// years, but the refusal keeps that from wrapping all the same.
fn take_arena_id(counter: &AtomicU64) -> Result<u64> {
    counter
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |id| id.checked_add(1))
        .map_err(|_| Error::LimitReached {
            what: "arena ids in this process",
            requested: u64::MAX,
            limit: u64::MAX - 1,
        })
}

/// A compacting tensor arena over a backend `B`.
///
/// See the crate docs for the model. In short: [`alloc`](Arena::alloc)
/// returns a [`Handle`]; the block's offset may change at any call that
/// takes `&mut self` and can compact (allocations and
/// [`compact`](Arena::compact)), unless the block is pinned.
#[derive(Debug)]
pub struct Arena<B: Backend = HostBackend> {
    id: u64,
    config: ArenaConfig,
    backend: B,
    index: FreeIndex,
    blocks: Slots<Block>,
    /// Owner of each used placement node (entries of free nodes are stale);
    /// kept in step with the block's pins.
    owners: Vec<Owner>,
    counters: Counters,
    /// Set once, by the first failure that leaves device memory and the
    /// table in doubt (a fault the GPU found included); never cleared.
    poisoned: std::sync::OnceLock<String>,
    /// Where dropped [`Storage`](crate::Storage)s leave their handles.
    reclaim: std::sync::Arc<crate::storage::Reclaim>,
    /// Handles taken from `reclaim` and not freed yet (pinned ones wait
    /// here for their last unpin).
    reclaiming: Vec<Handle>,
    /// Counts the arena stream's work that other streams must be ordered
    /// after (moves, writes, fills, copies, frees).
    epoch: u64,
    /// Per registered stream (index 0, the arena's, unused), the `epoch`
    /// it last joined. Atomic so that kernel arguments, taken under a
    /// shared arena's shared lock, can note joins; it grows only when a
    /// stream is registered (exclusive), up to [`MAX_STREAMS`] entries.
    ///
    /// [`MAX_STREAMS`]: crate::stream::MAX_STREAMS
    joined: Vec<AtomicU64>,
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
    /// Per block slot, its position in `live` during a compaction.
    live_pos: Vec<u32>,
    /// The positions in `live` of a plan's moved blocks, and room to sort
    /// them (see `compact::sort_moved`).
    moved: (Vec<u32>, Vec<LiveBlock>),
    /// Whether a stream other than the arena's was registered, so that a
    /// block may have been used on one ([`Arena::record_stream`], kernel
    /// arguments): until then a compaction need not look up the moved
    /// blocks' stream records. Set at registration, which is exclusive,
    /// so that uses recorded under a shared lock need not set it.
    other_streams: bool,
    spans: Vec<(u64, u64)>,
    /// The compaction policy's state (see `src/plan/policy.rs`).
    pacer: Pacer,
    /// Blocks whose bytes lie above their placement (deferred moves of
    /// `Auto`; empty under the other policies once settled).
    lag: Lag,
    /// Naive's layout while `Budgeted` keeps to a budget (its first phase,
    /// `src/plan/lag.rs`); `None` afterwards and under other policies.
    shadow: Option<Box<shadow::Shadow>>,
    /// Lifetimes by size: where a new block is carved (see
    /// `src/placement/lifetime.rs`); `None` when neither large blocks
    /// are kept apart nor lifetime placement is on, so that placement pays
    /// nothing for it.
    lifetimes: Option<Lifetimes>,
    /// Blocks of at least this many bytes are carved from the top of their
    /// region (`ArenaConfig::large_block_divisor`; `u64::MAX`: none).
    large_block_bytes: u64,
    /// Whether long-lived sizes join the large blocks at the top: when
    /// large blocks are kept apart (`ArenaConfig::keeps_large_apart`).
    long_lived_high: bool,
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

#[cfg(feature = "cuda")]
impl Arena<crate::backend::cuda::CudaBackend> {
    /// An arena of `config.capacity_bytes` on CUDA device `ordinal`, with
    /// the default kernel options (others:
    /// [`with_backend`](Arena::with_backend) and
    /// [`CudaBackend::with_options`](crate::backend::cuda::CudaBackend::with_options)).
    pub fn cuda(config: ArenaConfig, ordinal: usize) -> Result<Self> {
        use crate::backend::cuda::{CudaBackend, CudaCapacity, CudaOptions};
        config.validate()?;
        let backend = CudaBackend::with_options(
            ordinal,
            CudaCapacity::Bytes(config.capacity_bytes),
            CudaOptions::default(),
        )?;
        Arena::with_backend(config, backend)
    }
}

impl<B: Backend> Arena<B> {
    /// An arena over `backend`, whose region must hold `config.capacity_bytes`.
    pub fn with_backend(config: ArenaConfig, mut backend: B) -> Result<Self> {
        config.validate()?;
        let large_apart = config.keeps_large_apart();
        let lifetimes = config.lifetime_placement || large_apart;
        let large_block_bytes = config.large_block_bytes().unwrap_or(u64::MAX);
        let tier = if config.spill_host_bytes > 0 {
            backend.reserve_host_tier(config.spill_host_bytes)?;
            Some(FreeIndex::new(config.spill_host_bytes))
        } else {
            None
        };
        if backend.capacity_bytes() < config.capacity_bytes {
            return Err(Error::InvalidInput {
                input: "backend",
                reason: format!(
                    "its region of {} B is smaller than the configured capacity of {} B",
                    backend.capacity_bytes(),
                    config.capacity_bytes
                ),
            });
        }
        // Spilling changes residency where naive has none: no budget then.
        let shadow = (config.compaction == CompactionPolicy::Budgeted && tier.is_none())
            .then(|| Box::new(shadow::Shadow::new(config.capacity_bytes)));
        // Streams the backend had registered before it was given to the
        // arena have their entries too.
        let streams = backend.stream_count();
        let joined = (0..streams).map(|_| AtomicU64::new(u64::MAX)).collect();
        Ok(Self {
            id: take_arena_id(&NEXT_ARENA_ID)?,
            index: FreeIndex::new(config.capacity_bytes),
            config,
            backend,
            blocks: Slots::default(),
            owners: Vec::new(),
            counters: Counters::default(),
            poisoned: std::sync::OnceLock::new(),
            reclaim: Default::default(),
            reclaiming: Vec::new(),
            epoch: 0,
            joined,
            tier,
            clock: AtomicU64::new(0),
            table: Vec::new(),
            dirty: None,
            live: Vec::new(),
            live_pos: Vec::new(),
            moved: (Vec::new(), Vec::new()),
            other_streams: streams > 1,
            spans: Vec::new(),
            pacer: Pacer::for_placement(large_apart),
            lag: Lag::new(),
            shadow,
            lifetimes: lifetimes.then(Lifetimes::new),
            large_block_bytes,
            long_lived_high: large_apart,
        })
    }

    /// This arena's id (handles carry it): unique in the process.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Forgets the lifetimes learned so far (see
    /// `src/placement/lifetime.rs`): placement then decides as in a new
    /// arena. For a program replayed several times on one arena, whose
    /// passes must each make the decisions of the first; a training loop
    /// wants the history kept.
    pub fn forget_lifetimes(&mut self) {
        if let Some(l) = self.lifetimes.as_mut() {
            *l = Lifetimes::new();
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ArenaConfig {
        &self.config
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, mutably: for backend extensions inside the crate only,
    /// since moving bytes behind the arena's back would corrupt it.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    fn check_usable(&self) -> Result<()> {
        match self.poisoned.get() {
            Some(reason) => Err(Error::Poisoned {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Marks the arena unusable; the first reason sticks.
    fn poison(&self, reason: String) {
        let _ = self.poisoned.set(reason);
    }

    /// Poisons the arena for a failure that leaves its records in doubt
    /// (`what` failed with `e`: the placement index or the planner refused
    /// the arena's own input, which is a bug) and returns the error that
    /// every later call reports.
    fn broken(&self, what: &str, e: impl std::fmt::Display) -> Error {
        self.poison(format!("{what}: {e}"));
        Error::Poisoned {
            reason: self.poisoned.get().cloned().unwrap_or_default(),
        }
    }

    /// Passes `r` through, poisoning the arena on a fault the device
    /// reported: its bytes are undefined from then on.
    fn sticky<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(Error::Backend(BackendError::DeviceFault { reason })) = &r {
            self.poison(format!("device fault: {reason}"));
        }
        r
    }

    fn block(&self, h: Handle) -> Result<&Block> {
        self.check_usable()?;
        if h.arena != self.id {
            return Err(Error::Foreign {
                kind: "handle",
                owner: h.arena,
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
        b.real_offset().ok_or(Error::NotResident)
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

    // ---- queries ----------------------------------------------------------

    /// Everything known about a live block.
    pub fn info(&self, h: Handle) -> Result<BlockInfo> {
        let b = self.block(h)?;
        Ok(self.info_of(h, b))
    }

    fn info_of(&self, handle: Handle, b: &Block) -> BlockInfo {
        let (offset, resident) = match b.real_offset() {
            Some(offset) => (offset, true),
            None => (0, false),
        };
        BlockInfo {
            handle,
            offset,
            resident,
            size_bytes: b.size,
            reserved_bytes: b.reserved(),
            align_bytes: b.align(),
            dtype: b.dtype,
            pins: b.pins,
        }
    }

    /// Live blocks in address order (of their bytes: a block whose move is
    /// deferred, `src/plan/lag.rs`, is listed where its bytes are).
    pub fn blocks(&self) -> Vec<BlockInfo> {
        let mut infos: Vec<BlockInfo> = self
            .index
            .regions()
            .filter_map(|r| r.slot)
            .filter_map(|slot| {
                let key = self.owners.get(slot as usize)?.key;
                let b = self.blocks.get(key)?;
                Some(self.info_of(
                    Handle {
                        key,
                        arena: self.id,
                    },
                    b,
                ))
            })
            .collect();
        if !self.lag.is_empty() {
            infos.sort_unstable_by_key(|i| i.offset);
        }
        infos
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
            live_blocks: self.blocks.len() as u64,
            free_regions: r.free_regions as u64,
            pinned_blocks: c.pinned_blocks as u64,
            peak_allocated_bytes: c.peak_allocated_bytes,
            allocs: c.allocs,
            frees: c.frees,
            failed_allocs: c.failed_allocs,
            targeted_compactions: c.targeted,
            full_compactions: c.full,
            moves: c.moves,
            bytes_moved: c.bytes_moved,
            naive_bytes_moved: c.naive_bytes_moved,
            naive_failures: c.naive_failures,
            handover_bytes: c.handover_bytes,
            overrun_bytes: c.overrun_bytes,
            deferred_bytes: self.lag.deferred_bytes(),
            planning_time: c.planning,
            planning_visits: self.pacer.visits(),
            budget_compactions: self.pacer.escalations(),
            compaction_time: c.compaction,
            evictions: c.evictions,
            restores: c.restores,
            bytes_evicted: c.bytes_evicted,
            bytes_restored: c.bytes_restored,
            host_tier_used_bytes: self
                .tier
                .as_ref()
                .map_or(0, |t| t.capacity() - t.free_bytes()),
            pending_reclaim: (self.reclaim.pending() + self.reclaiming.len()) as u64,
        }
    }

    /// Records a slot's new state: `Some((offset, bytes))` live, `None` freed.
    fn set_entry(&mut self, key: BlockKey, live: Option<(u64, u64)>) {
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
    /// Kernels see the backend's copy, which matches it after every
    /// compaction and after [`flush_table`](Arena::flush_table).
    #[cfg_attr(not(any(test, feature = "cuda")), allow(dead_code))]
    pub(crate) fn handle_table(&self) -> &[TableEntry] {
        &self.table
    }

    /// Sends the table's changed slots to the backend (on the CUDA backend:
    /// enqueued on the arena stream): before kernels resolve handles
    /// allocated since the last compaction (`graph::handle_args` calls it).
    pub(crate) fn flush_table(&mut self) -> Result<()> {
        self.check_usable()?;
        if let Some((lo, hi)) = self.dirty.take() {
            // Other streams resolving handles must see the update.
            self.epoch += 1;
            let r = self.backend.sync_table(&self.table[lo..hi], lo);
            if let Err(e) = self.sticky(r) {
                self.dirty = Some((lo, hi));
                return Err(e);
            }
        }
        Ok(())
    }

    /// Records block `key` (live) as the owner of placement node `slot`.
    fn set_owner(&mut self, slot: u32, key: BlockKey) {
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
    fn sync_pinned(&mut self, key: BlockKey) {
        if let Some(b) = self.blocks.get(key) {
            if let Place::Device(a) = &b.place {
                if let Some(o) = self.owners.get_mut(a.slot() as usize) {
                    o.pinned = b.pins > 0;
                }
            }
            let pinned = b.pins > 0;
            shadow::pin(self, key, pinned);
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }
}
