//! The first screen: every device of the trace, then on the replayed one
//! the three capacities for its peak live bytes, each `oom` event, and what
//! `PYTORCH_CUDA_ALLOC_CONF` would have done.

use cuarena::fmt_bytes;

use crate::oom::{ArenaTry, Oom};
use crate::replay::{Chosen, Loaded};
use crate::units::{count, ratio};
use crate::verdict::Verdict;
use crate::Res;

/// The devices, one line each; the replayed one marked.
fn print_devices(l: &Loaded) -> Res<()> {
    outln!(
        "  {:<8} {:>9} {:>11} {:>18} {:>11}",
        "device",
        "events",
        "peak live",
        "PyTorch reserved",
        "oom events"
    )?;
    for d in &l.devices {
        let mark = if d.device == l.device { " *" } else { "" };
        let reserved = match (d.reserved_peak, d.reserved_complete) {
            (Some(r), true) => fmt_bytes(r),
            (Some(r), false) => format!(">= {}", fmt_bytes(r)),
            (None, _) => "not recorded".to_owned(),
        };
        outln!(
            "  {:<8} {:>9} {:>11} {:>18} {:>11}",
            format!("{}{mark}", d.device),
            d.events,
            fmt_bytes(d.peak_live),
            reserved,
            d.ooms
        )?;
    }
    Ok(())
}

/// One of the three capacities: bytes, ratio to peak live, what it says.
fn capacity_line(label: &str, bytes: u64, peak: u64, at_least: bool, what: &str) -> Res<()> {
    let ge = if at_least { ">=" } else { "=" };
    outln!(
        "  {label:<22} {:>10} {ge} {:.4} x peak live: {what}",
        fmt_bytes(bytes),
        ratio(bytes, peak)
    )
}

fn arena_outcome(a: &ArenaTry) -> String {
    match (a.serves, a.fails_at) {
        (true, None) => "serves it and the rest".to_owned(),
        (true, Some(e)) => format!("serves it, then fails at event {e}"),
        (false, _) => "would not serve it".to_owned(),
    }
}

fn print_oom(o: &Oom, align: u64) -> Res<()> {
    let need = o.live_plus_request(align);
    outln!(
        "  oom at event {}: asked {}, {} live: {} needed at once",
        o.event,
        fmt_bytes(o.requested),
        fmt_bytes(o.live),
        fmt_bytes(need)
    )?;
    let allocated = match o.allocated {
        Some(a) => format!("{} allocated, ", fmt_bytes(a)),
        None => String::new(),
    };
    let free = match o.device_free {
        Some(f) => format!("; the device had {} free", fmt_bytes(f)),
        None => "; the device's free bytes are not recorded".to_owned(),
    };
    outln!(
        "    PyTorch had {allocated}{} reserved{free}",
        fmt_bytes(o.reserved)
    )?;
    let needed = match (
        o.of_reserved.serves && o.of_reserved.fails_at.is_none(),
        o.needed,
    ) {
        (true, _) => String::new(),
        (false, Some(n)) => format!(": it needs {}", fmt_bytes(n)),
        (false, None) => ": no capacity found that runs the rest".to_owned(),
    };
    outln!(
        "    an arena of PyTorch's reserved ({}) {}{needed}",
        fmt_bytes(o.of_reserved.bytes),
        arena_outcome(&o.of_reserved)
    )?;
    if let (Some(d), Some(free)) = (o.of_device, o.device_free) {
        if o.capped() == Some(true) {
            outln!(
                "    more was free on the device: a cap held this process (a memory fraction, not in \
                 snapshots, or"
            )?;
            outln!(
                "    memory used outside PyTorch); an arena of reserved + device free ({}) {}",
                fmt_bytes(d.bytes),
                arena_outcome(&d)
            )?;
        } else {
            outln!(
                "    an arena of reserved + device free ({} + {}) {}",
                fmt_bytes(o.reserved),
                fmt_bytes(free),
                arena_outcome(&d)
            )?;
        }
    }
    Ok(())
}

/// The verdict's lines (the first of the command's output).
pub(crate) fn print(l: &Loaded, v: &Verdict, align: u64) -> Res<()> {
    outln!("cuarena replay: {}", l.name)?;
    print_devices(l)?;
    let why = match (l.chosen, l.devices.len()) {
        (_, 1) => String::new(),
        (Chosen::Asked, _) => " (--device)".to_owned(),
        (Chosen::FirstOom, _) => {
            ", the first with an oom event (--device N replays another)".to_owned()
        }
        (Chosen::LargestPeak, _) => {
            ", the largest peak live (--device N replays another)".to_owned()
        }
    };
    outln!("device {}{why}:", l.device)?;
    let before = if l.ops.initial_blocks > 0 {
        format!(
            ", counting {} live before recording began",
            fmt_bytes(l.ops.initial_bytes)
        )
    } else {
        String::new()
    };
    outln!(
        "  {:<22} {:>10}  at event {}{before}",
        "peak live",
        fmt_bytes(v.peak),
        v.peak_event
    )?;
    let r = &v.reserved;
    if r.initial.is_some() || !r.series.is_empty() {
        let at_least = r.initial.is_none();
        let what = if at_least {
            "what PyTorch paid, at least (no `segments`: what it held before recording is \
             unknown)"
        } else {
            "what PyTorch paid (cache rounding, segments, fragmentation)"
        };
        capacity_line("PyTorch reserved", r.peak, v.peak, at_least, what)?;
    } else {
        outln!("  PyTorch reserved       not in the trace (no `segments`, no segment events)")?;
    }
    match v.best_fit {
        Some(b) => capacity_line(
            "best fit, one region",
            b,
            v.peak,
            false,
            "no cache rounding or segments; fragmentation remains",
        )?,
        None => outln!("  best fit, one region   no capacity found")?,
    }
    match v.capacity {
        Some(c) => capacity_line(
            "cuarena, compacting",
            c,
            v.peak,
            false,
            "compaction removes fragmentation too",
        )?,
        None => outln!("  cuarena, compacting    no capacity found (see below)")?,
    }
    for o in &v.ooms {
        print_oom(o, align)?;
    }
    if v.ooms_total > v.ooms.len() as u64 {
        let more = v.ooms_total - v.ooms.len() as u64;
        outln!(
            "  ({} not analysed)",
            count(more, "more oom event", "more oom events")
        )?;
    }
    crate::model::print(&v.pytorch)
}
