//! Real allocator baselines for trace replay: the CUDA stream-ordered
//! allocator on a memory pool capped at a given size, and plain
//! `cuMemAlloc` / `cuMemFree` per tensor.
//!
//! Both replay an [`Ops`] program with the driver's own calls (through
//! `cudarc::driver::sys`) and no data: they answer "does this allocator
//! complete the program at this capacity" and "how long do its calls
//! take", the questions the arena's GPU replay ([`crate::gpu::replay`])
//! answers for cuarena.
//!
//! # The pool
//!
//! [`replay_pool`] creates a pool with `cuMemPoolCreate` (device memory,
//! `maxSize` = the capacity rounded up to the driver's allocation
//! granularity, 0 for the driver's default), sets its release threshold to
//! `u64::MAX` so that it keeps what it reserved, and replays every alloc
//! with `cuMemAllocFromPoolAsync` and every free with `cuMemFreeAsync` on
//! one stream, so a freed block is reusable by the next allocation at
//! once. An allocation the pool refuses ends the replay
//! ([`Outcome::Failed`]). [`find_min_pool_capacity`] bisects the capacity.
//!
//! # Timing
//!
//! `wall_time` is the host time of the replay loop (the allocator calls and
//! nothing else) plus a final stream synchronisation; the reserved-bytes
//! series, when asked for, adds a `cuMemPoolGetAttribute` per allocation,
//! so time a run without it.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuarena::backend::cuda::cudarc::driver::sys;
use cuarena::backend::cuda::cudarc::driver::{CudaContext, CudaStream};

use super::driver_err;
use crate::trace::replay::{search_capacity, Search};
use crate::trace::{Op, Ops, Outcome};
use crate::{Result, ToolError};
use cuarena::backend::cuda::CudaBackend;
use cuarena::{BackendError, Error};

/// Which real allocator a [`BaselineReport`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// `cuMemAllocFromPoolAsync` / `cuMemFreeAsync` on a capped pool.
    Pool,
    /// `cuMemAlloc` / `cuMemFree` per tensor, uncapped.
    CuMemAlloc,
}

impl Baseline {
    /// Short name for tables.
    pub fn label(self) -> &'static str {
        match self {
            Baseline::Pool => "CUDA pool (cuMemAllocFromPoolAsync)",
            Baseline::CuMemAlloc => "cuMemAlloc / cuMemFree",
        }
    }
}

/// What a baseline replay did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BaselineReport {
    /// The allocator.
    pub allocator: Baseline,
    /// The pool's `maxSize` as created (after rounding up to the
    /// granularity); `None` for no cap.
    pub capacity_bytes: Option<u64>,
    /// Completed, or the op where the allocator refused.
    pub outcome: Outcome,
    /// Ops that ran successfully.
    pub ops_run: usize,
    /// Allocator calls made (allocations and frees; zero-byte
    /// allocations make none).
    pub calls: u64,
    /// Host time of the replay loop plus a final stream synchronisation.
    pub wall_time: Duration,
    /// The pool's `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH` at the end.
    pub peak_reserved_bytes: Option<u64>,
    /// The pool's `CU_MEMPOOL_ATTR_USED_MEM_HIGH` at the end.
    pub peak_used_bytes: Option<u64>,
    /// `(trace event, bytes the pool reserved)` at every change, when
    /// asked for.
    pub reserved: Vec<(u64, u64)>,
}

impl BaselineReport {
    /// True when every op ran.
    pub fn completed(&self) -> bool {
        self.outcome.is_completed()
    }

    /// The trace event at which the replay failed.
    pub fn failed_event(&self) -> Option<u64> {
        self.outcome.failed_event()
    }

    /// Wall time per op run.
    pub fn time_per_op(&self) -> Duration {
        crate::trace::replay::per_op(self.wall_time, self.ops_run)
    }
}

/// Options of [`replay_pool`]: [`Default`] and the `with_*` methods.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolOptions {
    /// Device ordinal.
    pub ordinal: usize,
    /// The pool's `maxSize`, rounded up to the allocation granularity; 0
    /// for the driver's default (no cap of ours).
    pub max_size_bytes: u64,
    /// Record the pool's reserved bytes after every allocation (slows the
    /// replay down; for pictures, not for timing).
    pub record_reserved: bool,
}

impl PoolOptions {
    /// The device ordinal.
    #[must_use]
    pub fn with_ordinal(mut self, ordinal: usize) -> Self {
        self.ordinal = ordinal;
        self
    }

    /// The pool's `maxSize` (0: the driver's default).
    #[must_use]
    pub fn with_max_size_bytes(mut self, bytes: u64) -> Self {
        self.max_size_bytes = bytes;
        self
    }

    /// Record the pool's reserved bytes after every allocation.
    #[must_use]
    pub fn with_record_reserved(mut self, record: bool) -> Self {
        self.record_reserved = record;
        self
    }
}

/// Maps a raw driver result to [`BackendError::Driver`] naming `call`.
fn check(r: sys::CUresult, call: &'static str) -> Result<()> {
    Ok(r.result().map_err(driver_err(call))?)
}

/// The primary context of `ordinal`, bound to this thread, and a new stream.
fn context(ordinal: usize) -> Result<(Arc<CudaContext>, Arc<CudaStream>)> {
    CudaBackend::available().map_err(|reason| Error::Backend(BackendError::NoDevice { reason }))?;
    let ctx = CudaContext::new(ordinal).map_err(driver_err("cuDevicePrimaryCtxRetain"))?;
    ctx.bind_to_thread()
        .map_err(driver_err("cuCtxSetCurrent"))?;
    let stream = ctx.new_stream().map_err(driver_err("cuStreamCreate"))?;
    Ok((ctx, stream))
}

fn device_location(ordinal: usize) -> Result<sys::CUmemLocation> {
    let id = i32::try_from(ordinal).map_err(|_| {
        Error::Backend(BackendError::NoDevice {
            reason: format!("device ordinal {ordinal} out of range"),
        })
    })?;
    Ok(sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id,
    })
}

/// The driver's minimum allocation granularity for device memory on
/// `ordinal` (2 MiB on Hopper): pool caps are rounded up to it.
pub fn pool_granularity(ordinal: usize) -> Result<u64> {
    let (_ctx, _stream) = context(ordinal)?;
    granularity(ordinal)
}

fn granularity(ordinal: usize) -> Result<u64> {
    let prop = sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType(0),
        location: device_location(ordinal)?,
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    };
    let mut g: usize = 0;
    // SAFETY: `g` and `prop` are valid for the call; `prop` is fully
    // initialised (no handle types, no Windows metadata).
    let r = unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    };
    check(r, "cuMemGetAllocationGranularity")?;
    Ok((g as u64).max(1))
}

/// A memory pool, destroyed on drop (after its owner freed everything and
/// synchronised the stream).
struct Pool {
    raw: sys::CUmemoryPool,
}

impl Pool {
    fn create(ordinal: usize, max_size: u64) -> Result<Pool> {
        let max_size = usize::try_from(max_size).map_err(|_| Error::LimitReached {
            what: "bytes of a memory pool (this machine's address space)",
            requested: max_size,
            limit: usize::MAX as u64,
        })?;
        let props = sys::CUmemPoolProps {
            allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: sys::CUmemAllocationHandleType(0),
            location: device_location(ordinal)?,
            win32SecurityAttributes: std::ptr::null_mut(),
            maxSize: max_size,
            usage: 0,
            reserved: [0; 54],
        };
        let mut raw: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `raw` and `props` are valid for the call; `props` is fully
        // initialised with the reserved bytes zero, as the driver requires.
        let r = unsafe { sys::cuMemPoolCreate(&mut raw, &props) };
        check(r, "cuMemPoolCreate")?;
        let pool = Pool { raw };
        let mut threshold: u64 = u64::MAX;
        // SAFETY: the release threshold attribute takes a cuuint64_t, which
        // `threshold` is; the pool is live.
        let r = unsafe {
            sys::cuMemPoolSetAttribute(
                pool.raw,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast::<c_void>(),
            )
        };
        check(r, "cuMemPoolSetAttribute")?;
        Ok(pool)
    }

    fn attribute(&self, attr: sys::CUmemPool_attribute) -> Result<u64> {
        let mut v: u64 = 0;
        // SAFETY: the reserved/used attributes are cuuint64_t values, which
        // `v` is; the pool is live.
        let r = unsafe { sys::cuMemPoolGetAttribute(self.raw, attr, (&mut v as *mut u64).cast()) };
        check(r, "cuMemPoolGetAttribute")?;
        Ok(v)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: `raw` came from cuMemPoolCreate and is destroyed once,
        // here; its owner freed every allocation and synchronised the
        // stream first. Errors cannot be reported from Drop.
        let _ = unsafe { sys::cuMemPoolDestroy(self.raw) };
    }
}

/// Live allocations of a replay, freed on drop (in every outcome).
struct Live {
    ptrs: Vec<sys::CUdeviceptr>,
    stream: Option<sys::CUstream>,
}

impl Live {
    fn new(n: usize, stream: Option<sys::CUstream>) -> Live {
        Live {
            ptrs: vec![0; n],
            stream,
        }
    }

    fn slot(&mut self, id: u32) -> Result<&mut sys::CUdeviceptr> {
        self.ptrs
            .get_mut(id as usize)
            .ok_or_else(|| ToolError::Program {
                reason: format!("op names block {id}, beyond the program's sizes"),
            })
    }

    /// Frees everything still live and waits for the stream.
    fn release(&mut self) {
        for p in self.ptrs.iter_mut().filter(|p| **p != 0) {
            let ptr = std::mem::take(p);
            // SAFETY: `ptr` was returned by the allocation call of this
            // replay and not freed yet (slots are cleared when freed).
            let _ = unsafe {
                match self.stream {
                    Some(s) => sys::cuMemFreeAsync(ptr, s),
                    None => sys::cuMemFree_v2(ptr),
                }
            };
        }
        if let Some(s) = self.stream {
            // SAFETY: `s` is the replay's live stream.
            let _ = unsafe { sys::cuStreamSynchronize(s) };
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.release();
    }
}

fn failed(ops: &Ops, op: usize, error: ToolError) -> Outcome {
    Outcome::Failed {
        op,
        event: ops.event_index.get(op).copied().unwrap_or(op as u64),
        error,
    }
}

fn size_of(size: u64) -> Result<usize> {
    Ok(usize::try_from(size).map_err(|_| Error::TooLarge {
        requested_bytes: size,
        capacity_bytes: usize::MAX as u64,
    })?)
}

/// Replays `ops` with one allocator of the driver: `alloc(&mut address,
/// bytes)` makes one call that sets the block's address, `free(address)` one call
/// that gives it back (each counted; a zero-byte allocation makes none).
/// `after(i, op)` runs after every op that succeeded; its error is the
/// replay's. Returns the outcome (the first refused call ends the
/// program), the ops run and the calls made.
fn drive(
    ops: &Ops,
    live: &mut Live,
    mut alloc: impl FnMut(&mut sys::CUdeviceptr, usize) -> Result<()>,
    mut free: impl FnMut(sys::CUdeviceptr) -> Result<()>,
    mut after: impl FnMut(usize, Op) -> Result<()>,
) -> Result<(Outcome, usize, u64)> {
    let (mut outcome, mut ops_run, mut calls) = (Outcome::Completed, 0, 0u64);
    for (i, &op) in ops.ops.iter().enumerate() {
        let r = match op {
            Op::Alloc { id, size } => (|| -> Result<()> {
                let slot = live.slot(id)?;
                if size == 0 {
                    return Ok(());
                }
                let bytes = size_of(size)?;
                calls += 1;
                let mut p: sys::CUdeviceptr = 0;
                alloc(&mut p, bytes)?;
                *slot = p;
                Ok(())
            })(),
            Op::Free { id } => (|| -> Result<()> {
                let p = std::mem::take(live.slot(id)?);
                if p == 0 {
                    return Ok(());
                }
                calls += 1;
                free(p)
            })(),
        };
        if let Err(e) = r {
            outcome = failed(ops, i, e);
            break;
        }
        ops_run = i + 1;
        after(i, op)?;
    }
    Ok((outcome, ops_run, calls))
}

/// Replays `ops` on a fresh pool (see the [module documentation](self)).
///
/// Errors when there is no device or the pool cannot be created; a refused
/// allocation is an [`Outcome::Failed`] in the report.
pub fn replay_pool(ops: &Ops, options: &PoolOptions) -> Result<BaselineReport> {
    let (_ctx, stream) = context(options.ordinal)?;
    let g = granularity(options.ordinal)?;
    let cap = options.max_size_bytes.div_ceil(g).saturating_mul(g);
    let pool = Pool::create(options.ordinal, cap)?;
    let s = stream.cu_stream();
    let mut live = Live::new(ops.sizes.len(), Some(s));
    let mut reserved: Vec<(u64, u64)> = Vec::new();
    let mut last_reserved = 0u64;

    let t0 = Instant::now();
    let (outcome, ops_run, calls) = drive(
        ops,
        &mut live,
        |p, bytes| {
            // SAFETY: `p` is valid for the call, `pool` and the stream
            // are live and of the current context.
            let r = unsafe { sys::cuMemAllocFromPoolAsync(p, bytes, pool.raw, s) };
            check(r, "cuMemAllocFromPoolAsync")
        },
        |p| {
            // SAFETY: `p` came from cuMemAllocFromPoolAsync on this stream
            // and is freed once (`drive` cleared its slot).
            check(unsafe { sys::cuMemFreeAsync(p, s) }, "cuMemFreeAsync")
        },
        |i, op| {
            if options.record_reserved && matches!(op, Op::Alloc { .. }) {
                let now =
                    pool.attribute(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
                if now != last_reserved {
                    reserved.push((ops.event_index.get(i).copied().unwrap_or(i as u64), now));
                    last_reserved = now;
                }
            }
            Ok(())
        },
    )?;
    stream
        .synchronize()
        .map_err(driver_err("cuStreamSynchronize"))?;
    let wall_time = t0.elapsed();
    let peak_reserved_bytes =
        Some(pool.attribute(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?);
    let peak_used_bytes =
        Some(pool.attribute(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?);
    live.release();
    drop(live);
    drop(pool);
    Ok(BaselineReport {
        allocator: Baseline::Pool,
        capacity_bytes: (cap > 0).then_some(cap),
        outcome,
        ops_run,
        calls,
        wall_time,
        peak_reserved_bytes,
        peak_used_bytes,
        reserved,
    })
}

/// One trial of [`find_min_pool_capacity`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolTrial {
    /// The pool's `maxSize`.
    pub capacity_bytes: u64,
    /// The trace event where it failed (`None`: completed).
    pub failed_event: Option<u64>,
}

/// The smallest pool capacity found to complete a program.
#[derive(Debug, Clone)]
pub struct PoolMinCapacity {
    /// Smallest capacity that completed (a multiple of the granularity).
    pub capacity_bytes: u64,
    /// The largest capacity that failed (the search's lower end).
    pub failed_bytes: u64,
    /// Every replay the search ran, in order.
    pub trials: Vec<PoolTrial>,
    /// The replay at `capacity_bytes`.
    pub report: BaselineReport,
}

/// Searches for the smallest pool capacity that completes `ops`, to within
/// `tolerance_bytes` (raised to the allocation granularity).
///
/// `lower_bytes` must be a capacity below which no allocator can complete
/// (the peak of live bytes). The search tries it, then steps of
/// `tolerance_bytes` above it doubling until a replay completes, then
/// bisects. It assumes more capacity never hurts, and gives up (an
/// [`ToolError::Program`]) past 95% of the device's free memory.
pub fn find_min_pool_capacity(
    ops: &Ops,
    ordinal: usize,
    lower_bytes: u64,
    tolerance_bytes: u64,
) -> Result<PoolMinCapacity> {
    let (ctx, _stream) = context(ordinal)?;
    let g = granularity(ordinal)?;
    let (free, _total) = ctx.mem_get_info().map_err(driver_err("cuMemGetInfo"))?;
    let limit = (free as u64 / 20).saturating_mul(19) / g * g;
    let round = |b: u64| b.div_ceil(g).saturating_mul(g);
    let tol = round(tolerance_bytes.max(1));
    let mut trials = Vec::new();
    let run = |cap: u64| -> Result<BaselineReport> {
        let r = replay_pool(
            ops,
            &PoolOptions {
                ordinal,
                max_size_bytes: cap,
                record_reserved: false,
            },
        )?;
        trials.push(PoolTrial {
            capacity_bytes: cap,
            failed_event: r.failed_event(),
        });
        Ok(r)
    };
    let found = search_capacity(
        Search {
            lower: round(lower_bytes.max(1)),
            step: tol,
            granule: g,
            tolerance: tol,
            limit,
        },
        run,
        BaselineReport::completed,
        |failed, _| {
            ToolError::Program {
            reason: format!(
                "the pool did not complete at any capacity up to {failed} B (95% of free device memory)"
            ),
        }
        },
    )?;
    Ok(PoolMinCapacity {
        capacity_bytes: found.ok,
        failed_bytes: found.failed,
        trials,
        report: found.report,
    })
}

/// Replays `ops` with `cuMemAlloc` / `cuMemFree` per tensor on device
/// `ordinal`, uncapped: the cost of going to the driver for every tensor.
pub fn replay_cu_mem_alloc(ops: &Ops, ordinal: usize) -> Result<BaselineReport> {
    let (ctx, _stream) = context(ordinal)?;
    let mut live = Live::new(ops.sizes.len(), None);
    let t0 = Instant::now();
    let (outcome, ops_run, calls) = drive(
        ops,
        &mut live,
        |p, bytes| {
            // SAFETY: `p` is valid for the call; the context is current.
            check(unsafe { sys::cuMemAlloc_v2(p, bytes) }, "cuMemAlloc")
        },
        |p| {
            // SAFETY: `p` came from cuMemAlloc and is freed once (`drive`
            // cleared its slot); nothing uses it.
            check(unsafe { sys::cuMemFree_v2(p) }, "cuMemFree")
        },
        |_, _| Ok(()),
    )?;
    ctx.synchronize().map_err(driver_err("cuCtxSynchronize"))?;
    let wall_time = t0.elapsed();
    live.release();
    Ok(BaselineReport {
        allocator: Baseline::CuMemAlloc,
        capacity_bytes: None,
        outcome,
        ops_run,
        calls,
        wall_time,
        peak_reserved_bytes: None,
        peak_used_bytes: None,
        reserved: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_read_their_outcome() {
        let r = BaselineReport {
            allocator: Baseline::Pool,
            capacity_bytes: Some(1 << 21),
            outcome: Outcome::Failed {
                op: 3,
                event: 7,
                error: Error::ZeroSize.into(),
            },
            ops_run: 3,
            calls: 3,
            wall_time: Duration::from_micros(3),
            peak_reserved_bytes: None,
            peak_used_bytes: None,
            reserved: Vec::new(),
        };
        assert!(!r.completed());
        assert_eq!(r.failed_event(), Some(7));
        assert_eq!(r.time_per_op(), Duration::from_micros(1));
        assert!(Baseline::Pool.label().contains("pool"));
    }

    /// Without a driver every entry point says so instead of panicking.
    #[test]
    fn no_device_is_an_error_not_a_panic() {
        if CudaBackend::available().is_ok() {
            println!("skipped: a GPU is present");
            return;
        }
        let ops = Ops::from_ops([Op::Alloc { id: 0, size: 10 }]);
        assert!(matches!(
            replay_pool(&ops, &PoolOptions::default()),
            Err(ToolError::Arena(Error::Backend(
                BackendError::NoDevice { .. }
            )))
        ));
        assert!(matches!(
            replay_cu_mem_alloc(&ops, 0),
            Err(ToolError::Arena(Error::Backend(
                BackendError::NoDevice { .. }
            )))
        ));
        assert!(matches!(
            pool_granularity(0),
            Err(ToolError::Arena(Error::Backend(
                BackendError::NoDevice { .. }
            )))
        ));
    }
}
