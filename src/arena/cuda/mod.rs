//! CUDA-only methods of [`Arena`]: construction, typed views usable as
//! kernel arguments, pinned pointers, stream joins and typed transfers.
//! They live on the arena side: the backend knows byte ranges of its
//! region, never handles or blocks.

pub mod graph;

use std::sync::Arc;

use bytemuck::Pod;
use cudarc::driver::{CudaStream, CudaView};

use crate::arena::Arena;
use crate::backend::cuda::{
    driver_err, ArenaViewMut, CudaBackend, CudaCapacity, CudaOptions, IoViews,
};
use crate::config::ArenaConfig;
use crate::error::{Error, Result};
use crate::handle::{ElemType, Handle};

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
        // Alignment and bounds are the backend's checks, when it makes the view.
        let offset = self.resolve(h)?;
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
        self.backend().view::<T>(offset, len)
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
        let mut in_ranges = [(0u64, 0usize); M];
        for (r, &h) in in_ranges.iter_mut().zip(inputs.iter()) {
            *r = self.typed_range::<I>(h)?;
        }
        let mut out_ranges = [(0u64, 0usize); N];
        for (r, &h) in out_ranges.iter_mut().zip(outputs.iter()) {
            *r = self.typed_range::<O>(h)?;
        }
        self.backend_mut().views_io(in_ranges, out_ranges)
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
