//! Pattern fill and check kernels for the GPU trace replay
//! ([`crate::gpu::replay`]), from `kernels/pattern.cu`.
//!
//! Word `w` of a tensor with id `id` holds a hash of `(id, w)`: the pattern
//! depends on the position inside the tensor, so a correct move keeps it,
//! and on the id, so a wrong block or a stale copy does not pass. Fills and
//! checks run on the arena stream, so they are ordered with the arena's own
//! compactions (the stream contract of
//! [`Arena<CudaBackend>`](cuarena::Arena#impl-Arena<CudaBackend>)), and are
//! launched through addresses the arena itself resolved for a live block.
//!
//! The module is compiled with the core's NVRTC path
//! ([`cuarena::backend::cuda::compile`], once per process and
//! architecture) and loaded into the backend's context.

use std::sync::Arc;

use cuarena::backend::cuda::cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use cuarena::backend::cuda::cudarc::nvrtc::Ptx;

use super::driver_err;
use crate::{Result, ToolError};
use cuarena::backend::cuda::CudaBackend;
use cuarena::Arena;
use cuarena::Handle;

/// Name used in [`cuarena::BackendError::Nvrtc`] for these kernels.
pub const PATTERN_SOURCE_NAME: &str = "kernels/pattern.cu";
const PATTERN_SOURCE: &str = include_str!("../../kernels/pattern.cu");

/// Threads per CTA of the fill and check kernels.
const THREADS: u32 = 256;

/// Which bytes of a tensor a check reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckRange {
    /// Every byte.
    Full,
    /// The first and the last `n` bytes (every byte when the tensor holds
    /// at most `2 n`), rounded out to 16-byte vectors.
    Edges(u64),
}

impl CheckRange {
    /// Bytes of a `len`-byte tensor this range reads (before rounding to
    /// 16-byte vectors).
    pub fn bytes_of(self, len: u64) -> u64 {
        match self {
            CheckRange::Full => len,
            CheckRange::Edges(n) => len.min(n.saturating_mul(2)),
        }
    }

    /// `(head, tail)` as the check kernel takes them: vectors below `head`
    /// and above `tail`; `head >= tail` means all.
    fn head_tail(self, len: u64) -> (u64, u64) {
        match self {
            CheckRange::Edges(n) if n.saturating_mul(2) < len => (n, len - n),
            _ => (len, len),
        }
    }
}

/// Compiles `kernels/pattern.cu` for `arch` (`sm_90`) to machine code, or
/// takes it from the core's cache. Needs NVRTC but no device.
pub fn compile(arch: &str) -> Result<Ptx> {
    let image = cuarena::backend::cuda::compile(
        PATTERN_SOURCE_NAME,
        PATTERN_SOURCE,
        arch,
        &["--std=c++17"],
    )?;
    Ok(image)
}

/// The pattern kernels loaded for one arena, with their device counters.
///
/// Launches go to the stream given at load (the arena stream); the counters
/// (mismatching words, first failing tag) live on the device and are read
/// by [`mismatches`](PatternKernels::mismatches), which waits for the
/// stream.
#[derive(Debug)]
pub struct PatternKernels {
    _module: Arc<CudaModule>,
    fill_fn: CudaFunction,
    check_fn: CudaFunction,
    delay_fn: CudaFunction,
    stream: Arc<CudaStream>,
    /// `[mismatching words, first failing tag (low 32 bits)]`.
    counters: CudaSlice<u64>,
    bad_ptr: u64,
    tag_ptr: u64,
    max_grid: u32,
}

impl PatternKernels {
    /// Compiles (once) and loads the kernels into `backend`'s context; they
    /// run on its arena stream.
    pub fn load(backend: &CudaBackend) -> Result<Self> {
        let ptx = compile(backend.arch())?;
        let ctx = backend.context();
        ctx.bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))?;
        let module = ctx
            .load_module(ptx)
            .map_err(driver_err("cuModuleLoadData"))?;
        let function = |name: &str| {
            module
                .load_function(name)
                .map_err(driver_err("cuModuleGetFunction"))
        };
        let stream = backend.stream().clone();
        let counters = stream
            .clone_htod(&[0u64, u64::from(u32::MAX)])
            .map_err(driver_err("cuMemcpyHtoDAsync"))?;
        let bad_ptr = {
            let (p, _record) = counters.device_ptr(&stream);
            p
        };
        Ok(Self {
            fill_fn: function("pattern_fill")?,
            check_fn: function("pattern_check")?,
            delay_fn: function("pattern_delay")?,
            _module: module,
            stream,
            counters,
            bad_ptr,
            tag_ptr: bad_ptr + 8,
            max_grid: backend.sm_count().saturating_mul(8).max(1),
        })
    }

    fn config(&self, bytes: u64) -> LaunchConfig {
        let vectors = bytes.div_ceil(16).max(1);
        let ctas = vectors.div_ceil(u64::from(THREADS));
        LaunchConfig {
            grid_dim: (ctas.clamp(1, u64::from(self.max_grid)) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The address and size of live block `h` of `arena`, which must be the
    /// arena these kernels were loaded for.
    fn block(&self, arena: &Arena<CudaBackend>, h: Handle) -> Result<(u64, u64)> {
        if !Arc::ptr_eq(arena.backend().stream(), &self.stream) {
            return Err(ToolError::Usage {
                reason: "pattern kernels used with an arena they were not loaded for".to_owned(),
            });
        }
        let offset = arena.resolve(h)?;
        let len = arena.info(h)?.size_bytes;
        Ok((arena.backend().region_ptr() + offset, len))
    }

    /// Enqueues the fill of block `h` with the pattern of `id`.
    pub fn fill(&self, arena: &Arena<CudaBackend>, h: Handle, id: u32) -> Result<()> {
        let (ptr, len) = self.block(arena, h)?;
        let cfg = self.config(len);
        let mut b = self.stream.launch_builder(&self.fill_fn);
        b.arg(&ptr).arg(&len).arg(&id);
        // SAFETY: `pattern_fill(u8*, u64, u32)` writes exactly [ptr, ptr +
        // len): the bytes of live block `h`, resolved by the arena just now
        // (`block` checked that the arena is the one whose stream this is).
        // The launch is on the arena stream, so it runs after every earlier
        // move of the block and before any later move or reuse of its bytes.
        unsafe { b.launch(cfg) }.map_err(driver_err("cuLaunchKernel(pattern_fill)"))?;
        Ok(())
    }

    /// Enqueues a check of `range` of block `h` against the pattern of
    /// `id`; a mismatch adds to the counters, and `tag` (an op index, say)
    /// becomes the first failing tag if it is the smallest so far.
    pub fn check(
        &self,
        arena: &Arena<CudaBackend>,
        h: Handle,
        id: u32,
        range: CheckRange,
        tag: u32,
    ) -> Result<()> {
        let (ptr, len) = self.block(arena, h)?;
        let (head, tail) = range.head_tail(len);
        let cfg = self.config(range.bytes_of(len));
        let mut b = self.stream.launch_builder(&self.check_fn);
        b.arg(&ptr)
            .arg(&len)
            .arg(&id)
            .arg(&head)
            .arg(&tail)
            .arg(&tag)
            .arg(&self.bad_ptr)
            .arg(&self.tag_ptr);
        // SAFETY: `pattern_check(const u8*, u64, u32, u64, u64, u32, u64*,
        // u32*)` reads only [ptr, ptr + len), the bytes of live block `h`
        // (resolved by its arena just now, and ordered on its stream as in
        // `fill`), and atomically updates the two counter words, which
        // `self.counters` owns for as long as `self` lives.
        unsafe { b.launch(cfg) }.map_err(driver_err("cuLaunchKernel(pattern_check)"))?;
        Ok(())
    }

    /// Enqueues a kernel that keeps the stream busy for `ns` nanoseconds
    /// (one thread polling the global timer).
    pub fn delay(&self, ns: u64) -> Result<()> {
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.delay_fn);
        b.arg(&ns);
        // SAFETY: `pattern_delay(u64)` touches no memory.
        unsafe { b.launch(cfg) }.map_err(driver_err("cuLaunchKernel(pattern_delay)"))?;
        Ok(())
    }

    /// Waits for the stream and returns the mismatching words counted so
    /// far and the smallest tag of a failing check (`None`: none failed).
    pub fn mismatches(&self) -> Result<(u64, Option<u32>)> {
        let got = self
            .stream
            .clone_dtoh(&self.counters)
            .map_err(driver_err("cuMemcpyDtoHAsync"))?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        let bad = got.first().copied().unwrap_or(0);
        let tag = got.get(1).map_or(u32::MAX, |&t| t as u32);
        Ok((bad, (tag != u32::MAX).then_some(tag)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_ranges() {
        assert_eq!(CheckRange::Full.head_tail(100), (100, 100));
        assert_eq!(CheckRange::Edges(64).head_tail(100), (100, 100));
        assert_eq!(CheckRange::Edges(64).head_tail(1000), (64, 936));
        assert_eq!(CheckRange::Edges(64).bytes_of(1000), 128);
        assert_eq!(CheckRange::Edges(64).bytes_of(100), 100);
        assert_eq!(CheckRange::Full.bytes_of(7), 7);
    }

    /// Compiles the kernels when NVRTC can be loaded (no device needed);
    /// skips otherwise.
    #[test]
    fn kernels_compile_where_nvrtc_is_present() {
        // SAFETY: only tries to open the NVRTC library.
        if !unsafe { cuarena::backend::cuda::cudarc::nvrtc::sys::is_culib_present() } {
            println!("skipped: no NVRTC library");
            return;
        }
        if let Err(e) = compile("sm_90") {
            panic!("{e}");
        }
    }
}
