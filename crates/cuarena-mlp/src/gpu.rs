//! The CUDA executor: `mlp.cu` compiled with NVRTC, launched on
//! the arena stream with views from `kernel_args`, batches uploaded on a
//! second stream registered with the arena (the data loader), and spills
//! and restores timed by CUDA events.

use std::sync::Arc;

use cuarena::backend::cuda::cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream, DriverError, LaunchConfig,
    PinnedHostSlice, PushKernelArg,
};
use cuarena::backend::cuda::{compile, ArenaView, ArenaViewMut, CudaBackend};
use cuarena::{Arena, ArenaConfig, Handle, Storage, StreamId};

use super::{h, Exec, Kernel, Op, Operand, Res};

/// Which way a host-tier copy went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Device to host (a spill).
    Out,
    /// Host to device (a restore).
    In,
}

/// Time spent in spills and restores (CUDA events on the arena stream
/// around each `make_resident` call that spilled or restored), and the
/// bytes of each such call per direction, in order.
#[derive(Debug, Clone, Default)]
pub struct SpillTiming {
    /// Milliseconds in device-to-host spill copies.
    pub out_ms: f64,
    /// Milliseconds in host-to-device restore copies.
    pub in_ms: f64,
    /// Direction and bytes of the copies of each timed call (one entry per
    /// direction and call: a call's copies of one direction together).
    pub copies: Vec<(Dir, u64)>,
}

impl SpillTiming {
    /// Bytes copied in direction `d`.
    pub fn bytes(&self, d: Dir) -> u64 {
        self.copies.iter().filter(|c| c.0 == d).map(|c| c.1).sum()
    }
}

/// Spill timing: a pair of CUDA events on the arena stream around every
/// `make_resident` call that spilled or restored (the arena's copies are
/// enqueued inside it), read when asked.
#[derive(Debug, Default)]
struct Events {
    /// Pairs ready for reuse, and pairs recorded and not yet read, with
    /// the bytes each direction moved in between.
    free: Vec<(CudaEvent, CudaEvent)>,
    pending: Vec<(CudaEvent, CudaEvent, u64, u64)>,
    timing: SpillTiming,
}

/// Calls timed at most before the host reads their events.
const MAX_PENDING: usize = 4096;

fn drv(call: &'static str) -> impl Fn(DriverError) -> cuarena::Error {
    move |e| cuarena::Error::from(cuarena::BackendError::driver(call, e))
}

impl Events {
    fn pair(&mut self, ctx: &Arc<CudaContext>) -> cuarena::Result<(CudaEvent, CudaEvent)> {
        if let Some(p) = self.free.pop() {
            return Ok(p);
        }
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        Ok((
            ctx.new_event(flags).map_err(drv("cuEventCreate"))?,
            ctx.new_event(flags).map_err(drv("cuEventCreate"))?,
        ))
    }

    /// Reads every pending pair (waits for the last one). A call that both
    /// spilled and restored has its time split in proportion to the bytes.
    fn harvest(&mut self) -> cuarena::Result<()> {
        if let Some(last) = self.pending.last() {
            last.1.synchronize().map_err(drv("cuEventSynchronize"))?;
        }
        for (start, end, out, inn) in std::mem::take(&mut self.pending) {
            let ms = f64::from(start.elapsed_ms(&end).map_err(drv("cuEventElapsedTime"))?);
            let total = (out + inn).max(1) as f64;
            self.timing.out_ms += ms * out as f64 / total;
            self.timing.in_ms += ms * inn as f64 / total;
            self.free.push((start, end));
        }
        Ok(())
    }
}

const SOURCE: &str = include_str!("mlp.cu");

struct Kernels {
    _module: Arc<CudaModule>,
    mm_nn: CudaFunction,
    mm_tn: CudaFunction,
    mm_nt: CudaFunction,
    bias_add: CudaFunction,
    relu_fwd: CudaFunction,
    relu_bwd: CudaFunction,
    col_sum: CudaFunction,
    softmax_xent: CudaFunction,
    argmax: CudaFunction,
    mean2_acc: CudaFunction,
    sgd: CudaFunction,
    scale: CudaFunction,
}

use Operand::{In, InI32, Null, Out, OutI32};

/// A view taken for one launch.
enum Arg<'a> {
    F(ArenaView<'a, f32>),
    FMut(ArenaViewMut<'a, f32>),
    I(ArenaView<'a, i32>),
    IMut(ArenaViewMut<'a, i32>),
    Null,
}

/// The data loader's side of the executor: a stream registered with the
/// arena that batches are uploaded on, page-locked staging buffers (a ring:
/// a buffer is refilled only after the copy that used it, enqueued
/// `PREFETCH` batches earlier, has finished), and an event per upload that
/// the compute waits for before the batch's first use.
struct Loader {
    id: StreamId,
    stream: Arc<CudaStream>,
    ring: Vec<(Option<PinnedHostSlice<f32>>, Option<CudaEvent>)>,
    next: usize,
    uploaded: Vec<(Handle, CudaEvent)>,
}

pub struct Gpu {
    pub arena: Arena<CudaBackend>,
    k: Kernels,
    /// Spill timing, when on.
    events: Option<Events>,
    /// The data loader's stream and buffers (made at the first upload).
    loader: Option<Loader>,
}

/// Picks a kernel of [`Kernels`].
type Pick = fn(&Kernels) -> &CudaFunction;

fn dim(n: usize) -> Res<i32> {
    Ok(i32::try_from(n).map_err(|_| format!("dimension {n} does not fit the kernels' int"))?)
}

/// Grid-stride elementwise launch.
fn cfg_1d(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 4096) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One thread per row, 128 rows a block.
fn cfg_rows(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(128).max(1) as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Gpu {
    /// An arena of `config` on device 0, with the kernels compiled for
    /// its device (once per process: later executors take the image from
    /// the crate's cache).
    pub fn new(config: ArenaConfig, time_copies: bool) -> Res<Self> {
        Self::on_device(0, config, time_copies)
    }

    /// [`new`](Gpu::new) on CUDA device `ordinal`.
    pub fn on_device(ordinal: usize, config: ArenaConfig, time_copies: bool) -> Res<Self> {
        let backend = CudaBackend::new(ordinal, config.capacity_bytes)?;
        let image = compile("mlp.cu", SOURCE, backend.arch(), &["--std=c++17"])?;
        let module = backend.context().load_module(image)?;
        let f = |name: &str| module.load_function(name);
        let k = Kernels {
            mm_nn: f("mlp_matmul_nn")?,
            mm_tn: f("mlp_matmul_tn")?,
            mm_nt: f("mlp_matmul_nt")?,
            bias_add: f("mlp_bias_add")?,
            relu_fwd: f("mlp_relu_fwd")?,
            relu_bwd: f("mlp_relu_bwd")?,
            col_sum: f("mlp_col_sum")?,
            softmax_xent: f("mlp_softmax_xent")?,
            argmax: f("mlp_argmax")?,
            mean2_acc: f("mlp_mean2_acc")?,
            sgd: f("mlp_sgd_momentum")?,
            scale: f("mlp_scale")?,
            _module: module,
        };
        let events = (time_copies && config.spill_host_bytes > 0).then(Events::default);
        let arena = Arena::with_backend(config, backend)?;
        Ok(Self {
            arena,
            k,
            events,
            loader: None,
        })
    }

    /// Spill timing so far (waits for the copies still in flight).
    pub fn timing(&mut self) -> cuarena::Result<SpillTiming> {
        match &mut self.events {
            Some(ev) => {
                ev.harvest()?;
                Ok(ev.timing.clone())
            }
            None => Ok(SpillTiming::default()),
        }
    }

    /// Launches the kernel `pick` names with the operands' device
    /// addresses, then `ints`, then `floats` (the argument order of
    /// every kernel in mlp.cu).
    ///
    /// Why the addresses cannot go stale: first `make_resident` brings
    /// every operand onto the device together (with spilling on, it may
    /// spill other blocks, restore these and compact, all enqueued on
    /// the arena stream before this launch; it never spills one of
    /// these). Then the addresses are resolved, after the last call
    /// that could move anything (every `alloc` happens before the
    /// launch that uses the block), and used only to enqueue this one
    /// launch; from there on only `&self.arena` is used, so nothing
    /// moves until we return, and no address outlives this function.
    /// The kernel runs on the arena stream, so it executes before any
    /// compaction, spill, transfer or reuse of a freed block enqueued
    /// later on that stream: on the GPU it sees exactly the layout
    /// these addresses describe.
    fn launch(
        &mut self,
        pick: Pick,
        cfg: LaunchConfig,
        operands: &[Operand],
        ints: &[i32],
        floats: &[f32],
    ) -> Res<()> {
        let handles: Vec<Option<Handle>> = operands.iter().map(|o| o.handle()).collect();
        self.resident(&handles)?;
        let f = pick(&self.k);
        // Views for the arena stream: taken after the last call that could
        // move anything, borrowing the arena until the launch is enqueued.
        let mut args = self.arena.kernel_args(StreamId::ARENA)?;
        let mut views = Vec::with_capacity(operands.len());
        let fits = |len: usize, elems: usize| -> Res<()> {
            if len < elems {
                return Err(format!("view of {len} elements too small for {elems}").into());
            }
            Ok(())
        };
        for &o in operands {
            views.push(match o {
                In(h, n) => {
                    let v = args.input::<f32>(&h)?;
                    fits(v.len(), n)?;
                    Arg::F(v)
                }
                Out(h, n) => {
                    let v = args.output::<f32>(&h)?;
                    fits(v.len(), n)?;
                    Arg::FMut(v)
                }
                InI32(h, n) => {
                    let v = args.input::<i32>(&h)?;
                    fits(v.len(), n)?;
                    Arg::I(v)
                }
                OutI32(h, n) => {
                    let v = args.output::<i32>(&h)?;
                    fits(v.len(), n)?;
                    Arg::IMut(v)
                }
                Null => Arg::Null,
            });
        }
        let null = 0u64;
        let mut b = args.stream().launch_builder(f);
        for v in &views {
            match v {
                Arg::F(v) => b.arg(v),
                Arg::FMut(v) => b.arg(v),
                Arg::I(v) => b.arg(v),
                Arg::IMut(v) => b.arg(v),
                Arg::Null => b.arg(&null),
            };
        }
        for i in ints {
            b.arg(i);
        }
        for x in floats {
            b.arg(x);
        }
        // SAFETY: every call below passes the pointers, ints and floats of
        // the kernel's C signature in order and type (views as pointers to
        // f32 or i32, a null pointer where the kernel accepts one, `int` as
        // i32, `float` as f32). The views cover live, resident blocks at
        // least as large as what the kernel touches for the given
        // dimensions (checked above), outputs alias nothing (checked by
        // `kernel_args`), and the launch is on the stream they were taken
        // for, the arena stream, ordered before any later move or reuse.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

impl Exec for Gpu {
    type B = CudaBackend;
    fn arena(&mut self) -> &mut Arena<CudaBackend> {
        &mut self.arena
    }
    fn resident(&mut self, ops: &[Option<Handle>]) -> Res<()> {
        let hs: Vec<Handle> = ops.iter().flatten().copied().collect();
        let Some(ev) = &mut self.events else {
            return Ok(self.arena.make_resident(&hs)?);
        };
        let before = self.arena.stats();
        let (start, end) = ev.pair(self.arena.backend().context())?;
        start
            .record(self.arena.backend().stream())
            .map_err(drv("cuEventRecord"))?;
        self.arena.make_resident(&hs)?;
        let after = self.arena.stats();
        let out = after.bytes_evicted - before.bytes_evicted;
        let inn = after.bytes_restored - before.bytes_restored;
        if out + inn == 0 {
            ev.free.push((start, end));
            return Ok(());
        }
        end.record(self.arena.backend().stream())
            .map_err(drv("cuEventRecord"))?;
        for (d, b) in [(Dir::Out, out), (Dir::In, inn)] {
            if b > 0 {
                ev.timing.copies.push((d, b));
            }
        }
        ev.pending.push((start, end, out, inn));
        if ev.pending.len() >= MAX_PENDING {
            ev.harvest()?;
        }
        Ok(())
    }
    fn run(&mut self, k: Kernel) -> Res<()> {
        // The grid of each kernel, its int and float arguments (after the
        // pointers, in the order of its C signature).
        let (pick, cfg, ints, floats): (Pick, _, Vec<i32>, Vec<f32>) = match k {
            Kernel::Matmul { op, m, n, k, .. } => {
                let pick: Pick = match op {
                    Op::NN => |k| &k.mm_nn,
                    Op::TN => |k| &k.mm_tn,
                    Op::NT => |k| &k.mm_nt,
                };
                let cfg = LaunchConfig {
                    grid_dim: (n.div_ceil(64) as u32, m.div_ceil(64) as u32, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                (pick, cfg, vec![dim(m)?, dim(n)?, dim(k)?], vec![])
            }
            Kernel::BiasAdd { rows, cols, .. } => (
                |k| &k.bias_add,
                cfg_1d(rows * cols),
                vec![dim(rows)?, dim(cols)?],
                vec![],
            ),
            Kernel::Relu { len, .. } => (|k| &k.relu_fwd, cfg_1d(len), vec![dim(len)?], vec![]),
            Kernel::ReluBwd { len, .. } => (|k| &k.relu_bwd, cfg_1d(len), vec![dim(len)?], vec![]),
            Kernel::ColSum { rows, cols, .. } => {
                let cfg = LaunchConfig {
                    grid_dim: (cols.div_ceil(32) as u32, 1, 1),
                    block_dim: (32, 8, 1),
                    shared_mem_bytes: 0,
                };
                (|k| &k.col_sum, cfg, vec![dim(rows)?, dim(cols)?], vec![])
            }
            Kernel::SoftmaxXent { rows, cols, .. } => (
                |k| &k.softmax_xent,
                cfg_rows(rows),
                vec![dim(rows)?, dim(cols)?],
                vec![],
            ),
            Kernel::Argmax { rows, cols, .. } => (
                |k| &k.argmax,
                cfg_rows(rows),
                vec![dim(rows)?, dim(cols)?],
                vec![],
            ),
            Kernel::Mean2Acc { n, .. } => {
                let cfg = LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                (|k| &k.mean2_acc, cfg, vec![dim(n)?], vec![])
            }
            Kernel::Sgd { len, lr, mu, .. } => {
                (|k| &k.sgd, cfg_1d(len), vec![dim(len)?], vec![lr, mu])
            }
            Kernel::Scale { len, s, .. } => (|k| &k.scale, cfg_1d(len), vec![dim(len)?], vec![s]),
        };
        self.launch(pick, cfg, &k.operands(), &ints, &floats)
    }
    fn upload(&mut self, x: &Storage, data: &[f32]) -> Res<()> {
        // What the dry run does: x is used (it was just allocated, so this
        // moves nothing).
        self.arena.make_resident(&[h(x)])?;
        if self.loader.is_none() {
            let stream = self.arena.backend().context().new_stream()?;
            let id = self.arena.register_stream(stream.clone())?;
            self.loader = Some(Loader {
                id,
                stream,
                ring: (0..=super::PREFETCH).map(|_| (None, None)).collect(),
                next: 0,
                uploaded: Vec::new(),
            });
        }
        let l = self.loader.as_mut().ok_or("no loader")?;
        let ctx = self.arena.backend().context().clone();
        let (buf, done) = &mut l.ring[l.next];
        l.next = (l.next + 1) % (super::PREFETCH + 1);
        if let Some(ev) = done.take() {
            // The copy of PREFETCH batches ago: long finished.
            ev.synchronize()?;
        }
        if buf.as_ref().is_none_or(|b| b.len() < data.len()) {
            // SAFETY: the buffer is written below before any copy reads it.
            *buf = Some(unsafe { ctx.alloc_pinned::<f32>(data.len().max(1)) }?);
        }
        let host = buf.as_mut().ok_or("no buffer")?.as_mut_slice()?;
        host[..data.len()].copy_from_slice(data);
        {
            // The upload stream first waits for the arena's moves so far;
            // the view records x as used on it, so the arena waits for the
            // copy before it moves, spills or frees x.
            let mut args = self.arena.kernel_args(l.id)?;
            let mut view = args.output::<f32>(x)?;
            l.stream.memcpy_htod(&host[..data.len()], &mut view)?;
        }
        *done = Some(l.stream.record_event(None)?);
        l.uploaded.push((h(x), l.stream.record_event(None)?));
        Ok(())
    }
    fn await_upload(&mut self, x: &Storage) -> Res<()> {
        let Some(l) = self.loader.as_mut() else {
            return Ok(());
        };
        if let Some(i) = l.uploaded.iter().position(|u| u.0 == h(x)) {
            let (_, ev) = l.uploaded.swap_remove(i);
            // A stream wait: the host does not wait.
            self.arena.backend().stream().wait(&ev)?;
        }
        Ok(())
    }
}
