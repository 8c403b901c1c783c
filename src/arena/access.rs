//! Queries and host transfers.

use super::ops::{check_dtype, host_vec};
use super::{Arena, Block, Stats};
use crate::backend::Backend;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::handle::{BlockInfo, Handle};

impl<B: Backend> Arena<B> {
    /// Everything known about a live block.
    pub fn info(&self, h: Handle) -> Result<BlockInfo> {
        let b = self.block(h)?;
        Ok(self.info_of(h, b))
    }

    pub(super) fn info_of(&self, handle: Handle, b: &Block) -> BlockInfo {
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

    /// Bytes asked for when the block was allocated.
    pub fn size_bytes(&self, h: Handle) -> Result<u64> {
        Ok(self.block(h)?.size)
    }

    /// Alignment of the block's offset.
    pub fn align_bytes(&self, h: Handle) -> Result<u64> {
        Ok(self.block(h)?.align())
    }

    /// The dtype the block was allocated for (`None`: untyped bytes).
    pub fn dtype(&self, h: Handle) -> Result<Option<DType>> {
        Ok(self.block(h)?.dtype)
    }

    /// True if the handle names a live block of this arena.
    pub fn contains(&self, h: Handle) -> bool {
        h.arena == self.id && self.blocks.contains_key(h.key)
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

    /// Free regions `(offset, len)` of the region's bytes, in address order.
    /// With deferred moves (`src/plan/lag.rs`) these differ from the
    /// placement index's, which [`Stats`] describes (where the next block
    /// goes): the same free bytes, laid out where the bytes really are.
    pub fn free_regions(&self) -> Vec<(u64, u64)> {
        if self.lag.is_empty() {
            return self
                .index
                .regions()
                .filter(|r| r.slot.is_none())
                .map(|r| (r.offset, r.size))
                .collect();
        }
        let mut used: Vec<(u64, u64)> = self
            .blocks
            .iter()
            .filter_map(|(_, b)| Some((b.real_offset()?, b.reserved())))
            .collect();
        used.sort_unstable();
        let mut free = Vec::new();
        let mut cursor = 0;
        let capacity = self.config.capacity_bytes;
        for (offset, len) in used.into_iter().chain(std::iter::once((capacity, 0))) {
            if offset > cursor {
                free.push((cursor, offset - cursor));
            }
            cursor = cursor.max(offset + len);
        }
        free
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
        }
    }

    /// The statistics as a readable table.
    pub fn summary(&self) -> String {
        self.stats().summary()
    }

    // ---- data -----------------------------------------------------------------

    /// A whole-block transfer's arguments: the handle, `T` against the
    /// block's dtype, `len` bytes against its size.
    fn check_transfer<T: Element>(&self, h: Handle, len: usize) -> Result<()> {
        let b = self.block(h)?;
        check_dtype(b.dtype, T::DTYPE)?;
        if len as u64 != b.size {
            return Err(Error::LengthMismatch {
                block_bytes: b.size,
                slice_bytes: len as u64,
            });
        }
        Ok(())
    }

    /// Writes `data` into the block; `data` must be exactly the block's
    /// size, `T` its dtype unless it is untyped. Arguments are checked
    /// before a spilled block is brought back: a wrong type or length
    /// changes nothing. Byte ranges of any dtype: [`write_bytes`](Arena::write_bytes).
    pub fn write<T: Element>(&mut self, h: Handle, data: &[T]) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        self.check_transfer::<T>(h, bytes.len())?;
        self.make_resident(&[h])?;
        let b = self.block(h)?;
        let offset = self.device_offset(b)?;
        self.wait_uses(h.key)?;
        self.epoch += 1;
        let r = self.backend.write(offset, bytes);
        self.sticky(r)
    }

    /// Reads the block into `out`, which must be exactly the block's size.
    /// Arguments are checked before a spilled block is brought back.
    pub fn read_into<T: Element>(&mut self, h: Handle, out: &mut [T]) -> Result<()> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        self.check_transfer::<T>(h, bytes.len())?;
        self.make_resident(&[h])?;
        let b = self.block(h)?;
        let offset = self.device_offset(b)?;
        self.wait_uses(h.key)?;
        let r = self.backend.read(offset, bytes);
        self.sticky(r)
    }

    /// Reads the block as a `Vec<T>`, bringing it back if spilled.
    pub fn read<T: Element>(&mut self, h: Handle) -> Result<Vec<T>> {
        let b = self.block(h)?;
        check_dtype(b.dtype, T::DTYPE)?;
        let elem = T::DTYPE.size_bytes();
        if b.size % elem != 0 {
            return Err(Error::NotWholeElements {
                block_bytes: b.size,
                elem_bytes: elem,
            });
        }
        let mut out = host_vec::<T>(b.size, "the Vec that Arena::read returns")?;
        self.read_into(h, &mut out)?;
        Ok(out)
    }
}
