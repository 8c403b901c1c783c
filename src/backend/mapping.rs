//! The mapped prefix of a reserved range, as chunks: what an elastic
//! region's backend keeps to know which bytes it may touch.
//!
//! Pure data: the host and metadata backends keep one to model mapping
//! (the host one refuses every access above the mapped end), and the CUDA
//! backend keeps the same ends beside its physical allocations. A chunk is
//! mapped and unmapped whole, as `cuMemUnmap` requires of what one
//! `cuMemMap` mapped.

use crate::error::{Error, Result};

/// The chunks mapped at the bottom of a reserved range. Invariants: `ends`
/// ascend strictly, every end is a multiple of `granularity_bytes`, and the
/// last (the mapped end) is at most `reserved_bytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chunks {
    reserved_bytes: u64,
    granularity_bytes: u64,
    ends: Vec<u64>,
    /// Mapped whole at creation, never unmapped.
    fixed: bool,
}

impl Chunks {
    /// Nothing mapped of `reserved_bytes` (rounded down to the granularity,
    /// a power of two).
    pub(crate) fn new(reserved_bytes: u64, granularity_bytes: u64) -> Self {
        let g = granularity_bytes.max(1).next_power_of_two();
        Self {
            reserved_bytes: reserved_bytes & !(g - 1),
            granularity_bytes: g,
            ends: Vec::new(),
            fixed: false,
        }
    }

    /// Everything mapped at once, as one chunk: a fixed region.
    pub(crate) fn fixed(bytes: u64) -> Self {
        Self {
            reserved_bytes: bytes,
            granularity_bytes: 1,
            ends: if bytes > 0 { vec![bytes] } else { Vec::new() },
            fixed: true,
        }
    }

    pub(crate) fn reserved_bytes(&self) -> u64 {
        self.reserved_bytes
    }

    pub(crate) fn granularity_bytes(&self) -> u64 {
        self.granularity_bytes
    }

    /// The mapped end: `[0, mapped)` may be touched.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Chunks mapped now.
    pub(crate) fn count(&self) -> usize {
        self.ends.len()
    }

    /// Checks a new chunk `[mapped, end)`: above the mapped end, a multiple
    /// of the granularity, within the reserve. Returns its length.
    pub(crate) fn check_map(&self, end: u64) -> Result<u64> {
        let mapped = self.mapped_bytes();
        if self.fixed
            || end <= mapped
            || end % self.granularity_bytes != 0
            || end > self.reserved_bytes
        {
            return Err(Error::InvalidInput {
                input: "mapping",
                reason: format!(
                    "a chunk must end above the mapped end {mapped} B, at a multiple of the \
                     granularity {} B, within the reserve of {} B: not at {end} B",
                    self.granularity_bytes, self.reserved_bytes
                ),
            });
        }
        Ok(end - mapped)
    }

    /// Records the chunk `[mapped, end)` (checked by [`check_map`](Self::check_map)).
    pub(crate) fn push(&mut self, end: u64) {
        debug_assert!(self.check_map(end).is_ok());
        self.ends.push(end);
    }

    /// The chunks to unmap so that the mapped end is the lowest chunk end
    /// at or above `end`: how many (from the top) and that new end.
    /// A fixed region unmaps nothing.
    pub(crate) fn above(&self, end: u64) -> (usize, u64) {
        if self.fixed {
            return (0, self.mapped_bytes());
        }
        let keep = self.ends.partition_point(|&e| e < end);
        let keep = if keep < self.ends.len() {
            keep + 1
        } else {
            keep
        };
        let keep = if end == 0 { 0 } else { keep };
        let new_end = keep.checked_sub(1).map_or(0, |i| self.ends[i]);
        (self.ends.len() - keep, new_end)
    }

    /// Drops the top `n` chunks.
    pub(crate) fn pop(&mut self, n: usize) {
        self.ends.truncate(self.ends.len().saturating_sub(n));
    }
}

/// A clock set by hand, or the backend's default ([`None`] until set):
/// shared-reference interior mutability, so that a replay can move the
/// time of an arena's backend through [`crate::Arena::backend`].
#[derive(Debug, Default)]
pub(crate) struct ManualClock(std::sync::atomic::AtomicU64);

impl ManualClock {
    const UNSET: u64 = 0;

    /// The time set, if any.
    pub(crate) fn get(&self) -> Option<u64> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            Self::UNSET => None,
            t => Some(t - 1),
        }
    }

    pub(crate) fn set(&self, time_us: u64) {
        let t = time_us.saturating_add(1);
        self.0.store(t, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Clone for ManualClock {
    fn clone(&self) -> Self {
        Self(std::sync::atomic::AtomicU64::new(
            self.0.load(std::sync::atomic::Ordering::Relaxed),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_map_and_unmap_whole() {
        let mut c = Chunks::new(1000, 10);
        assert_eq!((c.reserved_bytes(), c.granularity_bytes()), (992, 16));
        assert!(c.check_map(8).is_err(), "not a multiple of the granule");
        assert!(c.check_map(1008).is_err(), "past the reserve");
        assert_eq!(c.check_map(32).unwrap(), 32);
        c.push(32);
        c.push(64);
        c.push(128);
        assert!(c.check_map(64).is_err(), "below the mapped end");
        assert_eq!(c.mapped_bytes(), 128);
        // Down to 40: the chunk [32, 64) holds byte 39 and stays.
        assert_eq!(c.above(40), (1, 64));
        assert_eq!(c.above(64), (1, 64));
        assert_eq!(c.above(65), (0, 128));
        assert_eq!(c.above(0), (3, 0));
        c.pop(2);
        assert_eq!((c.mapped_bytes(), c.count()), (32, 1));
        let f = Chunks::fixed(100);
        assert_eq!((f.mapped_bytes(), f.above(1)), (100, (0, 100)));
    }
}
