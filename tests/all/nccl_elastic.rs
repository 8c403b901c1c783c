//! NCCL collectives on tensors of elastic arenas (feature `nccl`), one
//! arena and rank per GPU: tensors allocated before a growth, after it and
//! after a trim, all-reduced in place and out of place while the arenas
//! grow and trim (compacting, unmapping) around them. An elastic arena's
//! base address never changes, and a trim unmaps in stream order, after
//! the collectives queued before it.
//!
//! Skips as the other NCCL tests do; on one GPU the communicator has one
//! rank. Run with `NCCL_NVLS_ENABLE=0 test-all nccl --include-ignored
//! --test-threads=1`.

use cuarena::backend::cuda::nccl::{Communicator, ReduceOp};
use cuarena::backend::Backend;
use cuarena::{ArenaConfig, DType, Storage};

use crate::nccl::{arena_ranks, gpus, ArenaRank};

/// i64 elements of every tensor (2 MiB).
const LEN: u64 = 1 << 18;
const MIB: u64 = 1 << 20;

/// Rank `rank`'s values of the tensor tagged `tag`: i * (rank + 1) + tag.
fn values(rank: usize, tag: i64) -> Vec<i64> {
    (0..LEN as i64)
        .map(|i| i * (rank as i64 + 1) + tag)
        .collect()
}

/// The sum of [`values`] of `tag` over `n` ranks, times `times`.
fn summed(n: usize, tag: i64, times: i64) -> Vec<i64> {
    let ranks: i64 = (1..=n as i64).sum();
    (0..LEN as i64)
        .map(|i| times * (i * ranks + n as i64 * tag))
        .collect()
}

/// A tensor on every rank, holding [`values`] of `tag`.
fn tensors(ranks: &mut [ArenaRank], tag: i64) -> Vec<Storage> {
    ranks
        .iter_mut()
        .enumerate()
        .map(|(rank, r)| {
            let t = r
                .arena
                .alloc_storage_dtype(DType::I64, LEN)
                .expect("tensor");
            r.arena.write(&t, &values(rank, tag)).expect("write");
            t
        })
        .collect()
}

/// All-reduces (sum) each rank's `src` into its `dst`; in place when
/// `dst` is `None`.
fn all_reduce(
    comms: &[Communicator],
    ranks: &mut [ArenaRank],
    src: &[Storage],
    dst: Option<&[Storage]>,
) {
    Communicator::group(comms, || {
        for (i, (c, r)) in comms.iter().zip(ranks.iter_mut()).enumerate() {
            let mut args = r.arena.kernel_args(r.comm_stream)?;
            match dst {
                None => {
                    let mut v = args.output::<i64>(&src[i])?;
                    c.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
                }
                Some(dst) => {
                    let s = args.input::<i64>(&src[i])?;
                    let mut d = args.output::<i64>(&dst[i])?;
                    c.all_reduce(&s, &mut d, ReduceOp::Sum)?;
                }
            }
        }
        Ok(())
    })
    .expect("all_reduce");
}

/// Every rank's tensor holds `want`.
fn check(ranks: &[ArenaRank], ts: &[Storage], want: &[i64], what: &str) {
    for (rank, (r, t)) in ranks.iter().zip(ts).enumerate() {
        let got = r.arena.read::<i64>(t).expect("read");
        let bad = got.iter().zip(want).filter(|(g, w)| g != w).count();
        assert_eq!(bad, 0, "{what}: rank {rank}, {bad} of {LEN} elements wrong");
    }
}

fn offset(r: &ArenaRank, t: &Storage) -> u64 {
    let h = t.handle().expect("a block");
    r.arena.info(h).expect("info").offset
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn collectives_on_elastic_arena_tensors_survive_growth_and_trim() {
    let Some(n) = gpus() else { return };
    let config = ArenaConfig::elastic().with_trim_window_us(0);
    let (mut ranks, comms) = arena_ranks(n, &config);
    let bases: Vec<u64> = ranks
        .iter()
        .map(|r| r.arena.backend().region_ptr())
        .collect();

    // `a` before a growth, `b` after it (above 256 MiB of fillers).
    let a = tensors(&mut ranks, 1);
    let mapped0: Vec<u64> = ranks
        .iter()
        .map(|r| r.arena.backend().mapped_bytes())
        .collect();
    for r in ranks.iter_mut() {
        // The mapped bytes left above `a` first, so that `b` lands above
        // the fillers.
        let plug = r.arena.stats().largest_free_bytes;
        if plug > 0 {
            let p = r.arena.alloc_storage(plug).expect("plug");
            r.filler.push(p);
        }
        for _ in 0..8 {
            let f = r.arena.alloc_storage(32 * MIB).expect("grow");
            r.filler.push(f);
        }
    }
    let b = tensors(&mut ranks, 2);
    for (rank, r) in ranks.iter().enumerate() {
        let mapped = r.arena.backend().mapped_bytes();
        println!(
            "rank {rank}: grew from {} B to {mapped} B mapped",
            mapped0[rank]
        );
        assert!(mapped >= mapped0[rank] + 256 * MIB);
        assert!(offset(r, &b[rank]) >= mapped0[rank], "b lies in new chunks");
    }
    all_reduce(&comms, &mut ranks, &a, None);
    all_reduce(&comms, &mut ranks, &b, None);

    // While the collectives may still run: the fillers go and every arena
    // trims, moving `b` down past them and unmapping what is above.
    for (rank, r) in ranks.iter_mut().enumerate() {
        let before = offset(r, &b[rank]);
        r.filler.clear();
        let given = r.arena.trim().expect("trim");
        let st = r.arena.stats();
        let g = r.arena.backend().granularity_bytes();
        println!(
            "rank {rank}: trim gave back {given} B, {} B mapped for {} B live; b at {before} -> {}",
            st.capacity_bytes,
            st.allocated_bytes,
            offset(r, &b[rank])
        );
        assert!(given > 0, "rank {rank}: the trim unmapped nothing");
        assert!(offset(r, &b[rank]) < before, "rank {rank}: b moved down");
        assert!(st.capacity_bytes <= st.allocated_bytes + g.max(st.allocated_bytes / 100));
    }
    check(&ranks, &a, &summed(n, 1, 1), "a, allocated before a growth");
    check(&ranks, &b, &summed(n, 2, 1), "b, allocated after a growth");

    // `c` after the trim: `a` all-reduced into it, `b` again in place; then
    // growth again around them, and a last trim.
    let c = tensors(&mut ranks, 0);
    all_reduce(&comms, &mut ranks, &a, Some(&c));
    all_reduce(&comms, &mut ranks, &b, None);
    for r in ranks.iter_mut() {
        for _ in 0..4 {
            let f = r.arena.alloc_storage(64 * MIB).expect("grow again");
            r.filler.push(f);
        }
    }
    check(
        &ranks,
        &c,
        &summed(n, 1, n as i64),
        "c, allocated after a trim",
    );
    check(
        &ranks,
        &b,
        &summed(n, 2, n as i64),
        "b, after growing again",
    );
    for r in ranks.iter_mut() {
        r.filler.clear();
        r.arena.reclaim().expect("reclaim");
        r.arena.trim().expect("trim again");
    }
    all_reduce(&comms, &mut ranks, &c, None);
    let want = summed(n, 1, (n * n) as i64);
    check(&ranks, &c, &want, "c, after the second trim");
    for (rank, r) in ranks.iter_mut().enumerate() {
        r.arena.synchronize().expect("no fault");
        assert_eq!(r.arena.backend().mapped_chunks().1, 0, "all released");
        assert_eq!(
            r.arena.backend().region_ptr(),
            bases[rank],
            "the base never moved"
        );
    }
}
