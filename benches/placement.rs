//! Steady-state cost of one alloc + one free on a metadata arena (placement
//! only: no bytes, and no compaction: `CompactionPolicy::Manual`), against
//! the `offset-allocator` crate (0.2) on the same sequence. The arena's
//! figure includes what every allocation costs it besides the placement
//! index: the handle table, the block table and the counters.
//!
//! Run: `cargo bench --bench placement` (about a minute). Criterion prints
//! mean estimates; the medians are in `estimates.json`:
//!
//! ```text
//! cd target/criterion/placement_alloc_free
//! for f in */*/new/estimates.json; do echo "$f $(jq .median.point_estimate $f)"; done
//! ```
//!
//! # Workload
//!
//! - **Sizes:** log-uniform between 64 B and 256 MiB, i.e. every power of two
//!   in that range equally likely (half the blocks are under 128 KiB, one in
//!   11 is over 64 MiB; mean about 16.8 MiB), rounded up to 256 B and
//!   allocated at 256 B alignment, as the arena does.
//! - **Live blocks:** N = 1,000 / 10,000 / 100,000 / 1,000,000, in a ring of
//!   N slots, allocated up front and then churned 2N times (at least
//!   200,000) untimed, so the free space is fragmented as in a steady state.
//! - **One iteration:** free the block in a random slot, allocate a new block
//!   of a random size into it. Slot indices and sizes are pre-generated
//!   (a power-of-two sequence of at least 2N and 65,536 entries, replayed in
//!   a cycle); the timed loop draws no random numbers.
//! - **Capacity:** twice the expected live bytes (N x mean size), so requests
//!   essentially never fail; failures, if any, are counted and printed.
//!
//! # The baseline
//!
//! `offset-allocator` counts in `u32` units, so it gets the same capacity and
//! sizes in units of U bytes (sizes rounded up): U is the smallest power of
//! two of at least 256 B for which the capacity fits in `u32` units
//! (256 B up to N = 10,000; 1 KiB at 100,000; 16 KiB at 1,000,000; printed at
//! startup). Its node table holds 2N + 4096 nodes. It rounds nothing else but
//! its search is not exact (it skips the request's own size class), and it
//! has no alignment parameter (its offsets are unit-aligned).
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use cuarena::backend::MetaBackend;
use cuarena::{Arena, ArenaConfig, CompactionPolicy, Handle};
use offset_allocator::{Allocation, Allocator};

#[path = "../tests/support/mod.rs"]
mod support;
use support::Rng;

/// Smallest and largest sampled size, log2 (64 B and 256 MiB).
const MIN_LOG2: f64 = 6.0;
const MAX_LOG2: f64 = 28.0;
/// The arena's default alignment, to which it rounds sizes.
const GRAIN: u64 = 256;

/// A block size: log-uniform in [64 B, 256 MiB], rounded up to `GRAIN`.
/// (The generator runs only outside the timed loop.)
fn size(rng: &mut Rng) -> u64 {
    let bytes = (MIN_LOG2 + (MAX_LOG2 - MIN_LOG2) * rng.unit()).exp2() as u64;
    bytes.div_ceil(GRAIN) * GRAIN
}

/// The pre-generated sequence both allocators replay, and their sizing.
struct Workload {
    live: usize,
    /// Initial fill, one size per ring slot.
    fill: Vec<u64>,
    /// Untimed churn before measuring: (slot, size).
    churn: Vec<(u32, u64)>,
    /// The timed sequence (length a power of two): slot to free, size to alloc.
    slots: Vec<u32>,
    sizes: Vec<u64>,
    capacity: u64,
    /// Bytes per `offset-allocator` unit.
    unit: u64,
}

impl Workload {
    fn new(live: usize) -> Self {
        let mut rng = Rng::new(0x5eed ^ live as u64);
        let fill = (0..live).map(|_| size(&mut rng)).collect();
        let churn = (0..(2 * live).max(200_000))
            .map(|_| (rng.below(live as u64) as u32, size(&mut rng)))
            .collect();
        let len = (2 * live).max(1 << 16).next_power_of_two();
        let slots = (0..len).map(|_| rng.below(live as u64) as u32).collect();
        let sizes = (0..len).map(|_| size(&mut rng)).collect();
        // Mean of a log-uniform variable on [a, b] is (b - a) / ln(b / a).
        let (a, b) = (MIN_LOG2.exp2(), MAX_LOG2.exp2());
        let mean = (b - a) / (b / a).ln() + GRAIN as f64 / 2.0;
        // A multiple of the arena's alignment, as its config requires.
        let capacity = (2.0 * live as f64 * mean) as u64 / GRAIN * GRAIN;
        let mut unit = GRAIN;
        while capacity.div_ceil(unit) >= u64::from(u32::MAX) {
            unit *= 2;
        }
        Workload {
            live,
            fill,
            churn,
            slots,
            sizes,
            capacity,
            unit,
        }
    }

    fn units(&self, bytes: u64) -> u32 {
        // Cannot truncate: sizes are at most 256 MiB and units at least 256 B.
        bytes.div_ceil(self.unit) as u32
    }
}

/// A metadata arena with a ring of live blocks, warmed to a steady state.
struct Ours {
    arena: Arena<MetaBackend>,
    ring: Vec<Option<Handle>>,
    step: usize,
    failures: u64,
}

impl Ours {
    fn new(w: &Workload) -> Self {
        let config = ArenaConfig::new(w.capacity)
            .with_alignment_bytes(GRAIN)
            .with_compaction(CompactionPolicy::Manual);
        let mut s = Ours {
            arena: Arena::metadata(config).expect("a metadata arena"),
            ring: Vec::with_capacity(w.live),
            step: 0,
            failures: 0,
        };
        for &size in &w.fill {
            let id = s.alloc(size);
            s.ring.push(id);
        }
        for &(slot, size) in &w.churn {
            s.replace(slot as usize, size);
        }
        s
    }

    #[inline]
    fn alloc(&mut self, size: u64) -> Option<Handle> {
        match self.arena.alloc(black_box(size)) {
            Ok(h) => Some(black_box(h)),
            Err(_) => {
                self.failures += 1;
                None
            }
        }
    }

    #[inline]
    fn replace(&mut self, slot: usize, size: u64) {
        if let Some(old) = self.ring[slot].take() {
            // Cannot fail: the ring holds only this arena's live handles.
            let _ = self.arena.free(black_box(old));
        }
        self.ring[slot] = self.alloc(size);
    }

    /// One timed iteration.
    #[inline]
    fn step(&mut self, w: &Workload) {
        let k = self.step & (w.slots.len() - 1);
        self.step += 1;
        self.replace(w.slots[k] as usize, w.sizes[k]);
    }
}

/// `offset-allocator` with the same ring, in units.
struct Theirs {
    alloc: Allocator,
    ring: Vec<Option<Allocation>>,
    step: usize,
    failures: u64,
}

impl Theirs {
    fn new(w: &Workload) -> Self {
        let units = w.capacity.div_ceil(w.unit) as u32;
        let max_allocs = (2 * w.live + 4096) as u32;
        let mut s = Theirs {
            alloc: Allocator::with_max_allocs(units, max_allocs),
            ring: Vec::with_capacity(w.live),
            step: 0,
            failures: 0,
        };
        for &size in &w.fill {
            let a = s.allocate(w.units(size));
            s.ring.push(a);
        }
        for &(slot, size) in &w.churn {
            s.replace(slot as usize, w.units(size));
        }
        s
    }

    #[inline]
    fn allocate(&mut self, units: u32) -> Option<Allocation> {
        let a = self.alloc.allocate(black_box(units));
        match a {
            Some(a) => {
                black_box(a.offset);
            }
            None => self.failures += 1,
        }
        a
    }

    #[inline]
    fn replace(&mut self, slot: usize, units: u32) {
        if let Some(old) = self.ring[slot].take() {
            self.alloc.free(black_box(old));
        }
        self.ring[slot] = self.allocate(units);
    }

    #[inline]
    fn step(&mut self, w: &Workload, units: &[u32]) {
        let k = self.step & (w.slots.len() - 1);
        self.step += 1;
        self.replace(w.slots[k] as usize, units[k]);
    }
}

fn alloc_free_pair(c: &mut Criterion) {
    let mut group = c.benchmark_group("placement_alloc_free");
    group
        .throughput(Throughput::Elements(1))
        .sample_size(100)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for live in [1_000, 10_000, 100_000, 1_000_000] {
        let w = Workload::new(live);
        eprintln!(
            "N = {live}: capacity {:.2} TiB, offset-allocator unit {} B",
            w.capacity as f64 / (1u64 << 40) as f64,
            w.unit
        );

        let mut ours = Ours::new(&w);
        let warm_failures = ours.failures;
        group.bench_with_input(BenchmarkId::new("cuarena", live), &w, |b, w| {
            b.iter(|| ours.step(w))
        });
        let stats = ours.arena.stats();
        eprintln!(
            "  cuarena: {} failed allocs in set-up, {} in {} benchmark iterations; {} free regions, largest {} MiB",
            warm_failures,
            ours.failures - warm_failures,
            ours.step,
            stats.free_regions,
            stats.largest_free_bytes >> 20
        );
        drop(ours);

        let units: Vec<u32> = w.sizes.iter().map(|&s| w.units(s)).collect();
        let mut theirs = Theirs::new(&w);
        let warm_failures = theirs.failures;
        group.bench_with_input(BenchmarkId::new("offset-allocator", live), &w, |b, w| {
            b.iter(|| theirs.step(w, &units))
        });
        eprintln!(
            "  offset-allocator: {} failed allocs in set-up, {} in {} benchmark iterations",
            warm_failures,
            theirs.failures - warm_failures,
            theirs.step
        );
    }
    group.finish();
}

criterion_group!(benches, alloc_free_pair);
criterion_main!(benches);
