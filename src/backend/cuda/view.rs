//! Typed views of byte ranges of the region, for kernel arguments and
//! cudarc copies. The backend checks what makes a view sound on its own
//! (bounds, alignment, outputs that alias nothing); which block a range
//! belongs to is the arena's business.

use std::marker::PhantomData;
use std::mem::ManuallyDrop;

use bytemuck::Pod;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, LaunchArgs, PushKernelArg};

use super::CudaBackend;
use crate::backend::check_range;
use crate::error::{Error, Result};

/// A mutable view of `len` elements of `T` in the region, borrowing the
/// backend (and so the arena) mutably: no compaction, allocation, free or
/// transfer can happen while it lives, so the bytes stay where it points.
///
/// Pass `&mut view` straight to cudarc's launch builder, or take a
/// [`CudaViewMut`] with [`as_view_mut`](ArenaViewMut::as_view_mut) for
/// cudarc's copy functions.
///
/// The view carries cudarc events of its own: a kernel launched with it on
/// any stream records them, and dropping the view makes the arena stream
/// wait for that work (so the block is not moved or reused under it).
#[derive(Debug)]
pub struct ArenaViewMut<'a, T> {
    /// An alias of the block's bytes; never freed (see `Drop`).
    slice: ManuallyDrop<CudaSlice<T>>,
    _region: PhantomData<&'a mut ()>,
}

impl<T> ArenaViewMut<'_, T> {
    /// Elements in the view.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// True for a view of no elements.
    pub fn is_empty(&self) -> bool {
        self.slice.is_empty()
    }

    /// The view as a cudarc mutable view (for copies and slicing).
    pub fn as_view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.slice.as_view_mut()
    }

    /// The view as a cudarc view.
    pub fn as_view(&self) -> CudaView<'_, T> {
        self.slice.as_view()
    }

    /// Device address of the first element, as a **plain number**: it is
    /// right while this view lives (the view borrows the arena, so nothing
    /// moves), and goes stale at the next compaction after the view is
    /// dropped. Work that uses it on another stream is not tracked. Keep
    /// the view, or pin the block, for as long as the address is used.
    pub fn device_address(&self) -> u64 {
        let (ptr, _record) = self.slice.device_ptr(self.slice.stream());
        ptr
    }
}

impl<T> Drop for ArenaViewMut<'_, T> {
    fn drop(&mut self) {
        // SAFETY: `slice` is taken exactly once, here. `leak` makes the
        // arena stream wait for the recorded uses of the view and hands the
        // address back without freeing it: the bytes belong to the region.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        let _ = slice.leak();
    }
}

// SAFETY: pushes the aliased slice exactly as cudarc pushes a
// `&mut CudaSlice<T>` (its device pointer, and its events for cudarc's
// stream tracking); the reference outlives the launch builder ('b: 'a).
unsafe impl<'a, 'b: 'a, 'c, T> PushKernelArg<&'b mut ArenaViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut ArenaViewMut<'c, T>) -> &mut Self {
        let slice: &'b mut CudaSlice<T> = &mut arg.slice;
        self.arg(slice)
    }
}

// SAFETY: as above, pushed as a read-only `&CudaSlice<T>`.
unsafe impl<'a, 'b: 'a, 'c, T> PushKernelArg<&'b ArenaViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b ArenaViewMut<'c, T>) -> &mut Self {
        let slice: &'b CudaSlice<T> = &arg.slice;
        self.arg(slice)
    }
}

/// Input views and output views for a kernel, from
/// [`CudaBackend::views_io`] (and the arena's `views_io`).
pub type IoViews<'a, I, O, const M: usize, const N: usize> =
    ([CudaView<'a, I>; M], [ArenaViewMut<'a, O>; N]);

impl CudaBackend {
    /// Checks that `len` elements of `T` at region offset `offset` lie in
    /// the region at an address aligned for `T`; returns the byte range.
    fn typed_bytes<T>(&self, offset: u64, len: usize) -> Result<(u64, u64)> {
        let size = std::mem::size_of::<T>() as u64;
        let bytes = (len as u64).checked_mul(size).ok_or(Error::OutOfBounds {
            offset,
            len: u64::MAX,
            capacity_bytes: self.capacity_bytes,
        })?;
        check_range(offset, bytes, self.capacity_bytes)?;
        let align = std::mem::align_of::<T>() as u64;
        if (self.region_ptr + offset) % align != 0 {
            return Err(Error::MisalignedView {
                offset,
                requested_type: std::any::type_name::<T>(),
                elem_align_bytes: align,
            });
        }
        Ok((offset, offset + bytes))
    }

    /// A read-only view of `len` elements of `T` at region offset `offset`.
    /// [`Error::OutOfBounds`] outside the region, [`Error::MisalignedView`]
    /// at an address not aligned for `T`.
    pub fn view<T: Pod>(&self, offset: u64, len: usize) -> Result<CudaView<'_, T>> {
        let (start, end) = self.typed_bytes::<T>(offset, len)?;
        let out_of_bounds = || Error::OutOfBounds {
            offset,
            len: end - start,
            capacity_bytes: self.capacity_bytes,
        };
        let (start, end) = (
            usize::try_from(start).map_err(|_| out_of_bounds())?,
            usize::try_from(end).map_err(|_| out_of_bounds())?,
        );
        let bytes_view = self
            .region
            .try_slice(start..end)
            .ok_or_else(out_of_bounds)?;
        // SAFETY: `T: Pod`, so any bytes are a valid `T`; the view covers
        // exactly `len` elements inside the region, at an address aligned
        // for `T` (typed_bytes).
        unsafe { bytes_view.transmute::<T>(len) }.ok_or_else(out_of_bounds)
    }

    /// Views for a kernel that reads `inputs` (as `I`) and writes `outputs`
    /// (as `O`), each given as `(region offset, elements)`. Inputs may
    /// overlap each other; an output that overlaps another output or an
    /// input is [`Error::AliasedViews`]. Everything is checked before any
    /// view is made.
    pub fn views_io<I: Pod, O: Pod, const M: usize, const N: usize>(
        &mut self,
        inputs: [(u64, usize); M],
        outputs: [(u64, usize); N],
    ) -> Result<IoViews<'_, I, O, M, N>> {
        let mut in_bytes = [(0u64, 0u64); M];
        for (r, &(offset, len)) in in_bytes.iter_mut().zip(inputs.iter()) {
            *r = self.typed_bytes::<I>(offset, len)?;
        }
        let mut out_bytes = [(0u64, 0u64); N];
        for (r, &(offset, len)) in out_bytes.iter_mut().zip(outputs.iter()) {
            *r = self.typed_bytes::<O>(offset, len)?;
        }
        let overlaps = |a: (u64, u64), b: (u64, u64)| a.0 < b.1 && b.0 < a.1;
        for (k, &o) in out_bytes.iter().enumerate() {
            if out_bytes[..k]
                .iter()
                .chain(in_bytes.iter())
                .any(|&p| overlaps(o, p))
            {
                return Err(Error::AliasedViews { output: k });
            }
        }
        let this: &Self = self;
        let mut ins = Vec::with_capacity(M);
        for &(offset, len) in &inputs {
            ins.push(this.view::<I>(offset, len)?);
        }
        let ins: [CudaView<'_, I>; M] = ins
            .try_into()
            .map_err(|_| Error::AliasedViews { output: 0 })?;
        let stream = &this.stream;
        let base = this.region_ptr;
        let outs = outputs.map(|(offset, len)| {
            // SAFETY: `len` elements of `O` lie in the region at
            // `base + offset`, aligned for `O` (typed_bytes), and `O: Pod`.
            // No other output or input overlaps them (checked above). The
            // alias never frees the memory (ArenaViewMut::drop leaks it),
            // and the `&mut self` borrow the view carries keeps the region
            // from being written, moved or viewed again while it lives.
            let slice = unsafe { stream.upgrade_device_ptr::<O>(base + offset, len) };
            ArenaViewMut {
                slice: ManuallyDrop::new(slice),
                _region: PhantomData,
            }
        });
        Ok((ins, outs))
    }
}
