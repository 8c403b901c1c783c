//! The run's settings and its command line.

use std::ffi::OsString;
use std::str::FromStr;

use lexopt::prelude::*;

use super::*;

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) steps: usize,
    pub(crate) min_batch: usize,
    pub(crate) max_batch: usize,
    /// Print (and evaluate) every this many steps.
    pub(crate) every: usize,
    pub(crate) lr: f32,
    pub(crate) momentum: f32,
    pub(crate) seed: u64,
    /// The run fails unless its final eval loss is below this.
    pub(crate) target_loss: f32,
    /// Peak live bytes over the arena's capacity (spilling on), or `None`
    /// for an arena that fits (1.05 x peak, no host tier).
    pub(crate) oversubscribe: Option<f64>,
    /// Batches are windows of one pool of inputs made before the loop (a
    /// cheap data loader, so that timings show the device's work) instead
    /// of fresh Gaussian inputs for every batch.
    pub(crate) data_pool: bool,
    /// Time every spill and restore copy with CUDA events (two event
    /// records per copy; off for throughput measurements).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) time_copies: bool,
}

impl Settings {
    pub(crate) fn gpu() -> Self {
        Self {
            steps: 3000,
            min_batch: 16,
            max_batch: 4096,
            every: 250,
            lr: 0.05,
            momentum: 0.9,
            seed: 0x5eed_c0de,
            target_loss: GPU_TARGET_LOSS,
            oversubscribe: None,
            data_pool: false,
            time_copies: true,
        }
    }

    pub(crate) fn cpu() -> Self {
        // Host math is slower: fewer, smaller steps with a larger learning
        // rate reach the same target (eval loss 0.43 at step 800).
        Self {
            steps: 800,
            max_batch: 512,
            every: 100,
            lr: 0.2,
            ..Self::gpu()
        }
    }

    /// The short run the GPU is checked against the host reference with.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn check() -> Self {
        Self {
            steps: 4,
            min_batch: 16,
            max_batch: 700,
            every: 4,
            ..Self::gpu()
        }
    }

    /// Cosine decay from `lr` to 0 over the run.
    pub(crate) fn lr_at(&self, step: usize) -> f32 {
        let t = step as f32 / self.steps.max(1) as f32;
        self.lr * 0.5 * (1.0 + (std::f32::consts::PI * t).cos())
    }
}

/// What the command line asks for.
pub(crate) enum Mode {
    Help,
    Gpu(Settings),
    Cpu(Settings),
    Dry(Settings),
}

pub(crate) const HELP: &str = "\
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
    Box::new(UsageError(e.to_string()))
}

/// A bad command line (exit status 2).
#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for UsageError {}

fn value<T: FromStr>(p: &mut lexopt::Parser, name: &str) -> Res<T>
where
    T::Err: std::fmt::Display,
{
    let v = p.value().map_err(usage)?;
    let s = v.to_string_lossy();
    s.parse().map_err(|e| usage(format!("{name} {s}: {e}")))
}

/// Parses the command line (without the program name).
pub(crate) fn parse(args: impl IntoIterator<Item = OsString>) -> Res<Mode> {
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
            Long("steps") => s.steps = value::<usize>(&mut p, "--steps")?.max(1),
            Long("max-batch") => {
                s.max_batch = value::<usize>(&mut p, "--max-batch")?.max(s.min_batch)
            }
            Long("every") => s.every = value::<usize>(&mut p, "--every")?.max(1),
            Long("seed") => s.seed = value(&mut p, "--seed")?,
            Long("lr") => s.lr = value(&mut p, "--lr")?,
            Long("target") => s.target_loss = value(&mut p, "--target")?,
            Long("oversubscribe") => {
                let r: f64 = value(&mut p, "--oversubscribe")?;
                if !(r >= 1.0 && r.is_finite()) {
                    return Err(usage(format!("--oversubscribe {r}: must be a ratio >= 1")));
                }
                s.oversubscribe = Some(r);
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
