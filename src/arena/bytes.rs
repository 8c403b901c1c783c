//! Bytes in and out of blocks, and on the device between them: writes,
//! reads, copies and fills of byte ranges of blocks (a [`Handle`], a
//! [`crate::Storage`] or a [`crate::StorageSlice`]), typed or not. They
//! run in arena-stream order after the streams that used the blocks (see
//! [`StreamId`](crate::StreamId)), with the same semantics on every
//! backend. Every argument is checked before anything changes: a
//! call that returns an error has moved, spilled and written nothing.

use super::{Arena, Block};
use crate::backend::Backend;
use crate::dtype::{name_of, DType, Element};
use crate::error::{Error, Result};
use crate::handle::Handle;
use crate::slots::Slots;
use crate::storage::{AsRange, BlockRange};

/// A range checked against its block: the handle, offset in the block,
/// bytes, and the dtype it is read as (the range's, else the block's).
#[derive(Debug, Clone, Copy)]
pub(super) struct Checked {
    pub(super) handle: Handle,
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) dtype: Option<DType>,
}

/// Checks `r` against its block in `blocks` (alive, of arena `arena_id`,
/// in bounds) and, for a typed access (`want` set), that the range's dtype
/// is `want` (an untyped range takes any) and that it holds whole
/// elements at an offset in the block aligned to their size
/// ([`Error::Misaligned`]). `None` for zero bytes of no block (an empty storage). Shared
/// by the arena's operations and the CUDA kernel arguments, which hold
/// the block table apart from the backend.
pub(super) fn check_block_range(
    blocks: &Slots<Block>,
    arena_id: u64,
    r: &BlockRange,
    want: Option<DType>,
) -> Result<Option<Checked>> {
    let Some(handle) = r.handle else {
        let len = r.len_bytes.unwrap_or(0);
        if r.offset_bytes != 0 || len != 0 {
            return Err(Error::OutOfBounds {
                start_bytes: r.offset_bytes,
                end_bytes: r.offset_bytes.saturating_add(len),
                available_bytes: 0,
            });
        }
        if let (Some(have), Some(want)) = (r.dtype, want) {
            check_dtype(Some(have), want)?;
        }
        return Ok(None);
    };
    if handle.arena != arena_id {
        return Err(Error::Foreign {
            kind: "handle",
            owner: handle.arena,
            arena: arena_id,
        });
    }
    let b = blocks.get(handle.key).ok_or(Error::StaleHandle)?;
    let dtype = r.dtype.or(b.dtype);
    if let Some(want) = want {
        check_dtype(dtype, want)?;
    }
    let len = r.len_bytes.unwrap_or(b.size.saturating_sub(r.offset_bytes));
    let fits = r.offset_bytes.checked_add(len).is_some_and(|e| e <= b.size);
    if !fits {
        return Err(Error::OutOfBounds {
            start_bytes: r.offset_bytes,
            end_bytes: r.offset_bytes.saturating_add(len),
            available_bytes: b.size,
        });
    }
    // Whole elements, at an offset in the block that is a multiple of the
    // element size: a typed access reads the elements a kernel would (the
    // block's own alignment is the allocation's; kernel views check it).
    if let Some(want) =
        want.filter(|w| len % w.size_bytes() != 0 || r.offset_bytes % w.size_bytes() != 0)
    {
        return Err(Error::Misaligned {
            offset_bytes: r.offset_bytes,
            len_bytes: len,
            elem_type: want.name(),
            elem_bytes: want.size_bytes(),
        });
    }
    Ok(Some(Checked {
        handle,
        offset: r.offset_bytes,
        len,
        dtype,
    }))
}

/// [`Error::TypeMismatch`] unless a range of dtype `have` (`None`:
/// untyped, which takes any) may be accessed as `want`.
pub(super) fn check_dtype(have: Option<DType>, want: DType) -> Result<()> {
    match have {
        Some(h) if h != want => Err(Error::TypeMismatch {
            range_type: name_of(have),
            requested_type: want.name(),
        }),
        _ => Ok(()),
    }
}

/// A `Vec` of `n` zeroed `T`s for `bytes` bytes, allocated fallibly: a
/// range larger than host memory (a metadata arena's) is an error, not an
/// abort.
pub(super) fn host_vec<T: bytemuck::Pod>(bytes: u64, what: &'static str) -> Result<Vec<T>> {
    let elem = (std::mem::size_of::<T>() as u64).max(1);
    // More than the address space holds: no allocator could give it.
    let n = usize::try_from(bytes / elem).map_err(|_| Error::HostMemory {
        requested_bytes: bytes,
        what,
    })?;
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| Error::HostMemory {
        requested_bytes: bytes,
        what,
    })?;
    out.resize(n, T::zeroed());
    Ok(out)
}

impl<B: Backend> Arena<B> {
    /// Checks `r` against its block (see [`check_block_range`]).
    fn check_range(&self, r: &BlockRange, want: Option<DType>) -> Result<Option<Checked>> {
        self.check_usable()?;
        check_block_range(&self.core.blocks, self.core.id, r, want)
    }

    /// Region offset of a checked range whose block is resident.
    fn region_offset(&self, c: Checked) -> Result<u64> {
        let b: &Block = self.block(c.handle)?;
        Ok(self.device_offset(b)? + c.offset)
    }

    /// Writes `data` into the bytes `dst` names (a block through its
    /// handle, a storage, a slice of one): `data` must be exactly that long
    /// ([`Error::LengthMismatch`]) and `T` the range's dtype, unless the
    /// range is untyped ([`Error::TypeMismatch`]; any dtype's bytes:
    /// [`write_bytes`](Arena::write_bytes)). A spilled block is brought
    /// back first; the arguments are checked before that, so a wrong type
    /// or length changes nothing.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let x = arena.alloc_storage_dtype(DType::F32, 3)?;
    /// arena.write(&x, &[1.0f32, 2.0, 3.0])?;
    /// assert!(arena.write(&x, &[1u32, 2, 3]).is_err()); // not the storage's dtype
    /// assert_eq!(arena.read::<f32>(&x)?, [1.0, 2.0, 3.0]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn write<T: Element>(&mut self, dst: impl AsRange, data: &[T]) -> Result<()> {
        self.write_checked(&dst, bytemuck::cast_slice(data), Some(T::DTYPE))
    }

    /// Writes `data` into the bytes `dst` names, whatever their dtype;
    /// `data` must be exactly that long ([`Error::LengthMismatch`]).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let x = arena.alloc_storage_dtype(DType::F32, 2)?;
    /// arena.write_bytes(&x, &[0, 0, 128, 63, 0, 0, 0, 64])?; // any dtype, as bytes
    /// assert_eq!(arena.read::<f32>(&x)?, [1.0, 2.0]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn write_bytes(&mut self, dst: impl AsRange, data: &[u8]) -> Result<()> {
        self.write_checked(&dst, data, None)
    }

    fn write_checked(
        &mut self,
        dst: &impl AsRange,
        bytes: &[u8],
        want: Option<DType>,
    ) -> Result<()> {
        let Some(c) = self.check_range(&dst.block_range(), want)? else {
            return expect_len(0, bytes.len() as u64);
        };
        expect_len(c.len, bytes.len() as u64)?;
        self.make_resident(&[c.handle])?;
        let offset = self.region_offset(c)?;
        self.core.wait_uses(c.handle.key)?;
        self.core.order.queued();
        let r = self.core.backend.write(offset, bytes);
        self.sticky(r)
    }

    /// The bytes `src` names as a `Vec<T>`, `T` being the range's dtype
    /// unless it is untyped ([`Error::TypeMismatch`]; any dtype's bytes:
    /// [`read_bytes`](Arena::read_bytes)). Needs no exclusive access (a
    /// shared arena reads under its shared lock): a spilled block is
    /// [`Error::NotResident`] here (bring it back with
    /// [`make_resident`](Arena::make_resident); `SharedArena::read` does).
    /// The host waits for the arena stream and for the streams that used
    /// the block.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let x = arena.alloc_storage_dtype(DType::I32, 4)?;
    /// arena.write(&x, &[1i32, -2, 3, -4])?;
    /// assert_eq!(arena.read::<i32>(x.slice(1..3)?)?, [-2, 3]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn read<T: Element>(&self, src: impl AsRange) -> Result<Vec<T>> {
        let len = self
            .check_range(&src.block_range(), Some(T::DTYPE))?
            .map_or(0, |c| c.len);
        let mut out = host_vec::<T>(len, "the Vec that Arena::read returns")?;
        self.read_checked(&src, bytemuck::cast_slice_mut(&mut out), Some(T::DTYPE))?;
        Ok(out)
    }

    /// Reads the bytes `src` names into `out`, which must be exactly that
    /// long ([`Error::LengthMismatch`]); otherwise as [`read`](Arena::read).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let x = arena.alloc_storage_dtype(DType::U16, 4)?;
    /// arena.fill(&x, 7u16)?;
    /// let mut out = [0u16; 4]; // a buffer of the caller's: no allocation
    /// arena.read_into(&x, &mut out)?;
    /// assert_eq!(out, [7; 4]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn read_into<T: Element>(&self, src: impl AsRange, out: &mut [T]) -> Result<()> {
        self.read_checked(&src, bytemuck::cast_slice_mut(out), Some(T::DTYPE))
    }

    /// The bytes `src` names, whatever their dtype (otherwise as
    /// [`read`](Arena::read)).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let x = arena.alloc_storage_dtype(DType::U32, 1)?;
    /// arena.write(&x, &[0x0403_0201u32])?;
    /// assert_eq!(arena.read_bytes(&x)?, [1, 2, 3, 4]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn read_bytes(&self, src: impl AsRange) -> Result<Vec<u8>> {
        let len = self
            .check_range(&src.block_range(), None)?
            .map_or(0, |c| c.len);
        let mut out = host_vec::<u8>(len, "the Vec that Arena::read_bytes returns")?;
        self.read_checked(&src, &mut out, None)?;
        Ok(out)
    }

    fn read_checked(
        &self,
        src: &impl AsRange,
        bytes: &mut [u8],
        want: Option<DType>,
    ) -> Result<()> {
        let Some(c) = self.check_range(&src.block_range(), want)? else {
            return expect_len(0, bytes.len() as u64);
        };
        expect_len(c.len, bytes.len() as u64)?;
        let offset = self.region_offset(c)?;
        self.core.wait_uses(c.handle.key)?;
        let r = self.core.backend.read(offset, bytes);
        self.sticky(r)
    }

    /// Copies the bytes `src` names to the bytes `dst` names, on the device
    /// in arena-stream order. Same length ([`Error::LengthMismatch`]), same
    /// dtype when both are typed ([`Error::TypeMismatch`]: reinterpret one
    /// with `as_dtype` to copy across dtypes); within one block the ranges
    /// must not overlap ([`Error::Overlap`]). Spilled blocks are
    /// brought back.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let x = arena.alloc_storage_dtype(DType::F32, 4)?;
    /// arena.write(&x, &[1.0f32, 2.0, 3.0, 4.0])?;
    /// arena.copy(x.slice(0..2)?, x.slice(2..4)?)?; // disjoint ranges of one block
    /// assert_eq!(arena.read::<f32>(&x)?, [1.0, 2.0, 1.0, 2.0]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn copy(&mut self, src: impl AsRange, dst: impl AsRange) -> Result<()> {
        let s = self.check_range(&src.block_range(), None)?;
        let d = self.check_range(&dst.block_range(), None)?;
        let (s, d) = match (s, d) {
            (None, None) => return Ok(()),
            (Some(c), None) => return expect_len(0, c.len),
            (None, Some(c)) => return expect_len(c.len, 0),
            (Some(s), Some(d)) => (s, d),
        };
        expect_len(d.len, s.len)?;
        if let (Some(se), Some(de)) = (s.dtype, d.dtype) {
            if se != de {
                return Err(Error::TypeMismatch {
                    range_type: de.name(),
                    requested_type: se.name(),
                });
            }
        }
        if s.handle == d.handle {
            let apart = s.offset + s.len <= d.offset || d.offset + d.len <= s.offset;
            if !apart && s.len > 0 {
                return Err(Error::Overlap {
                    first_offset: s.offset,
                    first_bytes: s.len,
                    second_offset: d.offset,
                    second_bytes: d.len,
                });
            }
        }
        self.make_resident(&[s.handle, d.handle])?;
        let (so, dof) = (self.region_offset(s)?, self.region_offset(d)?);
        self.core.wait_uses(s.handle.key)?;
        self.core.wait_uses(d.handle.key)?;
        self.core.order.queued();
        let r = self.core.backend.copy(so, dof, s.len);
        self.sticky(r)
    }

    /// Fills the bytes `dst` names with `value` repeated, on the device in
    /// arena-stream order; `T` must be the range's dtype unless it is
    /// untyped ([`Error::TypeMismatch`]). To fill a range of another dtype
    /// with a bit pattern (a `bool` or fp8 range, zeros of any dtype),
    /// reinterpret it (`as_dtype(DType::U8)`) or allocate it untyped. A
    /// spilled block is brought back.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let x = arena.alloc_storage_dtype(DType::F64, 4)?;
    /// arena.fill(&x, 0.25f64)?;
    /// arena.fill(x.as_dtype(DType::U8)?.slice(0..8)?, 0u8)?; // bytes: zeros
    /// assert_eq!(arena.read::<f64>(&x)?, [0.0, 0.25, 0.25, 0.25]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn fill<T: Element>(&mut self, dst: impl AsRange, value: T) -> Result<()> {
        let pattern = bytemuck::bytes_of(&value);
        let Some(c) = self.check_range(&dst.block_range(), Some(T::DTYPE))? else {
            return Ok(());
        };
        self.make_resident(&[c.handle])?;
        let offset = self.region_offset(c)?;
        self.core.wait_uses(c.handle.key)?;
        self.core.order.queued();
        let r = self.core.backend.fill(offset, c.len, pattern);
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
            range_bytes: range,
            given_bytes: slice,
        })
    }
}
