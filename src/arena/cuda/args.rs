//! Kernel arguments for a registered stream: typed views of any number of
//! ranges (blocks, storages, slices of them), of any element types, made
//! after the stream was ordered behind the arena's moves and recorded as
//! uses, so nothing moves or is reused under the work they are passed to.

use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::CudaStream;

use super::super::bytes::{check_block_range, Checked};
use super::super::Block;
use crate::backend::cuda::{ArenaView, ArenaViewMut, ViewSet};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::handle::BlockKey;
use crate::slots::Slots;
use crate::storage::AsRange;
use crate::stream::StreamId;

/// The views of one piece of work on one registered stream, from
/// [`Arena::kernel_args`](crate::Arena::kernel_args). Each [`input`](KernelArgs::input) and
/// [`output`](KernelArgs::output) checks its range (alive, this arena's,
/// in bounds, element type, alignment), refuses outputs that alias
/// ([`Error::Overlap`]), records the block as used on the stream and
/// returns a view that borrows the arena: no compaction, allocation, free
/// or spill can happen until every view is dropped. Taken from `&Arena`,
/// so threads sharing an arena take theirs at once under its shared lock.
///
/// ```no_run
/// # use cuarena::{Arena, ArenaConfig, DType};
/// # use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
/// # fn kernel() -> CudaFunction { unimplemented!() }
/// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
/// let compute = arena.backend().stream().context().new_stream().expect("stream");
/// let s = arena.register_stream(compute.clone())?;
/// let x = arena.alloc_storage_dtype(DType::F32, 1024)?;
/// let idx = arena.alloc_storage_dtype(DType::I64, 64)?;
/// let y = arena.alloc_storage_dtype(DType::F32, 64)?;
/// let gather: CudaFunction = kernel(); // gather(float* y, const float* x, const long long* idx, int n)
/// {
///     let mut args = arena.kernel_args(s)?;
///     let xv = args.input::<f32>(&x)?;
///     let iv = args.input::<i64>(&idx)?;
///     let mut yv = args.output::<f32>(&y)?;
///     let n = 64i32;
///     let mut b = compute.launch_builder(&gather);
///     b.arg(&mut yv).arg(&xv).arg(&iv).arg(&n);
///     // SAFETY: gather reads n indices, n floats of x at them, writes n of y.
///     unsafe { b.launch(LaunchConfig::for_num_elems(64)) }.expect("launch");
/// }
/// arena.compact()?; // waits (on the device) for the gather before moving x, idx or y
/// # Ok::<(), cuarena::Error>(())
/// ```
#[derive(Debug)]
pub struct KernelArgs<'a> {
    set: ViewSet<'a>,
    blocks: &'a Slots<Block>,
    arena_id: u64,
    clock: &'a AtomicU64,
    stream: StreamId,
    /// Streams this stream was made to wait for already, by these arguments.
    waited: smallvec::SmallVec<[StreamId; 4]>,
}

impl<'a> KernelArgs<'a> {
    /// Arguments over `set`, `stream` having waited for the arena stream
    /// (`Arena::kernel_args` makes them).
    pub(in crate::arena) fn new(
        set: ViewSet<'a>,
        blocks: &'a Slots<Block>,
        arena_id: u64,
        clock: &'a AtomicU64,
        stream: StreamId,
    ) -> Self {
        Self {
            set,
            blocks,
            arena_id,
            clock,
            stream,
            waited: smallvec::SmallVec::new(),
        }
    }

    /// The stream the views are for (the one to launch on).
    ///
    /// ```no_run
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// # use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
    /// # fn kernel() -> CudaFunction { unimplemented!() }
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let compute = arena.backend().context().new_stream().expect("stream");
    /// let s = arena.register_stream(compute)?;
    /// let y = arena.alloc_storage_dtype(DType::F32, 1024)?;
    /// let fill: CudaFunction = kernel(); // fill(float* y, float v, int n)
    /// let mut args = arena.kernel_args(s)?;
    /// let mut yv = args.output::<f32>(&y)?;
    /// let mut b = args.stream().launch_builder(&fill); // the stream `s`
    /// b.arg(&mut yv).arg(&1.0f32).arg(&1024i32);
    /// // SAFETY: fill writes n floats of y.
    /// unsafe { b.launch(LaunchConfig::for_num_elems(1024)) }.expect("launch");
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn stream(&self) -> &'a std::sync::Arc<CudaStream> {
        self.set.stream()
    }

    /// Its id.
    ///
    /// ```no_run
    /// use cuarena::{Arena, ArenaConfig, DType};
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let compute = arena.backend().context().new_stream().expect("stream");
    /// let s = arena.register_stream(compute)?;
    /// let args = arena.kernel_args(s)?;
    /// assert_eq!(args.stream_id(), s);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn stream_id(&self) -> StreamId {
        self.stream
    }

    /// Checks `r` as `T`s; returns its block, region offset and element
    /// count (`None` block for an empty storage). Changes nothing.
    fn resolve<T: Element>(&self, r: impl AsRange) -> Result<(Option<BlockKey>, u64, usize)> {
        let range = r.block_range();
        let Some(c) = check_block_range(self.blocks, self.arena_id, &range, Some(T::DTYPE))? else {
            return Ok((None, 0, 0)); // an empty storage: a view of nothing
        };
        let Checked {
            handle,
            offset,
            len,
            ..
        } = c;
        let b = self.blocks.get(handle.key).ok_or(Error::StaleHandle)?;
        // Where the bytes are (a deferred move leaves them above the
        // placement; see `crate::plan::lag`).
        let Some(at) = b.real_offset() else {
            return Err(Error::NotResident);
        };
        let n = len / T::DTYPE.size_bytes();
        let n = usize::try_from(n).map_err(|_| Error::LimitReached {
            what: "elements of one view (usize)",
            requested: n,
            limit: usize::MAX as u64,
        })?;
        Ok((Some(handle.key), at + offset, n))
    }

    /// Records a view of block `key` on the stream, and orders the stream
    /// after other streams' kernel arguments on it: a read waits for the
    /// last writer, a write for the last writer and the readers since (a
    /// collective on the communication stream, an upload on a copy stream).
    /// The block's records are locked for the call: arguments taken on
    /// other threads at the same time see each other's uses.
    fn record(&mut self, key: Option<BlockKey>, write: bool) -> Result<()> {
        let Some(key) = key else { return Ok(()) };
        let s = self.stream;
        let b = self.blocks.get(key).ok_or(Error::StaleHandle)?;
        let (set, waited) = (&self.set, &mut self.waited);
        b.with_streams(|records| {
            // The waits first: if one fails, the block's records are unchanged.
            let mut after: smallvec::SmallVec<[StreamId; 4]> = smallvec::SmallVec::new();
            if let Some(u) = records.as_deref() {
                after.extend(u.writer.filter(|&w| w != s));
                if write {
                    after.extend(u.readers.iter().copied().filter(|&r| r != s));
                }
            }
            for w in after {
                if !waited.contains(&w) {
                    set.wait_for(w)?;
                    waited.push(w);
                }
            }
            let u = records.get_or_insert_with(Default::default);
            if s != StreamId::ARENA && !u.uses.contains(&s) {
                u.uses.push(s);
            }
            if write {
                u.writer = Some(s);
                u.readers.clear();
            } else if !u.readers.contains(&s) {
                u.readers.push(s);
            }
            Ok::<(), Error>(())
        })?;
        b.last_use.store(
            self.clock.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// A read-only view of the bytes `r` names (a block, a storage, a slice
    /// of one) as `T`s. [`Error::TypeMismatch`] unless `T` is the range's
    /// dtype (or it is untyped; reinterpret a range with `as_dtype`),
    /// [`Error::Misaligned`] unless it is whole `T`s at an offset aligned
    /// to `T`'s size,
    /// [`Error::Overlap`] over an earlier output,
    /// [`Error::NotResident`] for a spilled block (call
    /// [`Arena::make_resident`](crate::Arena::make_resident) before taking the arguments). An empty
    /// storage gives a view of no elements.
    ///
    /// ```no_run
    /// use cuarena::{Arena, ArenaConfig, DType};
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let compute = arena.backend().context().new_stream().expect("stream");
    /// let s = arena.register_stream(compute)?;
    /// let x = arena.alloc_storage_dtype(DType::F32, 1024)?;
    /// let mut args = arena.kernel_args(s)?;
    /// let whole = args.input::<f32>(&x)?;
    /// let half = args.input::<f32>(x.slice(0..512)?)?; // inputs may overlap
    /// assert!(args.input::<u32>(&x).is_err()); // x holds f32
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn input<T: Element>(&mut self, r: impl AsRange) -> Result<ArenaView<'a, T>> {
        let (key, at, n) = self.resolve::<T>(r)?;
        let view = self.set.input::<T>(at, n)?;
        self.record(key, false)?;
        Ok(view)
    }

    /// A mutable view of the bytes `r` names as `T`s (the checks of
    /// [`input`](KernelArgs::input)); [`Error::Overlap`] when it
    /// overlaps any view taken before from these arguments.
    ///
    /// ```no_run
    /// use cuarena::{Arena, ArenaConfig, DType};
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let compute = arena.backend().context().new_stream().expect("stream");
    /// let s = arena.register_stream(compute)?;
    /// let x = arena.alloc_storage_dtype(DType::F32, 1024)?;
    /// let mut args = arena.kernel_args(s)?;
    /// let low = args.output::<f32>(x.slice(0..512)?)?;
    /// let high = args.output::<f32>(x.slice(512..1024)?)?; // disjoint: both writable
    /// assert!(args.output::<f32>(x.slice(256..768)?).is_err()); // Error::Overlap
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn output<T: Element>(&mut self, r: impl AsRange) -> Result<ArenaViewMut<'a, T>> {
        let (key, at, n) = self.resolve::<T>(r)?;
        let view = self.set.output::<T>(at, n)?;
        self.record(key, true)?;
        Ok(view)
    }
}
