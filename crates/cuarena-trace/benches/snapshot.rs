//! Reading and replaying a 100 MB snapshot, as `cuarena replay` does: the
//! shipped real snapshot with Python stacks (`mlp_small_with_stacks.pickle`,
//! PyTorch 2.11) repeated with its addresses shifted until the pickle holds
//! about 100 MB, then read, turned into a program and replayed on the
//! arena at peak live and on the two baselines. Prints a table; the target
//! is 2 s in all.
//!
//! The big snapshot is written by Python's `pickle` (as PyTorch's
//! `_dump_snapshot` writes it: strings and dicts memoized, items batched)
//! when `python3` is on the PATH; otherwise by serde-pickle, whose layout
//! (no memo, so larger and cheaper to read per byte) the table names.
//!
//!     cargo bench -p cuarena-trace --bench snapshot

use std::collections::BTreeMap;
use std::time::Instant;

use cuarena::ArenaConfig;
use cuarena_trace::trace::{replay_with, Allocator, ReplayOptions, Trace};
use serde_pickle::{HashableValue, Value};

const TARGET_BYTES: usize = 100_000_000;

fn key(k: &str) -> HashableValue {
    HashableValue::String(k.to_owned())
}

/// The fixture with its events repeated (addresses shifted by 2^36 a copy,
/// so the copies never share a block) to about `TARGET_BYTES` of pickle.
fn big_snapshot() -> Vec<u8> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/mlp_small_with_stacks.pickle"
    );
    let bytes = std::fs::read(path).expect("the shipped fixture");
    let top = serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).unwrap();
    let Value::Dict(mut top) = top else {
        panic!("not a snapshot")
    };
    let Some(Value::List(devices)) = top.get(&key("device_traces")).cloned() else {
        panic!("no device_traces")
    };
    let Value::List(events) = &devices[0] else {
        panic!()
    };
    // serde-pickle repeats every string: about 2.2x Python's bytes.
    let copies = TARGET_BYTES / (2 * bytes.len()) + 1;
    let mut out = Vec::with_capacity(events.len() * copies);
    for c in 0..copies as i64 {
        for e in events {
            let mut e = e.clone();
            if let Value::Dict(d) = &mut e {
                if let Some(Value::I64(a)) = d.get_mut(&key("addr")) {
                    *a += c << 36;
                }
            }
            out.push(e);
        }
    }
    top.insert(key("device_traces"), Value::List(vec![Value::List(out)]));
    let top: BTreeMap<_, _> = top;
    serde_pickle::value_to_vec(&Value::Dict(top), serde_pickle::SerOptions::new()).unwrap()
}

/// The same snapshot written by Python's pickle, if `python3` runs.
fn python_snapshot(out: &std::path::Path) -> bool {
    let script = format!(
        r#"
import pickle
d = pickle.load(open({src:?}, "rb"))
ev = d["device_traces"][0]
one = len(pickle.dumps(ev, protocol=4))
out = []
for c in range(176 * {target} // (100 * one) + 1):
    for e in ev:
        e = dict(e)
        e["frames"] = [dict(f) for f in e.get("frames", [])]
        if "addr" in e:
            e["addr"] += c << 36
        out.append(e)
d["device_traces"][0] = out
pickle.dump(d, open({out:?}, "wb"), protocol=4)
"#,
        src = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/mlp_small_with_stacks.pickle"
        ),
        target = TARGET_BYTES,
        out = out.display().to_string(),
    );
    std::process::Command::new("python3")
        .args(["-c", &script])
        .status()
        .is_ok_and(|s| s.success())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("snapshot: bench");
        return;
    }
    let dir = std::env::temp_dir().join(format!("cuarena-bench-snapshot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.pickle");
    let writer = if python_snapshot(&path) {
        "Python pickle"
    } else {
        std::fs::write(&path, big_snapshot()).unwrap();
        "serde-pickle (no python3)"
    };
    let bytes = std::fs::read(&path).unwrap();
    println!("snapshot written by {writer}");
    println!(
        "| run | snapshot | events | read | program | 4 replays | total |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let mut best = f64::MAX;
    for run in 1..=3 {
        let t0 = Instant::now();
        let t = Trace::read(&path).unwrap();
        let read = t0.elapsed();
        let ops = t.ops(0).unwrap();
        let program = t0.elapsed() - read;
        let cap = ops.peak_live_rounded(256);
        let config = ArenaConfig::new(cap).with_alignment_bytes(256);
        for a in Allocator::ALL {
            let r =
                replay_with(&ops, &config, &ReplayOptions::default().with_allocator(a)).unwrap();
            assert!(a != Allocator::Bounded || r.completed());
        }
        let total = t0.elapsed();
        best = best.min(total.as_secs_f64());
        println!(
            "| {run} | {:.1} MB | {} | {:.3} s | {:.3} s | {:.3} s | {:.3} s |",
            bytes.len() as f64 / 1e6,
            t.events.len(),
            read.as_secs_f64(),
            program.as_secs_f64(),
            (total - read - program).as_secs_f64(),
            total.as_secs_f64()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("best total {best:.3} s (target: at most 2 s)");
}
