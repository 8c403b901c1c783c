//! The elastic arena on CUDA (virtual memory management): growth, trim,
//! compaction and every byte kept, the base address unchanged, growth that
//! does not wait for queued work, a device that cannot map more, and
//! captured CUDA graphs replayed across growth and trim (the NCCL
//! collectives' test is `nccl_elastic`).
//!
//! Every test prints `skipped: <reason>` and passes where no GPU is usable.
//! Run on the GPU machine with `cargo test --release --test all gpu_elastic
//! -- --include-ignored --test-threads=1 --nocapture`.

use crate::gpu_graph::{
    assert_correct, capture_handles, capture_raw, fixture, moved, offsets, setup, Fixture, Model,
    Tensors,
};
use cuarena::backend::cuda::CudaBackend;
use cuarena::backend::Backend;
use cuarena::graph::ArenaGraph;
use cuarena::{Arena, ArenaConfig, Handle};
use cuarena_testkit::{gpu_arena, Gate};

const MIB: u64 = 1 << 20;

fn words(i: usize, n: usize) -> Vec<u32> {
    (0..n).map(|k| (i * 7919 + k) as u32).collect()
}

/// No capacity, no automatic trim (the tests trim when they mean to).
fn config() -> ArenaConfig {
    ArenaConfig::elastic().with_trim_window_us(0)
}

/// An elastic CUDA arena, or `None` where no GPU is usable.
fn elastic() -> Option<Arena<CudaBackend>> {
    gpu_arena(config())
}

/// Every kept block `(i, h)` holds `words(i, ..)`.
fn check_kept(a: &Arena<CudaBackend>, keep: &[(usize, Handle)]) {
    for &(i, h) in keep {
        let want = words(i, (MIB / 4) as usize);
        assert_eq!(a.read::<u32>(h).expect("read"), want, "block {i}");
    }
}

/// Grow to 512 MiB in 1 MiB blocks, free every other, trim (compacting),
/// grow again: every byte stays, the base address never changes, and
/// after the trim mapped <= live + max(granule, 1%).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn an_elastic_arena_grows_compacts_and_trims_keeping_every_byte() {
    let Some(mut a) = elastic() else {
        return;
    };
    let base = a.backend().region_ptr();
    let g = a.backend().granularity_bytes();
    println!(
        "granularity {g} B, limit {} B",
        a.backend().capacity_bytes()
    );
    assert_eq!(a.backend().mapped_bytes(), 0);
    let n = 512;
    let mut live: Vec<(usize, Handle)> = Vec::new();
    for i in 0..n {
        let h = a.alloc(MIB).expect("alloc");
        a.write::<u32>(h, &words(i, (MIB / 4) as usize))
            .expect("write");
        live.push((i, h));
    }
    let mapped = a.backend().mapped_bytes();
    println!(
        "512 MiB live: {mapped} B mapped in {:?} chunks",
        a.backend().mapped_chunks()
    );
    assert!((512 * MIB..=512 * MIB + (2 * g).max(6 * MIB)).contains(&mapped));
    let (keep, gone): (Vec<_>, Vec<_>) = live.into_iter().partition(|(i, _)| i % 2 == 1);
    for (_, h) in gone {
        a.free(h).expect("free");
    }
    let given = a.trim().expect("trim");
    a.synchronize().expect("sync (releases the trimmed chunks)");
    let st = a.stats();
    println!(
        "trim gave back {given} B; {} B mapped for {} B live",
        st.capacity_bytes, st.allocated_bytes
    );
    assert!(st.capacity_bytes <= st.allocated_bytes + g.max(st.allocated_bytes / 100));
    assert_eq!(
        a.backend().mapped_chunks().1,
        0,
        "released after synchronize"
    );
    assert_eq!(a.backend().region_ptr(), base);
    check_kept(&a, &keep);
    // Grow back past the old peak.
    let more: Vec<Handle> = (0..300)
        .map(|_| a.alloc(MIB).expect("alloc again"))
        .collect();
    a.compact().expect("compact");
    assert_eq!(a.backend().region_ptr(), base);
    check_kept(&a, &keep);
    drop(more);
}

/// With the arena stream held by a gate kernel, allocations that map new
/// chunks return while the gate is still closed (host time per growth
/// printed), and a trim behind it releases nothing until the streams are
/// done.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn growth_and_trim_return_without_waiting_for_queued_work() {
    let Some(mut a) = elastic() else {
        return;
    };
    let first = a.alloc(MIB).expect("first");
    a.write::<u32>(first, &words(0, (MIB / 4) as usize))
        .expect("write");
    let gate = Gate::hold(a.backend()).expect("gate");
    let chunks0 = a.backend().mapped_chunks().0;
    let t0 = std::time::Instant::now();
    let blocks: Vec<Handle> = (0..256).map(|_| a.alloc(4 * MIB).expect("grow")).collect();
    let host = t0.elapsed();
    let grown = a.backend().mapped_chunks().0 - chunks0;
    for h in blocks {
        a.free(h).expect("free");
    }
    let trimmed = a.trim().expect("trim");
    let retired = a.backend().mapped_chunks().1;
    let still_queued = gate.closed().expect("query");
    gate.open();
    a.synchronize().expect("no kernel error");
    drop(gate);
    println!(
        "{grown} chunks mapped for 1 GiB behind a closed gate in {host:.1?} ({:.1} us per chunk); \
         trim gave back {trimmed} B, {retired} chunks waiting for the gate",
        host.as_secs_f64() * 1e6 / grown.max(1) as f64
    );
    assert!(
        still_queued,
        "growth or trim waited for queued work ({host:?})"
    );
    assert!(grown > 1);
    assert!(retired > 0, "the trimmed chunks waited for the stream");
    assert_eq!(a.backend().mapped_chunks().1, 0);
    assert_eq!(
        a.read::<u32>(first).expect("read"),
        words(0, (MIB / 4) as usize)
    );
}

/// A limit beyond the device's memory: a request the device cannot map
/// fails as out of memory and leaves the arena as it was.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn a_map_the_device_refuses_is_out_of_memory_and_changes_nothing() {
    let Some(probe) = elastic() else {
        return;
    };
    let (_, total) = probe.backend().context().mem_get_info().expect("mem info");
    drop(probe);
    let total = total as u64;
    let mut a =
        Arena::cuda(config().with_capacity_bytes(4 * total), 0).expect("elastic CUDA arena");
    let h = a.alloc(MIB).expect("alloc");
    a.write::<u32>(h, &words(1, (MIB / 4) as usize))
        .expect("write");
    let before = a.stats();
    let e = a.alloc(2 * total).expect_err("more than the device holds");
    assert!(e.is_out_of_memory(), "{e}");
    let after = a.stats();
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
    assert_eq!(
        a.backend().mapped_bytes(),
        before.capacity_bytes,
        "nothing stays mapped"
    );
    assert_eq!(
        a.read::<u32>(h).expect("read"),
        words(1, (MIB / 4) as usize)
    );
    a.alloc(64 * MIB).expect("the arena still works");
}

/// One graph of the test below, the tensors it runs on and what they must
/// hold.
struct Replayed {
    name: &'static str,
    g: ArenaGraph,
    m: Model,
    t: Tensors,
}

/// Replays every graph once, then checks each one's tensors.
fn replay_all(arena: &mut Arena<CudaBackend>, runs: &mut [Replayed], when: &str) {
    for r in runs.iter_mut() {
        r.g.launch(arena)
            .unwrap_or_else(|e| panic!("{when}: {}: {e}", r.name));
        r.m.step();
    }
    for r in runs.iter() {
        assert_correct(arena, &r.t, &r.m, &format!("{when}: {}", r.name));
    }
}

/// Another set of the graph's tensors, with inputs of its own; returns
/// its model, its tensors and the blocks laid out around them.
fn tensor_set(arena: &mut Arena<CudaBackend>, seed: usize) -> (Model, Tensors, Vec<Handle>) {
    let mut m = Model::new();
    m.a = (0..m.a.len())
        .map(|i| ((i * 7 + seed) % 89) as f32 + 1.0)
        .collect();
    let (t, low, fillers) = setup(arena, &m);
    (m, t, low.into_iter().chain(fillers).collect())
}

/// Captured CUDA graphs on an elastic arena: through handles on tensors
/// allocated before a growth, after it and after a trim, and with raw
/// addresses on pinned tensors; all replayed after every growth and trim
/// (the trims compact, moving the handle graphs' tensors, and unmap
/// chunks while replays are queued) and checked against the host's model.
/// The region's base address and the handle table's never change.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn graphs_stay_valid_across_growth_and_trim() {
    let Some(Fixture {
        mut arena,
        m,
        t,
        low,
        fillers,
        k,
        g,
    }) = fixture(config())
    else {
        return;
    };
    let base = arena.backend().region_ptr();
    let table = g.table().table;
    let gran = arena.backend().granularity_bytes();
    let mut spare: Vec<Handle> = low.into_iter().chain(fillers).collect();
    let mut runs = vec![Replayed {
        name: "handles, allocated first",
        g,
        m,
        t,
    }];
    // Raw addresses of pinned tensors: valid as long as the base is.
    let (pm, pt, around) = tensor_set(&mut arena, 3);
    spare.extend(around);
    for h in pt.all() {
        arena.pin(h).expect("pin");
    }
    runs.push(Replayed {
        name: "raw addresses, pinned",
        g: capture_raw(&mut arena, &k, &pt),
        m: pm,
        t: pt,
    });
    replay_all(&mut arena, &mut runs, "before growth");

    // Growth, then tensors in the new chunks (the mapped bytes left
    // above the blocks plugged first, so that they land there).
    let plug = arena.stats().largest_free_bytes;
    if plug > 0 {
        spare.push(arena.alloc(plug).expect("plug"));
    }
    let mapped0 = arena.backend().mapped_bytes();
    let big: Vec<Handle> = (0..4)
        .map(|_| arena.alloc(64 * MIB).expect("grow"))
        .collect();
    let (m, t, around) = tensor_set(&mut arena, 5);
    spare.extend(around);
    assert!(
        offsets(&arena, &t).iter().all(|&o| o >= mapped0),
        "allocated above the old mapped end {mapped0}"
    );
    runs.push(Replayed {
        name: "handles, allocated after a growth",
        g: capture_handles(&mut arena, &k, &t),
        m,
        t,
    });
    let grown = arena.backend().mapped_bytes();
    println!("grew from {mapped0} B to {grown} B mapped");
    assert!(grown >= mapped0 + 256 * MIB);
    replay_all(&mut arena, &mut runs, "after growth");

    // A trim that compacts (the tensors allocated after the growth slide
    // down) and unmaps, with the replays still queued.
    let before = offsets(&arena, &runs[2].t);
    for h in big.into_iter().chain(spare.drain(..)) {
        arena.free(h).expect("free");
    }
    let given = arena.trim().expect("trim");
    let st = arena.stats();
    let moved_n = moved(&before, &offsets(&arena, &runs[2].t));
    println!(
        "trim gave back {given} B: {} B mapped for {} B live; {moved_n} of 7 tensors moved",
        st.capacity_bytes, st.allocated_bytes
    );
    assert!(given > 0 && moved_n > 0);
    assert!(st.capacity_bytes <= st.allocated_bytes + gran.max(st.allocated_bytes / 100));
    replay_all(&mut arena, &mut runs, "after a trim");

    // Tensors allocated after the trim, then growth and a trim again.
    let (m, t, around) = tensor_set(&mut arena, 11);
    runs.push(Replayed {
        name: "handles, allocated after a trim",
        g: capture_handles(&mut arena, &k, &t),
        m,
        t,
    });
    replay_all(&mut arena, &mut runs, "after a trim, new tensors");
    let big: Vec<Handle> = (0..2)
        .map(|_| arena.alloc(128 * MIB).expect("grow again"))
        .collect();
    replay_all(&mut arena, &mut runs, "grown again");
    for h in big.into_iter().chain(around) {
        arena.free(h).expect("free");
    }
    arena.trim().expect("trim again");
    replay_all(&mut arena, &mut runs, "after a second trim");
    arena.synchronize().expect("no kernel error");
    assert_eq!(arena.backend().mapped_chunks().1, 0, "all released");
    assert_eq!(arena.backend().region_ptr(), base, "the base never moved");
    assert_eq!(arena.backend().table_ptr(), table, "nor the table");
    println!(
        "{} graphs replayed across 2 growths and 2 trims; {} trims, {} moved, peak mapped {} B",
        runs.len(),
        arena.stats().trims,
        arena.stats().bytes_moved,
        arena.stats().peak_mapped_bytes
    );
}
