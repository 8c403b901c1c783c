//! The PyTorch caching-allocator model on snapshots: for each file and
//! device, the recorded segment events and reserved peak beside the
//! model's under the recorded settings, then the other settings tried.
//!
//! ```text
//! cargo run --release -p cuarena-trace --example pytorch_model -- FILE...
//! ```

use cuarena_trace::pytorch::Session;
use cuarena_trace::trace::Trace;

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let what_if = std::env::args().any(|a| a == "--what-if");
    for path in std::env::args().skip(1).filter(|a| a != "--what-if") {
        let t = Trace::read(std::path::Path::new(&path))?;
        let name = std::path::Path::new(&path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for device in t.devices() {
            let s = Session::new(&t, device)?;
            let truth = s.truth();
            let m = s.recorded();
            let (te, me) = (truth.segment_events, m.segment_events);
            let err = m.reserved_peak_bytes as f64 / truth.reserved_peak_bytes.max(1) as f64 - 1.0;
            println!(
                "{name} d{device} [{}] alloc {}/{} ({:.3}/{:.3} GiB) free {}/{} map {}/{} ({:.3}/{:.3}) unmap {}/{} | peak {:.4}/{:.4} GiB {:+.3}% | init {:.3}/{:?} | ooms {}/{} unplaced {} empty_cache {}",
                m.settings,
                te.alloc, me.alloc, gib(te.alloc_bytes), gib(me.alloc_bytes),
                te.free, me.free, te.map, me.map, gib(te.map_bytes), gib(me.map_bytes),
                te.unmap, me.unmap,
                gib(truth.reserved_peak_bytes), gib(m.reserved_peak_bytes), err * 100.0,
                gib(m.reserved_initial_bytes), truth.reserved_initial_bytes.map(gib),
                truth.ooms, m.ooms.len(), m.unplaced_initial_blocks, m.empty_cache_events.len()
            );
            if what_if {
                for r in s.what_if()?.iter().skip(1) {
                    println!(
                        "    {:<32} peak {:.4} GiB  ooms {}",
                        r.settings.to_string(),
                        gib(r.reserved_peak_bytes),
                        r.ooms.len()
                    );
                }
            }
        }
    }
    Ok(())
}
