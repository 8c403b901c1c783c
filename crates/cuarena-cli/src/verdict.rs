//! The answer to the user's question, printed first: peak live bytes, what
//! PyTorch reserved for them, the capacity the arena needs, and for each
//! `oom` event whether an arena of all the memory PyTorch had would have
//! served it. The same figures as JSON with `--json`.

use cuarena::fmt_bytes;
use cuarena::ArenaConfig;
use cuarena_trace::trace::{
    find_min_capacity, replay_with, Action, Op, Ops, Outcome, ReplayOptions, ReplayReport,
    Reserved, DEVICE_FREE_UNKNOWN,
};

use crate::json::Json;
use crate::replay::Loaded;
use crate::{Failure, Res};

/// `oom` events analysed in full (each costs a replay); the rest are counted.
const MAX_OOMS: usize = 8;

/// One `oom` event, and what an arena of all the memory would have done.
pub(crate) struct Oom {
    /// Index of the event in the trace.
    pub(crate) event: u64,
    /// Bytes asked for.
    pub(crate) requested: u64,
    /// Bytes live then (the replayed program's, sizes rounded).
    pub(crate) allocated: u64,
    /// Bytes PyTorch had reserved then.
    pub(crate) reserved: u64,
    /// Bytes the device had free (`device_free`; `None` when the event does
    /// not say).
    pub(crate) device_free: Option<u64>,
    /// `reserved + device_free`, rounded down to the alignment (at most
    /// the largest capacity a replay takes).
    pub(crate) arena_bytes: u64,
    /// Whether that arena serves the request.
    pub(crate) serves: bool,
    /// The event at which that arena fails, if it does (at this event when
    /// it does not serve the request).
    pub(crate) fails_at: Option<u64>,
}

/// The verdict.
pub(crate) struct Verdict {
    /// Peak live bytes, sizes rounded to the alignment.
    pub(crate) peak: u64,
    /// Event at which the peak is first reached.
    pub(crate) peak_event: u64,
    pub(crate) reserved: Reserved,
    /// Capacity at which the arena completes the trace.
    pub(crate) capacity: Option<u64>,
    pub(crate) ooms: Vec<Oom>,
    pub(crate) ooms_total: u64,
    /// The arena's replay at peak live (the table reuses it).
    pub(crate) at_peak: ReplayReport,
}

fn round_up(v: u64, align: u64) -> u64 {
    v.div_ceil(align).saturating_mul(align)
}

/// Bytes live (rounded) after the first `n` ops.
fn live_after(ops: &Ops, n: usize, align: u64) -> u64 {
    let mut live = vec![false; ops.sizes.len()];
    let mut bytes: u64 = 0;
    for op in &ops.ops[..n.min(ops.ops.len())] {
        match *op {
            Op::Alloc { id, size } => {
                live[id as usize] = true;
                bytes = bytes.saturating_add(round_up(size, align));
            }
            Op::Free { id } => {
                if std::mem::take(&mut live[id as usize]) {
                    bytes = bytes.saturating_sub(round_up(ops.sizes[id as usize], align));
                }
            }
        }
    }
    bytes
}

/// `ops` with an alloc and a free of `size` bytes inserted before op `pos`.
fn with_probe(ops: &Ops, pos: usize, size: u64, event: u64) -> Option<Ops> {
    let id = u32::try_from(ops.sizes.len()).ok()?;
    let mut o = ops.clone();
    let t = o.time_us.get(pos).copied().unwrap_or(0);
    o.sizes.push(size);
    o.ops
        .splice(pos..pos, [Op::Alloc { id, size }, Op::Free { id }]);
    o.event_index.splice(pos..pos, [event, event]);
    o.time_us.splice(pos..pos, [t, t]);
    Some(o)
}

pub(crate) fn compute(l: &Loaded, align: u64) -> Res<Verdict> {
    let ops = &l.ops;
    let peak_event = ops.event_index.get(ops.peak_op).copied().unwrap_or(0);
    let reserved = l.trace.reserved(l.device);

    // The arena at peak live; the search only when that fails.
    let at_peak = ArenaConfig::new(l.peak.max(align)).with_alignment_bytes(align);
    let r = replay_with(ops, &at_peak, &ReplayOptions::default())?;
    let capacity = if r.completed() {
        Some(at_peak.capacity_bytes)
    } else {
        find_min_capacity(ops, align).ok().map(|m| m.capacity_bytes)
    };

    let mut ooms = Vec::new();
    let mut ooms_total = 0;
    for (i, e) in l.trace.events.iter().enumerate() {
        if e.device != l.device || e.action != Action::Oom {
            continue;
        }
        ooms_total += 1;
        if ooms.len() >= MAX_OOMS {
            continue;
        }
        let event = i as u64;
        let pos = ops.event_index.partition_point(|&x| x <= event);
        let allocated = live_after(ops, pos, align);
        let at = reserved.at(event);
        // Without the device's free bytes, the arena holds what PyTorch had.
        let free = (e.addr != DEVICE_FREE_UNKNOWN).then_some(e.addr);
        let arena_bytes = at
            .saturating_add(free.unwrap_or(0))
            .min(crate::args::MAX_CAPACITY)
            / align
            * align;
        let mut oom = Oom {
            event,
            requested: e.size,
            allocated,
            reserved: at,
            device_free: free,
            arena_bytes,
            serves: false,
            fails_at: Some(event),
        };
        if let (true, Some(probe)) = (arena_bytes > 0, with_probe(ops, pos, e.size, event)) {
            let config = ArenaConfig::new(arena_bytes).with_alignment_bytes(align);
            let r = replay_with(&probe, &config, &ReplayOptions::default())?;
            match r.outcome {
                Outcome::Completed => (oom.serves, oom.fails_at) = (true, None),
                Outcome::Failed { op, event: at, .. } => {
                    oom.serves = op > pos;
                    oom.fails_at = Some(at);
                }
            }
        }
        ooms.push(oom);
    }
    Ok(Verdict {
        peak: l.peak,
        peak_event,
        reserved,
        capacity,
        ooms,
        ooms_total,
        at_peak: r,
    })
}

fn x(a: u64, b: u64) -> f64 {
    a as f64 / b.max(1) as f64
}

/// The verdict's lines (the first of the command's output).
pub(crate) fn print(l: &Loaded, v: &Verdict) -> Res<()> {
    let devices = l.trace.devices();
    let others = if devices.len() > 1 {
        format!(" of devices {devices:?}; --device picks another")
    } else {
        String::new()
    };
    outln!("cuarena replay: {} (device {}{others})", l.name, l.device)?;
    let before = if l.ops.initial_blocks > 0 {
        format!(
            ", counting {} live before recording began",
            fmt_bytes(l.ops.initial_bytes)
        )
    } else {
        String::new()
    };
    outln!(
        "  peak live                  {:>11}  at event {}{before}",
        fmt_bytes(v.peak),
        v.peak_event
    )?;
    let r = &v.reserved;
    if r.initial.is_some() {
        outln!(
            "  PyTorch reserved, at peak  {:>11}  = {:.3} x peak live: what caching and fragmentation cost",
            fmt_bytes(r.peak),
            x(r.peak, v.peak)
        )?;
    } else if !r.series.is_empty() {
        outln!(
            "  PyTorch reserved, at peak  {:>11}  = {:.3} x peak live, at least (the trace has no \
             `segments`: what was reserved before recording is not counted)",
            fmt_bytes(r.peak),
            x(r.peak, v.peak)
        )?;
    } else {
        outln!("  PyTorch reserved, at peak  not in the trace (no `segments`, no segment events)")?;
    }
    match v.capacity {
        Some(c) => outln!(
            "  cuarena runs it in         {:>11}  = {:.4} x peak live",
            fmt_bytes(c),
            x(c, v.peak)
        )?,
        None => outln!("  cuarena runs it in         no capacity found (see below)")?,
    }
    for o in &v.ooms {
        let free = match o.device_free {
            Some(f) => format!("{} free on the device", fmt_bytes(f)),
            None => "the device's free bytes not recorded".to_owned(),
        };
        outln!(
            "  oom at event {}: asked {}, with {} allocated, {} reserved by PyTorch and {free}",
            o.event,
            fmt_bytes(o.requested),
            fmt_bytes(o.allocated),
            fmt_bytes(o.reserved),
        )?;
        let what = match (o.serves, o.fails_at) {
            (true, None) => "serves it and runs the rest of the trace".to_owned(),
            (true, Some(e)) => format!("serves it, then fails at event {e}"),
            (false, Some(e)) if e < o.event => {
                format!("fails earlier, at event {e}")
            }
            (false, _) => format!(
                "would not serve it either: {} live + {} asked is more than it holds",
                fmt_bytes(o.allocated),
                fmt_bytes(o.requested)
            ),
        };
        outln!(
            "    an arena of all that memory ({}) {what}",
            fmt_bytes(o.arena_bytes)
        )?;
    }
    if v.ooms_total > v.ooms.len() as u64 {
        outln!(
            "  ({} more oom events not analysed)",
            v.ooms_total - v.ooms.len() as u64
        )?;
    }
    Ok(())
}

/// The verdict and the trace's figures as one JSON object (`--json`).
pub(crate) fn json(l: &Loaded, v: &Verdict, align: u64) -> Res<()> {
    let o = &l.ops;
    let active = l.trace.active_at_dump(l.device);
    let mut j = Json::object();
    j.str("trace", &l.trace.source)
        .str(
            "format",
            match l.trace.format {
                cuarena_trace::trace::TraceFormat::Csv => "csv",
                cuarena_trace::trace::TraceFormat::Pickle => "pickle",
            },
        )
        .num("device", u64::from(l.device))
        .nums("devices", l.trace.devices().iter().map(|&d| u64::from(d)))
        .num("events", l.trace.events.len() as u64)
        .num("events_skipped", l.trace.counts.skipped())
        .num("alignment_bytes", align)
        .num("peak_live_bytes", v.peak)
        .num("peak_live_event", v.peak_event)
        .num("live_before_recording_bytes", o.initial_bytes)
        .num("blocks_before_recording", o.initial_blocks)
        .num("frees_matched_before_recording", o.initial_frees)
        .num("live_at_end_bytes", o.live_bytes_at_end)
        .opt_num(
            "segments_active_bytes",
            active.map(|a| a.allocated + a.pending_free),
        )
        .opt_num("pytorch_reserved_initial_bytes", v.reserved.initial)
        .opt_num(
            "pytorch_reserved_peak_bytes",
            (!v.reserved.series.is_empty() || v.reserved.initial.is_some())
                .then_some(v.reserved.peak),
        )
        .bool("pytorch_reserved_complete", v.reserved.initial.is_some())
        .opt_num("arena_capacity_bytes", v.capacity)
        .opt_f64(
            "arena_capacity_over_peak_live",
            v.capacity.map(|c| x(c, v.peak)),
        )
        .opt_f64(
            "pytorch_reserved_over_peak_live",
            (!v.reserved.series.is_empty()).then(|| x(v.reserved.peak, v.peak)),
        )
        .num("oom_events", v.ooms_total);
    let ooms: Vec<Json> = v
        .ooms
        .iter()
        .map(|o| {
            let mut e = Json::object();
            e.num("event", o.event)
                .num("requested_bytes", o.requested)
                .num("allocated_bytes", o.allocated)
                .num("reserved_bytes", o.reserved)
                .opt_num("device_free_bytes", o.device_free)
                .num("arena_bytes", o.arena_bytes)
                .bool("arena_serves_request", o.serves)
                .opt_num("arena_fails_at_event", o.fails_at);
            e
        })
        .collect();
    j.array("ooms", ooms);
    outln!("{}", j.finish())
}

/// Checks the peak against the largest capacity the replay takes.
pub(crate) fn check_peak(l: &Loaded) -> Res<()> {
    if l.peak > crate::args::MAX_CAPACITY {
        return Err(Failure::Io(format!(
            "{}: the trace's peak live bytes, {} B, are past the largest capacity a replay \
             takes ({} B): not a real trace?",
            l.name,
            l.peak,
            crate::args::MAX_CAPACITY
        )));
    }
    Ok(())
}
