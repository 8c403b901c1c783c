//! Launching kernels that take handles (`cuarena.cuh`,
//! [`CUARENA_CUH`](super::CUARENA_CUH)): the table argument, handles as
//! kernel arguments, and the launch itself. The arena side
//! (`cuarena::graph`) decides which handles and table to pass; the `unsafe`
//! launch lives here, with the driver.

use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

use super::driver_err;
use crate::error::Result;
use crate::handle::Handle;

/// The handle table as one kernel argument: mirrors `struct CuarenaTable`
/// of `cuarena.cuh` ([`CUARENA_CUH`](super::CUARENA_CUH)) field for field
/// (24 bytes, 8-aligned).
///
/// Resolve on the device with `cuarena_at(t, handle)` (unchecked) or
/// `cuarena_at_checked(t, handle, bytes)` (stale, freed, spilled or too
/// small blocks give `nullptr`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleArgs {
    /// Device address of the region's first byte.
    pub base: u64,
    /// Device address of the handle table (`CuarenaEntry` records).
    pub table: u64,
    /// Entries of the table the checked resolve may read.
    pub slots: u32,
    /// Padding (0).
    pub pad: u32,
}

// SAFETY: `#[repr(C)]`, made of u64/u32 only, with the layout of the C
// struct `CuarenaTable` that kernels take by value.
unsafe impl DeviceRepr for HandleArgs {}

/// A handle as a kernel takes it: `version << 32 | slot`
/// ([`Handle::to_bits`]), pushed as a `u64`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceHandle(pub u64);

// SAFETY: a transparent `u64`.
unsafe impl DeviceRepr for DeviceHandle {}

impl From<Handle> for DeviceHandle {
    fn from(h: Handle) -> Self {
        Self(h.to_bits())
    }
}

/// Launches `func` on `stream` as `func(table, handles[0], ..,
/// handles[N-1], *params)`: the kernel form of `cuarena.cuh`
/// (`CuarenaTable`, one `u64` per handle, one by-value parameter; pack
/// several scalars in a `#[repr(C)]` struct that implements
/// [`DeviceRepr`]). Nothing is tracked: no cudarc events are waited for or
/// recorded, so it may be captured into a graph.
///
/// # Safety
///
/// - `func`'s parameters must be exactly `(CuarenaTable, u64 x N, P)`.
/// - The kernel must touch only the blocks its handles name, within their
///   bytes, and only as `table` was at the launch's point of the stream:
///   launch on the arena stream (or join it both ways), after the table was
///   flushed for these handles, with the blocks resident. The arena's
///   `launch_args` and `graph::Capture::prepare` meet the last three and
///   return a [`PreparedLaunch`].
///
/// ```no_run
/// use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
/// use cuarena::graph::{self, DeviceHandle};
/// use cuarena::{Arena, ArenaConfig, DType};
/// # fn kernel() -> CudaFunction { unimplemented!() }
///
/// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
/// let (x, y) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
/// // extern "C" __global__ void double_it(CuarenaTable t, u64 out, u64 in, u32 n)
/// let double_it: CudaFunction = kernel();
/// // What `graph::launch_args` checks, by hand: resident blocks, a flushed table.
/// let table = graph::handle_args(&mut arena)?;
/// let stream = arena.backend().stream().clone();
/// let handles = [DeviceHandle::from(y), DeviceHandle::from(x)];
/// let cfg = LaunchConfig::for_num_elems(1024);
/// // SAFETY: double_it reads n floats of `in` and writes n of `out`; it runs
/// // on the arena stream, after the flush, and nothing moves before it.
/// unsafe { graph::launch_with_handles(&stream, &double_it, cfg, &table, &handles, &1024u32)? };
/// # Ok::<(), cuarena::Error>(())
/// ```
pub unsafe fn launch_with_handles<P: DeviceRepr, const N: usize>(
    stream: &CudaStream,
    func: &CudaFunction,
    cfg: LaunchConfig,
    table: &HandleArgs,
    handles: &[DeviceHandle; N],
    params: &P,
) -> Result<()> {
    let mut b = stream.launch_builder(func);
    b.arg(table);
    for h in handles {
        b.arg(h);
    }
    b.arg(params);
    // SAFETY: the caller guarantees the kernel's signature and what it
    // touches; every argument pushed lives until the launch returns.
    unsafe { b.launch(cfg) }.map_err(driver_err("cuLaunchKernel"))?;
    Ok(())
}

/// A launch whose stream, table and handles the arena has checked: the
/// arena stream, a flushed table, live resident handles. What is left to
/// the caller is the kernel itself ([`launch`](PreparedLaunch::launch)).
#[derive(Debug, Clone, Copy)]
pub struct PreparedLaunch<'a, const N: usize> {
    stream: &'a CudaStream,
    table: HandleArgs,
    handles: [DeviceHandle; N],
}

impl<'a, const N: usize> PreparedLaunch<'a, N> {
    /// Only the arena makes these (after its checks).
    pub(crate) fn new(
        stream: &'a CudaStream,
        table: HandleArgs,
        handles: [DeviceHandle; N],
    ) -> Self {
        Self {
            stream,
            table,
            handles,
        }
    }

    /// The table argument.
    ///
    /// ```no_run
    /// use cuarena::graph::{self, DeviceHandle};
    /// use cuarena::{Arena, ArenaConfig, DType};
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let (x, y) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
    /// let prepared = graph::launch_args(&mut arena, [y, x])?;
    /// // The kernel's `CuarenaTable`: it holds x's slot (a handle's low 32 bits).
    /// assert!((DeviceHandle::from(x).0 as u32) < prepared.table().slots);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn table(&self) -> HandleArgs {
        self.table
    }

    /// The handles, as the kernel gets them.
    ///
    /// ```no_run
    /// use cuarena::graph::{self, DeviceHandle};
    /// use cuarena::{Arena, ArenaConfig, DType};
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let (x, y) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
    /// let prepared = graph::launch_args(&mut arena, [y, x])?;
    /// assert_eq!(prepared.handles(), &[DeviceHandle::from(y), DeviceHandle::from(x)]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn handles(&self) -> &[DeviceHandle; N] {
        &self.handles
    }

    /// Launches `func(table, handles.., *params)` (see
    /// [`launch_with_handles`]).
    ///
    /// # Safety
    ///
    /// `func`'s parameters must be exactly `(CuarenaTable, u64 x N, P)`,
    /// and it may touch only the blocks named, within their bytes.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::cudarc::driver::{CudaFunction, LaunchConfig};
    /// use cuarena::graph;
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// # fn kernel() -> CudaFunction { unimplemented!() }
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let (x, y) = (arena.alloc_dtype(DType::F32, 1024)?, arena.alloc_dtype(DType::F32, 1024)?);
    /// let prepared = graph::launch_args(&mut arena, [y, x])?;
    /// // extern "C" __global__ void double_it(CuarenaTable t, u64 out, u64 in, u32 n)
    /// let double_it: CudaFunction = kernel();
    /// // SAFETY: double_it reads n floats of `in` and writes n of `out`.
    /// unsafe { prepared.launch(&double_it, LaunchConfig::for_num_elems(1024), &1024u32)? };
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub unsafe fn launch<P: DeviceRepr>(
        &self,
        func: &CudaFunction,
        cfg: LaunchConfig,
        params: &P,
    ) -> Result<()> {
        // SAFETY: the caller's obligations, plus the ones the arena met
        // when it prepared this launch.
        unsafe { launch_with_handles(self.stream, func, cfg, &self.table, &self.handles, params) }
    }
}
