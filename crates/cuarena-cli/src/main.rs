//! `cuarena`: the command-line tool for PyTorch users.
//!
//! ```text
//! cargo install --path crates/cuarena-cli   # or: cargo run --release -p cuarena-cli -- replay TRACE ...
//! cuarena replay TRACE --find-min   # would a compacting arena hold this trace?
//! ```
//!
//! `cuarena replay` reads a PyTorch memory snapshot
//! (`torch.cuda.memory._dump_snapshot`) or a CSV trace, replays its
//! allocations and frees on a metadata-only arena (placement and planning,
//! no bytes) and on two baselines, and prints peak live bytes, the smallest
//! arena capacity that completes, bytes moved and compactions; it can draw
//! the replay as SVG, and with `--gpu` replays with real bytes on a CUDA
//! arena against the CUDA memory pool and `cuMemAlloc`. See `--help`.

// First: its `outln!` macro is used by the modules after it.
#[macro_use]
mod out;

mod args;
mod elastic;
mod gpu;
#[cfg(feature = "cuda")]
mod gpu_table;
mod help;
mod model;
mod oom;
mod progress;
mod replay;
mod report;
mod screen;
mod units;
mod verdict;

use std::fmt;
use std::process::ExitCode;

use cuarena_trace::ToolError;

use args::Command;

/// Why the command failed; each kind has its own exit status.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The arena failed: it did not complete the trace at the capacity
    /// asked for, or a check of the bytes failed (exit 1).
    Arena(String),
    /// Bad command line (exit 2).
    Usage(String),
    /// The trace cannot be read or parsed, or an output file or stdout
    /// cannot be written (exit 3).
    Io(String),
    /// `--gpu` without a usable CUDA GPU (exit 4).
    NoGpu(String),
    /// Stdout was closed by its reader (`| head`): stop quietly, exit 0
    /// (see [`out`]).
    StdoutClosed,
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::Arena(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Io(_) => 3,
            Failure::NoGpu(_) => 4,
            Failure::StdoutClosed => 0,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Arena(m) | Failure::Usage(m) | Failure::Io(m) | Failure::NoGpu(m) => {
                f.write_str(m)
            }
            Failure::StdoutClosed => f.write_str("standard output closed"),
        }
    }
}

impl From<ToolError> for Failure {
    fn from(e: ToolError) -> Self {
        match e {
            // Record 0 is the whole file: say so without a record number.
            ToolError::Trace {
                path,
                record: 0,
                message,
            } => Failure::Io(format!("trace {path}: {message}")),
            // Byte counts in the units the screen uses, the exact count beside.
            ToolError::Limit {
                path,
                what,
                name,
                asked,
                limit,
            } if what.ends_with("in bytes") => Failure::Io(format!(
                "trace {path}: {} reached {}, past the limit {name} = {}",
                what.trim_end_matches(", in bytes"),
                units::exact(asked),
                units::exact(limit)
            )),
            // A program the trace made that cannot run is the trace's fault.
            ToolError::Trace { .. }
            | ToolError::Limit { .. }
            | ToolError::OutOfMemory { .. }
            | ToolError::Program { .. } => Failure::Io(e.to_string()),
            ToolError::Usage { .. } => Failure::Usage(e.to_string()),
            _ => Failure::Arena(e.to_string()),
        }
    }
}

pub(crate) type Res<T> = Result<T, Failure>;

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let command = match args::parse(args.iter().cloned()) {
        Ok(c) => c,
        Err(e) => {
            let help = match args.first() {
                Some(c) if c == "replay" => "cuarena replay --help",
                _ => "cuarena --help",
            };
            out::err_line(format_args!("cuarena: {e}\n(see `{help}`)"));
            return ExitCode::from(e.exit_code());
        }
    };
    let result = match command {
        Command::Help(text) => outln!("{text}"),
        Command::Version => outln!("cuarena {}", env!("CARGO_PKG_VERSION")),
        Command::Replay(a) if a.gpu => gpu::run(&a),
        Command::Replay(a) => replay::run(&a),
    };
    // The command's own failure first; else whether the last output got out.
    match result.and_then(|()| out::flush()) {
        Ok(()) | Err(Failure::StdoutClosed) => ExitCode::SUCCESS,
        Err(e) => {
            out::err_line(format_args!("cuarena: {e}"));
            ExitCode::from(e.exit_code())
        }
    }
}
