//! What owned storage costs over plain handles, and that using one is O(1).
//!
//! Run: `cargo bench --bench storage -- --warm-up-time 1 --measurement-time 3`.
//! Criterion prints mean estimates; the medians are in `estimates.json`
//! under `target/criterion/storage_*`.
//!
//! With `LIVE` blocks of 256 B live in a host arena (allocated up front,
//! every other one freed and reallocated so the index is not one run):
//!
//! - `storage_pair/alloc_free`: `Arena::alloc(256)` + `Arena::free`, the
//!   single owner's pair;
//! - `storage_pair/storage_drop_reclaim`: `Arena::alloc_storage(256)`, drop
//!   the `Storage`, `Arena::reclaim` (the block is freed there);
//! - `storage_pair/shared_storage_drop_reclaim`: the same through a
//!   `SharedArena` (its write lock taken twice, uncontended).
//!
//! The target: the last two at most twice the first. On a shared
//! machine the three groups run seconds apart under different loads, so
//! the bench also prints, first, the three timed in interleaved rounds
//! (15 rounds of 100,000 of each, the median round per op, and the ratios).
//!
//! `storage_resolve/{read_range_16B, resolve}/{1000, 100000}`: reading 16 B
//! of a slice of a storage (`Arena::read_range`: checks, resolution, copy),
//! and `Arena::resolve` of its handle, at 1,000 and 100,000 live blocks.
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use cuarena::DType;
use cuarena::{Arena, ArenaConfig, Handle, SharedArena};

const BLOCK: u64 = 256;

/// A host arena with `live` blocks of 256 B and room for as many again.
fn arena(live: usize) -> (Arena, Vec<Handle>) {
    let cap = (2 * live as u64 + 1024) * BLOCK;
    let mut a = Arena::host(ArenaConfig::new(cap)).expect("arena");
    let mut hs: Vec<Handle> = (0..live).map(|_| a.alloc(BLOCK).expect("alloc")).collect();
    // Holes between live blocks, then filled again: the index holds many
    // nodes, as in a steady state.
    for h in hs.iter_mut().step_by(2) {
        a.free(*h).expect("free");
    }
    for h in hs.iter_mut().step_by(2) {
        *h = a.alloc(BLOCK).expect("alloc");
    }
    (a, hs)
}

/// ns per op of `f` over `n` calls.
fn per_op(n: u32, mut f: impl FnMut()) -> f64 {
    let t = std::time::Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// The three pairs in interleaved rounds: load changes hit all three alike.
fn interleaved() {
    let (mut ar, _hs) = arena(100_000);
    // The shared arena wraps an arena of its own, of 100,000 blocks too.
    let shared_arena = SharedArena::new(arena(100_000).0);
    let mut rounds: [Vec<f64>; 3] = Default::default();
    for _ in 0..15 {
        rounds[0].push(per_op(100_000, || {
            let h = ar.alloc(black_box(BLOCK)).expect("alloc");
            ar.free(h).expect("free");
        }));
        rounds[1].push(per_op(100_000, || {
            let s = ar.alloc_storage(black_box(BLOCK)).expect("alloc");
            drop(black_box(s));
            ar.reclaim().expect("reclaim");
        }));
        rounds[2].push(per_op(100_000, || {
            let s = shared_arena.alloc_storage(black_box(BLOCK)).expect("alloc");
            drop(black_box(s));
            shared_arena.reclaim().expect("reclaim");
        }));
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let [x, y, z] = &mut rounds;
    let (x, y, z) = (med(x), med(y), med(z));
    println!(
        "interleaved, 100,000 live blocks: alloc+free {x:.1} ns, alloc_storage+drop+reclaim {y:.1} ns ({:.2}x), shared {z:.1} ns ({:.2}x)",
        y / x,
        z / x
    );
}

fn pairs(c: &mut Criterion) {
    interleaved();
    let live = 100_000;
    let mut g = c.benchmark_group("storage_pair");
    let (mut a, _hs) = arena(live);
    g.bench_function(BenchmarkId::new("alloc_free", live), |b| {
        b.iter(|| {
            let h = a.alloc(black_box(BLOCK)).expect("alloc");
            a.free(h).expect("free");
        })
    });
    g.bench_function(BenchmarkId::new("storage_drop_reclaim", live), |b| {
        b.iter(|| {
            let s = a.alloc_storage(black_box(BLOCK)).expect("alloc");
            drop(black_box(s));
            a.reclaim().expect("reclaim");
        })
    });
    let shared = SharedArena::new(a);
    g.bench_function(BenchmarkId::new("shared_storage_drop_reclaim", live), |b| {
        b.iter(|| {
            let s = shared.alloc_storage(black_box(BLOCK)).expect("alloc");
            drop(black_box(s));
            shared.reclaim().expect("reclaim");
        })
    });
    g.finish();
}

fn resolve(c: &mut Criterion) {
    let mut g = c.benchmark_group("storage_resolve");
    for live in [1_000usize, 100_000] {
        let (mut a, hs) = arena(live);
        let s = a.alloc_storage_dtype(DType::U32, 64).expect("storage");
        let slice = s.slice(8..12).expect("slice");
        a.write(&slice, &[1u32, 2, 3, 4]).expect("write");
        let mut out = [0u32; 4];
        g.bench_function(BenchmarkId::new("read_range_16B", live), |b| {
            b.iter(|| {
                a.read_into(black_box(&slice), &mut out).expect("read");
                black_box(out);
            })
        });
        let h = hs[live / 2];
        g.bench_function(BenchmarkId::new("resolve", live), |b| {
            b.iter(|| black_box(a.resolve(black_box(h)).expect("resolve")))
        });
    }
    g.finish();
}

criterion_group!(benches, pairs, resolve);
criterion_main!(benches);
