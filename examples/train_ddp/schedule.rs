//! The schedule: the data pool, each step's global batch (the same on
//! every rank and in the single-GPU reference), its uneven split into
//! per-rank shares, and a rank's share of it uploaded.

use cuarena::Storage;

use cuarena::DType;
use cuarena_mlp::{alloc_f32, Exec, Res, Rng, Settings, IN};

/// Rows in the data pool every global batch is a window of: large enough
/// that the student does not overfit it in the default 3000 steps (a pool
/// of 4 global batches did: eval loss rose again after 600 steps).
fn pool_rows(s: &Settings, world: usize) -> usize {
    32 * s.max_batch * world
}

/// The data pool of a `world`-rank schedule (the same on every rank), or
/// nothing where the arena holds no bytes (`stores` false: a dry run).
pub(crate) fn data_pool(s: &Settings, world: usize, stores: bool) -> Vec<f32> {
    if stores {
        let mut data = Rng::new(s.seed ^ 0xda7a);
        (0..pool_rows(s, world) * IN)
            .map(|_| data.normal())
            .collect()
    } else {
        Vec::new()
    }
}

/// Global batch of step `t` of a run whose data-parallel world is `world`:
/// (rows, first row in the pool). The same on every rank and in the
/// single-GPU reference.
fn global_batch(s: &Settings, world: usize, t: usize) -> (usize, usize) {
    let mut r = Rng::new(s.seed ^ 0x0061_0ba1 ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let g = r.batch(world * s.min_batch, world * s.max_batch);
    let start = r.below(pool_rows(s, world) - g + 1);
    (g, start)
}

/// `g` rows split into `parts` uneven shares (weights uniform in 0.5..1.5,
/// drawn for step `t`), every share at least one row; every rank computes
/// the same split.
fn split(s: &Settings, g: usize, parts: usize, t: usize) -> Vec<usize> {
    if parts == 1 {
        return vec![g];
    }
    let mut r = Rng::new(s.seed ^ 0x5711_7000 ^ (t as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    let w: Vec<f64> = (0..parts).map(|_| 0.5 + r.unit()).collect();
    let total: f64 = w.iter().sum();
    let mut n: Vec<usize> = w
        .iter()
        .map(|x| ((g as f64 * x / total) as usize).max(1))
        .collect();
    let sum: usize = n.iter().sum();
    n[0] = (n[0] + g).saturating_sub(sum).max(1);
    n
}

/// A rank's share of a global batch: inputs (uploaded), labels (computed
/// when the batch is taken), its rows, and the global batch's rows.
pub(crate) struct RankBatch {
    pub(crate) x: Storage,
    pub(crate) y: Storage,
    pub(crate) n: usize,
    pub(crate) g: usize,
}

/// Rank `rank`'s share of step `t`'s global batch, its inputs uploaded.
pub(crate) fn rank_batch<E: Exec>(
    e: &mut E,
    s: &Settings,
    world: usize,
    rank: usize,
    parts: usize,
    t: usize,
    pool: &[f32],
) -> Res<RankBatch> {
    let (g, start) = global_batch(s, world, t);
    let shares = split(s, g, parts, t);
    let n = shares[rank];
    let first = start + shares[..rank].iter().sum::<usize>();
    let x = alloc_f32(e, n * IN)?;
    let y = e.arena().alloc_storage_dtype(DType::I32, n as u64)?;
    let rows = if pool.is_empty() {
        &[][..]
    } else {
        &pool[first * IN..(first + n) * IN]
    };
    e.upload(&x, rows)?;
    Ok(RankBatch { x, y, n, g })
}
