//! CUDA-only methods of [`Arena`]: construction, typed views usable as
//! kernel arguments, pinned pointers, stream joins and typed transfers.
//! They live on the arena side: the backend knows byte ranges of its
//! region, never handles or blocks.

pub(crate) mod args;
pub mod graph;

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::arena::Arena;
use crate::backend::cuda::{
    ArenaView, ArenaViewMut, CudaBackend, CudaCapacity, CudaOptions, IoViews,
};
use crate::config::ArenaConfig;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::handle::Handle;
use crate::stream::StreamId;

/// # Streams
///
/// Every transfer, compaction, spill and table update of the arena runs on
/// the *arena stream* ([`Arena::stream`]) in order, without blocking the
/// host (reads excepted). Other streams are registered
/// ([`register_stream`](Arena::register_stream)) and named by a
/// [`StreamId`]; the contract of [`StreamId`](crate::StreamId) holds with events and
/// stream waits only:
///
/// - **Kernel arguments order themselves.** [`kernel_args`](Arena::kernel_args)
///   for a stream makes it wait for the arena's moves and writes so far, and
///   records every block it views as used there: before the arena frees,
///   moves, spills or writes such a block, the arena stream waits for that
///   stream's work (on the device).
/// - **Raw addresses are not tracked.** [`pinned_ptr`](Arena::pinned_ptr)
///   and [`ArenaViewMut::device_address`] are plain numbers: work that uses
///   them on another stream must be recorded by hand
///   ([`record_stream`](Arena::record_stream)) and must start after
///   [`wait_on_arena`](Arena::wait_on_arena) for that stream.
/// - **Kernels on the arena stream need nothing**: the stream orders them
///   with every move ([`view`](Arena::view), [`view_mut`](Arena::view_mut),
///   [`views_io`](Arena::views_io) are for it).
/// - Views borrow the arena, so nothing can move while they live; a pinned
///   block's pointer is valid until its last `unpin`. Kernel arguments take
///   `&self`: threads sharing a [`SharedArena`](crate::SharedArena) take
///   theirs and launch under its shared lock at once, while compaction and
///   spilling wait for the exclusive one.
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

    /// Registers `stream` with the arena and returns its id (a stream
    /// registered already keeps its id). The stream must belong to the
    /// arena's CUDA context, the device's primary context (what
    /// `arena.stream().context().new_stream()` gives, or a stream of
    /// [`CudaContext::new`](cudarc::driver::CudaContext::new) for the same
    /// device): another context's stream is [`Error::ForeignStream`].
    pub fn register_stream(&mut self, stream: Arc<CudaStream>) -> Result<StreamId> {
        self.check_usable()?;
        let id = self.backend_mut().register_stream(stream)?;
        self.note_stream(id);
        Ok(id.of_arena(self.id()))
    }

    /// The stream registered as `id` ([`StreamId::ARENA`]: the arena
    /// stream), `None` for an id this arena never gave out.
    pub fn stream_of(&self, id: StreamId) -> Option<&Arc<CudaStream>> {
        self.check_own_stream(id).ok()?;
        self.backend().stream_of(id)
    }

    /// A read-only view of block `h` as `T`s, for work on the arena stream:
    /// the arena stream first waits for the block's last writer on another
    /// stream, and the read is recorded (a later write on another stream
    /// waits for it).
    ///
    /// Fails with [`Error::TypeMismatch`] for a block allocated for another
    /// dtype, [`Error::MisalignedView`] for one placed below `T`'s
    /// alignment, [`Error::NotWholeElements`], or [`Error::NotResident`]
    /// for a spilled block (call [`make_resident`](Arena::make_resident)
    /// first). For other streams, take [`kernel_args`](Arena::kernel_args).
    pub fn view<T: Element>(&self, h: Handle) -> Result<ArenaView<'_, T>> {
        self.kernel_args(StreamId::ARENA)?.input::<T>(&h)
    }

    /// A mutable view of block `h` as `T`s, for work on the arena stream
    /// (same checks as [`view`](Arena::view)). Takes `&mut self`, so the
    /// view is the only one of the arena while it lives.
    pub fn view_mut<T: Element>(&mut self, h: Handle) -> Result<ArenaViewMut<'_, T>> {
        self.kernel_args(StreamId::ARENA)?.output::<T>(&h)
    }

    /// Mutable views of `N` distinct blocks at once, for the arena stream
    /// (a kernel with several outputs). A handle given twice is rejected
    /// with [`Error::AliasedViews`].
    pub fn views_mut<T: Element, const N: usize>(
        &mut self,
        handles: [Handle; N],
    ) -> Result<[ArenaViewMut<'_, T>; N]> {
        let (_, outputs) = self.views_io::<T, T, 0, N>([], handles)?;
        Ok(outputs)
    }

    /// Views for a kernel on the arena stream that reads `inputs` (as `I`)
    /// and writes `outputs` (as `O`): the outputs must be distinct from
    /// each other and from the inputs ([`Error::AliasedViews`] otherwise);
    /// inputs may repeat. For other streams, or element types that differ
    /// between arguments, take [`kernel_args`](Arena::kernel_args).
    pub fn views_io<I: Element, O: Element, const M: usize, const N: usize>(
        &mut self,
        inputs: [Handle; M],
        outputs: [Handle; N],
    ) -> Result<IoViews<'_, I, O, M, N>> {
        let mut args = self.kernel_args(StreamId::ARENA)?;
        let mut ins = Vec::with_capacity(M);
        for h in &inputs {
            ins.push(args.input::<I>(h)?);
        }
        let mut outs = Vec::with_capacity(N);
        for h in &outputs {
            outs.push(args.output::<O>(h)?);
        }
        // Both lengths are right by construction.
        let ins: [ArenaView<'_, I>; M] = ins
            .try_into()
            .map_err(|_| Error::AliasedViews { output: 0 })?;
        let outs: [ArenaViewMut<'_, O>; N] = outs
            .try_into()
            .map_err(|_| Error::AliasedViews { output: 0 })?;
        Ok((ins, outs))
    }

    /// Device address of a pinned block, valid until its last
    /// [`unpin`](Arena::unpin). [`Error::NotPinned`] for an unpinned block.
    /// A plain number: work that uses it on another stream must be
    /// recorded with [`record_stream`](Arena::record_stream) before the
    /// unpin, and start after [`wait_on_arena`](Arena::wait_on_arena).
    pub fn pinned_ptr(&self, h: Handle) -> Result<u64> {
        let info = self.info(h)?;
        if info.pins == 0 {
            return Err(Error::NotPinned);
        }
        Ok(self.backend().region_ptr() + self.resolve(h)?)
    }

    /// Copies `data` into block `h`; `data` must be exactly the block's size
    /// and of its element type (see [`Arena::write`]).
    pub fn upload<T: Element>(&mut self, h: Handle, data: &[T]) -> Result<()> {
        self.write(h, data)
    }

    /// Copies block `h` to the host as `T`s (see [`Arena::read`]); waits
    /// for the arena stream.
    pub fn download<T: Element>(&mut self, h: Handle) -> Result<Vec<T>> {
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
    /// A fault poisons the arena (every later call returns
    /// [`Error::Poisoned`]).
    pub fn synchronize(&mut self) -> Result<()> {
        self.check_usable()?;
        let r = self.backend_mut().synchronize();
        self.sticky(r)
    }
}
