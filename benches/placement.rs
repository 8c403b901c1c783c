//! Steady-state cost of one alloc + one free on a metadata arena (placement
//! only: no bytes, and no compaction: `CompactionPolicy::Manual`), against
//! the `offset-allocator` crate (0.2) on the same sequence. The arena's
//! figure includes what every allocation costs it besides the placement
//! index: the handle table, the block table and the counters.
//!
//! Run: `cargo bench --bench placement` (about a minute and a half): first
//! a table, then criterion's groups. Table only: `-- --table` (rounds:
//! `-- --table --rounds 9`; one N: `-- --table --live 100000`; an elastic
//! arena, which places by best fit: `-- --table --elastic`). A criterion
//! filter (`-- cuarena`) also works.
//!
//! # The table
//!
//! Per N, both allocators are built and warmed, then measured in rounds:
//! each round alternates 4 turns of the arena and of `offset-allocator`,
//! about 100 ms each (long against refilling the caches the other took),
//! so that a slow spell of a shared machine falls on both alike. The
//! columns: the median ns per iteration of each, the median over rounds
//! of each round's ratio (arena / offset-allocator, with its smallest and
//! largest), which is the figure the arena's target (at most 1.5) is read
//! against, and `offset-allocator`'s unit U (below).
//!
//! The last columns are the bytes each wastes to rounding on this
//! workload: over the arena's live blocks at the end of the measured
//! rounds (both are charged for the same sizes, so that they differ by
//! their rounding alone), the bytes reserved minus the bytes asked for,
//! as a total and per block, and (the line below) as a share of the live
//! bytes. The arena reserves each size rounded up to its 256 B alignment
//! (checked against its `Stats`: `allocated_bytes - requested_bytes`).
//! `offset-allocator` reserves whole units of U bytes and stores the unit
//! count exactly (its size classes index free regions; they do not round
//! what it stores), so it wastes the size rounded up to U. Neither figure
//! counts free space lost to fragmentation.
//!
//! Criterion prints mean estimates; the medians are in `estimates.json`:
//!
//! ```text
//! cd target/criterion/placement_alloc_free
//! for f in */*/new/estimates.json; do echo "$f $(jq .median.point_estimate $f)"; done
//! ```
//!
//! For a profiler, `-- --profile cuarena|offset-allocator N STEPS` builds
//! and warms one allocator and runs STEPS iterations in `profiled` (for
//! example `valgrind --tool=callgrind --toggle-collect='*profiled*'`).
//!
//! # Workload
//!
//! - **Sizes:** log-uniform between 64 B and 256 MiB, i.e. every power of two
//!   in that range equally likely (half the blocks are under 128 KiB, one in
//!   11 is over 64 MiB; mean about 16.8 MiB). The arena is asked for these
//!   bytes and rounds them up to its alignment, 256 B (its default).
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
//! (256 B up to N = 10,000; 1 KiB at 100,000; 16 KiB at 1,000,000; the
//! table's `unit` column). Its node table holds 2N + 4096 nodes. Its search is not exact
//! (it skips the request's own size class), and it has no alignment
//! parameter (its offsets are unit-aligned).
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use cuarena::backend::MetaBackend;
use cuarena::{Arena, ArenaConfig, CompactionPolicy, Handle};
use offset_allocator::{Allocation, Allocator};

use cuarena_testkit::{median, Rng};

/// Smallest and largest sampled size, log2 (64 B and 256 MiB).
const MIN_LOG2: f64 = 6.0;
const MAX_LOG2: f64 = 28.0;
/// The arena's default alignment, to which it rounds sizes.
const GRAIN: u64 = 256;

/// A block size in bytes: log-uniform in [64 B, 256 MiB]. (The generator
/// runs only outside the timed loop.)
fn size(rng: &mut Rng) -> u64 {
    (MIN_LOG2 + (MAX_LOG2 - MIN_LOG2) * rng.unit()).exp2() as u64
}

/// The pre-generated sequence both allocators replay, and their sizing.
struct Workload {
    live: usize,
    /// Initial fill, one size per ring slot (sizes in bytes, as asked for).
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

    /// The sizes in the ring after the fill, the churn and `steps` timed
    /// iterations (the same for both allocators, barring failures).
    fn live_after(&self, steps: usize) -> Vec<u64> {
        let mut ring = self.fill.clone();
        for &(slot, size) in &self.churn {
            ring[slot as usize] = size;
        }
        // A window of one cycle writes every slot the sequence writes, so
        // the last `len` steps decide the ring (the earlier ones before).
        let len = self.slots.len();
        for i in steps.saturating_sub(len)..steps {
            let k = i & (len - 1);
            ring[self.slots[k] as usize] = self.sizes[k];
        }
        ring
    }
}

/// A metadata arena with a ring of live blocks, warmed to a steady state.
struct Ours {
    arena: Arena<MetaBackend>,
    /// Handles as they are (16 bytes; an `Option` would add 8, where the
    /// baseline's `Option<Allocation>` is 8 in all): a failed allocation
    /// leaves a handle that names no block, whose free is refused.
    ring: Vec<Handle>,
    /// A handle of this arena that never names a block (version 0).
    none: Handle,
    step: usize,
    failures: u64,
}

impl Ours {
    /// `elastic`: an elastic arena with the same limit (the automatic trim
    /// off), which places by best fit with its free top last.
    fn new(w: &Workload, elastic: bool) -> Self {
        let config = if elastic {
            ArenaConfig::elastic()
                .with_capacity_bytes(w.capacity)
                .with_trim_window_us(0)
        } else {
            ArenaConfig::new(w.capacity)
        };
        let config = config
            .with_alignment_bytes(GRAIN)
            .with_compaction(CompactionPolicy::Manual);
        let arena = Arena::metadata(config).expect("a metadata arena");
        let mut s = Ours {
            none: Handle::from_bits(0, arena.id()),
            arena,
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
    fn alloc(&mut self, size: u64) -> Handle {
        match self.arena.alloc(black_box(size)) {
            Ok(h) => black_box(h),
            Err(_) => {
                self.failures += 1;
                self.none
            }
        }
    }

    #[inline]
    fn replace(&mut self, slot: usize, size: u64) {
        // Refused only for the handle of a failed allocation.
        let _ = self.arena.free(black_box(self.ring[slot]));
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
    for live in LIVE {
        let w = Workload::new(live);
        eprintln!(
            "N = {live}: capacity {:.2} TiB, offset-allocator unit {} B",
            w.capacity as f64 / (1u64 << 40) as f64,
            w.unit
        );

        let mut ours = Ours::new(&w, false);
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

/// The live block counts of the table and the criterion groups.
const LIVE: [usize; 4] = [1_000, 10_000, 100_000, 1_000_000];

/// Time of one allocator's turn: long against refilling the caches the
/// other one took during its turn (at 100,000 blocks, about a millisecond
/// for `offset-allocator`'s share of the L2 cache), short enough that a
/// slow spell of a shared machine falls on both alike.
const TURN_TIME: Duration = Duration::from_millis(100);

/// Turns of each allocator per round.
const TURNS: usize = 4;

/// Runs `step` `n` times; returns the time taken.
fn run(n: usize, step: &mut impl FnMut()) -> Duration {
    let t0 = Instant::now();
    for _ in 0..n {
        step();
    }
    t0.elapsed()
}

/// Iterations of `step` that take about `TURN_TIME`.
fn turn_len(step: &mut impl FnMut()) -> usize {
    const PROBE: usize = 4096;
    let t = run(PROBE, step).max(Duration::from_nanos(1));
    ((PROBE as f64 * TURN_TIME.as_secs_f64() / t.as_secs_f64()) as usize).max(PROBE)
}

/// One round: `TURNS` turns of `ours` and of `theirs`, alternating, each
/// of `lens` iterations. Returns the nanoseconds per iteration of each.
fn time_round(
    lens: (usize, usize),
    ours: &mut impl FnMut(),
    theirs: &mut impl FnMut(),
) -> (f64, f64) {
    let (mut a, mut b) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..TURNS {
        a += run(lens.0, ours);
        b += run(lens.1, theirs);
    }
    let per = |d: Duration, n: usize| d.as_nanos() as f64 / (TURNS * n) as f64;
    (per(a, lens.0), per(b, lens.1))
}

/// Bytes reserved minus bytes asked for over `live`, reserving whole
/// `unit`s.
fn rounding_waste(live: &[u64], unit: u64) -> u64 {
    live.iter().map(|&b| b.div_ceil(unit) * unit - b).sum()
}

/// Target of issue 33: the arena within this factor of offset-allocator.
const MAX_RATIO: f64 = 1.5;

fn table(rounds: usize, only: Option<usize>, elastic: bool) {
    println!(
        "alloc + free, ns per iteration: medians of {rounds} rounds (each: {TURNS} turns of \
         about {} ms of the arena and of offset-allocator, alternating); ratio: median \
         (min-max) of the rounds' ratios",
        TURN_TIME.as_millis()
    );
    println!(
        "{:>9} {:>9} {:>9} {:>17} {:>7} | {:>23} {:>23}",
        "N", "arena", "offset", "ratio", "unit", "arena waste", "offset-alloc waste"
    );
    let mut worst = 0.0f64;
    for live in LIVE.into_iter().filter(|&n| only.is_none_or(|o| o == n)) {
        let w = Workload::new(live);
        let mut ours = Ours::new(&w, elastic);
        let units: Vec<u32> = w.sizes.iter().map(|&s| w.units(s)).collect();
        let mut theirs = Theirs::new(&w);
        let (mut a, mut b, mut r) = (Vec::new(), Vec::new(), Vec::new());
        let mut ours_step = || ours.step(&w);
        let mut theirs_step = || theirs.step(&w, &units);
        let lens = (turn_len(&mut ours_step), turn_len(&mut theirs_step));
        for _ in 0..rounds {
            let (x, y) = time_round(lens, &mut ours_step, &mut theirs_step);
            a.push(x);
            b.push(y);
            r.push(x / y);
        }
        let (lo, hi) = r
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        let ratio = median(&mut r);
        worst = worst.max(ratio);
        // Both wastes over the arena's live sizes at the end, so that they
        // differ by the rounding alone.
        let failures = ours.failures + theirs.failures;
        let ring = w.live_after(ours.step);
        let ours_waste = rounding_waste(&ring, GRAIN);
        let stats = ours.arena.stats();
        if failures == 0 {
            assert_eq!(
                ours_waste,
                stats.allocated_bytes - stats.requested_bytes,
                "the arena's rounding, counted here and in its stats"
            );
        }
        let theirs_waste = rounding_waste(&ring, w.unit);
        let waste = |bytes: u64| {
            format!(
                "{:>9.2} MiB {:>6.0} B/blk",
                bytes as f64 / (1u64 << 20) as f64,
                bytes as f64 / live as f64
            )
        };
        println!(
            "{live:>9} {:>9.1} {:>9.1} {:>5.2} ({:.2}-{:.2}) {:>5} B | {:>23} {:>23}{}",
            median(&mut a),
            median(&mut b),
            ratio,
            lo,
            hi,
            w.unit,
            waste(ours_waste),
            waste(theirs_waste),
            if failures > 0 {
                format!(" ({failures} failed allocs: waste approximate)")
            } else {
                String::new()
            }
        );
        let requested: u64 = ring.iter().sum();
        println!(
            "{:>9} live: {:.2} TiB asked for; waste {:.4} % (arena), {:.4} % (offset-allocator)",
            "",
            requested as f64 / (1u64 << 40) as f64,
            100.0 * ours_waste as f64 / requested as f64,
            100.0 * theirs_waste as f64 / requested as f64
        );
    }
    println!(
        "{}: largest median ratio {worst:.2} (target <= {MAX_RATIO})",
        if worst <= MAX_RATIO { "PASS" } else { "FAIL" }
    );
}

/// Runs `steps` iterations of one allocator, for a profiler to isolate.
#[inline(never)]
fn profiled(steps: usize, mut step: impl FnMut()) {
    for _ in 0..steps {
        step();
    }
}

/// `--profile cuarena|offset-allocator N STEPS`.
fn profile(which: &str, live: usize, steps: usize) {
    let w = Workload::new(live);
    match which {
        "cuarena" => {
            let mut ours = Ours::new(&w, false);
            profiled(steps, || ours.step(&w));
            black_box(&ours.arena);
        }
        "offset-allocator" => {
            let units: Vec<u32> = w.sizes.iter().map(|&s| w.units(s)).collect();
            let mut theirs = Theirs::new(&w);
            profiled(steps, || theirs.step(&w, &units));
            black_box(&theirs.ring);
        }
        other => panic!("--profile cuarena|offset-allocator N STEPS, not {other}"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |flag: &str, k: usize| {
        let i = args.iter().position(|a| a == flag)?;
        args.get(i + k).cloned()
    };
    if let Some(which) = arg("--profile", 1) {
        let num = |k| arg("--profile", k).and_then(|s| s.parse().ok());
        profile(
            &which,
            num(2).expect("--profile: N"),
            num(3).expect("--profile: STEPS"),
        );
        return;
    }
    // `cargo test --benches` passes no `--bench`: a short smoke run.
    if !args.iter().any(|a| a == "--bench") {
        profile("cuarena", 1_000, 10_000);
        profile("offset-allocator", 1_000, 10_000);
        return;
    }
    let rounds = arg("--rounds", 1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let only = arg("--live", 1).and_then(|s| s.parse().ok());
    let elastic = args.iter().any(|a| a == "--elastic");
    table(rounds, only, elastic);
    if args.iter().any(|a| a == "--table") {
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
