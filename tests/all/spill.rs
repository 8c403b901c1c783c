//! Spilling to the host tier: random programs whose working set is up to
//! three times the region, every tensor's bytes verified; and the errors
//! when even spilling cannot help.

use cuarena::backend::{Backend, HostBackend};
use cuarena::{Arena, ArenaConfig, Error, Handle};

fn bytes(seed: u64, len: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A random program over an arena of `cap` with a host tier of `3 * cap`;
/// returns the stats at the end. Panics on any lost byte.
pub(crate) fn run_spill_program<B: Backend>(
    arena: &mut Arena<B>,
    seed: u64,
    steps: usize,
) -> cuarena::Stats {
    let cap = arena.config().capacity_bytes;
    let mut live: Vec<(Handle, Vec<u8>, u32)> = Vec::new();
    let mut x = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
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
                    Err(Error::HostTierFull { .. } | Error::WorkingSetTooLarge { .. }) => {}
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
                match arena.read::<u8>(live[i].0) {
                    Ok(got) => assert!(
                        got == live[i].1,
                        "step {step}: a spilled block lost its bytes"
                    ),
                    Err(Error::HostTierFull { .. } | Error::WorkingSetTooLarge { .. }) => {}
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
                        Err(Error::HostTierFull { .. } | Error::WorkingSetTooLarge { .. }) => {}
                        Err(e) => panic!("step {step}: {e}"),
                    }
                }
            }
            _ => {
                arena.compact().expect("compact");
            }
        }
        let st = arena.stats();
        assert_eq!(st.live_blocks, live.len(), "step {step}");
        let resident: u64 = arena.blocks().iter().map(|b| b.reserved_bytes).sum();
        assert_eq!(st.allocated_bytes, resident, "step {step}");
    }
    // Nothing lost: every tensor, resident or spilled, still has its bytes.
    for (h, data, pins) in &live {
        for _ in 0..*pins {
            arena.unpin(*h).expect("unpin");
        }
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
    // Reading x brings it back and spills y.
    assert!(a.read::<u8>(x).expect("read x").iter().all(|&b| b == 1));
    assert!(a.info(x).expect("info").resident);
    assert!(!a.info(y).expect("info").resident);
    a.make_resident(&[y]).expect("resident");
    assert!(a.resolve(y).is_ok());
    // Both at once cannot fit: the error says so and loses nothing.
    match a.make_resident(&[x, y]) {
        Err(Error::WorkingSetTooLarge {
            needed_bytes,
            reachable_bytes,
        }) => {
            assert!(needed_bytes > reachable_bytes);
        }
        other => panic!("{other:?}"),
    }
    assert!(a.read::<u8>(x).expect("x").iter().all(|&b| b == 1));
    assert!(a.read::<u8>(y).expect("y").iter().all(|&b| b == 2));
    assert!(a.summary().contains("spilled / restored"));
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
    assert!(matches!(
        b.alloc(40 << 10),
        Err(Error::WorkingSetTooLarge { .. })
    ));
}
