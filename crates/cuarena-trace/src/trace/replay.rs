//! Replaying an alloc/free program against a metadata-only arena.
//!
//! A replay runs every [`Op`] on an [`Arena<MetaBackend>`] (placement and
//! compaction planning for real, no bytes) and stops at the first failure.
//! Three allocators are compared ([`Allocator`]): the arena's own targeted
//! compaction, a naive one that slides everything down whenever an
//! allocation fails, and a non-moving best-fit allocator.
//!
//! # Performance
//! The loop does no allocation per op: block ids index a `Vec` of handles
//! sized up front. Without a timeline a replay costs what the arena's
//! `alloc`/`free` cost; with one, [`Arena::stats`] is read after every op.

use std::time::{Duration, Instant};

use super::ops::{round_up, Op, Ops};
use crate::viz::{Sample, Timeline};
use crate::{Result, ToolError};
use cuarena::backend::MetaBackend;
use cuarena::Arena;
use cuarena::Error;
use cuarena::Handle;
use cuarena::{ArenaConfig, CompactionPolicy, PolicyStats, Stats};

/// Which allocator a replay runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Allocator {
    /// The arena with [`CompactionPolicy::Bounded`], the default: targeted
    /// compactions while its bound allows, naive's layout when it does not.
    #[default]
    Bounded,
    /// The arena with [`CompactionPolicy::Auto`]: naive's layout with its
    /// moves deferred (never more bytes moved than naive).
    Auto,
    /// [`CompactionPolicy::Manual`]; on out-of-memory, one full compaction
    /// (every block slid down) and a retry. The baseline for bytes moved.
    NaiveCompacting,
    /// [`CompactionPolicy::Manual`] and never a compaction: a plain
    /// non-moving segregated-fit allocator.
    NonMoving,
}

impl Allocator {
    /// All of them, in table order.
    pub const ALL: [Allocator; 4] = [
        Allocator::Bounded,
        Allocator::Auto,
        Allocator::NaiveCompacting,
        Allocator::NonMoving,
    ];

    /// Short name for tables.
    pub fn label(self) -> &'static str {
        match self {
            Allocator::Bounded => "cuarena, bounded policy (default)",
            Allocator::Auto => "cuarena, auto policy (strict)",
            Allocator::NaiveCompacting => "naive (full compaction on failure)",
            Allocator::NonMoving => "non-moving segregated fit",
        }
    }

    /// The name on command lines and in JSON: `bounded`, `auto`, `naive`,
    /// `nonmoving`.
    pub fn name(self) -> &'static str {
        match self {
            Allocator::Bounded => "bounded",
            Allocator::Auto => "auto",
            Allocator::NaiveCompacting => "naive",
            Allocator::NonMoving => "nonmoving",
        }
    }

    /// The allocator of [`name`](Self::name) `name`.
    pub fn from_name(name: &str) -> Option<Allocator> {
        Allocator::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The arena's compaction policy for this allocator.
    pub fn policy(self) -> CompactionPolicy {
        match self {
            Allocator::Bounded => CompactionPolicy::Bounded,
            Allocator::Auto => CompactionPolicy::Auto,
            Allocator::NaiveCompacting | Allocator::NonMoving => CompactionPolicy::Manual,
        }
    }
}

/// Options of [`replay_with`]. Build them from [`Default`] with the
/// `with_*` methods (or set the fields of a default value): the struct is
/// `#[non_exhaustive]`.
///
/// ```
/// use cuarena_trace::trace::{Allocator, ReplayOptions};
/// let o = ReplayOptions::default()
///     .with_allocator(Allocator::NonMoving)
///     .with_timeline_points(100);
/// assert_eq!(o.timeline_points, 100);
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// Allocator to run (its compaction policy overrides the config's).
    pub allocator: Allocator,
    /// Collect a [`Timeline`] of about this many buckets (each keeps its
    /// lowest and highest live-bytes sample); 0 for none.
    pub timeline_points: usize,
}

impl ReplayOptions {
    /// The allocator to run.
    #[must_use]
    pub fn with_allocator(mut self, allocator: Allocator) -> Self {
        self.allocator = allocator;
        self
    }

    /// A timeline of about `points` buckets (0: none).
    #[must_use]
    pub fn with_timeline_points(mut self, points: usize) -> Self {
        self.timeline_points = points;
        self
    }
}

/// How a replay ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Every op ran.
    Completed,
    /// An op failed.
    Failed {
        /// Index of the op in [`Ops::ops`].
        op: usize,
        /// Index of its trace event ([`Ops::event_index`]).
        event: u64,
        /// What the arena (or a check) said.
        error: ToolError,
    },
}

impl Outcome {
    /// True when every op ran.
    pub fn is_completed(&self) -> bool {
        matches!(self, Outcome::Completed)
    }

    /// The trace event at which the replay failed.
    pub fn failed_event(&self) -> Option<u64> {
        match self {
            Outcome::Completed => None,
            Outcome::Failed { event, .. } => Some(*event),
        }
    }
}

/// `wall` divided over `ops` ops (at least one).
pub(crate) fn per_op(wall: Duration, ops: usize) -> Duration {
    wall / u32::try_from(ops.max(1)).unwrap_or(u32::MAX)
}

/// The compactions of a replay (or of a pass of the GPU replay): how
/// many, what they moved, and the host time they took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionStats {
    /// Targeted compactions.
    pub targeted_compactions: u64,
    /// Full compactions.
    pub full_compactions: u64,
    /// Blocks moved.
    pub moves: u64,
    /// Bytes moved.
    pub bytes_moved: u64,
    /// Host time planning compactions.
    pub planning_time: Duration,
    /// Host time in compactions (planning and executing the plans).
    pub compaction_time: Duration,
}

impl CompactionStats {
    /// The compactions an arena made between two of its [`Stats`].
    pub fn between(before: &Stats, after: &Stats) -> Self {
        Self {
            targeted_compactions: after.targeted_compactions - before.targeted_compactions,
            full_compactions: after.full_compactions - before.full_compactions,
            moves: after.moves - before.moves,
            bytes_moved: after.bytes_moved - before.bytes_moved,
            planning_time: after.planning_time.saturating_sub(before.planning_time),
            compaction_time: after.compaction_time.saturating_sub(before.compaction_time),
        }
    }

    /// Every compaction an arena made (its [`Stats`] now).
    pub fn of(st: &Stats) -> Self {
        Self::between(&Stats::default(), st)
    }

    /// Targeted and full compactions together.
    pub fn count(&self) -> u64 {
        self.targeted_compactions + self.full_compactions
    }
}

/// What a replay did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReplayReport {
    /// Allocator replayed.
    pub allocator: Allocator,
    /// Arena capacity.
    pub capacity_bytes: u64,
    /// Arena alignment (every size is rounded up to it).
    pub alignment_bytes: u64,
    /// Completed or failed.
    pub outcome: Outcome,
    /// Ops that ran successfully.
    pub ops_run: usize,
    /// Peak bytes reserved by live blocks (sizes rounded to the alignment).
    pub peak_live_bytes: u64,
    /// The arena's compactions.
    pub compaction: CompactionStats,
    /// Wall time of the whole replay (arena creation included).
    pub wall_time: Duration,
    /// The compaction policy's bookkeeping at the end (what naive moved,
    /// the bound, handovers).
    pub policy: PolicyStats,
    /// The timeline, when asked for.
    pub timeline: Option<Timeline>,
}

impl ReplayReport {
    /// True when every op ran.
    pub fn completed(&self) -> bool {
        self.outcome.is_completed()
    }

    /// The trace event at which the replay failed.
    pub fn failed_event(&self) -> Option<u64> {
        self.outcome.failed_event()
    }

    /// Wall time per op run.
    pub fn time_per_op(&self) -> Duration {
        per_op(self.wall_time, self.ops_run)
    }
}

/// Replays `ops` with the default policy, no timeline.
///
/// Errors only if the arena cannot be created from `config` (for example a
/// capacity that is not a multiple of the alignment); a failing op is a
/// [`Outcome::Failed`] in the report.
pub fn replay(ops: &Ops, config: &ArenaConfig) -> Result<ReplayReport> {
    replay_with(ops, config, &ReplayOptions::default())
}

/// Per-bucket extremes for the timeline: the samples with the lowest and
/// highest live bytes.
struct Sampler {
    stride: usize,
    in_bucket: usize,
    lo: Option<Sample>,
    hi: Option<Sample>,
    timeline: Timeline,
    last_counts: (u64, u64, u64),
}

impl Sampler {
    fn new(points: usize, n_ops: usize, capacity_bytes: u64) -> Self {
        Self {
            stride: n_ops.div_ceil(points.max(1)).max(1),
            in_bucket: 0,
            lo: None,
            hi: None,
            timeline: Timeline {
                capacity_bytes,
                ..Timeline::default()
            },
            last_counts: (0, 0, 0),
        }
    }

    fn observe(&mut self, arena: &Arena<MetaBackend>, event: u64) {
        let st = arena.stats();
        let s = Sample {
            event,
            live_bytes: st.allocated_bytes,
            free_bytes: st.free_bytes,
            largest_free_bytes: st.largest_free_bytes,
        };
        let (t, f, b) = self.last_counts;
        if st.targeted_compactions > t || st.full_compactions > f {
            // One alloc can run a targeted and then a full compaction; the
            // bytes are split evenly between them (only the sum is known).
            let kinds = [
                (false, st.targeted_compactions.saturating_sub(t)),
                (true, st.full_compactions.saturating_sub(f)),
            ];
            let n: u64 = kinds.iter().map(|k| k.1).sum();
            let moved = st.bytes_moved.saturating_sub(b) / n.max(1);
            for (full, k) in kinds {
                for _ in 0..k {
                    self.timeline.compactions.push((event, full, moved));
                }
            }
            self.last_counts = (st.targeted_compactions, st.full_compactions, st.bytes_moved);
        }
        if !matches!(self.lo, Some(lo) if lo.live_bytes <= s.live_bytes) {
            self.lo = Some(s);
        }
        if !matches!(self.hi, Some(hi) if hi.live_bytes >= s.live_bytes) {
            self.hi = Some(s);
        }
        self.in_bucket += 1;
        if self.in_bucket >= self.stride {
            self.flush();
        }
    }

    fn flush(&mut self) {
        let mut pair = [self.lo.take(), self.hi.take()];
        pair.sort_by_key(|s| s.map(|s| s.event));
        let [a, b] = pair;
        if let Some(a) = a {
            self.timeline.samples.push(a);
        }
        if let (Some(a), Some(b)) = (a, b) {
            if a != b {
                self.timeline.samples.push(b);
            }
        }
        self.in_bucket = 0;
    }
}

/// Runs one op. Zero-byte allocations get no block (the arena has none of
/// zero bytes); their free is a no-op.
fn run_op(
    arena: &mut Arena<MetaBackend>,
    handles: &mut [Option<Handle>],
    op: Op,
    allocator: Allocator,
) -> Result<()> {
    match op {
        Op::Alloc { id, size } => {
            let slot = handles
                .get_mut(id as usize)
                .ok_or_else(|| ToolError::Program {
                    reason: format!("op names block {id}, beyond the program's sizes"),
                })?;
            if size == 0 {
                *slot = None;
                return Ok(());
            }
            let h = match arena.alloc(size) {
                Err(Error::OutOfMemory { .. }) if allocator == Allocator::NaiveCompacting => {
                    arena.compact()?;
                    arena.alloc(size)?
                }
                r => r?,
            };
            *slot = Some(h);
            Ok(())
        }
        Op::Free { id } => match handles.get_mut(id as usize).and_then(Option::take) {
            Some(h) => Ok(arena.free(h)?),
            None => Ok(()),
        },
    }
}

/// One handle slot per block of the program, allocated fallibly (a
/// program's size is bounded by its trace's memory budget; this table is a
/// multiple of it).
fn handle_table(ops: &Ops) -> Result<Vec<Option<Handle>>> {
    let mut handles = Vec::new();
    handles
        .try_reserve_exact(ops.sizes.len())
        .map_err(|_| ToolError::OutOfMemory {
            path: "the alloc/free program".to_owned(),
            what: "the replay's handle table",
            asked: (ops.sizes.len() * std::mem::size_of::<Option<Handle>>()) as u64,
        })?;
    handles.resize(ops.sizes.len(), None);
    Ok(handles)
}

/// Replays `ops` on a metadata-only arena built from `config` (its
/// compaction policy replaced by the allocator's), stopping at the first
/// failing op.
pub fn replay_with(
    ops: &Ops,
    config: &ArenaConfig,
    options: &ReplayOptions,
) -> Result<ReplayReport> {
    let t0 = Instant::now();
    let config = config.clone().with_compaction(options.allocator.policy());
    let mut arena = Arena::metadata(config.clone())?;
    let mut handles = handle_table(ops)?;
    let mut sampler = (options.timeline_points > 0).then(|| {
        Sampler::new(
            options.timeline_points,
            ops.ops.len(),
            config.capacity_bytes,
        )
    });

    let mut outcome = Outcome::Completed;
    let mut ops_run = 0;
    for (i, &op) in ops.ops.iter().enumerate() {
        let event = ops.event_index.get(i).copied().unwrap_or(i as u64);
        if let Err(error) = run_op(&mut arena, &mut handles, op, options.allocator) {
            outcome = Outcome::Failed {
                op: i,
                event,
                error,
            };
            break;
        }
        ops_run = i + 1;
        if let Some(s) = sampler.as_mut() {
            s.observe(&arena, event);
        }
    }
    let timeline = sampler.map(|mut s| {
        s.flush();
        s.timeline
    });
    let st = arena.stats();
    Ok(ReplayReport {
        allocator: options.allocator,
        capacity_bytes: config.capacity_bytes,
        alignment_bytes: config.alignment_bytes,
        outcome,
        ops_run,
        peak_live_bytes: st.peak_allocated_bytes,
        compaction: CompactionStats::of(&st),
        wall_time: t0.elapsed(),
        timeline,
        policy: st.policy,
    })
}

/// The arena after the first `n` ops of `ops` (for pictures of its layout
/// around a given op). Errors if the arena cannot be built or an op fails.
pub fn replay_prefix(
    ops: &Ops,
    config: &ArenaConfig,
    allocator: Allocator,
    n: usize,
) -> Result<Arena<MetaBackend>> {
    let config = config.clone().with_compaction(allocator.policy());
    let mut arena = Arena::metadata(config)?;
    let mut handles = handle_table(ops)?;
    for &op in ops.ops.iter().take(n) {
        run_op(&mut arena, &mut handles, op, allocator)?;
    }
    Ok(arena)
}

/// The smallest capacity under which a program completes, and the replay
/// there. See [`find_min_capacity_with`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MinCapacity {
    /// Smallest capacity found that completes (a multiple of the alignment).
    pub capacity_bytes: u64,
    /// The lower bound: peak live bytes with every size rounded up to the
    /// alignment. No allocator can complete below it.
    pub peak_live_bytes: u64,
    /// Replays run by the search.
    pub trials: u32,
    /// The replay at `capacity_bytes`.
    pub report: ReplayReport,
}

impl MinCapacity {
    /// `capacity_bytes / peak_live_bytes`.
    pub fn ratio(&self) -> f64 {
        self.capacity_bytes as f64 / self.peak_live_bytes.max(1) as f64
    }
}

/// [`find_min_capacity_with`] for the arena's targeted compaction.
pub fn find_min_capacity(ops: &Ops, align: u64) -> Result<MinCapacity> {
    find_min_capacity_with(ops, align, Allocator::Bounded)
}

/// Searches for the smallest capacity (a multiple of `align`, which is
/// also the arena's alignment) under which `allocator` completes `ops`.
///
/// It starts at the lower bound, peak live bytes rounded to `align`; a
/// compacting arena usually completes there. Otherwise the step above it
/// doubles until a replay completes, then a binary search narrows to one
/// alignment unit. The search assumes that more capacity never hurts,
/// which holds for the arena's policies in practice but is not proven.
///
/// Errors if `align` is not a valid alignment, or if nothing up to 64 times
/// the total bytes ever allocated completes (the last failure's error).
pub fn find_min_capacity_with(ops: &Ops, align: u64, allocator: Allocator) -> Result<MinCapacity> {
    find_min_capacity_observed(ops, align, allocator, &mut |_| {})
}

/// [`find_min_capacity_with`], calling `observe` with the report of every
/// trial replay as it finishes (for a progress line; the search is the same).
pub fn find_min_capacity_observed(
    ops: &Ops,
    align: u64,
    allocator: Allocator,
    observe: &mut dyn FnMut(&ReplayReport),
) -> Result<MinCapacity> {
    if !align.is_power_of_two() {
        return Err(Error::InvalidAlignment {
            align_bytes: align,
            max_align_bytes: cuarena::ArenaConfig::MAX_ALIGN,
        }
        .into());
    }
    let base = ArenaConfig::new(align).with_alignment_bytes(align);
    let lower = round_up(ops.peak_live_rounded(align).max(align), align);
    let mut trials = 0u32;
    let run = |cap: u64| -> Result<ReplayReport> {
        trials += 1;
        let config = base.clone().with_capacity_bytes(cap);
        let report = replay_with(
            ops,
            &config,
            &ReplayOptions {
                allocator,
                timeline_points: 0,
            },
        )?;
        observe(&report);
        Ok(report)
    };

    // Grow: steps of 0.1 % of the bound, doubling.
    let total = ops
        .sizes
        .iter()
        .fold(0u64, |a, &s| a.saturating_add(round_up(s, align)));
    let limit = total.max(lower).saturating_mul(64);
    let step = round_up((lower / 1024).max(align), align);
    let found = search_capacity(
        Search {
            lower,
            step,
            granule: align,
            tolerance: align,
            limit,
        },
        run,
        ReplayReport::completed,
        |_, last| match last.outcome {
            Outcome::Failed { error, .. } => error,
            Outcome::Completed => ToolError::Usage {
                reason: "capacity search ran out of range".into(),
            },
        },
    )?;
    Ok(MinCapacity {
        capacity_bytes: found.ok,
        peak_live_bytes: lower,
        trials,
        report: found.report,
    })
}

/// The bounds of a [`search_capacity`], in bytes.
pub(crate) struct Search {
    /// The first capacity tried: one below which nothing completes.
    pub(crate) lower: u64,
    /// The first step above `lower` (doubled after every failure).
    pub(crate) step: u64,
    /// Every capacity tried is a multiple of it.
    pub(crate) granule: u64,
    /// The search ends when the capacity that completes is at most this
    /// far above one that fails.
    pub(crate) tolerance: u64,
    /// No capacity above it is tried.
    pub(crate) limit: u64,
}

/// What a [`search_capacity`] found.
pub(crate) struct Found<R> {
    /// The smallest capacity that completed.
    pub(crate) ok: u64,
    /// The largest capacity that failed below it (0 when `lower` completed;
    /// the CUDA pool's search reports it).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) failed: u64,
    /// The replay at `ok`.
    pub(crate) report: R,
}

/// The smallest capacity at which `run` completes (to within the
/// tolerance, assuming more capacity never hurts): `lower`, then steps
/// above it doubling until a replay completes, then bisection on multiples
/// of the granule. Past the limit, `out_of_range(largest failed, its
/// replay)` is the error.
pub(crate) fn search_capacity<R>(
    b: Search,
    mut run: impl FnMut(u64) -> Result<R>,
    completed: impl Fn(&R) -> bool,
    out_of_range: impl FnOnce(u64, R) -> ToolError,
) -> Result<Found<R>> {
    let first = run(b.lower)?;
    if completed(&first) {
        return Ok(Found {
            ok: b.lower,
            failed: 0,
            report: first,
        });
    }
    let (mut failed, mut last, mut step) = (b.lower, first, b.step);
    let (mut ok, mut report) = loop {
        let cap = round_up(b.lower.saturating_add(step), b.granule);
        if cap > b.limit || cap == u64::MAX {
            return Err(out_of_range(failed, last));
        }
        let r = run(cap)?;
        if completed(&r) {
            break (cap, r);
        }
        (failed, last) = (cap, r);
        step = step.saturating_mul(2);
    };
    // Narrow: `failed` fails, `ok` completes.
    while ok - failed > b.tolerance.max(b.granule) {
        let mid = failed + ((ok - failed) / 2 / b.granule) * b.granule;
        let mid = if mid <= failed {
            failed + b.granule
        } else {
            mid
        };
        let r = run(mid)?;
        if completed(&r) {
            (ok, report) = (mid, r);
        } else {
            failed = mid;
        }
    }
    Ok(Found { ok, failed, report })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An op naming a block the program has no size for is the program's
    /// fault, not the allocator's.
    #[test]
    fn op_beyond_the_sizes_is_a_program_error() {
        let mut ops = Ops::from_ops([Op::Alloc { id: 0, size: 256 }]);
        ops.sizes.clear();
        let r = replay(&ops, &ArenaConfig::new(1 << 20)).expect("replay");
        assert!(
            matches!(
                r.outcome,
                Outcome::Failed {
                    error: ToolError::Program { .. },
                    ..
                }
            ),
            "{:?}",
            r.outcome
        );
    }

    /// Three 256 B blocks, the outer two freed: two 256 B holes, so a
    /// 512 B request needs a move.
    fn fragmenting() -> Ops {
        Ops::from_ops([
            Op::Alloc { id: 0, size: 256 },
            Op::Alloc { id: 1, size: 256 },
            Op::Alloc { id: 2, size: 256 },
            Op::Free { id: 2 },
            Op::Alloc { id: 3, size: 0 },
            Op::Free { id: 0 },
            Op::Alloc { id: 4, size: 512 },
            Op::Free { id: 3 },
        ])
    }

    #[test]
    fn allocators_differ_on_fragmentation() {
        let ops = fragmenting();
        assert_eq!(ops.peak_live_rounded(256), 768);
        let cfg = ArenaConfig::new(768);
        let arena = replay(&ops, &cfg).unwrap();
        assert!(arena.completed(), "{:?}", arena.outcome);
        assert!(arena.compaction.bytes_moved > 0);
        let naive = replay_with(
            &ops,
            &cfg,
            &ReplayOptions {
                allocator: Allocator::NaiveCompacting,
                timeline_points: 4,
            },
        )
        .unwrap();
        assert!(naive.completed());
        assert_eq!(naive.compaction.full_compactions, 1);
        let t = naive.timeline.unwrap();
        assert_eq!(t.compactions.len(), 1);
        assert!(!t.samples.is_empty());
        let fixed = replay_with(
            &ops,
            &cfg,
            &ReplayOptions {
                allocator: Allocator::NonMoving,
                timeline_points: 0,
            },
        )
        .unwrap();
        match fixed.outcome {
            Outcome::Failed { op, event, error } => {
                assert_eq!((op, event), (6, 6));
                assert!(matches!(error, ToolError::Arena(Error::OutOfMemory { .. })));
            }
            Outcome::Completed => panic!("non-moving cannot fit 512 B in two 256 B holes"),
        }
        assert_eq!(fixed.ops_run, 6);
    }

    #[test]
    fn min_capacity_search() {
        let ops = fragmenting();
        let m = find_min_capacity(&ops, 256).unwrap();
        assert_eq!(m.capacity_bytes, 768);
        assert_eq!(m.trials, 1);
        let n = find_min_capacity_with(&ops, 256, Allocator::NonMoving).unwrap();
        assert!(
            n.capacity_bytes > 768 && n.capacity_bytes <= 1024,
            "{}",
            n.capacity_bytes
        );
        assert!(n.report.completed());
        assert!(find_min_capacity(&ops, 3).is_err());
        assert!(replay(&ops, &ArenaConfig::new(1000)).is_err());
        let empty = find_min_capacity(&Ops::default(), 256).unwrap();
        assert_eq!(empty.capacity_bytes, 256);
    }

    #[test]
    fn prefix_stops_where_asked() {
        let ops = fragmenting();
        let a = replay_prefix(&ops, &ArenaConfig::new(768), Allocator::Bounded, 3).unwrap();
        assert_eq!(a.stats().live_blocks, 3);
        assert!(replay_prefix(&ops, &ArenaConfig::new(768), Allocator::NonMoving, 7).is_err());
    }
}
