//! Unit tests of the arena's limits: ids that never repeat, a bounded
//! stream registry, byte counters that stay exact near 2^64.

use std::sync::atomic::AtomicU64;

use super::{take_arena_id, Arena};
use crate::config::ArenaConfig;
use crate::error::Error;
use crate::stream::MAX_STREAMS;

#[test]
fn arena_ids_are_refused_past_the_last_never_reused() {
    let counter = AtomicU64::new(u64::MAX - 2);
    assert_eq!(take_arena_id(&counter), Ok(u64::MAX - 2));
    assert_eq!(take_arena_id(&counter), Ok(u64::MAX - 1));
    for _ in 0..3 {
        assert_eq!(
            take_arena_id(&counter),
            Err(Error::LimitReached {
                what: "arena ids in this process",
                requested: u64::MAX,
                limit: u64::MAX - 1,
            })
        );
    }
    // Ids of live arenas are 64-bit and distinct.
    let a = Arena::host(ArenaConfig::new(1 << 12)).unwrap();
    let b = Arena::host(ArenaConfig::new(1 << 12)).unwrap();
    assert_ne!(a.id(), b.id());
}

#[test]
fn stream_registration_stops_at_the_limit_and_waits_still_work() {
    let mut a = Arena::host(ArenaConfig::new(1 << 12)).unwrap();
    let mut last = crate::StreamId::ARENA;
    for _ in 1..MAX_STREAMS {
        last = a.register_stream(()).unwrap();
    }
    assert_eq!(last.index(), MAX_STREAMS - 1);
    let refused = a.register_stream(()).unwrap_err();
    assert!(
        matches!(refused, Error::LimitReached { limit, .. } if limit == u64::from(MAX_STREAMS)),
        "{refused}"
    );
    // The per-stream table is as large as the registry, no larger.
    assert_eq!(a.core.order.joined.len(), MAX_STREAMS as usize);
    let x = a.alloc_storage(64).unwrap();
    a.record_stream(&x, last).unwrap();
    a.wait_on_arena(last).unwrap();
    a.fill(&x, 1u8).unwrap();
    a.wait_on_arena(last).unwrap();
}

#[test]
fn requested_bytes_stay_exact_up_to_u64_max() {
    // Region plus host tier past u64::MAX: refused up front.
    let over = ArenaConfig::new(1 << 63).with_spill_host_bytes(1 << 63);
    assert!(matches!(
        Arena::metadata(over),
        Err(Error::InvalidInput {
            input: "config",
            ..
        })
    ));
    // Just within: four blocks, two resident and two spilled, request
    // 2^64 - 1024 B in all, counted exactly.
    let config = ArenaConfig::new(1 << 63).with_spill_host_bytes((1 << 63) - 256);
    let mut a = Arena::metadata(config).unwrap();
    let x = (1u64 << 62) - 256;
    let blocks: Vec<_> = (0..4).map(|_| a.alloc(x).unwrap()).collect();
    let st = a.stats();
    assert_eq!(st.requested_bytes, u64::MAX - 1023);
    assert_eq!(st.evictions, 2);
    for h in blocks {
        a.free(h).unwrap();
    }
    assert_eq!(a.stats().requested_bytes, 0);
}
