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
//! The loop itself is the `cuarena-mlp` crate (`crates/cuarena-mlp/`),
//! which `train_ddp` and the spill bench share; this file is its command
//! line. The kernels (`mlp.cu`) are compiled at run time with NVRTC for
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

use std::error::Error;
use std::ffi::OsString;
use std::process::ExitCode;

use cuarena::backend::cuda::CudaBackend;
use cuarena_mlp::{run_cpu, run_dry, run_gpu, value, Res, Settings};
use lexopt::prelude::*;

fn main() -> ExitCode {
    let mode = match parse(std::env::args_os().skip(1)) {
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

/// What the command line asks for.
enum Mode {
    Help,
    Gpu(Settings),
    Cpu(Settings),
    Dry(Settings),
}

const HELP: &str = "\
train_mlp: an MLP (64 -> 256 -> 256 -> 10) trained in one cuarena arena, with
variable batch sizes so that the arena (1.05 x the peak of live bytes) compacts
while training goes on

usage: cargo run --release --example train_mlp -- [--cpu | --dry] [options]

modes:
  (default)          on a CUDA GPU: NVRTC kernels from mlp.cu, 3000 steps,
                     batches 16..4096, lr 0.05; first checked against the host
                     reference on a short run. Target: final eval loss < 0.5.
                     Without a GPU it says so and exits 0.
  --cpu              the same loop on the host backend with host math (the
                     reference the GPU is checked against; no GPU used): 800
                     steps, batches 16..512, lr 0.2. Target: final eval loss < 0.5.
  --dry              the GPU run's allocation sequence on a metadata arena: the
                     compactions it will make (placement depends only on that
                     sequence); no bytes, no GPU

options (each overrides the mode's default):
  --steps N          training steps
  --max-batch N      largest batch (batch sizes are uniform in 16..N)
  --every N          evaluate and print every N steps
  --seed N           seed of the teacher, the data and the schedule
  --lr X             peak learning rate (cosine decay to 0)
  --target X         final eval loss the run must get below
  --oversubscribe R  R >= 1: the arena holds only peak live / R, with a host tier
                     of 2 x peak live (spilling least recently used tensors); on
                     the GPU the run that fits is made first and the loss curves
                     must match exactly
  --data-pool        batches are windows of one pool of inputs made up front (a
                     cheap data loader)
  -h, --help         this text

exit status: 0 when the target is reached (or no GPU: skipped), 1 when it is
missed or a check fails, 2 on a bad command line";

fn usage(e: impl ToString) -> Box<dyn Error> {
    e.to_string().into()
}

/// Parses the command line (without the program name).
fn parse(args: impl IntoIterator<Item = OsString>) -> Res<Mode> {
    let args: Vec<OsString> = args.into_iter().collect();
    let cpu = args.iter().any(|a| a == "--cpu");
    let dry = args.iter().any(|a| a == "--dry");
    if cpu && dry {
        return Err(usage("--cpu and --dry are two modes; give one"));
    }
    let mut s = if cpu {
        Settings::cpu()
    } else {
        Settings::gpu()
    };
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next().map_err(usage)? {
        match arg {
            Short('h') | Long("help") => return Ok(Mode::Help),
            Long("cpu") | Long("dry") => {}
            Long("data-pool") => s.data_pool = true,
            Long("oversubscribe") => {
                let r: f64 = value(&mut p, "--oversubscribe")?;
                if !(r >= 1.0 && r.is_finite()) {
                    return Err(usage(format!("--oversubscribe {r}: must be a ratio >= 1")));
                }
                s.oversubscribe = Some(r);
            }
            // The training options both examples take.
            Long(name) => {
                let name = name.to_owned();
                s.option(&name, &mut p)?;
            }
            other => return Err(usage(other.unexpected())),
        }
    }
    Ok(if cpu {
        Mode::Cpu(s)
    } else if dry {
        Mode::Dry(s)
    } else {
        Mode::Gpu(s)
    })
}
