//! Staging buffers that enqueued work may still read, reused only once the
//! device is done with them (plain data, tested without a GPU).
//!
//! A plan's move records and a table update are written by the host into
//! page-locked memory and uploaded by asynchronous copies that run whenever
//! the stream reaches them, which may be long after the call that enqueued
//! them returned. The host must not overwrite such a buffer before its copy
//! ran, and must not wait for that either (the stream may hold many
//! milliseconds of earlier work). So each buffer carries a *fence* (a CUDA
//! event recorded behind the last copy that reads it), and [`Pool::take`]
//! hands out only buffers whose fence has completed, asking the driver
//! (`cuEventQuery`) without waiting; when none has, it makes another.
//!
//! # Bounds
//!
//! Buffers are made at a power of two of words (at least the pool's
//! minimum), and only when no idle one fits, so the pool holds at most one
//! buffer per piece of enqueued work still reading one, plus one per size
//! class it ever needed. Nothing is freed before the backend is dropped:
//! freeing page-locked memory may synchronise the device, which is the wait
//! this pool exists to avoid.

use std::collections::VecDeque;

use crate::error::Result;

/// What the pool needs to know of a buffer.
pub(super) trait Fenced {
    /// Words the buffer holds.
    fn words(&self) -> usize;
    /// Whether the device has finished the work recorded behind the
    /// buffer's last use (true for a buffer never used): a query, never a
    /// wait.
    fn is_done(&self) -> Result<bool>;
}

/// Buffers handed out by [`take`](Pool::take) and handed back behind their
/// fence by [`put_busy`](Pool::put_busy).
///
/// Invariant: no enqueued work reads a buffer in `idle`; every buffer in
/// `busy` had its fence recorded behind the last work that reads it, and
/// the fences of one pool are recorded on one stream, oldest first, so they
/// complete in that order.
#[derive(Debug)]
pub(super) struct Pool<T> {
    /// Buffers no enqueued work reads.
    idle: Vec<T>,
    /// Buffers enqueued work may still read, oldest fence first.
    busy: VecDeque<T>,
    /// Smallest buffer made, in words.
    min_words: usize,
    /// Buffers made (by `take`, and added at creation).
    made: u64,
    /// Words of all buffers held (idle, busy, and handed out).
    words: usize,
}

impl<T: Fenced> Pool<T> {
    /// An empty pool whose buffers hold at least `min_words` words.
    pub(super) fn new(min_words: usize) -> Self {
        Self {
            idle: Vec::new(),
            busy: VecDeque::new(),
            min_words: min_words.max(1),
            made: 0,
            words: 0,
        }
    }

    /// Words a buffer made for a request of `words` holds.
    pub(super) fn size_for(&self, words: usize) -> usize {
        words
            .max(self.min_words)
            .checked_next_power_of_two()
            .unwrap_or(words)
    }

    /// Adds a buffer no enqueued work reads (sized ahead of time).
    pub(super) fn add_idle(&mut self, item: T) {
        self.made += 1;
        self.words += item.words();
        self.idle.push(item);
    }

    /// Moves to `idle` every busy buffer whose fence has completed, oldest
    /// first, stopping at the first that has not (later fences of the same
    /// stream cannot have completed either). Never waits.
    fn reclaim(&mut self) -> Result<()> {
        while let Some(oldest) = self.busy.front() {
            if !oldest.is_done()? {
                break;
            }
            if let Some(done) = self.busy.pop_front() {
                self.idle.push(done);
            }
        }
        Ok(())
    }

    /// A buffer of at least `words` words that no enqueued work reads: the
    /// smallest idle one that fits (after reclaiming the busy ones whose
    /// fence completed), else a new one from `make(size_for(words))`.
    /// Never waits for the device. Hand it back with
    /// [`put_busy`](Self::put_busy) once its fence is recorded behind the
    /// work that reads it, or [`put_idle`](Self::put_idle) if none does.
    pub(super) fn take(
        &mut self,
        words: usize,
        make: impl FnOnce(usize) -> Result<T>,
    ) -> Result<T> {
        self.reclaim()?;
        let best = self
            .idle
            .iter()
            .enumerate()
            .filter(|(_, b)| b.words() >= words)
            .min_by_key(|(_, b)| b.words())
            .map(|(i, _)| i);
        if let Some(i) = best {
            return Ok(self.idle.swap_remove(i));
        }
        let item = make(self.size_for(words))?;
        self.made += 1;
        self.words += item.words();
        Ok(item)
    }

    /// Hands back a buffer whose fence was just recorded behind the last
    /// work that reads it.
    pub(super) fn put_busy(&mut self, item: T) {
        self.busy.push_back(item);
    }

    /// Hands back a buffer that no enqueued work reads.
    pub(super) fn put_idle(&mut self, item: T) {
        self.idle.push(item);
    }

    /// Buffers made so far.
    pub(super) fn made(&self) -> u64 {
        self.made
    }

    /// Words of all buffers the pool made.
    pub(super) fn words(&self) -> usize {
        self.words
    }

    /// Buffers handed back whose fence had not completed when last asked.
    pub(super) fn busy_len(&self) -> usize {
        self.busy.len()
    }

    /// Takes every buffer held (to free them once nothing can read them).
    pub(super) fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.words = 0;
        self.idle.drain(..).chain(self.busy.drain(..))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;
    use crate::error::Error;

    /// A buffer whose fence completes when the shared "device clock"
    /// reaches the point recorded for it.
    #[derive(Debug)]
    struct Fake {
        id: usize,
        words: usize,
        fence: u64,
        clock: Rc<Cell<u64>>,
        queries: Rc<Cell<u64>>,
    }

    impl Fenced for Fake {
        fn words(&self) -> usize {
            self.words
        }
        fn is_done(&self) -> Result<bool> {
            self.queries.set(self.queries.get() + 1);
            Ok(self.clock.get() >= self.fence)
        }
    }

    struct World {
        clock: Rc<Cell<u64>>,
        queries: Rc<Cell<u64>>,
        next_id: usize,
        /// Device time at which the next recorded fence completes.
        queue_end: u64,
    }

    impl World {
        fn new() -> Self {
            Self {
                clock: Rc::new(Cell::new(0)),
                queries: Rc::new(Cell::new(0)),
                next_id: 0,
                queue_end: 0,
            }
        }
        fn make(&mut self, words: usize) -> Result<Fake> {
            self.next_id += 1;
            Ok(Fake {
                id: self.next_id,
                words,
                fence: 0,
                clock: Rc::clone(&self.clock),
                queries: Rc::clone(&self.queries),
            })
        }
        /// Enqueues `work` units behind everything queued and records the
        /// buffer's fence behind them.
        fn record(&mut self, b: &mut Fake, work: u64) {
            self.queue_end = self.queue_end.max(self.clock.get()) + work;
            b.fence = self.queue_end;
        }
    }

    #[test]
    fn a_buffer_still_read_is_never_handed_out() {
        let mut w = World::new();
        let mut pool = Pool::new(64);
        // Three plans queued behind a long kernel: each takes a buffer
        // while the earlier ones are still being read.
        let mut ids = Vec::new();
        for _ in 0..3 {
            let mut b = pool.take(100, |n| w.make(n)).expect("take");
            assert_eq!(b.words, 128, "a power of two");
            assert!(!ids.contains(&b.id), "reused a buffer still read");
            ids.push(b.id);
            w.record(&mut b, 1000);
            pool.put_busy(b);
        }
        assert_eq!(pool.made(), 3);
        assert_eq!(pool.busy_len(), 3);
        // The device finishes the first plan only: its buffer comes back.
        w.clock.set(1000);
        let b = pool.take(100, |n| w.make(n)).expect("take");
        assert_eq!(b.id, ids[0]);
        assert_eq!(pool.made(), 3);
        pool.put_idle(b);
        // Everything done: no new buffer for any number of plans.
        w.clock.set(u64::MAX);
        for _ in 0..10 {
            let mut b = pool.take(128, |n| w.make(n)).expect("take");
            w.record(&mut b, 1);
            pool.put_busy(b);
        }
        assert_eq!(pool.made(), 3);
        assert_eq!(pool.words(), 3 * 128);
    }

    #[test]
    fn the_smallest_idle_buffer_that_fits_is_taken() {
        let mut w = World::new();
        let mut pool = Pool::new(16);
        pool.add_idle(w.make(1024).expect("make"));
        pool.add_idle(w.make(64).expect("make"));
        pool.add_idle(w.make(256).expect("make"));
        assert_eq!(pool.take(100, |n| w.make(n)).expect("take").words, 256);
        assert_eq!(pool.take(10, |n| w.make(n)).expect("take").words, 64);
        // Larger than any idle buffer: a new one, a power of two.
        let big = pool.take(5000, |n| w.make(n)).expect("take");
        assert_eq!(big.words, 8192);
        assert_eq!(pool.made(), 4);
        // A minimum applies to requests below it.
        assert_eq!(pool.size_for(1), 16);
        assert_eq!(pool.size_for(17), 32);
    }

    #[test]
    fn reclaiming_stops_at_the_first_pending_fence() {
        let mut w = World::new();
        let mut pool = Pool::new(8);
        for _ in 0..50 {
            let mut b = pool.take(8, |n| w.make(n)).expect("take");
            w.record(&mut b, 10);
            pool.put_busy(b);
        }
        // Nothing done: one query (the oldest), not fifty.
        let before = w.queries.get();
        let _b = pool.take(8, |n| w.make(n)).expect("take");
        assert_eq!(w.queries.get() - before, 1);
        // Half done: those come back in order.
        w.clock.set(250);
        pool.reclaim().expect("reclaim");
        assert_eq!(pool.busy_len(), 25);
    }

    #[test]
    fn a_failed_make_leaves_the_pool_as_it_was() {
        let mut w = World::new();
        let mut pool: Pool<Fake> = Pool::new(8);
        let mut b = pool.take(8, |n| w.make(n)).expect("take");
        w.record(&mut b, 10);
        pool.put_busy(b);
        let r = pool.take(8, |_| {
            Err(Error::InvalidInput {
                input: "config",
                reason: "no memory".to_owned(),
            })
        });
        assert!(r.is_err());
        assert_eq!((pool.made(), pool.busy_len(), pool.words()), (1, 1, 8));
        assert_eq!(pool.drain().count(), 1);
        assert_eq!(pool.words(), 0);
    }
}
