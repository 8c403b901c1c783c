//! Unit tests of the handle table kernels resolve handles through (the
//! device ABI of `kernels/cuarena.cuh`): the arena's table names every
//! live, resident block at its offset, freed and spilled slots never match
//! an old handle's version, and the backend's copy follows.

use super::Arena;
use crate::backend::{Backend, HostBackend};
use crate::config::{ArenaConfig, CompactionPolicy};
use crate::handle::Handle;
use cuarena_testkit::Rng;

const KIB: u64 = 1024;

/// Every live block of `a` listed by `blocks()` has its table entry at its
/// offset with its handle's version; every handle in `freed` reads another
/// version.
fn check_table<B: Backend>(a: &Arena<B>, freed: &[Handle], what: &str) {
    let table = a.handle_table();
    for b in a.blocks() {
        let bits = b.handle.to_bits();
        let e = table[(bits & 0xFFFF_FFFF) as usize];
        assert_eq!(
            (e.offset, u64::from(e.version)),
            (b.offset, bits >> 32),
            "{what}: table entry"
        );
    }
    for h in freed {
        let bits = h.to_bits();
        assert_ne!(
            u64::from(table[(bits & 0xFFFF_FFFF) as usize].version),
            bits >> 32,
            "{what}: stale entry"
        );
    }
}

#[test]
fn the_table_names_every_block_under_every_policy_with_spilling() {
    for (seed, policy) in (0..24u64).zip(
        [
            CompactionPolicy::Auto,
            CompactionPolicy::Bounded,
            CompactionPolicy::Manual,
        ]
        .into_iter()
        .cycle(),
    ) {
        let spill = if seed % 3 == 0 { 64 * KIB } else { 0 };
        let config = ArenaConfig::new(128 * KIB)
            .with_compaction(policy)
            .with_spill_host_bytes(spill);
        let mut a = Arena::host(config).expect("arena");
        let mut rng = Rng::new(seed);
        let (mut live, mut freed): (Vec<Handle>, Vec<Handle>) = (Vec::new(), Vec::new());
        for step in 0..600 {
            let x = rng.next();
            match x % 8 {
                0..=3 => {
                    if let Ok(h) = a.alloc(256 + (x >> 8) % (12 * KIB)) {
                        live.push(h);
                    }
                }
                4 | 5 if !live.is_empty() => {
                    let h = live.swap_remove(((x >> 8) % live.len() as u64) as usize);
                    if a.free(h).is_ok() {
                        freed.push(h);
                    } else {
                        live.push(h); // pinned
                    }
                }
                6 if !live.is_empty() => {
                    let h = live[((x >> 8) % live.len() as u64) as usize];
                    if a.info(h).expect("live").pins > 0 {
                        a.unpin(h).expect("unpin");
                    } else if x & 1 << 40 != 0 {
                        let _ = a.pin(h);
                    } else {
                        let _ = a.make_resident(&[h]);
                    }
                }
                _ => {
                    a.compact().expect("compact");
                }
            }
            check_table(&a, &freed, &format!("seed {seed} step {step}"));
        }
    }
}

#[test]
fn the_backend_table_follows_compactions_and_flushes() {
    for seed in 0..20u64 {
        let cap = 256 * KIB;
        let backend = HostBackend::new(cap).expect("backend").with_seed(seed);
        let mut a = Arena::with_backend(ArenaConfig::new(cap), backend).expect("arena");
        let mut live = Vec::new();
        let mut rng = Rng::new(seed * 7919 + 1);
        for _ in 0..400 {
            let x = rng.next();
            let size = 256 + (x >> 33) % (8 * KIB);
            if (x >> 20) % 3 == 0 && !live.is_empty() {
                let h = live.swap_remove(((x >> 40) as usize) % live.len());
                a.free(h).expect("free");
            } else if let Ok(h) = a.alloc(size) {
                live.push(h);
            }
            let before = a.stats().moves;
            if (x >> 50) % 17 == 0 {
                a.compact().expect("compact");
            }
            if a.stats().moves != before {
                // Right after a compaction the backend's copy is current.
                assert_eq!(
                    a.backend().table(),
                    &a.handle_table()[..a.backend().table().len()]
                );
            }
        }
        a.flush_table().expect("flush");
        assert_eq!(a.backend().table(), a.handle_table());
        for h in &live {
            let e = a.backend().table()[(h.to_bits() & 0xFFFF_FFFF) as usize];
            assert_eq!(e.offset, a.info(*h).expect("info").offset);
            assert_eq!(u64::from(e.version), h.to_bits() >> 32);
        }
    }
}

#[test]
fn freed_slots_read_version_0_and_live_versions_are_odd() {
    let mut a = Arena::metadata(ArenaConfig::new(1 << 20)).expect("arena");
    let h0 = a.alloc(100).expect("alloc");
    let h1 = a.alloc(100).expect("alloc");
    assert_eq!(h0.to_bits(), 1 << 32);
    assert_eq!(h1.to_bits(), (1 << 32) | 1);
    a.free(h0).expect("free");
    // The freed slot reads version 0 in the table (`CUARENA_FREE_VERSION`).
    assert_eq!(a.handle_table()[0].version, 0);
    assert_eq!(a.handle_table()[0].offset, 0);
    let h2 = a.alloc(100).expect("alloc");
    assert_eq!(
        h2.to_bits(),
        3 << 32,
        "slot 0 reused with the next odd version"
    );
    assert_eq!(a.handle_table()[0].version, 3);
    assert_eq!(a.handle_table()[1].version, 1);
    // Live versions are odd, as the header says.
    for e in a.handle_table() {
        assert_eq!(e.version % 2, 1);
    }
    // The slot is the low half of the bits, the table's last entry here.
    assert_eq!(h1.to_bits() as u32 as usize, a.handle_table().len() - 1);
}
