//! The bounds of `CompactionPolicy::Auto` and `Auto` against naive
//! compact-on-failure (best-fit placement, one full compaction when a
//! request fits in no hole, as the replays run it), on random programs
//! checked at every prefix: `Auto` never more bytes moved, `Budgeted` never
//! more than naive plus its handover and overrun bytes (the handover at
//! most twice the bytes live then), and neither any at all where a
//! non-moving best fit serves every request. See `cuarena::plan::lag` for
//! the argument, and for the one request `Budgeted` may fail where naive
//! serves it (before its handover, which could not be staged).
//!
//! `CUARENA_BOUND_POLICY=targeted` runs the same properties on the targeted
//! policy, which they do not hold for (a counterexample is kept below).

use cuarena::backend::{HostBackend, MetaBackend};
use cuarena::{Arena, ArenaConfig, CompactionPolicy, Error, Handle};
use proptest::prelude::*;

/// One step of a program. Indices pick a live block modulo the live count.
#[derive(Debug, Clone)]
enum Step {
    Alloc { size: u64, align_log2: u8 },
    Free { idx: usize },
    Pin { idx: usize },
    Unpin { idx: usize },
}

fn step() -> impl Strategy<Value = Step> {
    let size = prop_oneof![
        50 => 1u64..4096,
        30 => 4096u64..65536,
        15 => 65536u64..524_288,
        5 => 524_288u64..2_097_152,
    ];
    // Mostly the arena's alignment (256 B), some up to 64 KiB.
    let align_log2 = prop_oneof![85 => Just(0u8), 15 => 1u8..=8];
    prop_oneof![
        55 => (size, align_log2).prop_map(|(size, align_log2)| Step::Alloc { size, align_log2 }),
        40 => any::<usize>().prop_map(|idx| Step::Free { idx }),
        3 => any::<usize>().prop_map(|idx| Step::Pin { idx }),
        2 => any::<usize>().prop_map(|idx| Step::Unpin { idx }),
    ]
}

/// Capacity `factor` x the program's peak of reserved bytes (sizes rounded
/// to 256 B; alignment padding not counted, so near 1.0 some programs end
/// early where naive fails).
fn capacity(steps: &[Step], factor: f64) -> u64 {
    let (mut live, mut peak, mut sizes) = (0u64, 0u64, Vec::new());
    for s in steps {
        match *s {
            Step::Alloc { size, .. } => {
                let r = size.div_ceil(256) * 256;
                sizes.push(r);
                live += r;
                peak = peak.max(live);
            }
            Step::Free { idx } if !sizes.is_empty() => live -= sizes.swap_remove(idx % sizes.len()),
            _ => {}
        }
    }
    (((peak.max(256) as f64) * factor) as u64).div_ceil(256) * 256
}

/// A live block of both arenas.
struct Live {
    arena: Handle,
    naive: Handle,
    seed: u8,
    size: u64,
    pins: u32,
}

fn pattern(seed: u8, size: u64) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Runs `steps` on an arena of `policy` (host backend: plans are executed
/// strictly and every block's bytes are checked at the end) and on naive
/// (metadata backend), until naive fails a request. After every step the
/// arena must have moved no more bytes than naive. `Err` names the first
/// step where it did.
fn against_naive(steps: &[Step], cap: u64, policy: CompactionPolicy) -> Result<(), String> {
    let config = ArenaConfig::new(cap);
    let mut arena = Arena::with_backend(
        config.clone().with_compaction(policy),
        HostBackend::new(cap).expect("backend"),
    )
    .expect("arena");
    let mut naive =
        Arena::<MetaBackend>::metadata(config.with_compaction(CompactionPolicy::Manual))
            .expect("naive");
    let mut live: Vec<Live> = Vec::new();
    let mut handover = 0;
    for (i, s) in steps.iter().enumerate() {
        match *s {
            Step::Alloc { size, align_log2 } => {
                let align = 256u64 << align_log2;
                let n = match naive.alloc_aligned(size, align) {
                    Err(Error::OutOfMemory { .. }) => {
                        naive.compact().expect("compact");
                        naive.alloc_aligned(size, align)
                    }
                    r => r,
                };
                let Ok(n) = n else {
                    break; // naive fails: the comparison ends here
                };
                let a = match arena.alloc_aligned(size, align) {
                    Ok(a) => a,
                    // `Budgeted`'s documented gap: only before its handover.
                    Err(Error::OutOfMemory { .. })
                        if policy == CompactionPolicy::Budgeted
                            && arena.stats().handover_bytes == 0 =>
                    {
                        break;
                    }
                    Err(e) => {
                        return Err(format!(
                            "step {i}: the arena failed where naive did not: {e}"
                        ))
                    }
                };
                let seed = i as u8;
                arena.write(a, &pattern(seed, size)).expect("write");
                live.push(Live {
                    arena: a,
                    naive: n,
                    seed,
                    size,
                    pins: 0,
                });
            }
            Step::Free { idx } if !live.is_empty() => {
                let k = idx % live.len();
                if live[k].pins == 0 {
                    let b = live.swap_remove(k);
                    arena.free(b.arena).expect("free");
                    naive.free(b.naive).expect("free");
                }
            }
            Step::Pin { idx } if !live.is_empty() => {
                let n = live.len();
                let b = &mut live[idx % n];
                arena.pin(b.arena).expect("pin");
                naive.pin(b.naive).expect("pin");
                b.pins += 1;
            }
            Step::Unpin { idx } if !live.is_empty() => {
                let n = live.len();
                let b = &mut live[idx % n];
                if b.pins > 0 {
                    arena.unpin(b.arena).expect("unpin");
                    naive.unpin(b.naive).expect("unpin");
                    b.pins -= 1;
                }
            }
            _ => {}
        }
        let (a, n) = (arena.stats(), naive.stats());
        // `Auto`'s additive terms (0 under the other policies).
        let extra = a.handover_bytes + a.overrun_bytes;
        if a.bytes_moved > n.bytes_moved + extra {
            return Err(format!(
                "step {i}: the arena moved {} B, naive {} B",
                a.bytes_moved, n.bytes_moved
            ));
        }
        if a.handover_bytes > handover {
            // The handover ran at this step: one relayout of the live blocks.
            handover = a.handover_bytes;
            assert!(
                handover <= 2 * a.allocated_bytes,
                "step {i}: handover of {handover} B with {} B live",
                a.allocated_bytes
            );
        }
        assert_eq!(a.handover_bytes, handover, "step {i}: a second handover");
        if matches!(policy, CompactionPolicy::Budgeted | CompactionPolicy::Auto) {
            // The arena's own count of naive's bytes is naive's, and what it
            // moved plus what it deferred is covered by it.
            assert_eq!(a.naive_bytes_moved, n.bytes_moved, "step {i}");
            assert!(
                a.bytes_moved + a.deferred_bytes <= a.naive_bytes_moved + extra,
                "step {i}"
            );
            assert_eq!(a.naive_failures, 0, "step {i}");
        }
    }
    for b in &live {
        assert_eq!(
            arena.read::<u8>(b.arena).expect("read"),
            pattern(b.seed, b.size),
            "bytes of a block"
        );
    }
    Ok(())
}

/// Runs `steps` on `a` without compacting on failure; calls `after` after
/// every step. Returns whether every request was served.
fn run_plain(
    steps: &[Step],
    a: &mut Arena<MetaBackend>,
    mut after: impl FnMut(&Arena<MetaBackend>),
) -> bool {
    let mut live: Vec<(Handle, u32)> = Vec::new();
    for s in steps {
        match *s {
            Step::Alloc { size, align_log2 } => match a.alloc_aligned(size, 256 << align_log2) {
                Ok(h) => live.push((h, 0)),
                Err(_) => return false,
            },
            Step::Free { idx } if !live.is_empty() => {
                let k = idx % live.len();
                if live[k].1 == 0 {
                    a.free(live.swap_remove(k).0).expect("free");
                }
            }
            Step::Pin { idx } if !live.is_empty() => {
                let k = idx % live.len();
                live[k].1 += 1;
                a.pin(live[k].0).expect("pin");
            }
            Step::Unpin { idx } if !live.is_empty() => {
                let k = idx % live.len();
                if live[k].1 > 0 {
                    live[k].1 -= 1;
                    a.unpin(live[k].0).expect("unpin");
                }
            }
            _ => {}
        }
        after(a);
    }
    true
}

/// Whether a non-moving best fit (a manual arena that never compacts)
/// serves every request of `steps` at `cap`.
fn non_moving_completes(steps: &[Step], cap: u64) -> bool {
    let config = ArenaConfig::new(cap).with_compaction(CompactionPolicy::Manual);
    run_plain(steps, &mut Arena::metadata(config).expect("arena"), |_| {})
}

/// The policies under test: `Auto` and `Budgeted` (or the targeted one, to
/// see it fail).
fn policies() -> Vec<CompactionPolicy> {
    match std::env::var("CUARENA_BOUND_POLICY").as_deref() {
        Ok("targeted") => vec![CompactionPolicy::Targeted],
        _ => vec![CompactionPolicy::Budgeted, CompactionPolicy::Auto],
    }
}

fn cases() -> u32 {
    std::env::var("CUARENA_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 64 } else { 512 })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Never more bytes moved than naive, after every step, at capacities
    /// from the peak of live bytes up, with frees, large blocks, pins and
    /// alignments up to 64 KiB.
    #[test]
    fn never_more_bytes_moved_than_naive_at_any_prefix(
        steps in prop::collection::vec(step(), 1..250),
        factor in prop_oneof![Just(1.0), Just(1.01), Just(1.05), Just(1.25)],
    ) {
        let cap = capacity(&steps, factor);
        for policy in policies() {
            if let Err(e) = against_naive(&steps, cap, policy) {
                return Err(TestCaseError::fail(format!("{policy:?}, capacity {cap} B: {e}")));
            }
        }
    }

    /// Where a non-moving best fit serves every request, nothing moves.
    #[test]
    fn nothing_moves_where_a_non_moving_best_fit_suffices(
        steps in prop::collection::vec(step(), 1..250),
        factor in prop_oneof![Just(1.0), Just(1.05), Just(1.25), Just(1.5), Just(2.0)],
    ) {
        let cap = capacity(&steps, factor);
        prop_assume!(non_moving_completes(&steps, cap));
        for policy in policies() {
            let config = ArenaConfig::new(cap).with_compaction(policy);
            let mut a = Arena::metadata(config).expect("arena");
            let mut moved = 0;
            prop_assert!(run_plain(&steps, &mut a, |a| moved = moved.max(a.stats().bytes_moved)));
            prop_assert_eq!(moved, 0, "{:?}", policy);
        }
    }
}

/// The targeted policy (the former `Auto`) holds neither property; the
/// shortest programs found that show it. Naive moves 256 B here (one block
/// slid down), the targeted policy 512 B (at this capacity every block
/// counts as large and is carved from the top, so both small blocks are in
/// the way); and where a non-moving best fit serves every request of the
/// second program, the targeted policy's large-block placement needs a
/// compaction of 18 KiB. `Auto` and `Budgeted` hold both.
#[test]
fn the_targeted_policy_breaks_both_properties_and_auto_does_not() {
    use Step::{Alloc, Free};
    let a = |size| Alloc {
        size,
        align_log2: 0,
    };
    let more_than_naive = [a(256), a(1280), a(256), Free { idx: 1 }, a(3840)];
    let cap = 5376;
    assert_eq!(
        against_naive(&more_than_naive, cap, CompactionPolicy::Targeted),
        Err("step 4: the arena moved 512 B, naive 256 B".to_string())
    );
    for policy in [CompactionPolicy::Budgeted, CompactionPolicy::Auto] {
        assert_eq!(against_naive(&more_than_naive, cap, policy), Ok(()));
    }
    let needless = [
        a(28672),
        a(3328),
        a(768),
        Free { idx: 1 },
        a(18432),
        Free { idx: 0 },
        a(30720),
    ];
    let cap = 64 << 10;
    assert!(non_moving_completes(&needless, cap));
    for (policy, moved) in [
        (CompactionPolicy::Targeted, 18432),
        (CompactionPolicy::Budgeted, 0),
        (CompactionPolicy::Auto, 0),
    ] {
        let mut arena =
            Arena::metadata(ArenaConfig::new(cap).with_compaction(policy)).expect("arena");
        assert!(run_plain(&needless, &mut arena, |_| {}));
        assert_eq!(arena.stats().bytes_moved, moved, "{policy:?}");
    }
}
