//! Reads trace files and prints, per file, the event count and a fingerprint
//! of every event (used to check that readers agree, and to measure a
//! reader's peak memory with `/usr/bin/time -v`).
//!
//! `cargo run --release -p cuarena-trace --example read_trace -- FILE...`
//!
//! Exit status: 0 when every file was read, 1 when one failed (its error
//! on stderr) or stdout cannot be written, 2 for a usage error (no file
//! given). Stdout closed by its reader (`| head`) stops it quietly, status 0.

use std::hash::{Hash, Hasher};
use std::io::{ErrorKind, Write};
use std::process::ExitCode;

use cuarena_trace::trace::Trace;

const USAGE: &str = "\
usage: read_trace FILE...

Reads each trace file (a snapshot pickle or a CSV, either one gzipped or not)
and prints its event count and a fingerprint of every event.

options:
  -h, --help    print this help and exit

exit status: 0 when every file was read (or stdout was closed by its reader),
1 when one failed, 2 for a usage error";

/// Prints a line; `Err` with the exit status when stdout is gone (`println!`
/// would panic): 0 for a reader that closed the pipe, 1 for another error.
fn say(line: std::fmt::Arguments<'_>) -> Result<(), ExitCode> {
    writeln!(std::io::stdout().lock(), "{line}").map_err(|e| {
        if e.kind() == ErrorKind::BrokenPipe {
            ExitCode::SUCCESS
        } else {
            eprintln!("read_trace: cannot write to stdout: {e}");
            ExitCode::FAILURE
        }
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        return say(format_args!("{USAGE}"))
            .err()
            .unwrap_or(ExitCode::SUCCESS);
    }
    if args.is_empty() {
        eprintln!("read_trace: no trace file given\n\n{USAGE}");
        return ExitCode::from(2);
    }
    let mut failed = false;
    for arg in &args {
        match Trace::read(std::path::Path::new(arg)) {
            Ok(t) => {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                for e in &t.events {
                    (
                        e.action.as_str(),
                        e.addr,
                        e.size,
                        e.stream,
                        e.time_us,
                        e.device,
                    )
                        .hash(&mut h);
                }
                if let Err(code) = say(format_args!(
                    "{arg}: {} events, fingerprint {:016x}",
                    t.events.len(),
                    h.finish()
                )) {
                    return code;
                }
            }
            Err(e) => {
                eprintln!("read_trace: {arg}: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
