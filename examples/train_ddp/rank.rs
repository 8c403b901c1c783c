//! One rank's run: the training loop over its shares of the global
//! batches, the reducer its gradient buckets go to (NCCL all-reduces on a
//! communication stream registered with its arena, or nothing for a world
//! of one), and its arena sized by a dry run.

use std::sync::Arc;
use std::time::Instant;

use cuarena::backend::cuda::cudarc::driver::CudaStream;
use cuarena::backend::cuda::nccl::{Communicator, ReduceOp};
use cuarena::backend::Backend;
use cuarena::{fmt_bytes, ArenaConfig, Stats, Storage, StreamId};

use crate::schedule::{data_pool, rank_batch, RankBatch};
use crate::Ddp;
use cuarena_mlp::gpu::Gpu;
use cuarena_mlp::{
    arena_config, backward, forward, h, label, loss, update, Dry, Exec, Kernel, Problem, Res, Rng,
    Settings, Setup, CLASSES,
};

// ---- the per-rank loop ------------------------------------------------------------

/// Where a rank's gradient buckets go.
pub(crate) trait Reducer<E: Exec> {
    /// Starts the sum over ranks of one layer's `(dW, db)`, in place.
    fn bucket(&mut self, e: &mut E, g: &(Storage, Storage)) -> Res<()>;
    /// Makes the compute wait for every bucket started.
    fn wait(&mut self, e: &mut E) -> Res<()>;
}

/// A world of one: the sums are the rank's own.
pub(crate) struct Alone;

impl<E: Exec> Reducer<E> for Alone {
    fn bucket(&mut self, _: &mut E, _: &(Storage, Storage)) -> Res<()> {
        Ok(())
    }
    fn wait(&mut self, _: &mut E) -> Res<()> {
        Ok(())
    }
}

/// Eval points of a rank's run.
pub(crate) struct RankRun {
    pub(crate) curve: Vec<(usize, f32, f32)>,
    pub(crate) seconds: f64,
}

/// Rank `rank` of `parts` ranks training on the global batches of a
/// `world`-rank schedule (the reference: `parts` = 1).
#[allow(clippy::too_many_arguments)]
pub(crate) fn train_rank<E: Exec, R: Reducer<E>>(
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
    let pool = data_pool(s, world, stores);
    let mut order = Rng::new(s.seed ^ 0x0d0e ^ rank as u64);
    let run = Setup::new(e, p)?;
    let (l0, a0) = run.evaluate(e)?;
    let mut curve = vec![(0, l0, a0)];
    let started = Instant::now();
    // One batch prefetched: uploaded (on the executor's upload stream) in
    // the middle of the step before its own, so it lands among that step's
    // activations and outlives them (the holes the arena compacts).
    let mut next = Some(rank_batch(e, s, world, rank, parts, 1, &pool)?);
    for t in 1..=s.steps {
        let RankBatch { x, y, n, g } = next.take().ok_or("no batch")?;
        e.await_upload(&x)?;
        label(e, &run.teacher, &x, &y, n)?;
        let mut fwd = forward(e, &run.net, &x, n, true)?;
        let logits = fwd.z.pop().ok_or("no logits")?;
        let dlogits = loss(e, &logits, &y, n, &run.train_metrics, true)?.ok_or("no gradient")?;
        drop(logits);
        if t < s.steps {
            next = Some(rank_batch(e, s, world, rank, parts, t + 1, &pool)?);
        }
        // The kernel gives the gradient of this rank's mean loss: times n,
        // the sum over its rows.
        e.run(Kernel::Scale {
            x: h(&dlogits),
            len: n * CLASSES,
            s: n as f32,
        })?;
        let grads = backward(e, &run.net, &x, n, fwd, dlogits, |e, _, g| red.bucket(e, g))?;
        red.wait(e)?;
        let inv = 1.0 / g as f32;
        for (l, (gw, gb)) in run.net.layers.iter().zip(&grads) {
            for (x, len) in [(gw, l.fan_in * l.fan_out), (gb, l.fan_out)] {
                e.run(Kernel::Scale {
                    x: h(x),
                    len,
                    s: inv,
                })?;
            }
        }
        update(e, &run.net, grads, s.lr_at(t - 1), s.momentum, &mut order)?;
        drop((x, y));
        if t % s.every == 0 || t == s.steps {
            let (l, a) = run.evaluate(e)?;
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
pub(crate) fn rank_arena(
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

pub(crate) fn compactions(st: &Stats) -> u64 {
    st.targeted_compactions + st.full_compactions
}

// ---- the GPU rank ----------------------------------------------------------------

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
        self.stream.join(e.arena.backend().stream())?;
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
        e.arena.backend().stream().join(&self.stream)?;
        Ok(())
    }
}

/// One rank on `device`: its arena (1.05 x its peak), its
/// communication stream, its run; returns the run, its statistics and
/// the dry run's prediction.
pub(crate) fn rank_run(
    d: &Ddp,
    p: &Problem,
    world: usize,
    rank: usize,
    device: usize,
    comm: Communicator,
) -> Res<(RankRun, Stats, Stats, u64)> {
    let (peak, config, predicted) = rank_arena(p, &d.s, world, rank, world)?;
    let mut g = Gpu::on_device(device, config, false)?;
    let stream = comm.stream().clone();
    let id = g.arena.register_stream(stream.clone())?;
    let mut red = Nccl { comm, id, stream };
    let run = train_rank(&mut g, &mut red, p, &d.s, world, rank, world, rank == 0)?;
    red.comm.synchronize()?;
    Ok((run, g.arena.stats(), predicted, peak))
}
