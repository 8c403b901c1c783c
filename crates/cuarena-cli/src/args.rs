//! The command line: `cuarena [--help|--version]`, `cuarena help [COMMAND]`,
//! `cuarena replay TRACE [options]`, parsed with `lexopt`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::str::FromStr;

use cuarena_trace::trace::{Allocator, FreePoint};
use lexopt::prelude::*;

use crate::help::{MAIN_HELP, REPLAY_HELP};
use crate::{Failure, Res};

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
    /// `--elastic`: also replay on an elastic arena (no capacity).
    pub(crate) elastic: bool,
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
    /// The arena's policy (`--policy`): the verdict's capacity, the
    /// search, the pictures and the GPU replay run it.
    pub(crate) policy: Allocator,
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
        elastic: false,
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
        policy: Allocator::default(),
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
            Long("elastic") => a.elastic = true,
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
            Long("policy") => {
                let v = p.value().map_err(usage)?;
                let name = v.to_string_lossy();
                a.policy = Allocator::from_name(name.trim()).ok_or_else(|| {
                    let names: Vec<&str> = Allocator::ALL.iter().map(|a| a.name()).collect();
                    usage(format!(
                        "--policy: `{name}` is none of {}",
                        names.join(", ")
                    ))
                })?;
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
        ];
        if let Some((_, o)) = clash.iter().find(|c| c.0) {
            return Err(usage(format!(
                "--json prints the verdict alone (with --find-min, the smallest capacities \
                 too); it does not go with {o}"
            )));
        }
    }
    a.trace = trace.ok_or_else(|| usage("replay: missing TRACE (a snapshot pickle or CSV)"))?;
    Ok(Command::Replay(a))
}

/// The units `--capacity` takes, for its messages.
const CAPACITY_UNITS: &str = "bytes (15000000000), with a unit (B, KB, MB, GB, TB: powers of \
     1000; KiB, MiB, GiB, TiB or K, M, G, T: powers of 1024; e.g. 12GiB, 12GB, 11000MiB, 11.5GiB), \
     or a ratio of peak live bytes (1.02 or 1.02x)";

/// Parses `--capacity`: bytes with an optional unit, or a ratio of peak live
/// bytes (`1.02`, `1.02x`).
pub(crate) fn parse_capacity(s: &str) -> Res<Capacity> {
    let t = s.trim();
    if let Some(r) = t.strip_suffix(['x', 'X']) {
        return parse_ratio(r, s);
    }
    let lower = t.to_ascii_lowercase();
    let units: [(&str, u64); 13] = [
        ("kib", 1 << 10),
        ("mib", 1 << 20),
        ("gib", 1 << 30),
        ("tib", 1 << 40),
        ("kb", 1_000),
        ("mb", 1_000_000),
        ("gb", 1_000_000_000),
        ("tb", 1_000_000_000_000),
        ("k", 1 << 10),
        ("m", 1 << 20),
        ("g", 1 << 30),
        ("t", 1 << 40),
        ("b", 1),
    ];
    let unit = units
        .iter()
        .find_map(|(u, m)| lower.strip_suffix(u).map(|d| (d.trim(), *m)));
    let bad = || {
        usage(format!(
            "--capacity: `{s}` is not a capacity: give {CAPACITY_UNITS}"
        ))
    };
    let bytes = match unit {
        // A unit: whole or fractional numbers of it.
        Some((digits, mult)) => {
            if let Ok(n) = digits.parse::<u64>() {
                n.checked_mul(mult)
            } else {
                match digits.parse::<f64>() {
                    Ok(v) if v.is_finite() && v >= 0.0 && !digits.contains(['e', 'E']) => {
                        let b = v * mult as f64;
                        (b < MAX_CAPACITY as f64 * 2.0).then(|| b.ceil() as u64)
                    }
                    _ => return Err(bad()),
                }
            }
        }
        // No unit: a fraction is a ratio, a whole number bytes.
        None if t.contains('.') => return parse_ratio(t, s),
        None => Some(t.parse::<u64>().map_err(|_| bad())?),
    };
    match bytes {
        Some(0) => Err(usage(format!("--capacity: `{s}` is zero"))),
        Some(b) if b <= MAX_CAPACITY => Ok(Capacity::Bytes(b)),
        _ => Err(usage(format!(
            "--capacity: `{s}` is past the largest capacity a replay takes ({})",
            crate::units::exact(MAX_CAPACITY)
        ))),
    }
}

fn parse_ratio(r: &str, orig: &str) -> Res<Capacity> {
    match r.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e6 => Ok(Capacity::Ratio(v)),
        _ => Err(usage(format!(
            "--capacity: `{orig}` is not a positive ratio (e.g. 1.02); a capacity is \
             {CAPACITY_UNITS}"
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
        assert_eq!(
            parse_capacity("12GB").ok(),
            Some(Capacity::Bytes(12_000_000_000))
        );
        assert_eq!(
            parse_capacity("11000MiB").ok(),
            Some(Capacity::Bytes(11000 << 20))
        );
        assert_eq!(
            parse_capacity("11.5 GiB").ok(),
            Some(Capacity::Bytes(23 << 29))
        );
        assert_eq!(parse_capacity("4096B").ok(), Some(Capacity::Bytes(4096)));
        for bad in [
            "",
            "0",
            "-1",
            "1.0.0",
            "twelve",
            "0x",
            "99999999999999T",
            "12PB",
            "1e3GiB",
            "-2GiB",
        ] {
            assert!(parse_capacity(bad).is_err(), "{bad}");
        }
        let Err(e) = parse_capacity("12 gigs") else {
            panic!("parsed")
        };
        assert!(e.to_string().contains("KiB, MiB, GiB"), "{e}");
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
