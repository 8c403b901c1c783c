//! Device-side operations on byte ranges of blocks (a [`Handle`], a
//! [`crate::Storage`] or a [`crate::StorageSlice`]): sub-range reads and
//! writes, copies, fills. They run in arena-stream order after the streams
//! that used the blocks (see [`crate::stream`]), with the same semantics on
//! every backend. Every argument is checked before anything changes: a
//! call that returns an error has moved, spilled and written nothing.

use bytemuck::Pod;

use super::{Arena, Block};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::handle::Handle;
use crate::slots::Slots;
use crate::storage::{AsRange, BlockRange};

/// A range checked against its block: the handle, offset in the block, bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Checked {
    pub(super) handle: Handle,
    pub(super) offset: u64,
    pub(super) len: u64,
}

/// Checks `r` against its block in `blocks` (alive, of arena `arena_id`,
/// in bounds) and, for a typed access, the element type. `None` for zero
/// bytes of no block (an empty storage). Shared by the arena's operations
/// and the CUDA kernel arguments, which hold the block table apart from
/// the backend.
pub(super) fn check_block_range<T: Pod>(
    blocks: &Slots<Block>,
    arena_id: u64,
    r: &BlockRange,
    typed: bool,
) -> Result<Option<Checked>> {
    let Some(handle) = r.handle else {
        let len = r.len_bytes.unwrap_or(0);
        if r.offset_bytes != 0 || len != 0 {
            return Err(Error::RangeOutOfBounds {
                offset_bytes: r.offset_bytes,
                len_bytes: len,
                available_bytes: 0,
            });
        }
        return Ok(None);
    };
    if handle.arena != arena_id {
        return Err(Error::ForeignHandle {
            handle_arena: handle.arena,
            arena: arena_id,
        });
    }
    let b = blocks.get(handle.key).ok_or(Error::StaleHandle)?;
    if typed {
        Arena::<crate::backend::MetaBackend>::check_type::<T>(b)?;
    }
    let len = r.len_bytes.unwrap_or(b.size.saturating_sub(r.offset_bytes));
    let fits = r.offset_bytes.checked_add(len).is_some_and(|e| e <= b.size);
    if !fits {
        return Err(Error::RangeOutOfBounds {
            offset_bytes: r.offset_bytes,
            len_bytes: len,
            available_bytes: b.size,
        });
    }
    let elem = std::mem::size_of::<T>() as u64;
    if elem > 1 && len % elem != 0 {
        return Err(Error::NotWholeElements {
            block_bytes: len,
            elem_bytes: elem,
        });
    }
    Ok(Some(Checked {
        handle,
        offset: r.offset_bytes,
        len,
    }))
}

impl<B: Backend> Arena<B> {
    /// Checks `r` against its block (see [`check_block_range`]).
    fn check_range<T: Pod>(&self, r: &BlockRange, typed: bool) -> Result<Option<Checked>> {
        self.check_usable()?;
        check_block_range::<T>(&self.blocks, self.id, r, typed)
    }

    /// Region offset of a checked range whose block is resident.
    fn region_offset(&self, c: Checked) -> Result<u64> {
        let b: &Block = self.block(c.handle)?;
        Ok(self.device_offset(b)? + c.offset)
    }

    /// Writes `data` into the bytes `dst` names (a whole block, a storage or
    /// a slice of one); `data` must be exactly that long
    /// ([`Error::LengthMismatch`]), of the block's element type if it has one.
    pub fn write_range<T: Pod>(&mut self, dst: &impl AsRange, data: &[T]) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let Some(c) = self.check_range::<T>(&dst.block_range(), true)? else {
            return expect_len(0, bytes.len() as u64);
        };
        expect_len(c.len, bytes.len() as u64)?;
        self.make_resident(&[c.handle])?;
        let offset = self.region_offset(c)?;
        self.wait_uses(c.handle.key)?;
        self.epoch += 1;
        let r = self.backend.write(offset, bytes);
        self.sticky(r)
    }

    /// Reads the bytes `src` names into `out`, which must be exactly that
    /// long. Needs no exclusive access (a shared arena reads under its read
    /// lock); a spilled block is [`Error::NotResident`] here (bring it back
    /// with [`make_resident`](Arena::make_resident), or use
    /// [`read`](Arena::read), which does). The host waits for the arena
    /// stream and for the streams that used the block.
    pub fn read_range_into<T: Pod>(&self, src: &impl AsRange, out: &mut [T]) -> Result<()> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        let Some(c) = self.check_range::<T>(&src.block_range(), true)? else {
            return expect_len(0, bytes.len() as u64);
        };
        expect_len(c.len, bytes.len() as u64)?;
        let offset = self.region_offset(c)?;
        self.wait_uses(c.handle.key)?;
        let r = self.backend.read(offset, bytes);
        self.sticky(r)
    }

    /// The bytes `src` names as a `Vec<T>` (see
    /// [`read_range_into`](Arena::read_range_into)).
    pub fn read_range<T: Pod>(&self, src: &impl AsRange) -> Result<Vec<T>> {
        let len = match self.check_range::<T>(&src.block_range(), true)? {
            Some(c) => c.len,
            None => 0,
        };
        let elem = (std::mem::size_of::<T>() as u64).max(1);
        let n = usize::try_from(len / elem).map_err(|_| Error::ExceedsAddressSpace {
            requested_bytes: len,
            max_bytes: usize::MAX as u64,
        })?;
        let mut out = Vec::new();
        out.try_reserve_exact(n).map_err(|_| Error::HostMemory {
            requested_bytes: len,
            what: "the Vec that Arena::read_range returns",
        })?;
        out.resize(n, T::zeroed());
        self.read_range_into(src, &mut out)?;
        Ok(out)
    }

    /// Copies the bytes `src` names to the bytes `dst` names, on the device
    /// in arena-stream order. Same length ([`Error::LengthMismatch`]), same
    /// element type when both are typed ([`Error::TypeMismatch`]); within
    /// one block the ranges must not overlap ([`Error::OverlappingRanges`]).
    pub fn copy(&mut self, src: &impl AsRange, dst: &impl AsRange) -> Result<()> {
        let s = self.check_range::<u8>(&src.block_range(), false)?;
        let d = self.check_range::<u8>(&dst.block_range(), false)?;
        let (s, d) = match (s, d) {
            (None, None) => return Ok(()),
            (Some(c), None) => return expect_len(0, c.len),
            (None, Some(c)) => return expect_len(c.len, 0),
            (Some(s), Some(d)) => (s, d),
        };
        expect_len(d.len, s.len)?;
        let (sb, db) = (self.block(s.handle)?, self.block(d.handle)?);
        if let (Some(se), Some(de)) = (sb.elem, db.elem) {
            if se.id != de.id {
                return Err(Error::TypeMismatch {
                    block_type: de.name,
                    requested_type: se.name,
                });
            }
        }
        if s.handle == d.handle {
            let apart = s.offset + s.len <= d.offset || d.offset + d.len <= s.offset;
            if !apart && s.len > 0 {
                return Err(Error::OverlappingRanges {
                    src_offset: s.offset,
                    dst_offset: d.offset,
                    len_bytes: s.len,
                });
            }
        }
        self.make_resident(&[s.handle, d.handle])?;
        let (so, dof) = (self.region_offset(s)?, self.region_offset(d)?);
        self.wait_uses(s.handle.key)?;
        self.wait_uses(d.handle.key)?;
        self.epoch += 1;
        let r = self.backend.copy(so, dof, s.len);
        self.sticky(r)
    }

    /// Fills the bytes `dst` names with `value` repeated, on the device in
    /// arena-stream order. `T` must be the block's element type (if it has
    /// one) and 1, 2, 4, 8 or 16 bytes ([`Error::InvalidPattern`]).
    pub fn fill<T: Pod>(&mut self, dst: &impl AsRange, value: T) -> Result<()> {
        let pattern = bytemuck::bytes_of(&value);
        let Some(c) = self.check_range::<T>(&dst.block_range(), true)? else {
            return Ok(());
        };
        crate::backend::check_pattern(c.len, pattern)?;
        self.fill_checked(c, pattern)
    }

    /// Fills the bytes `dst` names with `byte`, whatever their element type
    /// (zeros, for example).
    pub fn fill_bytes(&mut self, dst: &impl AsRange, byte: u8) -> Result<()> {
        let r = dst.block_range();
        let Some(c) = self.check_range::<u8>(&r, false)? else {
            return Ok(());
        };
        self.fill_checked(c, &[byte])
    }

    fn fill_checked(&mut self, c: Checked, pattern: &[u8]) -> Result<()> {
        self.make_resident(&[c.handle])?;
        let offset = self.region_offset(c)?;
        self.wait_uses(c.handle.key)?;
        self.epoch += 1;
        let r = self.backend.fill(offset, c.len, pattern);
        self.sticky(r)
    }
}

/// [`Error::LengthMismatch`] unless `slice` bytes (of a host slice or a
/// source range) match a range of `range` bytes.
fn expect_len(range: u64, slice: u64) -> Result<()> {
    if range == slice {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            block_bytes: range,
            slice_bytes: slice,
        })
    }
}
