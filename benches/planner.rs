//! Compaction speed on a metadata arena (placement and planning, no bytes
//! to move): a full compaction of up to 1,000,000 live blocks, and an
//! allocation that needs a targeted one. Each measured call starts from a
//! freshly fragmented arena (built untimed), and includes what a compaction
//! costs besides planning: checking the plan, rebuilding the placement
//! index and updating the handle table.
//!
//! `cargo bench --bench planner`

use std::time::Duration;

use criterion::{
    black_box, criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput,
};
use cuarena::backend::MetaBackend;
use cuarena::{Arena, ArenaConfig, CompactionPolicy, Handle};

/// A metadata arena holding `n` live blocks of 256 B to 1 MiB
/// (log-uniform), each followed by a hole of 0 to 2 blocks' size (blocks
/// allocated in a row, then the holes freed): a heavily fragmented arena
/// under `policy`. Every `pins_every`-th block is pinned (0: none).
fn fragmented(n: usize, pins_every: usize, policy: CompactionPolicy) -> Arena<MetaBackend> {
    let mut x = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let layout: Vec<(u64, u64)> = (0..n)
        .map(|_| {
            let len = 256u64 << (next() % 13);
            (len, 256 * (next() % (2 * len / 256 + 1)))
        })
        .collect();
    let capacity = layout.iter().map(|(len, hole)| len + hole).sum::<u64>() + (1 << 20);
    let config = ArenaConfig::new(capacity)
        .with_alignment_bytes(256)
        .with_compaction(policy);
    let mut arena = Arena::metadata(config).expect("a metadata arena");
    let mut holes: Vec<Handle> = Vec::with_capacity(n);
    for (i, &(len, hole)) in layout.iter().enumerate() {
        let h = arena.alloc(len).expect("room for every block");
        if pins_every > 0 && i % pins_every == 0 {
            arena.pin(h).expect("pin");
        }
        if hole > 0 {
            holes.push(arena.alloc(hole).expect("room for every hole"));
        }
    }
    for h in holes {
        arena.free(h).expect("free");
    }
    arena
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("compact_full");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    for n in [10_000usize, 100_000, 1_000_000] {
        g.throughput(Throughput::Elements(n as u64));
        for (name, pins_every) in [("no_pins", 0), ("pin_every_1000", 1000)] {
            g.bench_function(BenchmarkId::new(name, n), |b| {
                b.iter_batched(
                    || fragmented(n, pins_every, CompactionPolicy::Manual),
                    |mut arena| {
                        let report = arena.compact().expect("compact");
                        (black_box(report), arena)
                    },
                    BatchSize::PerIteration,
                )
            });
        }
    }
    g.finish();

    let mut g = c.benchmark_group("alloc_targeted");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    for n in [10_000usize, 100_000] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(BenchmarkId::new("64MiB", n), |b| {
            b.iter_batched(
                || fragmented(n, 0, CompactionPolicy::Bounded),
                |mut arena| {
                    let h = arena
                        .alloc(64 << 20)
                        .expect("a targeted compaction makes room");
                    (black_box(h), arena)
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
