//! A golden test of placement decisions: speed work on the index must not
//! change which free region a request goes to, nor when it fails.

use super::*;
use cuarena_testkit::Rng;

/// The placement decisions (every offset chosen and every failure) of a
/// fixed random program that exercises every path of `alloc` and
/// `alloc_high` (good fit, the padded retry, the exact scan, failures)
/// and every case of `free`, folded into one hash. Speed work must leave it
/// unchanged: the project's figures (bytes moved on recorded traces, the
/// policies' proofs) rest on these decisions.
#[test]
fn placement_decisions_are_unchanged() {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut fold = |x: u64| {
        for b in x.to_le_bytes() {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    let (mut served, mut failed) = (0u32, 0u32);
    for (seed, capacity) in [(1u64, 1u64 << 20), (2, 3 << 18), (3, 1 << 30)] {
        let mut rng = Rng::new(seed);
        let mut index = FreeIndex::new(capacity);
        let mut live: Vec<Allocation> = Vec::new();
        for step in 0..40_000u64 {
            // Allocate twice as often as free, so that the index runs
            // nearly full (where the exact scan and failures happen).
            if !live.is_empty() && rng.below(3) == 0 {
                let i = rng.below(live.len() as u64) as usize;
                let a = live.swap_remove(i);
                fold(a.offset());
                index.free(a).expect("a live allocation");
                continue;
            }
            // Log-uniform sizes from 1 B to capacity / 16, some of them
            // multiples of 256 B.
            let max_log = (capacity / 16).ilog2();
            let log = rng.below(u64::from(max_log) + 1);
            let mut size = 1 + rng.below(1 << log);
            if rng.below(2) == 0 {
                size = size.div_ceil(256) * 256;
            }
            let align = match rng.below(4) {
                0 => 1,
                1 => 256,
                _ => 1 << rng.below(13),
            };
            let high = rng.below(4) == 0;
            let a = if high {
                index.alloc_high(size, align)
            } else {
                index.alloc(size, align)
            };
            fold(step);
            match a {
                Some(a) => {
                    fold(a.offset());
                    served += 1;
                    live.push(a);
                }
                None => {
                    fold(u64::MAX);
                    failed += 1;
                }
            }
        }
        index.check_invariants().expect("invariants");
    }
    assert!(served > 50_000 && failed > 10_000, "{served} {failed}");
    assert_eq!(
        hash, 5_460_444_575_923_830_395,
        "placement decisions changed"
    );
}
