//! Your own kernels with handle arguments, and CUDA graphs that keep working
//! across compactions.
//!
//! A kernel that takes raw addresses (views, a pinned block's address) is right
//! only until the next compaction moves its blocks, and a CUDA graph bakes
//! its kernels' arguments in at capture. A kernel that takes **handles**
//! instead, and resolves them on the device through the arena's handle
//! table (the header `cuarena.cuh`), finds every block wherever it is at that
//! point of the arena stream: every compaction enqueues the table's new
//! offsets on the arena stream right after its moves, so a graph captured
//! once can be replayed before and after any number of compactions.
//!
//! # The pieces
//!
//! - [`compile`](crate::backend::cuda::compile): NVRTC for your kernels,
//!   which `#include "cuarena.cuh"` by name
//!   ([`CUARENA_CUH`](crate::backend::cuda::CUARENA_CUH) is its text) for
//!   `CuarenaTable` and the resolves `cuarena_at` / `cuarena_at_checked`.
//! - [`HandleArgs`] ([`handle_args`]): the region's base, the table's address and its slot
//!   count, passed by value as one `CuarenaTable` kernel argument.
//! - [`DeviceHandle`]: a handle as the `u64` a kernel takes
//!   ([`Handle::to_bits`]).
//! - [`launch_args`] then [`PreparedLaunch::launch`]: launch a kernel of the
//!   form `kernel(CuarenaTable t, u64 h0, .., u64 hN-1, P params)`.
//! - [`ArenaGraph`]: captures kernels launched on the arena stream into a
//!   CUDA graph, and replays it with [`ArenaGraph::launch`], which first
//!   brings the graph's handles back to the device (if spilled), sends the
//!   table's pending changes, and refuses to run if the table's device
//!   buffer has moved since the capture.
//!
//! # The table's address
//!
//! A graph bakes in the table's device address. The backend's table grows
//! (to a new buffer; the old one is freed) when a handle's slot index
//! exceeds what it holds, which happens when more blocks are live at once
//! than ever before. So: [`reserve_handle_table`] for the most blocks the
//! program will have live at once (plus spilled) *before* capturing;
//! [`ArenaGraph::capture`] reserves at least [`DEFAULT_RESERVED_SLOTS`]
//! (1 MiB of table) and twice the current table. A replay after the table
//! moved anyway returns [`Error::TableMoved`] saying so, instead of
//! running on freed memory; capture again then.
//!
//! # Performance
//!
//! What resolving handles on the device costs over raw pointers (in
//! c = a + b over three 1 GiB tensors), and what each compaction's copy of
//! the changed table slots after its moves adds: `benches/handles.rs`,
//! measured in `BENCHMARKS.md#handle-table-on-the-device`.
//!
//! # Example
//!
//! ```no_run
//! use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
//! use cuarena::graph::ArenaGraph;
//! use cuarena::{Arena, ArenaConfig, DType};
//! # fn kernel() -> CudaFunction { unimplemented!() }
//!
//! let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
//! let (x, y) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
//! // extern "C" __global__ void double_it(CuarenaTable t, u64 out, u64 in, u32 n)
//! let double_it: CudaFunction = kernel();
//! let cfg = LaunchConfig::for_num_elems(1024);
//! let graph = ArenaGraph::capture(&mut arena, |cap| {
//!     // SAFETY: double_it reads n floats of `in` and writes n of `out`.
//!     unsafe { cap.prepare([y, x])?.launch(&double_it, cfg, &1024u32) }
//! })?;
//! graph.launch(&mut arena)?; // y = 2x
//! arena.compact()?; // may move x and y
//! graph.launch(&mut arena)?; // still y = 2x, wherever they are now
//! # Ok::<(), cuarena::Error>(())
//! ```

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};

use crate::arena::Arena;
pub use crate::backend::cuda::launch::{
    launch_with_handles, DeviceHandle, HandleArgs, PreparedLaunch,
};
use crate::backend::cuda::{driver_err, CudaBackend};
use crate::backend::Backend as _;
use crate::error::{BackendError, Error, Result};
use crate::handle::Handle;
use crate::stream::StreamId;

/// Slots [`ArenaGraph::capture`] reserves in the device table at least
/// (65,536 slots, 1 MiB): enough for that many blocks live at once.
pub const DEFAULT_RESERVED_SLOTS: usize = 1 << 16;

/// The arena's table as it is now, flushed first so that every live,
/// resident handle resolves. Valid for kernels enqueued on the arena
/// stream until the table's device buffer next grows (see the
/// [module documentation](self)); compactions do not change it.
///
/// ```no_run
/// use cuarena::graph::{self, DeviceHandle};
/// use cuarena::{Arena, ArenaConfig, DType};
///
/// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
/// let x = arena.alloc_dtype(DType::F32, 1024)?;
/// let table = graph::handle_args(&mut arena)?; // a kernel's `CuarenaTable` argument
/// let x_arg = DeviceHandle::from(x); // its `u64`: `cuarena_at(table, x_arg)` on the device
/// assert!((x_arg.0 as u32) < table.slots); // x's slot is one the table holds
/// # Ok::<(), cuarena::Error>(())
/// ```
pub fn handle_args(arena: &mut Arena<CudaBackend>) -> Result<HandleArgs> {
    arena.flush_table()?;
    current_args(arena)
}

/// The table as the backend holds it now (no flush).
fn current_args(arena: &Arena<CudaBackend>) -> Result<HandleArgs> {
    let slots = arena.handle_table().len();
    Ok(HandleArgs {
        base: arena.backend().region_ptr(),
        table: arena.backend().table_ptr(),
        slots: u32::try_from(slots).map_err(|_| Error::LimitReached {
            what: "handle table slots a kernel can address",
            requested: slots as u64,
            limit: u64::from(u32::MAX),
        })?,
        pad: 0,
    })
}

/// Fails unless `h` is a live, resident block of `arena`.
fn check_resident(arena: &Arena<CudaBackend>, h: Handle) -> Result<DeviceHandle> {
    if !arena.info(h)?.resident {
        return Err(Error::NotResident);
    }
    Ok(DeviceHandle::from(h))
}

/// Slots the backend's device table holds now (0 before the first sync).
///
/// ```no_run
/// use cuarena::graph;
/// use cuarena::{Arena, ArenaConfig};
///
/// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
/// graph::reserve_handle_table(&mut arena, 4096)?;
/// assert!(graph::handle_table_capacity(&arena) >= 4096);
/// # Ok::<(), cuarena::Error>(())
/// ```
pub fn handle_table_capacity(arena: &Arena<CudaBackend>) -> usize {
    arena.backend().table_capacity_slots()
}

/// Grows the backend's device table to hold at least `slots` entries now,
/// so that it keeps its address (and captured graphs stay valid) until more
/// than `slots` handles' slots are in use: slots are reused, so that is the
/// most blocks live at once (spilled ones included), plus one. Returns the
/// table's address, flushed.
///
/// ```no_run
/// use cuarena::graph;
/// use cuarena::{Arena, ArenaConfig};
///
/// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
/// // Room for 100,000 blocks live at once, before capturing any graph.
/// let table = graph::reserve_handle_table(&mut arena, 100_000)?;
/// let _blocks = (0..1000).map(|_| arena.alloc(4096)).collect::<Result<Vec<_>, _>>()?;
/// assert_eq!(graph::handle_args(&mut arena)?.table, table); // it has not moved
/// # Ok::<(), cuarena::Error>(())
/// ```
pub fn reserve_handle_table(arena: &mut Arena<CudaBackend>, slots: usize) -> Result<u64> {
    arena.backend_mut().reserve_table(slots)?;
    arena.flush_table()?;
    Ok(arena.backend().table_ptr())
}

/// Prepares a launch of `func(table, handles.., *params)` on the arena
/// stream (see [`launch_with_handles`]) after making the handles resident
/// and flushing the table, so the kernel finds every block where it is at
/// that point of the stream, whatever compactions came before or come
/// after. Launch it with `unsafe { prepared.launch(&func, cfg, &params) }`
/// before the next call on the arena (the borrow enforces it).
///
/// ```no_run
/// use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
/// use cuarena::graph;
/// use cuarena::{Arena, ArenaConfig, DType};
/// # fn kernel() -> CudaFunction { unimplemented!() }
///
/// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
/// let (x, y) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
/// // extern "C" __global__ void double_it(CuarenaTable t, u64 out, u64 in, u32 n)
/// let double_it: CudaFunction = kernel();
/// let prepared = graph::launch_args(&mut arena, [y, x])?;
/// // SAFETY: double_it reads n floats of `in` and writes n of `out`.
/// unsafe { prepared.launch(&double_it, LaunchConfig::for_num_elems(1024), &1024u32)? };
/// # Ok::<(), cuarena::Error>(())
/// ```
pub fn launch_args<const N: usize>(
    arena: &mut Arena<CudaBackend>,
    handles: [Handle; N],
) -> Result<PreparedLaunch<'_, N>> {
    launch_args_on(arena, StreamId::ARENA, handles)
}

/// [`launch_args`] for a launch on registered stream `stream`: after the
/// handles are made resident and the table flushed, `stream` waits for the
/// arena stream's work so far (the table update included) and every handle
/// is recorded as used on `stream`, so no compaction moves, spills or frees
/// its block before the launch has run.
///
/// The kernel reads the device table while later compactions of other
/// blocks may rewrite it on the arena stream; the entries of the handles
/// recorded here keep their values until the arena stream has waited for
/// the launch, so what the kernel reads for them is right.
///
/// The blocks are recorded as used on `stream` (so the arena waits for the
/// kernel before moving or freeing them), but not as read or written by it:
/// unlike [`Arena::kernel_args`], this does not order `stream` after other
/// streams' kernel arguments that wrote the blocks. Order those yourself.
///
/// ```no_run
/// use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
/// use cuarena::graph;
/// use cuarena::{Arena, ArenaConfig, DType};
/// # fn kernel() -> CudaFunction { unimplemented!() }
///
/// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
/// let compute = arena.backend().context().new_stream().expect("stream");
/// let s = arena.register_stream(compute)?;
/// let (x, y) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
/// let double_it: CudaFunction = kernel(); // (CuarenaTable t, u64 out, u64 in, u32 n)
/// let prepared = graph::launch_args_on(&mut arena, s, [y, x])?;
/// // SAFETY: double_it reads n floats of `in` and writes n of `out`.
/// unsafe { prepared.launch(&double_it, LaunchConfig::for_num_elems(1024), &1024u32)? };
/// arena.compact()?; // waits (on the device) for the launch on `s` before moving x or y
/// # Ok::<(), cuarena::Error>(())
/// ```
pub fn launch_args_on<const N: usize>(
    arena: &mut Arena<CudaBackend>,
    stream: StreamId,
    handles: [Handle; N],
) -> Result<PreparedLaunch<'_, N>> {
    arena.check_own_stream(stream)?;
    arena.make_resident(&handles)?;
    let table = handle_args(arena)?;
    let mut bits = [DeviceHandle(0); N];
    for (b, &h) in bits.iter_mut().zip(handles.iter()) {
        *b = check_resident(arena, h)?;
    }
    for h in &handles {
        arena.record_stream(h, stream)?;
    }
    arena.wait_on_arena(stream)?;
    let arena: &Arena<CudaBackend> = arena;
    let s = arena
        .backend()
        .stream_of(stream)
        .ok_or(Error::UnknownStream {
            stream: stream.index(),
            registered: arena.backend().stream_count(),
        })?;
    Ok(PreparedLaunch::new(s, table, bits))
}

/// What the closure of [`ArenaGraph::capture`] enqueues work with, while the
/// arena stream is being captured. It borrows the arena, so nothing can
/// allocate, free, compact or transfer during the capture (which would be
/// captured too, or break it).
pub struct Capture<'a> {
    arena: &'a Arena<CudaBackend>,
    table: HandleArgs,
    handles: Vec<Handle>,
}

impl std::fmt::Debug for Capture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("table", &self.table)
            .field("handles", &self.handles)
            .finish_non_exhaustive()
    }
}

impl Capture<'_> {
    /// The arena stream, being captured: launch on it only work that is
    /// allowed in a stream capture (kernels, async copies between device
    /// buffers; no synchronisation, no allocation).
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
    /// use cuarena::graph::ArenaGraph;
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// # fn kernel() -> CudaFunction { unimplemented!() }
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let x = arena.alloc_dtype(DType::F32, 1024)?;
    /// let zero: CudaFunction = kernel(); // (CuarenaTable t, u64 x, u32 n)
    /// let g = ArenaGraph::capture(&mut arena, |cap| {
    ///     let (table, h) = (cap.table(), cap.handle(x)?);
    ///     let mut b = cap.stream().launch_builder(&zero);
    ///     b.arg(&table).arg(&h).arg(&1024u32);
    ///     // SAFETY: zero writes n floats of x.
    ///     unsafe { b.launch(LaunchConfig::for_num_elems(1024)) }.expect("launch");
    ///     Ok(())
    /// })?;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.arena.backend().stream()
    }

    /// The table argument kernels of this graph resolve through.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
    /// use cuarena::graph::{self, ArenaGraph};
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// # fn kernel() -> CudaFunction { unimplemented!() }
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let x = arena.alloc_dtype(DType::F32, 1024)?;
    /// let zero: CudaFunction = kernel(); // (CuarenaTable t, u64 x, u32 n)
    /// let cfg = LaunchConfig::for_num_elems(1024);
    /// let g = ArenaGraph::capture(&mut arena, |cap| {
    ///     let (table, h) = (cap.table(), cap.handle(x)?);
    ///     // SAFETY: zero writes n floats of x.
    ///     unsafe { graph::launch_with_handles(cap.stream(), &zero, cfg, &table, &[h], &1024u32) }
    /// })?;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn table(&self) -> HandleArgs {
        self.table
    }

    /// `h` as a kernel argument, recorded as used by the graph (so that
    /// [`ArenaGraph::launch`] checks it and brings it back if spilled).
    /// Fails for a stale, foreign or spilled handle.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
    /// use cuarena::graph::{self, ArenaGraph, DeviceHandle};
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// # fn kernel() -> CudaFunction { unimplemented!() }
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let x = arena.alloc_dtype(DType::F32, 1024)?;
    /// let zero: CudaFunction = kernel(); // (CuarenaTable t, u64 x, u32 n)
    /// let cfg = LaunchConfig::for_num_elems(1024);
    /// let g = ArenaGraph::capture(&mut arena, |cap| {
    ///     let h = cap.handle(x)?;
    ///     assert_eq!(h, DeviceHandle::from(x));
    ///     // SAFETY: zero writes n floats of x.
    ///     unsafe { graph::launch_with_handles(cap.stream(), &zero, cfg, &cap.table(), &[h], &1024u32) }
    /// })?;
    /// assert_eq!(g.handles(), [x]); // checked, and brought back if spilled, at each launch
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn handle(&mut self, h: Handle) -> Result<DeviceHandle> {
        let d = check_resident(self.arena, h)?;
        if !self.handles.contains(&h) {
            self.handles.push(h);
        }
        Ok(d)
    }

    /// Prepares a launch of `func(table, handles.., *params)` into the
    /// graph (see [`launch_with_handles`]), recording the handles. Launch
    /// it with `unsafe { prepared.launch(&func, cfg, &params) }`.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
    /// use cuarena::graph::ArenaGraph;
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// # fn kernel() -> CudaFunction { unimplemented!() }
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let a = arena.alloc_dtype(DType::F32, 1024)?;
    /// let (b, c) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
    /// let add: CudaFunction = kernel(); // (CuarenaTable t, u64 out, u64 x, u64 y, u32 n)
    /// let cfg = LaunchConfig::for_num_elems(1024);
    /// let g = ArenaGraph::capture(&mut arena, |cap| {
    ///     // SAFETY: add reads n floats of x and y and writes n of out.
    ///     unsafe {
    ///         cap.prepare([c, a, b])?.launch(&add, cfg, &1024u32)?; // c = a + b
    ///         cap.prepare([a, c, c])?.launch(&add, cfg, &1024u32) // a = 2c
    ///     }
    /// })?;
    /// assert_eq!(g.handles(), [c, a, b]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn prepare<const N: usize>(
        &mut self,
        handles: [Handle; N],
    ) -> Result<PreparedLaunch<'_, N>> {
        let mut bits = [DeviceHandle(0); N];
        for (b, &h) in bits.iter_mut().zip(handles.iter()) {
            *b = self.handle(h)?;
        }
        Ok(PreparedLaunch::new(
            self.arena.backend().stream(),
            self.table,
            bits,
        ))
    }
}

/// Ends a capture that did not end normally (an error or a panic in the
/// closure), so the arena stream is usable again.
struct CaptureGuard<'a> {
    stream: &'a Arc<CudaStream>,
    active: bool,
}

impl Drop for CaptureGuard<'_> {
    fn drop(&mut self) {
        if self.active {
            // Whatever was captured is dropped with the graph, if any.
            let _ = self.stream.end_capture(CUgraphInstantiate_flags(0));
        }
    }
}

/// A CUDA graph captured on the arena stream, replayed on it by
/// [`launch`](ArenaGraph::launch).
///
/// Kernels that resolve handles through [`Capture::table`] stay correct
/// across compactions; raw addresses captured into it do not (they keep
/// pointing where the blocks were). See the [module documentation](self).
pub struct ArenaGraph {
    graph: CudaGraph,
    arena_id: u64,
    region_ptr: u64,
    table: HandleArgs,
    reserved_slots: usize,
    handles: Vec<Handle>,
}

impl std::fmt::Debug for ArenaGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArenaGraph")
            .field("arena_id", &self.arena_id)
            .field("region_ptr", &self.region_ptr)
            .field("table", &self.table)
            .field("reserved_slots", &self.reserved_slots)
            .field("handles", &self.handles)
            .finish_non_exhaustive()
    }
}

impl ArenaGraph {
    /// Captures what `record` enqueues on the arena stream into a graph,
    /// after reserving the device table (at least
    /// [`DEFAULT_RESERVED_SLOTS`] and twice the current table; see
    /// [`capture_reserving`](ArenaGraph::capture_reserving)) and flushing it.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
    /// use cuarena::graph::ArenaGraph;
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// # fn kernel() -> CudaFunction { unimplemented!() }
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let (x, y) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
    /// let double_it: CudaFunction = kernel(); // (CuarenaTable t, u64 out, u64 in, u32 n)
    /// let cfg = LaunchConfig::for_num_elems(1024);
    /// let g = ArenaGraph::capture(&mut arena, |cap| {
    ///     // SAFETY: double_it reads n floats of `in` and writes n of `out`.
    ///     unsafe { cap.prepare([y, x])?.launch(&double_it, cfg, &1024u32) }
    /// })?;
    /// g.launch(&mut arena)?; // y = 2x
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn capture<F>(arena: &mut Arena<CudaBackend>, record: F) -> Result<Self>
    where
        F: FnOnce(&mut Capture<'_>) -> Result<()>,
    {
        let slots = arena
            .handle_table()
            .len()
            .saturating_mul(2)
            .max(DEFAULT_RESERVED_SLOTS);
        Self::capture_reserving(arena, slots, record)
    }

    /// [`capture`](ArenaGraph::capture) with the device table reserved for
    /// `slots` slots (0: as it is).
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
    /// use cuarena::graph::{self, ArenaGraph};
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// # fn kernel() -> CudaFunction { unimplemented!() }
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let (x, y) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
    /// let double_it: CudaFunction = kernel(); // (CuarenaTable t, u64 out, u64 in, u32 n)
    /// let cfg = LaunchConfig::for_num_elems(1024);
    /// // The program keeps up to a million blocks live: reserve for them.
    /// let g = ArenaGraph::capture_reserving(&mut arena, 1 << 20, |cap| {
    ///     // SAFETY: double_it reads n floats of `in` and writes n of `out`.
    ///     unsafe { cap.prepare([y, x])?.launch(&double_it, cfg, &1024u32) }
    /// })?;
    /// assert!(graph::handle_table_capacity(&arena) >= 1 << 20);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn capture_reserving<F>(
        arena: &mut Arena<CudaBackend>,
        slots: usize,
        record: F,
    ) -> Result<Self>
    where
        F: FnOnce(&mut Capture<'_>) -> Result<()>,
    {
        reserve_handle_table(arena, slots)?;
        let table = handle_args(arena)?;
        let arena: &Arena<CudaBackend> = arena;
        let stream = arena.backend().stream();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver_err("cuStreamBeginCapture"))?;
        let mut guard = CaptureGuard {
            stream,
            active: true,
        };
        let mut cap = Capture {
            arena,
            table,
            handles: Vec::new(),
        };
        let recorded = record(&mut cap);
        guard.active = false;
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        recorded?;
        let graph = ended
            .map_err(driver_err("cuStreamEndCapture / cuGraphInstantiate"))?
            .ok_or(Error::Backend(BackendError::EmptyCapture))?;
        Ok(Self {
            graph,
            arena_id: arena.id(),
            region_ptr: arena.backend().region_ptr(),
            table,
            reserved_slots: handle_table_capacity(arena),
            handles: cap.handles,
        })
    }

    /// Replays the graph on the arena stream, after bringing its handles
    /// back to the device (if spilled) and sending the table's pending
    /// changes. Fails, running nothing, when a handle of the graph was
    /// freed ([`Error::StaleHandle`]), for another arena's graph, and when
    /// the table's device buffer has moved since the capture
    /// ([`Error::TableMoved`]: reserve more with
    /// [`reserve_handle_table`] and capture again).
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
    /// use cuarena::graph::ArenaGraph;
    /// use cuarena::{Arena, ArenaConfig, DType, Error};
    /// # fn kernel() -> CudaFunction { unimplemented!() }
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let gap = arena.alloc(1 << 20)?;
    /// let (x, y) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
    /// let double_it: CudaFunction = kernel(); // (CuarenaTable t, u64 out, u64 in, u32 n)
    /// let cfg = LaunchConfig::for_num_elems(1024);
    /// let g = ArenaGraph::capture(&mut arena, |cap| {
    ///     // SAFETY: double_it reads n floats of `in` and writes n of `out`.
    ///     unsafe { cap.prepare([y, x])?.launch(&double_it, cfg, &1024u32) }
    /// })?;
    /// g.launch(&mut arena)?;
    /// arena.free(gap)?;
    /// arena.compact()?; // may move x and y down, into the gap
    /// match g.launch(&mut arena) {
    ///     Ok(()) => {} // y = 2x where they are now
    ///     Err(Error::TableMoved { .. }) => { /* capture again (and reserve more) */ }
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn launch(&self, arena: &mut Arena<CudaBackend>) -> Result<()> {
        if arena.id() != self.arena_id {
            return Err(Error::Foreign {
                kind: "handle",
                owner: self.arena_id,
                arena: arena.id(),
            });
        }
        arena.make_resident(&self.handles)?;
        arena.flush_table()?;
        let now = current_args(arena)?;
        if now.table != self.table.table || now.base != self.region_ptr {
            return Err(Error::TableMoved {
                reserved_slots: self.reserved_slots,
                slots_in_use: now.slots as usize,
            });
        }
        self.graph.launch().map_err(driver_err("cuGraphLaunch"))
    }

    /// Uploads the graph to the device ahead of its first launch.
    ///
    /// ```no_run
    /// # use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
    /// # use cuarena::graph::ArenaGraph;
    /// # use cuarena::{Arena, ArenaConfig, DType};
    /// # fn kernel() -> CudaFunction { unimplemented!() }
    /// # let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// # let (x, y) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
    /// # let double_it: CudaFunction = kernel(); // (CuarenaTable t, u64 out, u64 in, u32 n)
    /// # let cfg = LaunchConfig::for_num_elems(1024);
    /// # let g = ArenaGraph::capture(&mut arena, |cap| {
    /// #     // SAFETY: double_it reads n floats of `in` and writes n of `out`.
    /// #     unsafe { cap.prepare([y, x])?.launch(&double_it, cfg, &1024u32) }
    /// # })?;
    /// // `g` captured from `double_it(y, x)` (see `ArenaGraph::capture`)
    /// g.upload()?; // the first launch does not pay for it
    /// g.launch(&mut arena)?;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn upload(&self) -> Result<()> {
        self.graph.upload().map_err(driver_err("cuGraphUpload"))
    }

    /// The handles the graph's kernels were given through
    /// [`Capture::handle`] / [`Capture::prepare`].
    ///
    /// ```no_run
    /// # use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
    /// # use cuarena::graph::ArenaGraph;
    /// # use cuarena::{Arena, ArenaConfig, DType};
    /// # fn kernel() -> CudaFunction { unimplemented!() }
    /// # let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// # let (x, y) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
    /// # let double_it: CudaFunction = kernel(); // (CuarenaTable t, u64 out, u64 in, u32 n)
    /// # let cfg = LaunchConfig::for_num_elems(1024);
    /// # let g = ArenaGraph::capture(&mut arena, |cap| {
    /// #     // SAFETY: double_it reads n floats of `in` and writes n of `out`.
    /// #     unsafe { cap.prepare([y, x])?.launch(&double_it, cfg, &1024u32) }
    /// # })?;
    /// // `g` captured from `double_it(y, x)` (see `ArenaGraph::capture`)
    /// assert_eq!(g.handles(), [y, x]); // free one and later launches fail: `StaleHandle`
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }

    /// The table argument baked into the graph.
    ///
    /// ```no_run
    /// # use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
    /// # use cuarena::graph::ArenaGraph;
    /// # use cuarena::{Arena, ArenaConfig, DType};
    /// # fn kernel() -> CudaFunction { unimplemented!() }
    /// # let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// # let (x, y) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
    /// # let double_it: CudaFunction = kernel(); // (CuarenaTable t, u64 out, u64 in, u32 n)
    /// # let cfg = LaunchConfig::for_num_elems(1024);
    /// # let g = ArenaGraph::capture(&mut arena, |cap| {
    /// #     // SAFETY: double_it reads n floats of `in` and writes n of `out`.
    /// #     unsafe { cap.prepare([y, x])?.launch(&double_it, cfg, &1024u32) }
    /// # })?;
    /// use cuarena::graph;
    ///
    /// // `g` captured from `double_it(y, x)` (see `ArenaGraph::capture`)
    /// let now = graph::handle_args(&mut arena)?;
    /// assert_eq!((g.table().base, g.table().table), (now.base, now.table)); // replays run
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn table(&self) -> HandleArgs {
        self.table
    }

    /// The cudarc graph (for inspection; replay with
    /// [`launch`](ArenaGraph::launch)).
    ///
    /// ```no_run
    /// # use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
    /// # use cuarena::graph::ArenaGraph;
    /// # use cuarena::{Arena, ArenaConfig, DType};
    /// # fn kernel() -> CudaFunction { unimplemented!() }
    /// # let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// # let (x, y) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
    /// # let double_it: CudaFunction = kernel(); // (CuarenaTable t, u64 out, u64 in, u32 n)
    /// # let cfg = LaunchConfig::for_num_elems(1024);
    /// # let g = ArenaGraph::capture(&mut arena, |cap| {
    /// #     // SAFETY: double_it reads n floats of `in` and writes n of `out`.
    /// #     unsafe { cap.prepare([y, x])?.launch(&double_it, cfg, &1024u32) }
    /// # })?;
    /// use cuarena::backend::cuda::cudarc::driver::sys;
    ///
    /// // `g` captured from `double_it(y, x)` (see `ArenaGraph::capture`)
    /// // The driver's graph, for its API (`cuGraphGetNodes`, `cuGraphDebugDotPrint`).
    /// let raw: sys::CUgraph = g.cuda_graph().cu_graph();
    /// assert!(!raw.is_null());
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn cuda_graph(&self) -> &CudaGraph {
        &self.graph
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_args_match_the_c_layout() {
        assert_eq!(std::mem::size_of::<HandleArgs>(), 24);
        assert_eq!(std::mem::align_of::<HandleArgs>(), 8);
        assert_eq!(std::mem::size_of::<DeviceHandle>(), 8);
        assert_eq!(std::mem::size_of::<crate::handle::TableEntry>(), 16);
    }

    #[test]
    fn device_handles_are_the_handle_bits() {
        let mut arena = Arena::metadata(crate::ArenaConfig::new(1 << 20)).expect("arena");
        let h = arena.alloc(100).expect("alloc");
        assert_eq!(DeviceHandle::from(h).0, h.to_bits());
        // The slot is the low half, the table's last entry.
        assert_eq!(h.to_bits() as u32 as usize, arena.handle_table().len() - 1);
    }
}
