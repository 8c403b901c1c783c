//! Statistics and the human-readable summary.

use std::fmt::Write as _;
use std::time::Duration;

pub use super::policy::PolicyStats;
use crate::plan::PlanKind;

/// A snapshot of the arena's state and history.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Stats {
    /// Bytes of the region: in an elastic arena, those mapped now.
    pub capacity_bytes: u64,
    /// Highest `capacity_bytes` of an elastic arena (its peak mapped
    /// bytes); 0 for a fixed one.
    pub peak_mapped_bytes: u64,
    /// Trims that gave memory back ([`crate::Arena::trim`] and the
    /// automatic trim).
    pub trims: u64,
    /// Bytes reserved by live blocks (sizes rounded to the alignment).
    pub allocated_bytes: u64,
    /// Bytes asked for by live blocks.
    pub requested_bytes: u64,
    /// Bytes not reserved by any block.
    pub free_bytes: u64,
    /// Largest contiguous free region.
    pub largest_free_bytes: u64,
    /// `1 - largest_free / free`: 0 when all free space is one region.
    pub fragmentation: f64,
    /// Live blocks.
    pub live_blocks: u64,
    /// Free regions.
    pub free_regions: u64,
    /// Live blocks with at least one pin.
    pub pinned_blocks: u64,
    /// Highest `allocated_bytes` seen.
    pub peak_allocated_bytes: u64,
    /// Successful allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Allocations that failed (out of memory).
    pub failed_allocs: u64,
    /// Targeted compactions run (made room for one request).
    pub targeted_compactions: u64,
    /// Full compactions run.
    pub full_compactions: u64,
    /// Blocks moved, over all compactions.
    pub moves: u64,
    /// Bytes copied, over all compactions.
    pub bytes_moved: u64,
    /// Plans that moved blocks in pieces, through free space smaller than
    /// a block (`src/plan/pieces.rs`; counted in the compactions too).
    pub piece_plans: u64,
    /// Host time spent planning compactions.
    pub planning_time: Duration,
    /// Host time spent in compaction: planning plus executing (on the CUDA
    /// backend, executing means enqueueing: the copies run asynchronously).
    pub compaction_time: Duration,
    /// Blocks spilled to the host tier.
    pub evictions: u64,
    /// Blocks brought back from the host tier.
    pub restores: u64,
    /// Bytes copied device to host by spilling.
    pub bytes_evicted: u64,
    /// Bytes copied host to device by restoring.
    pub bytes_restored: u64,
    /// Bytes of the host tier holding spilled blocks now.
    pub host_tier_used_bytes: u64,
    /// Blocks of dropped [`Storage`](crate::Storage)s not freed yet: the
    /// arena frees them at its next allocation or compaction, or at
    /// `reclaim` (a pinned one at its last unpin). Storages dropped since
    /// the snapshot are not counted.
    pub pending_reclaim: u64,
    /// The compaction policy's bookkeeping: what naive moved, what is
    /// deferred or away from naive's layout, handovers.
    pub policy: PolicyStats,
}

/// What one compaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionReport {
    /// Targeted or full.
    pub kind: PlanKind,
    /// Blocks moved.
    pub moves: u64,
    /// Waves (kernel launches on the CUDA backend).
    pub waves: u64,
    /// Bytes copied.
    pub bytes_moved: u64,
    /// Host time planning.
    pub planning: Duration,
    /// Host time executing (enqueueing, on the CUDA backend).
    pub execution: Duration,
}

/// Formats bytes with a binary unit.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

impl Stats {
    /// A table in the spirit of `torch.cuda.memory_summary()`.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let line = "|-------------------------------+--------------------|";
        let row = |s: &mut String, k: &str, v: String| {
            let _ = writeln!(s, "| {k:<29} | {v:>18} |");
        };
        let _ = writeln!(s, "{line}");
        let _ = writeln!(s, "| {:<29} | {:>18} |", "cuarena memory summary", "");
        let _ = writeln!(s, "{line}");
        row(&mut s, "capacity", fmt_bytes(self.capacity_bytes));
        row(
            &mut s,
            "allocated (reserved)",
            fmt_bytes(self.allocated_bytes),
        );
        row(
            &mut s,
            "requested by live blocks",
            fmt_bytes(self.requested_bytes),
        );
        row(
            &mut s,
            "peak allocated",
            fmt_bytes(self.peak_allocated_bytes),
        );
        row(&mut s, "free", fmt_bytes(self.free_bytes));
        row(
            &mut s,
            "largest free hole",
            fmt_bytes(self.largest_free_bytes),
        );
        row(
            &mut s,
            "fragmentation",
            format!("{:.1} %", 100.0 * self.fragmentation),
        );
        let _ = writeln!(s, "{line}");
        row(&mut s, "live blocks", self.live_blocks.to_string());
        row(&mut s, "pinned blocks", self.pinned_blocks.to_string());
        row(&mut s, "free regions", self.free_regions.to_string());
        row(
            &mut s,
            "allocs / frees",
            format!("{} / {}", self.allocs, self.frees),
        );
        row(&mut s, "failed allocs", self.failed_allocs.to_string());
        let _ = writeln!(s, "{line}");
        row(
            &mut s,
            "compactions (targeted/full)",
            format!("{} / {}", self.targeted_compactions, self.full_compactions),
        );
        row(&mut s, "blocks moved", self.moves.to_string());
        row(&mut s, "bytes moved", fmt_bytes(self.bytes_moved));
        let p = &self.policy;
        if p.naive_bytes_moved > 0 || p.deferred_bytes > 0 || p.away_bytes > 0 {
            row(&mut s, "bytes naive moved", fmt_bytes(p.naive_bytes_moved));
            row(&mut s, "moves deferred", fmt_bytes(p.deferred_bytes));
            row(&mut s, "away from naive's layout", fmt_bytes(p.away_bytes));
            row(
                &mut s,
                "handovers (bytes)",
                format!("{} ({})", p.handovers, fmt_bytes(p.handover_bytes)),
            );
        }
        row(
            &mut s,
            "planning time",
            format!("{:.3} ms", self.planning_time.as_secs_f64() * 1e3),
        );
        row(
            &mut s,
            "compaction time",
            format!("{:.3} ms", self.compaction_time.as_secs_f64() * 1e3),
        );
        if self.evictions + self.restores > 0 || self.host_tier_used_bytes > 0 {
            let _ = writeln!(s, "{line}");
            row(
                &mut s,
                "spilled / restored blocks",
                format!("{} / {}", self.evictions, self.restores),
            );
            row(&mut s, "bytes spilled", fmt_bytes(self.bytes_evicted));
            row(&mut s, "bytes restored", fmt_bytes(self.bytes_restored));
            row(
                &mut s,
                "host tier in use",
                fmt_bytes(self.host_tier_used_bytes),
            );
        }
        let _ = writeln!(s, "{line}");
        s
    }
}

impl std::fmt::Display for Stats {
    /// The table of [`Stats::summary`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.summary())
    }
}

impl std::fmt::Display for CompactionReport {
    /// One line: kind, blocks and bytes moved, waves, host times.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            PlanKind::Targeted => "targeted",
            PlanKind::Full => "full",
        };
        write!(
            f,
            "{kind} compaction: {} block(s), {} moved in {} wave(s); planning {:.3} ms, execution {:.3} ms",
            self.moves,
            fmt_bytes(self.bytes_moved),
            self.waves,
            self.planning.as_secs_f64() * 1e3,
            self.execution.as_secs_f64() * 1e3,
        )
    }
}
