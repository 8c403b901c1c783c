//! What the GPU tests and benches share beyond the GPU check: a kernel
//! that holds a stream until the host opens it ([`Gate`]), a timer on CUDA
//! events ([`EventTimer`]), `cuMemcpyDtoDAsync` inside a backend's region
//! (the baseline of the move benches), and a CUDA arena that skips where
//! no GPU is usable ([`gpu_arena`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cuarena::backend::cuda::cudarc::driver::{
    result, sys, CudaEvent, CudaFunction, CudaModule, CudaStream,
};
use cuarena::backend::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use cuarena::backend::cuda::CudaBackend;
use cuarena::{Arena, ArenaConfig, Result};

use crate::gpu::cuda::{driver_err, gpu_available, load_kernels, TESTING_CU};
use crate::median;

/// A CUDA arena of `config` on device 0, or `None` where no GPU is usable
/// (as [`gpu_available`]: a test asked for fails there, one that was not
/// skips).
pub fn gpu_arena(config: ArenaConfig) -> Option<Arena<CudaBackend>> {
    gpu_available().then(|| Arena::cuda(config, 0).expect("CUDA arena"))
}

/// The kernels of `crates/cuarena-testkit/kernels/testing.cu`, loaded for
/// `backend`.
pub fn test_module(backend: &CudaBackend) -> Arc<CudaModule> {
    load_kernels(
        backend,
        "crates/cuarena-testkit/kernels/testing.cu",
        TESTING_CU,
    )
    .unwrap_or_else(|e| panic!("crates/cuarena-testkit/kernels/testing.cu: {e}"))
}

/// The kernel `name` of `testing.cu` (see [`test_module`]).
pub fn test_kernel(backend: &CudaBackend, name: &str) -> CudaFunction {
    test_module(backend)
        .load_function(name)
        .unwrap_or_else(|e| panic!("testing.cu: {name}: {e}"))
}

/// A kernel (`test_gate` of `testing.cu`) that holds a stream until the
/// host opens it, or a timeout passes: work queued behind it waits, so a
/// call that returns while the gate is closed did not wait for queued work.
/// Dropping it opens it and waits for its stream.
#[derive(Debug)]
pub struct Gate {
    /// The flag the kernel polls: page-locked host memory mapped for the
    /// device.
    host: *mut u32,
    stream: Arc<CudaStream>,
    /// Recorded on the stream right after the kernel.
    passed: CudaEvent,
    /// The kernel (and its module) stays loaded until the stream is done.
    _kernel: CudaFunction,
}

impl Gate {
    /// How long a gate stays closed if nobody opens it.
    pub const TIMEOUT: Duration = Duration::from_secs(20);

    /// A closed gate on `backend`'s arena stream.
    pub fn hold(backend: &CudaBackend) -> Result<Gate> {
        Self::hold_stream(backend, backend.stream())
    }

    /// A closed gate on `stream` (of `backend`'s context).
    pub fn hold_stream(backend: &CudaBackend, stream: &Arc<CudaStream>) -> Result<Gate> {
        let f = test_kernel(backend, "test_gate");
        backend
            .context()
            .bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))?;
        // SAFETY: a page-locked allocation of 4 bytes, mapped for the
        // device; the context is current (bound above).
        let host = unsafe { result::malloc_host(4, sys::CU_MEMHOSTALLOC_DEVICEMAP) }
            .map_err(driver_err("cuMemHostAlloc"))?
            .cast::<u32>();
        // SAFETY: `host` points to 4 writable bytes, ours.
        unsafe { host.write_volatile(0) };
        let passed = backend
            .context()
            .new_event(None)
            .map_err(driver_err("cuEventCreate"))?;
        // From here on `Drop` frees `host` (after opening the gate).
        let gate = Gate {
            host,
            stream: Arc::clone(stream),
            passed,
            _kernel: f.clone(),
        };
        let mut device = 0;
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) }
            .result()
            .map_err(driver_err("cuMemHostGetDevicePointer"))?;
        let timeout_ns = u64::try_from(Self::TIMEOUT.as_nanos()).unwrap_or(u64::MAX);
        let mut b = stream.launch_builder(&f);
        b.arg(&device).arg(&timeout_ns);
        let one = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: test_gate(const u32*, u64) only reads the flag, which
        // lives until `Drop` has waited for the stream.
        unsafe { b.launch(one) }.map_err(driver_err("cuLaunchKernel"))?;
        gate.passed
            .record(stream)
            .map_err(driver_err("cuEventRecord"))?;
        Ok(gate)
    }

    /// True while the work queued behind the gate has not started: the
    /// gate is closed (and its timeout has not passed).
    pub fn closed(&self) -> Result<bool> {
        let done = self
            .passed
            .try_is_complete()
            .map_err(driver_err("cuEventQuery"))?;
        Ok(!done)
    }

    /// Lets the kernel finish.
    pub fn open(&self) {
        // SAFETY: `host` is live until drop; the kernel only reads it.
        unsafe { self.host.write_volatile(1) };
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
        // The kernel must be done with the flag before it is freed.
        let _ = self.stream.synchronize();
        // SAFETY: from cuMemHostAlloc in `hold_stream`; the stream that
        // read it is idle.
        let _ = unsafe { result::free_host(self.host.cast()) };
    }
}

/// Medians of CUDA-event times on one stream (a warm-up call first).
#[derive(Debug)]
pub struct EventTimer {
    stream: Arc<CudaStream>,
    start: CudaEvent,
    end: CudaEvent,
    reps: usize,
}

impl EventTimer {
    /// A timer of `reps` repetitions on `backend`'s arena stream.
    pub fn new(backend: &CudaBackend, reps: usize) -> Result<Self> {
        let ctx = backend.context();
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let err = driver_err("cuEventCreate");
        Ok(Self {
            stream: backend.stream().clone(),
            start: ctx.new_event(flags).map_err(&err)?,
            end: ctx.new_event(flags).map_err(&err)?,
            reps: reps.max(1),
        })
    }

    /// Median milliseconds of `f` between events recorded before and
    /// after it (so host work inside `f` counts too), after one warm-up.
    pub fn median_ms(&self, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        let drv = driver_err("event");
        f()?;
        self.stream.synchronize().map_err(&drv)?;
        let mut times = Vec::with_capacity(self.reps);
        for _ in 0..self.reps {
            self.start.record(&self.stream).map_err(&drv)?;
            f()?;
            self.end.record(&self.stream).map_err(&drv)?;
            self.end.synchronize().map_err(&drv)?;
            times.push(f64::from(self.start.elapsed_ms(&self.end).map_err(&drv)?));
        }
        Ok(median(&mut times))
    }

    /// Median (device ms, host ms) of `f` when the stream is kept busy by
    /// `block` while the host runs `f`: the device time then excludes the
    /// host's work, and the host time is what `f` costs the caller.
    pub fn split_ms(
        &self,
        mut block: impl FnMut() -> Result<()>,
        mut f: impl FnMut() -> Result<()>,
    ) -> Result<(f64, f64)> {
        let drv = driver_err("event");
        f()?;
        self.stream.synchronize().map_err(&drv)?;
        let (mut dev, mut host) = (Vec::new(), Vec::new());
        for _ in 0..self.reps {
            block()?;
            self.start.record(&self.stream).map_err(&drv)?;
            let t = Instant::now();
            f()?;
            host.push(t.elapsed().as_secs_f64() * 1e3);
            self.end.record(&self.stream).map_err(&drv)?;
            self.end.synchronize().map_err(&drv)?;
            dev.push(f64::from(self.start.elapsed_ms(&self.end).map_err(&drv)?));
        }
        Ok((median(&mut dev), median(&mut host)))
    }
}

/// `cuMemcpyDtoDAsync` of each `(src, dst, len)` (offsets into `backend`'s
/// region) on its arena stream: the baseline of the move benches.
///
/// Panics unless every range lies in the region's accessible bytes
/// (`capacity_bytes`) and the two ranges of a copy do not overlap: the
/// driver would otherwise touch memory that is not ours.
pub fn memcpy_in_region(backend: &CudaBackend, copies: &[(u64, u64, u64)]) -> Result<()> {
    use cuarena::backend::Backend;
    let (base, cap) = (backend.region_ptr(), backend.capacity_bytes());
    let stream = backend.stream().cu_stream();
    for &(s, d, n) in copies {
        let inside = |o: u64| o.checked_add(n).is_some_and(|e| e <= cap);
        assert!(
            inside(s) && inside(d),
            "copy {s}+{n} -> {d} outside {cap} B"
        );
        assert!(s + n <= d || d + n <= s, "copy {s}+{n} -> {d} overlaps");
        // SAFETY: both ranges lie in the region's accessible bytes and do
        // not overlap (asserted above); the stream keeps order with the
        // arena's own work.
        unsafe { result::memcpy_dtod_async(base + d, base + s, n as usize, stream) }
            .map_err(driver_err("cuMemcpyDtoDAsync"))?;
    }
    Ok(())
}

/// Fills `backend`'s accessible bytes (`capacity_bytes`, a multiple of 4)
/// with `word` on its arena stream: benches never time on zeros.
pub fn fill_region(backend: &CudaBackend, word: u32) -> Result<()> {
    use cuarena::backend::Backend;
    let words = usize::try_from(backend.capacity_bytes() / 4).unwrap_or(usize::MAX);
    // SAFETY: `words` 4-byte words from the region's base lie in its
    // accessible bytes, on the stream that orders every use of them.
    unsafe {
        sys::cuMemsetD32Async(
            backend.region_ptr(),
            word,
            words,
            backend.stream().cu_stream(),
        )
    }
    .result()
    .map_err(driver_err("cuMemsetD32Async"))
}
