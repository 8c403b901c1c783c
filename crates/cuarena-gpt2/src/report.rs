//! What a run prints and writes: the losses, speed and memory of each run,
//! the gradient check against PyTorch's, and the JSON that
//! `scripts/gpt2_reference.py compare` reads.

use std::path::Path;

use cuarena::{fmt_bytes, Stats};
use safetensors::SafeTensors;
use serde_json::json;

use cuarena::backend::cuda::HostStats;

use crate::cli::{Mem, Settings};
use crate::cuda::HostTime;
use crate::dev::Dev;
use crate::model::{Layout, Start};
use crate::train::State;
use crate::Res;

pub struct Run {
    pub mem: Mem,
    pub losses: Vec<f32>,
    pub norms: Vec<f32>,
    /// Wall time of steps 1.. (step 0 is the warm-up) and their tokens.
    pub time_s: f64,
    pub tokens: usize,
    pub stats: Option<Stats>,
    pub grads: Option<String>,
    /// Host time inside the device calls over the timed steps.
    pub host: HostTime,
    /// The arena backend's own costs over the whole run (arena runs).
    pub backend: Option<HostStats>,
}

impl Run {
    pub(crate) fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.time_s.max(1e-9)
    }
}

/// The largest |a - b| / |b| over the first `k` pairs; a NaN counts as
/// infinitely far (f32::max alone would skip it).
pub(crate) fn max_rel_diff(a: &[f32], b: &[f32], k: usize) -> f32 {
    a.iter()
        .zip(b)
        .take(k)
        .map(|(x, y)| ((x - y) / y).abs())
        .map(|d| if d.is_nan() { f32::INFINITY } else { d })
        .fold(0f32, f32::max)
}

pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    crate::model::le_words(bytes, f32::from_le_bytes).collect()
}

/// The first step's gradients against PyTorch's: relative L2 error per
/// parameter (|g - r| / |r|), the worst five and the whole.
pub fn check_grads<D: Dev>(d: &mut D, st: &State, lay: &Layout, path: &Path) -> Res<String> {
    let ours = f32s(&d.download(st.grads)?);
    let bytes = crate::load::read_bounded(path)?;
    let what = path.display().to_string();
    let file = SafeTensors::deserialize(&bytes).map_err(|e| format!("{what}: {e}"))?;
    let theirs = lay.gather(&file, &what)?;
    let mut per: Vec<(f64, &str)> = Vec::new();
    let (mut num, mut den) = (0f64, 0f64);
    for (name, shape, at) in &lay.params {
        let n: usize = shape.iter().product();
        let (mut e, mut r) = (0f64, 0f64);
        for (a, b) in ours[*at..at + n].iter().zip(&theirs[*at..at + n]) {
            e += (f64::from(*a) - f64::from(*b)).powi(2);
            r += f64::from(*b).powi(2);
        }
        num += e;
        den += r;
        per.push(((e / r.max(1e-300)).sqrt(), name));
    }
    per.sort_by(|a, b| b.0.total_cmp(&a.0));
    let worst: Vec<String> = per
        .iter()
        .take(5)
        .map(|(e, n)| format!("{n} {e:.2e}"))
        .collect();
    let line = format!(
        "first-step gradients vs PyTorch: relative L2 error {:.2e} over all parameters; worst: {}",
        (num / den.max(1e-300)).sqrt(),
        worst.join(", ")
    );
    println!("{line}");
    Ok(line)
}

/// The median of `x` (the lower middle for an even count).
pub(crate) fn median(mut x: Vec<f64>) -> Option<f64> {
    x.sort_by(f64::total_cmp);
    x.get(x.len().saturating_sub(1) / 2).copied()
}

pub fn finish(s: &Settings, start: &Start, peak: u64, capacity: u64, runs: &[Run]) -> Res<()> {
    let steps = start.batches.len();
    println!("\n| run | tokens/s (steps 1..{steps}) | first loss | last loss | memory |");
    println!("| --- | --- | --- | --- | --- |");
    for r in runs {
        let memory = match &r.stats {
            Some(st) if r.mem == Mem::Elastic => format!(
                "elastic arena, no capacity: peak mapped {} = {:.4} x its peak live {}; {} trims; {} compactions ({} targeted, {} full), {} moved",
                fmt_bytes(st.peak_mapped_bytes),
                st.peak_mapped_bytes as f64 / st.peak_allocated_bytes.max(1) as f64,
                fmt_bytes(st.peak_allocated_bytes),
                st.trims,
                st.targeted_compactions + st.full_compactions,
                st.targeted_compactions,
                st.full_compactions,
                fmt_bytes(st.bytes_moved)
            ),
            Some(st) => format!(
                "arena {} = {:.4} x peak live {}; {} compactions ({} targeted, {} full), {} moved",
                fmt_bytes(capacity),
                capacity as f64 / peak as f64,
                fmt_bytes(peak),
                st.targeted_compactions + st.full_compactions,
                st.targeted_compactions,
                st.full_compactions,
                fmt_bytes(st.bytes_moved)
            ),
            None => "cudarc allocations (cuMemAllocAsync pool)".into(),
        };
        println!(
            "| {} | {:.0} | {:.4} | {:.4} | {memory} |",
            r.mem.name(),
            r.tokens_per_s(),
            r.losses.first().copied().unwrap_or(f32::NAN),
            r.losses.last().copied().unwrap_or(f32::NAN),
        );
    }
    for r in runs {
        let parts: Vec<String> = HostTime::KINDS
            .iter()
            .zip(&r.host.calls)
            .map(|(k, (t, n))| {
                format!(
                    "{k} {:.0} ms ({n}, {:.1} us each)",
                    t.as_secs_f64() * 1e3,
                    t.as_secs_f64() * 1e6 / (*n).max(1) as f64
                )
            })
            .collect();
        let total: f64 = r.host.calls.iter().map(|c| c.0.as_secs_f64()).sum();
        println!(
            "[{}] host time in calls over the timed steps: {:.0} ms of {:.0} ms wall: {}",
            r.mem.name(),
            total * 1e3,
            r.time_s * 1e3,
            parts.join(", ")
        );
    }
    if let Some(b) = runs.iter().find_map(|r| r.backend) {
        // What the backend holds outside the arena's capacity, and whether
        // plan scratch had to grow during the run.
        println!(
            "[arena] backend over the first arena run: {} held beside the arena at the end (plan scratch, handle table copy); {} scratch buffers grown after creation; {} staging buffers ({}); {} blocking driver calls ({:.1} ms); {:.0} ms staging and launching plans",
            fmt_bytes(b.device_scratch_bytes),
            b.buffers_grown,
            b.staging_buffers,
            fmt_bytes(b.staging_bytes),
            b.blocked_calls,
            b.blocked_time.as_secs_f64() * 1e3,
            b.staging_time.as_secs_f64() * 1e3
        );
    }
    let med = |m: Mem| median_tokens_per_s(runs, m);
    let first = |m: Mem| runs.iter().find(|r| r.mem == m);
    if let (Some(a), Some(p), Some(ta), Some(tp)) = (
        first(Mem::Arena),
        first(Mem::Plain),
        med(Mem::Arena),
        med(Mem::Plain),
    ) {
        let diff = max_rel_diff(&a.losses, &p.losses, usize::MAX);
        println!(
            "arena / plain tokens/s (medians of {} alternating runs each): {:.0} / {:.0} = {:.4}; largest relative loss difference between the two: {diff:.2e}",
            s.repeat,
            ta,
            tp,
            ta / tp
        );
    }
    elastic_summary(s, runs);
    if let Some(path) = &s.json {
        let run_json = |r: &Run| {
            json!({
                "mem": r.mem.name(),
                "losses": r.losses,
                "grad_norms": r.norms,
                "tokens_per_s": r.tokens_per_s(),
                "time_s": r.time_s,
                "tokens": r.tokens,
                "bytes_moved": r.stats.as_ref().map(|st| st.bytes_moved),
                "peak_live_bytes": r.stats.as_ref().map(|st| st.peak_allocated_bytes),
                "peak_mapped_bytes": r.stats.as_ref().filter(|_| r.mem == Mem::Elastic).map(|st| st.peak_mapped_bytes),
                "trims": r.stats.as_ref().filter(|_| r.mem == Mem::Elastic).map(|st| st.trims),
                "compactions": r.stats.as_ref().map(|st| st.targeted_compactions + st.full_compactions),
                "grad_check": r.grads,
                "backend_buffers_grown": r.backend.map(|b| b.buffers_grown),
                "backend_device_scratch_bytes": r.backend.map(|b| b.device_scratch_bytes),
                "backend_blocked_calls": r.backend.map(|b| b.blocked_calls),
                "host_ms": HostTime::KINDS.iter().zip(&r.host.calls).map(|(k, c)| (k.to_string(), json!({"ms": c.0.as_secs_f64() * 1e3, "calls": c.1}))).collect::<serde_json::Map<_, _>>(),
            })
        };
        let first = runs.first().ok_or("no run")?;
        let doc = json!({
            "tokens_per_s_median": { "arena": med(Mem::Arena), "plain": med(Mem::Plain), "elastic": med(Mem::Elastic) },
            "precision": if s.bf16 { "bf16" } else { "fp32" },
            "steps": steps,
            "losses": first.losses,
            "grad_norms": first.norms,
            "tokens_per_s": first.tokens_per_s(),
            "peak_live_bytes": peak,
            "capacity_bytes": capacity,
            "runs": runs.iter().map(run_json).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The median tokens/s of the runs on `m`.
fn median_tokens_per_s(runs: &[Run], m: Mem) -> Option<f64> {
    median(
        runs.iter()
            .filter(|r| r.mem == m)
            .map(Run::tokens_per_s)
            .collect(),
    )
}

/// Issue 34's figures for an elastic run: tokens/s against the fixed
/// arena's (medians of the alternating runs; target at least 0.99 of it),
/// and each elastic run's peak mapped bytes against its own peak live
/// bytes (target: at most peak live + max(2 MiB, 1% of it)).
fn elastic_summary(s: &Settings, runs: &[Run]) {
    let med = |m: Mem| median_tokens_per_s(runs, m);
    if let (Some(te), Some(ta)) = (med(Mem::Elastic), med(Mem::Arena)) {
        let ratio = te / ta;
        let losses = |m: Mem| runs.iter().find(|r| r.mem == m).map(|r| &r.losses);
        let diff = match (losses(Mem::Elastic), losses(Mem::Arena)) {
            (Some(e), Some(a)) => max_rel_diff(e, a, usize::MAX),
            _ => f32::NAN,
        };
        println!(
            "elastic / fixed arena tokens/s (medians of {} alternating runs each): {te:.0} / {ta:.0} = {ratio:.4} (target >= 0.99: {}); largest relative loss difference: {diff:.2e}",
            s.repeat,
            if ratio >= 0.99 { "met" } else { "MISSED" }
        );
    }
    for (i, r) in runs.iter().filter(|r| r.mem == Mem::Elastic).enumerate() {
        let Some(st) = &r.stats else { continue };
        let (mapped, live) = (st.peak_mapped_bytes, st.peak_allocated_bytes);
        let allowed = live + (2u64 << 20).max(live / 100);
        println!(
            "[elastic run {}] peak mapped {mapped} B, peak live {live} B: {} B above it, {} B allowed (max(2 MiB, 1%)): {}",
            i + 1,
            mapped.saturating_sub(live),
            allowed - live,
            if mapped <= allowed { "met" } else { "MISSED" }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_differences_count_nan_as_disagreement_and_stop_at_k() {
        let theirs = [2.0, 4.0, 8.0];
        assert_eq!(max_rel_diff(&[2.0, 5.0, 8.0], &theirs, 3), 0.25);
        assert_eq!(max_rel_diff(&[2.0, 5.0, 8.0], &theirs, 1), 0.0);
        assert_eq!(
            max_rel_diff(&[2.0, 4.0, f32::NAN], &theirs, 3),
            f32::INFINITY
        );
        assert_eq!(median(vec![3.0, 1.0, 2.0, 9.0]), Some(2.0));
        assert_eq!(median(Vec::new()), None);
    }
}
