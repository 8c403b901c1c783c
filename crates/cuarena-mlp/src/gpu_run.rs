//! The GPU run: checked against the host reference, then trained, and
//! (oversubscribed) compared with the run that fits.

use super::*;

/// A finished GPU training run and what it needs to be checked.
pub struct GpuRun {
    /// The executor, with the arena as the run left it.
    pub gpu: gpu::Gpu,
    pub out: Outcome,
    /// Peak live bytes of the dry run.
    pub peak: u64,
    /// The metadata arena's statistics for the same sequence.
    pub predicted: Stats,
}

/// One training run on the GPU, the arena sized from the dry run's peak
/// by `s.oversubscribe` (see [`arena_config`]).
pub fn gpu_train(s: &Settings, p: &Problem, log: bool) -> Res<GpuRun> {
    let (peak, config) = capacity_for(p, s)?;
    if log {
        println!("dry run (metadata arena): {}\n", arena_line(peak, &config));
    }
    let mut gpu = gpu::Gpu::new(config.clone(), s.time_copies)?;
    let out = train(&mut gpu, p, s, log)?;
    let predicted = predict(p, s, &config)?;
    Ok(GpuRun {
        gpu,
        out,
        peak,
        predicted,
    })
}

/// "N out, X in Y ms (Z GB/s)" for the copies of direction `d`.
pub fn copies_line(t: &gpu::SpillTiming, d: gpu::Dir) -> String {
    let (n, ms) = match d {
        gpu::Dir::Out => (t.copies.iter().filter(|c| c.0 == d).count(), t.out_ms),
        gpu::Dir::In => (t.copies.iter().filter(|c| c.0 == d).count(), t.in_ms),
    };
    let bytes = t.bytes(d);
    format!(
        "{n} copies, {} in {ms:.2} ms ({:.1} GB/s)",
        fmt_bytes(bytes),
        bytes as f64 / (ms * 1e6).max(f64::MIN_POSITIVE)
    )
}

/// `train_mlp` on a GPU: checked against the host reference on a short
/// run, then trained (after the run that fits, when oversubscribed) and
/// checked.
pub fn run_gpu(s: Settings) -> Res<()> {
    use gpu::Gpu;

    let p = problem(&s);
    describe(&s, &p.teacher, &p.eval_x);

    // 1. The GPU against the host reference: a short run with the same
    //    seeds and the same tight capacity (and host tier) on both;
    //    oversubscribed as asked, or as much as its smaller batches allow.
    let mut c = Settings::check();
    if let Some(r) = s.oversubscribe {
        let (peak, max_operands, _) = dry_peak(&p, &c)?;
        c.oversubscribe = Some(r.min(0.999 * peak as f64 / max_operands as f64).max(1.0));
    }
    let (check_peak, config) = capacity_for(&p, &c)?;
    let check_capacity = config.capacity_bytes as f64 / check_peak as f64;
    let t0 = Instant::now();
    let mut g = Gpu::new(config.clone(), true)?;
    println!(
        "device: {} ({}), NVRTC + context {:.2} s",
        g.arena.backend().device_name(),
        g.arena.backend().arch(),
        t0.elapsed().as_secs_f64()
    );
    let go = train(&mut g, &p, &c, false)?;
    let gw = go.net.download(&mut g)?;
    let gstats = g.arena.stats();
    drop(g);
    let mut h = Cpu::new(config)?;
    let ho = train(&mut h, &p, &c, false)?;
    let hw = ho.net.download(&mut h)?;
    let (rel, upd) = update_error(&p.student, &gw, &hw);
    let (gp, hp) = (
        go.curve.last().ok_or("no evaluation")?,
        ho.curve.last().ok_or("no evaluation")?,
    );
    println!(
        "check vs host reference ({} steps, capacity {:.3} x peak, {} compactions, {} evictions, {} restores on each): weight updates differ by {:.2e} of the largest ({:.2e}); \
         train loss {:.5} vs {:.5}, eval loss {:.5} vs {:.5}",
        c.steps,
        check_capacity,
        gstats.targeted_compactions + gstats.full_compactions,
        gstats.evictions,
        gstats.restores,
        rel,
        upd,
        gp.train.map_or(f32::NAN, |t| t.0),
        hp.train.map_or(f32::NAN, |t| t.0),
        gp.eval_loss,
        hp.eval_loss
    );
    let hstats = h.arena.stats();
    if (gstats.evictions, gstats.restores) != (hstats.evictions, hstats.restores) {
        return Err("the GPU and host runs spilled differently".into());
    }
    if rel.is_nan() || rel >= 1e-3 {
        return Err("the GPU kernels disagree with the host reference".into());
    }

    // 2. Oversubscribed: first the run that fits, same seed, for its curve.
    let reference = match s.oversubscribe {
        Some(_) => {
            let fit = Settings {
                oversubscribe: None,
                ..s.clone()
            };
            let r = gpu_train(&fit, &p, false)?;
            println!(
                "the run that fits ({}): {} steps in {:.2} s",
                arena_line(r.peak, r.gpu.arena.config()),
                fit.steps,
                r.out.seconds
            );
            Some(r.out)
        }
        None => None,
    };

    // 3. The real run.
    let mut r = gpu_train(&s, &p, true)?;
    summary_of_run(&r.gpu.arena, r.peak, &r.predicted, &r.out, &s)?;
    if s.oversubscribe.is_some() {
        let t = r.gpu.timing()?;
        println!(
            "spill copies timed with CUDA events: out {}; in {}; together {:.1} GB/s",
            copies_line(&t, gpu::Dir::Out),
            copies_line(&t, gpu::Dir::In),
            (t.bytes(gpu::Dir::Out) + t.bytes(gpu::Dir::In)) as f64
                / ((t.out_ms + t.in_ms) * 1e6).max(f64::MIN_POSITIVE)
        );
    }
    if let Some(fit) = reference {
        compare_curves(&fit, &r.out, s.oversubscribe.unwrap_or(1.0))?;
    }
    verify(&mut r.gpu, &r.out, &p.teacher, &p.eval_x, s.target_loss)
}

/// The oversubscribed run's loss curve against the run that fits: the same
/// kernels on the same data in the same order, so the same numbers.
pub fn compare_curves(fit: &Outcome, over: &Outcome, ratio: f64) -> Res<()> {
    if fit.curve.len() != over.curve.len() {
        return Err("the two runs evaluated at different steps".into());
    }
    let (mut max_diff, mut bit_exact) = (0.0f32, true);
    for (a, b) in fit.curve.iter().zip(&over.curve) {
        let pairs = [
            (a.eval_loss, b.eval_loss),
            (a.train.map_or(0.0, |t| t.0), b.train.map_or(0.0, |t| t.0)),
        ];
        for (x, y) in pairs {
            max_diff = max_diff.max((x - y).abs());
            bit_exact &= x.to_bits() == y.to_bits();
        }
    }
    let (fa, oa) = (
        fit.curve.last().ok_or("no evaluation")?,
        over.curve.last().ok_or("no evaluation")?,
    );
    println!(
        "loss curve at {ratio} x oversubscribed vs the run that fits (same seed), {} points: final train loss {:.6} vs {:.6}, \
         final eval loss {:.6} vs {:.6}; largest difference {max_diff:.2e} ({}); time {:.2} s vs {:.2} s ({:.2} x)",
        fit.curve.len(),
        oa.train.map_or(f32::NAN, |t| t.0),
        fa.train.map_or(f32::NAN, |t| t.0),
        oa.eval_loss,
        fa.eval_loss,
        if bit_exact { "bit-identical" } else { "not bit-identical" },
        over.seconds,
        fit.seconds,
        over.seconds / fit.seconds.max(f64::MIN_POSITIVE)
    );
    if max_diff.is_nan() || max_diff > 1e-4 {
        return Err("the oversubscribed run's loss curve differs from the run that fits".into());
    }
    Ok(())
}
