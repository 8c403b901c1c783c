//! GPT-2 small (124M) trained on arena tensors: every weight, gradient,
//! optimizer moment, activation and temporary is a block of one arena whose
//! capacity is the run's own peak of live bytes; GEMMs go to cuBLAS, the
//! rest to our kernels (`gpt2.cu`, compiled with NVRTC). Each step has its
//! own batch size and sequence length, the shapes that fragment a caching
//! allocator. The same loop runs on plain cudarc allocations for the speed
//! comparison, and on a metadata arena (no GPU) for the capacity.
//!
//! `cargo run --release -p cuarena-gpt2 -- --help` lists the options.

// `unsafe` only for launches, cuBLAS and the workspace (cuda.rs), each
// block with its reason.
#![deny(clippy::undocumented_unsafe_blocks)]

mod cli;
mod cuda;
mod ddp;
mod dev;
mod layers;
mod load;
mod model;
mod report;
mod train;

use std::process::ExitCode;
use std::time::Instant;

use cuarena::fmt_bytes;

use cli::{Mem, Settings};
use dev::{Dev, Dry};
use model::{Batch, Layout, Start};
use train::{State, Trainer};

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let s = match cli::parse(std::env::args_os().skip(1)) {
        Ok(Some(s)) => s,
        Ok(None) => {
            println!("{}", cli::HELP);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("gpt2: {e}\n(see `--help`)");
            return ExitCode::from(2);
        }
    };
    match run(&s) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpt2: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(s: &Settings) -> Res<()> {
    let start = match &s.init {
        Some(path) => load::load(path, s.steps)?,
        None => model::synthetic(
            model::Config::GPT2,
            s.steps.unwrap_or(100),
            (64, 1024),
            (4, 16),
            s.seed,
        ),
    };
    let lay = Layout::new(start.cfg);
    let steps = start.batches.len();
    let tokens: usize = start.batches.iter().map(|b| b.b * b.t).sum();
    println!(
        "GPT-2: {} layers, d_model {}, {} heads, vocabulary {}, {} parameters; {} steps, batch {}..{}, length {}..{} ({} tokens); {}",
        start.cfg.layers,
        start.cfg.c,
        start.cfg.heads,
        start.cfg.vocab,
        lay.total,
        steps,
        start.batches.iter().map(|b| b.b).min().unwrap_or(0),
        start.batches.iter().map(|b| b.b).max().unwrap_or(0),
        start.batches.iter().map(|b| b.t).min().unwrap_or(0),
        start.batches.iter().map(|b| b.t).max().unwrap_or(0),
        tokens,
        if s.bf16 { "bf16 mixed precision" } else { "fp32" },
    );
    if let Some((i, b)) = start
        .batches
        .iter()
        .enumerate()
        .find(|(_, b)| b.b < s.world)
    {
        return Err(format!(
            "--world {}: step {i} has a batch of {} rows, and each GPU needs one; give at most {}",
            s.world,
            b.b,
            start.batches.iter().map(|b| b.b).min().unwrap_or(0)
        )
        .into());
    }
    // The run's own allocation sequence on a metadata arena: its peak of
    // live bytes is the arena's capacity (times --headroom).
    let whole = ddp::shard(&start.batches, 1, 0);
    let (peak, capacity) = capacity_of(&lay, &start, &whole, s, "dry run")?;
    if s.dry {
        // Each rank's own sequence, as `--world` would run it.
        for r in (0..s.world).filter(|_| s.world > 1) {
            let sh = ddp::shard(&start.batches, s.world, r);
            capacity_of(
                &lay,
                &start,
                &sh,
                s,
                &format!("rank {r} of {} dry run", s.world),
            )?;
        }
        return Ok(());
    }
    if let Err(reason) = cuarena::backend::cuda::CudaBackend::available() {
        println!("gpt2 needs a CUDA GPU: {reason}; skipping (`--dry` runs the allocation sequence without one).");
        return Ok(());
    }
    #[cfg(feature = "nccl")]
    ddp::check_devices(s.world)?;
    if let Some(p) = &s.check_grads {
        load::read_bounded(p).map(drop)?;
    }
    // Runs alternate (arena, plain, arena, ..., and the data-parallel run
    // after each round): the card's clocks drift by a few percent from run
    // to run, which one pair would mistake for the allocator's cost.
    #[cfg(feature = "nccl")]
    let caps = match s.world {
        1 => Vec::new(),
        _ => ddp::capacities(s, &lay, &start)?,
    };
    let mut runs = Vec::new();
    #[cfg(feature = "nccl")]
    let mut world_runs = Vec::new();
    for _ in 0..s.repeat {
        for mem in s.mems() {
            let mut d = match mem {
                Mem::Arena => cuda::Cuda::arena(0, capacity)?,
                Mem::Plain => cuda::Cuda::plain()?,
                Mem::Elastic => cuda::Cuda::elastic(0)?,
            };
            runs.push(train_on(&mut d, mem, mem.name(), &lay, &start, &whole, s)?);
        }
        #[cfg(feature = "nccl")]
        if s.world > 1 {
            let progress = world_runs.is_empty();
            world_runs.push(ddp::run(s, &lay, &start, &caps, progress)?);
        }
    }
    report::finish(s, &start, peak, capacity, &runs)?;
    #[cfg(feature = "nccl")]
    if s.world > 1 {
        let single: Vec<_> = runs.iter().filter(|r| r.mem == Mem::Arena).collect();
        ddp::report(s, &start, &caps, &single, &world_runs)?;
    }
    Ok(())
}

/// Peak live bytes of `steps` on a metadata arena, and the capacity the
/// arena gets (the peak times --headroom), with the compactions predicted
/// at that capacity.
fn capacity_of(
    lay: &Layout,
    start: &Start,
    steps: &[(Batch, usize)],
    s: &Settings,
    what: &str,
) -> Res<(u64, u64)> {
    let peak = dry(lay, start, steps, s, 1 << 50)?.peak_allocated_bytes;
    let capacity = ((peak as f64 * s.headroom).ceil() as u64).div_ceil(256) * 256;
    let t0 = Instant::now();
    let predicted = dry(lay, start, steps, s, capacity)?;
    println!(
        "{what}: peak live {}; arena capacity {} ({:.4} x peak); predicted {} compactions ({} targeted, {} full), {} moved ({:.1} ms on the host)",
        fmt_bytes(peak),
        fmt_bytes(capacity),
        capacity as f64 / peak as f64,
        predicted.targeted_compactions + predicted.full_compactions,
        predicted.targeted_compactions,
        predicted.full_compactions,
        fmt_bytes(predicted.bytes_moved),
        t0.elapsed().as_secs_f64() * 1e3
    );
    Ok((peak, capacity))
}

/// The allocation sequence of `steps` (a batch and its global batch's
/// rows) on a metadata arena of `capacity` bytes.
fn dry(
    lay: &Layout,
    start: &Start,
    steps: &[(Batch, usize)],
    s: &Settings,
    capacity: u64,
) -> Res<cuarena::Stats> {
    let mut d = Dry::new(capacity)?;
    let st = Trainer::setup(&mut d, lay, None, steps.len(), s.bf16)?;
    let mut tr = Trainer::new(&mut d, lay, &st, start.hyper, s.bf16);
    for (i, (b, rows)) in steps.iter().enumerate() {
        tr.step(i, b, *rows, &mut |_, _| Ok(()))
            .map_err(|e| format!("dry run, step {i} (batch {} x {}): {e}", b.b, b.t))?;
    }
    Ok(d.arena.stats())
}

/// One training run on `d`; step 0 is a warm-up, left out of the timing
/// (tokens are counted over the global batches). `label` prefixes the
/// progress lines; "" prints none.
pub fn train_on(
    d: &mut cuda::Cuda,
    mem: Mem,
    label: &str,
    lay: &Layout,
    start: &Start,
    steps: &[(Batch, usize)],
    s: &Settings,
) -> Res<report::Run> {
    let n = steps.len();
    let st: State = Trainer::setup(d, lay, Some(&start.weights), n, s.bf16)?;
    let mut grads_report = None;
    let mut t0 = Instant::now();
    let mut timed_tokens = 0usize;
    for (i, (b, rows)) in steps.iter().enumerate() {
        let mut check = |dd: &mut cuda::Cuda, st: &State| -> Res<()> {
            if i == 0 {
                if let Some(path) = &s.check_grads {
                    grads_report = Some(report::check_grads(dd, st, lay, path)?);
                }
            }
            Ok(())
        };
        Trainer::new(d, lay, &st, start.hyper, s.bf16)
            .step(i, b, *rows, &mut check)
            .map_err(|e| format!("{label} run, step {i} (batch {} x {}): {e}", b.b, b.t))?;
        if i == 0 {
            d.sync()?;
            d.host = cuda::HostTime::default();
            t0 = Instant::now();
        } else {
            timed_tokens += rows * b.t;
        }
        if !label.is_empty() && ((i + 1) % s.every == 0 || i + 1 == n) {
            let losses = report::f32s(&d.download(st.losses)?);
            let el = t0.elapsed().as_secs_f64();
            println!(
                "[{label}] step {:>4}/{n}  batch {:>2} x {:>4}  loss {:.4}  {:.0} tokens/s",
                i + 1,
                rows,
                b.t,
                losses[i],
                timed_tokens as f64 / el.max(1e-9)
            );
        }
    }
    d.sync()?;
    let time = t0.elapsed().as_secs_f64();
    Ok(report::Run {
        mem,
        losses: report::f32s(&d.download(st.losses)?),
        norms: report::f32s(&d.download(st.norms)?),
        time_s: time,
        tokens: timed_tokens,
        stats: d.stats(),
        grads: grads_report,
        host: d.host.clone(),
        backend: d.backend_stats(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loop's allocation sequence on a tiny model: every step frees
    /// what it allocated, and the run completes in an arena of exactly its
    /// peak live bytes (the capacity the GPU run is given).
    #[test]
    fn dry_run_frees_every_step_and_fits_its_peak() {
        let cfg = model::Config {
            vocab: 97,
            ctx: 48,
            c: 32,
            layers: 2,
            heads: 4,
        };
        for bf16 in [false, true] {
            let start = model::synthetic(cfg, 12, (3, 48), (2, 5), 7);
            let lay = Layout::new(cfg);
            let s = cli::parse(Vec::<std::ffi::OsString>::new())
                .unwrap()
                .unwrap();
            let s = Settings { bf16, ..s };
            let whole = ddp::shard(&start.batches, 1, 0);
            let big = dry(&lay, &start, &whole, &s, 1 << 40).unwrap();
            let persistent = if bf16 { 9 } else { 8 }; // with cuBLAS's workspace
            assert_eq!(big.live_blocks, persistent, "bf16 {bf16}");
            let fit = dry(&lay, &start, &whole, &s, big.peak_allocated_bytes).unwrap();
            assert_eq!(fit.live_blocks, persistent);
            assert!(fit.peak_allocated_bytes <= big.peak_allocated_bytes);
            // Each rank of two replays its own rows, and fits its own peak.
            for r in 0..2 {
                let sh = ddp::shard(&start.batches, 2, r);
                let own = dry(&lay, &start, &sh, &s, 1 << 40).unwrap();
                assert_eq!(own.live_blocks, persistent);
                assert!(own.peak_allocated_bytes <= big.peak_allocated_bytes);
                dry(&lay, &start, &sh, &s, own.peak_allocated_bytes).unwrap();
            }
            // One byte less than the peak cannot hold it.
            assert!(dry(&lay, &start, &whole, &s, big.peak_allocated_bytes - 256).is_err());
        }
    }
}
