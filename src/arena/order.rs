//! The stream order: what work on other streams must wait for.
//!
//! The arena's own stream runs moves, writes, fills, copies and frees;
//! another stream's kernels must be ordered after the ones that touch
//! their bytes. [`StreamOrder`] counts that work (`epoch`) and remembers,
//! per registered stream, the count it last joined, so that a stream waits
//! for the arena's stream only when something new was queued there.

use std::sync::atomic::{AtomicU64, Ordering};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct StreamOrder {
    /// Counts the arena stream's work that other streams must be ordered
    /// after (moves, writes, fills, copies, frees).
    pub(super) epoch: u64,
    /// Per registered stream (index 0, the arena's, unused), the `epoch`
    /// it last joined. Atomic so that kernel arguments, taken under a
    /// shared arena's shared lock, can note joins; it grows only when a
    /// stream is registered (exclusive), up to
    /// [`MAX_STREAMS`](crate::stream::MAX_STREAMS) entries.
    pub(super) joined: Vec<AtomicU64>,
    /// Whether a stream other than the arena's was registered, so that a
    /// block may have been used on one: until then a compaction need not
    /// look up the moved blocks' stream records.
    pub(super) other_streams: bool,
}

impl StreamOrder {
    /// The order of a backend that has `streams` registered already.
    pub(super) fn new(streams: u32) -> Self {
        Self {
            epoch: 0,
            joined: (0..streams).map(|_| AtomicU64::new(u64::MAX)).collect(),
            other_streams: streams > 1,
        }
    }

    /// Work was queued on the arena stream that later kernel arguments on
    /// other streams must wait for.
    pub(super) fn queued(&mut self) {
        self.epoch += 1;
    }

    /// Stream `i` was registered (index 0 is the arena's).
    pub(super) fn registered(&mut self, i: usize) {
        while self.joined.len() <= i {
            self.joined.push(AtomicU64::new(u64::MAX)); // never joined
        }
        self.other_streams |= i > 0;
    }

    /// Whether stream `i`'s last join is older than the arena stream's
    /// latest work (`None`: an unknown stream).
    pub(super) fn behind(&self, i: usize) -> Option<bool> {
        let j = self.joined.get(i)?;
        Some(j.load(Ordering::Acquire) != self.epoch)
    }

    /// Stream `i` has joined the arena stream's latest work.
    pub(super) fn joined_now(&self, i: usize) {
        if let Some(j) = self.joined.get(i) {
            j.store(self.epoch, Ordering::Release);
        }
    }
}
