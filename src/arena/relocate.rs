//! Relocation on request: an explicit full compaction, and blocks brought
//! back from the host tier. The mechanics are in `core` (plans checked,
//! executed, the index rebuilt), `policy` and `spill`.

use super::{Arena, CompactionReport, Place};
use crate::backend::Backend;
use crate::error::Result;
use crate::handle::{BlockKey, Handle};
use crate::storage::AsRange;

impl<B: Backend> Arena<B> {
    /// Compacts fully: afterwards the free space between pinned blocks is one
    /// region per gap (one region in all without pins), packed as the
    /// [`policies`](crate::policies) docs say (by alignment class where
    /// that pads less). Naive, asked for the same compaction, runs its own
    /// full compaction too: under the compacting policies it counts in
    /// [`PolicyStats::naive_bytes_moved`](crate::PolicyStats), and every
    /// policy keeps its bound.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let hs: Vec<_> = (0..4).map(|_| arena.alloc(1024)).collect::<Result<_, _>>()?;
    /// arena.free(hs[0])?;
    /// arena.free(hs[2])?;
    /// let report = arena.compact()?; // two holes become one free region
    /// assert!(report.moves > 0);
    /// assert_eq!(arena.stats().free_regions, 1);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn compact(&mut self) -> Result<CompactionReport> {
        self.check_usable()?;
        self.drain_reclaim()?;
        self.policy.compact(&mut self.core)
    }

    /// Brings every handle in `handles` onto the device together, spilling
    /// others (never these) if needed, and counts them as used.
    ///
    /// All or nothing: a bad handle, or blocks that cannot be resident
    /// together ([`Error::OutOfMemory`](crate::Error::OutOfMemory),
    /// [`Error::HostTierFull`](crate::Error::HostTierFull)),
    /// fail before anything changes. Several spilled blocks are placed
    /// together: in the holes as they are if they all fit there, else after
    /// the evictions (least recently used first) and the full compaction
    /// that make room for all of them, checked on a copy of the placement
    /// index before the first eviction.
    ///
    /// Takes anything that names blocks: handles, storages, slices
    /// (`&[h]`, `&[&x, &y]`, or `&[&x as &dyn AsRange, &slice]` to mix);
    /// empty storages name none.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let config = ArenaConfig::new(16 << 10).with_spill_host_bytes(32 << 10);
    /// let mut arena = Arena::host(config)?;
    /// let x = arena.alloc(12 << 10)?;
    /// let _y = arena.alloc(12 << 10)?; // x is spilled to the host tier to make room
    /// assert!(!arena.info(x)?.resident);
    /// arena.make_resident(&[x])?; // back (y goes out in its turn)
    /// assert!(arena.info(x)?.resident);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn make_resident<R: AsRange>(&mut self, ranges: &[R]) -> Result<()> {
        // A poisoned arena's layout is not trusted: placing may compact.
        self.check_usable()?;
        let handles: smallvec::SmallVec<[Handle; 8]> = ranges
            .iter()
            .filter_map(|r| r.block_range().handle)
            .collect();
        let handles = &handles[..];
        let mut keep = smallvec::SmallVec::<[BlockKey; 8]>::new();
        for &h in handles {
            self.block(h)?;
            keep.push(h.key);
        }
        let mut spilled: smallvec::SmallVec<[Handle; 8]> = smallvec::SmallVec::new();
        for &h in handles {
            let out = self
                .core
                .blocks
                .get(h.key)
                .is_some_and(|b| matches!(b.place, Place::Host(_)));
            if out && !spilled.contains(&h) {
                spilled.push(h);
            }
        }
        if spilled.len() > 1 {
            self.make_room_for_all(&spilled, &keep)?;
        }
        self.restore_each(handles, &keep)
    }
}
