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

mod gpu;
mod rank;
mod report;
mod schedule;

use std::process::ExitCode;

use cuarena::fmt_bytes;

use cuarena_mlp::{problem, value, Res, Settings};
use rank::{compactions, rank_arena};

/// What to run, from the command line.
pub(crate) struct Ddp {
    pub(crate) s: Settings,
    /// Ranks of the data-parallel run (the global batch sizes scale with it).
    pub(crate) world: usize,
    pub(crate) mode: DdpMode,
}

pub(crate) enum DdpMode {
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
            Long("world") => world = Some(value::<usize>(&mut p, "--world")?.max(1)),
            Long("rank") => rank = Some(value::<usize>(&mut p, "--rank")?),
            Long("device") => device = Some(value::<usize>(&mut p, "--device")?),
            Long("id-file") => id_file = Some(std::path::PathBuf::from(p.value()?)),
            // The training options both examples take.
            Long(name) => {
                let name = name.to_owned();
                s.option(&name, &mut p)?;
            }
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

/// Every rank's allocation sequence (and the reference's) on metadata
/// arenas: the peaks, capacities and compactions each run will have.
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
        cuarena_mlp::arena_line(peak, &config),
        compactions(&st),
        fmt_bytes(st.bytes_moved)
    );
    for r in 0..d.world {
        let (peak, config, st) = rank_arena(&p, &d.s, d.world, r, d.world)?;
        println!(
            "  rank {r}: {}; {} compactions ({} moves, {} moved), {} allocations",
            cuarena_mlp::arena_line(peak, &config),
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
