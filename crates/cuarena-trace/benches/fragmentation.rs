//! Compaction policy cost under heavy fragmentation: the shapes of
//! [`cuarena_trace::fragment`] (256 B blocks freed every other one then
//! 512 B requests; mixed sizes; scattered pins) replayed on a metadata
//! arena at capacity = peak live, for n = 10k to 320k initial blocks.
//!
//! First a table: per shape and n the best of several rounds (sizes and
//! shapes interleaved within each round, so a slow spell of this shared
//! machine hits every size alike), the ratio to the previous n (linear
//! scaling reads as 2.0 per doubling), planning visits per op (the
//! deterministic measure: flat when planning is linear), and a PASS/FAIL
//! line against "each doubling at most 2.3x" and "80k blocks under 0.5 s".
//! Then the criterion groups, one per shape, whose throughput is in initial
//! blocks per second: flat across n means time linear in n.
//!
//! `cargo bench -p cuarena-trace --bench fragmentation` (table only: `-- --table`, rounds:
//! `-- --table --rounds 9`; a criterion filter such as `-- checkerboard`
//! also works).
//!
//! # Page faults
//!
//! A replay needs about 300 bytes of host memory per block (the arena's
//! tables and the planner's), ~100 MB at 320k blocks. Each run builds a
//! fresh arena, so whether its pages are already mapped depends on glibc:
//! after a run it keeps the freed heap for the next one unless the free
//! space at the top of the heap passes its trim threshold (adjusted at run
//! time, at most 64 MiB), and then returns it to the kernel. Here that
//! happens after the 320k runs only, so those runs fault their memory back
//! in (about 3 µs per 4 KiB page on the test VM, a third of their time)
//! while smaller runs reuse mapped pages: a step in the time per op that is
//! glibc's, not the replay's. The `faults` column shows the minor page
//! faults of each best run. By default the bench returns all free memory
//! to the kernel before every run, so that every run faults in all the
//! memory it needs, as a fresh process would: each size runs alike, and
//! the time is the whole cost of a replay. `--keep-heap` instead raises the
//! trim threshold (and fixes the mmap threshold) so that no run faults in
//! memory an earlier run used; `--glibc-heap` leaves glibc's defaults (the
//! step above shows).

use std::time::Duration;

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use cuarena::ArenaConfig;
use cuarena_trace::fragment::{program, run, run_program, FragmentReport, Shape};
use cuarena_trace::trace::{replay_with, Allocator, Ops, ReplayOptions};

const SIZES: [usize; 6] = [10_000, 20_000, 40_000, 80_000, 160_000, 320_000];

/// The targets of the issue.
const MAX_RATIO: f64 = 2.3;
const MAX_80K_S: f64 = 0.5;

/// Naive compact-on-failure on the same program (not for pins): wall ms
/// and bytes moved.
fn naive(shape: Shape, ops: &Ops) -> Option<(f64, u64)> {
    if shape == Shape::Pinned {
        return None;
    }
    let cap = ops.peak_live_rounded(256).max(256);
    let r = replay_with(
        ops,
        &ArenaConfig::new(cap).with_alignment_bytes(256),
        &ReplayOptions::default()
            .with_allocator(Allocator::NaiveCompacting)
            .with_timeline_points(0),
    )
    .expect("naive replay");
    assert!(r.completed(), "naive failed: {:?}", r.outcome);
    Some((r.wall_time.as_secs_f64() * 1e3, r.compaction.bytes_moved))
}

/// Minor page faults of this process so far (0 where unknown).
fn minor_faults() -> i64 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `getrusage` fills the struct it is given; all-zero bytes
        // are a valid `rusage`.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0 {
            return ru.ru_minflt;
        }
    }
    0
}

/// How the C heap is treated between runs; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Heap {
    /// glibc's defaults.
    Default,
    /// Freed memory stays mapped (`--keep-heap`).
    Keep,
    /// Free memory goes back to the kernel before every run (the default).
    Trim,
}

impl Heap {
    fn label(self) -> &'static str {
        match self {
            Heap::Default => "glibc default heap (--glibc-heap)",
            Heap::Keep => "heap kept mapped between runs (--keep-heap)",
            Heap::Trim => "heap trimmed before every run (the default)",
        }
    }

    /// Applies the setting once, at the start.
    fn setup(self) {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if self == Heap::Keep {
            // SAFETY: plain setters of allocator parameters. A fixed mmap
            // threshold (32 MiB, glibc's largest) also stops glibc from
            // adjusting the trim threshold.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            }
        }
    }

    /// Before each timed run.
    fn before_run(self) {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if self == Heap::Trim {
            // SAFETY: returns free heap memory to the kernel; no pointers.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }
}

struct Case {
    shape: Shape,
    n: usize,
    ops: Ops,
    best: f64,
    /// Minor page faults of the best run.
    faults: i64,
    last: Option<FragmentReport>,
}

fn table(rounds: usize, heap: Heap) {
    heap.setup();
    let mut cases: Vec<Case> = SIZES
        .iter()
        .flat_map(|&n| Shape::ALL.map(|shape| (shape, n)))
        .map(|(shape, n)| Case {
            shape,
            n,
            ops: program(shape, n),
            best: f64::INFINITY,
            faults: 0,
            last: None,
        })
        .collect();
    for round in 0..rounds {
        // Alternate the order so drift in the machine's load favours no size.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..cases.len()).collect()
        } else {
            (0..cases.len()).rev().collect()
        };
        for i in order {
            let c = &mut cases[i];
            heap.before_run();
            let f0 = minor_faults();
            let r = run_program(c.shape, c.n, &c.ops).expect("fragmentation run");
            let faults = minor_faults() - f0;
            if r.wall.as_secs_f64() < c.best {
                c.best = r.wall.as_secs_f64();
                c.faults = faults;
            }
            c.last = Some(r);
        }
    }
    println!(
        "best of {rounds} rounds, sizes interleaved, {}",
        heap.label()
    );
    println!(
        "{:<13} {:>7} {:>9} {:>6} {:>7} {:>7} {:>9} {:>6} {:>9} {:>12} {:>9} {:>12}",
        "shape",
        "n",
        "ms",
        "ratio",
        "ns/op",
        "faults",
        "targ/full",
        "vis/op",
        "vis ratio",
        "bytes moved",
        "naive ms",
        "naive bytes"
    );
    let mut worst_ratio = (0.0f64, "", 0);
    let mut worst_80k = (0.0f64, "");
    for shape in Shape::ALL {
        let mut prev: Option<(f64, u64)> = None;
        for c in cases.iter().filter(|c| c.shape == shape) {
            let r = c.last.as_ref().expect("ran");
            let ratio = prev.map(|(t, _)| c.best / t);
            let vis_ratio = prev.map(|(_, v)| r.planning_visits as f64 / v.max(1) as f64);
            if let Some(x) = ratio.filter(|&x| x > worst_ratio.0) {
                worst_ratio = (x, shape.label(), c.n);
            }
            if c.n == 80_000 && c.best > worst_80k.0 {
                worst_80k = (c.best, shape.label());
            }
            let f = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{x:.2}"));
            let (nms, nbytes) = naive(shape, &c.ops)
                .map_or(("-".to_owned(), "-".to_owned()), |(ms, b)| {
                    (format!("{ms:.1}"), b.to_string())
                });
            println!(
                "{:<13} {:>7} {:>9.1} {:>6} {:>7.0} {:>7} {:>9} {:>6.2} {:>9} {:>12} {nms:>9} {nbytes:>12}",
                shape.label(),
                c.n,
                c.best * 1e3,
                f(ratio),
                c.best * 1e9 / r.ops as f64,
                c.faults,
                format!("{}/{}", r.compactions.0, r.compactions.1),
                r.planning_visits as f64 / r.ops as f64,
                f(vis_ratio),
                r.bytes_moved
            );
            prev = Some((c.best, r.planning_visits));
        }
    }
    let ok_ratio = worst_ratio.0 <= MAX_RATIO;
    let ok_80k = worst_80k.0 < MAX_80K_S;
    println!(
        "{}: largest time ratio per doubling {:.2} ({} to n = {}; target <= {MAX_RATIO}); \
         slowest 80k run {:.1} ms ({}; target < {:.0} ms)",
        if ok_ratio && ok_80k { "PASS" } else { "FAIL" },
        worst_ratio.0,
        worst_ratio.1,
        worst_ratio.2,
        worst_80k.0 * 1e3,
        worst_80k.1,
        MAX_80K_S * 1e3
    );
}

fn bench(c: &mut Criterion) {
    for shape in Shape::ALL {
        let mut g = c.benchmark_group(format!("fragmentation/{}", shape.label()));
        g.sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3));
        for n in SIZES {
            let ops = program(shape, n);
            // Initial blocks per second: flat across n when time is linear.
            g.throughput(Throughput::Elements(n as u64));
            g.bench_with_input(BenchmarkId::from_parameter(n), &ops, |b, ops| {
                b.iter(|| run_program(shape, n, ops).expect("fragmentation run"))
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
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(5);
    let heap = if args.iter().any(|a| a == "--keep-heap") {
        Heap::Keep
    } else if args.iter().any(|a| a == "--glibc-heap") {
        Heap::Default
    } else {
        Heap::Trim
    };
    if args.iter().any(|a| a == "--table") {
        table(rounds, heap);
        return;
    }
    table(rounds, heap);
    benches();
    Criterion::default().configure_from_args().final_summary();
}
