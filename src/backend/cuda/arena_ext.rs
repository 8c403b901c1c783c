//! CUDA-only methods of [`Arena`]: construction, typed views usable as
//! kernel arguments, pinned pointers, stream joins and typed transfers.
//!
//! Built only on the arena's public API (plus `backend_mut`), so the arena
//! core knows nothing about CUDA.

use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use bytemuck::Pod;
use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, LaunchArgs, PushKernelArg,
};

use super::{driver_err, CudaBackend, CudaCapacity, CudaOptions};
use crate::arena::Arena;
use crate::backend::Backend;
use crate::config::ArenaConfig;
use crate::error::{Error, Result};
use crate::handle::{ElemType, Handle};

/// A mutable view of one block as `len` elements of `T`, borrowing the
/// arena mutably: no compaction, allocation, free or transfer can happen
/// while it lives, so the block stays where the view points.
///
/// Pass `&mut view` straight to cudarc's launch builder, or take a
/// [`CudaViewMut`] with [`as_view_mut`](ArenaViewMut::as_view_mut) for
/// cudarc's copy functions.
///
/// The view carries cudarc events of its own: a kernel launched with it on
/// any stream records them, and dropping the view makes the arena stream
/// wait for that work (so the block is not moved or reused under it).
/// Raw pointers taken from the view get no such tracking; see the stream
/// contract on [`Arena<CudaBackend>`](Arena#impl-Arena<CudaBackend>).
#[derive(Debug)]
pub struct ArenaViewMut<'a, T> {
    /// An alias of the block's bytes; never freed (see `Drop`).
    slice: ManuallyDrop<CudaSlice<T>>,
    _arena: PhantomData<&'a mut ()>,
}

impl<T> ArenaViewMut<'_, T> {
    /// Elements in the view.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// True for a view of no elements (never: blocks hold at least one byte).
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

    /// Device address of the first element (valid while the view lives).
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

/// Input views and output views for a kernel, from [`Arena::views_io`].
pub type IoViews<'a, I, O, const M: usize, const N: usize> =
    ([CudaView<'a, I>; M], [ArenaViewMut<'a, O>; N]);

/// # The stream contract
///
/// Every transfer, compaction, spill and table update of the arena runs on
/// the *arena stream* ([`Arena::stream`]) in order, without blocking the
/// host (reads excepted). So:
///
/// - **Kernels on the arena stream need nothing.** A kernel that writes a
///   view, then a compaction that moves the block, then a read: the stream
///   orders them.
/// - **Other streams must be joined before the arena moves or reuses what
///   they touch.** Call [`join`](Arena::join) with the other stream after
///   enqueueing its work and before the next call that can compact
///   (allocations, [`compact`](Arena::compact)) or free. Views passed to
///   cudarc's launch builder are also tracked by cudarc's events (the arena
///   stream waits for them when the view is dropped or at the next
///   compaction), but raw pointers ([`pinned_ptr`](Arena::pinned_ptr),
///   [`ArenaViewMut::device_address`]) are not.
/// - **Freed space is reused in stream order.** After `free`, a later
///   allocation may hand out the same bytes at once; work enqueued on the
///   arena stream before the free has finished with them by the time later
///   work runs. Work on other streams must have been joined before `free`.
/// - Views borrow the arena, so nothing can move while they live; a pinned
///   block's pointer is valid until its last `unpin`.
impl Arena<CudaBackend> {
    /// An arena of `config.capacity_bytes` on CUDA device `ordinal`, with
    /// the default kernel options.
    pub fn cuda(config: ArenaConfig, ordinal: usize) -> Result<Self> {
        Self::cuda_with_options(config, ordinal, CudaOptions::default())
    }

    /// An arena on CUDA device `ordinal` with move-kernel `options`.
    pub fn cuda_with_options(
        config: ArenaConfig,
        ordinal: usize,
        options: CudaOptions,
    ) -> Result<Self> {
        config.validate()?;
        let backend = CudaBackend::with_options(
            ordinal,
            CudaCapacity::Bytes(config.capacity_bytes),
            options,
        )?;
        Arena::with_backend(config, backend)
    }

    /// The arena stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.backend().stream()
    }

    /// Offset and element count of a resident block viewed as `T`.
    fn typed_range<T: Pod>(&self, h: Handle) -> Result<(u64, usize)> {
        let info = self.info(h)?;
        if !info.resident {
            return Err(Error::NotResident);
        }
        let requested_type = std::any::type_name::<T>();
        if let Some(e) = info.elem {
            if e != ElemType::of::<T>() {
                return Err(Error::TypeMismatch {
                    block_type: e.name,
                    requested_type,
                });
            }
        }
        let elem = std::mem::size_of::<T>() as u64;
        if elem == 0 || info.size_bytes % elem != 0 {
            return Err(Error::NotWholeElements {
                block_bytes: info.size_bytes,
                elem_bytes: elem,
            });
        }
        // Counted as a use for the spill policy.
        let offset = self.resolve(h)?;
        let address = self.backend().region_ptr() + offset;
        if address % std::mem::align_of::<T>() as u64 != 0 {
            return Err(Error::MisalignedView {
                offset,
                requested_type,
                elem_align_bytes: std::mem::align_of::<T>() as u64,
            });
        }
        let len = usize::try_from(info.size_bytes / elem).map_err(|_| Error::TooLarge {
            requested_bytes: info.size_bytes,
            capacity_bytes: usize::MAX as u64,
        })?;
        Ok((offset, len))
    }

    /// A view of block `h` as `T`s, for kernel arguments and copies.
    ///
    /// Fails with [`Error::TypeMismatch`] for a block allocated for another
    /// element type, [`Error::MisalignedView`] for one placed below `T`'s
    /// alignment,
    /// [`Error::NotWholeElements`], or [`Error::NotResident`] for a spilled
    /// block (call [`make_resident`](Arena::make_resident) first).
    pub fn view<T: Pod>(&self, h: Handle) -> Result<CudaView<'_, T>> {
        let (offset, len) = self.typed_range::<T>(h)?;
        let bytes = len * std::mem::size_of::<T>();
        let start = offset as usize;
        let out_of_bounds = || Error::OutOfBounds {
            offset,
            len: bytes as u64,
            capacity_bytes: self.backend().capacity_bytes(),
        };
        let bytes_view = self
            .backend()
            .region()
            .try_slice(start..start + bytes)
            .ok_or_else(out_of_bounds)?;
        // SAFETY: `T: Pod`, so any bytes are a valid `T`; the view covers
        // exactly the block's whole elements, at an address aligned for `T`
        // (checked in typed_range).
        unsafe { bytes_view.transmute::<T>(len) }.ok_or_else(out_of_bounds)
    }

    /// A mutable view of block `h` as `T`s (same checks as [`view`](Arena::view)).
    pub fn view_mut<T: Pod>(&mut self, h: Handle) -> Result<ArenaViewMut<'_, T>> {
        let [v] = self.views_mut([h])?;
        Ok(v)
    }

    /// Mutable views of `N` distinct blocks at once (a kernel with several
    /// outputs). A handle given twice is rejected with
    /// [`Error::AliasedViews`].
    pub fn views_mut<T: Pod, const N: usize>(
        &mut self,
        handles: [Handle; N],
    ) -> Result<[ArenaViewMut<'_, T>; N]> {
        let (_, outputs) = self.views_io::<T, T, 0, N>([], handles)?;
        Ok(outputs)
    }

    /// Views for a kernel that reads `inputs` (as `I`) and writes `outputs`
    /// (as `O`): the outputs must be distinct from each other and from the
    /// inputs ([`Error::AliasedViews`] otherwise); inputs may repeat.
    pub fn views_io<I: Pod, O: Pod, const M: usize, const N: usize>(
        &mut self,
        inputs: [Handle; M],
        outputs: [Handle; N],
    ) -> Result<IoViews<'_, I, O, M, N>> {
        for (k, h) in outputs.iter().enumerate() {
            if outputs[..k].contains(h) || inputs.contains(h) {
                return Err(Error::AliasedViews { output: k });
            }
        }
        let this: &Self = self;
        // Check everything before making any view.
        let mut ranges = [(0u64, 0usize); N];
        for (r, &h) in ranges.iter_mut().zip(outputs.iter()) {
            *r = this.typed_range::<O>(h)?;
        }
        let mut ins = Vec::with_capacity(M);
        for &h in &inputs {
            ins.push(this.view::<I>(h)?);
        }
        let stream = this.backend().stream();
        let base = this.backend().region_ptr();
        let outs = ranges.map(|(offset, len)| {
            // SAFETY: the block's whole elements lie in the region at
            // `base + offset` (typed_range), aligned for `O`, and `O: Pod`.
            // The alias never frees the memory (ArenaViewMut::drop leaks
            // it), and the `&mut self` borrow the view carries keeps the
            // block from moving, being freed or being viewed again.
            let slice = unsafe { stream.upgrade_device_ptr::<O>(base + offset, len) };
            ArenaViewMut {
                slice: ManuallyDrop::new(slice),
                _arena: PhantomData,
            }
        });
        let ins: [CudaView<'_, I>; M] = match ins.try_into() {
            Ok(a) => a,
            Err(_) => {
                return Err(Error::InvalidConfig {
                    reason: "internal: input views".to_string(),
                })
            }
        };
        Ok((ins, outs))
    }

    /// Device address of a pinned block, valid until its last
    /// [`unpin`](Arena::unpin). [`Error::NotPinned`] for an unpinned block.
    /// Work that uses it on another stream must be [`join`](Arena::join)ed
    /// before the unpin.
    pub fn pinned_ptr(&self, h: Handle) -> Result<u64> {
        let info = self.info(h)?;
        if info.pins == 0 {
            return Err(Error::NotPinned);
        }
        Ok(self.backend().region_ptr() + self.resolve(h)?)
    }

    /// Makes the arena stream wait for the work enqueued on `other` so far:
    /// later compactions, frees and transfers happen after it.
    pub fn join(&mut self, other: &CudaStream) -> Result<()> {
        let event = other
            .record_event(None)
            .map_err(driver_err("cuEventRecord"))?;
        self.stream()
            .wait(&event)
            .map_err(driver_err("cuStreamWaitEvent"))
    }

    /// Copies `data` into block `h`; `data` must be exactly the block's size
    /// and of its element type (see [`Arena::write`]).
    pub fn upload<T: Pod>(&mut self, h: Handle, data: &[T]) -> Result<()> {
        self.write(h, data)
    }

    /// Copies block `h` to the host as `T`s (see [`Arena::read`]); waits
    /// for the arena stream.
    pub fn download<T: Pod>(&mut self, h: Handle) -> Result<Vec<T>> {
        self.read(h)
    }

    /// Device address of the backend's copy of the handle table (see
    /// `kernels/cuarena.cuh`), flushed first so that every live handle
    /// resolves. Valid until the next call that allocates.
    pub fn handle_table_ptr(&mut self) -> Result<u64> {
        self.flush_table()?;
        Ok(self.backend().table_ptr())
    }

    /// Waits for the arena stream and reports any error the move kernels
    /// found since the last check.
    pub fn synchronize(&mut self) -> Result<()> {
        self.backend_mut().synchronize()
    }
}
