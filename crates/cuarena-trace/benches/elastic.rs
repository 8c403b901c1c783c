//! The elastic arena on recorded traces, no capacity given: peak and mean
//! mapped bytes against the live bytes and the trailing window's peak,
//! bytes moved against naive compact-on-failure at a fixed capacity of the
//! peak live bytes, and PyTorch's reserved bytes beside them (from the
//! snapshot's own segment events). Metadata replays (no bytes), the
//! automatic trim on at its window, time-weighted means on the trace's
//! `time_us`. With the checks of issue 34:
//!
//! - peak mapped <= peak live + max(2 MiB, 1% of peak live);
//! - mean mapped <= 1.02 x mean window peak + 2 MiB;
//! - bytes moved <= naive's at peak live + 2 x peak live.
//!
//! Run:
//!
//!     cargo bench -p cuarena-trace --bench elastic      # the traces in tests/data
//!     CUARENA_TRACES=corpus cargo bench -p cuarena-trace --bench elastic
//!
//! `CUARENA_WINDOW_US` and `CUARENA_SLACK` set the window and the slack
//! (defaults: the arena's); `CUARENA_ONLY=NAME` keeps matching traces.
//! `CUARENA_REPEAT=K` (2 to 16) replays each program K times in a row
//! ([`Ops::repeated`](cuarena_trace::trace::Ops::repeated)), as a longer
//! run of the same workload; PyTorch's columns are then left out.

use cuarena::{fmt_bytes, ArenaConfig};
use cuarena_testkit::trace::{bench_traces, BenchTrace};
use cuarena_trace::trace::elastic::{
    naive_bytes_moved_at_peak_live, op_times, replay_elastic, time_weighted_mean,
};
use cuarena_trace::trace::Trace;

const ALIGN: u64 = 256;
const MIB: u64 = 1 << 20;

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("elastic: bench");
        return;
    }
    let defaults = ArenaConfig::elastic();
    let window = env("CUARENA_WINDOW_US").unwrap_or(defaults.trim_window_us);
    let slack = env("CUARENA_SLACK").unwrap_or(defaults.elastic_slack);
    let passes = env("CUARENA_REPEAT").unwrap_or(1u32).clamp(1, 16);
    let traces = bench_traces();
    println!("window {window} us, slack {slack}, {passes} pass(es) of each program");
    println!(
        "| trace | half | peak live | peak mapped / peak live | mean live | mean window peak | mean mapped / window peak | PyTorch reserved mean / mean mapped | expandable segments: reserved mean / mean mapped | moved | naive at peak | trims | checks |"
    );
    println!(
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    );
    let mut failed = 0;
    for BenchTrace {
        path: p,
        name,
        half,
    } in &traces
    {
        let Ok(t) = Trace::read(p) else {
            println!("| {name} | {half} | unreadable |");
            continue;
        };
        let Some(&device) = t.devices().first() else {
            continue;
        };
        let ops = t.ops(device).unwrap();
        let Some(ops) = (if passes > 1 {
            ops.repeated(passes)
        } else {
            Some(ops)
        }) else {
            println!("| {name} | {half} | too many ids to repeat |");
            continue;
        };
        let r = replay_elastic(&ops, ALIGN, window, slack).unwrap();
        let naive = naive_bytes_moved_at_peak_live(&ops, ALIGN).unwrap();
        let torch = if passes > 1 {
            0
        } else {
            reserved_mean(&t, &ops, device)
        };
        // The same program recorded with expandable segments, where the
        // folder has it (`settings/NAME__exp.pickle.gz`): its reserved mean
        // against the elastic arena's mean mapped on that recording.
        let stem = name.trim_end_matches(".gz").trim_end_matches(".pickle");
        let exp = Trace::read(
            &p.with_file_name("settings")
                .join(format!("{stem}__exp.pickle.gz")),
        )
        .ok()
        .filter(|_| passes == 1)
        .and_then(|e| {
            let d = *e.devices().first()?;
            let ops = e.ops(d).ok()?;
            let r = replay_elastic(&ops, ALIGN, window, slack).ok()?;
            Some(reserved_mean(&e, &ops, d) as f64 / r.mean_mapped_bytes.max(1) as f64)
        });
        let peak = r.peak_live_bytes;
        let mut bad = Vec::new();
        if !r.outcome.is_completed() {
            bad.push("failed".to_owned());
        }
        if r.peak_mapped_bytes > peak + (2 * MIB).max(peak / 100) {
            bad.push("peak".to_owned());
        }
        if r.mean_mapped_bytes as f64
            > 1.02 * r.mean_window_peak_live_bytes as f64 + 2.0 * MIB as f64
        {
            bad.push("mean".to_owned());
        }
        if let Some(n) = naive {
            if r.bytes_moved > n + 2 * peak {
                bad.push("moved".to_owned());
            }
        }
        if !bad.is_empty() {
            failed += 1;
        }
        println!(
            "| {name} | {half} | {} | {:.4} | {} | {} | {:.4} | {} | {} | {} | {} | {} | {} |",
            fmt_bytes(peak),
            r.peak_mapped_bytes as f64 / peak.max(1) as f64,
            fmt_bytes(r.mean_live_bytes),
            fmt_bytes(r.mean_window_peak_live_bytes),
            r.mean_mapped_bytes as f64 / r.mean_window_peak_live_bytes.max(1) as f64,
            if torch > 0 {
                format!("{:.4}", torch as f64 / r.mean_mapped_bytes.max(1) as f64)
            } else {
                "-".to_owned()
            },
            exp.map_or("-".to_owned(), |x| format!("{x:.4}")),
            fmt_bytes(r.bytes_moved),
            naive.map_or("failed".to_owned(), fmt_bytes),
            r.trims,
            if bad.is_empty() {
                "ok".to_owned()
            } else {
                bad.join(", ")
            },
        );
    }
    println!("{failed} of {} traces fail a check", traces.len());
}

/// PyTorch's reserved bytes over the trace's time, from its segment events.
fn reserved_mean(t: &Trace, ops: &cuarena_trace::trace::Ops, device: u32) -> u64 {
    let reserved = t.reserved(device);
    let (times, _) = op_times(ops);
    time_weighted_mean(&times, |i| reserved.at(ops.event_index[i]))
}
