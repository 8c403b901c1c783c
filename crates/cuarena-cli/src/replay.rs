//! `cuarena replay` on metadata-only arenas (no bytes, no GPU): the arena
//! and two baselines at one capacity, the smallest capacities, pictures.

use std::path::Path;
use std::time::Instant;

use cuarena::{fmt_bytes, ArenaConfig};
use cuarena_trace::trace::{
    find_min_capacity_observed, replay_prefix, replay_with, Allocator, FreePoint, MinCapacity, Ops,
    Outcome, ReplayOptions, ReplayReport, Trace, TraceFormat,
};
use cuarena_trace::viz::{memory_map_svg, timeline_svg, MemoryMap, Timeline};

use crate::args::{Capacity, ReplayArgs, MAX_CAPACITY};
use crate::progress::Progress;
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

fn print_header() -> Res<()> {
    outln!(
        "{:<36} {:>12} {:>26} {:>10} {:>12} {:>15} {:>9} {:>9}",
        "allocator",
        "capacity",
        "result",
        "cap/peak",
        "bytes moved",
        "compactions t/f",
        "time",
        "per op"
    )
}

fn print_row(label: &str, r: &ReplayReport, peak: u64) -> Res<()> {
    outln!(
        "{:<36} {:>12} {:>26} {:>10.4} {:>12} {:>15} {:>8.1}ms {:>7.0}ns",
        label,
        fmt_bytes(r.capacity_bytes),
        result_cell(&r.outcome),
        r.capacity_bytes as f64 / peak.max(1) as f64,
        fmt_bytes(r.bytes_moved),
        format!("{}/{}", r.targeted_compactions, r.full_compactions),
        r.wall_time.as_secs_f64() * 1e3,
        r.time_per_op().as_secs_f64() * 1e9,
    )
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
                    "--capacity {r}: {r} x the peak live {peak} B is past the largest capacity \
                     a replay takes ({MAX_CAPACITY} B)"
                )));
            }
            round_up(want.ceil() as u64, align)
        }
    };
    if bytes > MAX_CAPACITY {
        return Err(Failure::Usage(format!(
            "--capacity: {bytes} B is past the largest capacity a replay takes ({MAX_CAPACITY} B)"
        )));
    }
    Ok(bytes)
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
}

/// What to say when a snapshot holds no events at all.
const HOW_TO_RECORD: &str = "record one with \
    torch.cuda.memory._record_memory_history(max_entries=100000) before the steps and \
    torch.cuda.memory._dump_snapshot(path) after them";

/// Reads the trace and builds the program of the device asked for
/// (printing nothing: the verdict comes first).
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
    let devices = trace.devices();
    let device = match args.device {
        Some(d) if devices.contains(&d) => d,
        Some(d) => {
            return Err(Failure::Usage(format!(
                "--device {d}: the trace has no events on device {d} (devices in the trace: {devices:?})"
            )))
        }
        None => devices.first().copied().unwrap_or(0),
    };
    let ops = trace.ops_with(device, args.free_at)?;
    if ops.is_empty() {
        let on_device = trace.events.iter().filter(|e| e.device == device).count();
        return Err(Failure::Io(format!(
            "{name}: the trace has no allocations on device {device} ({on_device} events on it), \
             and no blocks live before recording; {HOW_TO_RECORD}"
        )));
    }
    let peak = ops.peak_live_rounded(args.align);
    let l = Loaded {
        trace,
        name,
        device,
        ops,
        peak,
        read_ms: t0.elapsed().as_secs_f64() * 1e3,
    };
    crate::verdict::check_peak(&l)?;
    Ok(l)
}

/// The trace's details, after the verdict.
pub(crate) fn print_details(l: &Loaded, args: &ReplayArgs) -> Res<()> {
    let ops = &l.ops;
    outln!()?;
    outln!(
        "trace {}: {} events read in {:.0} ms: {}",
        l.name,
        l.trace.events.len(),
        l.read_ms,
        l.trace.counts.summary()
    )?;
    outln!(
        "  before recording: {} blocks, {} live ({} from `segments`, {} freed in the trace); \
         {} frees matched against them",
        ops.initial_blocks,
        fmt_bytes(ops.initial_bytes),
        ops.initial_from_segments,
        ops.initial_blocks - ops.initial_from_segments,
        ops.initial_frees
    )?;
    outln!(
        "  {} allocs, {} frees, {} implicit frees, {} frees still pending at the end, \
         {} blocks live at the end ({})",
        ops.allocs,
        ops.frees,
        ops.implicit_frees,
        ops.pending_at_end,
        ops.live_at_end,
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
                        "{} B apart (a trace that lost events?)",
                        active.abs_diff(ops.live_bytes_at_end)
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
    let verdict = crate::verdict::compute(&loaded, args.align)?;
    if args.json {
        crate::verdict::json(&loaded, &verdict, args.align)?;
        return match verdict.capacity {
            Some(_) => Ok(()),
            None => Err(Failure::Arena(
                "the arena completes the trace at no capacity".to_owned(),
            )),
        };
    }
    crate::verdict::print(&loaded, &verdict)?;
    print_details(&loaded, args)?;
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
        let points = if want_timeline && allocator == Allocator::Compacting && !args.find_min {
            2000
        } else {
            0
        };
        // The verdict replayed the arena at peak live already.
        let reuse = allocator == Allocator::Compacting
            && points == 0
            && verdict.at_peak.capacity_bytes == config.capacity_bytes;
        let r = if reuse {
            verdict.at_peak.clone()
        } else {
            replay_one(&ops, &config, allocator, points)?
        };
        print_row(allocator.label(), &r, peak)?;
        if allocator == Allocator::Compacting {
            arena_at_cap = Some(r);
        }
    }
    // Is the run a failure? When a capacity was asked for (or no search was),
    // cuarena must complete at it.
    let verdict = match &arena_at_cap {
        Some(r) if args.capacity.is_some() || !args.find_min => arena_verdict(r, peak, args),
        _ => Ok(()),
    };

    let mut pictured = arena_at_cap;
    let mut non_moving_min = None;
    if args.find_min {
        let m = find_min(&ops, args.align, Allocator::Compacting, peak).map_err(|e| {
            Failure::Arena(format!("the arena completes the trace at no capacity: {e}"))
        })?;
        let min_config = ArenaConfig::new(m.capacity_bytes).with_alignment_bytes(args.align);
        let naive = replay_one(&ops, &min_config, Allocator::NaiveCompacting, 0)?;
        let fixed = find_min(&ops, args.align, Allocator::NonMoving, peak);
        outln!()?;
        outln!("smallest capacities ({} trial(s) for the arena):", m.trials)?;
        print_header()?;
        print_row("cuarena (auto policy), smallest", &m.report, peak)?;
        print_row("naive (full on failure), same cap", &naive, peak)?;
        match &fixed {
            Ok(f) => print_row("non-moving best fit, smallest", &f.report, peak)?,
            Err(e) => outln!("non-moving best fit: no capacity completes: {e}")?,
        }
        outln!()?;
        outln!("smallest capacity / peak live = {:.4}", m.ratio())?;
        non_moving_min = fixed.ok().map(|f| f.capacity_bytes);
        if want_timeline {
            pictured = Some(replay_one(&ops, &min_config, Allocator::Compacting, 2000)?);
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
                    "non-moving best fit, smallest capacity".to_owned(),
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
                write_map(path, &ops, args.align, pictured.capacity_bytes, &timeline)?;
            }
        }
    }
    verdict
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
    timeline: &Timeline,
) -> Res<()> {
    let Some(&(event, full, moved)) = timeline.compactions.iter().max_by_key(|c| c.2) else {
        outln!("no compaction happened; no memory map written")?;
        return Ok(());
    };
    let op = ops.event_index.partition_point(|&e| e < event);
    let config = ArenaConfig::new(capacity).with_alignment_bytes(align);
    let snapshot = |n: usize, title: String| -> Res<MemoryMap> {
        let arena = replay_prefix(ops, &config, Allocator::Compacting, n)?;
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
