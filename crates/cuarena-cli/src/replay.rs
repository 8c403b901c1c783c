//! `cuarena replay` on metadata-only arenas (no bytes, no GPU): the arena
//! and two baselines at one capacity, the smallest capacities, pictures.

use std::path::Path;
use std::time::Instant;

use cuarena::{fmt_bytes, ArenaConfig};
use cuarena_trace::trace::{
    find_min_capacity_observed, replay_prefix, replay_with, Action, Allocator, FreePoint,
    MinCapacity, Ops, Outcome, ReplayOptions, ReplayReport, Trace, TraceFormat,
};
use cuarena_trace::viz::{memory_map_svg, timeline_svg, MemoryMap, Timeline};

use crate::args::{Capacity, ReplayArgs, MAX_CAPACITY};
use crate::progress::Progress;
use crate::report::{MinJson, Report};
use crate::units::{count, exact};
use crate::verdict::Verdict;
use crate::{Failure, Res};

fn round_up(v: u64, align: u64) -> u64 {
    v.div_ceil(align).saturating_mul(align)
}

pub(crate) fn result_cell(o: &Outcome) -> String {
    match o {
        Outcome::Completed => "completed".to_owned(),
        Outcome::Failed { event, .. } => format!("failed at event {event}"),
    }
}

/// The table's columns: header and width (values are right-aligned to
/// the same width as their header).
const COLUMNS: [(&str, usize); 8] = [
    ("allocator", 36),
    ("capacity", 11),
    ("result", 24),
    ("cap/peak", 9),
    ("bytes moved", 12),
    ("compactions t/f", 15),
    ("time", 10),
    ("per op", 9),
];

fn print_cells(cells: [String; 8]) -> Res<()> {
    let mut line = String::new();
    for (i, (cell, (_, w))) in cells.iter().zip(COLUMNS).enumerate() {
        if i == 0 {
            line.push_str(&format!("{cell:<w$}"));
        } else {
            line.push_str(&format!(" {cell:>w$}"));
        }
    }
    outln!("{}", line.trim_end())
}

fn print_header() -> Res<()> {
    print_cells(COLUMNS.map(|(h, _)| h.to_owned()))
}

/// What the table's abbreviations mean.
fn print_legend() -> Res<()> {
    outln!(
        "(cap/peak: capacity / peak live; compactions t/f: targeted / full; per op: wall time \
         / ops run)"
    )
}

/// The table's name for an allocator. The arena's non-moving placement is
/// a two-level segregated fit (exact sizes), not an exact best fit.
pub(crate) fn label(allocator: Allocator) -> &'static str {
    match allocator {
        Allocator::NonMoving => "non-moving segregated fit (arena)",
        a => a.label(),
    }
}

fn print_row(label: &str, r: &ReplayReport, peak: u64) -> Res<()> {
    print_cells([
        label.to_owned(),
        fmt_bytes(r.capacity_bytes),
        result_cell(&r.outcome),
        format!("{:.4}", r.capacity_bytes as f64 / peak.max(1) as f64),
        fmt_bytes(r.compaction.bytes_moved),
        format!(
            "{}/{}",
            r.compaction.targeted_compactions, r.compaction.full_compactions
        ),
        format!("{:.1} ms", r.wall_time.as_secs_f64() * 1e3),
        format!("{:.0} ns", r.time_per_op().as_secs_f64() * 1e9),
    ])
}

/// The capacity `c` means for a trace of `peak` live bytes; past
/// [`MAX_CAPACITY`] a usage error naming the value.
pub(crate) fn capacity_bytes(c: Capacity, peak: u64, align: u64) -> Res<u64> {
    let bytes = match c {
        Capacity::Bytes(b) => round_up(b.max(1), align),
        Capacity::Ratio(r) => {
            let want = (peak.max(1) as f64) * r;
            if want > MAX_CAPACITY as f64 {
                return Err(Failure::Usage(format!(
                    "--capacity {r}: {r} x the peak live {} is past the largest capacity a \
                     replay takes ({})",
                    exact(peak),
                    exact(MAX_CAPACITY)
                )));
            }
            round_up(want.ceil() as u64, align)
        }
    };
    if bytes > MAX_CAPACITY {
        return Err(Failure::Usage(format!(
            "--capacity: {} is past the largest capacity a replay takes ({})",
            exact(bytes),
            exact(MAX_CAPACITY)
        )));
    }
    Ok(bytes)
}

/// One device of the trace, for the first screen's table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceLine {
    pub(crate) device: u32,
    /// Events kept on it.
    pub(crate) events: u64,
    /// Peak live bytes, sizes rounded to the alignment.
    pub(crate) peak_live: u64,
    /// What PyTorch reserved at its peak (`None`: the trace does not say).
    pub(crate) reserved_peak: Option<u64>,
    /// False when the trace has no `segments` (the reserved figure is then
    /// a lower bound).
    pub(crate) reserved_complete: bool,
    /// `oom` events on it.
    pub(crate) ooms: u64,
}

/// Why the replayed device is the one it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chosen {
    /// `--device`.
    Asked,
    /// The first with an `oom` event.
    FirstOom,
    /// None has one: the largest peak live.
    LargestPeak,
}

/// The trace read and turned into the program of one device.
pub(crate) struct Loaded {
    pub(crate) trace: Trace,
    /// The file as named on the command line.
    pub(crate) name: String,
    pub(crate) device: u32,
    pub(crate) ops: Ops,
    /// Peak live bytes with sizes rounded to the alignment.
    pub(crate) peak: u64,
    /// Milliseconds spent reading.
    pub(crate) read_ms: f64,
    /// Every device of the trace.
    pub(crate) devices: Vec<DeviceLine>,
    pub(crate) chosen: Chosen,
}

/// What to say when a snapshot holds no events at all.
const HOW_TO_RECORD: &str = "record one with \
    torch.cuda.memory._record_memory_history(max_entries=100000) before the steps and \
    torch.cuda.memory._dump_snapshot(path) after them";

/// Reads the trace, summarises every device and builds the program of the
/// one to replay (printing nothing: the verdict comes first): `--device`,
/// else the first with an `oom` event, else the one with the largest peak.
pub(crate) fn load(args: &ReplayArgs) -> Res<Loaded> {
    let t0 = Instant::now();
    let mut progress = Progress::new();
    progress.show(&format!("reading {}", args.trace.display()));
    let trace = Trace::read(&args.trace)?;
    progress.clear();
    let name = args.trace.display().to_string();
    if trace.events.is_empty() && trace.counts.skipped() == 0 {
        let why = match trace.format {
            TraceFormat::Pickle => {
                "`device_traces` is empty: memory history was not being recorded"
            }
            TraceFormat::Csv => "the CSV has a header and no event lines",
        };
        return Err(Failure::Io(format!(
            "{name}: the trace holds no allocator events ({why}); {HOW_TO_RECORD}"
        )));
    }
    let list = trace.devices();
    if let Some(d) = args.device.filter(|d| !list.contains(d)) {
        return Err(Failure::Usage(format!(
            "--device {d}: the trace has no events on device {d} (devices in the trace: {list:?})"
        )));
    }
    let mut devices = Vec::new();
    // A trace of one device (the usual case) keeps its program.
    let mut only = None;
    for &device in &list {
        progress.show(&format!("building the program of device {device}"));
        let ops = trace.ops_with(device, args.free_at)?;
        let r = trace.reserved(device);
        let events = trace.events.iter().filter(|e| e.device == device);
        devices.push(DeviceLine {
            device,
            events: events.clone().count() as u64,
            peak_live: ops.peak_live_rounded(args.align),
            reserved_peak: (r.initial.is_some() || !r.series.is_empty()).then_some(r.peak),
            reserved_complete: r.initial.is_some(),
            ooms: events.filter(|e| e.action == Action::Oom).count() as u64,
        });
        if list.len() == 1 {
            only = Some(ops);
        }
    }
    progress.clear();
    let (device, chosen) = match args.device {
        Some(d) => (d, Chosen::Asked),
        None => match devices.iter().find(|d| d.ooms > 0) {
            Some(d) => (d.device, Chosen::FirstOom),
            None => {
                let best = devices
                    .iter()
                    .max_by_key(|d| (d.peak_live, std::cmp::Reverse(d.device)))
                    .map_or(0, |d| d.device);
                (best, Chosen::LargestPeak)
            }
        },
    };
    let ops = match only {
        Some(ops) => ops,
        None => trace.ops_with(device, args.free_at)?,
    };
    if ops.is_empty() {
        let on_device = trace.events.iter().filter(|e| e.device == device).count();
        return Err(Failure::Io(format!(
            "{name}: the trace has no allocations on device {device} ({}), \
             and no blocks live before recording; {HOW_TO_RECORD}",
            count(on_device as u64, "event on it", "events on it")
        )));
    }
    let peak = ops.peak_live_rounded(args.align);
    crate::verdict::check_peak(peak, &name)?;
    Ok(Loaded {
        trace,
        name,
        device,
        ops,
        peak,
        read_ms: t0.elapsed().as_secs_f64() * 1e3,
        devices,
        chosen,
    })
}

/// The screen (the verdict first), then the trace's details.
pub(crate) fn print_head(l: &Loaded, verdict: &Verdict, args: &ReplayArgs) -> Res<()> {
    crate::screen::print(l, verdict, args.align)?;
    print_details(l, args)
}

/// The trace's details, after the verdict.
fn print_details(l: &Loaded, args: &ReplayArgs) -> Res<()> {
    let ops = &l.ops;
    outln!()?;
    outln!(
        "trace {}: {} read in {:.0} ms: {}",
        l.name,
        count(l.trace.events.len() as u64, "event", "events"),
        l.read_ms,
        l.trace.counts.summary()
    )?;
    outln!(
        "  before recording: {}, {} live ({} from `segments`, {} freed in the trace); \
         {} matched against them",
        count(ops.initial_blocks, "block", "blocks"),
        fmt_bytes(ops.initial_bytes),
        ops.initial_from_segments,
        ops.initial_blocks - ops.initial_from_segments,
        count(ops.initial_frees, "free", "frees")
    )?;
    outln!(
        "  {}, {}, {}, {} still pending at the end, {} live at the end ({})",
        count(ops.allocs, "alloc", "allocs"),
        count(ops.frees, "free", "frees"),
        count(ops.implicit_frees, "implicit free", "implicit frees"),
        count(ops.pending_at_end, "free", "frees"),
        count(ops.live_at_end, "block", "blocks"),
        fmt_bytes(ops.live_bytes_at_end)
    )?;
    match l.trace.active_at_dump(l.device) {
        Some(a) => {
            // Frees at the first free event leave pending blocks freed.
            let active = match args.free_at {
                FreePoint::Completed => a.allocated.saturating_add(a.pending_free),
                FreePoint::FirstFree => a.allocated,
            };
            outln!(
                "  at the dump `segments` hold {} active ({} allocated, {} pending free) in {} \
                 reserved; the replay ends with {} live: {}",
                fmt_bytes(active),
                fmt_bytes(a.allocated),
                fmt_bytes(a.pending_free),
                fmt_bytes(a.reserved),
                fmt_bytes(ops.live_bytes_at_end),
                if active == ops.live_bytes_at_end {
                    "the same".to_owned()
                } else {
                    format!(
                        "{} apart (a trace that lost events?)",
                        exact(active.abs_diff(ops.live_bytes_at_end))
                    )
                }
            )?;
        }
        None => outln!("  the trace has no `segments`: blocks live before recording are known only from their frees")?,
    }
    outln!(
        "  peak live {} B as recorded, {} B ({}) with sizes rounded to {} B",
        ops.peak_live_bytes,
        l.peak,
        fmt_bytes(l.peak),
        args.align
    )?;
    if args.free_at == FreePoint::FirstFree {
        outln!("  blocks are freed at their first free event (--free-at first)")?;
    }
    Ok(())
}

pub(crate) fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The smallest capacity under which `allocator` completes `ops`, with a
/// progress line per trial.
pub(crate) fn find_min(ops: &Ops, align: u64, allocator: Allocator, peak: u64) -> Res<MinCapacity> {
    let mut progress = Progress::new();
    let mut trials = 0;
    let label = allocator.label();
    progress.show(&format!("{label}: searching for the smallest capacity"));
    let found = find_min_capacity_observed(ops, align, allocator, &mut |r| {
        trials += 1;
        progress.show(&format!(
            "{label}: searching for the smallest capacity: trial {trials}, {} ({:.4} x peak live) {}",
            fmt_bytes(r.capacity_bytes),
            r.capacity_bytes as f64 / peak.max(1) as f64,
            result_cell(&r.outcome)
        ));
    });
    progress.clear();
    Ok(found?)
}

fn replay_one(
    ops: &Ops,
    config: &ArenaConfig,
    allocator: Allocator,
    points: usize,
) -> Res<ReplayReport> {
    let mut progress = Progress::new();
    progress.show(&format!(
        "replaying {} at {}",
        allocator.label(),
        fmt_bytes(config.capacity_bytes)
    ));
    let options = ReplayOptions::default()
        .with_allocator(allocator)
        .with_timeline_points(points);
    Ok(replay_with(ops, config, &options)?)
}

pub(crate) fn run(args: &ReplayArgs) -> Res<()> {
    let loaded = load(args)?;
    let verdict = crate::verdict::compute(&loaded, args.align, args.policy)?;
    if args.json {
        let min = if args.find_min {
            let arena = find_min(&loaded.ops, args.align, args.policy, loaded.peak).ok();
            let fixed = find_min(&loaded.ops, args.align, Allocator::NonMoving, loaded.peak).ok();
            Some(MinJson::new(arena.as_ref(), fixed.as_ref()))
        } else {
            None
        };
        let capacity = capacity_bytes(
            args.capacity.unwrap_or(Capacity::Ratio(1.0)),
            loaded.peak,
            args.align,
        )?;
        let config = ArenaConfig::new(capacity).with_alignment_bytes(args.align);
        let mut policies = Vec::with_capacity(Allocator::ALL.len());
        for allocator in Allocator::ALL {
            policies.push(
                if allocator == args.policy && verdict.at_peak.capacity_bytes == capacity {
                    verdict.at_peak.clone()
                } else {
                    replay_one(&loaded.ops, &config, allocator, 0)?
                },
            );
        }
        let elastic = if args.elastic {
            Some(crate::elastic::run(&loaded, args.align)?)
        } else {
            None
        };
        let report = Report::new(
            &loaded,
            &verdict,
            args.align,
            args.policy,
            &policies,
            min,
            elastic.as_ref(),
        );
        outln!("{}", report.to_line())?;
        return match verdict.capacity {
            Some(_) => Ok(()),
            None => Err(Failure::Arena(
                "the arena completes the trace at no capacity".to_owned(),
            )),
        };
    }
    print_head(&loaded, &verdict, args)?;
    if args.elastic {
        let e = crate::elastic::run(&loaded, args.align)?;
        let (mean_live, reserved) = crate::elastic::means(&loaded, args.align);
        crate::elastic::print(&e, mean_live, reserved)?;
    }
    let Loaded {
        trace,
        device,
        ops,
        peak,
        ..
    } = loaded;

    let capacity = capacity_bytes(
        args.capacity.unwrap_or(Capacity::Ratio(1.0)),
        peak,
        args.align,
    )?;
    let config = ArenaConfig::new(capacity).with_alignment_bytes(args.align);
    let want_timeline = args.svg.is_some() || args.map.is_some();

    outln!()?;
    print_header()?;
    let mut arena_at_cap = None;
    for allocator in Allocator::ALL {
        let points = if want_timeline && allocator == args.policy && !args.find_min {
            2000
        } else {
            0
        };
        // The verdict replayed the arena at peak live already.
        let reuse = allocator == args.policy
            && points == 0
            && verdict.at_peak.capacity_bytes == config.capacity_bytes;
        let r = if reuse {
            verdict.at_peak.clone()
        } else {
            replay_one(&ops, &config, allocator, points)?
        };
        print_row(label(allocator), &r, peak)?;
        if allocator == args.policy {
            arena_at_cap = Some(r);
        }
    }
    print_legend()?;
    // Is the run a failure? When a capacity was asked for (or no search was),
    // cuarena must complete at it.
    let verdict_status = match &arena_at_cap {
        Some(r) if args.capacity.is_some() || !args.find_min => arena_verdict(r, peak, args),
        _ => Ok(()),
    };

    let mut pictured = arena_at_cap;
    let mut non_moving_min = None;
    if args.find_min {
        let m = find_min(&ops, args.align, args.policy, peak).map_err(|e| {
            Failure::Arena(format!("the arena completes the trace at no capacity: {e}"))
        })?;
        let min_config = ArenaConfig::new(m.capacity_bytes).with_alignment_bytes(args.align);
        let naive = replay_one(&ops, &min_config, Allocator::NaiveCompacting, 0)?;
        let fixed = find_min(&ops, args.align, Allocator::NonMoving, peak);
        outln!()?;
        outln!(
            "smallest capacities ({} for the arena):",
            count(u64::from(m.trials), "trial", "trials")
        )?;
        print_header()?;
        print_row(
            &format!("{}, smallest", label(args.policy)),
            &m.report,
            peak,
        )?;
        print_row("naive (full on failure), same cap", &naive, peak)?;
        match &fixed {
            Ok(f) => print_row("non-moving segregated fit, smallest", &f.report, peak)?,
            Err(e) => outln!("non-moving segregated fit: no capacity completes: {e}")?,
        }
        print_legend()?;
        if let Some(b) = verdict.best_fit {
            outln!(
                "best fit in one region (exact, non-moving), smallest: {} ({:.4} x peak live)",
                fmt_bytes(b),
                b as f64 / peak.max(1) as f64
            )?;
        }
        outln!()?;
        outln!("smallest capacity / peak live = {:.4}", m.ratio())?;
        non_moving_min = fixed.ok().map(|f| f.capacity_bytes);
        if want_timeline {
            pictured = Some(replay_one(&ops, &min_config, args.policy, 2000)?);
        }
    }

    if let Some(pictured) = pictured {
        if let Some(mut timeline) = pictured.timeline.clone() {
            let reserved = trace.reserved_series(device);
            if !reserved.is_empty() {
                timeline
                    .baselines
                    .push(("PyTorch caching allocator, reserved".to_owned(), reserved));
            }
            if let (Some(cap), Some(last)) = (non_moving_min, ops.event_index.last()) {
                let first = ops.event_index.first().copied().unwrap_or(0);
                timeline.baselines.push((
                    "non-moving segregated fit, smallest capacity".to_owned(),
                    vec![(first, cap), (*last, cap)],
                ));
            }
            timeline.title = format!(
                "{} - cuarena at {} ({:.4} x peak live), {}",
                file_name(&args.trace),
                fmt_bytes(pictured.capacity_bytes),
                pictured.capacity_bytes as f64 / peak.max(1) as f64,
                result_cell(&pictured.outcome)
            );
            if let Some(path) = &args.svg {
                write_file(path, &timeline_svg(&timeline))?;
            }
            if let Some(path) = &args.map {
                write_map(
                    path,
                    &ops,
                    args.align,
                    pictured.capacity_bytes,
                    args.policy,
                    &timeline,
                )?;
            }
        }
    }
    verdict_status
}

/// Exit status 1 unless cuarena completed at the capacity replayed.
pub(crate) fn arena_verdict(r: &ReplayReport, peak: u64, args: &ReplayArgs) -> Res<()> {
    match &r.outcome {
        Outcome::Completed => Ok(()),
        Outcome::Failed { event, error, .. } => Err(Failure::Arena(format!(
            "the arena did not complete the trace at {} ({:.4} x peak live{}): event {event}: {error}{}",
            fmt_bytes(r.capacity_bytes),
            r.capacity_bytes as f64 / peak.max(1) as f64,
            if args.capacity.is_none() { ", the default" } else { "" },
            if args.find_min {
                ""
            } else {
                " (--find-min finds the smallest capacity that does)"
            }
        ))),
    }
}

pub(crate) fn write_file(path: &Path, text: &str) -> Res<()> {
    std::fs::write(path, text)
        .map_err(|e| Failure::Io(format!("cannot write {}: {e}", path.display())))?;
    outln!("wrote {}", path.display())?;
    Ok(())
}

/// Memory maps before and after the compaction of `timeline` that moved
/// the most bytes (metadata replays of the arena at `capacity`).
pub(crate) fn write_map(
    path: &Path,
    ops: &Ops,
    align: u64,
    capacity: u64,
    allocator: Allocator,
    timeline: &Timeline,
) -> Res<()> {
    let Some(&(event, full, moved)) = timeline.compactions.iter().max_by_key(|c| c.2) else {
        outln!("no compaction happened; no memory map written")?;
        return Ok(());
    };
    let op = ops.event_index.partition_point(|&e| e < event);
    let config = ArenaConfig::new(capacity).with_alignment_bytes(align);
    let snapshot = |n: usize, title: String| -> Res<MemoryMap> {
        let arena = replay_prefix(ops, &config, allocator, n)?;
        Ok(MemoryMap {
            title,
            capacity_bytes: capacity,
            blocks: arena
                .blocks()
                .iter()
                .map(|b| (b.offset, b.reserved_bytes, b.pins > 0))
                .collect(),
        })
    };
    let kind = if full { "full" } else { "targeted" };
    let maps = [
        snapshot(op, format!("before event {event}"))?,
        snapshot(
            op + 1,
            format!(
                "after event {event} ({kind} compaction, {} moved)",
                fmt_bytes(moved)
            ),
        )?,
    ];
    write_file(path, &memory_map_svg(&maps))
}
