//! Replays a PyTorch allocation trace against cuarena and two baselines.
//!
//! ```text
//! cargo run --release --example replay -- TRACE [--capacity BYTES|RATIO] [--find-min]
//!     [--device N] [--align BYTES] [--free-at completed|first]
//!     [--svg timeline.svg] [--map map.svg]
//!     [--gpu [--gpu-ordinal N] [--gpu-warmup N] [--check-all] [--gpu-corrupt ID]]
//! ```
//!
//! TRACE is a `torch.cuda.memory._dump_snapshot` pickle or an
//! `action,addr,size,stream,time_us` CSV, either optionally gzipped.
//!
//! Without `--gpu` the program runs on metadata-only arenas (placement and
//! planning, no bytes). With `--gpu` it replays on a CUDA arena with real
//! bytes and moves (`cuarena::tools::gpu::replay`), at `--capacity` or by default at
//! the smallest capacity the metadata search finds, and runs the real
//! baselines in the same process (`cuarena::tools::gpu::baselines`): a
//! CUDA memory pool capped at the arena's capacity, its own smallest
//! completing capacity, and plain `cuMemAlloc` / `cuMemFree`. It prints one
//! table, and exits non-zero when there is no GPU or when a pattern check
//! fails.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use cuarena::tools::trace::{
    find_min_capacity_with, replay_prefix, replay_with, Allocator, FreePoint, Ops, Outcome,
    ReplayOptions, ReplayReport, Trace,
};
use cuarena::tools::viz::{memory_map_svg, timeline_svg, MemoryMap, Timeline};
use cuarena::{fmt_bytes, ArenaConfig};

const USAGE: &str = "\
usage: replay TRACE [options]

  TRACE                      snapshot pickle or CSV trace, optionally gzipped
  --capacity BYTES|RATIO     arena capacity: bytes (e.g. 15000000000, 14GiB, 512MiB)
                             or a ratio of peak live bytes (e.g. 1.02 or 1.02x);
                             default 1.0, with --gpu the smallest the metadata
                             search finds
  --find-min                 also search for the smallest capacity that completes
  --device N                 device of the trace to replay (default: first with events)
  --align BYTES              arena alignment, a power of two (default 256)
  --free-at completed|first  free at free_completed (default) or at the first free event
  --svg FILE                 write a timeline of the arena replay as SVG
  --map FILE                 write memory maps before/after the largest compaction as SVG
  --gpu                      replay on the GPU with real bytes, against a capped CUDA
                             memory pool and cuMemAlloc (capacity default: the
                             smallest the metadata search finds)
  --gpu-ordinal N            CUDA device for --gpu (default 0)
  --gpu-warmup N             passes over the trace before the timed one on the same
                             arena, checked too (default 1)
  --gpu-corrupt ID           self-test of the checks: overwrite block ID after its fill;
                             the GPU replay must fail at its free (no baselines run)
  --check-all                with --gpu, check every byte of every tensor at its free
                             (default: moved tensors and every 8th in full, 64 KiB at
                             each end of the others)
  -h, --help                 this text";

#[derive(Debug, Clone, Copy)]
enum Capacity {
    Bytes(u64),
    Ratio(f64),
}

#[derive(Debug)]
struct Args {
    trace: PathBuf,
    /// `None`: 1.0 x peak on metadata, the smallest found with `--gpu`.
    capacity: Option<Capacity>,
    find_min: bool,
    gpu: bool,
    gpu_ordinal: usize,
    gpu_warmup: u32,
    gpu_corrupt: Option<u32>,
    check_all: bool,
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
        capacity: None,
        find_min: false,
        gpu: false,
        gpu_ordinal: 0,
        gpu_warmup: 1,
        gpu_corrupt: None,
        check_all: false,
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
            "--capacity" => args.capacity = Some(parse_capacity(&value("--capacity")?)?),
            "--find-min" => args.find_min = true,
            "--gpu" => args.gpu = true,
            "--check-all" => args.check_all = true,
            "--gpu-corrupt" => {
                let v = value("--gpu-corrupt")?;
                args.gpu_corrupt = Some(
                    v.parse()
                        .map_err(|_| format!("--gpu-corrupt: `{v}` is not a block id"))?,
                );
            }
            "--gpu-warmup" => {
                let v = value("--gpu-warmup")?;
                args.gpu_warmup = v
                    .parse()
                    .map_err(|_| format!("--gpu-warmup: `{v}` is not a number of passes"))?;
            }
            "--gpu-ordinal" => {
                let v = value("--gpu-ordinal")?;
                args.gpu_ordinal = v
                    .parse()
                    .map_err(|_| format!("--gpu-ordinal: `{v}` is not a device ordinal"))?;
            }
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

/// The capacity `c` means for a trace of `peak` live bytes.
fn capacity_bytes(c: Capacity, peak: u64, align: u64) -> u64 {
    match c {
        Capacity::Bytes(b) => round_up(b.max(1), align),
        Capacity::Ratio(r) => round_up(((peak.max(1) as f64) * r).ceil() as u64, align),
    }
}

/// The trace read and turned into the program of one device.
struct Loaded {
    trace: Trace,
    device: u32,
    ops: Ops,
    /// Peak live bytes with sizes rounded to the alignment.
    peak: u64,
}

fn load(args: &Args) -> Result<Loaded, String> {
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
    Ok(Loaded {
        trace,
        device,
        ops,
        peak,
    })
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn run(args: Args) -> Result<(), String> {
    if args.gpu {
        return gpu::run(&args);
    }
    let Loaded {
        trace,
        device,
        ops,
        peak,
    } = load(&args)?;

    let capacity = capacity_bytes(
        args.capacity.unwrap_or(Capacity::Ratio(1.0)),
        peak,
        args.align,
    );
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
        file_name(&args.trace),
        fmt_bytes(pictured.capacity_bytes),
        pictured.capacity_bytes as f64 / peak.max(1) as f64,
        result_cell(&pictured)
    );
    if let Some(path) = &args.svg {
        write_file(path, &timeline_svg(&timeline))?;
    }
    if let Some(path) = &args.map {
        write_map(path, &ops, args.align, pictured.capacity_bytes, &timeline)?;
    }
    Ok(())
}

fn write_file(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Memory maps before and after the compaction of `timeline` that moved
/// the most bytes (metadata replays of the arena at `capacity`).
fn write_map(
    path: &Path,
    ops: &Ops,
    align: u64,
    capacity: u64,
    timeline: &Timeline,
) -> Result<(), String> {
    let Some(&(event, full, moved)) = timeline.compactions.iter().max_by_key(|c| c.2) else {
        println!("no compaction happened; no memory map written");
        return Ok(());
    };
    let op = ops.event_index.partition_point(|&e| e < event);
    let config = ArenaConfig::new(capacity).with_alignment_bytes(align);
    let snapshot = |n: usize, title: String| -> Result<MemoryMap, String> {
        let arena =
            replay_prefix(ops, &config, Allocator::Compacting, n).map_err(|e| e.to_string())?;
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

/// `--gpu`: the replay on a CUDA arena and the real baselines.
#[cfg(not(feature = "cuda"))]
mod gpu {
    pub fn run(_args: &super::Args) -> Result<(), String> {
        Err("--gpu needs cuarena's `cuda` feature (build with default features)".to_owned())
    }
}

/// `--gpu`: the replay on a CUDA arena and the real baselines.
#[cfg(feature = "cuda")]
mod gpu {
    use std::time::Duration;

    use cuarena::backend::cuda::CudaBackend;
    use cuarena::tools::gpu::baselines::{
        find_min_pool_capacity, replay_cu_mem_alloc, replay_pool, BaselineReport, PoolOptions,
    };
    use cuarena::tools::gpu::replay::{
        replay_gpu, CheckSampling, GpuReplayOptions, GpuReplayReport, PassReport,
    };
    use cuarena::tools::trace::{
        find_min_capacity, replay_with, Allocator, Outcome, ReplayOptions,
    };
    use cuarena::tools::viz::timeline_svg;
    use cuarena::tools::ToolError;
    use cuarena::{fmt_bytes, ArenaConfig, Error};

    use super::{capacity_bytes, file_name, load, write_file, write_map, Args, Loaded};

    /// One row of the comparison table.
    struct Row {
        allocator: String,
        capacity: String,
        result: String,
        cap_over_peak: String,
        bytes_moved: String,
        moving: String,
        moving_fraction: String,
        per_event_alloc: String,
        per_event_replay: String,
    }

    const HEADER: [&str; 9] = [
        "allocator",
        "capacity",
        "result",
        "capacity / peak live",
        "bytes moved",
        "time moving (device)",
        "moving / trace wall",
        "time per event (allocator calls)",
        "time per event (whole replay)",
    ];

    impl Row {
        fn cells(&self) -> [&str; 9] {
            [
                &self.allocator,
                &self.capacity,
                &self.result,
                &self.cap_over_peak,
                &self.bytes_moved,
                &self.moving,
                &self.moving_fraction,
                &self.per_event_alloc,
                &self.per_event_replay,
            ]
        }
    }

    fn outcome_cell(o: &Outcome) -> String {
        match o {
            Outcome::Completed => "completed".to_owned(),
            Outcome::Failed { event, .. } => format!("failed at event {event}"),
        }
    }

    fn ns(d: Duration) -> String {
        let v = d.as_secs_f64() * 1e9;
        if v >= 10_000.0 {
            format!("{:.1} µs", v / 1e3)
        } else {
            format!("{v:.0} ns")
        }
    }

    fn ms(d: Duration) -> String {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }

    fn ratio(cap: u64, peak: u64) -> String {
        format!("{:.4}", cap as f64 / peak.max(1) as f64)
    }

    fn baseline_row(label: &str, r: &BaselineReport, cap: Option<u64>, peak: u64) -> Row {
        let per = ns(r.time_per_op());
        Row {
            allocator: label.to_owned(),
            capacity: cap.map_or("uncapped".to_owned(), fmt_bytes),
            result: outcome_cell(&r.outcome),
            cap_over_peak: cap.map_or("-".to_owned(), |c| ratio(c, peak)),
            bytes_moved: "0 (never moves)".to_owned(),
            moving: "-".to_owned(),
            moving_fraction: "-".to_owned(),
            per_event_alloc: per.clone(),
            per_event_replay: per,
        }
    }

    fn arena_row(g: &GpuReplayReport, capacity: u64, peak: u64, trace_wall: Duration) -> Row {
        let t = &g.timed;
        let fraction = if trace_wall > Duration::ZERO {
            format!(
                "{:.3}%",
                100.0 * t.move_device_time.as_secs_f64() / trace_wall.as_secs_f64()
            )
        } else {
            "-".to_owned()
        };
        Row {
            allocator: "cuarena (GPU, targeted compaction)".to_owned(),
            capacity: fmt_bytes(capacity),
            result: outcome_cell(&g.outcome),
            cap_over_peak: ratio(capacity, peak),
            bytes_moved: format!(
                "{} ({}/{})",
                fmt_bytes(t.bytes_moved),
                t.targeted_compactions,
                t.full_compactions
            ),
            moving: format!(
                "{}{}",
                ms(t.move_device_time),
                if t.inexact_compactions() > 0 {
                    " (upper bound)"
                } else {
                    ""
                }
            ),
            moving_fraction: fraction,
            per_event_alloc: ns(t.allocator_time_per_op()),
            per_event_replay: ns(t.time_per_op()),
        }
    }

    fn print_table(rows: &[Row]) {
        let mut widths = HEADER.map(str::len);
        for r in rows {
            for (w, c) in widths.iter_mut().zip(r.cells()) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: [&str; 9]| {
            let mut s = String::from("|");
            for (k, (c, w)) in cells.iter().zip(widths).enumerate() {
                let pad = w.saturating_sub(c.chars().count());
                if k == 0 {
                    s.push_str(&format!(" {c}{} |", " ".repeat(pad)));
                } else {
                    s.push_str(&format!(" {}{c} |", " ".repeat(pad)));
                }
            }
            s
        };
        println!("{}", line(HEADER));
        let rule: Vec<String> = widths
            .iter()
            .enumerate()
            .map(|(k, w)| {
                if k == 0 {
                    "-".repeat(*w)
                } else {
                    format!("{}:", "-".repeat(w.saturating_sub(1)))
                }
            })
            .collect();
        println!("| {} |", rule.join(" | "));
        for r in rows {
            println!("{}", line(r.cells()));
        }
    }

    fn print_pass(name: &str, p: &PassReport) {
        println!(
            "  {name}: {} ops in {} ({} per op), allocator calls {} ({} per op)",
            p.ops_run,
            ms(p.wall_time),
            ns(p.time_per_op()),
            ms(p.allocator_time),
            ns(p.allocator_time_per_op())
        );
        println!(
            "    patterns {} filled, {} checked ({} tensors in full, {} at their edges)",
            fmt_bytes(p.bytes_filled),
            fmt_bytes(p.bytes_checked),
            p.checked_full,
            p.checked_edges,
        );
        println!(
            "    compactions {} targeted / {} full, {} blocks and {} moved, {} on the device; \
             host planning {}, host compaction {}; settle delays {} (in the wall time)",
            p.targeted_compactions,
            p.full_compactions,
            p.moves,
            fmt_bytes(p.bytes_moved),
            ms(p.move_device_time),
            ms(p.planning_time),
            ms(p.compaction_time),
            ms(p.delay_time)
        );
        for c in &p.compactions {
            let secs = c.device_time.as_secs_f64();
            let rate = if secs > 0.0 {
                2.0 * c.bytes_moved as f64 / secs / 1e12
            } else {
                0.0
            };
            println!(
                "      event {:>7}: {}/{}, {:>10} moved in {:>8} on the device \
                 ({:.2} TB/s read + written), alloc call {:>8} on the host{}",
                c.event,
                c.targeted,
                c.full,
                fmt_bytes(c.bytes_moved),
                ms(c.device_time),
                rate,
                ms(c.host_time),
                if c.exact {
                    ""
                } else {
                    " (device time an upper bound: the GPU may have idled)"
                }
            );
        }
        if p.untimed_compactions > 0 {
            println!(
                "    {} compactions were not predicted and are missing from the device time",
                p.untimed_compactions
            );
        }
    }

    fn print_gpu_details(g: &GpuReplayReport) {
        println!(
            "  device {}; checks: {}; {} mismatching words in all passes",
            g.device_name,
            g.sampling.describe(),
            g.mismatched_words
        );
        for (k, p) in g.warmup.iter().enumerate() {
            print_pass(&format!("warm-up pass {}", k + 1), p);
        }
        print_pass("timed pass", &g.timed);
    }

    pub fn run(args: &Args) -> Result<(), String> {
        if let Err(reason) = CudaBackend::available() {
            return Err(format!(
                "--gpu needs a CUDA GPU and this machine has none usable: {reason}"
            ));
        }
        let Loaded {
            trace,
            device,
            ops,
            peak,
        } = load(args)?;
        let align = args.align;
        let capacity = match args.capacity {
            Some(c) => capacity_bytes(c, peak, align),
            None => {
                let m = find_min_capacity(&ops, align).map_err(|e| e.to_string())?;
                println!(
                    "  smallest capacity the metadata search finds: {} ({:.4} x peak live, {} trials)",
                    fmt_bytes(m.capacity_bytes),
                    m.ratio(),
                    m.trials
                );
                m.capacity_bytes
            }
        };
        let config = ArenaConfig::new(capacity).with_alignment_bytes(align);
        let trace_wall = trace_wall_time(&trace, device);
        println!(
            "  trace wall time {:.3} s (last minus first time_us of device {device})",
            trace_wall.as_secs_f64()
        );

        // The metadata replay: the timeline, and the decisions the GPU
        // replay must repeat.
        let meta = replay_with(
            &ops,
            &config,
            &ReplayOptions {
                allocator: Allocator::Compacting,
                timeline_points: 2000,
            },
        )
        .map_err(|e| e.to_string())?;

        println!();
        println!("cuarena on the GPU at {} ...", fmt_bytes(capacity));
        let options = GpuReplayOptions {
            ordinal: args.gpu_ordinal,
            sampling: if args.check_all {
                CheckSampling::ALL
            } else {
                CheckSampling::default()
            },
            warmup_passes: args.gpu_warmup,
            corrupt_block: args.gpu_corrupt,
            ..GpuReplayOptions::default()
        };
        let gpu = replay_gpu(&ops, &config, &options);
        let mut rows = Vec::new();
        match &gpu {
            Ok(g) => {
                print_gpu_details(g);
                let same = g.warmup.iter().chain([&g.timed]).all(|p| {
                    p.targeted_compactions == meta.targeted_compactions
                        && p.full_compactions == meta.full_compactions
                        && p.bytes_moved == meta.bytes_moved
                        && p.ops_run == meta.ops_run
                        && p.peak_live_bytes == meta.peak_live_bytes
                });
                println!(
                    "  every pass made the metadata replay's decisions (compactions, bytes moved, \
                     ops run, peak): {}",
                    if same { "yes" } else { "NO" }
                );
                rows.push(arena_row(g, capacity, peak, trace_wall));
            }
            Err(e) => println!("  GPU replay error: {e}"),
        }
        if let Some(id) = args.gpu_corrupt {
            println!();
            print_table(&rows);
            let g = gpu.map_err(|e| format!("GPU replay: {e}"))?;
            return match &g.outcome {
                Outcome::Failed { event, error, .. } => {
                    println!(
                        "self-test passed: block {id} was overwritten on purpose, and the replay \
                         failed at event {event}: {error}"
                    );
                    Ok(())
                }
                Outcome::Completed => Err(format!(
                    "self-test FAILED: block {id} was overwritten but every check passed"
                )),
            };
        }

        // The pool at the arena's capacity, and its own smallest.
        let ordinal = args.gpu_ordinal;
        println!();
        println!("CUDA pool at the arena's capacity ...");
        match replay_pool(
            &ops,
            &PoolOptions {
                ordinal,
                max_size_bytes: capacity,
                record_reserved: false,
            },
        ) {
            Ok(r) => rows.push(baseline_row(
                "CUDA pool, capped at the arena's capacity",
                &r,
                r.capacity_bytes,
                peak,
            )),
            Err(e) => println!("  error: {e}"),
        }
        println!("CUDA pool: smallest capacity that completes (to 0.1% of peak live) ...");
        let mut pool_min = None;
        match find_min_pool_capacity(&ops, ordinal, peak, peak / 1000) {
            Ok(m) => {
                for t in &m.trials {
                    println!(
                        "  {:>12} ({:.4}): {}",
                        fmt_bytes(t.capacity_bytes),
                        t.capacity_bytes as f64 / peak.max(1) as f64,
                        t.failed_event
                            .map_or("completed".to_owned(), |e| format!("failed at event {e}"))
                    );
                }
                rows.push(baseline_row(
                    "CUDA pool, smallest capacity that completes",
                    &m.report,
                    Some(m.capacity_bytes),
                    peak,
                ));
                pool_min = Some(m.capacity_bytes);
            }
            Err(e) => println!("  error: {e}"),
        }
        println!("CUDA pool, uncapped ...");
        match replay_pool(
            &ops,
            &PoolOptions {
                ordinal,
                max_size_bytes: 0,
                record_reserved: false,
            },
        ) {
            Ok(r) => {
                let mut row = baseline_row("CUDA pool, uncapped", &r, None, peak);
                if let Some(high) = r.peak_reserved_bytes {
                    row.capacity = format!("uncapped, reserved peak {}", fmt_bytes(high));
                    row.cap_over_peak = ratio(high, peak);
                }
                rows.push(row);
            }
            Err(e) => println!("  error: {e}"),
        }
        println!("cuMemAlloc / cuMemFree ...");
        match replay_cu_mem_alloc(&ops, ordinal) {
            Ok(r) => rows.push(baseline_row(
                "cuMemAlloc / cuMemFree per tensor",
                &r,
                None,
                peak,
            )),
            Err(e) => println!("  error: {e}"),
        }

        println!();
        let device_name = match &gpu {
            Ok(g) => g.device_name.clone(),
            Err(_) => "the GPU".to_owned(),
        };
        println!(
            "{} on {device_name} (peak live {}, trace wall time {:.3} s):",
            file_name(&args.trace),
            fmt_bytes(peak),
            trace_wall.as_secs_f64()
        );
        print_table(&rows);

        if args.svg.is_some() || args.map.is_some() {
            if let Some(mut timeline) = meta.timeline.clone() {
                let reserved = trace.reserved_series(device);
                if !reserved.is_empty() {
                    timeline
                        .baselines
                        .push(("PyTorch caching allocator, reserved".to_owned(), reserved));
                }
                if args.svg.is_some() {
                    match replay_pool(
                        &ops,
                        &PoolOptions {
                            ordinal,
                            max_size_bytes: 0,
                            record_reserved: true,
                        },
                    ) {
                        Ok(r) if !r.reserved.is_empty() => timeline
                            .baselines
                            .push(("CUDA pool (uncapped), reserved".to_owned(), r.reserved)),
                        Ok(_) => {}
                        Err(e) => println!("CUDA pool reserved series: error: {e}"),
                    }
                }
                if let (Some(cap), Some(&first), Some(&last)) =
                    (pool_min, ops.event_index.first(), ops.event_index.last())
                {
                    timeline.baselines.push((
                        "CUDA pool, smallest completing cap".to_owned(),
                        vec![(first, cap), (last, cap)],
                    ));
                }
                timeline.title = format!(
                    "{} - cuarena at {} ({:.4} x peak live), {} on {device_name} with pattern checks",
                    file_name(&args.trace),
                    fmt_bytes(capacity),
                    capacity as f64 / peak.max(1) as f64,
                    match &gpu {
                        Ok(g) => outcome_cell(&g.outcome),
                        Err(_) => "error".to_owned(),
                    },
                );
                if let Some(path) = &args.svg {
                    write_file(path, &timeline_svg(&timeline))?;
                }
                if let Some(path) = &args.map {
                    write_map(path, &ops, align, capacity, &timeline)?;
                }
            }
        }

        let g = gpu.map_err(|e| format!("GPU replay: {e}"))?;
        match &g.outcome {
            Outcome::Completed => Ok(()),
            Outcome::Failed {
                error: ToolError::Arena(Error::OutOfMemory { .. } | Error::TooLarge { .. }),
                event,
                ..
            } => {
                println!(
                    "cuarena ran out of memory at event {event} at this capacity (no data error)"
                );
                Ok(())
            }
            Outcome::Failed { event, error, .. } => {
                Err(format!("GPU REPLAY FAILED at event {event}: {error}"))
            }
        }
    }

    /// Last minus first `time_us` of the trace's events on `device`.
    fn trace_wall_time(trace: &cuarena::tools::trace::Trace, device: u32) -> Duration {
        let mut it = trace.events.iter().filter(|e| e.device == device);
        let first = it.next().map(|e| e.time_us);
        let last = it.next_back().map(|e| e.time_us).or(first);
        match (first, last) {
            (Some(a), Some(b)) if b > a => Duration::from_micros((b - a) as u64),
            _ => Duration::ZERO,
        }
    }
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
