//! A model of PyTorch's CUDA caching allocator, to say what
//! `PYTORCH_CUDA_ALLOC_CONF` would have done for a recorded trace.
//!
//! Written from the allocator's documented behaviour and its source
//! (`c10/cuda/CUDACachingAllocator.cpp`, PyTorch 2.x): requests rounded to
//! 512 B (or to `roundup_power2_divisions` steps); a small pool (requests of
//! at most 1 MiB, 2 MiB segments) and a large one (20 MiB segments for
//! requests under 10 MiB, else the request rounded to 2 MiB); the smallest
//! cached block of the stream that fits, split when the rest is worth
//! keeping (512 B in the small pool, more than 1 MiB in the large one);
//! free blocks merged with free neighbours; `max_split_size_mb`,
//! `max_non_split_rounding_mb`, `garbage_collection_threshold`,
//! `expandable_segments` (2 MiB and 20 MiB pages, mapped at the lowest
//! address that fits); and at the memory limit, cached blocks released and
//! the request retried before an out-of-memory. Blocks are per stream.
//!
//! A run replays the trace's allocs and frees through the model: a block
//! returns to its pool at its `free_completed` (where PyTorch's own
//! `free_block` records it), the cache is emptied where the recording shows
//! `torch.cuda.empty_cache()` (segments freed that the model's own retry
//! does not explain), and each recorded `oom` request is tried again (and,
//! when served, given back at once: the program went on without it).
//!
//! [`Session::recorded`] runs under the settings the snapshot recorded,
//! from the state the snapshot implies when recording began: its segment
//! events and reserved peak are checked against the recording's
//! ([`Recorded`]). [`Session::run`] runs under other settings from an empty
//! allocator (the blocks live before recording allocated first, in address
//! order). CUDA graphs' private pools and blocks used by other streams
//! (`record_stream`) are not modelled beyond what the trace records.
//!
//! The memory limit: with an `oom` event on the device, every run is held
//! to what PyTorch reserved at its peak (what the process could hold; the
//! per-process fraction itself is not in a snapshot), so the recorded
//! failures fail again under the recorded settings and a run that serves
//! them says the job fits in what it had. Without one, runs have no limit.

mod blocks;
mod caching;
mod drive;
mod expandable;
mod settings;
mod start;
#[cfg(test)]
mod tests;
mod whatif;

use crate::trace::{Action, Trace};
use crate::Result;

pub use caching::SegmentEvents;
pub use settings::{AllocatorSettings, ROUNDUP_INTERVALS};
pub use whatif::{candidates, recommend, Recommendation};

/// A request the model could not serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelOom {
    /// Index of its event in [`Trace::events`].
    pub event: u64,
    /// Bytes asked for.
    pub requested_bytes: u64,
    /// A recorded `oom` that fails again (else an `alloc` that succeeded
    /// in the recording).
    pub recorded: bool,
    /// Bytes of the blocks handed out then (PyTorch's `allocated_bytes`).
    pub allocated_bytes: u64,
    /// Bytes reserved then, after the release of cached blocks that
    /// preceded the failure.
    pub reserved_bytes: u64,
}

/// What one run of the model did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimReport {
    /// The settings it ran under.
    pub settings: AllocatorSettings,
    /// Started from the state the snapshot implies (else from empty).
    pub from_recorded_state: bool,
    /// The memory limit it was held to (see the module doc).
    pub cap_bytes: Option<u64>,
    /// Reserved when recording began.
    pub reserved_initial_bytes: u64,
    /// The most reserved at once.
    pub reserved_peak_bytes: u64,
    /// The event after which the peak was first reached (`None`: at the
    /// start).
    pub reserved_peak_event: Option<u64>,
    /// Reserved at the end.
    pub reserved_end_bytes: u64,
    /// The segment events it made during the trace.
    pub segment_events: SegmentEvents,
    /// Requests it could not serve.
    pub ooms: Vec<ModelOom>,
    /// Recorded `oom` events whose request it served.
    pub served_recorded_ooms: Vec<u64>,
    /// Events where it emptied the cache as the recording shows.
    pub empty_cache_events: Vec<u64>,
    /// Blocks live before recording that fit in no segment of the
    /// snapshot (allocated afresh before the trace).
    pub unplaced_initial_blocks: u64,
    /// When the run was held to a limit: the reserved peak of the same run
    /// without one (every request served, the recorded `oom` ones given
    /// back at once), what these settings need for the whole trace.
    pub unlimited_peak_bytes: Option<u64>,
}

/// What the recording itself says, to check a run under the recorded
/// settings against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Its segment events on the device.
    pub segment_events: SegmentEvents,
    /// Reserved when recording began (`None` without `segments`).
    pub reserved_initial_bytes: Option<u64>,
    /// The most reserved at once.
    pub reserved_peak_bytes: u64,
    /// `oom` events.
    pub ooms: u64,
}

/// The model on one device of a trace: the run under the recorded
/// settings, and runs under others.
pub struct Session<'t> {
    plan: drive::Plan<'t>,
    recorded: SimReport,
}

impl<'t> Session<'t> {
    /// Runs the model on `device` under the settings the snapshot recorded
    /// (PyTorch's defaults when it records none). Errors when the memory
    /// budget of the stages after reading is exceeded.
    pub fn new(trace: &'t Trace, device: u32) -> Result<Session<'t>> {
        let plan = drive::Plan::new(trace, device)?;
        let mut recorded = plan.run(
            &plan.recorded.clone(),
            plan.cap,
            drive::Start::Recorded,
            drive::Releases::Detect,
        )?;
        if plan.cap.is_some() {
            let free = plan.run(
                &plan.recorded.clone(),
                None,
                drive::Start::Recorded,
                drive::Releases::At(&recorded.empty_cache_events),
            )?;
            recorded.unlimited_peak_bytes = Some(free.reserved_peak_bytes);
        }
        Ok(Session { plan, recorded })
    }

    /// The run under the recorded settings, from the recorded state.
    pub fn recorded(&self) -> &SimReport {
        &self.recorded
    }

    /// Whether the snapshot recorded its settings (`allocator_settings`).
    pub fn settings_recorded(&self) -> bool {
        self.plan.trace.allocator_settings.is_some()
    }

    /// The memory limit runs are held to (see the module doc).
    pub fn cap_bytes(&self) -> Option<u64> {
        self.plan.cap
    }

    /// A run under `settings`, from an empty allocator, the cache emptied
    /// where the recorded run found `empty_cache()` calls; with a limit, the
    /// same run without one gives [`SimReport::unlimited_peak_bytes`].
    pub fn run(&self, settings: &AllocatorSettings) -> Result<SimReport> {
        let releases = &self.recorded.empty_cache_events;
        let mut r = self.plan.run(
            settings,
            self.plan.cap,
            drive::Start::Fresh,
            drive::Releases::At(releases),
        )?;
        if self.plan.cap.is_some() {
            let free = self.plan.run(
                settings,
                None,
                drive::Start::Fresh,
                drive::Releases::At(releases),
            )?;
            r.unlimited_peak_bytes = Some(free.reserved_peak_bytes);
        }
        Ok(r)
    }

    /// The recorded run; when the recording began with memory reserved, a
    /// run under the recorded settings from an empty allocator (what the
    /// other runs compare with: they start empty too); then a run under
    /// each of [`candidates`].
    pub fn what_if(&self) -> Result<Vec<SimReport>> {
        let mut out = vec![self.recorded.clone()];
        if self.recorded.reserved_initial_bytes > 0 {
            out.push(self.run(&self.plan.recorded)?);
        }
        for s in candidates(&self.plan.recorded) {
            out.push(self.run(&s)?);
        }
        Ok(out)
    }

    /// What the recording says on the device.
    pub fn truth(&self) -> Recorded {
        let (trace, device) = (self.plan.trace, self.plan.device);
        let mut r = Recorded::default();
        let s = &mut r.segment_events;
        for e in trace.events.iter().filter(|e| e.device == device) {
            match e.action {
                Action::SegmentAlloc => {
                    (s.alloc, s.alloc_bytes) = (s.alloc + 1, s.alloc_bytes + e.size)
                }
                Action::SegmentFree => (s.free, s.free_bytes) = (s.free + 1, s.free_bytes + e.size),
                Action::SegmentMap => (s.map, s.map_bytes) = (s.map + 1, s.map_bytes + e.size),
                Action::SegmentUnmap => {
                    (s.unmap, s.unmap_bytes) = (s.unmap + 1, s.unmap_bytes + e.size)
                }
                Action::Oom => r.ooms += 1,
                _ => {}
            }
        }
        let reserved = trace.reserved(device);
        r.reserved_initial_bytes = reserved.initial;
        r.reserved_peak_bytes = reserved.peak;
        r
    }
}
