//! Reads trace files and prints, per file, the event count and a fingerprint
//! of every event (used to check that readers agree, and to measure a
//! reader's peak memory with `/usr/bin/time -v`).
//!
//! `cargo run --release --example read_trace -- FILE...`
//!
//! Exit status: 0 when every file was read, 1 when one failed (its error
//! on stderr), 2 for a usage error (no file given).

use std::hash::{Hash, Hasher};
use std::process::ExitCode;

use cuarena::tools::trace::Trace;

const USAGE: &str = "\
usage: read_trace FILE...

Reads each trace file (a snapshot pickle or a CSV, either one gzipped or not)
and prints its event count and a fingerprint of every event.

options:
  -h, --help    print this help and exit

exit status: 0 when every file was read, 1 when one failed, 2 for a usage error";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
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
                println!(
                    "{arg}: {} events, fingerprint {:016x}",
                    t.events.len(),
                    h.finish()
                );
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
