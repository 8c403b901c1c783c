//! Expandable segments (`expandable_segments:True`): one address range per
//! stream and pool, reserved once, with physical pages (2 MiB in the small
//! pool, 20 MiB in the large one) mapped where a request needs them, at the
//! lowest address that fits (`segment_map`), and unmapped when the cache
//! is emptied (`segment_unmap`).

use super::blocks::{Block, Id};
use super::caching::{Expandable, Model, LARGE_BUFFER, SMALL_BUFFER};
use crate::Result;

/// Address space reserved per expandable segment. PyTorch reserves 9/8 of
/// the device's memory, which a snapshot does not record; any range larger
/// than what the trace maps serves the same.
const ADDRESS_SPACE: u64 = 1 << 40;

/// The address range of an expandable segment with pages of `page` bytes.
pub(crate) fn address_space(page: u64) -> u64 {
    ADDRESS_SPACE.div_ceil(page) * page
}

impl Model {
    /// The page size of the segment `id` belongs to.
    fn segment_of(&self, id: Id) -> Expandable {
        let es = self.blocks.get(id).expandable.unwrap_or(0) as usize;
        self.expandable[es]
    }

    /// A new expandable segment for `stream` in a pool: one unmapped block
    /// spanning its address range. `base` `None`: fresh addresses.
    pub(crate) fn new_expandable(
        &mut self,
        small: bool,
        stream: u64,
        base: Option<u64>,
    ) -> Result<Id> {
        let page = if small { SMALL_BUFFER } else { LARGE_BUFFER };
        let size = address_space(page);
        let base = match base {
            Some(b) => b,
            None => self.fresh_address(size),
        };
        let es = u32::try_from(self.expandable.len()).unwrap_or(u32::MAX);
        self.expandable.push(Expandable { base, page });
        let mut b = Block::new(base, size, stream, small);
        b.mapped = false;
        b.expandable = Some(es);
        let id = self.blocks.add(b)?;
        self.blocks.insert(id);
        Ok(id)
    }

    /// `find_expandable_block`: the lowest address of the stream's
    /// segments where free and unmapped blocks in a row hold `size` bytes,
    /// or a new segment.
    fn find_expandable_block(&mut self, small: bool, stream: u64, size: u64) -> Result<Id> {
        let found = self
            .blocks
            .pool(small)
            .unmapped
            .range((stream, 0, 0)..)
            .take_while(|k| k.0 == stream)
            .map(|k| {
                let prev = self.blocks.get(k.2).prev;
                if self.blocks.is_free(prev) {
                    prev.unwrap_or(k.2)
                } else {
                    k.2
                }
            })
            .find(|&c| self.has_room(c, size));
        match found {
            Some(c) => Ok(c),
            None => self.new_expandable(small, stream, None),
        }
    }

    /// Whether the free (mapped or not) blocks from `id` on hold `size`.
    fn has_room(&self, id: Id, size: u64) -> bool {
        let mut bytes = 0u64;
        let mut cur = Some(id);
        while bytes < size && self.blocks.is_free(cur) {
            let Some(c) = cur else { break };
            bytes = bytes.saturating_add(self.blocks.get(c).size);
            cur = self.blocks.get(c).next;
        }
        bytes >= size
    }

    /// `try_allocate_expandable_block`: maps pages until a free block of
    /// at least `size` bytes exists at the lowest address that can hold
    /// it; takes it from the pool.
    pub(crate) fn try_allocate_expandable(
        &mut self,
        small: bool,
        stream: u64,
        size: u64,
    ) -> Result<Option<Id>> {
        let mut c = self.find_expandable_block(small, stream, size)?;
        if !self.blocks.get(c).mapped {
            let want = self.blocks.get(c).size.min(size);
            if !self.map_block(c, want)? {
                return Ok(None);
            }
        }
        while self.blocks.get(c).size < size {
            let remaining = size - self.blocks.get(c).size;
            let Some(next) = self.blocks.get(c).next else {
                return Ok(None);
            };
            let want = remaining.min(self.blocks.get(next).size);
            if !self.map_block(next, want)? {
                return Ok(None);
            }
            // `next` now holds `c` merged in.
            c = next;
        }
        self.blocks.take(c);
        Ok(Some(c))
    }

    /// `map_block`: pages mapped under the first `size` bytes of the
    /// unmapped block `id` (its rest stays unmapped), merged with free
    /// neighbours and put in the pool. False when the limit stops it.
    fn map_block(&mut self, id: Id, size: u64) -> Result<bool> {
        let seg = self.segment_of(id);
        let b = *self.blocks.get(id);
        let first = (b.addr - seg.base) / seg.page;
        let end = (b.addr - seg.base + size).div_ceil(seg.page);
        let bytes = (end - first) * seg.page;
        if bytes == 0 || self.over_cap(bytes) {
            return Ok(bytes == 0);
        }
        self.blocks.take(id);
        if bytes < b.size {
            let rest = self.blocks.split_back(id, bytes)?;
            self.blocks.insert(rest);
        }
        self.blocks.get_mut(id).mapped = true;
        let (prev, next) = (self.blocks.get(id).prev, self.blocks.get(id).next);
        self.blocks.try_merge(id, prev);
        self.blocks.try_merge(id, next);
        self.blocks.insert(id);
        self.reserved += bytes;
        self.events.map += 1;
        self.events.map_bytes += bytes;
        Ok(true)
    }

    /// `unmap_block`: the whole pages inside the free block `id` unmapped
    /// (the parts before and after them stay free blocks).
    pub(crate) fn unmap_block(&mut self, id: Id) -> Result<()> {
        let seg = self.segment_of(id);
        let b = *self.blocks.get(id);
        let first = (b.addr - seg.base).div_ceil(seg.page);
        let end = (b.addr - seg.base + b.size) / seg.page;
        if first >= end {
            return Ok(());
        }
        self.blocks.take(id);
        let start = seg.base + first * seg.page;
        let bytes = (end - first) * seg.page;
        let mut mid = id;
        if start > b.addr {
            // The block keeps the part before; the pages go to a new one.
            mid = self.blocks.split_back(id, start - b.addr)?;
            self.blocks.insert(id);
        }
        if self.blocks.get(mid).size > bytes {
            let after = self.blocks.split_back(mid, bytes)?;
            self.blocks.insert(after);
        }
        self.blocks.get_mut(mid).mapped = false;
        let (prev, next) = (self.blocks.get(mid).prev, self.blocks.get(mid).next);
        self.blocks.try_merge(mid, prev);
        self.blocks.try_merge(mid, next);
        self.blocks.insert(mid);
        self.reserved = self.reserved.saturating_sub(bytes);
        self.events.unmap += 1;
        self.events.unmap_bytes += bytes;
        Ok(())
    }
}
