//! The MLP training loop on one cuarena arena that the `train_mlp` and
//! `train_ddp` examples and the spill bench (`benches/spill.rs`) share: an
//! MLP (64 → 256 → 256 → 10, ReLU, softmax cross-entropy, SGD with
//! momentum) learns to imitate a fixed random "teacher" MLP on Gaussian
//! inputs, with batch sizes drawn every step, so that an arena of 1.05 x
//! the peak of live bytes compacts while training goes on.
//!
//! - [`Kernel`]: the loop's kernels as values (operands, sizes); [`Exec`]
//!   runs them: `gpu::Gpu` (feature `cuda`: the kernels of `mlp.cu`,
//!   compiled with NVRTC and launched on the arena stream through
//!   `kernel_args`), [`Cpu`] (the host reference, on a host arena) and
//!   [`Dry`] (a metadata arena: the allocation sequence only). Every
//!   executor makes a kernel's operands resident in the order
//!   [`Kernel::operands`] gives, so the three make the same placement and
//!   spill decisions.
//! - [`train`]: the model on the arena (parameters, forward and backward
//!   passes, the data loader that prefetches batches on a second stream,
//!   the evaluations); [`Setup`] is what a run uploads first.
//! - [`capacity_for`]: the arena sized from a dry run of the same
//!   sequence; [`summary_of_run`], [`integrity::check_every_tensor`]: the checks.
//! - [`run_cpu`], [`run_dry`] and `run_gpu`: the `train_mlp` example's
//!   modes (its documentation says what each does and checks).

mod exec;
#[cfg(feature = "cuda")]
pub mod gpu;
#[cfg(feature = "cuda")]
mod gpu_run;
pub mod integrity;
mod model;
mod reference;
mod report;
mod settings;

use std::collections::VecDeque;
use std::error::Error;
use std::time::Instant;

use cuarena::backend::{Backend, HostBackend, MetaBackend};
use cuarena::{fmt_bytes, Arena, ArenaConfig, Handle, Stats, Storage, StreamId};

pub use exec::*;
#[cfg(feature = "cuda")]
pub use gpu_run::*;
pub use model::*;
pub use reference::*;
pub use report::*;
pub use settings::*;

pub type Res<T> = Result<T, Box<dyn Error>>;

pub const IN: usize = 64;
pub const HIDDEN: usize = 256;
pub const CLASSES: usize = 10;
pub const TEACHER_HIDDEN: usize = 16;
pub const EVAL_ROWS: usize = 2048;
/// The GPU run fails unless its final eval loss is below this (`--cpu`
/// has the same target, `--target` sets another).
pub const GPU_TARGET_LOSS: f32 = 0.5;
/// Batches the data loader keeps ready (each allocated in the middle of an
/// earlier step).
pub const PREFETCH: usize = 3;
/// Arena capacity over the dry run's peak of live bytes.
pub const HEADROOM: f64 = 1.05;
/// Host tier over the dry run's peak of live bytes, when oversubscribed.
pub const HOST_TIER: f64 = 2.0;

/// Teacher, initial student and eval inputs.
pub struct Problem {
    pub teacher: HostNet,
    pub student: HostNet,
    pub eval_x: Vec<f32>,
}

/// The problem of a seed.
pub fn problem(s: &Settings) -> Problem {
    let mut rng = Rng::new(s.seed);
    let teacher = make_teacher(&mut rng);
    let student = HostNet::random(&[IN, HIDDEN, HIDDEN, CLASSES], 0.25, &mut rng);
    let eval_x = (0..EVAL_ROWS * IN).map(|_| rng.normal()).collect();
    Problem {
        teacher,
        student,
        eval_x,
    }
}

fn describe(s: &Settings, teacher: &HostNet, eval_x: &[f32]) {
    let mut counts = [0usize; CLASSES];
    for y in teacher.labels(eval_x, EVAL_ROWS) {
        counts[y as usize] += 1;
    }
    println!(
        "model {IN} -> {HIDDEN} -> {HIDDEN} -> {CLASSES} (ReLU, softmax cross-entropy), SGD lr {} (cosine) momentum {}; teacher {IN} -> {TEACHER_HIDDEN} -> {CLASSES}",
        s.lr, s.momentum
    );
    println!(
        "{} steps, batch sizes uniform in {}..{} (prefetched {PREFETCH} ahead), eval batch {EVAL_ROWS} (classes {:?})",
        s.steps, s.min_batch, s.max_batch, counts
    );
}

/// Final checks shared by both runs: eval inputs unchanged after every
/// compaction, labels equal to the host teacher's, the trained weights'
/// loss on the host, and every live tensor unchanged by two more
/// compactions (see [`integrity::check_every_tensor`]).
fn verify<E: Exec>(
    e: &mut E,
    out: &Outcome,
    teacher: &HostNet,
    eval_inputs: &[f32],
    target: f32,
) -> Res<()> {
    // Reads need the blocks resident (spilled ones come back).
    e.arena().make_resident(&[&out.eval_x])?;
    let x_back = e.arena().read::<f32>(h(&out.eval_x))?;
    let same = x_back
        .iter()
        .zip(eval_inputs)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    e.arena().make_resident(&[&out.eval_y])?;
    let y_dev = e.arena().read::<i32>(h(&out.eval_y))?;
    let y_host = teacher.labels(eval_inputs, EVAL_ROWS);
    let agree = y_dev.iter().zip(&y_host).filter(|(a, b)| a == b).count();
    let trained = out.net.download(e)?;
    let (hl, ha) = host_eval(&trained, eval_inputs, &y_dev);
    let last = out.curve.last().ok_or("no evaluation")?;
    println!(
        "integrity: eval inputs {} after all compactions; labels computed in the arena agree with the host teacher's on {agree}/{EVAL_ROWS}; \
         trained weights re-evaluated on the host: eval loss {hl:.4} acc {ha:.3} (the run said {:.4} / {:.3})",
        if same { "bit-exact" } else { "CHANGED" },
        last.eval_loss,
        last.eval_acc
    );
    if !same {
        return Err("the eval inputs changed while the arena compacted".into());
    }
    if (hl - last.eval_loss).abs() > 1e-3 * hl.max(1.0) {
        return Err("the device's eval loss disagrees with the host's on the same weights".into());
    }
    if agree + 4 < EVAL_ROWS {
        return Err("device and host teacher labels disagree on more than a few rows".into());
    }
    integrity::check_every_tensor(e, out)?;
    let last_loss = last.eval_loss;
    if last_loss < target {
        println!("target reached: final eval loss {last_loss:.4} < {target}");
        Ok(())
    } else {
        Err(format!("target missed: final eval loss {last_loss:.4} >= {target}").into())
    }
}

/// The GPU run's allocation sequence on a metadata arena of the same
/// capacity: the same placements and compactions, no bytes, no GPU.
/// The statistics of `train(s)` on an arena of `capacity`, as predicted by
/// a metadata arena: placement and compaction depend only on the sequence
/// of allocations and frees, not on the bytes.
fn predict(p: &Problem, s: &Settings, config: &ArenaConfig) -> Res<Stats> {
    let mut dry = Dry::new(config.clone())?;
    train(&mut dry, p, s, false)?;
    Ok(dry.arena.stats())
}

/// "peak live …; arena capacity … (… x peak)[, host tier …]".
pub fn arena_line(peak: u64, config: &ArenaConfig) -> String {
    let mut line = format!(
        "peak live {}; arena capacity {} ({:.3} x peak)",
        fmt_bytes(peak),
        fmt_bytes(config.capacity_bytes),
        config.capacity_bytes as f64 / peak.max(1) as f64
    );
    if config.spill_host_bytes > 0 {
        line += &format!(", host tier {}", fmt_bytes(config.spill_host_bytes));
    }
    line
}

/// `train_mlp --dry`: the run's allocation sequence on a metadata arena
/// of the capacity the GPU run gets, and what it predicts.
pub fn run_dry(s: Settings) -> Res<()> {
    let p = problem(&s);
    let (peak, config) = capacity_for(&p, &s)?;
    let t0 = Instant::now();
    let st = predict(&p, &s, &config)?;
    println!(
        "dry run of {} steps (batches {}..{}) in {:.1} ms: {}; {} compactions ({} targeted, {} full), {} moves, {} moved, {} allocations; {} evictions ({}), {} restores ({})",
        s.steps,
        s.min_batch,
        s.max_batch,
        t0.elapsed().as_secs_f64() * 1e3,
        arena_line(peak, &config),
        st.targeted_compactions + st.full_compactions,
        st.targeted_compactions,
        st.full_compactions,
        st.moves,
        fmt_bytes(st.bytes_moved),
        st.allocs,
        st.evictions,
        fmt_bytes(st.bytes_evicted),
        st.restores,
        fmt_bytes(st.bytes_restored)
    );
    Ok(())
}

/// `train_mlp --cpu`: the loop on a host arena with the host math, with
/// the checks of a GPU run.
pub fn run_cpu(s: Settings) -> Res<()> {
    println!("train_mlp on the host reference (no GPU used)");
    let p = problem(&s);
    describe(&s, &p.teacher, &p.eval_x);
    let (peak, config) = capacity_for(&p, &s)?;
    println!("dry run: {}", arena_line(peak, &config));
    let mut cpu = Cpu::new(config.clone())?;
    let out = train(&mut cpu, &p, &s, true)?;
    let predicted = predict(&p, &s, &config)?;
    summary_of_run(&cpu.arena, peak, &predicted, &out, &s)?;
    verify(&mut cpu, &out, &p.teacher, &p.eval_x, s.target_loss)
}
