//! The fragmentation scenario of every bug report, as a reusable program:
//! the demo runs it on the GPU (or the host), and the tests run it on the
//! host so CI proves what the demo claims.
//!
//! A training loop with variable batch sizes allocates activations every
//! step and, now and then, a long-lived tensor (a growing KV cache, an
//! optimizer buffer). The short-lived tensors are freed at the end of each
//! step; the long-lived ones stay, scattered, so the free memory ends up in
//! holes. Then a tensor larger than the largest hole but smaller than the
//! free bytes is requested. A non-moving allocator of the same capacity
//! (the same arena with compaction off) fails there; the compacting arena
//! moves some blocks and succeeds, and every live tensor's bytes are
//! verified afterwards.

use std::time::{Duration, Instant};

use cuarena::backend::Backend;
use cuarena::plan::PlanKind;
use cuarena::{Arena, CompactionPolicy, Handle, Stats};

use crate::{DemoError, Result};

/// What the scenario measured.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ScenarioReport {
    /// Training-loop steps run.
    pub steps: usize,
    /// Stats of the compacting arena just before the big request.
    pub before: Stats,
    /// Stats of the non-moving baseline just before the big request: its
    /// holes differ from the compacting arena's (that one compacted during
    /// the loop, when a step's request found no hole).
    pub baseline_before: Stats,
    /// Size of the big request.
    pub request_bytes: u64,
    /// What the non-moving baseline said to the big request (or to an
    /// earlier request of the loop, if it failed sooner).
    pub baseline: std::result::Result<(), cuarena::Error>,
    /// Step at which the baseline failed (`steps` for the big request).
    pub baseline_failed_at: Option<usize>,
    /// Stats of the compacting arena after the big request.
    pub after: Stats,
    /// Live blocks `(offset, len, pinned)` before and after the request.
    pub map_before: Vec<(u64, u64, bool)>,
    /// See `map_before`.
    pub map_after: Vec<(u64, u64, bool)>,
    /// Wall time of the big request (compaction included).
    pub request_time: Duration,
    /// Tensors whose bytes were checked after the request, and their bytes.
    pub verified: (usize, u64),
}

/// Words of a tensor's pattern: a hash of its seed and the word index.
fn word(seed: u64, i: u64) -> u64 {
    let mut z = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fill(arena: &mut Arena<impl Backend>, h: Handle, seed: u64, bytes: u64) -> Result<()> {
    let data: Vec<u64> = (0..bytes / 8).map(|i| word(seed, i)).collect();
    Ok(arena.write(h, &data)?)
}

fn map_of(arena: &Arena<impl Backend>) -> Vec<(u64, u64, bool)> {
    arena
        .blocks()
        .iter()
        .map(|b| (b.offset, b.reserved_bytes, b.pins > 0))
        .collect()
}

/// Runs the scenario on `arena` (compacting) and `baseline` (the same
/// capacity, compaction off: made with [`CompactionPolicy::Manual`], which
/// this checks, [`DemoError::BaselineCompacts`] otherwise). Tensor sizes scale with the capacity: at the
/// largest batch a step's activations take about 1/8 of it, and the
/// long-lived tensors about 2/5 on average. Prints progress through
/// `progress` every couple of seconds.
pub fn run<B: Backend, C: Backend>(
    arena: &mut Arena<B>,
    baseline: &mut Arena<C>,
    steps: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<ScenarioReport> {
    const BATCHES: [u64; 7] = [8, 16, 32, 48, 64, 96, 128];
    const LAYERS: u64 = 6;
    const KEEP: usize = 24;
    if baseline.config().compaction != CompactionPolicy::Manual {
        return Err(DemoError::BaselineCompacts);
    }
    // Activation bytes of one sample of one layer.
    let unit = (arena.config().capacity_bytes / (128 * 12 * 8)).max(8) & !7;
    let mut rng = 0x5EED_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut keep: Vec<(Handle, Option<Handle>, u64, u64)> = Vec::new(); // (ours, baseline's, seed, bytes)
    let mut base = Beside {
        arena: baseline,
        result: Ok(()),
        failed_at: None,
    };
    let started = Instant::now();
    let mut last_print = Instant::now();
    for step in 0..steps {
        let batch = BATCHES[(next() % BATCHES.len() as u64) as usize];
        let mut acts = Vec::new();
        for layer in 0..LAYERS {
            let bytes = batch * unit * (1 + layer % 3);
            // Activations die within the step: their bytes are never checked.
            let h = arena.alloc(bytes)?;
            acts.push((h, base.alloc(bytes, step)));
        }
        // Every step something long-lived stays: a cache block sized by
        // this step's batch, allocated between the activations.
        {
            let bytes = batch * unit * 4;
            let seed = next();
            let h = arena.alloc(bytes)?;
            fill(arena, h, seed, bytes)?;
            keep.push((h, base.alloc(bytes, step), seed, bytes));
        }
        // Old cache entries expire in random order, leaving holes.
        if keep.len() > KEEP {
            let i = (next() % keep.len() as u64) as usize;
            let (h, b, _, _) = keep.swap_remove(i);
            arena.free(h)?;
            base.free(b)?;
        }
        for (h, b) in acts {
            arena.free(h)?;
            base.free(b)?;
        }
        if last_print.elapsed() > Duration::from_secs(2) {
            progress(&format!(
                "  step {step}/{steps} ({:.0} s)",
                started.elapsed().as_secs_f64()
            ));
            last_print = Instant::now();
        }
    }
    let before = arena.stats();
    let baseline_before = base.arena.stats();
    let map_before = map_of(arena);
    // Larger than the largest hole, smaller than the free bytes.
    let align = arena.config().alignment_bytes;
    let request_bytes = ((before.largest_free_bytes + before.free_bytes) / 2) & !(align - 1);
    if request_bytes <= before.largest_free_bytes {
        return Err(DemoError::NoFragmentation);
    }
    // The big request counts as step `steps`.
    base.alloc(request_bytes, steps);
    let t0 = Instant::now();
    let big = arena.alloc(request_bytes)?;
    let request_time = t0.elapsed();
    let seed = next();
    fill(arena, big, seed, request_bytes)?;
    keep.push((big, None, seed, request_bytes));
    let after = arena.stats();
    let map_after = map_of(arena);
    // Every live tensor still holds its bytes.
    let mut verified = (0, 0);
    if arena.backend().stores_bytes() {
        for &(h, _, seed, bytes) in &keep {
            let got: Vec<u64> = arena.read(h)?;
            let bad = got
                .iter()
                .enumerate()
                .filter(|&(i, &w)| w != word(seed, i as u64))
                .count();
            if bad > 0 {
                return Err(DemoError::DataMismatch {
                    tensor_bytes: bytes,
                    mismatched_words: 2 * bad as u64,
                });
            }
            verified.0 += 1;
            verified.1 += bytes;
        }
    }
    Ok(ScenarioReport {
        steps,
        before,
        baseline_before,
        request_bytes,
        baseline: base.result,
        baseline_failed_at: base.failed_at,
        after,
        map_before,
        map_after,
        request_time,
        verified,
    })
}

/// The non-moving baseline beside the compacting arena: it gets the same
/// requests until one fails, and keeps that failure and its step.
struct Beside<'a, C: Backend> {
    arena: &'a mut Arena<C>,
    result: std::result::Result<(), cuarena::Error>,
    failed_at: Option<usize>,
}

impl<C: Backend> Beside<'_, C> {
    /// A block of `bytes` at step `step`, unless an earlier request failed.
    fn alloc(&mut self, bytes: u64, step: usize) -> Option<Handle> {
        if self.failed_at.is_some() {
            return None;
        }
        match self.arena.alloc(bytes) {
            Ok(h) => Some(h),
            Err(e) => {
                self.result = Err(e);
                self.failed_at = Some(step);
                None
            }
        }
    }

    /// Frees the block the baseline got, if any.
    fn free(&mut self, h: Option<Handle>) -> Result<()> {
        if let Some(h) = h {
            self.arena.free(h)?;
        }
        Ok(())
    }
}

impl ScenarioReport {
    /// Whether the compacting arena compacted to satisfy the request.
    pub fn compacted(&self) -> bool {
        self.after.targeted_compactions + self.after.full_compactions
            > self.before.targeted_compactions + self.before.full_compactions
    }

    /// Bytes moved by the big request's compaction.
    pub fn bytes_moved(&self) -> u64 {
        self.after.bytes_moved - self.before.bytes_moved
    }

    /// Kind of the compaction that made room.
    pub fn kind(&self) -> Option<PlanKind> {
        if self.after.targeted_compactions > self.before.targeted_compactions {
            Some(PlanKind::Targeted)
        } else if self.after.full_compactions > self.before.full_compactions {
            Some(PlanKind::Full)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuarena::{ArenaConfig, Error};

    /// The demo's claim, proven in CI: the non-moving baseline fails where
    /// the compacting arena succeeds, and every live tensor keeps its bytes.
    #[test]
    fn the_demo_scenario_holds_on_the_host_backend() {
        let cap = 64 << 20;
        let mut ours = Arena::host(ArenaConfig::new(cap)).expect("arena");
        let manual = ArenaConfig::new(cap).with_compaction(CompactionPolicy::Manual);
        let mut base = Arena::host(manual).expect("baseline");
        let r = run(&mut ours, &mut base, 120, &mut |_| {}).expect("scenario");
        assert!(
            r.request_bytes > r.before.largest_free_bytes && r.request_bytes <= r.before.free_bytes
        );
        assert!(
            r.request_bytes > r.baseline_before.largest_free_bytes,
            "the baseline has a hole for it"
        );
        assert!(
            matches!(r.baseline, Err(Error::OutOfMemory { .. })),
            "{:?}",
            r.baseline
        );
        assert_eq!(r.baseline_failed_at, Some(r.steps));
        assert!(r.compacted());
        assert!(r.bytes_moved() > 0);
        assert!(r.verified.0 > 1);
    }
}
