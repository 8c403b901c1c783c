//! Stream tracking: streams registered with the arena, which streams used
//! a block, the waits that keep the arena from moving or reusing bytes
//! under them, and (CUDA) kernel arguments, which order themselves. The
//! contract is on [`StreamId`].

use super::Arena;
use crate::backend::{check_stream, Backend};
use crate::error::{Error, Result};
use crate::storage::AsRange;
use crate::stream::StreamId;

impl<B: Backend> Arena<B> {
    /// Registers a stream with the arena and returns its id (a stream
    /// registered already keeps its id): a CUDA stream on the CUDA backend,
    /// which must belong to the arena's context (the device's primary
    /// context: `arena.backend().stream().context().new_stream()`, or a
    /// stream of `CudaContext::new` for the same device; another context's
    /// stream is [`BackendError::ForeignStream`](crate::BackendError::ForeignStream)); `()` on the host and metadata
    /// backends, whose work is synchronous and whose streams are ids only,
    /// so that programs recording uses and waiting on streams run the same
    /// there. At most 65,536 streams per arena, its own included
    /// ([`Error::LimitReached`]).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.register_stream(())?; // the host backend's streams are ids
    /// assert_ne!(s, cuarena::StreamId::ARENA); // id 0 is the arena's own
    /// let h = arena.alloc(256)?;
    /// arena.record_stream(h, s)?;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn register_stream(&mut self, stream: B::Stream) -> Result<StreamId> {
        self.check_usable()?;
        let id = self.core.backend.register_stream(stream)?;
        self.note_stream(id);
        Ok(id.of_arena(self.core.id))
    }

    /// Makes room in the per-stream tables for registered stream `id`
    /// (its index is below [`crate::stream::MAX_STREAMS`]: the backends
    /// refuse more).
    fn note_stream(&mut self, id: StreamId) {
        let i = id.index() as usize;
        // Blocks may get stream uses from now on.
        self.core.order.registered(i);
    }

    /// Waits for the arena stream (on the CUDA backend; a no-op on the
    /// others) and reports any fault the move kernels found since the last
    /// check. A fault poisons the arena: every later call returns
    /// [`Error::Poisoned`].
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let h = arena.alloc(256)?;
    /// arena.fill(h, 1u8)?;
    /// arena.synchronize()?; // the arena stream's work is done (a no-op here)
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn synchronize(&mut self) -> Result<()> {
        self.check_usable()?;
        let r = self.core.backend.synchronize();
        self.sticky(r)
    }

    /// Records that the bytes `r` names are used by work enqueued on
    /// `stream` (PyTorch's `record_stream`): the arena will not free, move,
    /// spill or write the block before that work is done, waiting with
    /// stream waits, never on the host. Record after enqueueing the work or
    /// before; the wait covers whatever `stream` holds when it happens.
    /// Kernel arguments taken for a stream record it themselves.
    ///
    /// Takes `&self` (the records have a lock of their own): threads
    /// sharing the arena record under its shared lock.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let side = arena.register_stream(())?;
    /// let x = arena.alloc_storage(4096)?;
    /// // ... work on `side` uses x ...
    /// arena.record_stream(&x, side)?;
    /// drop(x); // freed after that work, without a host wait
    /// arena.reclaim()?;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn record_stream(&self, r: impl AsRange, stream: StreamId) -> Result<()> {
        self.check_usable()?;
        self.check_own_stream(stream)?;
        let Some(h) = r.block_range().handle else {
            return Ok(()); // an empty storage uses nothing
        };
        let b = self.block(h)?;
        if stream != StreamId::ARENA {
            b.with_streams(|s| {
                let u = s.get_or_insert_with(Default::default);
                if !u.uses.contains(&stream) {
                    u.uses.push(stream);
                }
            });
        }
        Ok(())
    }

    /// Checks that `stream` is registered with this arena (not another's).
    pub(crate) fn check_own_stream(&self, stream: StreamId) -> Result<()> {
        if stream.1 != 0 && stream.1 != self.core.id {
            return Err(Error::Foreign {
                kind: "stream",
                owner: stream.1,
                arena: self.core.id,
            });
        }
        check_stream(stream, self.core.backend.stream_count())
    }

    /// Makes later work on `stream` wait for the arena stream's work it has
    /// not waited for yet (moves, writes, fills, copies, frees): call it
    /// before enqueueing work that uses arena bytes on `stream` (kernel
    /// arguments taken for a stream do). An event record and a stream wait
    /// when there is such work, nothing otherwise; the host never waits.
    ///
    /// Takes `&self`: several threads sharing the arena join their streams
    /// at once (a stream joined twice waits twice, which is harmless).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let side = arena.register_stream(())?;
    /// let x = arena.alloc(4096)?;
    /// arena.fill(x, 0u8)?; // on the arena stream
    /// arena.wait_on_arena(side)?; // work enqueued on `side` now runs after the fill
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn wait_on_arena(&self, stream: StreamId) -> Result<()> {
        self.check_usable()?;
        self.check_own_stream(stream)?;
        if stream == StreamId::ARENA {
            return Ok(());
        }
        // Registration sized the table; a missing entry is an unknown stream.
        let i = stream.0 as usize;
        let behind = self.core.order.behind(i).ok_or(Error::UnknownStream {
            stream: stream.0,
            registered: self.core.backend.stream_count(),
        })?;
        // `epoch` changes only under `&mut self`, so it is stable here.
        if behind {
            self.core.backend.join_arena(stream)?;
            self.core.order.joined_now(i);
        }
        Ok(())
    }
}

#[cfg(feature = "cuda")]
impl Arena<crate::backend::cuda::CudaBackend> {
    /// Kernel arguments for work on registered stream `stream` (see
    /// [`KernelArgs`](crate::KernelArgs); for work on the
    /// arena stream, [`StreamId::ARENA`], which the arena's moves order by
    /// themselves): first makes `stream` wait for the arena stream's
    /// work it has not waited for (moves, writes, fills, table updates), so
    /// the views point where the blocks are when the work runs; each view
    /// then records its block as used on `stream`, so the arena stream
    /// waits for that work before it moves, spills, writes or frees the
    /// block. A fault the device reported poisons the arena here too.
    ///
    /// Takes `&self`: the arguments borrow the arena, so nothing moves
    /// while they live, and the use records have locks of their own, so
    /// several threads sharing the arena take arguments and launch at once
    /// ([`SharedArena::with_kernel_args`](crate::SharedArena::with_kernel_args)).
    /// The aliasing check covers the views of one `KernelArgs`; two sets
    /// that write one block at once are ordered only as far as the work
    /// already enqueued when each was taken, as two kernels on unordered
    /// streams would be.
    ///
    /// ```no_run
    /// use cuarena::{Arena, ArenaConfig, DType, StreamId};
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let x = arena.alloc_storage_dtype(DType::F32, 1024)?;
    /// let y = arena.alloc_storage_dtype(DType::F32, 1024)?;
    /// let mut args = arena.kernel_args(StreamId::ARENA)?;
    /// let (input, output) = (args.input::<f32>(&x)?, args.output::<f32>(&y)?);
    /// // launch a kernel on `args.stream()` with `input` and `output`
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn kernel_args(&self, stream: StreamId) -> Result<super::cuda::args::KernelArgs<'_>> {
        self.check_usable()?;
        let r = self.core.backend.check_status(false);
        self.sticky(r)?;
        self.wait_on_arena(stream)?;
        Ok(super::cuda::args::KernelArgs::new(
            self.core.backend.view_set(stream)?,
            &self.core.blocks,
            self.core.id,
            &self.core.clock,
            stream,
        ))
    }
}
