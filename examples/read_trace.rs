//! Reads trace files and prints, per file, the event count and a fingerprint
//! of every event (used to check that readers agree, and to measure a
//! reader's peak memory with `/usr/bin/time -v`).
//!
//! `cargo run --release --example read_trace -- FILE...`

use std::hash::{Hash, Hasher};

use cuarena::tools::trace::Trace;

fn main() {
    let mut failed = false;
    for arg in std::env::args().skip(1) {
        match Trace::read(std::path::Path::new(&arg)) {
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
                println!("{arg}: error: {e}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
