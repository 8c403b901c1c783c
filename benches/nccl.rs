//! All-reduce on arena tensors against the same bytes in plain cudarc
//! buffers, measured in the same run (feature `nccl`; one process driving
//! every visible GPU, one NCCL group call per iteration).
//!
//! `cargo bench --features nccl --bench nccl` (or the staged executable
//! with `--bench`, see `scripts/gpu-suite.sh`). Without a GPU or libnccl it
//! prints why and exits 0. On one GPU the all-reduce is a copy (world size
//! 1); the figures that matter come from two or more.
//!
//! # Table
//!
//! For sizes 1 MiB to 1 GiB (f32): NCCL bus bandwidth
//! (`bytes / time * 2 (n - 1) / n`) on
//! - **plain**: `CudaSlice<f32>` buffers from cudarc;
//! - **arena**: an owned storage in an `Arena<CudaBackend>` per GPU, taken
//!   as an output view for the communication stream registered with it
//!   (`kernel_args(comm).output(..)`), which records the use;
//! - **arena + compaction**: the same, while each arena compacts 64 MiB of
//!   other, fragmented blocks on its own stream during every all-reduce.
//!
//! Ratios are arena / plain and arena + compaction / plain, from the same
//! run [target: arena / plain >= 0.98 at every size >= 16 MiB]. Times are
//! CUDA events on rank 0's communication stream around `reps` all-reduces
//! (after 2 warm-ups); 7 rounds interleave the three cases, and the
//! medians are compared.
//!
//! Environment: `CUARENA_BENCH_REPS` (default 20), `NCCL_NVLS_ENABLE=0`
//! on the GPU machines (shared/GPU.md).

use std::sync::Arc;
use std::time::Duration;

use cuarena::backend::cuda::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cuarena::backend::cuda::nccl::{self, Communicator, ReduceOp};
use cuarena::backend::cuda::CudaBackend;
use cuarena::DType;
use cuarena::{Arena, ArenaConfig, Storage, StreamId};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const MIB: u64 = 1 << 20;

fn main() {
    if let Err(reason) = CudaBackend::available().and_then(|()| nccl::available()) {
        println!("nccl bench skipped: {reason}");
        return;
    }
    if let Err(e) = run() {
        eprintln!("nccl bench failed: {e}");
        std::process::exit(1);
    }
}

/// One GPU's side: its arena, communication stream, and buffers.
struct Rank {
    arena: Arena<CudaBackend>,
    comm_id: StreamId,
    plain: CudaSlice<f32>,
    tensor: Storage,
    /// Small blocks, every other one freed each iteration to fragment.
    filler: Vec<Storage>,
}

fn run() -> Res<()> {
    let n = CudaContext::device_count()? as usize;
    let reps: usize = std::env::var("CUARENA_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let max_bytes = 1 << 30;
    let mut ranks = Vec::new();
    let mut comm_streams: Vec<Arc<CudaStream>> = Vec::new();
    for ordinal in 0..n {
        // Room for the largest tensor, the filler, and slack to compact in.
        let mut arena = Arena::cuda(ArenaConfig::new(max_bytes + 256 * MIB), ordinal)?;
        let stream = arena.backend().context().new_stream()?;
        let comm_id = arena.register_stream(stream.clone())?;
        let plain = stream.alloc_zeros::<f32>((max_bytes / 4) as usize)?;
        let tensor = arena.alloc_storage_dtype(DType::F32, max_bytes / 4)?;
        arena.fill(&tensor, 0f32)?;
        comm_streams.push(stream);
        ranks.push(Rank {
            arena,
            comm_id,
            plain,
            tensor,
            filler: Vec::new(),
        });
    }
    let comms = Communicator::init_all(comm_streams, Duration::from_secs(120))?;
    let name = ranks[0].arena.backend().device_name().to_string();
    println!("device {name} x {n}, world size {n}, {reps} all-reduces per sample");
    println!();
    println!("| size | plain bus GB/s | arena bus GB/s | arena + compaction bus GB/s | arena / plain | arena + compaction / plain |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut size = MIB;
    let mut worst_ge_16 = f64::INFINITY;
    while size <= max_bytes {
        let elems = (size / 4) as usize;
        // Interleaved: 7 rounds of (plain, arena, arena + compaction), so
        // drifts in clocks or load hit the three alike; medians compared.
        let mut t = [Vec::new(), Vec::new(), Vec::new()];
        for _round in 0..7 {
            for (case, times) in t.iter_mut().enumerate() {
                times.push(timed(&comms, reps, |i| {
                    op(case, i, &comms, &mut ranks, elems)
                })?);
            }
        }
        let [plain, arena, compacting] = t.map(|mut v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        });
        let bus = |t: f64| size as f64 / t * 2.0 * (n as f64 - 1.0).max(1.0) / n as f64 / 1e9;
        let (rp, rc) = (plain / arena, plain / compacting);
        if size >= 16 * MIB {
            worst_ge_16 = worst_ge_16.min(rp);
        }
        println!(
            "| {} MiB | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} |",
            size / MIB,
            bus(plain),
            bus(arena),
            bus(compacting),
            rp,
            rc
        );
        size *= 2;
    }
    println!();
    println!(
        "arena / plain at sizes >= 16 MiB: worst {worst_ge_16:.3} (target >= 0.98): {}",
        if worst_ge_16 >= 0.98 {
            "met"
        } else {
            "NOT met"
        }
    );
    for c in &comms {
        c.synchronize()?;
    }
    for (i, r) in ranks.iter().enumerate() {
        let s = r.arena.stats();
        println!(
            "rank {i}: {} compactions, {} moved during the bench",
            s.targeted_compactions + s.full_compactions,
            cuarena::fmt_bytes(s.bytes_moved)
        );
    }
    Ok(())
}

/// Frees every other filler block (64 blocks of 1 MiB) and compacts, which
/// moves the survivors down past the tensor's neighbours, then refills.
fn fragment_and_compact(r: &mut Rank, i: usize) -> cuarena::Result<()> {
    let parity = i % 2;
    let mut k = 0;
    r.filler.retain(|_| {
        k += 1;
        k % 2 == parity
    });
    r.arena.compact()?;
    while r.filler.len() < 64 {
        r.filler.push(r.arena.alloc_storage(MIB)?);
    }
    Ok(())
}

/// One all-reduce on every rank: 0 plain buffers, 1 arena tensors, 2 arena
/// tensors while each arena compacts other blocks on its own stream.
fn op(
    case: usize,
    i: usize,
    comms: &[Communicator],
    ranks: &mut [Rank],
    elems: usize,
) -> cuarena::Result<()> {
    Communicator::group(comms, || {
        for (c, r) in comms.iter().zip(ranks.iter_mut()) {
            if case == 0 {
                let mut v = r.plain.slice_mut(..elems);
                c.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
            } else {
                let part = r.tensor.slice(0..elems as u64)?;
                let mut args = r.arena.kernel_args(r.comm_id)?;
                let mut v = args.output::<f32>(&part)?;
                c.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
            }
        }
        Ok(())
    })?;
    if case == 2 {
        // While the all-reduces run: fragment and compact other blocks.
        for r in ranks.iter_mut() {
            fragment_and_compact(r, i)?;
        }
    }
    Ok(())
}

/// Seconds per call of `op` over `reps` calls (after 2 warm-ups), timed
/// with events on rank 0's communication stream.
fn timed(
    comms: &[Communicator],
    reps: usize,
    mut op: impl FnMut(usize) -> cuarena::Result<()>,
) -> Res<f64> {
    let stream = comms[0].stream();
    for i in 0..2 {
        op(i)?;
    }
    for c in comms {
        c.synchronize()?;
    }
    let flags = Some(cuarena::backend::cuda::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream.record_event(flags)?;
    for i in 0..reps {
        op(i)?;
    }
    let end = stream.record_event(flags)?;
    for c in comms {
        c.synchronize()?;
    }
    Ok(start.elapsed_ms(&end)? as f64 / 1e3 / reps as f64)
}
