//! Trace replay on the GPU: an [`Ops`] program on an
//! [`Arena<CudaBackend>`] with real bytes and real moves.
//!
//! Every allocation is filled on the device with a pattern derived from its
//! block id (the `pattern_fill` kernel of `kernels/pattern.cu`; no host
//! upload, so a trace that allocates hundreds of GiB over its run costs
//! device bandwidth only), and every free checks it first
//! (`pattern_check`, which counts mismatching 32-bit words into a device
//! counter). Compactions move the bytes with the arena's own kernels in
//! between, so a move that loses, overlaps or misplaces a byte shows up as
//! a mismatch. Any mismatch fails the replay ([`Outcome::Failed`] with
//! [`ToolError::DataMismatch`] naming the first free whose check failed).
//!
//! # Sampling
//!
//! [`CheckSampling`] says how much of each tensor is read back. The
//! default checks **every byte of every tensor that was moved** (its offset
//! at the free differs from its offset at the allocation), every byte of
//! every 8th tensor (by id), and the first and last 64 KiB of all others;
//! tensors still live at the end are checked the same way. Fills always
//! write every byte. [`CheckSampling::ALL`] checks everything.
//!
//! # Passes
//!
//! The program runs [`GpuReplayOptions::warmup_passes`] times (default 1)
//! and then once more, timed, on the same arena; each pass starts from an
//! empty arena (the pass before freed every block), so it makes the same placement and compaction decisions (the arena is
//! deterministic), and every pass is checked. The warm-up
//! loads every kernel and fills the backend's staging pool to what the
//! program keeps in flight (the backend sizes its device scratch from the
//! region's capacity when it is made, and grows it in stream order past
//! that, so no compaction waits for the device in either pass). Both
//! passes are reported.
//!
//! # Timing
//!
//! - **Device time moving**: CUDA events on the arena stream before and
//!   after every allocation that compacts. An allocation that will compact
//!   is known beforehand (its rounded size fits in the free bytes but in no
//!   hole); before it, a short delay kernel keeps the stream busy while the
//!   host plans and enqueues the moves, so the start event fires only when
//!   the moves are already queued and the interval holds device work, not
//!   host planning. If the start event has already completed when the
//!   allocation returns, the GPU may have idled inside the interval: that
//!   compaction's time is an upper bound ([`CompactionTiming::exact`] is
//!   false) and the delay doubles for the next one.
//! - **Host time against device time**, per compacting allocation
//!   ([`CompactionTiming`]): the host time of the `Arena::alloc` call,
//!   split into planning, staging (the rest of the compaction: checking,
//!   laying out and enqueueing the moves, the index and the table) and the
//!   placement around them; the backend's share and any time it was
//!   blocked on the device ([`HostStats`](cuarena::backend::cuda::HostStats));
//!   and whether the call returned before the device reached the work
//!   queued ahead of its moves (the start event still pending: nothing
//!   waited for it). [`PassReport::host_vs_device`] sums that up over the
//!   compactions after the first, against the target of at most a
//!   millisecond of host time for plans of up to 10,000 moves.
//! - **Allocator time**: host time inside `Arena::alloc` and `Arena::free`
//!   (planning and enqueueing included).
//! - **Wall time**: a whole pass, pattern launches, delays, the checks of
//!   the tensors live at its end and a final synchronisation included;
//!   arena creation and kernel compilation excluded.

use std::time::{Duration, Instant};

use super::driver_err;
use crate::gpu::pattern::PatternKernels;
use crate::trace::{round_up, Allocator, CompactionStats, Op, Ops, Outcome};
use crate::{Result, ToolError};
use cuarena::backend::cuda::cudarc::driver::{sys, CudaEvent};
use cuarena::backend::cuda::{CudaBackend, CudaCapacity};
use cuarena::Arena;
use cuarena::ArenaConfig;
use cuarena::Handle;
use cuarena::Stats;
use cuarena::{BackendError, Error};

pub use super::report::{
    trace_wall_time, CheckSampling, CompactionTiming, GpuReplayOptions, GpuReplayReport,
    HostVsDevice, PassReport, HOST_TARGET, HOST_TARGET_MOVES,
};

/// Events around one compacting allocation, read after the pass, and its
/// host timing (its device time filled in then).
struct Pending {
    start: CudaEvent,
    end: CudaEvent,
    timing: CompactionTiming,
}

/// The replay's state across passes.
struct Run<'a> {
    ops: &'a Ops,
    arena: Arena<CudaBackend>,
    kernels: PatternKernels,
    sampling: CheckSampling,
    handles: Vec<Option<Handle>>,
    /// Offset of each block at its allocation.
    offsets: Vec<u64>,
    align: u64,
    delay: Duration,
    /// Tag of this pass's op 0 (tags of pass p start at p * (ops + 1)).
    tag_base: u64,
    /// Reserved bytes of the live blocks.
    live: u64,
    pending: Vec<Pending>,
    pass: PassReport,
    corrupt_block: Option<u32>,
    /// Naive compact-on-failure (a full compaction on out-of-memory).
    naive: bool,
    /// Whether the arena is elastic (every allocation timed).
    elastic: bool,
}

/// Most delay enqueued before one compaction.
const MAX_DELAY: Duration = Duration::from_millis(64);

impl Run<'_> {
    fn timing_event(&self) -> Result<CudaEvent> {
        self.arena
            .backend()
            .context()
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| driver_err("cuEventCreate")(e).into())
    }

    fn tag(&self, i: usize) -> u32 {
        tag(self.tag_base.saturating_add(i as u64))
    }

    /// Runs op `i`; `Ok(Err(e))` is the arena refusing it (or an op the
    /// program cannot run), `Err` a device failure that ends the replay.
    fn op(&mut self, i: usize, op: Op) -> Result<std::result::Result<(), ToolError>> {
        match op {
            Op::Alloc { id, size } => {
                let Some(slot) = self.handles.get(id as usize) else {
                    return Ok(Err(ToolError::Program {
                        reason: format!("op names block {id}, beyond the program's sizes"),
                    }));
                };
                if size == 0 || slot.is_some() {
                    return Ok(Ok(()));
                }
                let before = self.arena.stats();
                let backend_before = self.arena.backend().host_stats();
                let reserved = round_up(size, self.align);
                let predicted = will_compact(&before, reserved);
                // An elastic arena may also compact to grow less or to
                // trim: every allocation is timed, without a delay kernel
                // where none was predicted (an upper bound then).
                let start = if predicted || self.elastic {
                    if predicted {
                        let ns = u64::try_from(self.delay.as_nanos()).unwrap_or(u64::MAX);
                        self.kernels.delay(ns)?;
                        self.pass.delay_time += self.delay;
                    }
                    let e = self.timing_event()?;
                    e.record(self.arena.backend().stream())
                        .map_err(driver_err("cuEventRecord"))?;
                    Some(e)
                } else {
                    None
                };
                let t = Instant::now();
                let r = match self.arena.alloc(size) {
                    // Naive: one full compaction when the request fits in
                    // no hole, then the request again.
                    Err(Error::OutOfMemory { .. }) if self.naive => {
                        self.arena.compact()?;
                        self.arena.alloc(size)
                    }
                    r => r,
                };
                let host_time = t.elapsed();
                self.pass.allocator_time += host_time;
                let after = self.arena.stats();
                let backend_after = self.arena.backend().host_stats();
                let d = CompactionStats::between(&before, &after);
                if let Some(start) = start {
                    let end = self.timing_event()?;
                    end.record(self.arena.backend().stream())
                        .map_err(driver_err("cuEventRecord"))?;
                    if d.count() > 0 || d.bytes_moved > 0 {
                        // Still pending: the moves were queued before the
                        // GPU reached the start event.
                        let exact = !start
                            .try_is_complete()
                            .map_err(driver_err("cuEventQuery"))?;
                        if !exact {
                            self.delay = (self.delay * 2).min(MAX_DELAY);
                        }
                        let timing = CompactionTiming {
                            op: i,
                            event: self.ops.event_index.get(i).copied().unwrap_or(i as u64),
                            targeted: d.targeted_compactions,
                            full: d.full_compactions,
                            moves: d.moves,
                            bytes_moved: d.bytes_moved,
                            host_time,
                            planning_time: d.planning_time,
                            staging_time: d.compaction_time.saturating_sub(d.planning_time),
                            backend_time: backend_after
                                .staging_time
                                .saturating_sub(backend_before.staging_time),
                            blocked_time: backend_after
                                .blocked_time
                                .saturating_sub(backend_before.blocked_time),
                            device_time: Duration::ZERO,
                            exact,
                        };
                        self.pending.push(Pending { start, end, timing });
                    }
                } else if d.count() > 0 {
                    self.pass.untimed_compactions += d.count();
                }
                let h = match r {
                    Ok(h) => h,
                    Err(e) => return Ok(Err(e.into())),
                };
                self.kernels.fill(&self.arena, h, id)?;
                if self.corrupt_block == Some(id) {
                    let len = usize::try_from(size).map_err(|_| Error::TooLarge {
                        requested_bytes: size,
                        capacity_bytes: usize::MAX as u64,
                    })?;
                    self.arena.write(h, &vec![0xA5u8; len])?;
                }
                self.pass.bytes_filled += size;
                self.live += reserved;
                self.pass.peak_live_bytes = self.pass.peak_live_bytes.max(self.live);
                self.offsets[id as usize] = self.arena.resolve(h)?;
                self.handles[id as usize] = Some(h);
                Ok(Ok(()))
            }
            Op::Free { id } => {
                let Some(h) = self.handles.get_mut(id as usize).and_then(Option::take) else {
                    return Ok(Ok(()));
                };
                self.check(h, id, self.tag(i))?;
                let reserved = self.arena.info(h)?.reserved_bytes;
                let t = Instant::now();
                let r = self.arena.free(h);
                self.pass.allocator_time += t.elapsed();
                if r.is_ok() {
                    self.live -= reserved;
                }
                Ok(r.map_err(ToolError::from))
            }
        }
    }

    /// Enqueues the check of live block `h` (id `id`) under `tag`.
    fn check(&mut self, h: Handle, id: u32, tag: u32) -> Result<()> {
        let moved = self.arena.resolve(h)? != self.offsets[id as usize];
        let range = self.sampling.range(id, moved);
        let len = self.arena.info(h)?.size_bytes;
        self.kernels.check(&self.arena, h, id, range, tag)?;
        self.pass.bytes_checked += range.bytes_of(len);
        if range.bytes_of(len) == len {
            self.pass.checked_full += 1;
        } else {
            self.pass.checked_edges += 1;
        }
        Ok(())
    }

    /// One pass over the program from an empty arena, leaving it empty.
    /// Returns the pass's report and how it ended (before pattern checks,
    /// which are read once after all passes).
    fn run_pass(&mut self, pass: u32) -> Result<(PassReport, Outcome)> {
        let ops = self.ops;
        self.tag_base = u64::from(pass) * (ops.ops.len() as u64 + 1);
        self.pass = PassReport::default();
        self.live = 0;
        let s0 = self.arena.stats();
        let t0 = Instant::now();
        let mut outcome = Outcome::Completed;
        for (i, &op) in ops.ops.iter().enumerate() {
            if let Err(error) = self.op(i, op)? {
                outcome = Outcome::Failed {
                    op: i,
                    event: ops.event_index.get(i).copied().unwrap_or(i as u64),
                    error,
                };
                break;
            }
            self.pass.ops_run = i + 1;
        }
        // Tensors still live are checked too, tagged with the op after the
        // last one run.
        let end_tag = self.tag(self.pass.ops_run);
        for id in 0..self.handles.len() {
            if let Some(h) = self.handles[id] {
                self.check(h, id as u32, end_tag)?;
            }
        }
        let synced = self.arena.synchronize();
        self.pass.wall_time = t0.elapsed();
        if let (Err(error), Outcome::Completed) = (synced, &outcome) {
            // The move kernels reported a bad plan: as loud as a mismatch.
            let op = self.pass.ops_run;
            outcome = Outcome::Failed {
                op,
                event: ops.event_index.get(op).copied().unwrap_or(op as u64),
                error: error.into(),
            };
        }
        // Empty the arena for the next pass (after the checks above, in
        // stream order).
        for slot in self.handles.iter_mut() {
            if let Some(h) = slot.take() {
                self.arena.free(h)?;
            }
        }
        let st = self.arena.stats();
        let p = &mut self.pass;
        p.compaction = CompactionStats::between(&s0, &st);
        for e in self.pending.drain(..) {
            let ms = e
                .start
                .elapsed_ms(&e.end)
                .map_err(driver_err("cuEventElapsedTime"))?;
            let device_time = Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3);
            p.move_device_time += device_time;
            p.compactions.push(CompactionTiming {
                device_time,
                ..e.timing
            });
        }
        p.peak_mapped_bytes = st.peak_mapped_bytes;
        Ok((std::mem::take(&mut self.pass), outcome))
    }
}

/// Whether an allocation of `reserved` bytes (rounded to the alignment, at
/// the arena's own alignment) compacts under [`cuarena::CompactionPolicy::Auto`]
/// without pins or spilling: it fits in the free bytes but in no hole.
/// Exact, since the free-space index fails only when no hole can hold a
/// request.
fn will_compact(stats: &Stats, reserved: u64) -> bool {
    reserved > stats.largest_free_bytes && reserved <= stats.free_bytes
}

/// A check tag (saturating below `u32::MAX`, which means "none").
fn tag(i: u64) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX - 1).min(u32::MAX - 1)
}

/// Replays `ops` on a CUDA arena built from `config` (its compaction policy
/// set to that of `options.allocator`) on device `options.ordinal`, with
/// pattern fills and checks: `options.warmup_passes` passes, then the timed
/// one (see the [module documentation](self)).
///
/// Errors when there is no usable device, the arena or the kernels cannot
/// be made, or a CUDA call fails; an allocation the arena refuses and a
/// failed pattern check are an [`Outcome::Failed`] in the report.
pub fn replay_gpu(
    ops: &Ops,
    config: &ArenaConfig,
    options: &GpuReplayOptions,
) -> Result<GpuReplayReport> {
    CudaBackend::available().map_err(|reason| Error::Backend(BackendError::NoDevice { reason }))?;
    let config = config.clone().with_compaction(options.allocator.policy());
    let backend = if config.elastic {
        let limit = (config.capacity_bytes > 0).then_some(config.capacity_bytes);
        CudaBackend::elastic(options.ordinal, limit, options.cuda_options)?
    } else {
        CudaBackend::with_options(
            options.ordinal,
            CudaCapacity::Bytes(config.capacity_bytes),
            options.cuda_options,
        )?
    };
    let arena = Arena::with_backend(config.clone(), backend)?;
    let kernels = PatternKernels::load(arena.backend())?;
    let device_name = arena.backend().device_name().to_owned();
    let mut run = Run {
        ops,
        arena,
        kernels,
        sampling: options.sampling,
        handles: vec![None; ops.sizes.len()],
        offsets: vec![0; ops.sizes.len()],
        align: config.alignment_bytes,
        delay: options.settle_delay.max(Duration::from_micros(1)),
        tag_base: 0,
        live: 0,
        pending: Vec::new(),
        pass: PassReport::default(),
        corrupt_block: options.corrupt_block,
        naive: options.allocator == Allocator::NaiveCompacting,
        elastic: config.elastic,
    };
    run.arena.synchronize()?;

    let mut passes = Vec::new();
    let mut outcome = Outcome::Completed;
    let mut failed_pass = None;
    for pass in 0..=options.warmup_passes {
        let (report, o) = run.run_pass(pass)?;
        passes.push(report);
        if let Outcome::Failed { .. } = o {
            outcome = o;
            failed_pass = Some(pass);
            break;
        }
    }
    let (mismatched_words, first_bad) = run.kernels.mismatches()?;
    if let Some(bad) = first_bad {
        let n = ops.ops.len() as u64 + 1;
        let (pass, op) = ((u64::from(bad) / n) as u32, (u64::from(bad) % n) as usize);
        let earlier = match (&outcome, failed_pass) {
            (Outcome::Failed { op: f, .. }, Some(fp)) => (fp, *f) < (pass, op),
            _ => false,
        };
        if !earlier {
            let event = ops.event_index.get(op).copied().unwrap_or(op as u64);
            let ran = passes.get(pass as usize).map_or(0, |p| p.ops_run);
            let what = if op >= ran {
                "the check of the tensors still live at the end".to_owned()
            } else {
                format!("the free at op {op} (trace event {event})")
            };
            outcome = Outcome::Failed {
                op,
                event,
                error: ToolError::DataMismatch {
                    what: format!("the tensors checked ({what} in pass {pass} failed first)"),
                    mismatched_words,
                },
            };
            failed_pass = Some(pass);
        }
    }
    let timed = passes.pop().unwrap_or_default();
    Ok(GpuReplayReport {
        device_name,
        capacity_bytes: config.capacity_bytes,
        alignment_bytes: config.alignment_bytes,
        outcome,
        failed_pass,
        timed,
        warmup: passes,
        mismatched_words,
        sampling: options.sampling,
        trace_wall_time: trace_wall_time(ops),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::pattern::CheckRange;
    use cuarena::CompactionPolicy;

    #[test]
    fn sampling_picks_ranges() {
        let s = CheckSampling::default();
        assert_eq!(s.range(8, false), CheckRange::Full);
        assert_eq!(s.range(9, true), CheckRange::Full);
        assert_eq!(s.range(9, false), CheckRange::Edges(64 << 10));
        assert_eq!(CheckSampling::ALL.range(9, false), CheckRange::Full);
        let none = CheckSampling {
            full_every: 0,
            full_if_moved: false,
            ..s
        };
        assert_eq!(none.range(0, true), CheckRange::Edges(64 << 10));
        assert!(s.describe().contains("every 8th tensor"));
        assert_eq!(CheckSampling::ALL.describe(), "every byte of every tensor");
    }

    #[test]
    fn trace_wall_time_spans_the_program() {
        let mut ops = Ops::from_ops([Op::Alloc { id: 0, size: 1 }, Op::Free { id: 0 }]);
        assert_eq!(trace_wall_time(&ops), Duration::ZERO);
        ops.time_us = vec![1_000, 3_500];
        assert_eq!(trace_wall_time(&ops), Duration::from_micros(2_500));
        assert_eq!(tag(5), 5);
        assert_eq!(tag(u64::MAX), u32::MAX - 1);
    }

    /// The prediction that places the timing events is exact: on a
    /// metadata arena replaying a real trace at its smallest capacity, an
    /// allocation compacts if and only if it was predicted to. Under the
    /// targeted policy: `Auto` also runs deferred moves at allocations that
    /// fit in a hole (deferred moves), which this prediction does not
    /// see (the replay counts them as untimed compactions).
    #[test]
    fn compaction_prediction_is_exact_on_a_real_trace() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/resnet50_varbatch_h100.pickle.gz");
        let trace = crate::trace::Trace::read(&path).unwrap();
        let ops = trace.ops(0).unwrap();
        let cap = crate::trace::find_min_capacity(&ops, 256)
            .unwrap()
            .capacity_bytes;
        let config = ArenaConfig::new(cap).with_compaction(CompactionPolicy::Bounded);
        let mut arena = Arena::metadata(config).unwrap();
        let mut handles = vec![None; ops.sizes.len()];
        let (mut predicted, mut compacted) = (0, 0);
        for &op in &ops.ops {
            match op {
                Op::Alloc { id, size } if size > 0 => {
                    let before = arena.stats();
                    let p = will_compact(&before, round_up(size, 256));
                    handles[id as usize] = Some(arena.alloc(size).unwrap());
                    let after = arena.stats();
                    let c = after.targeted_compactions + after.full_compactions
                        > before.targeted_compactions + before.full_compactions;
                    assert_eq!(p, c);
                    predicted += u32::from(p);
                    compacted += u32::from(c);
                }
                Op::Alloc { .. } => {}
                Op::Free { id } => {
                    if let Some(h) = handles[id as usize].take() {
                        arena.free(h).unwrap();
                    }
                }
            }
        }
        assert!(compacted > 0);
        assert_eq!(predicted, compacted);
    }

    #[test]
    fn without_a_device_the_replay_says_why() {
        if CudaBackend::available().is_ok() {
            println!("skipped: a GPU is present");
            return;
        }
        let ops = Ops::from_ops([Op::Alloc { id: 0, size: 256 }]);
        let r = replay_gpu(
            &ops,
            &ArenaConfig::new(1 << 20),
            &GpuReplayOptions::default(),
        );
        assert!(
            matches!(
                r,
                Err(ToolError::Arena(Error::Backend(
                    BackendError::NoDevice { .. }
                )))
            ),
            "{r:?}"
        );
    }
}
