//! The statistics a shared arena publishes after every exclusive call, so
//! that [`crate::SharedArena::stats`] reads them without the arena's lock.
//!
//! A sequence lock over atomics: the publisher (one at a time: it holds the
//! arena's exclusive lock) makes the sequence odd, stores every field, and
//! makes it even again; a reader copies the fields between two reads of an
//! even, unchanged sequence, and retries otherwise. Readers never block a
//! publisher and never wait for arena work, only (rarely) for the few dozen
//! stores of a publish in progress. Every access is atomic, so a torn copy
//! is discarded, never undefined. A `Mutex<Stats>` would do as well, but
//! would make a reader wait for a publisher descheduled while holding it.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::Duration;

use super::{PolicyStats, Stats};

/// Fields of [`Stats`], each as one `u64`.
const WORDS: usize = 39;

/// `s` as words (durations in nanoseconds, saturated; the fraction as its
/// bits).
fn encode(s: &Stats) -> [u64; WORDS] {
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    [
        s.capacity_bytes,
        s.allocated_bytes,
        s.requested_bytes,
        s.free_bytes,
        s.largest_free_bytes,
        s.fragmentation.to_bits(),
        s.live_blocks,
        s.free_regions,
        s.pinned_blocks,
        s.peak_allocated_bytes,
        s.allocs,
        s.frees,
        s.failed_allocs,
        s.targeted_compactions,
        s.full_compactions,
        s.moves,
        s.bytes_moved,
        nanos(s.planning_time),
        nanos(s.compaction_time),
        s.evictions,
        s.restores,
        s.bytes_evicted,
        s.bytes_restored,
        s.host_tier_used_bytes,
        s.pending_reclaim,
        s.policy.naive_bytes_moved,
        s.policy.naive_failures,
        u64::from(s.policy.bound_ended),
        s.policy.deferred_bytes,
        s.policy.away_bytes,
        s.policy.bound_bytes,
        s.policy.handovers,
        s.policy.handover_bytes,
        s.policy.free_entries,
        s.policy.planning_visits,
        s.policy.budget_compactions,
        s.piece_plans,
        s.peak_mapped_bytes,
        s.trims,
    ]
}

/// The inverse of [`encode`].
fn decode(w: [u64; WORDS]) -> Stats {
    Stats {
        capacity_bytes: w[0],
        allocated_bytes: w[1],
        requested_bytes: w[2],
        free_bytes: w[3],
        largest_free_bytes: w[4],
        fragmentation: f64::from_bits(w[5]),
        live_blocks: w[6],
        free_regions: w[7],
        pinned_blocks: w[8],
        peak_allocated_bytes: w[9],
        allocs: w[10],
        frees: w[11],
        failed_allocs: w[12],
        targeted_compactions: w[13],
        full_compactions: w[14],
        moves: w[15],
        bytes_moved: w[16],
        planning_time: Duration::from_nanos(w[17]),
        compaction_time: Duration::from_nanos(w[18]),
        evictions: w[19],
        restores: w[20],
        bytes_evicted: w[21],
        bytes_restored: w[22],
        host_tier_used_bytes: w[23],
        pending_reclaim: w[24],
        policy: PolicyStats {
            naive_bytes_moved: w[25],
            naive_failures: w[26],
            bound_ended: w[27] != 0,
            deferred_bytes: w[28],
            away_bytes: w[29],
            bound_bytes: w[30],
            handovers: w[31],
            handover_bytes: w[32],
            free_entries: w[33],
            planning_visits: w[34],
            budget_compactions: w[35],
        },
        piece_plans: w[36],
        peak_mapped_bytes: w[37],
        trims: w[38],
    }
}

/// The last published [`Stats`]; see the [module documentation](self).
#[derive(Debug)]
pub(super) struct StatsCell {
    /// Even: `words` hold a whole snapshot; odd: a publish is under way.
    seq: AtomicU64,
    words: [AtomicU64; WORDS],
}

impl StatsCell {
    pub(super) fn new(s: &Stats) -> Self {
        Self {
            seq: AtomicU64::new(0),
            words: encode(s).map(AtomicU64::new),
        }
    }

    /// Publishes `s`. Callers must not publish concurrently (they hold the
    /// arena's exclusive lock, which also orders one publish after another).
    pub(super) fn publish(&self, s: &Stats) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        // The odd sequence is visible before any field changes.
        fence(Ordering::Release);
        for (w, v) in self.words.iter().zip(encode(s)) {
            w.store(v, Ordering::Relaxed);
        }
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The last published snapshot, whole.
    pub(super) fn read(&self) -> Stats {
        let mut tries = 0u32;
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 0 {
                let words = self.words.each_ref().map(|w| w.load(Ordering::Relaxed));
                // The field loads happen before the second sequence load.
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return decode(words);
                }
            }
            // A publish is under way: it is a few dozen stores, unless its
            // thread was descheduled, when yielding lets it finish.
            tries += 1;
            if tries < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_round_trip_and_are_never_torn() {
        let stats = |k: u64| Stats {
            capacity_bytes: k,
            allocated_bytes: k,
            requested_bytes: k,
            live_blocks: k,
            host_tier_used_bytes: k,
            pending_reclaim: k,
            fragmentation: k as f64,
            planning_time: Duration::from_nanos(k),
            ..Stats::default()
        };
        let cell = std::sync::Arc::new(StatsCell::new(&stats(0)));
        assert_eq!(cell.read(), stats(0));
        let w = std::sync::Arc::clone(&cell);
        let writer = std::thread::spawn(move || {
            for k in 1..=20_000 {
                w.publish(&stats(k));
            }
        });
        let mut last = 0;
        while last < 20_000 {
            let s = cell.read();
            let k = s.capacity_bytes;
            assert_eq!(s, stats(k), "a torn snapshot");
            assert!(k >= last, "snapshots go back in time");
            last = k;
        }
        writer.join().unwrap();
    }
}
