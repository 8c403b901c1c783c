//! The arena's contract, case by case: bad input, the allocation guarantee,
//! pinning, a wrong plan caught by the strict host backend, poisoning.

use cuarena::backend::{Backend, HostBackend};
use cuarena::plan::{Move, Plan, PlanKind};
use cuarena::BackendError;
use cuarena::DType;
use cuarena::{Arena, ArenaConfig, BlockInfo, CompactionPolicy, Error};

const KIB: u64 = 1024;

fn arena(cap: u64) -> Arena {
    Arena::host(ArenaConfig::new(cap)).expect("arena")
}

fn state(a: &Arena<impl Backend>) -> (Vec<BlockInfo>, Vec<(u64, u64)>) {
    (a.blocks(), crate::free_regions(a))
}

/// Fills the arena with `n` blocks of `size`, writes a pattern into each,
/// then frees every other one: free space ends up in `n / 2` equal holes.
fn fragment(a: &mut Arena<impl Backend>, n: usize, size: u64) -> Vec<(cuarena::Handle, Vec<u8>)> {
    let mut all = Vec::new();
    for i in 0..n {
        let h = a.alloc(size).expect("fill");
        let data: Vec<u8> = (0..size).map(|j| (i as u64 * 31 + j) as u8).collect();
        a.write(h, &data).expect("write");
        all.push((h, data));
    }
    let mut kept = Vec::new();
    for (i, (h, data)) in all.into_iter().enumerate() {
        if i % 2 == 0 {
            a.free(h).expect("free");
        } else {
            kept.push((h, data));
        }
    }
    kept
}

#[test]
fn bad_input_gets_its_own_error_and_changes_nothing() {
    let mut a = arena(64 * KIB);
    let h = a.alloc(1000).expect("alloc");
    a.write(h, &[7u8; 1000]).expect("write");
    let t = a.alloc_dtype(DType::F32, 10).expect("typed");
    let odd = a.alloc(1001).expect("odd");
    let before = state(&a);
    let stats = a.stats();

    assert_eq!(a.alloc(0), Err(Error::ZeroSize));
    assert!(matches!(
        a.alloc_aligned(8, 384),
        Err(Error::InvalidAlignment {
            align_bytes: 384,
            ..
        })
    ));
    assert!(matches!(
        a.alloc(64 * KIB + 1),
        Err(Error::TooLarge {
            capacity_bytes: 65536,
            ..
        })
    ));
    assert!(matches!(a.alloc(u64::MAX - 3), Err(Error::TooLarge { .. })));
    assert!(matches!(
        a.alloc_dtype(DType::U64, u64::MAX / 4),
        Err(Error::LimitReached {
            requested: 4_611_686_018_427_387_903,
            limit: 2_305_843_009_213_693_951,
            ..
        })
    ));
    assert_eq!(
        a.read::<u8>(h).map(|v| v.len()),
        Ok(1000),
        "a valid read still works between bad calls"
    );
    let mut short = vec![0u8; 999];
    assert_eq!(
        a.read_into(h, &mut short),
        Err(Error::LengthMismatch {
            range_bytes: 1000,
            given_bytes: 999
        })
    );
    assert!(matches!(a.read::<u32>(t), Err(Error::TypeMismatch { .. })));
    assert!(matches!(
        a.read::<u64>(odd),
        Err(Error::Misaligned {
            offset_bytes: 0,
            len_bytes: 1001,
            elem_type: "u64",
            elem_bytes: 8
        })
    ));
    assert_eq!(a.unpin(h), Err(Error::Pinned { pins: 0 }));
    a.pin(h).expect("pin");
    assert_eq!(a.free(h), Err(Error::Pinned { pins: 1 }));
    a.unpin(h).expect("unpin");

    let mut other = arena(4 * KIB);
    let foreign = other.alloc(16).expect("alloc");
    assert!(matches!(a.free(foreign), Err(Error::Foreign { .. })));
    assert_eq!(state(&a), before);
    assert_eq!(a.stats().allocs, stats.allocs);
    assert_eq!(a.stats().free_bytes, stats.free_bytes);

    // Stale: freed, then its slot reused by a new block.
    a.free(h).expect("free");
    assert_eq!(a.free(h), Err(Error::StaleHandle));
    let h2 = a.alloc(1000).expect("realloc");
    assert_ne!(h, h2);
    assert_eq!(a.read::<u8>(h), Err(Error::StaleHandle));
    assert_eq!(a.info(h2).map(|i| i.size_bytes), Ok(1000));
}

#[test]
fn handle_metadata_is_queryable() {
    let mut a = arena(64 * KIB);
    let h = a.alloc_dtype(DType::F32, 100).expect("alloc");
    assert_eq!(a.info(h).map(|i| i.size_bytes), Ok(400));
    assert_eq!(a.info(h).map(|i| i.align_bytes), Ok(256));
    assert_eq!(a.info(h).map(|i| i.dtype), Ok(Some(cuarena::DType::F32)));
    let x: Vec<f32> = (0..100).map(|i| i as f32).collect();
    a.write(h, &x).expect("write");
    assert_eq!(a.read::<f32>(h).expect("read"), x);
    let g = a.alloc_aligned(10, 4096).expect("aligned");
    assert_eq!(a.info(g).expect("info").offset % 4096, 0);
    assert_eq!(a.info(g).expect("info").reserved_bytes, 256);
}

#[test]
fn fragmented_arena_compacts_instead_of_failing() {
    let cap = 1024 * KIB;
    let mut a = arena(cap);
    let mut b = Arena::host(ArenaConfig::new(cap).with_compaction(CompactionPolicy::Manual))
        .expect("arena");
    let kept_a = fragment(&mut a, 64, 16 * KIB);
    fragment(&mut b, 64, 16 * KIB);
    let s = a.stats();
    assert_eq!(s.free_bytes, cap / 2);
    assert_eq!(s.largest_free_bytes, 16 * KIB);
    // Larger than any hole, smaller than the free bytes.
    let want = 256 * KIB;
    match b.alloc(want) {
        Err(Error::OutOfMemory {
            requested_bytes,
            free_bytes,
            largest_free_bytes,
            reachable_bytes,
        }) => {
            assert_eq!(requested_bytes, want);
            assert_eq!(free_bytes, cap / 2);
            assert_eq!(largest_free_bytes, 16 * KIB);
            assert_eq!(
                reachable_bytes,
                cap / 2,
                "a full compaction would merge all free space"
            );
        }
        other => panic!("the non-moving baseline should fail, got {other:?}"),
    }
    let h = a.alloc(want).expect("the compacting arena succeeds");
    let s = a.stats();
    assert_eq!(s.targeted_compactions, 1);
    assert!(
        s.bytes_moved > 0 && s.bytes_moved <= want,
        "targeted moved {} B",
        s.bytes_moved
    );
    for (h, data) in &kept_a {
        assert_eq!(&a.read::<u8>(*h).expect("read"), data);
    }
    // Every free byte is usable: fill the rest exactly.
    let rest = a.stats().free_bytes;
    a.alloc(rest).expect("fill to the last byte");
    assert!(matches!(
        a.alloc(1),
        Err(Error::OutOfMemory { free_bytes: 0, .. })
    ));
    a.free(h).expect("free");
}

#[test]
fn full_compaction_merges_free_space_and_keeps_bytes() {
    let mut a = arena(1024 * KIB);
    let kept = fragment(&mut a, 50, 10 * KIB + 100);
    let r = a.compact().expect("compact");
    assert_eq!(r.waves, 1, "a full compaction without pins is one wave");
    assert!(r.moves > 0);
    let s = a.stats();
    assert_eq!(s.free_regions, 1);
    assert_eq!(s.fragmentation, 0.0);
    assert_eq!(s.full_compactions, 1);
    for (h, data) in &kept {
        assert_eq!(&a.read::<u8>(*h).expect("read"), data);
    }
    assert!(a.stats().summary().contains("compactions (targeted/full)"));
}

#[test]
fn pinned_blocks_never_move_and_bound_what_compaction_reaches() {
    let cap = 100 * KIB;
    let mut a = arena(cap);
    let blocks: Vec<_> = (0..10).map(|_| a.alloc(10 * KIB).expect("alloc")).collect();
    // Pin blocks 3 and 7; free the rest of the odd ones and block 0.
    a.pin(blocks[3]).expect("pin");
    a.pin(blocks[7]).expect("pin");
    a.pin(blocks[7]).expect("nested pin");
    let at3 = a.info(blocks[3]).expect("info").offset;
    let at7 = a.info(blocks[7]).expect("info").offset;
    for i in [0, 1, 5, 9] {
        a.free(blocks[i]).expect("free");
    }
    // Gaps between pins: [0,30K) holds 1 block, [40K,70K) holds 2, [80K,100K) holds 1 of 2.
    let st = a.stats();
    assert_eq!(st.pinned_blocks, 2);
    match a.alloc(40 * KIB) {
        Err(Error::OutOfMemory {
            reachable_bytes,
            free_bytes,
            ..
        }) => {
            assert_eq!(free_bytes, 40 * KIB);
            assert!(reachable_bytes < 40 * KIB);
        }
        other => panic!("no gap between pins can hold 40 KiB: {other:?}"),
    }
    let h = a
        .alloc(20 * KIB)
        .expect("a gap can hold 20 KiB after compaction");
    assert_eq!(a.info(blocks[3]).expect("info").offset, at3);
    assert_eq!(a.info(blocks[7]).expect("info").offset, at7);
    a.compact().expect("compact");
    assert_eq!(a.info(blocks[3]).expect("info").offset, at3);
    assert_eq!(a.info(blocks[7]).expect("info").offset, at7);
    assert_eq!(a.unpin(blocks[7]), Ok(1));
    assert_eq!(a.unpin(blocks[7]), Ok(0));
    a.free(h).expect("free");
}

fn pattern_backend(cap: u64, seed: u64) -> HostBackend {
    let mut b = HostBackend::new(cap)
        .expect("backend")
        .with_seed(seed)
        .with_validation(false);
    let data: Vec<u8> = (0..cap).map(|i| (i * 7 + i / 256) as u8).collect();
    b.write(0, &data).expect("fill");
    b
}

#[test]
fn a_wrong_plan_is_caught_by_the_host_backend() {
    // Move 0 writes over the source of move 1 in the same wave, before
    // move 1 is guaranteed to have read it.
    let plan = Plan::new(
        PlanKind::Full,
        [vec![
            Move {
                key: 1,
                src: 0,
                dst: 8 * KIB,
                len: 4 * KIB,
            },
            Move {
                key: 2,
                src: 8 * KIB,
                dst: 16 * KIB,
                len: 4 * KIB,
            },
        ]],
    );
    let cap = 32 * KIB;
    // Validation names the broken rule.
    let mut strict = HostBackend::new(cap).expect("backend");
    assert!(matches!(
        strict.execute(&plan),
        Err(Error::InvalidInput { input: "plan", .. })
    ));
    // Without validation the interleaved schedule corrupts move 1's bytes.
    let mut corrupted = 0;
    for seed in 0..8 {
        let mut b = pattern_backend(cap, seed);
        let want = b.bytes()[8 * KIB as usize..12 * KIB as usize].to_vec();
        b.execute(&plan).expect("runs");
        corrupted += usize::from(b.bytes()[16 * KIB as usize..20 * KIB as usize] != want[..]);
    }
    assert!(
        corrupted > 0,
        "the strict schedule never exposed the conflict"
    );
}

#[test]
fn a_valid_chain_survives_every_schedule() {
    // Adjacent blocks sliding down by 16 B, each destination covering the
    // previous source: valid, so every interleaving must keep the bytes.
    let moves = (0..20)
        .map(|i| Move {
            key: i,
            src: 16 + i * 1000,
            dst: i * 1000,
            len: 1000,
        })
        .collect();
    let plan = Plan::new(PlanKind::Full, [moves]);
    for seed in 0..20 {
        let mut b = pattern_backend(32 * KIB, seed);
        let want = b.bytes()[16..20_016].to_vec();
        b.execute(&plan).expect("runs");
        assert_eq!(&b.bytes()[..20_000], &want[..], "seed {seed}");
    }
}

#[test]
fn a_failed_compaction_poisons_the_arena() {
    let cap = 64 * KIB;
    let mut a = Arena::with_backend(
        ArenaConfig::new(cap),
        // Its plans fail: the arena must poison itself.
        crate::errors::Faulty(HostBackend::new(cap).expect("b"), false),
    )
    .expect("arena");
    fragment(&mut a, 16, 4 * KIB);
    assert!(matches!(
        a.alloc(16 * KIB),
        Err(Error::Backend(BackendError::Driver { .. }))
    ));
    assert!(matches!(a.alloc(256), Err(Error::Poisoned { .. })));
    assert!(matches!(a.compact(), Err(Error::Poisoned { .. })));
}

#[test]
fn config_is_validated() {
    assert!(matches!(
        Arena::host(ArenaConfig::new(1000)),
        Err(Error::InvalidInput {
            input: "config",
            ..
        })
    ));
    assert!(matches!(
        Arena::host(ArenaConfig::new(4096).with_alignment_bytes(100)),
        Err(Error::InvalidAlignment { .. })
    ));
    assert!(matches!(
        Arena::host(ArenaConfig::new(0)),
        Err(Error::InvalidInput {
            input: "config",
            ..
        })
    ));
}

#[test]
fn dedicated_errors_name_what_was_asked() {
    // A backend without a host tier, asked for one.
    let r = Arena::with_backend(
        ArenaConfig::new(4 * KIB).with_spill_host_bytes(8 * KIB),
        crate::errors::Faulty(HostBackend::new(4 * KIB).expect("b"), false),
    );
    assert!(matches!(
        r,
        Err(Error::HostTierFull { requested_bytes, host_tier_bytes: 0, .. })
            if requested_bytes == 8 * KIB
    ));
    // A backend smaller than the config.
    let r = Arena::with_backend(
        ArenaConfig::new(8 * KIB),
        HostBackend::new(4 * KIB).expect("b"),
    );
    assert_eq!(
        r.err(),
        Some(Error::InvalidInput {
            input: "backend",
            reason: "its region of 4096 B is smaller than the configured capacity of 8192 B".into()
        })
    );
}

#[test]
fn stats_and_reports_display() {
    let mut a = Arena::host(ArenaConfig::new(64 * KIB)).expect("arena");
    fragment(&mut a, 16, 2 * KIB);
    let report = a.compact().expect("compact");
    let line = report.to_string();
    assert!(line.starts_with("full compaction:"), "{line}");
    assert!(line.contains("wave"), "{line}");
    let table = a.stats().to_string();
    assert_eq!(table, a.stats().summary());
    assert!(table.contains("cuarena memory summary"));
}

/// Every policy places as naive does (segregated fit, from the bottom of
/// the region it picks) until it compacts: large blocks too.
#[test]
fn every_policy_places_from_the_bottom() {
    let cap = 1024 * KIB;
    for policy in [
        CompactionPolicy::Bounded,
        CompactionPolicy::Auto,
        CompactionPolicy::Manual,
    ] {
        let mut a = Arena::host(ArenaConfig::new(cap).with_compaction(policy)).expect("arena");
        let big = a.alloc(cap / 32).expect("large");
        let small = a.alloc(4 * KIB).expect("small");
        assert_eq!(a.info(big).unwrap().offset, 0, "{policy:?}");
        assert_eq!(a.info(small).unwrap().offset, cap / 32, "{policy:?}");
    }
}
