//! The fragmentation bug report, solved.
//!
//! `cargo run --release --example demo` at the repository root (`-- --help`
//! says what it does)
//!
//! A training loop with variable batch sizes leaves free memory in holes;
//! then a tensor larger than the largest hole (but smaller than the free
//! bytes) is requested. A non-moving allocator of the same capacity fails;
//! cuarena compacts and succeeds, and every live tensor is verified. Runs on
//! the GPU when a CUDA driver is present, else on the host backend at a
//! smaller size.

use std::io::{ErrorKind, Write};
use std::process::ExitCode;
use std::time::Instant;

use cuarena::backend::cuda::CudaBackend;
use cuarena::backend::Backend;
use cuarena::plan::PlanKind;
use cuarena::{fmt_bytes, Arena, ArenaConfig, CompactionPolicy, Error};
use cuarena_demo::scenario::{self, ScenarioReport};
use cuarena_demo::Result;
use cuarena_trace::viz::{memory_map_svg, MemoryMap};

const HELP: &str = "\
demo: the fragmentation bug report, solved

usage: cargo run --release --example demo [-- --help]

A training loop with variable batch sizes (300 steps, batches 8..128, long-lived
cache tensors expiring at random) leaves the free memory in holes; then one
tensor larger than the largest hole, but smaller than the free bytes, is
requested. A non-moving allocator of the same capacity fails; cuarena compacts,
places it, and every live tensor is checked byte for byte. Two arenas of 4 GiB
on a CUDA GPU when one is present, else of 256 MiB on the host backend.
Writes out/demo_memory_map.svg (the arena before and after the request).

exit status: 0 when cuarena placed the tensor and every check passed, 1 when
not, 2 on a bad command line";

/// `println!` without its panic when stdout is gone (`demo | head`): a
/// reader that closed the pipe ends the demo quietly with status 0, as it
/// wants no more output; another write error ends it with status 1.
macro_rules! say {
    ($($arg:tt)*) => {
        say(format_args!($($arg)*))
    };
}

fn say(line: std::fmt::Arguments<'_>) {
    if let Err(e) = writeln!(std::io::stdout().lock(), "{line}") {
        if e.kind() == ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("demo: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

fn main() -> ExitCode {
    // One option: no argument parser (and no dependency) for it.
    match std::env::args_os().nth(1) {
        None => {}
        Some(a) if a == "-h" || a == "--help" => {
            say!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("demo: unexpected argument {other:?} (see `--help`)");
            return ExitCode::from(2);
        }
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    say!("cuarena demo: a training loop with variable batch sizes, then one big tensor\n");
    let started = Instant::now();
    match CudaBackend::available() {
        Ok(()) => {
            let cap = 4u64 << 30;
            let mut ours = Arena::cuda(ArenaConfig::new(cap), 0)?;
            let manual = ArenaConfig::new(cap).with_compaction(CompactionPolicy::Manual);
            let mut base = Arena::cuda(manual, 0)?;
            say!(
                "backend: CUDA ({}), two arenas of {} each",
                ours.backend().device_name(),
                fmt_bytes(cap)
            );
            return finish(&mut ours, &mut base, started);
        }
        Err(reason) => {
            say!("no CUDA GPU ({reason}): running on the host backend at a smaller size")
        }
    }
    let cap = 256u64 << 20;
    let mut ours = Arena::host(ArenaConfig::new(cap))?;
    let mut base = Arena::host(ArenaConfig::new(cap).with_compaction(CompactionPolicy::Manual))?;
    say!(
        "backend: host memory, two arenas of {} each (the strict test backend: it runs \
         every move as a random interleaving of 64-byte chunks to catch wrong plans, so its \
         timings say nothing about a GPU's)",
        fmt_bytes(cap)
    );
    finish(&mut ours, &mut base, started)
}

fn finish<B: Backend, C: Backend>(
    ours: &mut Arena<B>,
    base: &mut Arena<C>,
    started: Instant,
) -> Result<()> {
    let steps = 300;
    say!("running {steps} steps (batch sizes 8..128, 6 activations a step, long-lived cache tensors expiring at random)...");
    let r = scenario::run(ours, base, steps, &mut |line| say!("{line}"))?;
    print_report(&r);
    let svg = memory_map_svg(&[
        MemoryMap {
            title: "before the request: free memory in holes".into(),
            capacity_bytes: r.before.capacity_bytes,
            blocks: r.map_before.clone(),
        },
        MemoryMap {
            title: format!(
                "after: {} moved, one {} tensor placed",
                fmt_bytes(r.bytes_moved()),
                fmt_bytes(r.request_bytes)
            ),
            capacity_bytes: r.after.capacity_bytes,
            blocks: r.map_after.clone(),
        },
    ]);
    let dir = std::path::Path::new("out");
    let path = dir.join("demo_memory_map.svg");
    match std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, svg)) {
        Ok(()) => say!("memory map before/after: {}", path.display()),
        Err(e) => say!("could not write {}: {e}", path.display()),
    }
    say!("\n{}", ours.stats().summary());
    say!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Every figure of the report in one unit, chosen from the capacity, so the
/// columns compare at a glance.
#[derive(Clone, Copy)]
struct Unit {
    name: &'static str,
    bytes: f64,
}

impl Unit {
    fn for_capacity(capacity_bytes: u64) -> Unit {
        if capacity_bytes >= 4 << 30 {
            Unit {
                name: "GiB",
                bytes: (1u64 << 30) as f64,
            }
        } else {
            Unit {
                name: "MiB",
                bytes: (1u64 << 20) as f64,
            }
        }
    }

    fn of(self, b: u64) -> String {
        format!("{:.2} {}", b as f64 / self.bytes, self.name)
    }
}

/// Prints `rows` as a table with straight borders, the first row as its
/// header; columns marked in `right` are right-aligned (figures).
fn table(rows: &[Vec<String>], right: &[bool]) {
    let cols = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(w + 2)).collect();
    let rule = format!("|{}|", rule.join("+"));
    say!("{rule}");
    for (i, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (s, &w))| match right.get(c) {
                Some(true) => format!(" {s:>w$} "),
                _ => format!(" {s:<w$} "),
            })
            .collect();
        say!("|{}|", cells.join("|"));
        if i == 0 {
            say!("{rule}");
        }
    }
    say!("{rule}");
}

/// The baseline's answer, in the report's unit (the error's own message
/// counts bytes).
fn baseline_result(r: &ScenarioReport, unit: Unit) -> String {
    let why = match &r.baseline {
        Ok(()) => return "succeeded (no fragmentation failure this time)".into(),
        Err(Error::OutOfMemory {
            requested_bytes,
            free_bytes,
            largest_free_bytes,
            ..
        }) => format!(
            "out of memory: {} asked, {} free, largest hole {}",
            unit.of(*requested_bytes),
            unit.of(*free_bytes),
            unit.of(*largest_free_bytes)
        ),
        Err(e) => e.to_string(),
    };
    match r.baseline_failed_at {
        Some(step) if step < r.steps => format!("FAILED earlier, at loop step {step}: {why}"),
        _ => format!("FAILED: {why}"),
    }
}

fn print_report(r: &ScenarioReport) {
    let unit = Unit::for_capacity(r.before.capacity_bytes);
    let (ours, base) = (&r.before, &r.baseline_before);
    let same = !matches!(r.baseline_failed_at, Some(step) if step < r.steps);
    say!(
        "\nbefore the request ({}):",
        if same {
            "both arenas saw the same allocations and frees"
        } else {
            "the non-moving arena stopped at its failure"
        }
    );
    let row =
        |name: &str, f: &dyn Fn(&cuarena::Stats) -> String| vec![name.to_owned(), f(ours), f(base)];
    table(
        &[
            vec![String::new(), "cuarena".into(), "non-moving".into()],
            row("live tensors", &|s| s.live_blocks.to_string()),
            row("allocated", &|s| unit.of(s.allocated_bytes)),
            row("free", &|s| unit.of(s.free_bytes)),
            row("largest hole", &|s| unit.of(s.largest_free_bytes)),
            row("fragmentation", &|s| {
                format!("{:.1} %", 100.0 * s.fragmentation)
            }),
        ],
        &[false, true, true],
    );
    say!(
        "\nrequest: one tensor of {} (more than cuarena's largest hole, less than its free memory)\n",
        unit.of(r.request_bytes)
    );
    let kind = match r.kind() {
        Some(PlanKind::Targeted) => "targeted compaction",
        Some(PlanKind::Full) => "full compaction",
        None => "no compaction needed",
    };
    let ok = format!(
        "ok: {kind}, moved {} ({} blocks) in {:.2} ms of host time",
        unit.of(r.bytes_moved()),
        r.after.moves - r.before.moves,
        r.request_time.as_secs_f64() * 1e3
    );
    table(
        &[
            vec!["allocator".into(), "result".into()],
            vec!["non-moving, same capacity".into(), baseline_result(r, unit)],
            vec!["cuarena".into(), ok],
        ],
        &[],
    );
    say!(
        "\nverified: {} live tensors ({}) hold exactly their bytes after the compaction",
        r.verified.0,
        unit.of(r.verified.1)
    );
}
