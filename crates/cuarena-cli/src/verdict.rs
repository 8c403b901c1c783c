//! The answer to the user's question, computed: peak live bytes and three
//! capacities for them (what PyTorch reserved, what a non-moving best fit in
//! one region needs, what the compacting arena needs), each `oom` event
//! against an arena of what PyTorch had, and the model of PyTorch's
//! allocator under other settings. [`crate::screen`] prints it,
//! [`crate::report`] writes it as JSON.

use cuarena::ArenaConfig;
use cuarena_trace::bestfit::find_min_best_fit;
use cuarena_trace::trace::{
    find_min_capacity_with, replay_with, Allocator, ReplayOptions, ReplayReport, Reserved,
};

use crate::model::Modelled;
use crate::oom::Oom;
use crate::progress::Progress;
use crate::replay::Loaded;
use crate::{Failure, Res};

/// The verdict on the replayed device.
pub(crate) struct Verdict {
    /// Peak live bytes, sizes rounded to the alignment.
    pub(crate) peak: u64,
    /// Event at which the peak is first reached.
    pub(crate) peak_event: u64,
    pub(crate) reserved: Reserved,
    /// The smallest capacity at which a non-moving best fit in one region
    /// runs the trace.
    pub(crate) best_fit: Option<u64>,
    /// Capacity at which the arena completes the trace.
    pub(crate) capacity: Option<u64>,
    pub(crate) ooms: Vec<Oom>,
    pub(crate) ooms_total: u64,
    /// The arena's replay at peak live (the table reuses it).
    pub(crate) at_peak: ReplayReport,
    pub(crate) pytorch: Modelled,
}

/// `policy`: the arena's (`--policy`).
pub(crate) fn compute(l: &Loaded, align: u64, policy: Allocator) -> Res<Verdict> {
    let ops = &l.ops;
    let peak_event = ops.event_index.get(ops.peak_op).copied().unwrap_or(0);
    let reserved = l.trace.reserved(l.device);
    let mut progress = Progress::new();

    // The arena at peak live; the search only when that fails.
    progress.show("replaying the arena at peak live");
    let at_peak = ArenaConfig::new(l.peak.max(align)).with_alignment_bytes(align);
    let options = ReplayOptions::default().with_allocator(policy);
    let r = replay_with(ops, &at_peak, &options)?;
    let capacity = if r.completed() {
        Some(at_peak.capacity_bytes)
    } else {
        find_min_capacity_with(ops, align, policy)
            .ok()
            .map(|m| m.capacity_bytes)
    };
    progress.show("searching the smallest best-fit region");
    let best_fit = find_min_best_fit(ops, align, &l.trace.memory_budget())?;
    progress.clear();

    let pytorch = crate::model::run(&l.trace, l.device)?;
    let model_ooms = pytorch.runs.first().map_or(&[][..], |r| &r.ooms[..]);
    let (ooms, ooms_total) = crate::oom::analyse(l, align, &reserved, model_ooms)?;
    Ok(Verdict {
        peak: l.peak,
        peak_event,
        reserved,
        best_fit,
        capacity,
        ooms,
        ooms_total,
        at_peak: r,
        pytorch,
    })
}

/// Checks the peak against the largest capacity the replay takes.
pub(crate) fn check_peak(peak: u64, name: &str) -> Res<()> {
    if peak > crate::args::MAX_CAPACITY {
        return Err(Failure::Io(format!(
            "{name}: the trace's peak live bytes, {}, are past the largest capacity a replay \
             takes ({}): not a real trace?",
            crate::units::exact(peak),
            crate::units::exact(crate::args::MAX_CAPACITY)
        )));
    }
    Ok(())
}
