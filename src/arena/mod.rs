//! The arena: one region, a table of handles, placement, and compaction.
//!
//! The arena's [`Core`](core::Core) owns where every block is (the
//! [`FreeIndex`](crate::placement::FreeIndex), the block table, the handle
//! table) and a [`Backend`] (where the bytes are), and runs plans. The
//! compaction policy (`policy`) decides what happens when a request fits
//! in no hole; spilling (`spill`), what happens when even compaction
//! cannot make room.
//!
//! Every method that returns an error leaves the arena as it was, with one
//! exception: if the backend fails while executing a plan, device memory and
//! the table may disagree, so the arena poisons itself and every later call
//! returns [`Error::Poisoned`].

mod alloc;
pub(crate) mod block;
mod bytes;
pub(crate) mod core;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod elastic;
mod order;
mod place;
mod policy;
mod relocate;
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

use self::core::Core;
use block::{Block, Place};
use policy::Policy;

pub use shared::SharedArena;
pub use stats::{fmt_bytes, CompactionReport, PolicyStats, Stats};

use crate::backend::{Backend, HostBackend, MetaBackend};
use crate::config::ArenaConfig;
use crate::error::{Error, Result};
use crate::handle::{BlockInfo, Handle, TableEntry};
use crate::placement::{Fit, FreeIndex};

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
    config: ArenaConfig,
    /// Where every block is, and the backend.
    core: Core<B>,
    /// The compaction policy's state.
    policy: Policy,
    /// The host tier's index when spilling is on (`spill_host_bytes > 0`).
    tier: Option<FreeIndex>,
    /// Where dropped [`Storage`](crate::Storage)s leave their handles.
    reclaim: std::sync::Arc<crate::storage::Reclaim>,
    /// Handles taken from `reclaim` and not freed yet (pinned ones wait
    /// here for their last unpin).
    reclaiming: Vec<Handle>,
    /// The elastic region's state (`None`: a fixed region).
    elastic: Option<elastic::Elastic>,
}

impl Arena<HostBackend> {
    /// An arena in host memory: the backend of tests, docs and CI.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?; // 1 MiB
    /// let h = arena.alloc(4096)?;
    /// assert_eq!(arena.stats().allocated_bytes, 4096);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn host(config: ArenaConfig) -> Result<Self> {
        config.validate()?;
        let backend = if config.elastic {
            HostBackend::elastic(config.elastic_limit(), crate::backend::HOST_GRANULARITY)
        } else {
            HostBackend::new(config.capacity_bytes)?
        };
        Self::with_backend(config, backend)
    }
}

impl Arena<MetaBackend> {
    /// An arena that stores no bytes (placement and planning only).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::metadata(ArenaConfig::new(1 << 40))?; // 1 TiB, no bytes kept
    /// let h = arena.alloc(1 << 39)?;
    /// assert_eq!(arena.resolve(h)?, 0); // placement is real; the bytes are not
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn metadata(config: ArenaConfig) -> Result<Self> {
        config.validate()?;
        let backend = if config.elastic {
            MetaBackend::elastic(config.elastic_limit(), crate::backend::META_GRANULARITY)
        } else {
            MetaBackend::new(config.capacity_bytes)
        };
        Self::with_backend(config, backend)
    }
}

#[cfg(feature = "cuda")]
impl Arena<crate::backend::cuda::CudaBackend> {
    /// An arena of `config.capacity_bytes` on CUDA device `ordinal`, with
    /// the default kernel options (others:
    /// [`with_backend`](Arena::with_backend) and
    /// [`CudaBackend::with_options`](crate::backend::cuda::CudaBackend::with_options)).
    ///
    /// ```no_run
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?; // 1 GiB on device 0
    /// let x = arena.alloc(4096)?;
    /// arena.write(x, &[1u8; 4096])?;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn cuda(config: ArenaConfig, ordinal: usize) -> Result<Self> {
        use crate::backend::cuda::{CudaBackend, CudaCapacity, CudaOptions};
        config.validate()?;
        let backend = if config.elastic {
            let limit = (config.capacity_bytes > 0).then_some(config.capacity_bytes);
            CudaBackend::elastic(ordinal, limit, CudaOptions::default())?
        } else {
            CudaBackend::with_options(
                ordinal,
                CudaCapacity::Bytes(config.capacity_bytes),
                CudaOptions::default(),
            )?
        };
        Arena::with_backend(config, backend)
    }
}

impl<B: Backend> Arena<B> {
    /// An arena over `backend`, whose region must hold `config.capacity_bytes`.
    /// A fixed arena over a backend that maps (an elastic one) maps all of
    /// its capacity here; an elastic arena starts with what the backend
    /// has mapped.
    ///
    /// ```
    /// use cuarena::backend::HostBackend;
    /// use cuarena::{Arena, ArenaConfig};
    /// let backend = HostBackend::new(1 << 20)?.with_seed(7); // options of its own
    /// let mut arena = Arena::with_backend(ArenaConfig::new(1 << 20), backend)?;
    /// arena.alloc(256)?;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn with_backend(config: ArenaConfig, mut backend: B) -> Result<Self> {
        config.validate()?;
        // An elastic arena's capacity is a limit: a backend that maps in
        // granules reserves it rounded down to one.
        let needed = if config.elastic {
            let g = backend.granularity_bytes().max(1);
            config.capacity_bytes / g * g
        } else {
            config.capacity_bytes
        };
        if backend.capacity_bytes() < needed {
            return Err(Error::InvalidInput {
                input: "backend",
                reason: format!(
                    "its region of {} B is smaller than the configured capacity of {} B",
                    backend.capacity_bytes(),
                    config.capacity_bytes
                ),
            });
        }
        let tier = if config.spill_host_bytes > 0 {
            backend.reserve_host_tier(config.spill_host_bytes)?;
            Some(FreeIndex::new(config.spill_host_bytes))
        } else {
            None
        };
        let capacity = if config.elastic {
            backend.mapped_bytes()
        } else {
            if backend.mapped_bytes() < config.capacity_bytes {
                let g = backend.granularity_bytes();
                backend.map_to(config.capacity_bytes.div_ceil(g) * g)?;
            }
            config.capacity_bytes
        };
        let id = take_arena_id(&NEXT_ARENA_ID)?;
        // An elastic arena's free top is memory to give back, not a hole:
        // it places by best fit with the top last (`placement::Fit`).
        let fit = if config.elastic { Fit::Best } else { Fit::Good };
        Ok(Self {
            core: Core::new(id, backend, capacity, fit),
            elastic: elastic::Elastic::new(&config),
            policy: Policy::new(&config),
            config,
            tier,
            reclaim: Default::default(),
            reclaiming: Vec::new(),
        })
    }

    /// This arena's id (handles carry it): unique in the process.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let other = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let h = arena.alloc(256)?;
    /// assert_eq!(h.arena_id(), arena.id());
    /// assert_ne!(arena.id(), other.id());
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn id(&self) -> u64 {
        self.core.id
    }

    /// The configuration.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// assert_eq!(arena.config().capacity_bytes, 1 << 20);
    /// assert_eq!(arena.config().alignment_bytes, 256);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn config(&self) -> &ArenaConfig {
        &self.config
    }

    /// The backend.
    ///
    /// ```
    /// use cuarena::backend::Backend;
    /// use cuarena::{Arena, ArenaConfig};
    /// let arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// assert_eq!(arena.backend().capacity_bytes(), 1 << 20);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn backend(&self) -> &B {
        &self.core.backend
    }

    /// The backend, mutably: for backend extensions inside the crate only,
    /// since moving bytes behind the arena's back would corrupt it.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn backend_mut(&mut self) -> &mut B {
        &mut self.core.backend
    }

    fn check_usable(&self) -> Result<()> {
        self.core.check_usable()
    }

    fn sticky<T>(&self, r: Result<T>) -> Result<T> {
        self.core.sticky(r)
    }

    fn block(&self, h: Handle) -> Result<&Block> {
        self.core.block(h)
    }

    fn block_mut(&mut self, h: Handle) -> Result<&mut Block> {
        self.core.block_mut(h)
    }

    /// The offset of a resident block's bytes (and a use, for the LRU).
    fn device_offset(&self, b: &Block) -> Result<u64> {
        self.core.device_offset(b)
    }

    /// The current offset of a resident block, counted as a use; the
    /// resolution that views and pointers are built from.
    /// [`Error::NotResident`] for a spilled block: call
    /// [`make_resident`](Arena::make_resident) first.
    ///
    /// The offset is a plain number and goes stale at the next call that
    /// can compact; for kernels, take views (they borrow the arena, so no
    /// compaction can happen while they live) or pin the block.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let a = arena.alloc(256)?;
    /// let b = arena.alloc(256)?;
    /// arena.free(a)?;
    /// arena.compact()?; // b moves down into a's place
    /// assert_eq!(arena.resolve(b)?, 0);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn resolve(&self, h: Handle) -> Result<u64> {
        let b = self.block(h)?;
        self.device_offset(b)
    }

    // ---- queries ----------------------------------------------------------

    /// Everything known about a live block.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let h = arena.alloc_dtype(DType::F16, 100)?;
    /// let info = arena.info(h)?;
    /// assert_eq!((info.size_bytes, info.dtype, info.pins), (200, Some(DType::F16), 0));
    /// assert!(info.resident);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
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
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let a = arena.alloc(256)?;
    /// let b = arena.alloc(512)?;
    /// let live: Vec<_> = arena.blocks().iter().map(|i| i.handle).collect();
    /// assert_eq!(live.len(), 2);
    /// assert!(live.contains(&a) && live.contains(&b));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn blocks(&self) -> Vec<BlockInfo> {
        let core = &self.core;
        let mut infos: Vec<BlockInfo> = core
            .index
            .regions()
            .filter_map(|r| r.slot)
            .filter_map(|slot| {
                let key = core.owners.get(slot as usize)?.key;
                let b = core.blocks.get(key)?;
                Some(self.info_of(
                    Handle {
                        key,
                        arena: core.id,
                    },
                    b,
                ))
            })
            .collect();
        if self.policy.defers() {
            infos.sort_unstable_by_key(|i| i.offset);
        }
        infos
    }

    /// A snapshot of the statistics.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let h = arena.alloc(4096)?;
    /// arena.free(h)?;
    /// let st = arena.stats();
    /// assert_eq!((st.allocs, st.frees, st.live_blocks), (1, 1, 0));
    /// println!("{}", st.summary());
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn stats(&self) -> Stats {
        let core = &self.core;
        let r = core.index.report();
        let c = &core.counters;
        let capacity = core.capacity();
        Stats {
            capacity_bytes: capacity,
            peak_mapped_bytes: self.elastic.as_ref().map_or(0, |e| e.peak_mapped_bytes),
            trims: self.elastic.as_ref().map_or(0, |e| e.trims),
            allocated_bytes: capacity - r.free_bytes,
            requested_bytes: c.requested_bytes,
            free_bytes: r.free_bytes,
            largest_free_bytes: r.largest_free_bytes,
            fragmentation: if r.free_bytes == 0 {
                0.0
            } else {
                1.0 - r.largest_free_bytes as f64 / r.free_bytes as f64
            },
            live_blocks: core.blocks.len() as u64,
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
            piece_plans: c.piece_plans,
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
            pending_reclaim: (self.reclaim.pending() + self.reclaiming.len()) as u64,
            policy: self.policy.stats(core),
        }
    }

    /// The handle table (slot -> offset, version) as the arena sees it now.
    /// Kernels see the backend's copy, which matches it after every
    /// compaction and after [`flush_table`](Arena::flush_table).
    #[cfg_attr(not(any(test, feature = "cuda")), allow(dead_code))]
    pub(crate) fn handle_table(&self) -> &[TableEntry] {
        self.core.handle_table()
    }

    /// Sends the table's changed slots to the backend (on the CUDA backend:
    /// enqueued on the arena stream): before kernels resolve handles
    /// allocated since the last compaction (`graph::handle_args` calls it).
    #[cfg_attr(not(any(test, feature = "cuda")), allow(dead_code))]
    pub(crate) fn flush_table(&mut self) -> Result<()> {
        self.core.flush_table()
    }
}
