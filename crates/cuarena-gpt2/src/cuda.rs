//! The loop on CUDA: `gpt2.cu` compiled with NVRTC, GEMMs through cuBLAS,
//! every buffer either an arena block ([`Mem::Arena`]) or a plain cudarc
//! allocation ([`Mem::Plain`], stream-ordered `cuMemAllocAsync`): the same
//! loop, launches and GEMMs on one stream, so the difference in speed is the
//! arena's whole cost (handles, views, compaction).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cuarena::backend::cuda::cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
#[cfg(feature = "nccl")]
use cuarena::backend::cuda::nccl::{Communicator, ReduceOp};
use cuarena::backend::cuda::{compile, CudaBackend, HostStats};
use cuarena::{Arena, ArenaConfig, Handle, Stats, StreamId};
#[cfg(feature = "nccl")]
use cuarena::{AsRange, BlockRange};
use cudarc::cublas::{result as blas, sys as bsys, CudaBlas};

use crate::dev::{Ab, Arg, Cfg, Dev, Gemm, Kernel, Ptr, Table, Tid, WORKSPACE};
use crate::Res;

const SOURCE: &str = include_str!("gpt2.cu");

/// Where the buffers live.
pub enum Mem {
    /// Arena blocks; the workspace block is pinned (cuBLAS keeps its address).
    Arena {
        arena: Box<Arena<CudaBackend>>,
        bufs: Table<(Handle, u64)>,
    },
    /// One cudarc allocation per buffer; the workspace is the first.
    Plain {
        _ctx: Arc<CudaContext>,
        bufs: Table<CudaSlice<u8>>,
    },
}

/// The device side of the loop. Field order is drop order: cuBLAS goes
/// before the memory its workspace lives in.
pub struct Cuda {
    blas: CudaBlas,
    /// Data parallel: this rank's communicator, its stream registered with
    /// the arena (gradient buckets are all-reduced there while the backward
    /// pass goes on on the arena stream).
    #[cfg(feature = "nccl")]
    ddp: Option<Ddp>,
    /// Host time spent in each kind of call, and how many calls.
    pub host: HostTime,
    funcs: Vec<CudaFunction>,
    stream: Arc<CudaStream>,
    pub mem: Mem,
}

impl Cuda {
    /// The arena of `capacity` bytes on device `ordinal`.
    pub fn arena(ordinal: usize, capacity: u64) -> Res<Self> {
        Self::on_arena(ordinal, ArenaConfig::new(capacity))
    }

    /// An elastic arena on device `ordinal`: no capacity given, memory
    /// mapped as the blocks need it and given back by the automatic trim
    /// (its default window).
    pub fn elastic(ordinal: usize) -> Res<Self> {
        Self::on_arena(ordinal, ArenaConfig::elastic())
    }

    fn on_arena(ordinal: usize, config: ArenaConfig) -> Res<Self> {
        let arena = Arena::cuda(config, ordinal)?;
        let ctx = arena.backend().context().clone();
        let stream = arena.backend().stream().clone();
        let arch = arena.backend().arch().to_owned();
        Self::build(
            &ctx,
            stream,
            &arch,
            Mem::Arena {
                arena: Box::new(arena),
                bufs: Table::default(),
            },
        )
    }

    /// Plain cudarc allocations on device 0, on a stream of their own.
    pub fn plain() -> Res<Self> {
        let ctx = CudaContext::new(0)?;
        // One stream and raw addresses: cudarc's per-allocation events would
        // order nothing here and cost a record per use.
        // SAFETY: every buffer is used on `stream` only, so no cross-stream
        // ordering is lost by turning the tracking off.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let (major, minor) = ctx.compute_capability()?;
        let arch = format!("sm_{major}{minor}");
        Self::build(
            &ctx.clone(),
            stream,
            &arch,
            Mem::Plain {
                _ctx: ctx,
                bufs: Table::default(),
            },
        )
    }

    fn build(ctx: &Arc<CudaContext>, stream: Arc<CudaStream>, arch: &str, mem: Mem) -> Res<Self> {
        let image = compile("gpt2.cu", SOURCE, arch, &["--std=c++17"])?;
        let module = ctx.load_module(image)?;
        let funcs = Kernel::NAMES
            .iter()
            .map(|n| module.load_function(n))
            .collect::<Result<Vec<_>, _>>()?;
        let blas = CudaBlas::new(stream.clone())?;
        let mut me = Self {
            blas,
            #[cfg(feature = "nccl")]
            ddp: None,
            host: HostTime::default(),
            funcs,
            stream,
            mem,
        };
        let workspace = me.alloc(WORKSPACE)?;
        let addr = match &mut me.mem {
            Mem::Arena { arena, bufs } => {
                let h = bufs.get(workspace)?.0;
                arena.pin(h)?;
                let mut args = arena.kernel_args(StreamId::ARENA)?;
                let view = args.output::<u8>(h)?;
                view.device_address()
            }
            Mem::Plain { bufs, .. } => bufs.get(workspace)?.device_ptr(&me.stream).0,
        };
        // SAFETY: the workspace is WORKSPACE bytes of device memory that
        // stays at this address until `me` is dropped (pinned in the arena,
        // never freed as a plain buffer), and the handle is destroyed first
        // (field order). cuBLAS uses it on the handle's stream only.
        let st = unsafe {
            bsys::cublasSetWorkspace_v2(*me.blas.handle(), addr as *mut _, WORKSPACE as usize)
        };
        if st != bsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(format!("cublasSetWorkspace_v2 failed: {st:?}").into());
        }
        Ok(me)
    }

    /// What the arena's CUDA backend cost the host since it was made, and
    /// whether its device scratch had to grow (None on plain allocations).
    pub fn backend_stats(&self) -> Option<HostStats> {
        match &self.mem {
            Mem::Arena { arena, .. } => Some(arena.backend().host_stats()),
            Mem::Plain { .. } => None,
        }
    }

    /// Data parallel: waits for this rank's collectives with the
    /// communicator's timeout before the host waits on the loop's stream
    /// (which waits for them): a peer that failed then ends this rank with
    /// an error instead of a wait without end.
    fn peers_done(&self) -> Res<()> {
        #[cfg(feature = "nccl")]
        if let Some(ddp) = &self.ddp {
            ddp.comm.synchronize()?;
        }
        Ok(())
    }

    /// Makes this device a rank of `comm` (its stream is on this device).
    #[cfg(feature = "nccl")]
    pub fn attach(&mut self, comm: Communicator) -> Res<()> {
        let Mem::Arena { arena, .. } = &mut self.mem else {
            return Err("data parallel runs use the arena".into());
        };
        let stream = comm.stream().clone();
        let id = arena.register_stream(stream.clone())?;
        self.ddp = Some(Ddp { comm, id, stream });
        Ok(())
    }

    /// Device addresses of the distinct buffers in `ptrs` (written ones as
    /// outputs), resolved after the last call that could move anything,
    /// then `f` with them. On the arena the views borrow it until `f`
    /// returns, so the addresses cannot go stale while `f` enqueues work.
    fn with_addrs<R>(
        &mut self,
        ptrs: &[(Ptr, bool)],
        f: impl FnOnce(&Arc<CudaStream>, &dyn Fn(Ptr) -> u64) -> Res<R>,
    ) -> Res<R> {
        let mut distinct: Vec<(Tid, bool, u64)> = Vec::with_capacity(ptrs.len());
        for &(p, w) in ptrs {
            match distinct.iter_mut().find(|d| d.0 == p.t) {
                Some(d) => d.1 |= w,
                None => distinct.push((p.t, w, 0)),
            }
        }
        match &mut self.mem {
            Mem::Arena { arena, bufs } => {
                let mut args = arena.kernel_args(StreamId::ARENA)?;
                for d in &mut distinct {
                    let &(h, size) = bufs.get(d.0)?;
                    check_offsets(ptrs, d.0, size)?;
                    d.2 = if d.1 {
                        args.output::<u8>(h)?.device_address()
                    } else {
                        args.input::<u8>(h)?.device_address()
                    };
                }
                let addr = |p: Ptr| base(&distinct, p.t) + p.off;
                f(args.stream(), &addr)
            }
            Mem::Plain { bufs, .. } => {
                for d in &mut distinct {
                    let s = bufs.get(d.0)?;
                    check_offsets(ptrs, d.0, s.len() as u64)?;
                    d.2 = s.device_ptr(&self.stream).0;
                }
                let addr = |p: Ptr| base(&distinct, p.t) + p.off;
                f(&self.stream, &addr)
            }
        }
    }
}

#[cfg(feature = "nccl")]
pub struct Ddp {
    comm: Communicator,
    id: StreamId,
    stream: Arc<CudaStream>,
}

/// `len` bytes at `off` in a block: a gradient bucket in the flat buffer.
#[cfg(feature = "nccl")]
struct Sub {
    h: Handle,
    off: u64,
    len: u64,
}

#[cfg(feature = "nccl")]
impl AsRange for Sub {
    fn block_range(&self) -> BlockRange {
        BlockRange {
            handle: Some(self.h),
            offset_bytes: self.off,
            len_bytes: Some(self.len),
            dtype: None,
        }
    }
}

/// Where the host's time goes: per kind of call, total time and count
/// (launch, gemm, alloc, free, upload).
#[derive(Debug, Default, Clone)]
pub struct HostTime {
    pub calls: [(Duration, u64); 5],
}

impl HostTime {
    pub const KINDS: [&'static str; 5] = ["launch", "gemm", "alloc", "free", "upload"];

    fn add(&mut self, kind: usize, since: Instant) {
        let c = &mut self.calls[kind];
        c.0 += since.elapsed();
        c.1 += 1;
    }
}

fn base(distinct: &[(Tid, bool, u64)], t: Tid) -> u64 {
    distinct.iter().find(|d| d.0 == t).map_or(0, |d| d.2)
}

fn check_offsets(ptrs: &[(Ptr, bool)], t: Tid, size: u64) -> Res<()> {
    for (p, _) in ptrs.iter().filter(|p| p.0.t == t) {
        if p.off >= size {
            return Err(format!("offset {} past buffer {t} of {size} bytes", p.off).into());
        }
    }
    Ok(())
}

fn cint(x: usize) -> Res<i32> {
    Ok(i32::try_from(x).map_err(|_| format!("GEMM dimension {x} does not fit cuBLAS's int"))?)
}

/// The calls themselves; [`Dev`] times them.
impl Cuda {
    fn do_alloc(&mut self, bytes: u64) -> Res<Tid> {
        match &mut self.mem {
            Mem::Arena { arena, bufs } => {
                let h = arena.alloc(bytes)?;
                Ok(bufs.insert((h, bytes)))
            }
            Mem::Plain { bufs, .. } => {
                // SAFETY: the loop writes every buffer before reading it,
                // as it does in the arena (whose blocks are not zeroed).
                let s = unsafe { self.stream.alloc::<u8>(usize::try_from(bytes)?) }?;
                Ok(bufs.insert(s))
            }
        }
    }

    fn do_free(&mut self, t: Tid) -> Res<()> {
        match &mut self.mem {
            Mem::Arena { arena, bufs } => Ok(arena.free(bufs.take(t)?.0)?),
            Mem::Plain { bufs, .. } => {
                drop(bufs.take(t)?); // cuMemFreeAsync on the stream
                Ok(())
            }
        }
    }

    fn do_launch(&mut self, k: Kernel, cfg: Cfg, args: &[Arg]) -> Res<()> {
        let ptrs: Vec<(Ptr, bool)> = args
            .iter()
            .filter_map(|a| match *a {
                Arg::R(p) => Some((p, false)),
                Arg::W(p) => Some((p, true)),
                _ => None,
            })
            .collect();
        let func = &self.funcs[k as usize];
        let lc = LaunchConfig {
            grid_dim: cfg.grid,
            block_dim: cfg.block,
            shared_mem_bytes: cfg.shmem,
        };
        // The builder keeps references: the values live in these vectors.
        let mut u = Vec::with_capacity(args.len());
        let mut i = Vec::with_capacity(args.len());
        let mut f = Vec::with_capacity(args.len());
        let funcs_ptr = func.clone();
        self.with_addrs(&ptrs, |stream, addr| {
            for a in args {
                match *a {
                    Arg::R(p) | Arg::W(p) => u.push(addr(p)),
                    Arg::U(x) => u.push(x),
                    Arg::I(x) => i.push(x),
                    Arg::F(x) => f.push(x),
                }
            }
            let mut b = stream.launch_builder(&funcs_ptr);
            let (mut iu, mut ii, mut iff) = (0, 0, 0);
            for a in args {
                match a {
                    Arg::R(_) | Arg::W(_) | Arg::U(_) => {
                        b.arg(&u[iu]);
                        iu += 1;
                    }
                    Arg::I(_) => {
                        b.arg(&i[ii]);
                        ii += 1;
                    }
                    Arg::F(_) => {
                        b.arg(&f[iff]);
                        iff += 1;
                    }
                }
            }
            // SAFETY: every launch in `train.rs` and `layers.rs` passes its kernel's C
            // arguments in order and type (pointers as 64-bit addresses,
            // int as i32, float as f32, sizes as u64), with buffers at
            // least as large as the kernel touches for the dimensions
            // given (the loop allocates them from the same dimensions);
            // the addresses are current (see `with_addrs`), and the launch
            // is on the stream they were taken for.
            unsafe { b.launch(lc) }?;
            Ok(())
        })
    }

    fn do_gemm(&mut self, g: &Gemm) -> Res<()> {
        let ptrs = [(g.a, false), (g.b, false), (g.c, true)];
        let (m, n, k) = (cint(g.m)?, cint(g.n)?, cint(g.k)?);
        let (lda, ldb, ldc, batch) = (cint(g.lda)?, cint(g.ldb)?, cint(g.ldc)?, cint(g.batch)?);
        let op = |t: bool| {
            if t {
                bsys::cublasOperation_t::CUBLAS_OP_T
            } else {
                bsys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let ab = match g.ab {
            Ab::F32 => bsys::cudaDataType::CUDA_R_32F,
            Ab::Bf16 => bsys::cudaDataType::CUDA_R_16BF,
        };
        let handle = *self.blas.handle();
        let (alpha, beta) = (g.alpha, g.beta);
        self.with_addrs(&ptrs, |_, addr| {
            let (a, b, c) = (addr(g.a), addr(g.b), addr(g.c));
            // SAFETY: the handle's stream is the stream the addresses were
            // taken for (the arena's, or the plain stream); A, B and C hold
            // the elements the dimensions, leading dimensions and strides
            // reach (the loop allocates them from the same shapes); C
            // aliases neither A nor B; alpha and beta are host scalars
            // (cuBLAS's default pointer mode) living across the call.
            unsafe {
                if g.batch == 1 {
                    blas::gemm_ex(
                        handle,
                        op(g.ta),
                        op(g.tb),
                        m,
                        n,
                        k,
                        (&alpha as *const f32).cast(),
                        a as *const _,
                        ab,
                        lda,
                        b as *const _,
                        ab,
                        ldb,
                        (&beta as *const f32).cast(),
                        c as *mut _,
                        bsys::cudaDataType::CUDA_R_32F,
                        ldc,
                        bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )?;
                } else {
                    blas::gemm_strided_batched_ex(
                        handle,
                        op(g.ta),
                        op(g.tb),
                        m,
                        n,
                        k,
                        (&alpha as *const f32).cast(),
                        a as *const _,
                        ab,
                        lda,
                        g.sa as i64,
                        b as *const _,
                        ab,
                        ldb,
                        g.sb as i64,
                        (&beta as *const f32).cast(),
                        c as *mut _,
                        bsys::cudaDataType::CUDA_R_32F,
                        ldc,
                        g.sc as i64,
                        batch,
                        bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )?;
                }
            }
            Ok(())
        })
    }

    fn do_upload(&mut self, t: Tid, data: &[u8]) -> Res<()> {
        match &mut self.mem {
            Mem::Arena { arena, bufs } => {
                let h = bufs.get(t)?.0;
                Ok(arena.write_bytes(h, data)?)
            }
            Mem::Plain { bufs, .. } => {
                let mut dst = bufs.get_mut(t)?.slice_mut(..data.len());
                self.stream.memcpy_htod(data, &mut dst)?;
                Ok(())
            }
        }
    }
}

impl Dev for Cuda {
    fn alloc(&mut self, bytes: u64) -> Res<Tid> {
        let t0 = Instant::now();
        let r = self.do_alloc(bytes);
        self.host.add(2, t0);
        r
    }

    fn free(&mut self, t: Tid) -> Res<()> {
        let t0 = Instant::now();
        let r = self.do_free(t);
        self.host.add(3, t0);
        r
    }

    fn launch(&mut self, k: Kernel, cfg: Cfg, args: &[Arg]) -> Res<()> {
        let t0 = Instant::now();
        let r = self.do_launch(k, cfg, args);
        self.host.add(0, t0);
        r
    }

    fn gemm(&mut self, g: &Gemm) -> Res<()> {
        let t0 = Instant::now();
        let r = self.do_gemm(g);
        self.host.add(1, t0);
        r
    }

    fn upload(&mut self, t: Tid, data: &[u8]) -> Res<()> {
        let t0 = Instant::now();
        let r = self.do_upload(t, data);
        self.host.add(4, t0);
        r
    }

    fn download(&mut self, t: Tid) -> Res<Vec<u8>> {
        self.peers_done()?;
        match &mut self.mem {
            Mem::Arena { arena, bufs } => Ok(arena.read_bytes(bufs.get(t)?.0)?),
            Mem::Plain { bufs, .. } => Ok(self.stream.clone_dtoh(bufs.get(t)?)?),
        }
    }

    fn sync(&mut self) -> Res<()> {
        self.peers_done()?;
        Ok(self.stream.synchronize()?)
    }

    fn stats(&self) -> Option<Stats> {
        match &self.mem {
            Mem::Arena { arena, .. } => Some(arena.stats()),
            Mem::Plain { .. } => None,
        }
    }

    #[cfg(feature = "nccl")]
    fn reduce(&mut self, p: Ptr, elems: usize) -> Res<()> {
        let (Some(ddp), Mem::Arena { arena, bufs }) = (&self.ddp, &mut self.mem) else {
            return Ok(());
        };
        // The communication stream waits for the backward pass so far (a
        // stream wait, not the host); the view for it also waits for the
        // arena's moves and records the use, so the arena waits for the
        // all-reduce before it moves or frees the gradients.
        ddp.stream.join(&self.stream)?;
        let h = bufs.get(p.t)?.0;
        let mut args = arena.kernel_args(ddp.id)?;
        let mut v = args.output::<f32>(Sub {
            h,
            off: p.off,
            len: 4 * elems as u64,
        })?;
        ddp.comm.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
        Ok(())
    }

    #[cfg(feature = "nccl")]
    fn reduce_wait(&mut self) -> Res<()> {
        if let Some(ddp) = &self.ddp {
            self.stream.join(&ddp.stream)?;
        }
        Ok(())
    }
}
