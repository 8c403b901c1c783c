//! A real training loop on the arena: an MLP (64 → 256 → 256 → 10, ReLU,
//! softmax cross-entropy, SGD with momentum) learns to imitate a fixed
//! random "teacher" MLP on Gaussian inputs.
//!
//! `cargo run --release --example train_mlp` (needs a CUDA GPU; without one
//! it says so and exits 0). `-- --cpu` runs the same loop on the host
//! backend with host implementations of the kernels (slower: fewer steps,
//! smaller batches, a larger learning rate, the same target): the reference
//! the GPU is checked against. `-- --help` lists the options. `-- --dry` replays
//! the GPU run's allocation sequence on a metadata arena and prints the
//! compactions it will make (placement depends only on that sequence).
//! Also `--steps N`, `--max-batch N`, `--every N`, `--seed N`, `--lr X`.
//!
//! `--oversubscribe R` (R >= 1, e.g. 1.5) gives the arena only peak live / R
//! bytes and a host tier of 2 x peak live (page-locked memory on the GPU):
//! the working set no longer fits, and the arena spills least recently used
//! tensors to the tier and brings them back when a kernel needs them. Every
//! launch first calls `make_resident(&[operands...])`, so a tensor in use by
//! the current launch is never the victim. On the GPU, the run that fits
//! (1.05 x peak, no tier) is made first with the same seed, and the two loss
//! curves are compared: the math is identical, so they should match
//! exactly. Spill and restore copies are timed with CUDA events.
//! `--data-pool` draws batches from one pool of inputs made up front (a
//! cheap data loader: the host's Gaussian sampling otherwise dominates the
//! step time); `benches/spill.rs` times the loop that way.
//!
//! Every tensor lives in one arena: weights, momentum, gradients,
//! activations, the batch's inputs and labels, and the loss accumulators.
//! Batch sizes are drawn uniformly from 16..4096 every step, batches are
//! prefetched three ahead in the middle of steps (as a data loader would),
//! and activations and gradients are freed in an order that leaves holes.
//! The arena is sized to 1.05 × the peak of live bytes, measured by a dry
//! run of the very same allocation sequence on a metadata-only arena, so
//! allocations regularly fit in the free bytes but in no hole: the arena
//! compacts (moving live tensors with its own kernels) and training goes on.
//!
//! The kernels (`mlp.cu`) are compiled at run time with NVRTC for
//! the device's architecture and launched on the arena stream through
//! `kernel_args(StreamId::ARENA)`: the operands are made resident first,
//! then their views are taken, and the views borrow the arena until the
//! launch is enqueued, so nothing can move between an address and its
//! kernel. Uploads do not go on the arena stream: the data loader copies
//! each prefetched batch on a second stream registered with the arena
//! (`register_stream`), into a view from `kernel_args` for that stream,
//! which makes the copy wait for the arena's moves so far and records the
//! use (the arena waits for the copy before it moves, spills or frees the
//! batch); the arena stream waits for the upload (a stream wait, not the
//! host) before the batch's first kernel.
//!
//! Before the real run, a short run is made twice with the same seeds and
//! the same tight capacity, once on the GPU and once on the host reference,
//! and the weights' updates are compared. After it, the eval inputs (moved
//! by compactions or not) are compared bit for bit with what was uploaded,
//! and the trained weights are evaluated on the host. Last, every tensor
//! the run still holds (weights, momentum, eval inputs and labels, any
//! other live block) is downloaded, the arena is made to compact (an
//! allocation one granule larger than its largest hole forces a targeted
//! compaction, then a full `compact()`), and every tensor is downloaded
//! again after each and compared bit for bit (GPU and `--cpu` runs).

mod exec;
#[cfg(feature = "cuda")]
pub(crate) mod gpu;
#[cfg(feature = "cuda")]
mod gpu_run;
mod integrity;
mod model;
mod reference;
mod report;
mod settings;

use std::collections::VecDeque;
use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

use cuarena::backend::{Backend, HostBackend, MetaBackend};
use cuarena::{fmt_bytes, Arena, ArenaConfig, Handle, Stats, Storage, StreamId};

pub(crate) use exec::*;
#[cfg(feature = "cuda")]
pub(crate) use gpu_run::*;
pub(crate) use model::*;
pub(crate) use reference::*;
pub(crate) use report::*;
pub(crate) use settings::*;

pub(crate) type Res<T> = Result<T, Box<dyn Error>>;

pub(crate) const IN: usize = 64;
pub(crate) const HIDDEN: usize = 256;
pub(crate) const CLASSES: usize = 10;
pub(crate) const TEACHER_HIDDEN: usize = 16;
pub(crate) const EVAL_ROWS: usize = 2048;
/// The GPU run fails unless its final eval loss is below this (`--cpu`
/// has the same target, `--target` sets another).
pub(crate) const GPU_TARGET_LOSS: f32 = 0.5;
/// Batches the data loader keeps ready (each allocated in the middle of an
/// earlier step).
pub(crate) const PREFETCH: usize = 3;
/// Arena capacity over the dry run's peak of live bytes.
pub(crate) const HEADROOM: f64 = 1.05;
/// Host tier over the dry run's peak of live bytes, when oversubscribed.
pub(crate) const HOST_TIER: f64 = 2.0;

fn main() -> ExitCode {
    let mode = match settings::parse(std::env::args_os().skip(1)) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("train_mlp: {e}\n(see `--help`)");
            return ExitCode::from(2);
        }
    };
    let result = match mode {
        Mode::Help => {
            println!("{HELP}");
            Ok(())
        }
        Mode::Cpu(s) => run_cpu(s),
        Mode::Dry(s) => run_dry(s),
        Mode::Gpu(s) => run_gpu_or_skip(s),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("train_mlp: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The GPU run, or a line saying why there is none (exit status 0).
fn run_gpu_or_skip(s: Settings) -> Res<()> {
    #[cfg(feature = "cuda")]
    {
        use cuarena::backend::cuda::CudaBackend;
        match CudaBackend::available() {
            Ok(()) => run_gpu(s),
            Err(reason) => {
                println!(
                    "train_mlp needs a CUDA GPU (its kernels run on the device): {reason}; skipping. \
                     `--cpu` runs the same loop on the host reference."
                );
                Ok(())
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = s;
        println!(
            "train_mlp needs a CUDA GPU: cuarena was built without the `cuda` feature; skipping. \
             `--cpu` runs the same loop on the host reference."
        );
        Ok(())
    }
}

/// Teacher, initial student and eval inputs.
pub(crate) struct Problem {
    pub(crate) teacher: HostNet,
    pub(crate) student: HostNet,
    pub(crate) eval_x: Vec<f32>,
}

/// The problem of a seed.
pub(crate) fn problem(s: &Settings) -> Problem {
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
    train(&mut dry, &p.teacher, &p.student, &p.eval_x, s, false)?;
    Ok(dry.arena.stats())
}

/// "peak live …; arena capacity … (… x peak)[, host tier …]".
pub(crate) fn arena_line(peak: u64, config: &ArenaConfig) -> String {
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

fn run_dry(s: Settings) -> Res<()> {
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

fn run_cpu(s: Settings) -> Res<()> {
    println!("train_mlp on the host reference (no GPU used)");
    let p = problem(&s);
    describe(&s, &p.teacher, &p.eval_x);
    let (peak, config) = capacity_for(&p, &s)?;
    println!("dry run: {}", arena_line(peak, &config));
    let mut cpu = Cpu::new(config.clone())?;
    let out = train(&mut cpu, &p.teacher, &p.student, &p.eval_x, &s, true)?;
    let predicted = predict(&p, &s, &config)?;
    summary_of_run(&cpu.arena, peak, &predicted, &out, &s)?;
    verify(&mut cpu, &out, &p.teacher, &p.eval_x, s.target_loss)
}
