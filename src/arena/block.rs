//! A block's records: where its bytes are ([`Place`]), what the arena knows
//! of it ([`Block`]), the owner of each placement node ([`Owner`]), which
//! streams used it ([`StreamUses`]), and the arena's counters.

use std::sync::atomic::AtomicU64;

use crate::dtype::DType;
use crate::handle::BlockKey;
use crate::placement::Allocation;
use crate::plan::planner::LiveBlock;

/// The block on a used placement node, with what compaction planning needs
/// of it. Kept beside the nodes (indexed like them, so in address order
/// after a compaction) that collecting the live blocks reads two dense
/// tables and never the block table: at ~100 bytes a block, reading that
/// once per block per compaction made replays slow down per op as it
/// outgrew the caches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner {
    pub(crate) key: BlockKey,
    /// Bytes to copy when it moves (its size).
    pub(crate) size: u64,
    pub(crate) align: u32,
    pub(crate) pinned: bool,
}

impl Owner {
    pub(crate) const NONE: Owner = Owner {
        key: BlockKey::NULL,
        size: 0,
        align: 1,
        pinned: false,
    };

    /// The planner's view of this block on the used region at `offset` of
    /// `len` bytes (its reservation).
    pub(crate) fn live_block(&self, offset: u64, len: u64) -> LiveBlock {
        LiveBlock {
            key: self.key.to_bits(),
            offset,
            len,
            copy_len: self.size,
            align: u64::from(self.align),
            pinned: self.pinned,
        }
    }

    /// The owner a [`LiveBlock`] was collected from (the inverse of
    /// [`Owner::live_block`]), for the index rebuilt after a plan.
    pub(crate) fn of_live(l: &LiveBlock) -> Owner {
        Owner {
            key: BlockKey::from_bits(l.key),
            size: l.copy_len,
            // The live list took it from an owner entry: it fits.
            align: u32::try_from(l.align).unwrap_or(u32::MAX),
            pinned: l.pinned,
        }
    }
}

/// Records `owner` as the block on placement node `slot` in `owners`.
pub(crate) fn set_owner(owners: &mut Vec<Owner>, slot: u32, owner: Owner) {
    let i = slot as usize;
    if owners.len() <= i {
        owners.resize(i + 1, Owner::NONE);
    }
    owners[i] = owner;
}

/// Where a block's bytes are.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// In the region: the placement allocation holds the offset (nowhere
    /// else does).
    Device(Allocation),
    /// Spilled to the host tier: the allocation of the tier's own index.
    Host(Allocation),
}

/// A live block's metadata: one entry of the slot table per live block,
/// touched by every alloc and free and by every compaction's passes over
/// the live blocks. Kept small (rarely used state lives behind pointers)
/// so that a table of hundreds of thousands of blocks stays in cache and
/// takes few fresh pages: at ~200 bytes an entry, replay time per op grew
/// by 40 % from 80k to 160k blocks.
#[derive(Debug)]
pub(crate) struct Block {
    pub(crate) place: Place,
    pub(crate) size: u64,
    /// The dtype it was allocated for (`None`: untyped bytes).
    pub(crate) dtype: Option<DType>,
    /// Streams that used the block; `None` until kernel arguments or
    /// [`Arena::record_stream`] name it (one small allocation then, beside
    /// a kernel launch; plain alloc and free never make one). Behind a
    /// mutex of its own so that kernel arguments, taken under a shared
    /// arena's shared lock by several threads, record uses; under `&mut`
    /// (compaction, free) it is reached without locking.
    pub(crate) streams: std::sync::Mutex<Option<Box<StreamUses>>>,
    /// Tick of the last use (resolved for a kernel, a transfer or a pin):
    /// the spill policy evicts the least recently used block first.
    pub(crate) last_use: AtomicU64,
    /// Alignment of the offset (a power of two up to
    /// [`crate::config::MAX_ALIGN`], so it fits).
    pub(crate) align: u32,
    pub(crate) pins: u32,
    /// Where the bytes of a resident block are when they have not followed
    /// its placement yet (a deferred move, `src/plan/lag.rs`): always
    /// above the placement's offset, so never 0. `None`: at the placement.
    pub(crate) lag: Option<std::num::NonZeroU64>,
}

impl Block {
    /// Bytes reserved: the size rounded up to the arena's alignment, which
    /// is what its placement (in the region or the host tier) holds.
    pub(crate) fn reserved(&self) -> u64 {
        match &self.place {
            Place::Device(a) | Place::Host(a) => a.size(),
        }
    }

    /// Alignment of the offset in bytes.
    pub(crate) fn align(&self) -> u64 {
        u64::from(self.align)
    }

    /// Where the block's bytes are in the region: its placement's offset,
    /// or where they lag ([`Block::lag`]); `None` when spilled.
    pub(crate) fn real_offset(&self) -> Option<u64> {
        match &self.place {
            Place::Device(a) => Some(self.lag.map_or(a.offset(), |at| at.get())),
            Place::Host(_) => None,
        }
    }

    /// The streams that used the block since it was allocated.
    pub(crate) fn uses(&self) -> smallvec::SmallVec<[crate::stream::StreamId; 2]> {
        self.with_streams(|s| s.as_ref().map(|s| s.uses.clone()).unwrap_or_default())
    }

    /// Runs `f` on the stream-use records (`None` before the first use),
    /// under their lock. Nothing in `f` panics, so a poisoned lock (it
    /// cannot be) would hold consistent records.
    pub(crate) fn with_streams<R>(&self, f: impl FnOnce(&mut Option<Box<StreamUses>>) -> R) -> R {
        let mut s = self
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut s)
    }
}

/// Which streams used a block (see [`StreamId`](crate::StreamId)).
#[derive(Debug, Default)]
pub(crate) struct StreamUses {
    /// Registered streams other than the arena's that used the block since
    /// it was allocated.
    pub(crate) uses: smallvec::SmallVec<[crate::stream::StreamId; 2]>,
    /// The stream whose kernel arguments last wrote the block, and the
    /// streams that read it since: what later work on another stream must
    /// wait for (read after write, write after read or write).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) writer: Option<crate::stream::StreamId>,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) readers: smallvec::SmallVec<[crate::stream::StreamId; 2]>,
}

/// What the arena has done: allocations, compactions, spilling.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    pub(crate) requested_bytes: u64,
    pub(crate) pinned_blocks: usize,
    pub(crate) peak_allocated_bytes: u64,
    pub(crate) evictions: u64,
    pub(crate) restores: u64,
    pub(crate) bytes_evicted: u64,
    pub(crate) bytes_restored: u64,
    pub(crate) allocs: u64,
    pub(crate) frees: u64,
    pub(crate) failed_allocs: u64,
    pub(crate) targeted: u64,
    pub(crate) full: u64,
    pub(crate) moves: u64,
    pub(crate) bytes_moved: u64,
    pub(crate) piece_plans: u64,
    pub(crate) planning: std::time::Duration,
    pub(crate) compaction: std::time::Duration,
}
