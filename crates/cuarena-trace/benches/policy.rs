//! Bytes moved by cuarena's default policy (and `Auto`) against naive
//! compact-on-failure, per trace, at 1.00, 1.01 and 1.05 x peak live: the
//! table of BENCHMARKS.md, with the bound's checks (at most naive plus twice
//! the peak live bytes; nothing moved where naive moves nothing; no request
//! failed that naive serves) and the replay time per op against naive's.
//! Metadata replays (placement and planning, no bytes).
//!
//!     cargo bench -p cuarena-trace --bench policy     # the traces in tests/data
//!     CUARENA_TRACES=corpus cargo bench -p cuarena-trace --bench policy   # a folder of your own
//!
//! A trace's half (design or report) is looked up in the folder's
//! `manifest.json` or `corpus_manifest.json` (as `scripts/record-corpus.sh`
//! writes them); other traces are listed as `other`.

use cuarena::{fmt_bytes, ArenaConfig};
use cuarena_testkit::trace::{bench_traces, BenchTrace};
use cuarena_trace::trace::{replay_with, Allocator, ReplayOptions, Trace};

const ALIGN: u64 = 256;
const RATIOS: [f64; 3] = [1.00, 1.01, 1.05];

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("policy: bench");
        return;
    }
    let traces = bench_traces();
    println!(
        "| trace | half | capacity | naive moved | bounded moved | bounded / naive | (bounded - naive) / peak | handovers | auto / naive | non-moving |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    // (half, capacity ratio, bounded / naive, auto / naive)
    let mut rows: Vec<(String, f64, f64, f64)> = Vec::new();
    let (mut failures, mut over_bound, mut moved_where_naive_not, mut above_naive) = (0, 0, 0, 0);
    let mut worst_excess = 0f64;
    let mut time = [(0f64, 0usize); 2]; // bounded, naive: seconds, ops
    for BenchTrace {
        path: p,
        name,
        half,
    } in &traces
    {
        let t = match Trace::read(p) {
            Ok(t) => t,
            Err(e) => {
                println!("| {name} | {half} | unreadable: {e} | | | | | | | |");
                continue;
            }
        };
        let Some(&device) = t.devices().first() else {
            continue;
        };
        let ops = t.ops(device).unwrap();
        let peak = ops.peak_live_rounded(ALIGN);
        for r in RATIOS {
            let cap = ((peak as f64 * r).ceil() as u64).div_ceil(ALIGN) * ALIGN;
            let config = ArenaConfig::new(cap.max(ALIGN)).with_alignment_bytes(ALIGN);
            let run = |a| {
                replay_with(&ops, &config, &ReplayOptions::default().with_allocator(a)).unwrap()
            };
            let ours = run(Allocator::Bounded);
            let auto = run(Allocator::Auto);
            let naive = run(Allocator::NaiveCompacting);
            let fixed = run(Allocator::NonMoving);
            time[0].0 += ours.wall_time.as_secs_f64();
            time[0].1 += ours.ops_run;
            time[1].0 += naive.wall_time.as_secs_f64();
            time[1].1 += naive.ops_run;
            if naive.completed() && !ours.completed() {
                failures += 1;
            }
            let (a, n) = (ours.compaction.bytes_moved, naive.compaction.bytes_moved);
            if a > n {
                above_naive += 1;
                worst_excess = worst_excess.max((a - n) as f64 / peak.max(1) as f64);
            }
            if a > n.saturating_add(2 * peak) {
                over_bound += 1;
            }
            if n == 0 && a > 0 {
                moved_where_naive_not += 1;
            }
            let ratio = |x: u64| (n > 0).then(|| x as f64 / n as f64);
            if let (Some(b), Some(x)) = (ratio(a), ratio(auto.compaction.bytes_moved)) {
                rows.push((half.clone(), r, b, x));
            }
            println!(
                "| {name} | {half} | {r:.2} | {} | {}{} | {} | {:.3} | {} | {} | {} |",
                fmt_bytes(n),
                fmt_bytes(a),
                if ours.completed() { "" } else { " (failed)" },
                ratio(a).map_or("-".to_owned(), |x| format!("{x:.3}")),
                (a as f64 - n as f64) / peak.max(1) as f64,
                ours.policy.handovers,
                ratio(auto.compaction.bytes_moved).map_or("-".to_owned(), |x| format!("{x:.3}")),
                if fixed.completed() {
                    "completes"
                } else {
                    "fails"
                }
            );
        }
    }
    println!();
    let median = |mut v: Vec<f64>| -> (usize, f64, f64) {
        if v.is_empty() {
            return (0, f64::NAN, f64::NAN);
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let m = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        (n, m, v[n - 1])
    };
    for h in ["design", "report", "other", "all"] {
        for (what, pick) in [("all capacities", 0.0), ("1.01 and 1.05", 1.0)] {
            let sel = |col: usize| -> Vec<f64> {
                rows.iter()
                    .filter(|x| h == "all" || x.0 == h)
                    .filter(|x| pick == 0.0 || x.1 > 1.0)
                    .map(|x| if col == 0 { x.2 } else { x.3 })
                    .collect()
            };
            let (n, m, w) = median(sel(0));
            if n == 0 {
                continue;
            }
            let (_, am, _) = median(sel(1));
            println!(
                "{h}, {what}: {n} cases where naive moves anything; bounded / naive median {m:.3}, worst {w:.3}; auto / naive median {am:.3}"
            );
        }
    }
    println!("cases where bounded moved more than naive: {above_naive} (largest excess {worst_excess:.3} x peak live)");
    println!("cases over naive + 2 x peak live: {over_bound}");
    println!("cases where naive moves nothing and bounded moved anything: {moved_where_naive_not}");
    println!("cases naive completes and bounded fails: {failures}");
    println!(
        "replay time per op: bounded {:.0} ns, naive {:.0} ns ({:.2} x)",
        time[0].0 * 1e9 / time[0].1.max(1) as f64,
        time[1].0 * 1e9 / time[1].1.max(1) as f64,
        (time[0].0 / time[0].1.max(1) as f64) / (time[1].0 / time[1].1.max(1) as f64)
    );
}
