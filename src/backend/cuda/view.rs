//! Typed views of byte ranges of the region, for kernel arguments, cudarc's
//! copies, cuBLAS and NCCL. The backend checks what makes a view sound on
//! its own (bounds, alignment, outputs that alias nothing, one view set at
//! a time); which block a range belongs to is the arena's business.
//!
//! The views carry no cudarc events: cudarc's per-slice tracking would treat
//! the whole region as one buffer, serialising unrelated work on different
//! streams while ordering nothing the arena relies on. The arena orders
//! streams itself (see [`StreamId`](crate::StreamId)): a view is *for* one stream, and
//! taking it through the arena joins that stream after the arena's moves and
//! records the block as used there.

use std::marker::PhantomData;
use std::sync::Arc;

use bytemuck::Pod;
use cudarc::driver::{
    sys, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, LaunchArgs, PushKernelArg, SyncOnDrop,
};

use super::CudaBackend;
use crate::backend::check_range;
use crate::error::{Error, Result};
use crate::stream::StreamId;

/// A read-only view of `len` elements of `T` in the region, for work on
/// [`stream`](ArenaView::stream). It borrows the arena, so no compaction,
/// free or spill can happen while it lives: the bytes stay where it points.
///
/// Pass `&view` to cudarc's launch builder, or use it wherever cudarc,
/// cuBLAS or NCCL take a [`DevicePtr`]. It records and waits for no cudarc
/// events; take views through the arena (`Arena::kernel_args`), which
/// orders their stream with the arena's, and use them on the stream they
/// are for. Through [`DevicePtr`] on another stream (a cudarc copy, an
/// NCCL call) that stream first waits for the view's, and the host waits
/// for the use before the call returns: correct, but synchronous. A kernel
/// launched with the view on another stream is not ordered (the launch is
/// `unsafe`, and the launch builder does not tell the view its stream).
#[derive(Debug, Clone, Copy)]
pub struct ArenaView<'a, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: &'a Arc<CudaStream>,
    _elems: PhantomData<&'a [T]>,
}

/// A mutable view of `len` elements of `T` in the region, for work on
/// [`stream`](ArenaViewMut::stream); no other view of the same view set
/// overlaps it. Like [`ArenaView`], it borrows the arena and carries no
/// cudarc events.
///
/// Pass `&mut view` to cudarc's launch builder, or use it wherever cudarc,
/// cuBLAS or NCCL take a [`DevicePtrMut`] (`memcpy_htod` into it, a GEMM's
/// output, an all-reduce's buffer).
#[derive(Debug)]
pub struct ArenaViewMut<'a, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: &'a Arc<CudaStream>,
    _elems: PhantomData<&'a mut [T]>,
}

/// What both kinds of view answer alike.
macro_rules! view_accessors {
    ($view:ident) => {
        impl<'a, T> $view<'a, T> {
            /// Elements in the view.
            ///
            /// ```no_run
            /// use cuarena::{Arena, ArenaConfig, DType};
            ///
            /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
            /// let compute = arena.backend().context().new_stream().expect("stream");
            /// let s = arena.register_stream(compute)?;
            /// let x = arena.alloc_storage_dtype(DType::F32, 1024)?;
            /// let mut args = arena.kernel_args(s)?;
            /// let xv = args.input::<f32>(&x)?;
            /// assert_eq!(xv.len(), 1024);
            /// # Ok::<(), cuarena::Error>(())
            /// ```
            pub fn len(&self) -> usize {
                self.len
            }

            /// True for a view of no elements.
            ///
            /// ```no_run
            /// use cuarena::{Arena, ArenaConfig, DType};
            ///
            /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
            /// let compute = arena.backend().context().new_stream().expect("stream");
            /// let s = arena.register_stream(compute)?;
            /// let x = arena.alloc_storage_dtype(DType::F32, 1024)?;
            /// let mut args = arena.kernel_args(s)?;
            /// let xv = args.input::<f32>(&x)?;
            /// assert!(!xv.is_empty());
            /// # Ok::<(), cuarena::Error>(())
            /// ```
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// The stream the view is for.
            ///
            /// ```no_run
            /// use cuarena::{Arena, ArenaConfig, DType};
            ///
            /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
            /// let compute = arena.backend().context().new_stream().expect("stream");
            /// let s = arena.register_stream(compute)?;
            /// let x = arena.alloc_storage_dtype(DType::F32, 1024)?;
            /// let mut args = arena.kernel_args(s)?;
            /// let xv = args.input::<f32>(&x)?;
            /// assert!(std::sync::Arc::ptr_eq(xv.stream(), args.stream()));
            /// # Ok::<(), cuarena::Error>(())
            /// ```
            pub fn stream(&self) -> &'a Arc<CudaStream> {
                self.stream
            }
        }
    };
}
view_accessors!(ArenaView);
view_accessors!(ArenaViewMut);

impl<'a, T> ArenaView<'a, T> {
    /// Device address of the first element, as a **plain number**: right
    /// while this view lives (the view borrows the arena, so nothing moves),
    /// stale at the next compaction after it is dropped, and not known to
    /// the arena: work that uses it after the view is gone is not ordered
    /// with anything. Keep the view, or pin the block, while it is used.
    ///
    /// ```no_run
    /// use cuarena::{Arena, ArenaConfig, DType};
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let compute = arena.backend().context().new_stream().expect("stream");
    /// let s = arena.register_stream(compute)?;
    /// let x = arena.alloc_storage_dtype(DType::F32, 1024)?;
    /// let mut args = arena.kernel_args(s)?;
    /// let xv = args.input::<f32>(&x)?;
    /// let at = xv.device_address(); // right only while `xv` lives
    /// assert_ne!(at, 0);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn device_address(&self) -> u64 {
        self.ptr
    }
}

impl<'a, T> ArenaViewMut<'a, T> {
    /// The same bytes, read-only, for as long as this view is borrowed.
    ///
    /// ```no_run
    /// use cuarena::{Arena, ArenaConfig, DType};
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let compute = arena.backend().context().new_stream().expect("stream");
    /// let s = arena.register_stream(compute)?;
    /// let y = arena.alloc_storage_dtype(DType::F32, 1024)?;
    /// let mut args = arena.kernel_args(s)?;
    /// let yv = args.output::<f32>(&y)?;
    /// let read = yv.as_view();
    /// assert_eq!((read.len(), read.device_address()), (1024, yv.device_address()));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn as_view(&self) -> ArenaView<'_, T> {
        ArenaView {
            ptr: self.ptr,
            len: self.len,
            stream: self.stream,
            _elems: PhantomData,
        }
    }

    /// Device address of the first element, as a **plain number** (see
    /// [`ArenaView::device_address`]).
    ///
    /// ```no_run
    /// use cuarena::{Arena, ArenaConfig, DType};
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let compute = arena.backend().context().new_stream().expect("stream");
    /// let s = arena.register_stream(compute)?;
    /// let y = arena.alloc_storage_dtype(DType::F32, 1024)?;
    /// let mut args = arena.kernel_args(s)?;
    /// let yv = args.output::<f32>(&y)?;
    /// assert_ne!(yv.device_address(), 0);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn device_address(&self) -> u64 {
        self.ptr
    }
}

impl<T> DeviceSlice<T> for ArenaView<'_, T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl<T> DeviceSlice<T> for ArenaViewMut<'_, T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

/// What a use of a view on `used_on` needs. On the stream the view is for,
/// nothing: the arena ordered that stream (no events, no waits). On another
/// stream (cudarc's copies or NCCL given a view taken for a different
/// stream), `used_on` first waits for the view's stream, and the host waits
/// for `used_on` when cudarc drops the guard, before the view's borrow of
/// the arena can end: nothing is moved or reused under that use.
fn guard<'a>(view_stream: &CudaStream, used_on: &'a CudaStream) -> SyncOnDrop<'a> {
    if view_stream.cu_stream() == used_on.cu_stream() {
        return SyncOnDrop::Sync(None);
    }
    if used_on.join(view_stream).is_err() {
        // No event: order by waiting on the host instead.
        let _ = view_stream.synchronize();
    }
    SyncOnDrop::Sync(Some(used_on))
}

impl<T> DevicePtr<T> for ArenaView<'_, T> {
    /// The address; see [`ArenaView`] for what a use on another stream
    /// than the view's costs.
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, guard(self.stream, stream))
    }
}

impl<T> DevicePtr<T> for ArenaViewMut<'_, T> {
    /// The address (see [`ArenaView`] for other streams).
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, guard(self.stream, stream))
    }
}

impl<T> DevicePtrMut<T> for ArenaViewMut<'_, T> {
    /// The address (see [`ArenaView`] for other streams).
    fn device_ptr_mut<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, guard(self.stream, stream))
    }
}

// SAFETY: pushes a pointer to the view's device address (a `u64` that
// lives as long as the borrow, 'b: 'a), as cudarc pushes a `CudaView`'s;
// the kernel gets a `const T*` to `len` elements of `T` in the region.
unsafe impl<'a, 'b: 'a, 'c, T> PushKernelArg<&'b ArenaView<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b ArenaView<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as above, for a `T*` the kernel may write through: the view is
// borrowed mutably for as long as the launch builder lives.
unsafe impl<'a, 'b: 'a, 'c, T> PushKernelArg<&'b mut ArenaViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut ArenaViewMut<'c, T>) -> &mut Self {
        let ptr: &'b u64 = &arg.ptr;
        self.arg(ptr)
    }
}

// SAFETY: as for `ArenaView`: a read-only use of an output view.
unsafe impl<'a, 'b: 'a, 'c, T> PushKernelArg<&'b ArenaViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b ArenaViewMut<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

/// Makes the views of one kernel (or of any work on one stream): any number
/// of inputs and outputs, of any element types. An output that overlaps
/// another output or an input, or an input that overlaps an earlier output,
/// is [`Error::Overlap`]; inputs may overlap each other.
///
/// A view set borrows the backend (through [`CudaBackend::view_set`]) and
/// its views keep that borrow, so while any of them lives nothing can
/// write, move or free the region. The aliasing rule holds within one set;
/// several sets may live at once (threads launching together), and work
/// they give one block is ordered by the arena's use records, not checked
/// here. The arena's `kernel_args` wraps one and adds the ordering.
#[derive(Debug)]
pub struct ViewSet<'a> {
    backend: &'a CudaBackend,
    stream: &'a Arc<CudaStream>,
    stream_id: StreamId,
    /// Byte ranges of the views made so far.
    inputs: Vec<(u64, u64)>,
    outputs: Vec<(u64, u64)>,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// [`Error::Overlap`] of an earlier view's range `first` and `second`.
fn overlap(first: (u64, u64), second: (u64, u64)) -> Error {
    Error::Overlap {
        first_offset: first.0,
        first_bytes: first.1 - first.0,
        second_offset: second.0,
        second_bytes: second.1 - second.0,
    }
}

impl<'a> ViewSet<'a> {
    /// Makes the set's stream wait for the work enqueued so far on
    /// `earlier` (an event and a stream wait; nothing when they are one).
    pub fn wait_for(&self, earlier: StreamId) -> Result<()> {
        self.backend.stream_waits_for(self.stream_id, earlier)
    }

    /// The stream the views are for.
    pub fn stream(&self) -> &'a Arc<CudaStream> {
        self.stream
    }

    /// A read-only view of `len` elements of `T` at region offset `offset`.
    /// [`Error::OutOfBounds`] outside the region, [`Error::Misaligned`]
    /// at an address not aligned for `T`, [`Error::Overlap`] over an
    /// output of this set.
    pub fn input<T: Pod>(&mut self, offset: u64, len: usize) -> Result<ArenaView<'a, T>> {
        let r = self.backend.typed_bytes::<T>(offset, len)?;
        if let Some(&o) = self.outputs.iter().find(|&&o| overlaps(o, r)) {
            return Err(overlap(o, r));
        }
        self.inputs.push(r);
        Ok(ArenaView {
            ptr: self.backend.region_ptr + offset,
            len,
            stream: self.stream,
            _elems: PhantomData,
        })
    }

    /// A mutable view of `len` elements of `T` at region offset `offset`
    /// (same checks as [`input`](ViewSet::input)); [`Error::Overlap`]
    /// when it overlaps any view of the set.
    pub fn output<T: Pod>(&mut self, offset: u64, len: usize) -> Result<ArenaViewMut<'a, T>> {
        let r = self.backend.typed_bytes::<T>(offset, len)?;
        if let Some(&p) = self
            .outputs
            .iter()
            .chain(&self.inputs)
            .find(|&&p| overlaps(p, r))
        {
            return Err(overlap(p, r));
        }
        self.outputs.push(r);
        Ok(ArenaViewMut {
            ptr: self.backend.region_ptr + offset,
            len,
            stream: self.stream,
            _elems: PhantomData,
        })
    }
}

impl CudaBackend {
    /// Checks that `len` elements of `T` at region offset `offset` lie in
    /// the region at an address aligned for `T`; returns the byte range.
    fn typed_bytes<T>(&self, offset: u64, len: usize) -> Result<(u64, u64)> {
        let size = std::mem::size_of::<T>() as u64;
        let bytes = (len as u64).checked_mul(size).ok_or(Error::OutOfBounds {
            start_bytes: offset,
            end_bytes: u64::MAX,
            available_bytes: self.capacity_bytes,
        })?;
        check_range(offset, bytes, self.capacity_bytes)?;
        let align = std::mem::align_of::<T>() as u64;
        if (self.region_ptr + offset) % align != 0 {
            return Err(Error::Misaligned {
                offset_bytes: offset,
                len_bytes: bytes,
                elem_type: std::any::type_name::<T>(),
                elem_bytes: align,
            });
        }
        Ok((offset, offset + bytes))
    }

    /// A set of views for work on registered stream `stream` (see
    /// [`ViewSet`]). Orders nothing by itself: make `stream` wait for the
    /// arena stream first (the arena's `kernel_args` does).
    pub(crate) fn view_set(&self, stream_id: StreamId) -> Result<ViewSet<'_>> {
        Ok(ViewSet {
            backend: self,
            stream: &self.registered(stream_id)?.stream,
            stream_id,
            inputs: Vec::new(),
            outputs: Vec::new(),
        })
    }
}
