//! NCCL collectives (feature `nccl`): the communicator on plain cudarc
//! buffers and on arena tensors, bounded waits when a peer is missing, and
//! the one-process-per-GPU bootstrap through a shared id in a file.
//!
//! Every test skips (printing why) without a GPU or without libnccl. Tests
//! that need two GPUs skip on one. Run on the two-GPU machine with
//! `NCCL_NVLS_ENABLE=0 test-all nccl --test-threads=1`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cuarena::backend::cuda::cudarc::driver::{CudaContext, CudaStream};
use cuarena::backend::cuda::nccl::{self, Communicator, ReduceOp, UniqueId};
use cuarena::Error;

use cuarena::BackendError;
use cuarena::DType;
use cuarena_testkit::gpu_available;

/// GPUs visible, or `None` (after printing why) when NCCL tests cannot run.
pub(crate) fn gpus() -> Option<usize> {
    if !gpu_available() {
        return None;
    }
    if !cuarena_testkit::usable(nccl::available()) {
        return None;
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Some(n as usize),
        other => {
            println!("skipped: device count {other:?}");
            None
        }
    }
}

fn streams(n: usize) -> Vec<Arc<CudaStream>> {
    (0..n)
        .map(|i| {
            let ctx = CudaContext::new(i).expect("context");
            ctx.new_stream().expect("stream")
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn collectives_on_plain_buffers_are_exact_on_every_visible_device() {
    let Some(n) = gpus() else { return };
    let comms = Communicator::init_all(streams(n), Duration::from_secs(60)).expect("init_all");
    let len = 1 << 20;
    // Integers: sums are exact whatever the reduction order.
    let mut bufs: Vec<_> = comms
        .iter()
        .map(|c| {
            let host: Vec<i64> = (0..len as i64).map(|i| i * (c.rank() as i64 + 1)).collect();
            c.stream().clone_htod(&host).expect("upload")
        })
        .collect();
    Communicator::group(&comms, || {
        for (c, b) in comms.iter().zip(bufs.iter_mut()) {
            c.all_reduce_in_place(b, ReduceOp::Sum)?;
        }
        Ok(())
    })
    .expect("all_reduce");
    let ranks_sum: i64 = (1..=n as i64).sum();
    for (c, b) in comms.iter().zip(&bufs) {
        c.synchronize().expect("sync");
        let got = c.stream().clone_dtoh(b).expect("download");
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &v)| v == i as i64 * ranks_sum),
            "rank {}",
            c.rank()
        );
    }
    // all_gather then reduce_scatter of the gathered: each rank gets
    // world * its own share back.
    let share = 4096;
    let sends: Vec<_> = comms
        .iter()
        .map(|c| {
            let host = vec![c.rank() as u32 + 7; share];
            c.stream().clone_htod(&host).expect("upload")
        })
        .collect();
    let mut gathered: Vec<_> = comms
        .iter()
        .map(|c| c.stream().alloc_zeros::<u32>(share * n).expect("alloc"))
        .collect();
    Communicator::group(&comms, || {
        for ((c, s), g) in comms.iter().zip(&sends).zip(gathered.iter_mut()) {
            c.all_gather(s, g)?;
        }
        Ok(())
    })
    .expect("all_gather");
    let mut scattered: Vec<_> = comms
        .iter()
        .map(|c| c.stream().alloc_zeros::<u32>(share).expect("alloc"))
        .collect();
    Communicator::group(&comms, || {
        for ((c, g), s) in comms.iter().zip(&gathered).zip(scattered.iter_mut()) {
            c.reduce_scatter(g, s, ReduceOp::Sum)?;
        }
        Ok(())
    })
    .expect("reduce_scatter");
    for (c, (g, s)) in comms.iter().zip(gathered.iter().zip(&scattered)) {
        c.synchronize().expect("sync");
        let g = c.stream().clone_dtoh(g).expect("download");
        for r in 0..n {
            assert!(g[r * share..(r + 1) * share]
                .iter()
                .all(|&v| v == r as u32 + 7));
        }
        let s = c.stream().clone_dtoh(s).expect("download");
        assert!(s.iter().all(|&v| v == (c.rank() as u32 + 7) * n as u32));
    }
    // broadcast from rank 0, then a ring of send/recv (rank r sends to r+1).
    let mut bc: Vec<_> = comms
        .iter()
        .map(|c| {
            let host = vec![(c.rank() as u8).wrapping_mul(100).wrapping_add(5); share];
            c.stream().clone_htod(&host).expect("upload")
        })
        .collect();
    Communicator::group(&comms, || {
        for (c, b) in comms.iter().zip(bc.iter_mut()) {
            c.broadcast(b, 0)?;
        }
        Ok(())
    })
    .expect("broadcast");
    let mut rx: Vec<_> = comms
        .iter()
        .map(|c| c.stream().alloc_zeros::<u32>(share).expect("alloc"))
        .collect();
    Communicator::group(&comms, || {
        for ((c, s), r) in comms.iter().zip(&sends).zip(rx.iter_mut()) {
            c.send(s, (c.rank() + 1) % n)?;
            c.recv(r, (c.rank() + n - 1) % n)?;
        }
        Ok(())
    })
    .expect("send/recv");
    for ((c, b), r) in comms.iter().zip(&bc).zip(&rx) {
        c.synchronize().expect("sync");
        let b = c.stream().clone_dtoh(b).expect("download");
        assert!(b.iter().all(|&v| v == 5), "broadcast on rank {}", c.rank());
        let r = c.stream().clone_dtoh(r).expect("download");
        let from = (c.rank() + n - 1) % n;
        assert!(
            r.iter().all(|&v| v == from as u32 + 7),
            "recv on rank {}",
            c.rank()
        );
    }
    assert!(matches!(
        comms[0].broadcast(&mut rx[0], n),
        Err(Error::InvalidInput {
            input: "config",
            ..
        })
    ));
    // Lengths that do not match are errors before anything is enqueued.
    let short = comms[0]
        .stream()
        .alloc_zeros::<u32>(share - 1)
        .expect("alloc");
    let mut out = comms[0].stream().alloc_zeros::<u32>(share).expect("alloc");
    assert!(matches!(
        comms[0].all_reduce(&short, &mut out, ReduceOp::Sum),
        Err(Error::LengthMismatch { .. })
    ));
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn a_rank_whose_peer_never_joins_fails_within_its_timeout() {
    if gpus().is_none() {
        return;
    }
    let id = UniqueId::new().expect("id");
    let stream = streams(1).remove(0);
    let timeout = Duration::from_secs(5);
    let t0 = Instant::now();
    // Rank 0 of a world of 2; rank 1 never comes.
    let r = Communicator::init_with_timeout(stream, id, 0, 2, timeout);
    let waited = t0.elapsed();
    match r {
        Err(Error::Backend(BackendError::Nccl { reason, .. })) => {
            println!("rank 0 alone: {reason} after {waited:?}");
            assert!(waited < timeout + Duration::from_secs(10), "{waited:?}");
        }
        other => panic!("expected an NCCL timeout, got {other:?}"),
    }
}

/// Environment of a rank process started by the bootstrap test.
const CHILD_RANK: &str = "CUARENA_NCCL_TEST_RANK";
const CHILD_ID_FILE: &str = "CUARENA_NCCL_TEST_ID_FILE";

/// What the rank processes of a two-process test do (`CHILD_MODE`).
const CHILD_MODE: &str = "CUARENA_NCCL_TEST_MODE";

/// Runs `nccl_rank_process` as two processes (ranks 0 and 1, one GPU
/// each) in `mode`, through an id file as a launcher would; `None` (after
/// printing why) with fewer than two GPUs.
fn two_rank_processes(mode: &str) -> Option<()> {
    let n = gpus()?;
    if n < 2 {
        println!("skipped: one process per GPU needs two GPUs, {n} visible");
        return None;
    }
    let dir = std::env::temp_dir().join(format!("cuarena-nccl-{}-{mode}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let id_file = dir.join("nccl-id");
    // What a launcher does: rank 0's id, written where every rank reads it.
    std::fs::write(&id_file, UniqueId::new().expect("id").to_hex()).expect("write id");
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (0..2)
        .map(|rank| {
            std::process::Command::new(&exe)
                .args([
                    "nccl::nccl_rank_process",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                ])
                .env(CHILD_RANK, rank.to_string())
                .env(CHILD_ID_FILE, &id_file)
                .env(CHILD_MODE, mode)
                .spawn()
                .expect("spawn rank")
        })
        .collect();
    for (rank, mut c) in children.into_iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(s) = c.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("rank {rank} did not finish in 120 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "rank {rank} ({mode}): {status}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    Some(())
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn one_process_per_device_bootstraps_through_an_id_file() {
    if std::env::var(CHILD_RANK).is_ok() {
        return; // a child runs `nccl_rank_process` only
    }
    two_rank_processes("ok");
}

/// Rank 1 dies after joining; rank 0's collective on an arena tensor fails
/// within its communicator's timeout (aborted, not hung), and rank 0's
/// arena stays consistent: other tensors keep their bytes, the tensor of
/// the failed collective can be read and freed, allocation and compaction
/// work.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn a_rank_that_dies_mid_collective_fails_the_other_within_its_timeout() {
    if std::env::var(CHILD_RANK).is_ok() {
        return;
    }
    two_rank_processes("dies");
}

/// One rank of the bootstrap test (run by it in a child process).
#[test]
#[ignore = "run by the two-process tests"]
fn nccl_rank_process() {
    let Ok(rank) = std::env::var(CHILD_RANK) else {
        return; // not a child: `--include-ignored` runs it in the parent too
    };
    let rank: usize = rank.parse().expect("rank number");
    let id_file = std::env::var(CHILD_ID_FILE).expect("id file");
    let id = UniqueId::from_hex(&std::fs::read_to_string(id_file).expect("read id")).expect("id");
    if std::env::var(CHILD_MODE).as_deref() == Ok("dies") {
        return rank_that_dies_or_survives(rank, id);
    }
    let stream = streams(rank + 1).remove(rank);
    let comm = Communicator::init_with_timeout(stream, id, rank, 2, Duration::from_secs(60))
        .expect("init from the id file");
    let host = vec![rank as u64 + 1; 1 << 16];
    let mut buf = comm.stream().clone_htod(&host).expect("upload");
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
        .expect("all_reduce");
    comm.synchronize().expect("sync");
    let got = comm.stream().clone_dtoh(&buf).expect("download");
    assert!(got.iter().all(|&v| v == 3), "rank {rank}");
    println!("rank {rank}: all_reduce across processes ok");
}

fn rank_that_dies_or_survives(rank: usize, id: UniqueId) {
    use cuarena::{Arena, ArenaConfig};
    let mut arena = Arena::cuda(ArenaConfig::new(64 << 20), rank).expect("arena");
    let s = arena.backend().context().new_stream().expect("stream");
    let comm_stream = arena.register_stream(s.clone()).expect("register");
    let timeout = Duration::from_secs(5);
    let comm = Communicator::init_with_timeout(s, id, rank, 2, timeout).expect("init");
    if rank == 1 {
        println!("rank 1: joined, now dying");
        std::process::exit(0);
    }
    let keep = arena
        .alloc_storage_dtype(DType::U32, 1 << 16)
        .expect("keep");
    let want: Vec<u32> = (0..1 << 16).map(|i| i * 7 + 1).collect();
    arena.write(&keep, &want).expect("write");
    let grads = arena
        .alloc_storage_dtype(DType::F32, 1 << 20)
        .expect("grads");
    arena.fill(&grads, 0f32).expect("zeros");
    let t0 = Instant::now();
    let enqueued = {
        let mut args = arena.kernel_args(comm_stream).expect("args");
        let mut v = args.output::<f32>(&grads).expect("view");
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum)
    };
    let r = enqueued.and_then(|()| comm.synchronize());
    let waited = t0.elapsed();
    match &r {
        Err(Error::Backend(BackendError::Nccl { reason, .. })) => {
            println!("rank 0: {reason} after {waited:?}")
        }
        other => panic!("rank 0: expected an NCCL error, got {other:?}"),
    }
    assert!(comm.is_aborted());
    assert!(waited < timeout + Duration::from_secs(20), "{waited:?}");
    // The arena after the abort: nothing hangs, nothing lost.
    assert_eq!(arena.read::<u32>(&keep).expect("read"), want);
    let _ = arena.read::<f32>(&grads).expect("the aborted tensor reads");
    drop(grads);
    let more = arena
        .alloc_storage(32 << 20)
        .expect("alloc after the abort");
    arena.compact().expect("compact after the abort");
    assert_eq!(arena.read::<u32>(&keep).expect("read"), want);
    drop(more);
    arena.synchronize().expect("no fault");
    println!("rank 0: arena consistent after the peer died ({waited:?})");
}
/// One GPU's arena for the arena tests, with its communication stream.
pub(crate) struct ArenaRank {
    pub(crate) arena: cuarena::Arena<cuarena::backend::cuda::CudaBackend>,
    pub(crate) comm_stream: cuarena::StreamId,
    pub(crate) filler: Vec<cuarena::Storage>,
}

/// An arena of `config` on each of `n` GPUs, each with a stream registered
/// for its communicator, and the communicators (one process, `n` ranks).
pub(crate) fn arena_ranks(
    n: usize,
    config: &cuarena::ArenaConfig,
) -> (Vec<ArenaRank>, Vec<Communicator>) {
    let ranks: Vec<ArenaRank> = (0..n)
        .map(|i| {
            let mut arena = cuarena::Arena::cuda(config.clone(), i).expect("arena");
            let s = arena.backend().context().new_stream().expect("stream");
            let comm_stream = arena.register_stream(s).expect("register");
            ArenaRank {
                arena,
                comm_stream,
                filler: Vec::new(),
            }
        })
        .collect();
    let streams: Vec<_> = ranks
        .iter()
        .map(|r| {
            r.arena
                .backend()
                .stream_of(r.comm_stream)
                .expect("stream")
                .clone()
        })
        .collect();
    let comms = Communicator::init_all(streams, Duration::from_secs(60)).expect("init_all");
    (ranks, comms)
}

/// Drops every other filler block and allocates larger ones, so that the
/// arena has to compact (targeted), then compacts fully too.
fn churn(r: &mut ArenaRank, round: usize) {
    let mut k = 0;
    r.filler.retain(|_| {
        k += 1;
        k % 2 == round % 2
    });
    for _ in 0..8 {
        let bytes = (64 << 10) * (1 + (round % 3) as u64);
        r.filler.push(r.arena.alloc_storage(bytes).expect("filler"));
    }
    r.arena.compact().expect("compact");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn collectives_on_arena_tensors_survive_compactions_on_every_rank() {
    let Some(n) = gpus() else { return };
    // Tight: the fillers fragment it and force compactions.
    let (mut ranks, comms) = arena_ranks(n, &cuarena::ArenaConfig::new(24 << 20));
    let len = 1 << 18; // 2 MiB of i64
    let mut moved_before = vec![0u64; n];
    for round in 0..12 {
        // Each rank's tensor: i * (rank + 1) + round, allocated after churn so
        // that it lands anywhere and is moved by the next compactions.
        let mut tensors = Vec::new();
        for (rank, r) in ranks.iter_mut().enumerate() {
            churn(r, round);
            let t = r
                .arena
                .alloc_storage_dtype(DType::I64, len)
                .expect("tensor");
            let host: Vec<i64> = (0..len as i64)
                .map(|i| i * (rank as i64 + 1) + round as i64)
                .collect();
            r.arena.write(&t, &host).expect("write");
            tensors.push(t);
        }
        // All-reduce the tensors' second halves as slices, in place.
        Communicator::group(&comms, || {
            for ((c, r), t) in comms.iter().zip(ranks.iter_mut()).zip(&tensors) {
                let half = t.slice(len / 2..len)?;
                let mut args = r.arena.kernel_args(r.comm_stream)?;
                let mut v = args.output::<i64>(&half)?;
                c.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
            }
            Ok(())
        })
        .expect("all_reduce");
        // While the collectives may still run: more churn and compactions,
        // which must wait for them before moving the tensors.
        for (r, t) in ranks.iter_mut().zip(&tensors) {
            churn(r, round + 1);
            let big = r.arena.alloc_storage(4 << 20).expect("forces a compaction");
            drop(big);
            let _ = t;
        }
        let ranks_sum: i64 = (1..=n as i64).sum();
        for (rank, (r, t)) in ranks.iter_mut().zip(&tensors).enumerate() {
            let got = r.arena.read::<i64>(t).expect("read");
            for (i, &v) in got.iter().enumerate() {
                let want = if (i as u64) < len / 2 {
                    i as i64 * (rank as i64 + 1) + round as i64
                } else {
                    i as i64 * ranks_sum + n as i64 * round as i64
                };
                assert_eq!(v, want, "rank {rank} round {round} element {i}");
            }
        }
        drop(tensors);
    }
    for (rank, r) in ranks.iter().enumerate() {
        let s = r.arena.stats();
        println!(
            "rank {rank}: {} targeted + {} full compactions, {} moved",
            s.targeted_compactions,
            s.full_compactions,
            cuarena::fmt_bytes(s.bytes_moved)
        );
        assert!(
            s.bytes_moved > moved_before[rank],
            "rank {rank} never moved a block"
        );
        moved_before[rank] = s.bytes_moved;
    }
    // all_gather into an arena tensor and reduce_scatter back, on slices.
    let share = 4096u64;
    let mut gathered = Vec::new();
    let mut sends = Vec::new();
    for (rank, r) in ranks.iter_mut().enumerate() {
        let s = r
            .arena
            .alloc_storage_dtype(DType::U32, share)
            .expect("send");
        r.arena.fill(&s, rank as u32 + 7).expect("fill");
        let g = r
            .arena
            .alloc_storage_dtype(DType::U32, share * n as u64 + 5)
            .expect("gathered");
        r.arena.fill(&g, 0u32).expect("zeros");
        sends.push(s);
        gathered.push(g);
    }
    Communicator::group(&comms, || {
        for (((c, r), s), g) in comms
            .iter()
            .zip(ranks.iter_mut())
            .zip(&sends)
            .zip(&gathered)
        {
            let mut args = r.arena.kernel_args(r.comm_stream)?;
            let sv = args.input::<u32>(s)?;
            let mut gv = args.output::<u32>(&g.slice(5..5 + share * n as u64)?)?;
            c.all_gather(&sv, &mut gv)?;
        }
        Ok(())
    })
    .expect("all_gather");
    for (r, g) in ranks.iter_mut().zip(&gathered) {
        churn(r, 99);
        let got = r.arena.read::<u32>(g).expect("read");
        assert!(got[..5].iter().all(|&v| v == 0));
        for k in 0..n {
            let part = &got[5 + k * share as usize..5 + (k + 1) * share as usize];
            assert!(part.iter().all(|&v| v == k as u32 + 7), "part {k}");
        }
    }
}
