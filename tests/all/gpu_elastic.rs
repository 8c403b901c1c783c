//! The elastic arena on CUDA (virtual memory management): growth, trim,
//! compaction and every byte kept, the base address unchanged, growth that
//! does not wait for queued work, and a device that cannot map more.
//!
//! Every test prints `skipped: <reason>` and passes where no GPU is usable.
//! Run on the GPU machine with `cargo test --release --test all gpu_elastic
//! -- --include-ignored --test-threads=1 --nocapture`.

use crate::gpu::{test_module, Gate};
use cuarena::backend::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use cuarena::backend::cuda::CudaBackend;
use cuarena::backend::Backend;
use cuarena::{Arena, ArenaConfig, Handle};
use cuarena_testkit::gpu_available;

const MIB: u64 = 1 << 20;

fn words(i: usize, n: usize) -> Vec<u32> {
    (0..n).map(|k| (i * 7919 + k) as u32).collect()
}

fn elastic() -> Arena<CudaBackend> {
    Arena::cuda(ArenaConfig::elastic().with_trim_window_us(0), 0).expect("elastic CUDA arena")
}

/// Grow to 512 MiB in 1 MiB blocks, free every other, trim (compacting),
/// grow again: every byte stays, the base address never changes, and
/// after the trim mapped <= live + max(granule, 1%).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn an_elastic_arena_grows_compacts_and_trims_keeping_every_byte() {
    if !gpu_available() {
        return;
    }
    let mut a = elastic();
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
    for &(i, h) in &keep {
        assert_eq!(
            a.read::<u32>(h).expect("read"),
            words(i, (MIB / 4) as usize),
            "block {i}"
        );
    }
    // Grow back past the old peak.
    let more: Vec<Handle> = (0..300)
        .map(|_| a.alloc(MIB).expect("alloc again"))
        .collect();
    a.compact().expect("compact");
    assert_eq!(a.backend().region_ptr(), base);
    for &(i, h) in &keep {
        assert_eq!(
            a.read::<u32>(h).expect("read"),
            words(i, (MIB / 4) as usize),
            "block {i}"
        );
    }
    drop(more);
}

/// With the arena stream held by a gate kernel, allocations that map new
/// chunks return while the gate is still closed (host time per growth
/// printed), and a trim behind it releases nothing until the streams are
/// done.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn growth_and_trim_return_without_waiting_for_queued_work() {
    if !gpu_available() {
        return;
    }
    let mut a = elastic();
    let first = a.alloc(MIB).expect("first");
    a.write::<u32>(first, &words(0, (MIB / 4) as usize))
        .expect("write");
    let module = test_module(a.backend());
    let gate_fn = module.load_function("test_gate").expect("kernel");
    let gate = Gate::new();
    let timeout_ns: u64 = 20_000_000_000;
    let stream = a.backend().stream().clone();
    {
        let mut b = stream.launch_builder(&gate_fn);
        b.arg(&gate.device).arg(&timeout_ns);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: test_gate(const u32*, u64) reads the mapped flag only.
        unsafe { b.launch(cfg) }.expect("launch");
    }
    let passed = stream.context().new_event(None).expect("event");
    passed.record(&stream).expect("record");
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
    let still_queued = !passed.try_is_complete().expect("query");
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
    if !gpu_available() {
        return;
    }
    let ctx = cuarena::backend::cuda::cudarc::driver::CudaContext::new(0).expect("context");
    let (_, total) = ctx.mem_get_info().expect("mem info");
    let total = total as u64;
    let mut a = Arena::cuda(
        ArenaConfig::elastic()
            .with_capacity_bytes(4 * total)
            .with_trim_window_us(0),
        0,
    )
    .expect("elastic CUDA arena");
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
