//! The command line.

use std::ffi::OsString;
use std::path::PathBuf;

use lexopt::prelude::*;

use crate::Res;

pub const HELP: &str = "\
gpt2: GPT-2 small (124M) trained on one cuarena arena with cuBLAS

USAGE: cargo run --release -p cuarena-gpt2 -- [OPTIONS]

Without --init the run makes its own start: GPT-2's initialisation and
synthetic text, 100 steps, batch 4..16, length 64..1024 (no downloads).
`scripts/gpt2_reference.py init` writes the file PyTorch is compared on.

OPTIONS:
  --init FILE          initial weights and token batches (safetensors)
  --steps N            train the first N steps (default: all)
  --precision P        fp32 (default) or bf16 (GEMM operands in bf16,
                       f32 accumulation, as autocast)
  --mem M              arena, plain (cudarc allocations), elastic or both
                       (default: both, arena first; plain is the speed
                       baseline)
  --elastic            also run on an elastic arena (no capacity given:
                       it maps memory as the blocks need it and gives it
                       back), after each fixed arena run: tokens/s against
                       the fixed arena, and its peak mapped bytes against
                       its peak live bytes
  --headroom X         arena capacity over the run's peak live bytes
                       (default 1.0)
  --json FILE          write losses, gradient norms, speed and memory
  --check-grads FILE   compare the first step's gradients with FILE
                       (`scripts/gpt2_reference.py train --grads-out`)
  --repeat N           run each of --mem N times, alternating (default 1):
                       speed is the median run's; losses the first run's
  --every N            a progress line every N steps (default 10)
  --seed N             seed of the synthetic start (default 0)
  --world W            after each round of one-GPU runs, the same batches
                       data-parallel over W GPUs (one thread and arena per
                       GPU, gradient buckets all-reduced with NCCL during
                       the backward pass); compares the losses (first
                       runs) and the speed (medians); exits 1 if the losses
                       differ by more than the tolerances used against
                       PyTorch
  --dry                only the allocation sequence on a metadata arena
                       (no GPU): peak live bytes and predicted compactions
                       (with --world, each rank's too)
  -h, --help           this text

Without a CUDA GPU the run says so and exits 0.";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mem {
    Arena,
    Plain,
    /// An arena with no capacity (`ArenaConfig::elastic()`).
    Elastic,
}

impl Mem {
    pub fn name(self) -> &'static str {
        match self {
            Mem::Arena => "arena",
            Mem::Plain => "plain",
            Mem::Elastic => "elastic",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mems {
    One(Mem),
    Both,
}

impl Mems {
    pub fn list(self) -> Vec<Mem> {
        match self {
            Mems::One(m) => vec![m],
            Mems::Both => vec![Mem::Arena, Mem::Plain],
        }
    }
}

impl Settings {
    /// The runs of one round, in order: `--mem`'s, with `--elastic` the
    /// elastic arena's right after the fixed arena's (or last).
    pub fn mems(&self) -> Vec<Mem> {
        let mut list = self.mem.list();
        if self.elastic && !list.contains(&Mem::Elastic) {
            let at = list
                .iter()
                .position(|&m| m == Mem::Arena)
                .map_or(list.len(), |i| i + 1);
            list.insert(at, Mem::Elastic);
        }
        list
    }
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub init: Option<PathBuf>,
    pub steps: Option<usize>,
    pub bf16: bool,
    pub mem: Mems,
    pub headroom: f64,
    pub json: Option<PathBuf>,
    pub check_grads: Option<PathBuf>,
    pub every: usize,
    pub repeat: usize,
    /// `--elastic`: an elastic arena run beside the others.
    pub elastic: bool,
    pub world: usize,
    pub seed: u64,
    pub dry: bool,
}

fn num<T: std::str::FromStr>(v: OsString, what: &str) -> Res<T> {
    let s = v.into_string().map_err(|_| format!("{what}: not UTF-8"))?;
    s.parse()
        .map_err(|_| format!("{what}: `{s}` is not a valid number").into())
}

/// A path: any bytes the OS takes, but not something that looks like an
/// option (`--json --dry` is a missing value, not a file named `--dry`).
fn path(v: OsString, what: &str) -> Res<PathBuf> {
    if v.to_string_lossy().starts_with('-') {
        return Err(format!(
            "{what} needs a path; `{}` looks like an option",
            v.to_string_lossy()
        )
        .into());
    }
    Ok(PathBuf::from(v))
}

fn text(v: OsString, what: &str) -> Res<String> {
    Ok(v.into_string().map_err(|_| format!("{what}: not UTF-8"))?)
}

/// The settings, or `None` for `--help`.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Res<Option<Settings>> {
    let mut s = Settings {
        init: None,
        steps: None,
        bf16: false,
        mem: Mems::Both,
        headroom: 1.0,
        json: None,
        check_grads: None,
        every: 10,
        repeat: 1,
        elastic: false,
        world: 1,
        seed: 0,
        dry: false,
    };
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next()? {
        match arg {
            Long("init") => s.init = Some(path(p.value()?, "--init")?),
            Long("steps") => {
                let n: usize = num(p.value()?, "--steps")?;
                if n == 0 || n > crate::load::MAX_STEPS {
                    return Err(format!("--steps {n}: give 1 to {}", crate::load::MAX_STEPS).into());
                }
                s.steps = Some(n);
            }
            Long("precision") => {
                s.bf16 = match text(p.value()?, "--precision")?.as_str() {
                    "fp32" => false,
                    "bf16" => true,
                    other => return Err(format!("--precision `{other}`: fp32 or bf16").into()),
                }
            }
            Long("mem") => {
                s.mem = match text(p.value()?, "--mem")?.as_str() {
                    "arena" => Mems::One(Mem::Arena),
                    "plain" => Mems::One(Mem::Plain),
                    "elastic" => Mems::One(Mem::Elastic),
                    "both" => Mems::Both,
                    other => {
                        return Err(format!("--mem `{other}`: arena, plain, elastic or both").into())
                    }
                }
            }
            Long("headroom") => {
                let x: f64 = num(p.value()?, "--headroom")?;
                if !(1.0..=4.0).contains(&x) {
                    return Err(format!("--headroom {x}: give 1.0 to 4.0").into());
                }
                s.headroom = x;
            }
            Long("json") => s.json = Some(path(p.value()?, "--json")?),
            Long("check-grads") => s.check_grads = Some(path(p.value()?, "--check-grads")?),
            Long("every") => {
                s.every = num(p.value()?, "--every")?;
                if s.every == 0 {
                    return Err("--every 0: give at least 1".into());
                }
            }
            Long("repeat") => {
                s.repeat = num(p.value()?, "--repeat")?;
                if !(1..=20).contains(&s.repeat) {
                    return Err(format!("--repeat {}: give 1 to 20", s.repeat).into());
                }
            }
            Long("world") => {
                s.world = num(p.value()?, "--world")?;
                if !(1..=16).contains(&s.world) {
                    return Err(format!("--world {}: give 1 to 16", s.world).into());
                }
            }
            Long("elastic") => s.elastic = true,
            Long("seed") => s.seed = num(p.value()?, "--seed")?,
            Long("dry") => s.dry = true,
            Short('h') | Long("help") => return Ok(None),
            _ => return Err(arg.unexpected().into()),
        }
    }
    if s.world > 1 && !s.dry {
        if !cfg!(feature = "nccl") {
            return Err(format!(
                "--world {}: built without the `nccl` feature (cargo run --release -p cuarena-gpt2 --features nccl)",
                s.world
            )
            .into());
        }
        if matches!(s.mem, Mems::One(Mem::Plain | Mem::Elastic)) {
            return Err("--world runs on fixed arenas: give `--mem arena` or `both`".into());
        }
    }
    Ok(Some(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn bad_values_are_errors_that_name_the_option() {
        for (a, want) in [
            (&["--steps", "0"][..], "--steps"),
            (&["--precision", "fp16"][..], "fp32 or bf16"),
            (&["--mem", "cuda"][..], "arena, plain, elastic or both"),
            (&["--headroom", "0.5"][..], "--headroom"),
            (&["--every", "x"][..], "--every"),
            (&["--json", "--dry"][..], "looks like an option"),
        ] {
            let e = parse(args(a)).unwrap_err().to_string();
            assert!(e.contains(want), "{a:?}: {e}");
        }
        assert!(parse(args(&["--bogus"])).is_err());
        assert!(parse(args(&["--help"])).unwrap().is_none());
        let s = parse(args(&[
            "--precision",
            "bf16",
            "--mem",
            "arena",
            "--steps",
            "5",
        ]))
        .unwrap()
        .unwrap();
        assert!(s.bf16 && s.mem == Mems::One(Mem::Arena) && s.steps == Some(5));
        assert_eq!(s.mems(), vec![Mem::Arena]);
        let both = |a: &[&str]| parse(args(a)).unwrap().unwrap().mems();
        assert_eq!(
            both(&["--elastic"]),
            vec![Mem::Arena, Mem::Elastic, Mem::Plain]
        );
        assert_eq!(
            both(&["--mem", "plain", "--elastic"]),
            vec![Mem::Plain, Mem::Elastic]
        );
        assert_eq!(both(&["--mem", "elastic"]), vec![Mem::Elastic]);
    }
}
