//! A trace's events through the model: allocs and frees as recorded (a
//! block returns to its pool at its `free_completed`), each recorded `oom`
//! request tried again, and the cache emptied where the recording shows
//! `torch.cuda.empty_cache()`.

use std::collections::HashMap;

use super::blocks::Id;
use super::caching::{allocation_size, Model, SMALL_SIZE};
use super::settings::AllocatorSettings;
use super::start::{live_blocks, recorded_start, LiveBlock};
use super::{ModelOom, SimReport};
use crate::trace::pairing::{initial_blocks, next_on_addr, Next};
use crate::trace::{Action, FreePoint, Trace, TraceEvent};
use crate::Result;

/// What a trace gives every run of the model on one device.
pub(crate) struct Plan<'t> {
    pub(crate) trace: &'t Trace,
    pub(crate) device: u32,
    /// Per event: whether it returns its block to the pool (a
    /// `free_completed`, or a `free_requested` whose completion was not
    /// recorded).
    frees: Vec<bool>,
    /// Blocks live when recording began, in address order, with their
    /// sizes under the recorded settings.
    live: Vec<LiveBlock>,
    pub(crate) recorded: AllocatorSettings,
    /// The memory limit the runs are held to: what PyTorch reserved at its
    /// peak when the trace has an `oom` on this device (the process could
    /// hold that much, and no more than it had when the request failed),
    /// else none.
    pub(crate) cap: Option<u64>,
    /// Where the segments a run makes get their addresses.
    first_address: u64,
    /// The recording's `segment_alloc` events, `(address, size)`.
    driver: Vec<(u64, u64)>,
}

/// Where the cache is emptied in a run.
pub(crate) enum Releases<'a> {
    /// Where the recording frees segments that the model's own retry after
    /// a failed request does not explain (found while running).
    Detect,
    /// At these events (found by a [`Releases::Detect`] run).
    At(&'a [u64]),
}

/// How a run starts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// From the segments and blocks the snapshot implies (recorded
    /// settings only).
    Recorded,
    /// From an empty allocator that allocates the blocks live before
    /// recording, in address order.
    Fresh,
}

impl<'t> Plan<'t> {
    pub(crate) fn new(trace: &'t Trace, device: u32) -> Result<Plan<'t>> {
        let mut budget = trace.memory_budget();
        let events = &trace.events;
        let next = next_on_addr(events, device, &mut budget)?;
        let completes = events
            .iter()
            .any(|e| e.device == device && e.action == Action::FreeCompleted);
        let mut frees = budget.vec_of(events.len(), false, "the model's free points")?;
        for (i, e) in events.iter().enumerate() {
            if e.device != device {
                continue;
            }
            frees[i] = match e.action {
                Action::FreeCompleted => true,
                Action::FreeRequested => match next[i] {
                    Next::Completed => false,
                    Next::Alloc => true,
                    Next::End => !completes,
                },
                _ => false,
            };
        }
        drop(next);
        let initial = initial_blocks(
            events,
            trace.segments.as_deref(),
            device,
            FreePoint::Completed,
            &mut budget,
        )?;
        let recorded = trace.allocator_settings.clone().unwrap_or_default();
        let probe = Model::new(recorded.clone(), None, 0, trace.memory_budget());
        let live = live_blocks(trace, device, &initial, &probe);
        let on_device = || events.iter().filter(|e| e.device == device);
        let cap = on_device()
            .any(|e| e.action == Action::Oom)
            .then(|| trace.reserved(device).peak);
        let highest = on_device()
            .map(|e| e.addr.saturating_add(e.size))
            .chain(
                trace
                    .segments
                    .iter()
                    .flatten()
                    .map(|s| s.address.saturating_add(s.total_size)),
            )
            .max()
            .unwrap_or(0);
        let mut driver = Vec::new();
        for e in on_device().filter(|e| e.action == Action::SegmentAlloc) {
            budget.reserve(&mut driver, 1, "the recording's segment addresses")?;
            driver.push((e.addr, e.size));
        }
        Ok(Plan {
            driver,
            trace,
            device,
            frees,
            live,
            recorded,
            cap,
            first_address: (highest.saturating_add(1 << 30) >> 30).saturating_mul(1 << 30),
        })
    }

    /// One run under `settings`, held to `cap`.
    pub(crate) fn run(
        &self,
        settings: &AllocatorSettings,
        cap: Option<u64>,
        start: Start,
        releases: Releases<'_>,
    ) -> Result<SimReport> {
        let trace = self.trace;
        let mut budget = trace.memory_budget();
        let mut model = Model::new(
            settings.clone(),
            cap,
            self.first_address,
            trace.memory_budget(),
        );
        model.driver.clone_from(&self.driver);
        let mut live: HashMap<u64, Id> = HashMap::new();
        budget.charge(48 * self.live.len() as u64, "the model's live blocks")?;
        let mut report = SimReport {
            settings: settings.clone(),
            from_recorded_state: start == Start::Recorded,
            cap_bytes: cap,
            ..SimReport::default()
        };
        let mut unplaced = Vec::new();
        match start {
            Start::Recorded => {
                let (placed, rest) = recorded_start(&mut model, trace, self.device, &self.live)?;
                live = placed;
                unplaced = rest;
            }
            Start::Fresh => unplaced.extend_from_slice(&self.live),
        }
        report.unplaced_initial_blocks = if start == Start::Recorded {
            unplaced.len() as u64
        } else {
            0
        };
        for b in unplaced {
            if let Some(id) = model.malloc(b.requested, b.stream)? {
                live.insert(b.addr, id);
            }
        }
        model.events = Default::default();
        report.reserved_initial_bytes = model.reserved;
        report.reserved_peak_bytes = model.reserved;

        let events = &trace.events;
        let mut previous: Option<Action> = None;
        for (i, e) in events.iter().enumerate() {
            if e.device != self.device {
                continue;
            }
            let event = i as u64;
            let stream = e.stream as u64;
            match e.action {
                Action::Alloc => {
                    if let Some(old) = live.remove(&e.addr) {
                        model.free(old);
                    }
                    match model.malloc(e.size, stream)? {
                        Some(id) => {
                            if live.len() == live.capacity() {
                                budget.charge(
                                    48 * (live.len() as u64 + 16),
                                    "the model's live blocks",
                                )?;
                            }
                            live.insert(e.addr, id);
                        }
                        None => report.ooms.push(ModelOom {
                            event,
                            requested_bytes: e.size,
                            recorded: false,
                            allocated_bytes: model.allocated,
                            reserved_bytes: model.reserved,
                        }),
                    }
                }
                Action::FreeRequested | Action::FreeCompleted if self.frees[i] => {
                    if let Some(id) = live.remove(&e.addr) {
                        model.free(id);
                    }
                }
                Action::Oom => match model.malloc(e.size, stream)? {
                    // Served: the program went on without it, so it is
                    // given back at once.
                    Some(id) => {
                        model.free(id);
                        report.served_recorded_ooms.push(event);
                    }
                    None => report.ooms.push(ModelOom {
                        event,
                        requested_bytes: e.size,
                        recorded: true,
                        allocated_bytes: model.allocated,
                        reserved_bytes: model.reserved,
                    }),
                },
                Action::SegmentFree | Action::SegmentUnmap
                    if !matches!(previous, Some(Action::SegmentFree | Action::SegmentUnmap)) =>
                {
                    let user = match releases {
                        Releases::At(at) => at.binary_search(&event).is_ok(),
                        Releases::Detect => !self.model_releases_next(&model, i),
                    };
                    if user {
                        model.release_cached_blocks()?;
                        report.empty_cache_events.push(event);
                    }
                }
                _ => {}
            }
            previous = Some(e.action);
            if model.reserved > report.reserved_peak_bytes {
                report.reserved_peak_bytes = model.reserved;
                report.reserved_peak_event = Some(event);
            }
        }
        report.reserved_end_bytes = model.reserved;
        report.segment_events = model.events;
        Ok(report)
    }

    /// Whether the segments the recording frees from event `i` on are the
    /// model's own doing: the request that follows them finds no cached
    /// block and a new segment would pass the limit, so the model releases
    /// cached blocks itself before retrying it.
    fn model_releases_next(&self, model: &Model, i: usize) -> bool {
        let next: Option<&TraceEvent> = self.trace.events[i..]
            .iter()
            .filter(|e| e.device == self.device)
            .find(|e| {
                !matches!(
                    e.action,
                    Action::SegmentFree
                        | Action::SegmentUnmap
                        | Action::SegmentAlloc
                        | Action::SegmentMap
                )
            });
        let Some(e) = next.filter(|e| matches!(e.action, Action::Alloc | Action::Oom)) else {
            return false;
        };
        let size = model.settings.round_size(e.size);
        let small = size <= SMALL_SIZE;
        model
            .find_free_block(small, e.stream as u64, size)
            .is_none()
            && model.over_cap(allocation_size(size))
    }
}
