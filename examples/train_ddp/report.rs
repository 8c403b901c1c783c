//! The checks of a run: each arena's compactions against its dry run's
//! prediction, and the data-parallel loss curve against the single-GPU
//! reference on the same global batches.

use cuarena::{fmt_bytes, Stats};

use crate::rank::{compactions, RankRun};
use cuarena_mlp::Res;

/// Relative tolerance on the eval loss, DDP vs the single-GPU reference, at
/// every eval point. The two runs see the same rows and the same
/// arithmetic per row; only the order of float sums differs (per-rank
/// partial sums of the gradient, NCCL's reduction order), a relative
/// difference of ~1e-7 per step that SGD carries along and amplifies: over
/// 1000 steps on two H200s the largest relative difference measured was
/// 9.4e-4; the default 3000 steps allow 5e-3.
const LOSS_RTOL: f32 = 5e-3;

/// A rank's (or the reference's) arena against its dry run: the same
/// compactions, moves and bytes moved, or an error.
pub(crate) fn report_arena(who: &str, st: &Stats, predicted: &Stats, peak: u64) -> Res<()> {
    let same = (compactions(st), st.moves, st.bytes_moved)
        == (
            compactions(predicted),
            predicted.moves,
            predicted.bytes_moved,
        );
    println!(
        "{who}: capacity {} = {:.3} x its peak live {}; {} compactions ({} moves, {} moved); the dry run predicted {}: {}",
        fmt_bytes(st.capacity_bytes),
        st.capacity_bytes as f64 / peak.max(1) as f64,
        fmt_bytes(peak),
        compactions(st),
        st.moves,
        fmt_bytes(st.bytes_moved),
        compactions(predicted),
        if same { "identical" } else { "DIFFERENT" }
    );
    if !same {
        return Err(format!("{who} compacted otherwise than its dry run").into());
    }
    Ok(())
}

/// The DDP run's eval losses against the single-GPU reference's, point by
/// point, and its final eval loss against the target.
pub(crate) fn compare(reference: &RankRun, ddp: &RankRun, target: f32) -> Res<()> {
    let mut worst = 0.0f32;
    for (a, b) in reference.curve.iter().zip(&ddp.curve) {
        let rel = (a.1 - b.1).abs() / a.1.abs().max(f32::MIN_POSITIVE);
        worst = worst.max(rel);
    }
    let (ra, da) = (
        reference.curve.last().ok_or("no evaluation")?,
        ddp.curve.last().ok_or("no evaluation")?,
    );
    println!(
        "loss curve, DDP vs single GPU on the same global batches, {} points: final eval loss {:.6} vs {:.6}; \
         largest relative difference {worst:.2e} (tolerance {LOSS_RTOL:.0e}: float summation order only); {:.2} s vs {:.2} s",
        ddp.curve.len(),
        da.1,
        ra.1,
        ddp.seconds,
        reference.seconds
    );
    if reference.curve.len() != ddp.curve.len() || worst.is_nan() || worst > LOSS_RTOL {
        return Err("the DDP loss curve differs from the single-GPU one".into());
    }
    if da.1 >= target {
        return Err(format!("target missed: final eval loss {:.4} >= {target}", da.1).into());
    }
    println!("target reached: final eval loss {:.4} < {target}", da.1);
    Ok(())
}
