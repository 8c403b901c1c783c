//! The fragmentation bug report, solved.
//!
//! `cargo run --release --example demo` (`-- --help` says what it does)
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

use cuarena::backend::Backend;
use cuarena::tools::scenario::{self, ScenarioReport};
use cuarena::tools::viz::{memory_map_svg, MemoryMap};
use cuarena::{fmt_bytes, Arena, ArenaConfig};

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
    match lexopt::Parser::from_env().next() {
        Ok(None) => {}
        Ok(Some(lexopt::Arg::Short('h') | lexopt::Arg::Long("help"))) => {
            say!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Ok(Some(other)) => {
            eprintln!("demo: {} (see `--help`)", other.unexpected());
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("demo: {e} (see `--help`)");
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

fn run() -> cuarena::tools::Result<()> {
    say!("cuarena demo: a training loop with variable batch sizes, then one big tensor\n");
    let started = Instant::now();
    #[cfg(feature = "cuda")]
    {
        use cuarena::backend::cuda::CudaBackend;
        match CudaBackend::available() {
            Ok(()) => {
                let cap = 4u64 << 30;
                let mut ours = Arena::cuda(ArenaConfig::new(cap), 0)?;
                let mut base = Arena::cuda(ArenaConfig::new(cap), 0)?;
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
    }
    let cap = 256u64 << 20;
    let mut ours = Arena::host(ArenaConfig::new(cap))?;
    let mut base = Arena::host(ArenaConfig::new(cap))?;
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
) -> cuarena::tools::Result<()> {
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
    say!("\n{}", ours.summary());
    say!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn print_report(r: &ScenarioReport) {
    let b = &r.before;
    say!("\nbefore the request (both arenas saw the same allocations):");
    say!(
        "  live tensors {:>10}   allocated {:>12}",
        b.live_blocks,
        fmt_bytes(b.allocated_bytes)
    );
    say!(
        "  free {:>18}   largest hole {:>9}   fragmentation {:.1} %",
        fmt_bytes(b.free_bytes),
        fmt_bytes(b.largest_free_bytes),
        100.0 * b.fragmentation
    );
    say!("\nrequest: one tensor of {}\n", fmt_bytes(r.request_bytes));
    say!("| allocator                   | result                                            |");
    say!("|-----------------------------+---------------------------------------------------|");
    let base = match (&r.baseline, r.baseline_failed_at) {
        (Err(e), Some(step)) if step == r.steps => format!("FAILED: {e}"),
        (Err(e), Some(step)) => format!("FAILED earlier, at loop step {step}: {e}"),
        _ => "succeeded (no fragmentation failure this time)".into(),
    };
    say!("| non-moving, same capacity   | {base}");
    let kind = match r.kind() {
        Some(cuarena::plan::PlanKind::Targeted) => "targeted compaction",
        Some(cuarena::plan::PlanKind::Full) => "full compaction",
        None => "no compaction needed",
    };
    say!(
        "| cuarena                     | ok: {kind}, moved {} ({} blocks); the request took {:.2} ms of host time",
        fmt_bytes(r.bytes_moved()),
        r.after.moves - r.before.moves,
        r.request_time.as_secs_f64() * 1e3
    );
    say!(
        "\nverified: {} live tensors ({}) hold exactly their bytes after the compaction",
        r.verified.0,
        fmt_bytes(r.verified.1)
    );
}
