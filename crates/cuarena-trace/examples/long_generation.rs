//! A decoder generating for a long time, as a program of allocations: its
//! per-layer key and value caches grow by one token a step, each new cache
//! allocated while the one it replaces is live, with a temporary beside
//! it. Replays it on an elastic metadata arena and prints the elastic
//! checks of `cuarena replay --elastic` (BENCHMARKS.md, "Recordings not
//! used in the design": the limit this shows).
//!
//!     cargo run --release -p cuarena-trace --example long_generation -- \
//!         [LAYERS [STEPS [FIRST_KIB [GROWTH_KIB [SLACK_PERCENT]]]]]
//!
//! Defaults: 12 layers, 400 steps of 20 ms, caches of 1024 KiB growing by
//! 16 KiB a step, 20 MiB of weights per layer, the arena's slack (1%).

use cuarena::ArenaConfig;
use cuarena_trace::trace::elastic::{naive_bytes_moved_at_peak_live, replay_elastic};
use cuarena_trace::trace::{Op, Ops};

const MIB: f64 = 1048576.0;

/// Most layers x steps a program may have (16 Mi ops).
const MAX_LAYER_STEPS: u64 = 1 << 21;

fn arg(i: usize, default: u64) -> Result<u64, String> {
    match std::env::args().nth(i) {
        None => Ok(default),
        Some(s) => s
            .parse()
            .map_err(|_| format!("argument {i} ({s:?}) is not a whole number")),
    }
}

/// The program, and each op's time in microseconds.
fn program(layers: u64, steps: u64, first: u64, growth: u64) -> (Vec<Op>, Vec<i64>) {
    let (mut ops, mut times) = (Vec::new(), Vec::new());
    let mut next = 0u32;
    let mut now = 0i64;
    let mut alloc = |ops: &mut Vec<Op>, times: &mut Vec<i64>, size: u64, now: i64| {
        ops.push(Op::Alloc { id: next, size });
        times.push(now);
        next += 1;
        next - 1
    };
    for _ in 0..layers {
        alloc(&mut ops, &mut times, 20 << 20, now);
    }
    let mut caches: Vec<u32> = (0..2 * layers)
        .map(|_| alloc(&mut ops, &mut times, first, now))
        .collect();
    for step in 1..=steps {
        now += 20_000;
        for cache in caches.iter_mut() {
            let tmp = alloc(&mut ops, &mut times, 1 << 20, now);
            let grown = alloc(&mut ops, &mut times, first + step * growth, now);
            ops.push(Op::Free { id: *cache });
            ops.push(Op::Free { id: tmp });
            times.extend([now, now]);
            *cache = grown;
            now += 10;
        }
    }
    (ops, times)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let layers = arg(1, 12)?.clamp(1, 1024);
    let steps = arg(2, 400)?.clamp(1, 100_000);
    let first = arg(3, 1024)?.clamp(1, 1 << 20) << 10;
    let growth = arg(4, 16)?.min(1 << 20) << 10;
    // Four ops per cache per step: bound the program's memory.
    if layers * steps > MAX_LAYER_STEPS {
        return Err(format!(
            "{layers} layers x {steps} steps is {} layer-steps; at most {MAX_LAYER_STEPS}",
            layers * steps
        )
        .into());
    }
    let d = ArenaConfig::elastic();
    let slack = match std::env::args().nth(5) {
        None => d.elastic_slack,
        Some(s) => match s.parse::<f64>() {
            Ok(p) if (0.0..=100.0).contains(&p) => p / 100.0,
            _ => return Err(format!("SLACK_PERCENT ({s:?}) is not a number from 0 to 100").into()),
        },
    };
    let (program, times) = program(layers, steps, first, growth);
    let mut ops = Ops::from_ops(program);
    ops.time_us = times;
    let r = replay_elastic(&ops, d.alignment_bytes, d.trim_window_us, slack)?;
    let naive = naive_bytes_moved_at_peak_live(&ops, d.alignment_bytes)?.unwrap_or(0);
    let peak = r.peak_live_bytes as f64;
    let wpeak = r.mean_window_peak_live_bytes.max(1) as f64;
    let allowed_moves = naive as f64 + 2.0 * peak;
    println!(
        "{layers} layers, {steps} steps, caches {} KiB + {} KiB a step; window {} us, slack {slack}",
        first >> 10,
        growth >> 10,
        r.window_us
    );
    println!(
        "peak mapped / peak live {:.4} (the check: at most {:.4})",
        r.peak_mapped_bytes as f64 / peak,
        1.0 + (2.0 * MIB).max(0.01 * peak) / peak
    );
    println!(
        "mean mapped / mean window peak {:.4} (the check: at most {:.4})",
        r.mean_mapped_bytes as f64 / wpeak,
        1.02 + 2.0 * MIB / wpeak
    );
    println!(
        "moved {:.1} MiB (the check: at most {:.1} MiB, naive at peak live {:.1} MiB + 2 x peak live)",
        r.bytes_moved as f64 / MIB,
        allowed_moves / MIB,
        naive as f64 / MIB
    );
    Ok(())
}
