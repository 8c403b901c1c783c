//! Planner speed: a full compaction of up to 1,000,000 live blocks, and a
//! targeted one, planned on the host (pure data, no backend).
//!
//! `cargo bench --bench planner`

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use cuarena::plan::planner::{plan_full, plan_targeted, LiveBlock, Request};

#[path = "../tests/support/mod.rs"]
mod support;

/// `n` live blocks of 256 B to 1 MiB (log-uniform), each followed by a hole
/// of 0 to 2 blocks' size: a heavily fragmented arena.
fn layout(n: usize, pins_every: usize) -> (Vec<LiveBlock>, u64) {
    let mut rng = support::Rng::new(0x1234_5678_9abc_def1);
    let mut next = move || rng.next();
    let mut blocks = Vec::with_capacity(n);
    let mut offset = 0u64;
    for i in 0..n {
        let len = 256u64 << (next() % 13);
        blocks.push(LiveBlock {
            key: i as u64,
            offset,
            len,
            copy_len: len,
            align: 256,
            pinned: pins_every > 0 && i % pins_every == 0,
        });
        offset += len + 256 * (next() % (2 * len / 256 + 1));
    }
    (blocks, offset + (1 << 20))
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan_full");
    g.sample_size(20);
    for n in [10_000usize, 100_000, 1_000_000] {
        let (blocks, cap) = layout(n, 0);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("no_pins", n), &blocks, |b, blocks| {
            b.iter(|| black_box(plan_full(black_box(blocks), cap)))
        });
        let (pinned, cap) = layout(n, 1000);
        g.bench_with_input(
            BenchmarkId::new("pin_every_1000", n),
            &pinned,
            |b, blocks| b.iter(|| black_box(plan_full(black_box(blocks), cap))),
        );
    }
    g.finish();

    let mut g = c.benchmark_group("plan_targeted");
    g.sample_size(20);
    for n in [10_000usize, 100_000] {
        let (blocks, cap) = layout(n, 0);
        let req = Request {
            size: 64 << 20,
            align: 256,
        };
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("64MiB", n), &blocks, |b, blocks| {
            b.iter(|| black_box(plan_targeted(black_box(blocks), cap, req)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
