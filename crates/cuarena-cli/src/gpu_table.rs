//! `cuarena replay --gpu`: the comparison table and the per-pass details.

use std::time::Duration;

use cuarena::fmt_bytes;
use cuarena_trace::gpu::baselines::BaselineReport;
use cuarena_trace::gpu::replay::{GpuReplayReport, PassReport, HOST_TARGET, HOST_TARGET_MOVES};

use crate::replay::result_cell;
use crate::Res;

/// One row of the comparison table.
pub(crate) struct Row {
    pub(crate) allocator: String,
    pub(crate) capacity: String,
    result: String,
    pub(crate) cap_over_peak: String,
    bytes_moved: String,
    moving: String,
    moving_fraction: String,
    per_event_alloc: String,
    per_event_replay: String,
}

const HEADER: [&str; 9] = [
    "allocator",
    "capacity",
    "result",
    "capacity / peak live",
    "bytes moved",
    "time moving (device)",
    "moving / trace wall",
    "time per event (allocator calls)",
    "time per event (whole replay)",
];

impl Row {
    fn cells(&self) -> [&str; 9] {
        [
            &self.allocator,
            &self.capacity,
            &self.result,
            &self.cap_over_peak,
            &self.bytes_moved,
            &self.moving,
            &self.moving_fraction,
            &self.per_event_alloc,
            &self.per_event_replay,
        ]
    }
}

fn ns(d: Duration) -> String {
    let v = d.as_secs_f64() * 1e9;
    if v >= 10_000.0 {
        format!("{:.1} µs", v / 1e3)
    } else {
        format!("{v:.0} ns")
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn ms3(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

pub(crate) fn ratio(cap: u64, peak: u64) -> String {
    format!("{:.4}", cap as f64 / peak.max(1) as f64)
}

pub(crate) fn baseline_row(label: &str, r: &BaselineReport, cap: Option<u64>, peak: u64) -> Row {
    let per = ns(r.time_per_op());
    Row {
        allocator: label.to_owned(),
        capacity: cap.map_or("uncapped".to_owned(), fmt_bytes),
        result: result_cell(&r.outcome),
        cap_over_peak: cap.map_or("-".to_owned(), |c| ratio(c, peak)),
        bytes_moved: "0 (never moves)".to_owned(),
        moving: "-".to_owned(),
        moving_fraction: "-".to_owned(),
        per_event_alloc: per.clone(),
        per_event_replay: per,
    }
}

pub(crate) fn arena_row(
    g: &GpuReplayReport,
    capacity: u64,
    peak: u64,
    trace_wall: Duration,
) -> Row {
    let t = &g.timed;
    let fraction = if trace_wall > Duration::ZERO {
        format!(
            "{:.3}%",
            100.0 * t.move_device_time.as_secs_f64() / trace_wall.as_secs_f64()
        )
    } else {
        "-".to_owned()
    };
    Row {
        allocator: "cuarena on the GPU".to_owned(),
        capacity: fmt_bytes(capacity),
        result: result_cell(&g.outcome),
        cap_over_peak: ratio(capacity, peak),
        bytes_moved: format!(
            "{} ({}/{})",
            fmt_bytes(t.compaction.bytes_moved),
            t.compaction.targeted_compactions,
            t.compaction.full_compactions
        ),
        moving: format!(
            "{}{}",
            ms(t.move_device_time),
            if t.inexact_compactions() > 0 {
                " (upper bound)"
            } else {
                ""
            }
        ),
        moving_fraction: fraction,
        per_event_alloc: ns(t.allocator_time_per_op()),
        per_event_replay: ns(t.time_per_op()),
    }
}

pub(crate) fn print_table(rows: &[Row]) -> Res<()> {
    let mut widths = HEADER.map(str::len);
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r.cells()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: [&str; 9]| {
        let mut s = String::from("|");
        for (k, (c, w)) in cells.iter().zip(widths).enumerate() {
            let pad = w.saturating_sub(c.chars().count());
            if k == 0 {
                s.push_str(&format!(" {c}{} |", " ".repeat(pad)));
            } else {
                s.push_str(&format!(" {}{c} |", " ".repeat(pad)));
            }
        }
        s
    };
    outln!("{}", line(HEADER))?;
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(k, w)| {
            if k == 0 {
                "-".repeat(*w)
            } else {
                format!("{}:", "-".repeat(w.saturating_sub(1)))
            }
        })
        .collect();
    outln!("| {} |", rule.join(" | "))?;
    for r in rows {
        outln!("{}", line(r.cells()))?;
    }
    Ok(())
}

fn print_pass(name: &str, p: &PassReport) -> Res<()> {
    outln!(
        "  {name}: {} ops in {} ({} per op), allocator calls {} ({} per op)",
        p.ops_run,
        ms(p.wall_time),
        ns(p.time_per_op()),
        ms(p.allocator_time),
        ns(p.allocator_time_per_op())
    )?;
    outln!(
        "    patterns {} filled, {} checked ({} tensors in full, {} at their edges)",
        fmt_bytes(p.bytes_filled),
        fmt_bytes(p.bytes_checked),
        p.checked_full,
        p.checked_edges,
    )?;
    outln!(
        "    compactions {} targeted / {} full, {} blocks and {} moved, {} on the device; \
         host planning {}, host compaction {}; settle delays {} (in the wall time)",
        p.compaction.targeted_compactions,
        p.compaction.full_compactions,
        p.compaction.moves,
        fmt_bytes(p.compaction.bytes_moved),
        ms(p.move_device_time),
        ms(p.compaction.planning_time),
        ms(p.compaction.compaction_time),
        ms(p.delay_time)
    )?;
    for c in &p.compactions {
        let secs = c.device_time.as_secs_f64();
        let rate = if secs > 0.0 {
            2.0 * c.bytes_moved as f64 / secs / 1e12
        } else {
            0.0
        };
        let placement = c.host_time.saturating_sub(c.planning_time + c.staging_time);
        outln!(
            "      event {:>7}: {}/{}, {:>6} moves, {:>10} moved: device {:>8} ({:.2} TB/s read + \
             written); host {:>8} = planning {} + staging {} + placement {} (backend {}, blocked \
             {}); {}",
            c.event,
            c.targeted,
            c.full,
            c.moves,
            fmt_bytes(c.bytes_moved),
            ms(c.device_time),
            rate,
            ms3(c.host_time),
            ms3(c.planning_time),
            ms3(c.staging_time),
            ms3(placement),
            ms3(c.backend_time),
            ms3(c.blocked_time),
            if c.exact {
                "returned before the device reached it"
            } else {
                "the device had reached it at return (device time an upper bound)"
            }
        )?;
    }
    let h = p.host_vs_device();
    if h.compactions > 0 {
        outln!(
            "    host vs device, {} compactions after the first: host <= planning + staging \
             (never blocked on the device) in {}, returned before the device reached their moves \
             in {}; host <= {} ms in {}/{} plans of <= {} moves; host median {} max {}, device \
             median {} max {}: target {}",
            h.compactions,
            h.unblocked,
            h.returned_while_queued,
            HOST_TARGET.as_millis(),
            h.small_plans_within_target,
            h.small_plans,
            HOST_TARGET_MOVES,
            ms3(h.host_median),
            ms3(h.host_max),
            ms(h.device_median),
            ms(h.device_max),
            if h.met() { "met" } else { "MISSED" }
        )?;
    }
    if p.untimed_compactions > 0 {
        outln!(
            "    {} compactions were not predicted and are missing from the device time",
            p.untimed_compactions
        )?;
    }
    Ok(())
}

pub(crate) fn print_gpu_details(g: &GpuReplayReport) -> Res<()> {
    outln!(
        "  device {}; checks: {}; {} mismatching words in all passes",
        g.device_name,
        g.sampling.describe(),
        g.mismatched_words
    )?;
    for (k, p) in g.warmup.iter().enumerate() {
        print_pass(&format!("warm-up pass {}", k + 1), p)?;
    }
    print_pass("timed pass", &g.timed)
}
