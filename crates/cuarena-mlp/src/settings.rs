//! The run's settings and its command line.

use std::str::FromStr;

use lexopt::prelude::*;

use super::*;

#[derive(Debug, Clone)]
pub struct Settings {
    pub steps: usize,
    pub min_batch: usize,
    pub max_batch: usize,
    /// Print (and evaluate) every this many steps.
    pub every: usize,
    pub lr: f32,
    pub momentum: f32,
    pub seed: u64,
    /// The run fails unless its final eval loss is below this.
    pub target_loss: f32,
    /// Peak live bytes over the arena's capacity (spilling on), or `None`
    /// for an arena that fits (1.05 x peak, no host tier).
    pub oversubscribe: Option<f64>,
    /// Batches are windows of one pool of inputs made before the loop (a
    /// cheap data loader, so that timings show the device's work) instead
    /// of fresh Gaussian inputs for every batch.
    pub data_pool: bool,
    /// Time every spill and restore copy with CUDA events (two event
    /// records per copy; off for throughput measurements).
    pub time_copies: bool,
}

impl Settings {
    pub fn gpu() -> Self {
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

    pub fn cpu() -> Self {
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
    pub fn check() -> Self {
        Self {
            steps: 4,
            min_batch: 16,
            max_batch: 700,
            every: 4,
            ..Self::gpu()
        }
    }

    /// Cosine decay from `lr` to 0 over the run.
    pub fn lr_at(&self, step: usize) -> f32 {
        let t = step as f32 / self.steps.max(1) as f32;
        self.lr * 0.5 * (1.0 + (std::f32::consts::PI * t).cos())
    }
}

/// The value of option `name` (the parser's next argument) as a `T`.
pub fn value<T: FromStr>(p: &mut lexopt::Parser, name: &str) -> Res<T>
where
    T::Err: std::fmt::Display,
{
    let v = p.value()?;
    let s = v.to_string_lossy();
    Ok(s.parse().map_err(|e| format!("{name} {s}: {e}"))?)
}

impl Settings {
    /// Applies `--name`, one of the training options both examples take
    /// (`--steps N`, `--max-batch N`, `--every N`, `--seed N`, `--lr X`,
    /// `--target X`), its value read from `p`; any other name is an error.
    pub fn option(&mut self, name: &str, p: &mut lexopt::Parser) -> Res<()> {
        match name {
            "steps" => self.steps = value::<usize>(p, "--steps")?.max(1),
            "max-batch" => self.max_batch = value::<usize>(p, "--max-batch")?.max(self.min_batch),
            "every" => self.every = value::<usize>(p, "--every")?.max(1),
            "seed" => self.seed = value(p, "--seed")?,
            "lr" => self.lr = value(p, "--lr")?,
            "target" => self.target_loss = value(p, "--target")?,
            _ => return Err(Long(name).unexpected().into()),
        }
        Ok(())
    }
}
