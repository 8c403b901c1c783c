//! Spilling to the host tier: random programs whose working set is up to
//! three times the region, every tensor's bytes verified; and the errors
//! when even spilling cannot help.

use cuarena::backend::{Backend, HostBackend};
use cuarena::DType;
use cuarena::{Arena, ArenaConfig, Error, Handle};
use cuarena_testkit::{bytes, Rng};

/// A random program over an arena of `cap` with a host tier of `3 * cap`;
/// returns the stats at the end. Panics on any lost byte.
pub(crate) fn run_spill_program<B: Backend>(
    arena: &mut Arena<B>,
    seed: u64,
    steps: usize,
) -> cuarena::Stats {
    let cap = arena.config().capacity_bytes;
    let mut live: Vec<(Handle, Vec<u8>, u32)> = Vec::new();
    let mut rng = Rng::new(seed);
    let mut next = move || rng.next();
    for step in 0..steps {
        let live_bytes: u64 = live.iter().map(|l| l.1.len() as u64).sum();
        match next() % 10 {
            // Grow the working set toward 3x the region.
            0..=4 if live_bytes < 3 * cap => {
                let size = 1 + next() % (cap / 6);
                match arena.alloc(size) {
                    Ok(h) => {
                        let data = bytes(next(), size);
                        arena.write(h, &data).expect("write");
                        live.push((h, data, 0));
                    }
                    Err(Error::HostTierFull { .. } | Error::OutOfMemory { .. }) => {}
                    Err(e) => panic!("step {step}: {e}"),
                }
            }
            0..=5 if !live.is_empty() => {
                let i = (next() % live.len() as u64) as usize;
                if live[i].2 == 0 {
                    let (h, _, _) = live.swap_remove(i);
                    arena.free(h).expect("free");
                }
            }
            6 | 7 if !live.is_empty() => {
                // Use a block: it comes back, others may go out.
                let i = (next() % live.len() as u64) as usize;
                let h = live[i].0;
                match arena.make_resident(&[h]).and_then(|()| arena.read::<u8>(h)) {
                    Ok(got) => assert!(
                        got == live[i].1,
                        "step {step}: a spilled block lost its bytes"
                    ),
                    Err(Error::HostTierFull { .. } | Error::OutOfMemory { .. }) => {}
                    Err(e) => panic!("step {step}: {e}"),
                }
            }
            8 if !live.is_empty() => {
                let i = (next() % live.len() as u64) as usize;
                if live[i].2 > 0 {
                    arena.unpin(live[i].0).expect("unpin");
                    live[i].2 -= 1;
                } else if live.iter().filter(|l| l.2 > 0).count() < 2 {
                    match arena.pin(live[i].0) {
                        Ok(_) => live[i].2 += 1,
                        Err(Error::HostTierFull { .. } | Error::OutOfMemory { .. }) => {}
                        Err(e) => panic!("step {step}: {e}"),
                    }
                }
            }
            9 if live.len() >= 2 && next() % 2 == 0 => {
                // Two blocks at once: both come back, or nothing changes.
                let (i, j) = (
                    (next() % live.len() as u64) as usize,
                    (next() % live.len() as u64) as usize,
                );
                let before = (arena.blocks(), arena.stats());
                match arena.make_resident(&[live[i].0, live[j].0]) {
                    Ok(()) => {
                        assert!(arena.info(live[i].0).expect("info").resident, "step {step}");
                        assert!(arena.info(live[j].0).expect("info").resident, "step {step}");
                    }
                    Err(Error::HostTierFull { .. } | Error::OutOfMemory { .. }) => {
                        let mut after = arena.stats();
                        after.failed_allocs = before.1.failed_allocs;
                        assert_eq!((arena.blocks(), after), before, "step {step}");
                    }
                    Err(e) => panic!("step {step}: {e}"),
                }
            }
            _ => {
                arena.compact().expect("compact");
            }
        }
        let st = arena.stats();
        assert_eq!(st.live_blocks, live.len() as u64, "step {step}");
        let resident: u64 = arena.blocks().iter().map(|b| b.reserved_bytes).sum();
        assert_eq!(st.allocated_bytes, resident, "step {step}");
    }
    // Nothing lost: every tensor, resident or spilled, still has its bytes.
    for (h, data, pins) in &live {
        for _ in 0..*pins {
            arena.unpin(*h).expect("unpin");
        }
        arena.make_resident(&[*h]).expect("resident");
        let got: Vec<u8> = arena.read(*h).expect("read back");
        assert!(&got == data, "a tensor lost its bytes");
    }
    arena.stats()
}

#[test]
fn working_sets_up_to_three_times_the_region_keep_their_bytes() {
    let (mut evictions, mut restores) = (0, 0);
    for seed in 0..40 {
        let cap = 256 << 10;
        let backend = HostBackend::new(cap).expect("backend").with_seed(seed);
        let config = ArenaConfig::new(cap).with_spill_host_bytes(4 * cap);
        let mut arena = Arena::with_backend(config, backend).expect("arena");
        let st = run_spill_program(&mut arena, seed, 300);
        evictions += st.evictions;
        restores += st.restores;
    }
    assert!(
        evictions > 100 && restores > 100,
        "evictions {evictions}, restores {restores}"
    );
}

#[test]
fn spilled_handles_stay_valid_and_views_need_residency() {
    let cap = 64 << 10;
    // Restoring one block while spilling another needs room for both in
    // the tier for a moment: give it twice the region.
    let mut a = Arena::host(ArenaConfig::new(cap).with_spill_host_bytes(2 * cap)).expect("arena");
    let x = a.alloc(40 << 10).expect("x");
    a.write(x, &vec![1u8; 40 << 10]).expect("write x");
    let y = a.alloc(40 << 10).expect("y spills x");
    assert_eq!(a.stats().evictions, 1);
    assert!(!a.info(x).expect("info").resident);
    assert_eq!(a.resolve(x), Err(Error::NotResident));
    a.write(y, &vec![2u8; 40 << 10]).expect("write y");
    // Reads need residency: x comes back, and spills y.
    assert_eq!(a.read::<u8>(x), Err(Error::NotResident));
    a.make_resident(&[x]).expect("x back");
    assert!(a.read::<u8>(x).expect("read x").iter().all(|&b| b == 1));
    assert!(a.info(x).expect("info").resident);
    assert!(!a.info(y).expect("info").resident);
    a.make_resident(&[y]).expect("resident");
    assert!(a.resolve(y).is_ok());
    // Both at once cannot fit: the error says so and loses nothing.
    match a.make_resident(&[x, y]) {
        Err(Error::OutOfMemory {
            requested_bytes,
            reachable_bytes,
            ..
        }) => {
            assert!(requested_bytes > reachable_bytes);
        }
        other => panic!("{other:?}"),
    }
    a.make_resident(&[x]).expect("x back");
    assert!(a.read::<u8>(x).expect("x").iter().all(|&b| b == 1));
    a.make_resident(&[y]).expect("y back");
    assert!(a.read::<u8>(y).expect("y").iter().all(|&b| b == 2));
    assert!(a.stats().summary().contains("spilled / restored"));
}

#[test]
fn a_full_host_tier_is_reported_with_its_numbers() {
    let cap = 64 << 10;
    let mut a = Arena::host(ArenaConfig::new(cap).with_spill_host_bytes(16 << 10)).expect("arena");
    let x = a.alloc(40 << 10).expect("x");
    a.write(x, &vec![3u8; 40 << 10]).expect("write");
    match a.alloc(40 << 10) {
        Err(Error::HostTierFull {
            needed_bytes,
            host_tier_bytes,
            ..
        }) => {
            assert_eq!((needed_bytes, host_tier_bytes), (40 << 10, 16 << 10));
        }
        other => panic!("{other:?}"),
    }
    assert!(a.read::<u8>(x).expect("x").iter().all(|&b| b == 3));
    // Pinned blocks are never spilled.
    a.pin(x).expect("pin");
    let mut b = Arena::host(ArenaConfig::new(cap).with_spill_host_bytes(cap)).expect("arena");
    let p = b.alloc(40 << 10).expect("p");
    b.pin(p).expect("pin");
    assert!(matches!(b.alloc(40 << 10), Err(Error::OutOfMemory { .. })));
}

/// Residency of every block, in handle order: what a failed call must leave
/// as it was.
fn residency(a: &Arena, hs: &[Handle]) -> Vec<(bool, u64)> {
    hs.iter()
        .map(|&h| {
            let i = a.info(h).expect("info");
            (i.resident, i.offset)
        })
        .collect()
}

/// Four 256 B blocks fill a 1 KiB region; the tier holds two. `alloc(768)`
/// needs three evicted: it fails with `HostTierFull` and evicts none.
#[test]
fn a_spilling_alloc_that_fails_evicts_nothing() {
    let mut a = Arena::host(ArenaConfig::new(1024).with_spill_host_bytes(512)).expect("arena");
    let hs: Vec<Handle> = (0..4u8)
        .map(|i| {
            let h = a.alloc(256).expect("alloc");
            a.write(h, &[i + 1; 256]).expect("write");
            h
        })
        .collect();
    let before = residency(&a, &hs);
    let (ev, used) = (a.stats().evictions, a.stats().host_tier_used_bytes);
    match a.alloc(768) {
        Err(Error::HostTierFull {
            requested_bytes,
            needed_bytes,
            host_tier_bytes,
            host_free_bytes,
            host_largest_free_bytes,
        }) => {
            assert_eq!(requested_bytes, 768);
            assert_eq!(needed_bytes, 768, "three blocks of 256 B to spill");
            assert_eq!(host_tier_bytes, 512);
            assert_eq!((host_free_bytes, host_largest_free_bytes), (512, 512));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        residency(&a, &hs),
        before,
        "a failed alloc changed residency"
    );
    assert_eq!(a.stats().evictions, ev);
    assert_eq!(a.stats().host_tier_used_bytes, used);
    for (i, &h) in hs.iter().enumerate() {
        assert_eq!(a.read::<u8>(h).expect("read"), vec![i as u8 + 1; 256]);
    }
    // Two evictions are enough for 512 B: that one succeeds, and evicts the
    // two least recently used blocks only.
    let h = a.alloc(512).expect("alloc with two evictions");
    assert_eq!(a.stats().evictions, ev + 2);
    assert_eq!(a.stats().host_tier_used_bytes, 512);
    // Now the tier is full: even one more eviction fails, changing nothing.
    let now = residency(&a, &hs);
    assert!(matches!(a.alloc(256), Err(Error::HostTierFull { .. })));
    assert_eq!(residency(&a, &hs), now);
    assert!(a.info(h).is_ok());
}

/// A working set that cannot fit even with everything else spilled fails
/// before anything is evicted.
#[test]
fn working_set_too_large_evicts_nothing() {
    let mut a = Arena::host(ArenaConfig::new(1024).with_spill_host_bytes(4096)).expect("arena");
    let p = a.alloc(512).expect("p");
    a.pin(p).expect("pin");
    let hs: Vec<Handle> = (0..2).map(|_| a.alloc(256).expect("alloc")).collect();
    let before = residency(&a, &hs);
    assert!(matches!(
        a.alloc(768),
        Err(Error::OutOfMemory {
            requested_bytes: 1280,
            reachable_bytes: 512,
            ..
        })
    ));
    assert_eq!(residency(&a, &hs), before);
    assert_eq!(a.stats().evictions, 0);
    assert_eq!(a.stats().host_tier_used_bytes, 0);
}

/// Wrong-length or wrong-type transfers to a spilled block fail before it
/// is brought back: it stays spilled and nothing else is evicted, with a
/// tier that has room and with one that has none.
#[test]
fn argument_errors_on_spilled_blocks_change_no_residency() {
    for tier in [2048u64, 256] {
        let mut a = Arena::host(ArenaConfig::new(1024).with_spill_host_bytes(tier)).expect("arena");
        let x = a.alloc_dtype(DType::U32, 64).expect("x");
        a.write(x, &[7u32; 64]).expect("write x");
        let others: Vec<Handle> = (0..3).map(|_| a.alloc(256).expect("alloc")).collect();
        let y = a.alloc_dtype(DType::F32, 64).expect("y spills x");
        assert!(!a.info(x).expect("info").resident);
        let mut hs = others.clone();
        hs.extend([x, y]);
        let before = residency(&a, &hs);
        let st = a.stats();
        let errs = [
            a.write(x, &[1u32; 63]).unwrap_err(),
            a.write(x, &[1.0f32; 64]).unwrap_err(),
            a.write(x, &[1u8; 256]).unwrap_err(),
            a.read_into(x, &mut [0u32; 65]).unwrap_err(),
            a.read::<f32>(x).unwrap_err(),
            a.write(x, &[1u32; 3]).unwrap_err(),
            a.fill(x, 1u64).unwrap_err(),
            a.copy(x, y).unwrap_err(),
        ];
        for e in errs {
            assert!(
                matches!(e, Error::LengthMismatch { .. } | Error::TypeMismatch { .. }),
                "tier {tier}: {e}"
            );
        }
        assert_eq!(residency(&a, &hs), before, "tier {tier}");
        assert_eq!(a.stats().evictions, st.evictions, "tier {tier}");
        assert_eq!(a.stats().restores, st.restores, "tier {tier}");
        // A valid write brings it back (or, with a full tier, fails with
        // `HostTierFull` and changes nothing).
        match a.write(x, &[9u32; 64]) {
            Ok(()) => assert!(a.info(x).expect("info").resident),
            Err(Error::HostTierFull { .. }) => {
                assert_eq!(tier, 256);
                assert_eq!(residency(&a, &hs), before);
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// The spill model: random programs with `alloc` failing on a full tier,
/// checked for unchanged residency on every failure.
#[test]
fn failed_spilling_allocs_change_nothing_in_random_programs() {
    let mut failures = 0;
    for seed in 0..20u64 {
        let cap = 16 << 10;
        let mut a =
            Arena::host(ArenaConfig::new(cap).with_spill_host_bytes(cap / 2)).expect("arena");
        let mut live: Vec<(Handle, Vec<u8>)> = Vec::new();
        let mut rng = Rng::new(seed);
        let mut next = move || rng.next();
        for step in 0..300 {
            if next() % 3 == 0 && !live.is_empty() {
                let i = (next() % live.len() as u64) as usize;
                let (h, _) = live.swap_remove(i);
                a.free(h).expect("free");
                continue;
            }
            let size = 1 + next() % (cap / 3);
            let hs: Vec<Handle> = live.iter().map(|l| l.0).collect();
            let before = residency(&a, &hs);
            let (ev, used) = (a.stats().evictions, a.stats().host_tier_used_bytes);
            match a.alloc(size) {
                Ok(h) => {
                    let data = bytes(next(), size);
                    a.write(h, &data).expect("write");
                    live.push((h, data));
                }
                Err(Error::HostTierFull { .. } | Error::OutOfMemory { .. }) => {
                    failures += 1;
                    assert_eq!(residency(&a, &hs), before, "seed {seed} step {step}");
                    assert_eq!(a.stats().evictions, ev);
                    assert_eq!(a.stats().host_tier_used_bytes, used);
                }
                Err(e) => panic!("{e}"),
            }
        }
        // Resident blocks first, each freed after its check: the spilled
        // ones then come back without evicting anything.
        live.sort_by_key(|l| !a.info(l.0).expect("info").resident);
        for (h, data) in live {
            a.make_resident(&[h]).expect("resident");
            assert!(a.read::<u8>(h).expect("read") == data, "seed {seed}");
            a.free(h).expect("free");
        }
    }
    assert!(failures > 20, "weak test: {failures} failures");
}

/// A copy between two spilled blocks that cannot both be resident fails
/// and changes nothing: neither is brought back, nothing else is evicted,
/// no byte moves (the case: it used to restore one, evict another,
/// then fail). Two that fit together come back together.
#[test]
fn a_failing_copy_between_spilled_blocks_changes_nothing() {
    let cap = 64 << 10;
    let mut a = Arena::host(ArenaConfig::new(cap).with_spill_host_bytes(4 * cap)).expect("arena");
    let x = a.alloc(40 << 10).expect("x");
    a.write(x, &vec![1u8; 40 << 10]).expect("write x");
    let y = a.alloc(40 << 10).expect("y spills x");
    a.write(y, &vec![2u8; 40 << 10]).expect("write y");
    let z = a.alloc(40 << 10).expect("z spills y");
    a.write(z, &vec![3u8; 40 << 10]).expect("write z");
    assert!(!a.info(x).expect("x").resident && !a.info(y).expect("y").resident);
    let before = (a.blocks(), a.stats());
    assert!(matches!(a.copy(x, y), Err(Error::OutOfMemory { .. })));
    // The same state; only the failure is counted.
    let mut after = a.stats();
    after.failed_allocs -= 1;
    assert_eq!((a.blocks(), after), before);
    assert!(a.info(z).expect("z").resident);
    // Two small spilled blocks that fit together (after evicting z) come
    // back together, and the copy runs.
    let mut b = Arena::host(ArenaConfig::new(cap).with_spill_host_bytes(4 * cap)).expect("arena");
    let p = b.alloc(20 << 10).expect("p");
    b.write(p, &vec![4u8; 20 << 10]).expect("write p");
    let q = b.alloc(20 << 10).expect("q");
    b.write(q, &vec![5u8; 20 << 10]).expect("write q");
    let big = b.alloc(60 << 10).expect("big spills p and q");
    assert!(!b.info(p).expect("p").resident && !b.info(q).expect("q").resident);
    b.copy(p, q).expect("copy");
    assert!(b.info(p).expect("p").resident && b.info(q).expect("q").resident);
    assert!(!b.info(big).expect("big").resident);
    assert!(b.read::<u8>(q).expect("q").iter().all(|&v| v == 4));
}
