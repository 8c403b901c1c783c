//! The caching allocator's decisions, as `c10/cuda/CUDACachingAllocator.cpp`
//! documents and makes them: a request is rounded (`round_size`), served
//! from the smallest cached free block of its stream and pool that fits
//! (split when the rest is worth keeping), else from a new segment
//! (`cudaMalloc` of 2 MiB for small requests, 20 MiB up to 10 MiB, else the
//! request rounded to 2 MiB) or, with expandable segments, from pages
//! mapped onto the stream's segment; when the memory limit is reached,
//! cached blocks are released (oversize ones first with
//! `max_split_size_mb`, then every unsplit one) and the request retried,
//! and only then is it an out-of-memory.

use std::collections::BTreeMap;

use super::blocks::{Block, Blocks, Id, SizeKey};
use super::settings::AllocatorSettings;
use crate::trace::MemoryBudget;
use crate::Result;

/// Largest request of the small pool (`kSmallSize`).
pub(crate) const SMALL_SIZE: u64 = 1 << 20;
/// A small pool's segment, and an expandable small pool's page
/// (`kSmallBuffer`).
pub(crate) const SMALL_BUFFER: u64 = 2 << 20;
/// A large pool's segment for requests under 10 MiB, and an expandable
/// large pool's page (`kLargeBuffer`).
pub(crate) const LARGE_BUFFER: u64 = 20 << 20;
/// Requests from this size get a segment of their own size
/// (`kMinLargeAlloc`).
const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Their segment is the request rounded to this (`kRoundLarge`).
const ROUND_LARGE: u64 = 2 << 20;

/// The segment events the model made, as PyTorch records them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentEvents {
    /// `segment_alloc` events (`cudaMalloc`).
    pub alloc: u64,
    /// Their bytes.
    pub alloc_bytes: u64,
    /// `segment_free` events (`cudaFree`).
    pub free: u64,
    /// Their bytes.
    pub free_bytes: u64,
    /// `segment_map` events (expandable segments).
    pub map: u64,
    /// Their bytes.
    pub map_bytes: u64,
    /// `segment_unmap` events.
    pub unmap: u64,
    /// Their bytes.
    pub unmap_bytes: u64,
}

/// One expandable segment: a stream's and pool's address range, mapped in
/// pages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expandable {
    pub(crate) base: u64,
    pub(crate) page: u64,
}

/// The allocator of one device.
#[derive(Debug)]
pub(crate) struct Model {
    pub(crate) settings: AllocatorSettings,
    pub(crate) blocks: Blocks,
    pub(crate) expandable: Vec<Expandable>,
    /// Bytes reserved from the driver (`total_allocated_memory`).
    pub(crate) reserved: u64,
    /// Bytes of the blocks handed out (`allocated_bytes`).
    pub(crate) allocated: u64,
    /// The process's memory limit (a per-process fraction, or the device):
    /// a segment that would take `reserved` past it fails. `None`: no limit.
    pub(crate) cap: Option<u64>,
    /// Where the next segment's addresses start (segments the model makes
    /// get addresses of their own, above every recorded one).
    next_address: u64,
    /// The addresses `cudaMalloc` returned in the recording, `(address,
    /// size)` in order, and how many were used: where the model asks for a
    /// segment the recording also got, it gets the recorded address (the
    /// driver's choice, which decides between free blocks of equal size).
    pub(crate) driver: Vec<(u64, u64)>,
    driver_next: usize,
    /// The model's segments from `cudaMalloc`, address -> size.
    segments: BTreeMap<u64, u64>,
    pub(crate) events: SegmentEvents,
}

/// How far ahead of the last recorded `cudaMalloc` used a match is looked
/// for.
const DRIVER_WINDOW: usize = 8;

/// The segment a request of `size` (rounded) bytes gets when no cached
/// block fits (`get_allocation_size`).
pub(crate) fn allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

impl Model {
    /// An empty allocator; segments it makes get addresses from
    /// `first_address` up.
    pub(crate) fn new(
        settings: AllocatorSettings,
        cap: Option<u64>,
        first_address: u64,
        budget: MemoryBudget,
    ) -> Model {
        Model {
            settings,
            blocks: Blocks::new(budget),
            expandable: Vec::new(),
            reserved: 0,
            allocated: 0,
            cap,
            next_address: first_address,
            driver: Vec::new(),
            driver_next: 0,
            segments: BTreeMap::new(),
            events: SegmentEvents::default(),
        }
    }

    /// The address of a new `size`-byte segment: the next address the
    /// recording's `cudaMalloc` returned for that size (within a few calls,
    /// and where no segment of the model's lies), else a fresh one.
    fn segment_address(&mut self, size: u64) -> u64 {
        let end = (self.driver_next + DRIVER_WINDOW).min(self.driver.len());
        let found = (self.driver_next..end).find(|&k| {
            let (a, s) = self.driver[k];
            s == size && !self.overlaps(a, size)
        });
        match found {
            Some(k) => {
                self.driver_next = k + 1;
                self.driver[k].0
            }
            None => self.fresh_address(size),
        }
    }

    /// Counts a segment laid out from the snapshot.
    pub(crate) fn add_segment(&mut self, addr: u64, size: u64) {
        self.segments.insert(addr, size);
        self.reserved += size;
    }

    fn overlaps(&self, addr: u64, size: u64) -> bool {
        let end = addr.saturating_add(size);
        self.segments
            .range(..end)
            .next_back()
            .is_some_and(|(&a, &s)| a.saturating_add(s) > addr)
    }

    /// Fresh addresses for `bytes` (2 MiB aligned, never reused).
    pub(crate) fn fresh_address(&mut self, bytes: u64) -> u64 {
        let a = self.next_address;
        self.next_address = a
            .saturating_add(bytes.div_ceil(SMALL_BUFFER).saturating_mul(SMALL_BUFFER))
            .saturating_add(SMALL_BUFFER);
        a
    }

    /// Whether `bytes` more would pass the memory limit.
    pub(crate) fn over_cap(&self, bytes: u64) -> bool {
        self.cap
            .is_some_and(|cap| self.reserved.saturating_add(bytes) > cap)
    }

    fn gc_enabled(&self) -> bool {
        self.cap.is_some() && self.settings.garbage_collection_threshold > 0.0
    }

    /// `malloc`: a block of at least `orig` bytes on `stream`, or `None`
    /// for an out-of-memory (after releasing cached blocks and retrying).
    pub(crate) fn malloc(&mut self, orig: u64, stream: u64) -> Result<Option<Id>> {
        let size = self.settings.round_size(orig);
        let small = size <= SMALL_SIZE;
        let alloc_size = allocation_size(size);
        let found = match self.get_free_block(small, stream, size) {
            Some(id) => Some(id),
            None => {
                if self.gc_enabled() {
                    self.garbage_collect()?;
                }
                let mut got = self.alloc_block(small, stream, size, alloc_size)?;
                if got.is_none() && self.release_available_cached_blocks(small, stream, size)? {
                    got = self.alloc_block(small, stream, size, alloc_size)?;
                }
                if got.is_none() {
                    self.release_cached_blocks()?;
                    got = self.alloc_block(small, stream, size, alloc_size)?;
                }
                got
            }
        };
        let Some(mut id) = found else {
            return Ok(None);
        };
        if self.should_split(id, size) {
            let front = self.blocks.split_front(id, size)?;
            self.blocks.insert(id);
            id = front;
        }
        self.blocks.get_mut(id).allocated = true;
        self.allocated += self.blocks.get(id).size;
        Ok(Some(id))
    }

    /// `free_block`: the block back in its pool, merged with free
    /// neighbours.
    pub(crate) fn free(&mut self, id: Id) {
        self.blocks.get_mut(id).allocated = false;
        self.allocated = self.allocated.saturating_sub(self.blocks.get(id).size);
        let (prev, next) = (self.blocks.get(id).prev, self.blocks.get(id).next);
        self.blocks.try_merge(id, prev);
        self.blocks.try_merge(id, next);
        self.blocks.insert(id);
    }

    fn should_split(&self, id: Id, size: u64) -> bool {
        let b = self.blocks.get(id);
        let remaining = b.size - size;
        if b.small || self.settings.expandable_segments {
            remaining >= super::settings::MIN_BLOCK
        } else {
            size < self.settings.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// `get_free_block`: takes the block [`Model::find_free_block`] finds.
    fn get_free_block(&mut self, small: bool, stream: u64, size: u64) -> Option<Id> {
        if self.gc_enabled() {
            self.blocks.pool_mut(small).searches += 1;
        }
        let id = self.find_free_block(small, stream, size)?;
        self.blocks.take(id);
        Some(id)
    }

    /// Bytes a block could grow to: its own and an unmapped range after it.
    fn expandable_size(&self, id: Id) -> u64 {
        let b = self.blocks.get(id);
        let tail = b
            .next
            .map(|n| self.blocks.get(n))
            .filter(|n| !n.mapped)
            .map_or(0, |n| n.size);
        b.size.saturating_add(tail)
    }

    /// The smallest free block of `stream` in the pool that is at least
    /// `size` bytes and that `max_split_size_mb` lets serve it; among
    /// expandable blocks, the one that can grow least.
    pub(crate) fn find_free_block(&self, small: bool, stream: u64, size: u64) -> Option<Id> {
        let pool = self.blocks.pool(small);
        let mut it = pool.free.range((stream, size, 0, 0)..);
        let mut cur: SizeKey = *it.next()?;
        if cur.0 != stream {
            return None;
        }
        if self.blocks.get(cur.3).expandable.is_some() {
            if self.settings.expandable_segments {
                for &next in it {
                    let walk = self.blocks.get(cur.3).expandable.is_some()
                        && next.0 == stream
                        && self.expandable_size(next.3) < self.expandable_size(cur.3);
                    if !walk {
                        break;
                    }
                    cur = next;
                }
            } else {
                // Expandable segments turned off since: only other blocks.
                loop {
                    cur = *it.next()?;
                    if !(self.blocks.get(cur.3).expandable.is_some() && cur.0 == stream) {
                        break;
                    }
                }
                if cur.0 != stream {
                    return None;
                }
            }
        }
        let (max_split, rounding) = (
            self.settings.max_split_size,
            self.settings.max_non_split_rounding,
        );
        if size < max_split && cur.1 >= max_split {
            return None;
        }
        if size >= max_split && cur.1 >= size.saturating_add(rounding) {
            return None;
        }
        Some(cur.3)
    }

    /// `alloc_block`: a new segment (or mapped pages), unless the memory
    /// limit stops it.
    fn alloc_block(
        &mut self,
        small: bool,
        stream: u64,
        size: u64,
        alloc_size: u64,
    ) -> Result<Option<Id>> {
        if self.over_cap(alloc_size) {
            return Ok(None);
        }
        if self.settings.expandable_segments {
            return self.try_allocate_expandable(small, stream, size);
        }
        let address = self.segment_address(alloc_size);
        self.segments.insert(address, alloc_size);
        let id = self
            .blocks
            .add(Block::new(address, alloc_size, stream, small))?;
        self.reserved += alloc_size;
        self.events.alloc += 1;
        self.events.alloc_bytes += alloc_size;
        Ok(Some(id))
    }

    /// `release_block`: a whole free segment back to the driver.
    pub(crate) fn release_block(&mut self, id: Id) {
        let (addr, size) = (self.blocks.get(id).addr, self.blocks.get(id).size);
        self.segments.remove(&addr);
        self.blocks.take(id);
        self.blocks.remove(id);
        self.reserved = self.reserved.saturating_sub(size);
        self.events.free += 1;
        self.events.free_bytes += size;
    }

    /// The free blocks of a pool, in pool order (a copy: releasing changes
    /// the pool).
    fn free_blocks(&mut self, small: bool) -> Result<Vec<SizeKey>> {
        let n = self.blocks.pool(small).free.len();
        let mut v = Vec::new();
        self.blocks
            .budget()
            .reserve(&mut v, n, "a pool's free blocks, listed to release them")?;
        v.extend(self.blocks.pool(small).free.iter().copied());
        Ok(v)
    }

    /// `release_cached_blocks` (`torch.cuda.empty_cache()`, and the last
    /// retry before an out-of-memory): every unsplit free segment released,
    /// every free page of expandable segments unmapped.
    pub(crate) fn release_cached_blocks(&mut self) -> Result<()> {
        for small in [false, true] {
            let mut to_unmap = Vec::new();
            for (_, _, _, id) in self.free_blocks(small)? {
                let b = self.blocks.get(id);
                if b.expandable.is_some() {
                    to_unmap.push(id);
                } else if !b.is_split() {
                    self.release_block(id);
                }
            }
            for id in to_unmap {
                self.unmap_block(id)?;
            }
        }
        Ok(())
    }

    /// `release_available_cached_blocks`: with `max_split_size_mb`, the
    /// oversize free blocks of the stream released, the smallest one that
    /// is large enough, else the largest ones until enough bytes are.
    fn release_available_cached_blocks(
        &mut self,
        small: bool,
        stream: u64,
        size: u64,
    ) -> Result<bool> {
        let max_split = self.settings.max_split_size;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let want = size.max(max_split);
        let releasable = |m: &Model, id: Id| {
            let b = m.blocks.get(id);
            b.expandable.is_none() && !b.is_split()
        };
        let pool = &self.blocks.pool(small).free;
        if let Some(&(s, _, _, id)) = pool.range((stream, want, 0, 0)..).next() {
            if s == stream {
                if releasable(self, id) {
                    self.release_block(id);
                    return Ok(true);
                }
                return Ok(false);
            }
        }
        let mut largest_first = Vec::new();
        for &(s, sz, _, id) in pool.range(..(stream, want, 0, 0)).rev() {
            if s != stream || sz < max_split {
                break;
            }
            largest_first.push((sz, id));
        }
        let mut released = 0u64;
        for (sz, id) in largest_first {
            if released >= want {
                break;
            }
            if releasable(self, id) {
                self.release_block(id);
            }
            released = released.saturating_add(sz);
        }
        Ok(released >= want)
    }

    /// `garbage_collect_cached_blocks`: past `garbage_collection_threshold`
    /// of the limit, the unsplit free large blocks at least as old as the
    /// average (in free-block searches) released, until enough are.
    fn garbage_collect(&mut self) -> Result<()> {
        let Some(cap) = self.cap else { return Ok(()) };
        let threshold = (self.settings.garbage_collection_threshold * cap as f64) as u64;
        if self.reserved <= threshold {
            return Ok(());
        }
        let target = self.reserved - threshold;
        let searches = self.blocks.pool(false).searches;
        let age = |m: &Model, id: Id| searches.saturating_sub(m.blocks.get(id).gc_base);
        let candidates: Vec<Id> = self
            .free_blocks(false)?
            .into_iter()
            .map(|k| k.3)
            .filter(|&id| {
                let b = self.blocks.get(id);
                !b.is_split() && b.expandable.is_none()
            })
            .collect();
        let mut total_age: u64 = candidates.iter().map(|&id| age(self, id)).sum();
        let mut left = candidates;
        let mut reclaimed = 0u64;
        while reclaimed < target && !left.is_empty() {
            let average = total_age as f64 / left.len() as f64;
            let before = left.len();
            let mut keep = Vec::new();
            for id in left {
                let a = age(self, id);
                if a as f64 >= average {
                    reclaimed = reclaimed.saturating_add(self.blocks.get(id).size);
                    total_age -= a;
                    self.release_block(id);
                } else {
                    keep.push(id);
                }
            }
            left = keep;
            if left.len() == before {
                break;
            }
        }
        Ok(())
    }
}
