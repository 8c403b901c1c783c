//! What a GPU replay is asked to do ([`GpuReplayOptions`], [`CheckSampling`])
//! and what it reports ([`GpuReplayReport`], one [`PassReport`] a pass).

use std::time::Duration;

use cuarena::backend::cuda::CudaOptions;

use crate::gpu::pattern::CheckRange;
use crate::trace::{Allocator, CompactionStats, Ops, Outcome};

/// How much of each tensor a GPU replay reads back at its free. Build one
/// from [`Default`] (or [`CheckSampling::ALL`]) with the `with_*` methods:
/// the struct is `#[non_exhaustive]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckSampling {
    /// Bytes checked at each end of a tensor that is not checked in full.
    pub edge_bytes: u64,
    /// Every tensor whose id is a multiple of this is checked in full (1:
    /// all; 0: none but the moved ones).
    pub full_every: u32,
    /// Tensors that moved since their allocation are checked in full.
    pub full_if_moved: bool,
}

impl CheckSampling {
    /// Every byte of every tensor.
    pub const ALL: CheckSampling = CheckSampling {
        edge_bytes: u64::MAX,
        full_every: 1,
        full_if_moved: true,
    };

    /// Bytes checked at each end of a tensor not checked in full.
    #[must_use]
    pub fn with_edge_bytes(mut self, bytes: u64) -> Self {
        self.edge_bytes = bytes;
        self
    }

    /// Check every tensor whose id is a multiple of `n` in full (1: all;
    /// 0: none but the moved ones).
    #[must_use]
    pub fn with_full_every(mut self, n: u32) -> Self {
        self.full_every = n;
        self
    }

    /// Check tensors that moved since their allocation in full.
    #[must_use]
    pub fn with_full_if_moved(mut self, full: bool) -> Self {
        self.full_if_moved = full;
        self
    }

    /// The range to check of tensor `id`, moved or not.
    pub fn range(&self, id: u32, moved: bool) -> CheckRange {
        let every = self.full_every != 0 && id % self.full_every == 0;
        if every || (moved && self.full_if_moved) {
            CheckRange::Full
        } else {
            CheckRange::Edges(self.edge_bytes)
        }
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        if *self == CheckSampling::ALL {
            return "every byte of every tensor".to_owned();
        }
        format!(
            "every byte of {}every {} tensor, first and last {} of the others",
            if self.full_if_moved {
                "moved tensors and "
            } else {
                ""
            },
            ordinal(self.full_every),
            cuarena::fmt_bytes(self.edge_bytes)
        )
    }
}

fn ordinal(n: u32) -> String {
    match n {
        0 => "no".to_owned(),
        1 => "".to_owned(),
        2 => "2nd".to_owned(),
        3 => "3rd".to_owned(),
        n => format!("{n}th"),
    }
}

impl Default for CheckSampling {
    /// Moved tensors and every 8th tensor in full, 64 KiB at each end of
    /// the others.
    fn default() -> Self {
        CheckSampling {
            edge_bytes: 64 << 10,
            full_every: 8,
            full_if_moved: true,
        }
    }
}

/// Options of [`replay_gpu`](super::replay::replay_gpu): [`Default`] and
/// the `with_*` methods.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GpuReplayOptions {
    /// CUDA device ordinal.
    pub ordinal: usize,
    /// What the checks read.
    pub sampling: CheckSampling,
    /// Passes over the program before the timed one, on the same arena
    /// (checked like the timed one). They grow the arena's scratch buffers
    /// to what the program needs and load every kernel, so the timed pass
    /// measures the steady state; each starts from an empty arena and
    /// makes the same placement decisions.
    pub warmup_passes: u32,
    /// Initial delay enqueued before an allocation that will compact (see
    /// the module's "Timing"); doubles, up to the replay's `MAX_DELAY`, after a compaction
    /// whose timing came out inexact.
    pub settle_delay: Duration,
    /// Self-test of the checks: right after block `id` is filled (in every
    /// pass), its bytes are overwritten from the host (`0xA5`, through
    /// `Arena::write`), so its check must fail and the replay must report
    /// it. `None` for real runs.
    pub corrupt_block: Option<u32>,
    /// The move kernels' options of the replay's arena.
    pub cuda_options: CudaOptions,
    /// The allocator the GPU arena runs: [`Allocator::Bounded`] (the
    /// default), [`Allocator::Auto`], or [`Allocator::NaiveCompacting`]
    /// (a full compaction when a request fits in no hole), to time
    /// naive's moves on the same device. [`Allocator::NonMoving`] never
    /// compacts.
    pub allocator: Allocator,
}

impl Default for GpuReplayOptions {
    fn default() -> Self {
        Self {
            ordinal: 0,
            sampling: CheckSampling::default(),
            warmup_passes: 1,
            settle_delay: Duration::from_millis(2),
            corrupt_block: None,
            cuda_options: CudaOptions::default(),
            allocator: Allocator::Bounded,
        }
    }
}

impl GpuReplayOptions {
    /// The CUDA device ordinal.
    #[must_use]
    pub fn with_ordinal(mut self, ordinal: usize) -> Self {
        self.ordinal = ordinal;
        self
    }

    /// What the checks read.
    #[must_use]
    pub fn with_sampling(mut self, sampling: CheckSampling) -> Self {
        self.sampling = sampling;
        self
    }

    /// Passes before the timed one.
    #[must_use]
    pub fn with_warmup_passes(mut self, passes: u32) -> Self {
        self.warmup_passes = passes;
        self
    }

    /// Initial delay enqueued before an allocation that will compact.
    #[must_use]
    pub fn with_settle_delay(mut self, delay: Duration) -> Self {
        self.settle_delay = delay;
        self
    }

    /// The move kernels' options of the replay's arena.
    #[must_use]
    pub fn with_cuda_options(mut self, options: CudaOptions) -> Self {
        self.cuda_options = options;
        self
    }

    /// Self-test: corrupt block `id` after its fill (`None` for real runs).
    #[must_use]
    pub fn with_corrupt_block(mut self, id: Option<u32>) -> Self {
        self.corrupt_block = id;
        self
    }

    /// The allocator the GPU arena runs.
    #[must_use]
    pub fn with_allocator(mut self, allocator: Allocator) -> Self {
        self.allocator = allocator;
        self
    }
}

/// The host and device time of one compacting allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CompactionTiming {
    /// Index of the op in [`Ops::ops`].
    pub op: usize,
    /// Its trace event.
    pub event: u64,
    /// Targeted compactions it ran.
    pub targeted: u64,
    /// Full compactions it ran.
    pub full: u64,
    /// Moves of its plans.
    pub moves: u64,
    /// Bytes it moved.
    pub bytes_moved: u64,
    /// Host time of the `Arena::alloc` call (planning, enqueueing the moves,
    /// and any wait for the stream inside it).
    pub host_time: Duration,
    /// Of which planning (the arena's planning time).
    pub planning_time: Duration,
    /// Of which the rest of the compaction: checking the plan, staging and
    /// enqueueing its moves, the index and the handle table (the arena's
    /// compaction time less planning). The allocation's placement before
    /// and after it is the remainder of `host_time`.
    pub staging_time: Duration,
    /// Of `staging_time`, the CUDA backend's part: laying out, uploading
    /// and launching the moves and the table update.
    pub backend_time: Duration,
    /// Of `backend_time`, the host blocked on the device (a stream or event
    /// synchronisation): 0 unless something waited.
    pub blocked_time: Duration,
    /// Device time between the events around it.
    pub device_time: Duration,
    /// The start event (recorded behind the work queued before the
    /// allocation) had not completed when the call returned: the host
    /// returned while the device was still busy with earlier work, so it
    /// waited for none of it, and the device time covers only work. False
    /// when the GPU may have idled inside the interval (the device time is
    /// then an upper bound).
    pub exact: bool,
}

/// Host time of a plan this many moves or fewer should stay within
/// ([`HostVsDevice`]).
pub const HOST_TARGET_MOVES: u64 = 10_000;

/// Host time those plans' allocations should stay within.
pub const HOST_TARGET: Duration = Duration::from_millis(1);

/// Host time against device time over the compactions of a pass after its
/// first ([`PassReport::host_vs_device`]): does a compacting allocation
/// return without waiting for queued work?
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct HostVsDevice {
    /// Compactions counted (those after the pass's first).
    pub compactions: usize,
    /// Of which the host was never blocked on the device inside the call
    /// ([`CompactionTiming::blocked_time`] 0): its host time is planning,
    /// staging and the allocation's own placement, no wait.
    pub unblocked: usize,
    /// Of which the call returned before the device reached the work
    /// queued ahead of the moves ([`CompactionTiming::exact`]): direct
    /// evidence that it waited for none of it. A call whose planning and
    /// staging outlast the queued work (the replay's delay) is not counted
    /// here without having waited.
    pub returned_while_queued: usize,
    /// Those with plans of at most [`HOST_TARGET_MOVES`] moves.
    pub small_plans: usize,
    /// Of which the host took at most [`HOST_TARGET`].
    pub small_plans_within_target: usize,
    /// Median host time.
    pub host_median: Duration,
    /// Largest host time.
    pub host_max: Duration,
    /// Median device time of the moves.
    pub device_median: Duration,
    /// Largest device time of the moves.
    pub device_max: Duration,
}

impl HostVsDevice {
    /// Whether every compaction counted met the target of issue 25, item 5
    /// (none waited, and plans of up to 10,000 moves took at most a
    /// millisecond of host time).
    pub fn met(&self) -> bool {
        self.unblocked == self.compactions && self.small_plans_within_target == self.small_plans
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// What one pass over the program did.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct PassReport {
    /// Ops that ran successfully.
    pub ops_run: usize,
    /// Peak bytes reserved by live blocks (sizes rounded to the alignment).
    pub peak_live_bytes: u64,
    /// The arena's compactions in the pass.
    pub compaction: CompactionStats,
    /// Every compacting allocation with its device time.
    pub compactions: Vec<CompactionTiming>,
    /// Sum of the compactions' device time.
    pub move_device_time: Duration,
    /// Compactions that happened where none was predicted (no events
    /// around them; their moving time is missing from the sum). Zero
    /// unless the arena's policy changes.
    pub untimed_compactions: u64,
    /// Host time inside `Arena::alloc` and `Arena::free`.
    pub allocator_time: Duration,
    /// Wall time of the pass (see the module's "Timing").
    pub wall_time: Duration,
    /// Device time of the delay kernels enqueued before compactions (part
    /// of `wall_time`).
    pub delay_time: Duration,
    /// Bytes written by fills.
    pub bytes_filled: u64,
    /// Bytes read by checks.
    pub bytes_checked: u64,
    /// Tensors checked in full.
    pub checked_full: u64,
    /// Tensors checked at their edges only.
    pub checked_edges: u64,
    /// The arena's peak of mapped bytes so far (its capacity, unless
    /// elastic).
    pub peak_mapped_bytes: u64,
}

impl PassReport {
    /// Wall time per op run.
    pub fn time_per_op(&self) -> Duration {
        per(self.wall_time, self.ops_run)
    }

    /// Allocator time per op run.
    pub fn allocator_time_per_op(&self) -> Duration {
        per(self.allocator_time, self.ops_run)
    }

    /// Compactions whose device time is an upper bound.
    pub fn inexact_compactions(&self) -> usize {
        self.compactions.iter().filter(|c| !c.exact).count()
    }

    /// Host time against device time over the compactions after the
    /// pass's first (see [`HostVsDevice`]).
    pub fn host_vs_device(&self) -> HostVsDevice {
        let later = self.compactions.get(1..).unwrap_or_default();
        let mut h = HostVsDevice {
            compactions: later.len(),
            host_median: median(later.iter().map(|c| c.host_time).collect()),
            device_median: median(later.iter().map(|c| c.device_time).collect()),
            ..HostVsDevice::default()
        };
        for c in later {
            let unblocked = c.blocked_time.is_zero();
            h.unblocked += usize::from(unblocked);
            h.returned_while_queued += usize::from(c.exact);
            if c.moves <= HOST_TARGET_MOVES {
                h.small_plans += 1;
                h.small_plans_within_target += usize::from(c.host_time <= HOST_TARGET);
            }
            h.host_max = h.host_max.max(c.host_time);
            h.device_max = h.device_max.max(c.device_time);
        }
        h
    }
}

/// What a GPU replay did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GpuReplayReport {
    /// The device's name.
    pub device_name: String,
    /// Arena capacity.
    pub capacity_bytes: u64,
    /// Arena alignment.
    pub alignment_bytes: u64,
    /// Completed, or the op that failed: an allocation the arena refused,
    /// or the first free whose pattern check failed (in any pass).
    pub outcome: Outcome,
    /// The pass (0-based, warm-ups first) in which the replay failed.
    pub failed_pass: Option<u32>,
    /// The last pass run: the timed one, unless an earlier one failed.
    pub timed: PassReport,
    /// The warm-up passes run before it.
    pub warmup: Vec<PassReport>,
    /// Mismatching 32-bit words found in all passes (bytes in a tensor's
    /// unaligned tail).
    pub mismatched_words: u64,
    /// The sampling used.
    pub sampling: CheckSampling,
    /// The trace's recorded wall time: last minus first `time_us` of the
    /// program's events.
    pub trace_wall_time: Duration,
}

impl GpuReplayReport {
    /// True when every op of every pass ran and every check passed.
    pub fn completed(&self) -> bool {
        self.outcome.is_completed()
    }

    /// The trace event at which the replay failed.
    pub fn failed_event(&self) -> Option<u64> {
        self.outcome.failed_event()
    }

    /// The timed pass's device time moving over the trace's recorded wall
    /// time (`None` when the trace has no time span).
    pub fn moving_fraction(&self) -> Option<f64> {
        let wall = self.trace_wall_time.as_secs_f64();
        (wall > 0.0).then(|| self.timed.move_device_time.as_secs_f64() / wall)
    }
}

pub(super) fn per(d: Duration, n: usize) -> Duration {
    d / u32::try_from(n.max(1)).unwrap_or(u32::MAX)
}

/// The program's recorded wall time: last minus first `time_us` (zero for
/// programs without times).
pub fn trace_wall_time(ops: &Ops) -> Duration {
    match (ops.time_us.first(), ops.time_us.last()) {
        (Some(&a), Some(&b)) if b > a => Duration::from_micros((b - a) as u64),
        _ => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(
        host_us: u64,
        device_us: u64,
        moves: u64,
        blocked_us: u64,
        exact: bool,
    ) -> CompactionTiming {
        CompactionTiming {
            moves,
            host_time: Duration::from_micros(host_us),
            device_time: Duration::from_micros(device_us),
            blocked_time: Duration::from_micros(blocked_us),
            exact,
            ..CompactionTiming::default()
        }
    }

    #[test]
    fn host_vs_device_skips_the_first_and_counts_waits() {
        let mut p = PassReport::default();
        assert_eq!(p.host_vs_device().compactions, 0);
        assert!(p.host_vs_device().met());
        // The first compaction may grow buffers: not counted.
        p.compactions
            .push(timing(70_000, 2_000, 100, 65_000, false));
        p.compactions.push(timing(200, 2_000, 800, 0, true));
        p.compactions.push(timing(400, 5_000, 9_000, 0, true));
        p.compactions.push(timing(3_000, 9_000, 50_000, 0, true));
        let h = p.host_vs_device();
        assert_eq!(h.compactions, 3);
        assert_eq!((h.unblocked, h.returned_while_queued), (3, 3));
        assert_eq!((h.small_plans, h.small_plans_within_target), (2, 2));
        assert_eq!(h.host_median, Duration::from_micros(400));
        assert_eq!(h.host_max, Duration::from_millis(3));
        assert_eq!(h.device_max, Duration::from_millis(9));
        assert!(h.met());
        // A wait, or a small plan over 1 ms, misses the target.
        p.compactions
            .push(timing(65_000, 2_000, 100, 64_000, false));
        let h = p.host_vs_device();
        assert_eq!((h.unblocked, h.returned_while_queued), (3, 3));
        assert_eq!(h.small_plans_within_target, 2);
        assert!(!h.met());
        p.compactions.pop();
        p.compactions.push(timing(1_500, 2_000, 10_000, 0, true));
        assert!(!p.host_vs_device().met());
    }
}
