//! Replays a PyTorch allocation trace against cuarena and two baselines.
//!
//! ```text
//! cargo run --release --example replay -- TRACE [--capacity BYTES|RATIO] [--find-min]
//!     [--device N] [--align BYTES] [--free-at completed|first]
//!     [--svg timeline.svg] [--map map.svg] [--gpu]
//! ```
//!
//! TRACE is a `torch.cuda.memory._dump_snapshot` pickle or an
//! `action,addr,size,stream,time_us` CSV, either optionally gzipped.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use cuarena::trace::{
    find_min_capacity_with, replay_prefix, replay_with, Allocator, FreePoint, Outcome,
    ReplayOptions, ReplayReport, Trace,
};
use cuarena::viz::{memory_map_svg, timeline_svg, MemoryMap};
use cuarena::{fmt_bytes, ArenaConfig};

const USAGE: &str = "\
usage: replay TRACE [options]

  TRACE                      snapshot pickle or CSV trace, optionally gzipped
  --capacity BYTES|RATIO     arena capacity: bytes (e.g. 15000000000, 14GiB, 512MiB)
                             or a ratio of peak live bytes (e.g. 1.02 or 1.02x);
                             default 1.0
  --find-min                 also search for the smallest capacity that completes
  --device N                 device of the trace to replay (default: first with events)
  --align BYTES              arena alignment, a power of two (default 256)
  --free-at completed|first  free at free_completed (default) or at the first free event
  --svg FILE                 write a timeline of the arena replay as SVG
  --map FILE                 write memory maps before/after the largest compaction as SVG
  --gpu                      replay on the GPU (not built yet)
  -h, --help                 this text";

#[derive(Debug, Clone, Copy)]
enum Capacity {
    Bytes(u64),
    Ratio(f64),
}

#[derive(Debug)]
struct Args {
    trace: PathBuf,
    capacity: Capacity,
    find_min: bool,
    gpu: bool,
    svg: Option<PathBuf>,
    map: Option<PathBuf>,
    device: Option<u32>,
    align: u64,
    free_at: FreePoint,
}

/// Parses `14GiB`, `512MiB`, `1000000` as bytes, `1.02` / `1.02x` as a ratio.
fn parse_capacity(s: &str) -> Result<Capacity, String> {
    let t = s.trim();
    if let Some(r) = t.strip_suffix(['x', 'X']) {
        return parse_ratio(r, s);
    }
    if t.contains('.') {
        return parse_ratio(t, s);
    }
    let lower = t.to_ascii_lowercase();
    let units: [(&str, u64); 8] = [
        ("kib", 1 << 10),
        ("mib", 1 << 20),
        ("gib", 1 << 30),
        ("tib", 1 << 40),
        ("k", 1 << 10),
        ("m", 1 << 20),
        ("g", 1 << 30),
        ("t", 1 << 40),
    ];
    let (digits, mult) = units
        .iter()
        .find_map(|(u, m)| lower.strip_suffix(u).map(|d| (d, *m)))
        .unwrap_or((lower.as_str(), 1));
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("--capacity: `{s}` is neither a byte count nor a ratio"))?;
    n.checked_mul(mult)
        .map(Capacity::Bytes)
        .ok_or_else(|| format!("--capacity: `{s}` overflows"))
}

fn parse_ratio(r: &str, orig: &str) -> Result<Capacity, String> {
    match r.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e6 => Ok(Capacity::Ratio(v)),
        _ => Err(format!(
            "--capacity: `{orig}` is not a positive ratio (e.g. 1.02)"
        )),
    }
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut trace = None;
    let mut args = Args {
        trace: PathBuf::new(),
        capacity: Capacity::Ratio(1.0),
        find_min: false,
        gpu: false,
        svg: None,
        map: None,
        device: None,
        align: 256,
        free_at: FreePoint::Completed,
    };
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--capacity" => args.capacity = parse_capacity(&value("--capacity")?)?,
            "--find-min" => args.find_min = true,
            "--gpu" => args.gpu = true,
            "--svg" => args.svg = Some(PathBuf::from(value("--svg")?)),
            "--map" => args.map = Some(PathBuf::from(value("--map")?)),
            "--device" => {
                let v = value("--device")?;
                args.device = Some(
                    v.parse()
                        .map_err(|_| format!("--device: `{v}` is not a device ordinal"))?,
                );
            }
            "--align" => {
                let v = value("--align")?;
                args.align = match v.parse::<u64>() {
                    Ok(a) if a.is_power_of_two() => a,
                    _ => return Err(format!("--align: `{v}` is not a power of two")),
                };
            }
            "--free-at" => {
                args.free_at = match value("--free-at")?.as_str() {
                    "completed" => FreePoint::Completed,
                    "first" => FreePoint::FirstFree,
                    other => {
                        return Err(format!(
                            "--free-at: `{other}` is neither `completed` nor `first`"
                        ))
                    }
                }
            }
            s if s.starts_with('-') => return Err(format!("unknown option `{s}`")),
            s => {
                if trace.is_some() {
                    return Err(format!("unexpected argument `{s}` (one TRACE only)"));
                }
                trace = Some(PathBuf::from(s));
            }
        }
    }
    args.trace = trace.ok_or("missing TRACE")?;
    Ok(Some(args))
}

fn round_up(v: u64, align: u64) -> u64 {
    v.div_ceil(align).saturating_mul(align)
}

fn result_cell(r: &ReplayReport) -> String {
    match &r.outcome {
        Outcome::Completed => "completed".to_owned(),
        Outcome::Failed { event, .. } => format!("failed at event {event}"),
    }
}

fn print_header() {
    println!(
        "{:<36} {:>12} {:>26} {:>10} {:>12} {:>13} {:>9} {:>9}",
        "allocator",
        "capacity",
        "result",
        "cap/peak",
        "bytes moved",
        "compactions",
        "time",
        "per op"
    );
}

fn print_row(label: &str, r: &ReplayReport, peak: u64) {
    println!(
        "{:<36} {:>12} {:>26} {:>10.4} {:>12} {:>13} {:>8.1}ms {:>7.0}ns",
        label,
        fmt_bytes(r.capacity_bytes),
        result_cell(r),
        r.capacity_bytes as f64 / peak.max(1) as f64,
        fmt_bytes(r.bytes_moved),
        format!("{}/{}", r.targeted_compactions, r.full_compactions),
        r.wall_time.as_secs_f64() * 1e3,
        r.time_per_op().as_secs_f64() * 1e9,
    );
}

fn run(args: Args) -> Result<(), String> {
    if args.gpu {
        return Err(
            "GPU replay is not built yet: this example replays on a metadata-only arena \
             (drop --gpu)"
                .to_owned(),
        );
    }
    let t0 = Instant::now();
    let trace = Trace::read(&args.trace).map_err(|e| e.to_string())?;
    let devices = trace.devices();
    let device = match args.device {
        Some(d) if devices.contains(&d) => d,
        Some(d) => {
            return Err(format!(
                "device {d} has no events (devices in the trace: {devices:?})"
            ))
        }
        None => devices.first().copied().unwrap_or(0),
    };
    let ops = trace.ops_with(device, args.free_at);
    let peak = ops.peak_live_rounded(args.align);
    println!(
        "trace {}: {} events, device {device} of {devices:?}, read in {:.0} ms",
        args.trace.display(),
        trace.events.len(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    println!(
        "  {} allocs, {} frees, {} frees of blocks allocated before recording (skipped), \
         {} implicit frees, {} live at end",
        ops.allocs, ops.frees, ops.skipped_frees, ops.implicit_frees, ops.live_at_end
    );
    println!(
        "  peak live {} B as recorded, {} B ({}) with sizes rounded to {} B",
        ops.peak_live_bytes,
        peak,
        fmt_bytes(peak),
        args.align
    );
    if ops.is_empty() {
        return Err("the trace has no allocations on this device".to_owned());
    }

    let capacity = match args.capacity {
        Capacity::Bytes(b) => round_up(b.max(1), args.align),
        Capacity::Ratio(r) => round_up(((peak.max(1) as f64) * r).ceil() as u64, args.align),
    };
    let config = ArenaConfig::new(capacity).with_alignment_bytes(args.align);
    let want_timeline = args.svg.is_some() || args.map.is_some();

    println!();
    print_header();
    let mut arena_at_cap = None;
    for allocator in Allocator::ALL {
        let opts = ReplayOptions {
            allocator,
            timeline_points: if want_timeline
                && allocator == Allocator::Compacting
                && !args.find_min
            {
                2000
            } else {
                0
            },
        };
        let r = replay_with(&ops, &config, &opts).map_err(|e| e.to_string())?;
        print_row(allocator.label(), &r, peak);
        if allocator == Allocator::Compacting {
            arena_at_cap = Some(r);
        }
    }

    let mut pictured = arena_at_cap;
    let mut non_moving_min = None;
    if args.find_min {
        let m = find_min_capacity_with(&ops, args.align, Allocator::Compacting)
            .map_err(|e| e.to_string())?;
        let min_config = ArenaConfig::new(m.capacity_bytes).with_alignment_bytes(args.align);
        let naive = replay_with(
            &ops,
            &min_config,
            &ReplayOptions {
                allocator: Allocator::NaiveCompacting,
                timeline_points: 0,
            },
        )
        .map_err(|e| e.to_string())?;
        let fixed = find_min_capacity_with(&ops, args.align, Allocator::NonMoving);
        println!();
        println!("smallest capacities ({} trials for the arena):", m.trials);
        print_header();
        print_row("cuarena (targeted), smallest", &m.report, peak);
        print_row("naive (full on failure), same cap", &naive, peak);
        match &fixed {
            Ok(f) => print_row("non-moving best fit, smallest", &f.report, peak),
            Err(e) => println!("non-moving best fit: no capacity completes: {e}"),
        }
        println!();
        println!("smallest capacity / peak live = {:.4}", m.ratio());
        non_moving_min = fixed.ok().map(|f| f.capacity_bytes);
        if want_timeline {
            pictured = Some(
                replay_with(
                    &ops,
                    &min_config,
                    &ReplayOptions {
                        allocator: Allocator::Compacting,
                        timeline_points: 2000,
                    },
                )
                .map_err(|e| e.to_string())?,
            );
        }
    }

    let Some(pictured) = pictured else {
        return Ok(());
    };
    let Some(mut timeline) = pictured.timeline.clone() else {
        return Ok(());
    };
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
        args.trace
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        fmt_bytes(pictured.capacity_bytes),
        pictured.capacity_bytes as f64 / peak.max(1) as f64,
        result_cell(&pictured)
    );
    if let Some(path) = &args.svg {
        std::fs::write(path, timeline_svg(&timeline))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.map {
        // The compaction that moved the most bytes, pictured before/after.
        let Some(&(event, full, moved)) = timeline.compactions.iter().max_by_key(|c| c.2) else {
            println!("no compaction happened; no memory map written");
            return Ok(());
        };
        let op = ops.event_index.partition_point(|&e| e < event);
        let config = ArenaConfig::new(pictured.capacity_bytes).with_alignment_bytes(args.align);
        let snapshot = |n: usize, title: String| -> Result<MemoryMap, String> {
            let arena = replay_prefix(&ops, &config, Allocator::Compacting, n)
                .map_err(|e| e.to_string())?;
            Ok(MemoryMap {
                title,
                capacity_bytes: pictured.capacity_bytes,
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
        std::fs::write(path, memory_map_svg(&maps))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
