//! The CUDA executor: `kernels/mlp.cu` compiled with NVRTC, launched on
//! the arena stream, with spills and restores timed by CUDA events.

use std::sync::Arc;

use cuarena::backend::cuda::cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaFunction, CudaModule, DriverError, LaunchConfig, PushKernelArg,
};
use cuarena::backend::cuda::cudarc::nvrtc::{
    compile_ptx_with_opts, CompileError, CompileOptions, Ptx,
};
use cuarena::backend::cuda::CudaBackend;
use cuarena::{Arena, ArenaConfig, Handle, Storage};

use super::{Exec, Op, Res};

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
    move |e| cuarena::Error::Driver {
        call,
        source: cuarena::error::DriverError::from(e),
    }
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

const SOURCE: &str = include_str!("../../kernels/mlp.cu");

/// Compiles `kernels/mlp.cu` for `arch` (`sm_90` on a Hopper GPU).
pub fn compile(arch: &str) -> Res<Ptx> {
    let opts = CompileOptions {
        options: vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".to_string(),
        ],
        name: Some("mlp.cu".to_string()),
        ..Default::default()
    };
    compile_ptx_with_opts(SOURCE, opts).map_err(|e| match e {
        CompileError::CompileError { log, .. } => format!(
            "NVRTC could not compile kernels/mlp.cu:\n{}",
            log.to_string_lossy()
        )
        .into(),
        other => format!("NVRTC: {other:?}").into(),
    })
}

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
    #[allow(dead_code)] // train_ddp's
    scale: CudaFunction,
}

/// An operand of a launch: a block and how many 4-byte elements the
/// kernel may touch in it (checked against the block's size).
type Operand = (Option<Handle>, usize);

pub struct Gpu {
    pub arena: Arena<CudaBackend>,
    k: Kernels,
    /// Spill timing, when on.
    events: Option<Events>,
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

impl Gpu {
    /// An arena of `config` on device 0; compiles the kernels into
    /// `ptx` the first time (the device's architecture is known once a
    /// backend exists).
    pub fn new(config: ArenaConfig, ptx: &mut Option<Ptx>, time_copies: bool) -> Res<Self> {
        Self::on_device(0, config, ptx, time_copies)
    }

    /// [`new`](Gpu::new) on CUDA device `ordinal`.
    pub fn on_device(
        ordinal: usize,
        config: ArenaConfig,
        ptx: &mut Option<Ptx>,
        time_copies: bool,
    ) -> Res<Self> {
        let backend = CudaBackend::new(ordinal, config.capacity_bytes)?;
        let code = match ptx {
            Some(p) => p.clone(),
            None => {
                let p = compile(backend.arch())?;
                *ptx = Some(p.clone());
                p
            }
        };
        let module = backend.context().load_module(code)?;
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
        Ok(Self { arena, k, events })
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
        let mut ptrs = [0u64; 4];
        if operands.len() > ptrs.len() {
            return Err("too many operands".into());
        }
        let handles: Vec<Option<Handle>> = operands.iter().map(|o| o.0).collect();
        self.resident(&handles)?;
        let f = pick(&self.k);
        let base = self.arena.backend().region_ptr();
        for (p, &(h, elems)) in ptrs.iter_mut().zip(operands) {
            if let Some(h) = h {
                let size = self.arena.size_bytes(h)?;
                if size < 4 * elems as u64 {
                    return Err(format!("block of {size} B too small for {elems} elements").into());
                }
                *p = base + self.arena.resolve(h)?;
            }
        }
        let mut b = self.arena.stream().launch_builder(f);
        for p in &ptrs[..operands.len()] {
            b.arg(p);
        }
        for i in ints {
            b.arg(i);
        }
        for x in floats {
            b.arg(x);
        }
        // SAFETY: every call below passes the pointers, ints and floats
        // of the kernel's C signature in order and type (pointers as
        // u64, `int` as i32, `float` as f32). Each pointer is the
        // current address of a live block of this arena, resident with
        // all the others (or null where the kernel accepts null), at
        // least as large as the
        // elements the kernel touches for the given dimensions (checked
        // above), and the launch is ordered on the arena stream (see
        // the comment on this function).
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
            .record(self.arena.stream())
            .map_err(drv("cuEventRecord"))?;
        self.arena.make_resident(&hs)?;
        let after = self.arena.stats();
        let out = after.bytes_evicted - before.bytes_evicted;
        let inn = after.bytes_restored - before.bytes_restored;
        if out + inn == 0 {
            ev.free.push((start, end));
            return Ok(());
        }
        end.record(self.arena.stream())
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
    fn matmul(
        &mut self,
        op: Op,
        a: Handle,
        b: Handle,
        c: Handle,
        (m, n, k): (usize, usize, usize),
    ) -> Res<()> {
        let f: Pick = match op {
            Op::NN => |k| &k.mm_nn,
            Op::TN => |k| &k.mm_tn,
            Op::NT => |k| &k.mm_nt,
        };
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(64) as u32, m.div_ceil(64) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let ops = [(Some(a), m * k), (Some(b), k * n), (Some(c), m * n)];
        self.launch(f, cfg, &ops, &[dim(m)?, dim(n)?, dim(k)?], &[])
    }
    fn bias_add(&mut self, z: Handle, b: Handle, rows: usize, cols: usize) -> Res<()> {
        let ops = [(Some(z), rows * cols), (Some(b), cols)];
        self.launch(
            |k| &k.bias_add,
            cfg_1d(rows * cols),
            &ops,
            &[dim(rows)?, dim(cols)?],
            &[],
        )
    }
    fn relu(&mut self, z: Handle, h: Handle, len: usize) -> Res<()> {
        let ops = [(Some(z), len), (Some(h), len)];
        self.launch(|k| &k.relu_fwd, cfg_1d(len), &ops, &[dim(len)?], &[])
    }
    fn relu_bwd(&mut self, dh: Handle, z: Handle, dz: Handle, len: usize) -> Res<()> {
        let ops = [(Some(dh), len), (Some(z), len), (Some(dz), len)];
        self.launch(|k| &k.relu_bwd, cfg_1d(len), &ops, &[dim(len)?], &[])
    }
    fn col_sum(&mut self, x: Handle, out: Handle, rows: usize, cols: usize) -> Res<()> {
        let cfg = LaunchConfig {
            grid_dim: (cols.div_ceil(32) as u32, 1, 1),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        let ops = [(Some(x), rows * cols), (Some(out), cols)];
        self.launch(|k| &k.col_sum, cfg, &ops, &[dim(rows)?, dim(cols)?], &[])
    }
    fn softmax_xent(
        &mut self,
        logits: Handle,
        labels: Handle,
        dlogits: Option<Handle>,
        stats: Handle,
        rows: usize,
        cols: usize,
    ) -> Res<()> {
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(128).max(1) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let ops = [
            (Some(logits), rows * cols),
            (Some(labels), rows),
            (dlogits, rows * cols),
            (Some(stats), 2 * rows),
        ];
        self.launch(
            |k| &k.softmax_xent,
            cfg,
            &ops,
            &[dim(rows)?, dim(cols)?],
            &[],
        )
    }
    fn argmax(&mut self, logits: Handle, labels: Handle, rows: usize, cols: usize) -> Res<()> {
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(128).max(1) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let ops = [(Some(logits), rows * cols), (Some(labels), rows)];
        self.launch(|k| &k.argmax, cfg, &ops, &[dim(rows)?, dim(cols)?], &[])
    }
    fn mean2_acc(&mut self, stats: Handle, out: Handle, n: usize) -> Res<()> {
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let ops = [(Some(stats), 2 * n), (Some(out), 2)];
        self.launch(|k| &k.mean2_acc, cfg, &ops, &[dim(n)?], &[])
    }
    fn sgd(&mut self, w: Handle, g: Handle, v: Handle, len: usize, lr: f32, mu: f32) -> Res<()> {
        let ops = [(Some(w), len), (Some(g), len), (Some(v), len)];
        self.launch(|k| &k.sgd, cfg_1d(len), &ops, &[dim(len)?], &[lr, mu])
    }
    fn scale(&mut self, x: Handle, len: usize, s: f32) -> Res<()> {
        let ops = [(Some(x), len)];
        self.launch(|k| &k.scale, cfg_1d(len), &ops, &[dim(len)?], &[s])
    }
    fn upload(&mut self, x: &Storage, data: &[f32]) -> Res<()> {
        Ok(self.arena.write_range(x, data)?)
    }
}
