//! The compacting policies against naive compact-on-failure (the same
//! segregated-fit placement, one full compaction when a request fits in no
//! hole: a manual arena that compacts on out-of-memory), on random
//! programs that naive serves to the end, checked after every step:
//!
//! - the default, `Bounded`: bytes moved plus what reaching naive's layout
//!   would cost (`A + R`) never above naive's bytes plus twice the peak
//!   live bytes so far; its own count of naive's bytes equal to naive's;
//!   every request served; the comparison never ended;
//! - `Auto`: bytes moved plus deferred bytes never above naive's.
//!
//! Every block's bytes are checked at the end (the strict host backend runs
//! every plan as a random interleaving of chunk copies). The programs are
//! made so that naive serves them: a request naive would fail is preceded
//! by frees until it fits, at a capacity where compactions are frequent.
//! What the programs reach (handovers, handovers in pieces, pins in the
//! default's free mode) is printed and asserted.
//!
//! Planted bugs (each makes these tests fail; see the `cuarena_plant` cfg
//! in the policy and the relayout):
//!
//! ```text
//! RUSTFLAGS='--cfg cuarena_plant="skip-budget"' cargo test --release --test all bound
//! RUSTFLAGS='--cfg cuarena_plant="no-split"' cargo test --release --test all bound
//! ```

use cuarena::backend::{HostBackend, MetaBackend};
use cuarena::{Arena, ArenaConfig, CompactionPolicy, Error, Handle};
use proptest::prelude::*;

use cuarena_testkit::Rng;

/// One step of a program. Indices pick a live block modulo the live count.
#[derive(Debug, Clone, Copy)]
enum Step {
    Alloc { size: u64, align: u64 },
    Free { idx: usize },
    Pin { idx: usize },
    Unpin { idx: usize },
}

/// Naive: a manual arena that compacts when a request fits in no hole.
fn naive_alloc(naive: &mut Arena<MetaBackend>, size: u64, align: u64) -> Result<Handle, Error> {
    match naive.alloc_aligned(size, align) {
        Err(Error::OutOfMemory { .. }) => {
            naive.compact()?;
            naive.alloc_aligned(size, align)
        }
        r => r,
    }
}

/// Naive after `steps`, and its live blocks (handle, pin count).
fn naive_after(steps: &[Step], cap: u64) -> (Arena<MetaBackend>, Vec<(Handle, u32)>) {
    let mut naive =
        Arena::metadata(ArenaConfig::new(cap).with_compaction(CompactionPolicy::Manual))
            .expect("naive");
    let mut live: Vec<(Handle, u32)> = Vec::new();
    for s in steps {
        match *s {
            Step::Alloc { size, align } => {
                let h = naive_alloc(&mut naive, size, align).expect("naive served it before");
                live.push((h, 0));
            }
            Step::Free { idx } => naive.free(live.swap_remove(idx).0).expect("free"),
            Step::Pin { idx } => {
                naive.pin(live[idx].0).expect("pin");
                live[idx].1 += 1;
            }
            Step::Unpin { idx } => {
                naive.unpin(live[idx].0).expect("unpin");
                live[idx].1 -= 1;
            }
        }
    }
    (naive, live)
}

/// A program of about `len` steps at capacity `cap` that naive serves to
/// the end: made against naive, step by step, a request it would fail
/// preceded by frees (of unpinned blocks) until it fits, or dropped. A
/// failed attempt may have compacted, so naive is rebuilt from the steps
/// kept (the lockstep run never sees that attempt).
/// `pins`: pins and unpins among the steps.
fn program(rng: &mut Rng, cap: u64, len: usize, pins: bool) -> Vec<Step> {
    let (mut naive, mut live) = naive_after(&[], cap);
    let mut steps = Vec::new();
    while steps.len() < len {
        let roll = rng.below(100);
        if roll < 55 || live.is_empty() {
            let size = match rng.below(100) {
                0..=49 => rng.range(1, 4096),
                50..=84 => rng.range(4096, cap / 16),
                _ => rng.range(cap / 16, cap / 4),
            };
            let align = if rng.below(100) < 85 {
                256
            } else {
                256 << rng.range(1, 5)
            };
            loop {
                match naive_alloc(&mut naive, size, align) {
                    Ok(h) => {
                        live.push((h, 0));
                        steps.push(Step::Alloc { size, align });
                        break;
                    }
                    Err(_) => {
                        // Free an unpinned block and try again, or drop
                        // the request.
                        let unpinned: Vec<usize> =
                            (0..live.len()).filter(|&k| live[k].1 == 0).collect();
                        if !unpinned.is_empty() {
                            let k = unpinned[rng.below(unpinned.len() as u64) as usize];
                            steps.push(Step::Free { idx: k });
                        }
                        (naive, live) = naive_after(&steps, cap);
                        if unpinned.is_empty() {
                            break;
                        }
                    }
                }
            }
        } else if roll < 95 || !pins {
            let k = rng.below(live.len() as u64) as usize;
            if live[k].1 == 0 {
                naive.free(live.swap_remove(k).0).expect("free");
                steps.push(Step::Free { idx: k });
            }
        } else if roll < 98 {
            let k = rng.below(live.len() as u64) as usize;
            naive.pin(live[k].0).expect("pin");
            live[k].1 += 1;
            steps.push(Step::Pin { idx: k });
        } else {
            let k = rng.below(live.len() as u64) as usize;
            if live[k].1 > 0 {
                naive.unpin(live[k].0).expect("unpin");
                live[k].1 -= 1;
                steps.push(Step::Unpin { idx: k });
            }
        }
    }
    steps
}

/// A live block of both arenas.
struct Live {
    arena: Handle,
    naive: Handle,
    seed: u64,
    size: u64,
    pins: u32,
}

fn pattern(seed: u64, size: u64) -> Vec<u8> {
    cuarena_testkit::bytes(seed, size)
}

/// What one program reached.
#[derive(Debug, Default, Clone, Copy)]
struct Reached {
    handovers: u64,
    free_entries: u64,
    piece_plans: u64,
    naive_moved: bool,
}

/// Runs `steps` on an arena of `policy` (strict host backend) and on naive
/// (metadata) in lockstep, checking the policy's bound after every step and
/// every block's bytes at the end. `Err` names the first step that broke a
/// rule.
fn against_naive(steps: &[Step], cap: u64, policy: CompactionPolicy) -> Result<Reached, String> {
    let config = ArenaConfig::new(cap).with_compaction(policy);
    let backend = HostBackend::new(cap).expect("backend").with_seed(cap);
    let mut arena = Arena::with_backend(config, backend).expect("arena");
    let mut naive =
        Arena::metadata(ArenaConfig::new(cap).with_compaction(CompactionPolicy::Manual))
            .expect("naive");
    let mut live: Vec<Live> = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        match *s {
            Step::Alloc { size, align } => {
                let n = naive_alloc(&mut naive, size, align)
                    .map_err(|e| format!("step {i}: naive failed, the program is wrong: {e}"))?;
                let a = arena
                    .alloc_aligned(size, align)
                    .map_err(|e| format!("step {i}: the arena failed where naive did not: {e}"))?;
                let seed = (cap << 20) ^ i as u64;
                arena.write(a, &pattern(seed, size)).expect("write");
                live.push(Live {
                    arena: a,
                    naive: n,
                    seed,
                    size,
                    pins: 0,
                });
            }
            Step::Free { idx } => {
                let b = live.swap_remove(idx);
                arena.free(b.arena).map_err(|e| format!("step {i}: {e}"))?;
                naive.free(b.naive).expect("free");
            }
            Step::Pin { idx } => {
                let b = &mut live[idx];
                arena.pin(b.arena).map_err(|e| format!("step {i}: {e}"))?;
                naive.pin(b.naive).expect("pin");
                b.pins += 1;
            }
            Step::Unpin { idx } => {
                let b = &mut live[idx];
                arena.unpin(b.arena).map_err(|e| format!("step {i}: {e}"))?;
                naive.unpin(b.naive).expect("unpin");
                b.pins -= 1;
            }
        }
        let (a, n) = (arena.stats(), naive.stats());
        let p = &a.policy;
        if p.naive_bytes_moved != n.bytes_moved {
            return Err(format!(
                "step {i}: the arena counts {} B moved by naive, naive moved {} B",
                p.naive_bytes_moved, n.bytes_moved
            ));
        }
        if p.naive_failures != 0 || p.bound_ended {
            return Err(format!("step {i}: the comparison ended: {p:?}"));
        }
        match policy {
            CompactionPolicy::Bounded => {
                let owed = p.deferred_bytes + 2 * p.away_bytes;
                let bound = n.bytes_moved + 2 * a.peak_allocated_bytes;
                if a.bytes_moved + owed > bound || p.bound_bytes != bound {
                    return Err(format!(
                        "step {i}: moved {} B and owes {owed} B against naive's {} B plus twice \
                         the peak of {} B ({p:?})",
                        a.bytes_moved, n.bytes_moved, a.peak_allocated_bytes
                    ));
                }
            }
            _ => {
                if a.bytes_moved + p.deferred_bytes > n.bytes_moved {
                    return Err(format!(
                        "step {i}: moved {} B and deferred {} B against naive's {} B",
                        a.bytes_moved, p.deferred_bytes, n.bytes_moved
                    ));
                }
            }
        }
    }
    for b in &live {
        if arena.read::<u8>(b.arena).expect("read") != pattern(b.seed, b.size) {
            return Err("the bytes of a block changed".to_string());
        }
    }
    let a = arena.stats();
    Ok(Reached {
        handovers: a.policy.handovers,
        free_entries: a.policy.free_entries,
        piece_plans: a.piece_plans,
        naive_moved: naive.stats().bytes_moved > 0,
    })
}

/// Programs of the bound tests: how many (fewer in debug builds).
fn programs() -> u64 {
    std::env::var("CUARENA_BOUND_PROGRAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 40 } else { 400 })
}

#[test]
fn the_default_stays_within_naive_plus_twice_the_peak_and_auto_within_naive() {
    let mut rng = Rng::new(0x0b0e_d0a1);
    let n = programs();
    let (mut compacting, mut handover, mut pieces, mut entered) = (0u64, 0u64, 0u64, 0u64);
    for k in 0..n {
        let cap = 256 * rng.range(64, 1024);
        let pins = k % 4 == 3;
        let steps = program(&mut rng, cap, 300, pins);
        for policy in [CompactionPolicy::Bounded, CompactionPolicy::Auto] {
            let r = against_naive(&steps, cap, policy).unwrap_or_else(|e| {
                panic!("program {k} ({policy:?}, capacity {cap} B, pins {pins}): {e}\n{steps:?}")
            });
            if policy == CompactionPolicy::Bounded {
                compacting += u64::from(r.naive_moved);
                handover += u64::from(r.handovers > 0);
                pieces += u64::from(r.piece_plans > 0);
                entered += u64::from(r.free_entries > 0);
            }
        }
    }
    println!(
        "{n} programs: naive compacted in {compacting}, the default left naive's layout in \
         {entered}, handed over in {handover}, with plans in pieces in {pieces}"
    );
    // The bound is reached, not assumed: most programs compact, the
    // handover runs in a quarter of them at least, and some plans need
    // pieces (little free space to stage through).
    assert!(
        compacting * 4 >= n * 3,
        "{compacting} of {n} programs compact"
    );
    assert!(
        handover * 4 >= n,
        "the handover ran in {handover} of {n} programs"
    );
    assert!(pieces > 0, "no plan in pieces");
}

/// Pins: a block away from naive's place is brought back (the handover)
/// before it is pinned, and the bound holds with pins about.
#[test]
fn pins_in_the_default_free_mode_keep_the_bound() {
    let mut rng = Rng::new(0x005e_ed0f_b105);
    let n = programs() / 2;
    let mut pinned_handovers = 0;
    for k in 0..n {
        let cap = 256 * rng.range(64, 512);
        let steps = program(&mut rng, cap, 300, true);
        let r = against_naive(&steps, cap, CompactionPolicy::Bounded)
            .unwrap_or_else(|e| panic!("program {k} (capacity {cap} B): {e}\n{steps:?}"));
        pinned_handovers +=
            u64::from(r.handovers > 0 && steps.iter().any(|s| matches!(s, Step::Pin { .. })));
    }
    println!("{n} programs with pins: {pinned_handovers} with a handover");
    assert!(pinned_handovers > 0);
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
            Step::Alloc { size, align } => match a.alloc_aligned(size, align) {
                Ok(h) => live.push((h, 0)),
                Err(_) => return false,
            },
            Step::Free { idx } if idx < live.len() && live[idx].1 == 0 => {
                a.free(live.swap_remove(idx).0).expect("free");
            }
            Step::Pin { idx } if idx < live.len() => {
                live[idx].1 += 1;
                a.pin(live[idx].0).expect("pin");
            }
            Step::Unpin { idx } if idx < live.len() && live[idx].1 > 0 => {
                live[idx].1 -= 1;
                a.unpin(live[idx].0).expect("unpin");
            }
            _ => {}
        }
        after(a);
    }
    true
}

fn step() -> impl Strategy<Value = Step> {
    let size = prop_oneof![
        50 => 1u64..4096,
        30 => 4096u64..65536,
        15 => 65536u64..524_288,
        5 => 524_288u64..2_097_152,
    ];
    let align = prop_oneof![85 => Just(256u64), 15 => (1u32..=8).prop_map(|k| 256u64 << k)];
    prop_oneof![
        55 => (size, align).prop_map(|(size, align)| Step::Alloc { size, align }),
        40 => (0usize..64).prop_map(|idx| Step::Free { idx }),
        3 => (0usize..64).prop_map(|idx| Step::Pin { idx }),
        2 => (0usize..64).prop_map(|idx| Step::Unpin { idx }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(debug_assertions) { 64 } else { 512 },
        // About two random programs in three overflow the non-moving arena
        // and are rejected: proptest's default of 1,024 rejects aborted
        // some runs before 512 cases.
        max_global_rejects: 1 << 16,
        ..ProptestConfig::default()
    })]

    /// Where a non-moving segregated fit serves every request, nothing moves.
    #[test]
    fn nothing_moves_where_a_non_moving_segregated_fit_suffices(
        steps in prop::collection::vec(step(), 1..250),
        cap_kib in 256u64..8192,
    ) {
        let cap = cap_kib << 10;
        let manual = ArenaConfig::new(cap).with_compaction(CompactionPolicy::Manual);
        prop_assume!(run_plain(&steps, &mut Arena::metadata(manual).expect("arena"), |_| {}));
        for policy in [CompactionPolicy::Bounded, CompactionPolicy::Auto] {
            let config = ArenaConfig::new(cap).with_compaction(policy);
            let mut a = Arena::metadata(config).expect("arena");
            let mut moved = 0;
            prop_assert!(run_plain(&steps, &mut a, |a| moved = moved.max(a.stats().bytes_moved)));
            prop_assert_eq!(moved, 0, "{:?}", policy);
        }
    }
}

/// The program that made `Budgeted` (the default's predecessor) break its
/// bound on an explicit compaction, with no pins: both policies keep theirs
/// (an explicit compaction is naive's too).
#[test]
fn an_explicit_compaction_keeps_the_bound() {
    let cap = 3840;
    // (size, or a free of the block made at that step)
    enum Op {
        Alloc(u64),
        Free(usize),
    }
    use Op::{Alloc, Free};
    let program = [
        Alloc(1024),
        Free(0),
        Alloc(512),
        Alloc(512),
        Alloc(512),
        Alloc(768),
        Free(2),
        Alloc(1024),
        Alloc(768),
    ];
    for policy in [CompactionPolicy::Bounded, CompactionPolicy::Auto] {
        let mut a = Arena::host(ArenaConfig::new(cap).with_compaction(policy)).expect("arena");
        let mut naive =
            Arena::metadata(ArenaConfig::new(cap).with_compaction(CompactionPolicy::Manual))
                .expect("naive");
        let mut made: Vec<Option<(Handle, Handle)>> = Vec::new();
        for op in &program {
            match *op {
                Alloc(size) => {
                    let h = a.alloc(size).expect("arena");
                    let n = naive_alloc(&mut naive, size, 256).expect("naive");
                    made.push(Some((h, n)));
                }
                Free(step) => {
                    let (h, n) = made[step].take().expect("live");
                    a.free(h).expect("free");
                    naive.free(n).expect("free");
                    made.push(None);
                }
            }
        }
        a.compact().expect("compact");
        naive.compact().expect("compact");
        let (s, n) = (a.stats(), naive.stats());
        assert_eq!(s.policy.naive_bytes_moved, n.bytes_moved, "{policy:?}");
        assert_eq!(s.policy.naive_failures, 0, "{policy:?}");
        let extra = if policy == CompactionPolicy::Bounded {
            2 * s.peak_allocated_bytes
        } else {
            0
        };
        assert!(
            s.bytes_moved <= n.bytes_moved + extra,
            "{policy:?}: moved {} B, naive {} B",
            s.bytes_moved,
            n.bytes_moved
        );
    }
}

/// Exact best fit would put the 66,816 B block in the 69,120 B hole and
/// never compact; the arena's placement is a segregated fit, which takes
/// the top of the free space instead, and naive (the same placement)
/// compacts here too. The policies' promise is against that naive: no
/// more than it (plus twice the peak under the default).
#[test]
fn the_policies_are_compared_with_segregated_fit_not_exact_best_fit() {
    let cap = 322_560;
    let sizes = [69_120u64, 32_512, 66_816, 73_984, 103_680];
    let manual = ArenaConfig::new(cap).with_compaction(CompactionPolicy::Manual);
    let mut plain = Arena::metadata(manual.clone()).expect("arena");
    let mut naive = Arena::metadata(manual).expect("arena");
    let run = |a: &mut Arena<MetaBackend>, compact: bool| -> Result<(), Error> {
        let x = if compact {
            naive_alloc(a, sizes[0], 256)?
        } else {
            a.alloc(sizes[0])?
        };
        for (k, &s) in sizes[1..].iter().enumerate() {
            if k == 1 {
                a.free(x)?;
            }
            if compact {
                naive_alloc(a, s, 256)?;
            } else {
                a.alloc(s)?;
            }
        }
        Ok(())
    };
    // Without moves the segregated fit fails; naive compacts and serves.
    assert!(run(&mut plain, false).is_err());
    run(&mut naive, true).expect("naive serves it");
    let n = naive.stats().bytes_moved;
    assert!(n > 0);
    for policy in [CompactionPolicy::Bounded, CompactionPolicy::Auto] {
        let mut a = Arena::metadata(ArenaConfig::new(cap).with_compaction(policy)).expect("arena");
        let x = a.alloc(sizes[0]).expect("alloc");
        a.alloc(sizes[1]).expect("alloc");
        a.free(x).expect("free");
        for &s in &sizes[2..] {
            a.alloc(s).expect("served, as naive serves it");
        }
        let s = a.stats();
        assert_eq!(s.policy.naive_bytes_moved, n, "{policy:?}");
        assert!(
            s.bytes_moved <= n + 2 * s.peak_allocated_bytes,
            "{policy:?}"
        );
    }
}
