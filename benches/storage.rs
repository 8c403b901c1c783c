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
//!
//! The backend chosen at run time: before the groups, the bench also prints
//! `Arena<HostBackend>` against `Arena<AnyBackend>` (the same host memory
//! behind the enum) in interleaved rounds: alloc+free, resolve and a 16 B
//! typed read at 100,000 live blocks, the median round per op and the
//! ratio (the target: at most 1.02). A filter that matches no group runs
//! only the interleaved lines: `cargo bench --bench storage -- interleaved`.
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use cuarena::backend::{AnyBackend, Backend};
use cuarena::DType;
use cuarena::{Arena, ArenaConfig, Handle, SharedArena};
use cuarena_testkit::median;

const BLOCK: u64 = 256;

/// A host arena with `live` blocks of 256 B and room for as many again.
fn arena(live: usize) -> (Arena, Vec<Handle>) {
    arena_on(live, Arena::host)
}

/// [`arena`] on the backend `make` gives.
fn arena_on<B: Backend>(
    live: usize,
    make: impl FnOnce(ArenaConfig) -> cuarena::Result<Arena<B>>,
) -> (Arena<B>, Vec<Handle>) {
    let cap = (2 * live as u64 + 1024) * BLOCK;
    let mut a = make(ArenaConfig::new(cap)).expect("arena");
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
    let [x, y, z] = &mut rounds;
    let (x, y, z) = (median(x), median(y), median(z));
    println!(
        "interleaved, 100,000 live blocks: alloc+free {x:.1} ns, alloc_storage+drop+reclaim {y:.1} ns ({:.2}x), shared {z:.1} ns ({:.2}x)",
        y / x,
        z / x
    );
}

/// `Arena<HostBackend>` and `Arena<AnyBackend>` in interleaved rounds:
/// alloc+free, resolve, and a 16 B typed read, at 100,000 live blocks.
fn any_backend() {
    let live = 100_000;
    let (mut host, hs) = arena(live);
    let (mut any, ha) = arena_on(live, |c| {
        let backend = AnyBackend::new(&c, None)?;
        Arena::with_backend(c, backend)
    });
    assert!(matches!(any.backend(), AnyBackend::Host(_)));
    let sh = host.alloc_storage_dtype(DType::U32, 64).expect("storage");
    let sa = any.alloc_storage_dtype(DType::U32, 64).expect("storage");
    let (slh, sla) = (sh.slice(8..12).expect("s"), sa.slice(8..12).expect("s"));
    let (h, a) = (hs[live / 2], ha[live / 2]);
    // [alloc+free, resolve, read] x [host, any]
    let mut rounds: [[Vec<f64>; 2]; 3] = Default::default();
    let mut out = [0u32; 4];
    for _ in 0..15 {
        rounds[0][0].push(per_op(100_000, || {
            let h = host.alloc(black_box(BLOCK)).expect("alloc");
            host.free(h).expect("free");
        }));
        rounds[0][1].push(per_op(100_000, || {
            let h = any.alloc(black_box(BLOCK)).expect("alloc");
            any.free(h).expect("free");
        }));
        rounds[1][0].push(per_op(1_000_000, || {
            black_box(host.resolve(black_box(h)).expect("resolve"));
        }));
        rounds[1][1].push(per_op(1_000_000, || {
            black_box(any.resolve(black_box(a)).expect("resolve"));
        }));
        rounds[2][0].push(per_op(100_000, || {
            host.read_into(black_box(&slh), &mut out).expect("read");
        }));
        rounds[2][1].push(per_op(100_000, || {
            any.read_into(black_box(&sla), &mut out).expect("read");
        }));
    }
    for (name, [h, a]) in ["alloc+free", "resolve", "read_into 16 B"]
        .iter()
        .zip(&mut rounds)
    {
        let (h, a) = (median(h), median(a));
        println!(
            "interleaved, 100,000 live blocks, {name}: Arena<HostBackend> {h:.1} ns, Arena<AnyBackend> {a:.1} ns ({:.3}x)",
            a / h
        );
    }
}

fn pairs(c: &mut Criterion) {
    interleaved();
    any_backend();
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
