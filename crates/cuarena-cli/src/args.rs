//! The command line: `cuarena [--help|--version]`, `cuarena help [COMMAND]`,
//! `cuarena replay TRACE [options]`, parsed with `lexopt`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::str::FromStr;

use cuarena_trace::trace::{Allocator, FreePoint};
use lexopt::prelude::*;

use crate::{Failure, Res};

pub(crate) const MAIN_HELP: &str = "\
cuarena: a compacting GPU tensor arena, tried on your PyTorch program's allocations

usage: cuarena COMMAND [options]

commands:
  replay TRACE       replay a PyTorch memory snapshot or CSV trace on a compacting
                     arena and two non-compacting baselines: peak live bytes, the
                     smallest capacity that completes (--find-min), bytes moved,
                     SVG pictures; --gpu with real bytes on a CUDA GPU
  help [COMMAND]     this text, or a command's

options:
  -h, --help         this text (`cuarena replay --help` for replay's options)
  -V, --version      the version

exit status:
  0  done, or stdout was closed by its reader (`| head`): the output stops
     there, quietly
  1  the arena failed: it did not complete the trace at the capacity asked for,
     or a check of the bytes on the GPU failed
  2  bad command line
  3  the trace cannot be read or parsed, or an output file or stdout cannot be
     written
  4  --gpu, and no usable CUDA GPU (or a build without the `cuda` feature)

Record a trace in PyTorch (2.0 or later) around a few training steps:
  torch.cuda.memory._record_memory_history(max_entries=1_000_000)
  ...  # the steps
  torch.cuda.memory._dump_snapshot(\"snapshot.pickle\")
then:
  cuarena replay snapshot.pickle --find-min --svg timeline.svg";

pub(crate) const REPLAY_HELP: &str = "\
cuarena replay: replay a PyTorch allocation trace on cuarena and two baselines

usage: cuarena replay TRACE [options]

  TRACE                      a torch.cuda.memory._dump_snapshot pickle (PyTorch 2.x),
                             or a CSV with the header action,addr,size,stream,time_us;
                             either may be gzipped

The first lines answer the question: the peak live bytes (counting the tensors
live before recording began, from the snapshot's `segments`); what PyTorch's
caching allocator reserved at its peak, and its ratio to peak live (what
caching and fragmentation cost); the capacity at which cuarena runs the trace;
and for each `oom` event, what was asked, what PyTorch had allocated and
reserved and the device had free, and whether an arena holding all of that
memory would have served it (and where it would still fail, if it would).
Then the details: the replays run on metadata-only arenas (placement and
planning, no bytes, no GPU needed): cuarena's two policies (auto, the
default, which never moves more bytes than naive; targeted), a naive
compacting arena (full compaction on failure) and a non-moving best-fit
allocator, all at the same capacity.

options:
  --capacity BYTES|RATIO     arena capacity: bytes (e.g. 15000000000, 14GiB, 512MiB)
                             or a ratio of peak live bytes (e.g. 1.02 or 1.02x);
                             default 1.0, with --gpu the smallest the metadata
                             search finds; at most 2^60 bytes
  --find-min                 also search for the smallest capacity that completes,
                             for cuarena and for the non-moving baseline
  --device N                 device of the trace to replay (default: first with events)
  --align BYTES              arena alignment, a power of two up to 2^30 (default 256)
  --free-at completed|first  free at free_completed (default) or at the first free event
  --json                     print the verdict alone, as one JSON object (fields below)
  --svg FILE                 write a timeline of the arena replay as SVG
  --map FILE                 write memory maps before/after the largest compaction as SVG
  --gpu                      replay on the GPU with real bytes, against a capped CUDA
                             memory pool and cuMemAlloc (capacity default: the
                             smallest the metadata search finds)
  --gpu-ordinal N            CUDA device for --gpu (default 0)
  --gpu-policy auto|targeted|naive
                             the policy the GPU arena runs (default auto; naive
                             times naive compact-on-failure's moves on the device)
  --gpu-no-baselines         with --gpu, skip the CUDA pool and cuMemAlloc replays
  --gpu-warmup N             passes over the trace before the timed one on the same
                             arena, checked too (default 1)
  --gpu-corrupt ID           self-test of the checks: overwrite block ID after its fill;
                             the GPU replay must fail at its free (no baselines run)
  --check-all                with --gpu, check every byte of every tensor at its free
                             (default: moved tensors and every 8th in full, 64 KiB at
                             each end of the others)
  -h, --help                 this text

--json fields (bytes are integers; null where the trace does not say):
  trace, format (pickle|csv), device, devices, events (kept), events_skipped
  alignment_bytes            every size is rounded up to it
  peak_live_bytes            peak of the bytes live at once, sizes rounded
  peak_live_event            index of the (kept) event where it is first reached
  live_before_recording_bytes, blocks_before_recording
                             tensors live when recording began (from `segments`
                             and from frees of blocks the trace never allocated)
  frees_matched_before_recording
                             frees in the trace matched against those blocks
  live_at_end_bytes          live at the end of the replay; equals
  segments_active_bytes      the bytes `segments` held active at the dump
  pytorch_reserved_initial_bytes, pytorch_reserved_peak_bytes
                             what the caching allocator reserved from the driver
                             when recording began and at its peak
  pytorch_reserved_complete  false when the trace has no `segments` (a CSV): the
                             reserved figures then omit what was reserved before
  pytorch_reserved_over_peak_live
  arena_capacity_bytes, arena_capacity_over_peak_live
                             the capacity at which cuarena completes the trace
  oom_events                 number of `oom` events on the device
  ooms                       the first 8, each: event, requested_bytes,
                             allocated_bytes, reserved_bytes, device_free_bytes,
                             arena_bytes (reserved + device free),
                             arena_serves_request, arena_fails_at_event (null: it
                             runs the rest of the trace)

exit status:
  0  done: cuarena completed the trace at the capacity replayed (with --find-min
     and no --capacity: a smallest capacity was found); or stdout was closed by
     its reader (`| head`): the command stops there, quietly
  1  cuarena did not complete the trace at --capacity (default 1.0 x peak live),
     or no capacity completes, or a check of the bytes on the GPU failed
  2  bad command line (the message names the value)
  3  the trace cannot be read or parsed (the message names the record and the
     value), or an output file or stdout cannot be written
  4  --gpu, and no usable CUDA GPU (or a build without the `cuda` feature)

A progress line goes to stderr while the capacities are searched (when stderr
is a terminal); the results go to stdout.";

/// What the command line asks for.
#[derive(Debug)]
pub(crate) enum Command {
    Help(&'static str),
    Version,
    Replay(ReplayArgs),
}

/// An arena capacity as given on the command line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Capacity {
    Bytes(u64),
    Ratio(f64),
}

/// Largest capacity a replay takes (1 EiB, past any device), so that no
/// sum of sizes or rounding can wrap.
pub(crate) const MAX_CAPACITY: u64 = 1 << 60;

/// Options of `cuarena replay`.
#[derive(Debug)]
pub(crate) struct ReplayArgs {
    pub(crate) trace: PathBuf,
    /// `None`: 1.0 x peak on metadata, the smallest found with `--gpu`.
    pub(crate) capacity: Option<Capacity>,
    pub(crate) find_min: bool,
    pub(crate) gpu: bool,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) gpu_ordinal: usize,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) gpu_warmup: u32,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) gpu_corrupt: Option<u32>,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) check_all: bool,
    pub(crate) svg: Option<PathBuf>,
    pub(crate) map: Option<PathBuf>,
    pub(crate) device: Option<u32>,
    pub(crate) align: u64,
    pub(crate) free_at: FreePoint,
    pub(crate) json: bool,
    /// The allocator the GPU arena runs (`--gpu-policy`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) gpu_policy: Allocator,
    /// `--gpu-no-baselines`: the CUDA pool and cuMemAlloc are not replayed.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) gpu_baselines: bool,
}

fn usage(e: impl ToString) -> Failure {
    Failure::Usage(e.to_string())
}

/// The next value of option `name`, parsed; `what` says what it should be.
fn value<T: FromStr>(p: &mut lexopt::Parser, name: &str, what: &str) -> Res<T> {
    let v = p.value().map_err(usage)?;
    let s = v.to_string_lossy();
    s.trim()
        .parse()
        .map_err(|_| usage(format!("{name}: `{s}` is not {what}")))
}

/// Parses the whole command line (without the program name).
pub(crate) fn parse(args: impl IntoIterator<Item = OsString>) -> Res<Command> {
    let mut p = lexopt::Parser::from_args(args);
    match p.next().map_err(usage)? {
        None => Err(usage("no command given (commands: replay, help)")),
        Some(Short('h') | Long("help")) => Ok(Command::Help(MAIN_HELP)),
        Some(Short('V') | Long("version")) => Ok(Command::Version),
        Some(Value(v)) => match v.to_string_lossy().as_ref() {
            "replay" => parse_replay(&mut p),
            "help" => match p.next().map_err(usage)? {
                None => Ok(Command::Help(MAIN_HELP)),
                Some(Value(c)) if c == "replay" => Ok(Command::Help(REPLAY_HELP)),
                Some(other) => Err(usage(format!(
                    "help: no command {} (commands: replay)",
                    describe(&other)
                ))),
            },
            other => Err(usage(format!(
                "unknown command `{other}` (commands: replay, help)"
            ))),
        },
        Some(other) => Err(usage(other.unexpected())),
    }
}

fn describe(arg: &lexopt::Arg<'_>) -> String {
    match arg {
        Short(c) => format!("`-{c}`"),
        Long(l) => format!("`--{l}`"),
        Value(v) => format!("`{}`", v.to_string_lossy()),
    }
}

fn parse_replay(p: &mut lexopt::Parser) -> Res<Command> {
    let mut trace = None;
    let mut a = ReplayArgs {
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
        json: false,
        gpu_policy: Allocator::Bounded,
        gpu_baselines: true,
    };
    let mut gpu_only = None;
    while let Some(arg) = p.next().map_err(usage)? {
        match arg {
            Short('h') | Long("help") => return Ok(Command::Help(REPLAY_HELP)),
            Long("capacity") => {
                let v = p.value().map_err(usage)?;
                a.capacity = Some(parse_capacity(&v.to_string_lossy())?);
            }
            Long("find-min") => a.find_min = true,
            Long("json") => a.json = true,
            Long("gpu") => a.gpu = true,
            Long("check-all") => {
                a.check_all = true;
                gpu_only = Some("--check-all");
            }
            Long("gpu-corrupt") => {
                a.gpu_corrupt = Some(value(p, "--gpu-corrupt", "a block id")?);
                gpu_only = Some("--gpu-corrupt");
            }
            Long("gpu-warmup") => {
                a.gpu_warmup = value(p, "--gpu-warmup", "a number of passes")?;
                gpu_only = Some("--gpu-warmup");
            }
            Long("gpu-policy") => {
                let v = p.value().map_err(usage)?;
                a.gpu_policy = match v.to_string_lossy().as_ref() {
                    "bounded" => Allocator::Bounded,
                    "auto" => Allocator::Auto,
                    "naive" => Allocator::NaiveCompacting,
                    other => {
                        return Err(usage(format!(
                            "--gpu-policy: `{other}` is none of bounded, auto, naive"
                        )))
                    }
                };
                gpu_only = Some("--gpu-policy");
            }
            Long("gpu-no-baselines") => {
                a.gpu_baselines = false;
                gpu_only = Some("--gpu-no-baselines");
            }
            Long("gpu-ordinal") => {
                a.gpu_ordinal = value(p, "--gpu-ordinal", "a CUDA device ordinal")?;
                gpu_only = Some("--gpu-ordinal");
            }
            Long("svg") => a.svg = Some(PathBuf::from(p.value().map_err(usage)?)),
            Long("map") => a.map = Some(PathBuf::from(p.value().map_err(usage)?)),
            Long("device") => a.device = Some(value(p, "--device", "a device ordinal")?),
            Long("align") => {
                let v: u64 = value(p, "--align", "a power of two")?;
                if !v.is_power_of_two() {
                    return Err(usage(format!("--align: `{v}` is not a power of two")));
                }
                if v > cuarena::ArenaConfig::MAX_ALIGN {
                    return Err(usage(format!(
                        "--align: `{v}` is past the largest alignment, {}",
                        cuarena::ArenaConfig::MAX_ALIGN
                    )));
                }
                a.align = v;
            }
            Long("free-at") => {
                let v = p.value().map_err(usage)?;
                a.free_at = match v.to_string_lossy().as_ref() {
                    "completed" => FreePoint::Completed,
                    "first" => FreePoint::FirstFree,
                    other => {
                        return Err(usage(format!(
                            "--free-at: `{other}` is neither `completed` nor `first`"
                        )))
                    }
                };
            }
            Value(v) if trace.is_none() => trace = Some(PathBuf::from(v)),
            Value(v) => {
                return Err(usage(format!(
                    "unexpected argument `{}` (replay takes one TRACE)",
                    v.to_string_lossy()
                )))
            }
            other => return Err(usage(other.unexpected())),
        }
    }
    if let (Some(option), false) = (gpu_only, a.gpu) {
        return Err(usage(format!("{option} goes with --gpu")));
    }
    if a.json {
        let clash = [
            (a.gpu, "--gpu"),
            (a.svg.is_some(), "--svg"),
            (a.map.is_some(), "--map"),
            (a.capacity.is_some(), "--capacity"),
            (a.find_min, "--find-min"),
        ];
        if let Some((_, o)) = clash.iter().find(|c| c.0) {
            return Err(usage(format!(
                "--json prints the verdict alone; it does not go with {o}"
            )));
        }
    }
    a.trace = trace.ok_or_else(|| usage("replay: missing TRACE (a snapshot pickle or CSV)"))?;
    Ok(Command::Replay(a))
}

/// Parses `14GiB`, `512MiB`, `1000000` as bytes, `1.02` / `1.02x` as a ratio.
pub(crate) fn parse_capacity(s: &str) -> Res<Capacity> {
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
    let n: u64 = digits.trim().parse().map_err(|_| {
        usage(format!(
            "--capacity: `{s}` is neither a byte count nor a ratio"
        ))
    })?;
    match n.checked_mul(mult) {
        Some(0) => Err(usage(format!("--capacity: `{s}` is zero"))),
        Some(b) if b <= MAX_CAPACITY => Ok(Capacity::Bytes(b)),
        _ => Err(usage(format!(
            "--capacity: `{s}` is past the largest capacity a replay takes ({MAX_CAPACITY} B)"
        ))),
    }
}

fn parse_ratio(r: &str, orig: &str) -> Res<Capacity> {
    match r.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e6 => Ok(Capacity::Ratio(v)),
        _ => Err(usage(format!(
            "--capacity: `{orig}` is not a positive ratio (e.g. 1.02)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Res<Command> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn capacities() {
        assert_eq!(
            parse_capacity("14GiB").ok(),
            Some(Capacity::Bytes(14 << 30))
        );
        assert_eq!(
            parse_capacity("512m").ok(),
            Some(Capacity::Bytes(512 << 20))
        );
        assert_eq!(parse_capacity("1000").ok(), Some(Capacity::Bytes(1000)));
        assert_eq!(parse_capacity("1.02").ok(), Some(Capacity::Ratio(1.02)));
        assert_eq!(parse_capacity("2x").ok(), Some(Capacity::Ratio(2.0)));
        for bad in ["", "0", "-1", "1.0.0", "twelve", "0x", "99999999999999T"] {
            assert!(parse_capacity(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn replay_options() {
        let Ok(Command::Replay(a)) = parse_strs(&[
            "replay",
            "t.csv",
            "--find-min",
            "--capacity=1.5x",
            "--align",
            "512",
            "--free-at",
            "first",
        ]) else {
            panic!("should parse");
        };
        assert_eq!(a.trace, PathBuf::from("t.csv"));
        assert!(a.find_min && !a.gpu);
        assert_eq!(a.capacity, Some(Capacity::Ratio(1.5)));
        assert_eq!(a.align, 512);
        assert_eq!(a.free_at, FreePoint::FirstFree);
    }

    #[test]
    fn usage_errors_exit_2() {
        for bad in [
            &[][..],
            &["frobnicate"],
            &["replay"],
            &["replay", "a", "b"],
            &["replay", "a", "--bogus"],
            &["replay", "a", "--align", "300"],
            &["replay", "a", "--capacity"],
            &["replay", "a", "--check-all"],
            &["replay", "a", "--find-min=yes"],
        ] {
            match parse_strs(bad) {
                Err(e) => assert_eq!(e.exit_code(), 2, "{bad:?}: {e}"),
                Ok(c) => panic!("{bad:?} parsed as {c:?}"),
            }
        }
    }

    #[test]
    fn help() {
        for args in [&["--help"][..], &["-h"], &["help"]] {
            assert!(matches!(parse_strs(args), Ok(Command::Help(MAIN_HELP))));
        }
        for args in [
            &["help", "replay"][..],
            &["replay", "--help"],
            &["replay", "x", "-h"],
        ] {
            assert!(matches!(parse_strs(args), Ok(Command::Help(REPLAY_HELP))));
        }
    }
}
