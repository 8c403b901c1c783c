//! Bytes moved against naive compact-on-failure on every trace, checked at
//! every prefix: `Auto` never more, the default never more than naive plus
//! twice the peak live bytes, and neither anything where a non-moving
//! segregated fit needs nothing.

use cuarena::backend::MetaBackend;
use cuarena::{Arena, ArenaConfig, CompactionPolicy, Error, Handle};
use cuarena_trace::trace::{Op, Ops};

/// One allocator of a lockstep replay: its arena and handles.
struct Run {
    arena: Arena<MetaBackend>,
    handles: Vec<Option<Handle>>,
    /// Compact on out-of-memory and retry (naive), as the replays do.
    compact_on_oom: bool,
    /// Stopped at a failed allocation.
    failed: bool,
}

impl Run {
    fn new(ops: &Ops, config: ArenaConfig, compact_on_oom: bool) -> Run {
        Run {
            arena: Arena::metadata(config).expect("arena"),
            handles: vec![None; ops.sizes.len()],
            compact_on_oom,
            failed: false,
        }
    }

    fn op(&mut self, op: Op) {
        if self.failed {
            return;
        }
        match op {
            Op::Alloc { size: 0, .. } => {}
            Op::Alloc { id, size } => {
                let r = match self.arena.alloc(size) {
                    Err(Error::OutOfMemory { .. }) if self.compact_on_oom => {
                        self.arena.compact().expect("compact");
                        self.arena.alloc(size)
                    }
                    r => r,
                };
                match r {
                    Ok(h) => self.handles[id as usize] = Some(h),
                    Err(_) => self.failed = true,
                }
            }
            Op::Free { id } => {
                if let Some(h) = self.handles[id as usize].take() {
                    self.arena.free(h).expect("free");
                }
            }
        }
    }

    fn moved(&self) -> u64 {
        self.arena.stats().bytes_moved
    }
}

/// A row of the table: bytes moved by the default, `Auto` and naive, and
/// whether a non-moving segregated fit completes.
struct Row {
    bounded: u64,
    auto: u64,
    naive: u64,
    non_moving_completes: bool,
}

/// Replays `ops` at `cap` on the default policy, `Auto`, naive and a
/// non-moving segregated fit side by side, and checks at every op, while
/// naive serves: no request failed; both policies count naive's bytes as
/// naive moved them; `Auto` has moved plus deferred at most naive's bytes;
/// the default has moved plus owed at most naive's plus twice the peak.
fn lockstep(name: &str, ops: &Ops, cap: u64) -> Row {
    let config = ArenaConfig::new(cap);
    let mut bounded = Run::new(ops, config.clone(), false);
    let mut auto = Run::new(
        ops,
        config.clone().with_compaction(CompactionPolicy::Auto),
        false,
    );
    let mut naive = Run::new(
        ops,
        config.clone().with_compaction(CompactionPolicy::Manual),
        true,
    );
    let mut fixed = Run::new(ops, config.with_compaction(CompactionPolicy::Manual), false);
    for (i, &op) in ops.ops.iter().enumerate() {
        bounded.op(op);
        auto.op(op);
        naive.op(op);
        fixed.op(op);
        if naive.failed {
            break;
        }
        assert!(
            !auto.failed && !bounded.failed,
            "{name} at {cap} B: op {i} failed where naive did not"
        );
        let st = auto.arena.stats();
        let p = &st.policy;
        assert!(
            st.bytes_moved + p.deferred_bytes <= p.naive_bytes_moved
                && p.naive_bytes_moved == naive.moved(),
            "{name} at {cap} B, op {i}: Auto moved {} + deferred {} against naive {} (counted {})",
            st.bytes_moved,
            p.deferred_bytes,
            naive.moved(),
            p.naive_bytes_moved
        );
        let b = bounded.arena.stats();
        let p = &b.policy;
        let owed = p.deferred_bytes + 2 * p.away_bytes;
        assert!(
            p.naive_failures == 0
                && p.naive_bytes_moved == naive.moved()
                && b.bytes_moved + owed <= naive.moved() + 2 * b.peak_allocated_bytes,
            "{name} at {cap} B, op {i}: the default's bound: {b:?}"
        );
    }
    assert!(
        !naive.failed && !auto.failed && !bounded.failed,
        "{name} at {cap} B"
    );
    Row {
        bounded: bounded.moved(),
        auto: auto.moved(),
        naive: naive.moved(),
        non_moving_completes: !fixed.failed,
    }
}

/// Bytes moved by the default and `Auto` against naive compact-on-failure
/// on every shipped trace at 1.00, 1.01 and 1.05 x peak live (and 1.001),
/// and two synthetic programs, checked at every prefix (see [`lockstep`]),
/// and nothing moved at a capacity where a non-moving segregated fit
/// completes. Prints the table (`--nocapture`) and the median ratios.
#[test]
fn bytes_moved_against_naive() {
    let mut traces = super::all_traces();
    traces.push(("synthetic training 100k".into(), super::synthetic(100_000)));
    traces.push(("steady 100k".into(), super::steady(100_000, 1 << 30)));
    println!(
        "{:<34} {:>5} {:>14} {:>14} {:>7} {:>14} {:>7}",
        "trace", "cap", "bounded B", "naive B", "ratio", "auto B", "ratio"
    );
    // (name, capacity ratio, bounded / naive), where naive moves anything.
    let mut ratios: Vec<(String, f64, f64)> = Vec::new();
    for (name, ops) in &traces {
        let peak = ops.peak_live_rounded(256);
        for ratio in [1.0, 1.001, 1.01, 1.05] {
            let cap = ((peak as f64 * ratio) as u64).div_ceil(256) * 256;
            let row = lockstep(name, ops, cap);
            let of = |b: u64| b as f64 / row.naive.max(1) as f64;
            println!(
                "{name:<34} {ratio:>5.3} {:>14} {:>14} {:>7.3} {:>14} {:>7.3}",
                row.bounded,
                row.naive,
                of(row.bounded),
                row.auto,
                of(row.auto)
            );
            assert!(row.auto <= row.naive, "{name} at {ratio}");
            assert!(
                !row.non_moving_completes || (row.auto == 0 && row.bounded == 0),
                "{name} at {ratio}: a non-moving segregated fit completes, the arena moved {} B",
                row.auto.max(row.bounded)
            );
            if row.naive > 0 {
                ratios.push((name.clone(), ratio, of(row.bounded)));
            }
        }
    }
    let mut v: Vec<f64> = ratios
        .iter()
        .filter(|r| [1.0, 1.01, 1.05].contains(&r.1) && !r.0.contains(' '))
        .map(|r| r.2)
        .collect();
    v.sort_by(f64::total_cmp);
    let median = v.get(v.len() / 2).copied().unwrap_or(0.0);
    println!(
        "the default's median ratio where naive moves, at 1.00/1.01/1.05, over the shipped \
         traces: {median:.3}"
    );
}
