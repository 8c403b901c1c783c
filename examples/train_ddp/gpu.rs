//! The runs on GPUs: one thread per visible GPU (the single-GPU reference,
//! then the data-parallel run, compared), or one process per GPU
//! bootstrapped through an id file.

use std::time::{Duration, Instant};

use cuarena::backend::cuda::cudarc::driver::CudaContext;
use cuarena::backend::cuda::nccl::{self, Communicator, UniqueId};
use cuarena::backend::cuda::CudaBackend;
use cuarena::Stats;

use crate::rank::{rank_arena, rank_run, train_rank, Alone, RankRun};
use crate::report::{compare, report_arena};
use crate::{Ddp, DdpMode};
use cuarena_mlp::gpu::Gpu;
use cuarena_mlp::{problem, Res};

/// The threads or the process run, or a line saying why there is none
/// (no GPU, no libnccl: exit status 0).
pub(crate) fn run_or_skip(d: &Ddp) -> Res<()> {
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

fn run_threads(d: &Ddp) -> Res<()> {
    let visible = usize::try_from(CudaContext::device_count()?)?;
    let world = if d.world == 0 { visible } else { d.world };
    if world > visible {
        return Err(format!("--world {world}: only {visible} GPUs visible").into());
    }
    let p = problem(&d.s);
    println!(
        "train_ddp: world {world} (one thread per GPU), {} steps, global batches {}..{} split unevenly per rank",
        d.s.steps,
        world * d.s.min_batch,
        world * d.s.max_batch
    );

    // 1. The single-GPU reference on the same global batches.
    let (peak, config, predicted) = rank_arena(&p, &d.s, world, 0, 1)?;
    let mut g = Gpu::on_device(0, config, false)?;
    let reference = train_rank(&mut g, &mut Alone, &p, &d.s, world, 0, 1, false)?;
    println!(
        "single-GPU reference: {} steps in {:.2} s",
        d.s.steps, reference.seconds
    );
    report_arena("single-GPU reference", &g.arena.stats(), &predicted, peak)?;
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
                let p = &p;
                sc.spawn(move || rank_run(d, p, world, rank, rank, comm).map_err(|e| e.to_string()))
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
        report_arena(&format!("rank {rank}"), &st, &predicted, peak)?;
        runs.push(run);
    }
    compare(&reference, &runs[0], d.s.target_loss)
}

/// One process per GPU, bootstrapped through `id_file`.
fn run_process(d: &Ddp, rank: usize, id_file: &std::path::Path, device: Option<usize>) -> Res<()> {
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
    let (run, st, predicted, peak) = rank_run(d, &p, world, rank, device, comm)?;
    report_arena(&format!("rank {rank}"), &st, &predicted, peak)?;
    let last = run.curve.last().ok_or("no evaluation")?;
    println!(
        "rank {rank} of {world}: final eval loss {:.5} acc {:.3} after {} steps in {:.2} s",
        last.1, last.2, d.s.steps, run.seconds
    );
    Ok(())
}
