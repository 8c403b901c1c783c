//! Compaction policy cost under heavy fragmentation: the shapes of
//! [`cuarena::tools::fragment`] (256 B blocks freed every other one then
//! 512 B requests; mixed sizes; scattered pins) replayed on a metadata
//! arena at capacity = peak live, for n = 10k to 320k initial blocks.
//!
//! First a table of best-of-3 wall times per shape and n with the ratio to
//! the previous n (linear scaling reads as about 2.0 per doubling), then the
//! criterion measurements.
//!
//! `cargo bench --bench fragmentation` (table only: add `-- --table`; a
//! criterion filter such as `-- checkerboard` also works).

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use cuarena::tools::fragment::{program, run, Shape};
use cuarena::tools::trace::{replay_with, Allocator, ReplayOptions};
use cuarena::ArenaConfig;

/// Naive compact-on-failure on the same program (not for pins): wall ms
/// and bytes moved.
fn naive(shape: Shape, n: usize) -> Option<(f64, u64)> {
    if shape == Shape::Pinned {
        return None;
    }
    let ops = program(shape, n);
    let cap = ops.peak_live_rounded(256).max(256);
    let r = replay_with(
        &ops,
        &ArenaConfig::new(cap).with_alignment_bytes(256),
        &ReplayOptions::default()
            .with_allocator(Allocator::NaiveCompacting)
            .with_timeline_points(0),
    )
    .expect("naive replay");
    assert!(r.completed(), "naive failed: {:?}", r.outcome);
    Some((r.wall_time.as_secs_f64() * 1e3, r.bytes_moved))
}

const SIZES: [usize; 6] = [10_000, 20_000, 40_000, 80_000, 160_000, 320_000];

fn table() {
    println!(
        "{:<13} {:>8} {:>10} {:>7} {:>10} {:>12} {:>14} {:>10} {:>14}",
        "shape", "n", "ms", "ratio", "ns/op", "targ/full", "bytes moved", "naive ms", "naive bytes"
    );
    for shape in Shape::ALL {
        let mut prev: Option<f64> = None;
        for n in SIZES {
            let mut best = f64::INFINITY;
            let mut last = None;
            for _ in 0..3 {
                let r = run(shape, n).expect("fragmentation run");
                best = best.min(r.wall.as_secs_f64());
                last = Some(r);
            }
            let r = last.expect("ran");
            let ratio = prev.map_or("-".to_owned(), |p| format!("{:.2}", best / p));
            let (nms, nbytes) = naive(shape, n)
                .map_or(("-".to_owned(), "-".to_owned()), |(ms, b)| {
                    (format!("{ms:.1}"), b.to_string())
                });
            println!(
                "{:<13} {n:>8} {:>10.1} {ratio:>7} {:>10.0} {:>12} {:>14} {nms:>10} {nbytes:>14}",
                shape.label(),
                best * 1e3,
                best * 1e9 / r.ops as f64,
                format!("{}/{}", r.compactions.0, r.compactions.1),
                r.bytes_moved
            );
            prev = Some(best);
        }
    }
}

fn bench(c: &mut Criterion) {
    for shape in Shape::ALL {
        let mut g = c.benchmark_group(format!("fragmentation/{}", shape.label()));
        g.sample_size(10);
        for n in SIZES {
            g.throughput(Throughput::Elements(n as u64));
            g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
                b.iter(|| run(shape, n).expect("fragmentation run"))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --benches` passes no `--bench`: run one small case only.
    if !args.iter().any(|a| a == "--bench") {
        run(Shape::Checkerboard, 10_000).expect("fragmentation run");
        return;
    }
    table();
    if args.iter().any(|a| a == "--table") {
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
