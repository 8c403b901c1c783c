//! `cuarena replay --elastic`: the trace on an elastic metadata arena (no
//! capacity, the automatic trim on at its default window, on the trace's
//! own clock), beside naive compact-on-failure at a fixed capacity of peak
//! live and PyTorch's reserved bytes over time.

use cuarena::{fmt_bytes, ArenaConfig};
use cuarena_trace::trace::elastic::{
    naive_bytes_moved_at_peak_live, op_times, replay_elastic, time_weighted_mean, ElasticReport,
};
use cuarena_trace::trace::Op;

use crate::replay::{result_cell, Loaded};
use crate::Res;

/// What `--elastic` adds to a replay.
pub(crate) struct ElasticOut {
    pub(crate) report: ElasticReport,
    /// Naive compact-on-failure at a fixed capacity of peak live (`None`:
    /// it fails there).
    pub(crate) naive_at_peak: Option<u64>,
}

/// Runs the elastic replay.
pub(crate) fn run(l: &Loaded, align: u64) -> Res<ElasticOut> {
    let d = ArenaConfig::elastic();
    let report = replay_elastic(&l.ops, align, d.trim_window_us, d.elastic_slack)?;
    let naive_at_peak = naive_bytes_moved_at_peak_live(&l.ops, align)?;
    Ok(ElasticOut {
        report,
        naive_at_peak,
    })
}

/// Time-weighted means of the live bytes (sizes rounded to `align`) and of
/// PyTorch's reserved bytes (`None` where the trace does not say).
pub(crate) fn means(l: &Loaded, align: u64) -> (u64, Option<u64>) {
    let ops = &l.ops;
    let (times, _) = op_times(ops);
    let mut live = Vec::with_capacity(ops.ops.len());
    let mut now = 0u64;
    let round = |s: u64| s.div_ceil(align) * align;
    for &op in &ops.ops {
        match op {
            Op::Alloc { size, .. } => now += round(size),
            Op::Free { id } => now = now.saturating_sub(round(ops.sizes[id as usize])),
        }
        live.push(now);
    }
    let mean_live = time_weighted_mean(&times, |i| live[i]);
    let r = l.trace.reserved(l.device);
    let known = r.initial.is_some() || !r.series.is_empty();
    let reserved = known.then(|| time_weighted_mean(&times, |i| r.at(ops.event_index[i])));
    (mean_live, reserved)
}

/// The screen's lines.
pub(crate) fn print(e: &ElasticOut, mean_live: u64, reserved: Option<u64>) -> Res<()> {
    let r = &e.report;
    let peak = r.peak_live_bytes.max(1);
    outln!()?;
    outln!(
        "elastic arena (no capacity; automatic trim, window {} {}): {}",
        r.window_us,
        if r.timed {
            "us of trace time"
        } else {
            "ops (the trace has no time)"
        },
        result_cell(&r.outcome)
    )?;
    outln!(
        "  peak mapped {} ({:.4} x peak live {}), mean mapped {} ({:.4} x the mean window \
         peak {}; mean live {})",
        fmt_bytes(r.peak_mapped_bytes),
        r.peak_mapped_bytes as f64 / peak as f64,
        fmt_bytes(r.peak_live_bytes),
        fmt_bytes(r.mean_mapped_bytes),
        r.mean_mapped_bytes as f64 / r.mean_window_peak_live_bytes.max(1) as f64,
        fmt_bytes(r.mean_window_peak_live_bytes),
        fmt_bytes(mean_live)
    )?;
    outln!(
        "  moved {} in {} trims and its compactions; naive at a fixed capacity of peak live: {}",
        fmt_bytes(r.bytes_moved),
        r.trims,
        e.naive_at_peak.map_or("fails".to_owned(), fmt_bytes)
    )?;
    match reserved {
        Some(t) => outln!(
            "  PyTorch reserved {} on average ({:.3} x the elastic arena's mean mapped)",
            fmt_bytes(t),
            t as f64 / r.mean_mapped_bytes.max(1) as f64
        ),
        None => outln!("  PyTorch reserved: not in the trace"),
    }
}
