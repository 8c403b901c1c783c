//! Data-parallel training of train_mlp's MLP over every visible GPU, one
//! arena per GPU, gradients all-reduced with NCCL on a stream registered
//! with each rank's arena.
//!
//! `cargo run --release --features nccl --example train_ddp` runs one
//! thread per visible GPU in this process (world size = GPUs; 1 on a
//! one-GPU machine): first a single-GPU reference on the same global
//! batches, then the data-parallel run, and compares their eval losses at
//! every eval point. Without a GPU or without libnccl it says so and exits 0.
//! `-- --dry [--world W]` runs every rank's allocation sequence on metadata
//! arenas (no GPU): the per-rank peaks, capacities and compactions.
//!
//! One process per GPU: start W processes with `--rank R --world W
//! --id-file PATH` (same PATH, on a file system they all see; rank 0 writes
//! the NCCL unique id there, the others wait for it up to 60 s), e.g.
//!
//! ```text
//! for r in 0 1; do
//!   CUDA_VISIBLE_DEVICES=$r cargo run --release --features nccl --example train_ddp -- \
//!     --rank $r --world 2 --id-file /tmp/ddp.id --device 0 &
//! done; wait
//! ```
//!
//! (a launcher such as `torchrun`/`mpirun`/Slurm sets R and W per process
//! the same way; remove the id file between runs). `--device D` picks the
//! GPU (default: R when there are more than R visible, else 0).
//!
//! The schedule: every step has a global batch of G rows, G uniform in
//! W·16..=W·max (the same seed on every rank), split unevenly into W
//! shares by weights drawn for that step (every rank computes the same
//! split and takes its own share), so each rank's batch sizes, and with
//! them its arena's holes and compactions, follow their own sequence.
//! Each rank's gradient is the *sum* over its rows (the mean-loss gradient
//! times its row count), the buckets are all-reduced with `ReduceOp::Sum`
//! and divided by G: the gradient of the mean loss of the global batch, as
//! a single GPU computes it, up to float summation order.
//!
//! Overlap: as soon as the backward pass has a layer's `(dW, db)` (last
//! layer first) the communication stream waits (a stream wait) for the
//! arena stream's work so far, and the bucket is all-reduced on it with
//! views from `kernel_args(comm)`, which record the use; the backward pass
//! of the earlier layers is enqueued on the arena stream meanwhile. The
//! optimizer step makes the arena stream wait for the communication stream
//! (a stream wait): no host synchronisation per step.
//!
//! Each rank's arena is 1.05 x its own peak of live bytes, measured by a
//! dry run of that rank's allocation sequence on a metadata arena, which
//! also predicts its compactions exactly.

#[allow(dead_code, unused_imports)]
#[path = "../train_mlp/main.rs"]
mod mlp;

use std::process::ExitCode;
use std::time::Instant;

use cuarena::backend::Backend;
use cuarena::{fmt_bytes, ArenaConfig, Stats, Storage};

use mlp::{
    alloc_f32, arena_config, backward_with, evaluate, forward, h, label, loss, problem, update,
    Dry, Exec, Net, Problem, Res, Rng, Settings, CLASSES, EVAL_ROWS, IN,
};

/// Relative tolerance on the eval loss, DDP vs the single-GPU reference, at
/// every eval point. The two runs see the same rows and the same
/// arithmetic per row; only the order of float sums differs (per-rank
/// partial sums of the gradient, NCCL's reduction order), a relative
/// difference of ~1e-7 per step that SGD carries along and amplifies: over
/// 1000 steps on two H200s the largest relative difference measured was
/// 9.4e-4; the default 3000 steps allow 5e-3.
const LOSS_RTOL: f32 = 5e-3;

struct Ddp {
    s: Settings,
    /// Ranks of the data-parallel run (the global batch sizes scale with it).
    world: usize,
    mode: DdpMode,
}

enum DdpMode {
    Threads,
    Dry,
    Process {
        rank: usize,
        id_file: std::path::PathBuf,
        device: Option<usize>,
    },
    Help,
}

const HELP: &str = "\
train_ddp: train_mlp's MLP trained data-parallel, one cuarena arena per GPU,
gradients all-reduced with NCCL (feature nccl)

usage: cargo run --release --features nccl --example train_ddp -- [options]

  (default)          one thread per visible GPU: the single-GPU reference on the
                     same global batches, then the DDP run; eval losses compared
  --dry              every rank's allocation sequence on metadata arenas (no GPU)
  --world W          ranks (default: visible GPUs; --dry: 2)
  --rank R --id-file PATH [--device D]
                     one process per GPU: this process is rank R of --world W;
                     rank 0 writes the NCCL id to PATH, the others read it
  --steps N, --max-batch N (per-rank share scale), --every N, --seed N, --lr X
  -h, --help         this text";

fn parse() -> Res<Ddp> {
    use lexopt::prelude::*;
    let mut s = Settings {
        steps: 3000,
        every: 300,
        ..Settings::gpu()
    };
    let (mut world, mut rank, mut id_file, mut device, mut dry) = (None, None, None, None, false);
    let mut p = lexopt::Parser::from_env();
    fn num<T: std::str::FromStr>(p: &mut lexopt::Parser) -> Res<T>
    where
        T::Err: std::fmt::Display,
    {
        let v = p.value()?.to_string_lossy().into_owned();
        v.parse().map_err(|e| format!("{v}: {e}").into())
    }
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => {
                return Ok(Ddp {
                    s,
                    world: 1,
                    mode: DdpMode::Help,
                })
            }
            Long("dry") => dry = true,
            Long("world") => world = Some(num::<usize>(&mut p)?.max(1)),
            Long("rank") => rank = Some(num::<usize>(&mut p)?),
            Long("device") => device = Some(num::<usize>(&mut p)?),
            Long("id-file") => id_file = Some(std::path::PathBuf::from(p.value()?)),
            Long("steps") => s.steps = num::<usize>(&mut p)?.max(1),
            Long("max-batch") => s.max_batch = num::<usize>(&mut p)?.max(s.min_batch),
            Long("every") => s.every = num::<usize>(&mut p)?.max(1),
            Long("seed") => s.seed = num(&mut p)?,
            Long("lr") => s.lr = num(&mut p)?,
            Long("target") => s.target_loss = num(&mut p)?,
            other => return Err(other.unexpected().into()),
        }
    }
    let mode = match (rank, id_file, dry) {
        (_, _, true) => DdpMode::Dry,
        (Some(rank), Some(id_file), false) => DdpMode::Process {
            rank,
            id_file,
            device,
        },
        (None, None, false) => DdpMode::Threads,
        _ => return Err("--rank and --id-file go together (with --world)".into()),
    };
    let world = match (&mode, world) {
        (_, Some(w)) => w,
        (DdpMode::Dry, None) => 2,
        (DdpMode::Process { .. }, None) => return Err("--rank needs --world".into()),
        _ => 0, // the visible GPUs
    };
    if let DdpMode::Process { rank, .. } = &mode {
        if *rank >= world {
            return Err(format!("--rank {rank} is not below --world {world}").into());
        }
    }
    Ok(Ddp { s, world, mode })
}

// ---- the schedule --------------------------------------------------------------

/// Rows in the data pool every global batch is a window of: large enough
/// that the student does not overfit it in the default 3000 steps (a pool
/// of 4 global batches did: eval loss rose again after 600 steps).
fn pool_rows(s: &Settings, world: usize) -> usize {
    32 * s.max_batch * world
}

/// Global batch of step `t` of a run whose data-parallel world is `world`:
/// (rows, first row in the pool). The same on every rank and in the
/// single-GPU reference.
fn global_batch(s: &Settings, world: usize, t: usize) -> (usize, usize) {
    let mut r = Rng::new(s.seed ^ 0x0061_0ba1 ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let g = r.batch(world * s.min_batch, world * s.max_batch);
    let start = r.below(pool_rows(s, world) - g + 1);
    (g, start)
}

/// `g` rows split into `parts` uneven shares (weights uniform in 0.5..1.5,
/// drawn for step `t`), every share at least one row; every rank computes
/// the same split.
fn split(s: &Settings, g: usize, parts: usize, t: usize) -> Vec<usize> {
    if parts == 1 {
        return vec![g];
    }
    let mut r = Rng::new(s.seed ^ 0x5711_7000 ^ (t as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    let w: Vec<f64> = (0..parts).map(|_| 0.5 + r.unit()).collect();
    let total: f64 = w.iter().sum();
    let mut n: Vec<usize> = w
        .iter()
        .map(|x| ((g as f64 * x / total) as usize).max(1))
        .collect();
    let sum: usize = n.iter().sum();
    n[0] = (n[0] + g).saturating_sub(sum).max(1);
    n
}

// ---- the per-rank loop ------------------------------------------------------------

/// Where a rank's gradient buckets go.
trait Reducer<E: Exec> {
    /// Starts the sum over ranks of one layer's `(dW, db)`, in place.
    fn bucket(&mut self, e: &mut E, g: &(Storage, Storage)) -> Res<()>;
    /// Makes the compute wait for every bucket started.
    fn wait(&mut self, e: &mut E) -> Res<()>;
}

/// A world of one: the sums are the rank's own.
struct Alone;

impl<E: Exec> Reducer<E> for Alone {
    fn bucket(&mut self, _: &mut E, _: &(Storage, Storage)) -> Res<()> {
        Ok(())
    }
    fn wait(&mut self, _: &mut E) -> Res<()> {
        Ok(())
    }
}

/// A rank's share of a global batch: inputs (uploaded), labels (computed
/// when the batch is taken), its rows, and the global batch's rows.
struct RankBatch {
    x: Storage,
    y: Storage,
    n: usize,
    g: usize,
}

/// Rank `rank`'s share of step `t`'s global batch, its inputs uploaded.
fn rank_batch<E: Exec>(
    e: &mut E,
    s: &Settings,
    world: usize,
    rank: usize,
    parts: usize,
    t: usize,
    pool: &[f32],
) -> Res<RankBatch> {
    let (g, start) = global_batch(s, world, t);
    let shares = split(s, g, parts, t);
    let n = shares[rank];
    let first = start + shares[..rank].iter().sum::<usize>();
    let x = alloc_f32(e, n * IN)?;
    let y = e.arena().alloc_storage_elems::<i32>(n as u64)?;
    let rows = if pool.is_empty() {
        &[][..]
    } else {
        &pool[first * IN..(first + n) * IN]
    };
    e.upload(&x, rows)?;
    Ok(RankBatch { x, y, n, g })
}

/// Eval points of a rank's run.
struct RankRun {
    curve: Vec<(usize, f32, f32)>,
    seconds: f64,
}

/// Rank `rank` of `parts` ranks training on the global batches of a
/// `world`-rank schedule (the reference: `parts` = 1).
#[allow(clippy::too_many_arguments)]
fn train_rank<E: Exec, R: Reducer<E>>(
    e: &mut E,
    red: &mut R,
    p: &Problem,
    s: &Settings,
    world: usize,
    rank: usize,
    parts: usize,
    log: bool,
) -> Res<RankRun> {
    let stores = e.arena().backend().stores_bytes();
    let pool: Vec<f32> = if stores {
        let mut data = Rng::new(s.seed ^ 0xda7a);
        (0..pool_rows(s, world) * IN)
            .map(|_| data.normal())
            .collect()
    } else {
        Vec::new()
    };
    let mut order = Rng::new(s.seed ^ 0x0d0e ^ rank as u64);
    let teacher = Net::upload(e, &p.teacher, false)?;
    let eval_x = alloc_f32(e, EVAL_ROWS * IN)?;
    e.arena().write_range(&eval_x, &p.eval_x)?;
    let eval_y = e.arena().alloc_storage_elems::<i32>(EVAL_ROWS as u64)?;
    label(e, &teacher, &eval_x, &eval_y, EVAL_ROWS)?;
    let net = Net::upload(e, &p.student, true)?;
    let train_metrics = e.arena().alloc_storage_zeroed::<f32>(2)?;
    let eval_metrics = e.arena().alloc_storage_zeroed::<f32>(2)?;
    let (l0, a0) = evaluate(e, &net, &eval_x, &eval_y, &eval_metrics)?;
    let mut curve = vec![(0, l0, a0)];
    let started = Instant::now();
    // One batch prefetched: uploaded (on the executor's upload stream) in
    // the middle of the step before its own, so it lands among that step's
    // activations and outlives them (the holes the arena compacts).
    let mut next = Some(rank_batch(e, s, world, rank, parts, 1, &pool)?);
    for t in 1..=s.steps {
        let RankBatch { x, y, n, g } = next.take().ok_or("no batch")?;
        e.await_upload(&x)?;
        label(e, &teacher, &x, &y, n)?;
        let mut fwd = forward(e, &net, &x, n, true)?;
        let logits = fwd.z.pop().ok_or("no logits")?;
        let dlogits = loss(e, &logits, &y, n, &train_metrics, true)?.ok_or("no gradient")?;
        drop(logits);
        if t < s.steps {
            next = Some(rank_batch(e, s, world, rank, parts, t + 1, &pool)?);
        }
        // The kernel gives the gradient of this rank's mean loss: times n,
        // the sum over its rows.
        e.scale(h(&dlogits), n * CLASSES, n as f32)?;
        let grads = backward_with(e, &net, &x, n, fwd, dlogits, |e, _, g| red.bucket(e, g))?;
        red.wait(e)?;
        let inv = 1.0 / g as f32;
        for (l, (gw, gb)) in net.layers.iter().zip(&grads) {
            e.scale(h(gw), l.fan_in * l.fan_out, inv)?;
            e.scale(h(gb), l.fan_out, inv)?;
        }
        update(e, &net, grads, s.lr_at(t - 1), s.momentum, &mut order)?;
        drop((x, y));
        if t % s.every == 0 || t == s.steps {
            let (l, a) = evaluate(e, &net, &eval_x, &eval_y, &eval_metrics)?;
            if log {
                let st = e.arena().stats();
                println!(
                    "step {t:>5}  global batch {g:>5} (this rank {n:>4})  eval loss {l:.5} acc {a:.3}  | rank {rank}: compactions {}, moved {}",
                    st.targeted_compactions + st.full_compactions,
                    fmt_bytes(st.bytes_moved)
                );
            }
            curve.push((t, l, a));
        }
    }
    Ok(RankRun {
        curve,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// A rank's arena: 1.05 x its own peak live bytes, from a dry run of its
/// allocation sequence; and the statistics a metadata arena of that
/// capacity predicts.
fn rank_arena(
    p: &Problem,
    s: &Settings,
    world: usize,
    rank: usize,
    parts: usize,
) -> Res<(u64, ArenaConfig, Stats)> {
    let mut dry = Dry::new(ArenaConfig::new(1 << 40))?;
    train_rank(&mut dry, &mut Alone, p, s, world, rank, parts, false)?;
    let peak = dry.arena.stats().peak_allocated_bytes;
    let config = arena_config(peak, dry.arena.config().alignment_bytes, None);
    let mut dry = Dry::new(config.clone())?;
    train_rank(&mut dry, &mut Alone, p, s, world, rank, parts, false)?;
    Ok((peak, config, dry.arena.stats()))
}

fn compactions(st: &Stats) -> u64 {
    st.targeted_compactions + st.full_compactions
}

fn run_dry(d: &Ddp) -> Res<()> {
    let p = problem(&d.s);
    println!(
        "dry runs of {} steps, world {} (global batches {}..{} split unevenly):",
        d.s.steps,
        d.world,
        d.world * d.s.min_batch,
        d.world * d.s.max_batch
    );
    let (peak, config, st) = rank_arena(&p, &d.s, d.world, 0, 1)?;
    println!(
        "  single-GPU reference: {}; {} compactions, {} moved",
        mlp::arena_line(peak, &config),
        compactions(&st),
        fmt_bytes(st.bytes_moved)
    );
    for r in 0..d.world {
        let (peak, config, st) = rank_arena(&p, &d.s, d.world, r, d.world)?;
        println!(
            "  rank {r}: {}; {} compactions ({} moves, {} moved), {} allocations",
            mlp::arena_line(peak, &config),
            compactions(&st),
            st.moves,
            fmt_bytes(st.bytes_moved),
            st.allocs
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let d = match parse() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("train_ddp: {e}\n(see `--help`)");
            return ExitCode::from(2);
        }
    };
    let r = match d.mode {
        DdpMode::Help => {
            println!("{HELP}");
            Ok(())
        }
        DdpMode::Dry => run_dry(&d),
        _ => gpu::run_or_skip(&d),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("train_ddp: {e}");
            ExitCode::FAILURE
        }
    }
}

mod gpu {
    use std::sync::Arc;
    use std::time::Duration;

    use cuarena::backend::cuda::cudarc::driver::{CudaContext, CudaStream};
    use cuarena::backend::cuda::cudarc::nvrtc::Ptx;
    use cuarena::backend::cuda::nccl::{self, Communicator, ReduceOp, UniqueId};
    use cuarena::backend::cuda::CudaBackend;
    use cuarena::StreamId;

    use super::mlp::gpu::Gpu;
    use super::*;

    /// The rank's all-reduces on its communication stream, registered with
    /// its arena.
    struct Nccl {
        comm: Communicator,
        id: StreamId,
        stream: Arc<CudaStream>,
    }

    impl Reducer<Gpu> for Nccl {
        fn bucket(&mut self, e: &mut Gpu, (gw, gb): &(Storage, Storage)) -> Res<()> {
            // The bucket's kernels were enqueued on the arena stream: the
            // communication stream waits for them (a stream wait).
            self.stream.join(e.arena.stream())?;
            // Views for the communication stream: it also waits for the
            // arena's moves so far, and the uses are recorded, so the arena
            // waits for the all-reduce before it moves or frees the bucket.
            let mut args = e.arena.kernel_args(self.id)?;
            let mut w = args.output::<f32>(gw)?;
            let mut b = args.output::<f32>(gb)?;
            self.comm.all_reduce_in_place(&mut w, ReduceOp::Sum)?;
            self.comm.all_reduce_in_place(&mut b, ReduceOp::Sum)?;
            Ok(())
        }
        fn wait(&mut self, e: &mut Gpu) -> Res<()> {
            // The optimizer step (arena stream) waits for every bucket.
            e.arena.stream().join(&self.stream)?;
            Ok(())
        }
    }

    pub(super) fn run_or_skip(d: &Ddp) -> Res<()> {
        if let Err(reason) = CudaBackend::available() {
            println!("train_ddp needs CUDA GPUs: {reason}; skipping (`--dry` runs without one).");
            return Ok(());
        }
        if let Err(reason) = nccl::available() {
            println!("train_ddp needs NCCL: {reason}; skipping.");
            return Ok(());
        }
        match &d.mode {
            DdpMode::Process {
                rank,
                id_file,
                device,
            } => run_process(d, *rank, id_file, *device),
            _ => run_threads(d),
        }
    }

    /// One rank on `device`: its arena (1.05 x its peak), its
    /// communication stream, its run; returns the run, its statistics and
    /// the dry run's prediction.
    fn rank_run(
        d: &Ddp,
        p: &Problem,
        world: usize,
        rank: usize,
        device: usize,
        comm: Communicator,
        ptx: &mut Option<Ptx>,
    ) -> Res<(RankRun, Stats, Stats, u64)> {
        let (peak, config, predicted) = rank_arena(p, &d.s, world, rank, world)?;
        let mut g = Gpu::on_device(device, config, ptx, false)?;
        let stream = comm.stream().clone();
        let id = g.arena.register_stream(stream.clone())?;
        let mut red = Nccl { comm, id, stream };
        let run = train_rank(&mut g, &mut red, p, &d.s, world, rank, world, rank == 0)?;
        red.comm.synchronize()?;
        Ok((run, g.arena.stats(), predicted, peak))
    }

    fn report(who: &str, st: &Stats, predicted: &Stats, peak: u64) -> Res<()> {
        let same = (compactions(st), st.moves, st.bytes_moved)
            == (
                compactions(predicted),
                predicted.moves,
                predicted.bytes_moved,
            );
        println!(
            "{who}: capacity {} = {:.3} x its peak live {}; {} compactions ({} moves, {} moved); the dry run predicted {}: {}",
            fmt_bytes(st.capacity_bytes),
            st.capacity_bytes as f64 / peak.max(1) as f64,
            fmt_bytes(peak),
            compactions(st),
            st.moves,
            fmt_bytes(st.bytes_moved),
            compactions(predicted),
            if same { "identical" } else { "DIFFERENT" }
        );
        if !same {
            return Err(format!("{who} compacted otherwise than its dry run").into());
        }
        Ok(())
    }

    fn run_threads(d: &Ddp) -> Res<()> {
        let visible = usize::try_from(CudaContext::device_count()?)?;
        let world = if d.world == 0 { visible } else { d.world };
        if world > visible {
            return Err(format!("--world {world}: only {visible} GPUs visible").into());
        }
        let p = problem(&d.s);
        // Compiled by the first arena for its device (every rank's GPU is
        // of the same kind on one host).
        let mut ptx = None;
        println!(
            "train_ddp: world {world} (one thread per GPU), {} steps, global batches {}..{} split unevenly per rank",
            d.s.steps,
            world * d.s.min_batch,
            world * d.s.max_batch
        );

        // 1. The single-GPU reference on the same global batches.
        let (peak, config, predicted) = rank_arena(&p, &d.s, world, 0, 1)?;
        let mut g = Gpu::on_device(0, config, &mut ptx, false)?;
        let reference = train_rank(&mut g, &mut Alone, &p, &d.s, world, 0, 1, false)?;
        println!(
            "single-GPU reference: {} steps in {:.2} s",
            d.s.steps, reference.seconds
        );
        report("single-GPU reference", &g.arena.stats(), &predicted, peak)?;
        drop(g);

        // 2. Data-parallel: a communicator over every GPU, a thread per rank.
        let streams = (0..world)
            .map(|i| Ok(CudaContext::new(i)?.new_stream()?))
            .collect::<Res<Vec<_>>>()?;
        let comms = Communicator::init_all(streams, Duration::from_secs(60))?;
        let results: Vec<Res<(RankRun, Stats, Stats, u64)>> = std::thread::scope(|sc| {
            let handles: Vec<_> = comms
                .into_iter()
                .enumerate()
                .map(|(rank, comm)| {
                    let (p, ptx) = (&p, ptx.clone());
                    sc.spawn(move || {
                        let mut ptx = ptx;
                        rank_run(d, p, world, rank, rank, comm, &mut ptx).map_err(|e| e.to_string())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h.join() {
                    Ok(r) => r.map_err(Into::into),
                    Err(_) => Err("a rank panicked".into()),
                })
                .collect()
        });
        let mut runs = Vec::new();
        for (rank, r) in results.into_iter().enumerate() {
            let (run, st, predicted, peak) = r?;
            report(&format!("rank {rank}"), &st, &predicted, peak)?;
            runs.push(run);
        }
        compare(&reference, &runs[0], d.s.target_loss)
    }

    fn compare(reference: &RankRun, ddp: &RankRun, target: f32) -> Res<()> {
        let mut worst = 0.0f32;
        for (a, b) in reference.curve.iter().zip(&ddp.curve) {
            let rel = (a.1 - b.1).abs() / a.1.abs().max(f32::MIN_POSITIVE);
            worst = worst.max(rel);
        }
        let (ra, da) = (
            reference.curve.last().ok_or("no evaluation")?,
            ddp.curve.last().ok_or("no evaluation")?,
        );
        println!(
            "loss curve, DDP vs single GPU on the same global batches, {} points: final eval loss {:.6} vs {:.6}; \
             largest relative difference {worst:.2e} (tolerance {LOSS_RTOL:.0e}: float summation order only); {:.2} s vs {:.2} s",
            ddp.curve.len(),
            da.1,
            ra.1,
            ddp.seconds,
            reference.seconds
        );
        if reference.curve.len() != ddp.curve.len() || worst.is_nan() || worst > LOSS_RTOL {
            return Err("the DDP loss curve differs from the single-GPU one".into());
        }
        if da.1 >= target {
            return Err(format!("target missed: final eval loss {:.4} >= {target}", da.1).into());
        }
        println!("target reached: final eval loss {:.4} < {target}", da.1);
        Ok(())
    }

    /// One process per GPU, bootstrapped through `id_file`.
    fn run_process(
        d: &Ddp,
        rank: usize,
        id_file: &std::path::Path,
        device: Option<usize>,
    ) -> Res<()> {
        let world = d.world;
        let visible = usize::try_from(CudaContext::device_count()?)?;
        let device = device.unwrap_or(if rank < visible { rank } else { 0 });
        let id = if rank == 0 {
            let id = UniqueId::new()?;
            let tmp = id_file.with_extension("tmp");
            std::fs::write(&tmp, id.to_hex())?;
            std::fs::rename(&tmp, id_file)?;
            id
        } else {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if let Ok(text) = std::fs::read_to_string(id_file) {
                    break UniqueId::from_hex(&text)?;
                }
                if Instant::now() > deadline {
                    return Err(format!("no NCCL id in {} after 60 s", id_file.display()).into());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        let ctx = CudaContext::new(device)?;
        let comm = Communicator::init_with_timeout(
            ctx.new_stream()?,
            id,
            rank,
            world,
            Duration::from_secs(60),
        )?;
        let p = problem(&d.s);
        let mut ptx = None;
        let (run, st, predicted, peak) = rank_run(d, &p, world, rank, device, comm, &mut ptx)?;
        report(&format!("rank {rank}"), &st, &predicted, peak)?;
        let last = run.curve.last().ok_or("no evaluation")?;
        println!(
            "rank {rank} of {world}: final eval loss {:.5} acc {:.3} after {} steps in {:.2} s",
            last.1, last.2, d.s.steps, run.seconds
        );
        Ok(())
    }
}
