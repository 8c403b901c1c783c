//! Data parallel over the GPUs of one host: one thread, one arena and one
//! NCCL rank per GPU. Every rank starts from the same weights and takes its
//! rows of each global batch; the loss and its gradient are means over the
//! global batch, so the gradient buckets are *summed* over the ranks
//! (all-reduced on each rank's communication stream, registered with its
//! arena, while the backward pass of the earlier layers goes on), and every
//! rank then makes the same update. A rank's loss slot holds its share of
//! the global mean; the host adds the shares.

//!
//! Built with the crate's `nccl` feature; without it `--world` says so.

#[cfg(feature = "nccl")]
use crate::cli::Settings;
use crate::model::Batch;
#[cfg(feature = "nccl")]
use crate::model::{Layout, Start};
#[cfg(feature = "nccl")]
use crate::report::Run;
#[cfg(feature = "nccl")]
use crate::Res;

/// Rank `rank`'s rows of every batch, with the global batch's row count:
/// rows `rank * b / world .. (rank + 1) * b / world`.
pub fn shard(batches: &[Batch], world: usize, rank: usize) -> Vec<(Batch, usize)> {
    batches
        .iter()
        .map(|b| {
            let (r0, r1) = (rank * b.b / world, (rank + 1) * b.b / world);
            let w = b.t + 1;
            let part = Batch {
                b: r1 - r0,
                t: b.t,
                tokens: b.tokens[r0 * w..r1 * w].to_vec(),
            };
            (part, b.b)
        })
        .collect()
}

/// Enough GPUs and NCCL for `world` ranks, checked before any run.
#[cfg(feature = "nccl")]
pub fn check_devices(world: usize) -> Res<()> {
    if world < 2 {
        return Ok(());
    }
    let visible =
        usize::try_from(cuarena::backend::cuda::cudarc::driver::CudaContext::device_count()?)?;
    if world > visible {
        return Err(format!("--world {world}: only {visible} GPUs visible").into());
    }
    if let Err(reason) = cuarena::backend::cuda::nccl::available() {
        return Err(format!("--world {world} needs NCCL: {reason}").into());
    }
    Ok(())
}

/// One data-parallel run: the global losses (the ranks' shares added),
/// the slowest rank's wall time over the timed steps, the tokens of the
/// global batches, and each rank's arena statistics.
#[cfg(feature = "nccl")]
pub struct WorldRun {
    pub losses: Vec<f32>,
    pub time_s: f64,
    pub tokens: usize,
    pub stats: Vec<Option<cuarena::Stats>>,
}

#[cfg(feature = "nccl")]
impl WorldRun {
    fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.time_s.max(1e-9)
    }
}

/// Each rank's peak live bytes (of its own rows' allocation sequence on a
/// metadata arena) and capacity (the peak times --headroom).
#[cfg(feature = "nccl")]
pub fn capacities(s: &Settings, lay: &Layout, start: &Start) -> Res<Vec<(u64, u64)>> {
    (0..s.world)
        .map(|r| {
            let sh = shard(&start.batches, s.world, r);
            crate::capacity_of(lay, start, &sh, s, &format!("rank {r} dry run"))
        })
        .collect()
}

/// Trains the batches once over `s.world` GPUs, rank r in an arena of
/// `caps[r].1` bytes (`capacities`); `progress` prints rank 0's progress
/// lines.
#[cfg(feature = "nccl")]
pub fn run(
    s: &Settings,
    lay: &Layout,
    start: &Start,
    caps: &[(u64, u64)],
    progress: bool,
) -> Res<WorldRun> {
    use crate::cli::Mem;
    use cuarena::backend::cuda::cudarc::driver::CudaContext;
    use cuarena::backend::cuda::nccl::Communicator;
    use std::time::Duration;

    let world = s.world;
    let streams = (0..world)
        .map(|i| Ok(CudaContext::new(i)?.new_stream()?))
        .collect::<Res<Vec<_>>>()?;
    let comms = Communicator::init_all(streams, Duration::from_secs(120))?;
    // The gradient check belongs to the one-GPU run (each rank would
    // otherwise read the file and print a partial result).
    let rank_s = Settings {
        check_grads: None,
        ..s.clone()
    };
    let rank_s = &rank_s;
    let results: Vec<Result<Run, String>> = std::thread::scope(|sc| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let cap = caps[rank].1;
                sc.spawn(move || {
                    let go = || -> Res<Run> {
                        let sh = shard(&start.batches, world, rank);
                        let mut d = crate::cuda::Cuda::arena(rank, cap)?;
                        d.attach(comm)?;
                        let label = if rank == 0 && progress {
                            "rank 0 (its share of the loss)"
                        } else {
                            ""
                        };
                        crate::train_on(&mut d, Mem::Arena, label, lay, start, &sh, rank_s)
                    };
                    go().map_err(|e| format!("rank {rank}: {e}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    let runs = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(WorldRun {
        losses: (0..start.batches.len())
            .map(|i| runs.iter().map(|r| r.losses[i]).sum())
            .collect(),
        time_s: runs.iter().map(|r| r.time_s).fold(0f64, f64::max),
        tokens: runs[0].tokens,
        stats: runs.iter().map(|r| r.stats.clone()).collect(),
    })
}

/// Data parallel against one GPU: losses (first runs of each) within the
/// tolerances used against PyTorch, speed as the ratio of medians of the
/// alternating runs; an error when the losses do not agree.
#[cfg(feature = "nccl")]
pub fn report(
    s: &Settings,
    start: &Start,
    caps: &[(u64, u64)],
    single: &[&Run],
    multi: &[WorldRun],
) -> Res<()> {
    let (Some(one_run), Some(first)) = (single.first(), multi.first()) else {
        return Err("--world needs a one-GPU arena run to compare with".into());
    };
    let world = s.world;
    let steps = start.batches.len();
    let diff = |k: usize| crate::report::max_rel_diff(&first.losses, &one_run.losses, k);
    let median = |x: Vec<f64>| crate::report::median(x).unwrap_or(f64::NAN);
    let tps = median(multi.iter().map(WorldRun::tokens_per_s).collect());
    let one = median(single.iter().map(|r| r.tokens_per_s()).collect());
    println!(
        "\ndata parallel over {world} GPUs (medians of {} alternating runs each): {tps:.0} tokens/s against {one:.0} on one GPU: {:.3}x, scaling efficiency {:.1}%",
        multi.len(),
        tps / one,
        100.0 * tps / (world as f64 * one)
    );
    println!(
        "losses against the one-GPU run on the same global batches: largest relative difference {:.2e} over the first 10 steps, {:.2e} over all {steps}; last loss {:.4} (one GPU {:.4})",
        diff(10),
        diff(steps),
        first.losses.last().copied().unwrap_or(f32::NAN),
        one_run.losses.last().copied().unwrap_or(f32::NAN)
    );
    // The same tolerances as against PyTorch: the ranks change only the
    // order of the sums (row split and all-reduce).
    let (tol_first, tol_all) = if s.bf16 { (2e-2, 2e-2) } else { (1e-4, 1e-2) };
    let agree = diff(10) <= tol_first && diff(steps) <= tol_all;
    println!(
        "data parallel losses within {tol_first:e} (first 10 steps) and {tol_all:e} (all): {}",
        if agree { "PASS" } else { "FAIL" }
    );
    for ((r, st), (peak, _)) in first.stats.iter().enumerate().zip(caps) {
        if let Some(st) = st {
            println!(
                "rank {r}: arena {} ({:.4} x its peak live {}), {} compactions, {} moved",
                cuarena::fmt_bytes(st.capacity_bytes),
                st.capacity_bytes as f64 / *peak as f64,
                cuarena::fmt_bytes(*peak),
                st.targeted_compactions + st.full_compactions,
                cuarena::fmt_bytes(st.bytes_moved)
            );
        }
    }
    if let Some(path) = &s.json {
        let mut ddp_path = path.as_os_str().to_owned();
        ddp_path.push(".ddp.json");
        let ddp_path = std::path::PathBuf::from(ddp_path);
        let doc = serde_json::json!({
            "world": world,
            "losses": first.losses,
            "tokens_per_s": tps,
            "one_gpu_tokens_per_s": one,
            "runs": multi.len(),
            "scaling_efficiency": tps / (world as f64 * one),
            "max_rel_diff_first10": diff(10),
            "max_rel_diff_all": diff(steps),
            "agree": agree,
        });
        std::fs::write(&ddp_path, serde_json::to_string_pretty(&doc)?)
            .map_err(|e| format!("cannot write {}: {e}", ddp_path.display()))?;
        println!("wrote {}", ddp_path.display());
    }
    if !agree {
        return Err("data parallel losses differ from the one-GPU run's".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_row_once_in_order() {
        let batches: Vec<Batch> = (1..9)
            .map(|b| Batch {
                b,
                t: 3,
                tokens: (0..b as i32 * 4).collect(),
            })
            .collect();
        for world in 1..=4 {
            let shards: Vec<_> = (0..world).map(|r| shard(&batches, world, r)).collect();
            for (i, whole) in batches.iter().enumerate() {
                let mut tokens = Vec::new();
                for sh in &shards {
                    let (part, rows) = &sh[i];
                    assert_eq!((*rows, part.t), (whole.b, whole.t));
                    assert_eq!(part.tokens.len(), part.b * (part.t + 1));
                    tokens.extend_from_slice(&part.tokens);
                }
                assert_eq!(tokens, whole.tokens, "world {world}, batch {i}");
            }
        }
    }
}
