//! CUDA backend: one device allocation holds the arena's region, and
//! compaction plans run on our own NVRTC-compiled move kernels.
//!
//! # Stream contract
//!
//! The backend owns one stream, the *arena stream* ([`CudaBackend::stream`]).
//! Every transfer and every plan runs on it, in order, without host
//! synchronisation between waves. Other streams are registered
//! (the arena's `register_stream`, or [`Backend::register_stream`](crate::backend::Backend::register_stream)) and
//! ordered with the arena stream by events and stream waits only
//! ([`Backend::wait_stream`](crate::backend::Backend::wait_stream),
//! [`Backend::join_arena`](crate::backend::Backend::join_arena)); the
//! arena decides when (see [`StreamId`](crate::StreamId)). `CudaBackend::read` waits
//! for the arena stream; writes and plans do not block the host.
//!
//! Views ([`ArenaView`], [`ArenaViewMut`]) are plain device pointers for one
//! stream and carry no cudarc events: cudarc would track the region as one
//! buffer, serialising unrelated work on different streams.
//!
//! # Never waiting for queued work
//!
//! A compaction returns once its moves are checked, staged and enqueued:
//! nothing on that path waits for the device, however much work the
//! streams hold ([`CudaBackend::host_stats`] counts any exception).
//!
//! - The host writes a plan's records, and a table update's entries, into
//!   page-locked staging buffers taken from a pool; each goes back with an
//!   event recorded behind the copy that reads it and is reused only once
//!   that event has completed (`cuEventQuery`, never a wait); while every
//!   buffer is still being read, the pool makes another (see `pool`).
//! - Device scratch (the plan's records, tile descriptors, flags) is sized
//!   from the region's capacity when the backend is made; a plan that
//!   outgrows it, or first needs the side buffer, grows it in stream order
//!   (`cuMemFreeAsync`, `cuMemAllocAsync`), so the old buffer is freed only
//!   after the kernels that use it, with no host synchronisation.
//! - The handle table's device copy still grows with `cuMemAlloc` when the
//!   arena has more slots than it holds (a driver allocation, not a wait
//!   for queued work; `graph::reserve_handle_table` does it ahead of time).
//!
//! # The move kernel
//!
//! A wave runs in chunks of moves (the first of 1024, growing to 65536 and
//! a remainder of at most a quarter of that, each sized so that the host
//! lays it out while the GPU runs the one before: see `chunks`), so the
//! host's work hides behind the device's. A chunk's records (one per move)
//! go up on a side stream in one copy, followed there by
//! `cuarena_prep` (per tile: its addresses, whether it must shift, and the
//! range of earlier tiles whose source its destination overlaps), so both
//! overlap the kernels of the chunk before it; consecutive chunks alternate
//! between two descriptor buffers for that. The arena stream then runs
//! `cuarena_move`, a persistent kernel
//! whose CTAs take tiles of [`CudaOptions::tile_bytes`] in list order with
//! an atomic ticket, load a whole tile into registers, publish it, store the
//! part of it that covers at most its own source, wait for the earlier
//! tiles the rest overlaps, and store the rest. See `kernels/moves.cu`.
//! Every access is a 16-byte vector: a tile whose source and destination
//! differ modulo 16 loads aligned source vectors and funnel-shifts them
//! across lanes into aligned destination vectors (its first and last few
//! bytes go one by one). Chunks of one wave are ordered by the stream, so a
//! chunk never waits for another. On Hopper the default runs
//! `cuarena_move_bulk` (`kernels/bulk.cu`): the same tiles and waits,
//! carried through shared memory by bulk asynchronous copies, several per
//! CTA in flight; a chunk whose moves average 256 KiB or more takes a
//! second compiled shape with 64 KiB tiles ([`CudaOptions::with_large_moves`]).
//! A tile whose waiting part is small (a block sliding down by a small
//! shift) stores it into a side buffer instead of waiting, and a third
//! launch, `cuarena_settle`, puts it in place
//! ([`CudaOptions::side_buffer_bytes`]).
//!
//! # Checks
//!
//! The plan's bounds and source order are checked on the host while each
//! chunk is laid out (an error there leaves earlier chunks executed, as the
//! [`Backend`](crate::backend::Backend) contract allows). Rule 3 (no destination over a later
//! source) is checked on the device: per tile by the prep kernel, which
//! never lets a tile wait for a later one (so a bad plan cannot hang the
//! GPU), and over a whole wave of several chunks by `cuarena_check`. A
//! violation, or a wait that the watchdog gave up on (the tile then stores
//! nothing), is reported as [`BackendError::DeviceFault`] at the next
//! synchronisation point ([`Backend::read`](crate::backend::Backend::read), [`CudaBackend::synchronize`]),
//! or at the next call when the GPU has already finished, and at every
//! check after that: faults are sticky (the arena poisons itself). Rules 2 and 4 are
//! the planner's obligation (the arena checks the final layout).
//!
//! # Performance (`benches/moves.rs`, BENCHMARKS.md)
//!
//! Against `cuMemcpyDtoDAsync` on the same bytes, in the same run: large
//! blocks, 100,000 blocks of 4-64 KiB compacted in one wave end to end,
//! the same at 1-byte alignment, and a 4 GiB block sliding down by 256 B;
//! the figures are in
//! `BENCHMARKS.md#moves-our-kernel-against-cumemcpydtodasync`.

mod buffers;
mod chunks;
mod kernels;
pub(crate) mod launch;
mod moves;
#[cfg(feature = "nccl")]
pub mod nccl;
mod nvrtc;
mod options;
mod pool;
mod scratch;
mod stage;
mod streams;
mod transfers;
mod view;
mod vmm;
mod wave;

/// The cudarc this crate is built with (use it for your own kernels so the
/// types match).
pub use cudarc;
pub use nvrtc::{compile, CUARENA_CUH};
pub use options::CudaOptions;
#[cfg(test)]
use options::LargeMoves;
use options::MoveKernelInfo;
pub(crate) use view::ViewSet;
pub use view::{ArenaView, ArenaViewMut};

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{result, CudaContext, CudaSlice, CudaStream, DriverError};

use crate::error::{BackendError, Error, Result};
use crate::handle::TableEntry;

use buffers::DeviceBuf;
use kernels::KernelSet;
use scratch::{Scratch, CTL_WORDS};

/// Maps a cudarc driver error to [`BackendError::Driver`] naming `call`,
/// keeping the driver's result code.
pub(crate) fn driver_err(call: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| BackendError::driver(call, e).into()
}

/// What [`Backend::execute`](crate::backend::Backend::execute) and
/// [`Backend::sync_table`](crate::backend::Backend::sync_table) cost the
/// host ([`CudaBackend::host_stats`]), cumulative since the backend was
/// made. Neither waits for the device: staging memory that queued copies
/// still read is replaced from a pool, and scratch on the device grows in
/// stream order. `blocked_*` counts the exceptions (a device without
/// memory pools, error paths); it stays 0 on Hopper.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct HostStats {
    /// Host time inside both calls: checking, laying out, uploading and
    /// launching (waits included).
    pub staging_time: std::time::Duration,
    /// Of which the host was blocked on the device.
    pub blocked_time: std::time::Duration,
    /// Blocking driver calls made there.
    pub blocked_calls: u64,
    /// Plan execution's device scratch buffers that grew after the backend
    /// was made (a plan larger than the scratch sized at creation).
    pub buffers_grown: u64,
    /// Device memory the backend holds beside the region now: plan
    /// execution's scratch and the handle table's device copies (made at
    /// the first table update, doubled when full, the old ones kept).
    pub device_scratch_bytes: u64,
    /// Page-locked staging buffers made (at creation and since).
    pub staging_buffers: u64,
    /// Their bytes.
    pub staging_bytes: u64,
    /// Staging buffers that queued copies may still read (as last seen).
    pub staging_in_flight: usize,
}

/// How large the region is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CudaCapacity {
    /// Exactly this many bytes.
    Bytes(u64),
    /// This fraction (in `(0, 1]`) of the device's free memory as reported
    /// by `cuMemGetInfo` when the backend is made, rounded down to a
    /// multiple of `multiple_of_bytes` (the arena's alignment).
    FreeFraction {
        /// Fraction of the free memory.
        fraction: f64,
        /// The capacity is a multiple of this (a power of two).
        multiple_of_bytes: u64,
    },
}

/// The device memory's peak bandwidth in bytes per nanosecond: double data
/// rate at the memory clock over the bus width (a large
/// `cuMemcpyDtoDAsync` reaches about 90% of it, counting bytes read plus
/// written: `BENCHMARKS.md#moves-our-kernel-against-cumemcpydtodasync`);
/// 0 if the driver does not say.
fn copy_bytes_per_ns(ctx: &CudaContext) -> f64 {
    let attr = |a| ctx.attribute(a).ok().filter(|&v| v > 0).map(f64::from);
    let clock_khz = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
    let bus_bits = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
    match (clock_khz, bus_bits) {
        (Some(khz), Some(bits)) => 2.0 * khz * 1e3 * bits / 8.0 / 1e9,
        _ => 0.0,
    }
}

/// The arena's region in one device allocation, moved by our own kernels.
///
/// See the [module documentation](self) for the stream contract and the
/// kernel design.
#[derive(Debug)]
pub struct CudaBackend {
    region: ManuallyDrop<CudaSlice<u8>>,
    region_ptr: u64,
    /// Bytes the arena may touch: the region, or an elastic region's
    /// mapped prefix.
    capacity_bytes: u64,
    /// An elastic region's reserved range and chunks (`None`: fixed).
    /// Declared before `ctx`, so that it is released while the context
    /// lives.
    vmm: Option<vmm::Vmm>,
    scratch: Scratch,
    /// The move kernels, and those for chunks of large moves (when the
    /// options name a separate shape for them).
    primary: KernelSet,
    large: Option<KernelSet>,
    options: CudaOptions,
    device_name: String,
    arch: String,
    sm_count: u32,
    /// Bytes per nanosecond a device-to-device copy moves, read plus
    /// written, from the memory's clock and bus width (0 if unknown): what
    /// chunks of a wave are sized against (see `chunks::Chunks`).
    copy_bytes_per_ns: f64,
    stream: Arc<CudaStream>,
    /// Registered streams; index 0 is the arena stream.
    streams: Vec<streams::Registered>,
    ctx: Arc<CudaContext>,
}

impl CudaBackend {
    /// Ok when a CUDA driver, NVRTC and at least one device are present;
    /// otherwise says why not. Never panics (cudarc panics on the first
    /// call into a library that is not there, so this asks first).
    pub fn available() -> std::result::Result<(), String> {
        // SAFETY: only tries to open the driver library.
        if !unsafe { sys::is_culib_present() } {
            return Err("no CUDA driver library (libcuda.so) on the library path".to_string());
        }
        // SAFETY: only tries to open the NVRTC library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(
                "no NVRTC library (libnvrtc.so); add /usr/local/cuda/lib64 to LD_LIBRARY_PATH"
                    .to_string(),
            );
        }
        result::init().map_err(|e| format!("cuInit failed: {e:?}"))?;
        let count = result::device::get_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))?;
        if count < 1 {
            return Err("the CUDA driver reports no device".to_string());
        }
        Ok(())
    }

    /// A region of `capacity_bytes` on device `ordinal`, default kernel options.
    pub fn new(ordinal: usize, capacity_bytes: u64) -> Result<Self> {
        Self::with_options(
            ordinal,
            CudaCapacity::Bytes(capacity_bytes),
            CudaOptions::default(),
        )
    }

    /// A region sized by `capacity` on device `ordinal`, with kernel `options`.
    pub fn with_options(
        ordinal: usize,
        capacity: CudaCapacity,
        options: CudaOptions,
    ) -> Result<Self> {
        Self::make(ordinal, Some(capacity), None, options)
    }

    /// An elastic region on device `ordinal`: `limit_bytes` of address space
    /// reserved (`None`: the device's total memory), nothing mapped until
    /// the arena maps it ([`Backend::map_to`](crate::backend::Backend::map_to)).
    /// A device without virtual memory management is refused with
    /// [`BackendError::NoDevice`] saying so.
    pub fn elastic(ordinal: usize, limit_bytes: Option<u64>, options: CudaOptions) -> Result<Self> {
        Self::make(ordinal, None, Some(limit_bytes), options)
    }

    /// A fixed region (`capacity`) or an elastic one (`elastic`: its limit).
    fn make(
        ordinal: usize,
        capacity: Option<CudaCapacity>,
        elastic: Option<Option<u64>>,
        options: CudaOptions,
    ) -> Result<Self> {
        options.validate()?;
        Self::available().map_err(|reason| Error::Backend(BackendError::NoDevice { reason }))?;
        let count = result::device::get_count().map_err(driver_err("cuDeviceGetCount"))?;
        if ordinal >= usize::try_from(count).unwrap_or(0) {
            return Err(Error::Backend(BackendError::NoDevice {
                reason: format!("device ordinal {ordinal} requested, {count} present"),
            }));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver_err("cuDevicePrimaryCtxRetain"))?;
        let stream = ctx.new_stream().map_err(driver_err("cuStreamCreate"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver_err("cuDeviceGetAttribute"))?;
        let arch = format!("sm_{major}{minor}");
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_err("cuDeviceGetAttribute"))?;
        let sm_count = u32::try_from(sm_count).unwrap_or(1).max(1);
        let copy_bytes_per_ns = copy_bytes_per_ns(&ctx);
        let device_name = ctx.name().map_err(driver_err("cuDeviceGetName"))?;

        let primary = KernelSet::load(&ctx, &arch, major, sm_count, &options)?;
        let large = match options.large_moves {
            Some(l) => Some(KernelSet::load(&ctx, &arch, major, sm_count, &l.shape())?),
            None => None,
        };

        let capacity_bytes = match capacity.unwrap_or(CudaCapacity::Bytes(1)) {
            CudaCapacity::Bytes(b) => b,
            CudaCapacity::FreeFraction {
                fraction,
                multiple_of_bytes,
            } => {
                let in_range = fraction > 0.0 && fraction <= 1.0; // false for NaN
                if !in_range || !multiple_of_bytes.is_power_of_two() {
                    return Err(Error::InvalidInput {
                        input: "CUDA capacity",
                        reason: format!(
                            "free fraction {fraction} must be in (0, 1] and {multiple_of_bytes} a power of two"
                        ),
                    });
                }
                let (free, _total) = ctx.mem_get_info().map_err(driver_err("cuMemGetInfo"))?;
                let bytes = (free as f64 * fraction) as u64;
                let rounded = bytes / multiple_of_bytes * multiple_of_bytes;
                if rounded == 0 {
                    return Err(Error::InvalidInput {
                        input: "CUDA capacity",
                        reason: format!(
                            "a region of {bytes} B (of {free} B free on the device, rounded down \
                             to a multiple of {multiple_of_bytes} B) holds nothing"
                        ),
                    });
                }
                rounded
            }
        };
        if capacity_bytes == 0 {
            return Err(Error::InvalidInput {
                input: "CUDA capacity",
                reason: "the CUDA region must hold at least one byte (CudaCapacity::Bytes(0))"
                    .to_string(),
            });
        }
        // Everything that can fail before the region exists: once it does,
        // only a built `CudaBackend` (whose drop frees it) may return early.
        let scratch = Scratch::new(&ctx)?;
        let arena_stream = streams::Registered::new(Arc::clone(&stream), &stream)?;
        let (region, region_ptr, capacity_bytes, vmm) = if let Some(limit) = elastic {
            let limit = match limit {
                Some(l) => l,
                None => ctx.mem_get_info().map_err(driver_err("cuMemGetInfo"))?.1 as u64,
            };
            ctx.bind_to_thread()
                .map_err(driver_err("cuCtxSetCurrent"))?;
            // The range goes back when `vmm` drops, on any early return.
            let vmm = vmm::Vmm::reserve(ctx.cu_device(), limit)?;
            let (ptr, reserved) = (vmm.base(), vmm.reserved());
            // SAFETY: `ptr` is the base of a reserved range of `reserved`
            // bytes; the slice only carries the pointer (the arena touches
            // mapped bytes only) and is leaked, never freed, in `Drop`.
            let region = ManuallyDrop::new(unsafe {
                stream.upgrade_device_ptr::<u8>(ptr, reserved as usize)
            });
            (region, ptr, 0, Some(vmm))
        } else {
            // The allocation ends on a 256-byte boundary at least 16 bytes past
            // the region: the move kernel's shifting path reads whole aligned
            // 16-byte vectors, which may reach up to 15 bytes past the last
            // byte it moves (and discards them). The arena never sees the slack.
            let bytes = capacity_bytes
                .checked_add(16)
                .map(|b| b.next_multiple_of(256))
                .and_then(|b| usize::try_from(b).ok())
                .ok_or(Error::LimitReached {
                    what: "bytes of a CUDA region (this machine's address space)",
                    requested: capacity_bytes,
                    limit: usize::MAX as u64 - 271,
                })?;
            // SAFETY: a plain allocation in the context bound by
            // CudaContext::new; its bytes are uninitialised, which the arena
            // never exposes (it reads only what it wrote).
            let ptr = unsafe { result::malloc_sync(bytes) }.map_err(driver_err("cuMemAlloc"))?;
            // SAFETY: `ptr` is a live allocation of `bytes` bytes in this
            // context; the slice takes it over and `Drop` gives it back to
            // cuMemFree through `leak`.
            let region = ManuallyDrop::new(unsafe { stream.upgrade_device_ptr::<u8>(ptr, bytes) });

            (region, ptr, capacity_bytes, None)
        };
        let mut backend = CudaBackend {
            region,
            region_ptr,
            capacity_bytes,
            vmm,
            scratch,
            primary,
            large,
            options,
            device_name,
            arch,
            sm_count,
            copy_bytes_per_ns,
            streams: vec![arena_stream],
            stream,
            ctx,
        };
        backend
            .scratch
            .ctl
            .reserve(2 * CTL_WORDS * 4, true, &backend.stream)?;
        backend.scratch.status.reserve(CTL_WORDS)?;
        // An elastic region has nothing mapped to presize for yet.
        if backend.vmm.is_none() {
            backend.presize()?;
        }
        Ok(backend)
    }

    /// Binds the backend's context to the calling thread (driver calls
    /// act on the thread's current context).
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))
    }

    /// Checks a copy of `len` bytes between the region at `offset` and the
    /// host tier at `host_offset`, and binds the context: `false` when
    /// there is nothing to copy.
    pub(crate) fn begin_tier_copy(&self, offset: u64, host_offset: u64, len: u64) -> Result<bool> {
        crate::backend::check_range(offset, len, self.capacity_bytes)?;
        crate::backend::check_range(host_offset, len, self.scratch.host_tier_bytes)?;
        if len == 0 {
            return Ok(false);
        }
        self.bind()?;
        Ok(true)
    }

    /// The arena stream: every transfer and plan runs on it.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The context of the device.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Device address of the region's first byte. Bytes of a block are
    /// there only between compactions; prefer views and pinned pointers.
    pub fn region_ptr(&self) -> u64 {
        self.region_ptr
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The architecture the kernels were compiled for (`sm_90`).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Multiprocessors of the device.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// The device memory's peak copy rate in bytes per nanosecond (bytes
    /// read plus written), from its clock and bus width; 0 where the driver
    /// does not say. A wave's chunks are sized against it.
    pub fn copy_bytes_per_ns(&self) -> f64 {
        self.copy_bytes_per_ns
    }

    /// The kernel options in use.
    pub fn options(&self) -> &CudaOptions {
        &self.options
    }

    /// Registers, spills and grid of the move kernel (of chunks of small
    /// moves, when the options name a kernel for large ones).
    pub(crate) fn move_kernel_info(&self) -> &MoveKernelInfo {
        &self.primary.info
    }

    /// The same for the kernel of chunks of large moves, if the options
    /// name one.
    pub(crate) fn large_move_kernel_info(&self) -> Option<&MoveKernelInfo> {
        self.large.as_ref().map(|k| &k.info)
    }

    /// The move kernels as loaded, one line each (for logs and benches):
    /// the shape as it runs (`r`: the register kernel, `bN`: the bulk
    /// kernel with N tiles in flight), tile bytes, registers and local
    /// bytes per thread, shared memory per CTA, CTAs per multiprocessor
    /// and the grid. A second line describes the kernel of chunks of large
    /// moves, when there is one.
    pub fn describe_kernels(&self) -> String {
        let line = |what: &str, i: &MoveKernelInfo| {
            let kind = match i.bulk_stages {
                0 => "r".to_string(),
                s => format!("b{s}"),
            };
            format!(
                "{what} {kind}: tile {} KiB, {} regs, {} B local, {} B shared, {} CTAs/SM, grid {}",
                i.tile_bytes >> 10,
                i.registers,
                i.local_bytes,
                i.shared_bytes,
                i.ctas_per_sm,
                i.grid
            )
        };
        let mut out = line("move kernel", self.move_kernel_info());
        if let Some(large) = self.large_move_kernel_info() {
            out.push('\n');
            out.push_str(&line("large moves", large));
        }
        out
    }

    /// Device bytes of the side buffer that small waiting parts of tiles
    /// go through (see [`CudaOptions::side_buffer_bytes`]): 0 until a plan
    /// first slides a block down by a small shift.
    pub fn side_buffer_bytes(&self) -> usize {
        self.scratch.side.bytes
    }

    /// What plan execution and table updates cost the host so far, and
    /// what their staging memory grew to (see [`HostStats`]).
    pub fn host_stats(&self) -> HostStats {
        let s = &self.scratch;
        let c = &s.counters;
        HostStats {
            staging_time: c.staging,
            blocked_time: c.blocked.time,
            blocked_calls: c.blocked.calls,
            buffers_grown: c.grown,
            device_scratch_bytes: s.device_bytes(),
            staging_buffers: s.staging.made() + s.table_staging.made(),
            staging_bytes: 8 * (s.staging.words() + s.table_staging.words()) as u64,
            staging_in_flight: s.staging.busy_len() + s.table_staging.busy_len(),
        }
    }

    /// Waits for all work on the arena stream and reports any error the
    /// kernels found since the last check.
    pub fn synchronize(&mut self) -> Result<()> {
        self.bind()?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        // A trim's chunks wait for every registered stream: here, where
        // waiting is the point, they go.
        if let Some(v) = self.vmm.as_mut() {
            v.flush()?;
        }
        self.check_status(true)
    }

    /// Grows the device copy of the handle table to at least `slots`
    /// entries now, and returns its address. A table that grows gets a new
    /// address; the old buffer is kept (not updated) until the backend is
    /// dropped, so kernels already enqueued and captured graphs never read
    /// freed memory. Reserve up front for the most blocks you will have.
    pub(crate) fn reserve_table(&mut self, slots: usize) -> Result<u64> {
        let entry = std::mem::size_of::<TableEntry>();
        let need = slots
            .checked_mul(entry)
            .ok_or_else(|| Error::LimitReached {
                what: "handle table slots (this machine's address space)",
                requested: slots as u64,
                limit: (usize::MAX / entry) as u64,
            })?;
        let old_bytes = self.scratch.table.bytes;
        if old_bytes < need {
            self.bind()?;
            let want = need.max(old_bytes.saturating_mul(2)).max(64 * entry);
            // SAFETY: a plain allocation in the bound context.
            let ptr = unsafe { result::malloc_sync(want) }.map_err(driver_err("cuMemAlloc"))?;
            let mut grown = DeviceBuf {
                ptr,
                bytes: want,
                pooled: false,
            };
            let stream = self.stream.cu_stream();
            // SAFETY: `grown` holds `want` bytes and the old table
            // `old_bytes` < want; both are ordered on the arena stream after
            // every update enqueued so far, and the old buffer stays
            // allocated (retired) until drop.
            unsafe {
                result::memset_d8_async(ptr, 0, want, stream)
                    .map_err(driver_err("cuMemsetD8Async"))?;
                if old_bytes > 0 {
                    result::memcpy_dtod_async(ptr, self.scratch.table.ptr, old_bytes, stream)
                        .map_err(driver_err("cuMemcpyDtoDAsync"))?;
                }
            }
            std::mem::swap(&mut self.scratch.table, &mut grown);
            if grown.bytes > 0 {
                self.scratch.retired_tables.push(grown);
            }
        }
        Ok(self.scratch.table.ptr)
    }

    /// Entries the device table holds now (0 before the first sync).
    pub(crate) fn table_capacity_slots(&self) -> usize {
        self.scratch.table.bytes / std::mem::size_of::<TableEntry>()
    }

    /// Device address of the backend's copy of the arena's handle table
    /// (`TableEntry` records, see `kernels/cuarena.cuh`), 0 before the
    /// first sync. Updated until the table next grows (see
    /// `graph::reserve_handle_table`); `graph::handle_args` flushes the
    /// arena's changes first.
    pub fn table_ptr(&self) -> u64 {
        self.scratch.table.ptr
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // Nothing may still use the region or the scratch buffers: not the
        // arena stream, nor any registered stream (a kernel or collective
        // there may still read or write arena bytes).
        for r in &self.streams {
            let _ = r.stream.synchronize();
        }
        let _ = self.stream.synchronize();
        // SAFETY: `region` is taken exactly once, here, and never used
        // again; every stream that could use it is idle, so freeing its
        // memory is safe.
        let region = unsafe { ManuallyDrop::take(&mut self.region) };
        let ptr = region.leak();
        if self.vmm.is_none() {
            // SAFETY: `ptr` came from cuMemAlloc in `make`.
            let _ = unsafe { result::free_sync(ptr) };
        }
        // An elastic region's range goes when `vmm` drops, after this.
        self.scratch.release(&self.stream);
    }
}

#[cfg(test)]
mod tests;
