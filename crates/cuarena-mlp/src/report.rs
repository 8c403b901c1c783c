//! Sizing the arena from a dry run, and the summary of a run.

use super::*;

/// Runs the allocation sequence of `train(s)` on a metadata arena and
/// returns (peak live bytes, the configuration to give a real arena).
pub fn capacity_for(p: &Problem, s: &Settings) -> Res<(u64, ArenaConfig)> {
    let (peak, max_operands, align) = dry_peak(p, s)?;
    let config = arena_config(peak, align, s.oversubscribe);
    if config.capacity_bytes < max_operands {
        return Err(format!(
            "--oversubscribe {}: an arena of {} cannot hold the operands of one kernel together \
             (up to {}, the eval batch or the largest batch's activations); the most these settings allow is {:.2}",
            s.oversubscribe.unwrap_or(1.0),
            fmt_bytes(config.capacity_bytes),
            fmt_bytes(max_operands),
            peak as f64 / max_operands as f64
        )
        .into());
    }
    Ok((peak, config))
}

/// The allocation sequence of `train(s)` on an unbounded metadata arena:
/// (peak live bytes, most bytes one operation needs resident together,
/// the arena's alignment).
pub fn dry_peak(p: &Problem, s: &Settings) -> Res<(u64, u64, u64)> {
    let mut dry = Dry::new(ArenaConfig::new(1 << 40))?;
    train(&mut dry, p, s, false)?;
    let peak = dry.arena.stats().peak_allocated_bytes;
    Ok((peak, dry.max_operands, dry.arena.config().alignment_bytes))
}

/// The arena for a run whose peak of live bytes is `peak`: 1.05 x peak and
/// no host tier, or (oversubscribed by `ratio`) peak / ratio and a host
/// tier of 2 x peak.
pub fn arena_config(peak: u64, align: u64, ratio: Option<f64>) -> ArenaConfig {
    let round = |bytes: f64| (bytes as u64).div_ceil(align) * align;
    match ratio {
        None => ArenaConfig::new(round(peak as f64 * HEADROOM)),
        Some(r) => ArenaConfig::new(round(peak as f64 / r))
            .with_spill_host_bytes(round(peak as f64 * HOST_TIER)),
    }
}

/// Largest difference of two parameter sets' updates from `init`,
/// relative to the largest update.
pub fn update_error(init: &HostNet, a: &HostNet, b: &HostNet) -> (f32, f32) {
    let (mut max_diff, mut max_update) = (0.0f32, 0.0f32);
    for ((l0, la), lb) in init.layers.iter().zip(&a.layers).zip(&b.layers) {
        for ((p0, pa), pb) in [(&l0.w, &la.w, &lb.w), (&l0.b, &la.b, &lb.b)]
            .into_iter()
            .flat_map(|(x, y, z)| x.iter().zip(y).zip(z))
        {
            max_diff = max_diff.max((pa - pb).abs());
            max_update = max_update.max((pb - p0).abs());
        }
    }
    (max_diff / max_update.max(f32::MIN_POSITIVE), max_update)
}

/// Mean loss and accuracy of `net` on the host.
pub fn host_eval(net: &HostNet, x: &[f32], labels: &[i32]) -> (f32, f32) {
    let logits = net.logits(x, labels.len());
    let (_, stats) = host::softmax_xent(&logits, labels, CLASSES);
    let n = labels.len() as f32;
    (
        stats[..labels.len()].iter().sum::<f32>() / n,
        stats[labels.len()..].iter().sum::<f32>() / n,
    )
}

pub fn summary_of_run<B: Backend>(
    arena: &Arena<B>,
    peak: u64,
    predicted: &Stats,
    out: &Outcome,
    s: &Settings,
) -> Res<()> {
    let st = arena.stats();
    let first = out.curve.first().ok_or("no evaluation")?;
    let last = out.curve.last().ok_or("no evaluation")?;
    let (first_train, last_train) = (
        out.curve
            .iter()
            .find_map(|p| p.train)
            .unwrap_or((f32::NAN, f32::NAN)),
        last.train.unwrap_or((f32::NAN, f32::NAN)),
    );
    println!();
    println!(
        "loss: eval {:.4} (step 0) -> {:.4} (step {}), accuracy {:.3} -> {:.3}; train {:.4} (first {} steps) -> {:.4} (last {}); target: eval loss < {}",
        first.eval_loss,
        last.eval_loss,
        last.step,
        first.eval_acc,
        last.eval_acc,
        first_train.0,
        s.every.min(s.steps),
        last_train.0,
        s.every.min(s.steps),
        s.target_loss
    );
    println!(
        "steps: {} in {:.2} s ({:.2} ms/step, batches {}..{})",
        s.steps,
        out.seconds,
        1e3 * out.seconds / s.steps as f64,
        s.min_batch,
        s.max_batch
    );
    println!(
        "compactions: {} ({} targeted, {} full), {} moves, {} moved; host time in compacting calls {:.1} ms (planning {:.1} ms)",
        st.targeted_compactions + st.full_compactions,
        st.targeted_compactions,
        st.full_compactions,
        st.moves,
        fmt_bytes(st.bytes_moved),
        st.compaction_time.as_secs_f64() * 1e3,
        st.planning_time.as_secs_f64() * 1e3
    );
    // The point of the example: the arena compacts while training goes on.
    if st.targeted_compactions + st.full_compactions == 0 && s.steps >= 200 {
        return Err("the arena never compacted: the run shows nothing".into());
    }
    let decisions = |st: &Stats| {
        [
            st.targeted_compactions,
            st.full_compactions,
            st.moves,
            st.bytes_moved,
            st.evictions,
            st.restores,
            st.bytes_evicted,
            st.bytes_restored,
        ]
    };
    let same = decisions(predicted) == decisions(&st);
    println!(
        "a metadata arena of the same capacity fed the same sequence predicted {} compactions, {} moves, {} moved, {} evictions, {} restores: {}",
        predicted.targeted_compactions + predicted.full_compactions,
        predicted.moves,
        fmt_bytes(predicted.bytes_moved),
        predicted.evictions,
        predicted.restores,
        if same { "identical" } else { "DIFFERENT" }
    );
    let tier = arena.config().spill_host_bytes;
    if tier > 0 {
        println!(
            "spilling: capacity {:.3} x peak live ({} x oversubscribed), host tier {}; {} evictions ({} out), {} restores ({} in), {:.1} copies per step",
            st.capacity_bytes as f64 / peak as f64,
            s.oversubscribe.unwrap_or(1.0),
            fmt_bytes(tier),
            st.evictions,
            fmt_bytes(st.bytes_evicted),
            st.restores,
            fmt_bytes(st.bytes_restored),
            (st.evictions + st.restores) as f64 / s.steps as f64
        );
    }
    println!(
        "arena: capacity {} = {:.3} x peak live {} (dry run); peak reached {}; {} allocations, {} failed",
        fmt_bytes(st.capacity_bytes),
        st.capacity_bytes as f64 / peak as f64,
        fmt_bytes(peak),
        fmt_bytes(st.peak_allocated_bytes),
        st.allocs,
        st.failed_allocs
    );
    println!("\n{}", arena.stats().summary());
    Ok(())
}
