//! Lifetime prediction by exact size, for placement.
//!
//! Frameworks allocate the same sizes at the same program points in every
//! step of a training loop, so how long the last blocks of a size lived
//! predicts how long the next one will. [`Lifetimes`] keeps, per size, a
//! running mean of the lifetimes seen at free (in allocation ticks) and of
//! their deviation from it; a size whose blocks reliably die young is
//! *short-lived*, and with lifetime placement (opt-in,
//! `ArenaConfig::lifetime_placement`) the arena carves those from the top
//! of the free region it picks ([`super::FreeIndex::alloc_high`]), like
//! large blocks (`ArenaConfig::large_block_divisor`), while other sizes are
//! carved from the bottom (but for long-lived ones, below). Short-lived
//! blocks thus gather at
//! the top of free space, where their deaths leave holes next to the free
//! space rather than between long-lived blocks, and a compaction finds
//! fewer live bytes between the holes.
//!
//! The other end: a size whose blocks reliably outlive half the average
//! block is *long-lived*, and with large blocks kept apart
//! (`ArenaConfig::large_block_divisor`, the default) the arena carves
//! those from the top as well, beside the large blocks, out of the churn of
//! the rest. A long-lived block left among short-lived ones is what a
//! compaction at the limit must slide past when the holes around it merge
//! (BENCHMARKS.md, "Runs of 2026-11-25, fourth pass").
//!
//! Bounded memory and O(1) per call: a direct-mapped table of [`SLOTS`]
//! entries keyed by size; a size that collides replaces the one there,
//! which is forgotten: neither short- nor long-lived again (the bottom).

/// Entries of the table. A training step allocates a few hundred to a few
/// thousand distinct sizes; a collision only forgets a size (it is then
/// placed as before), so a small table costs little. 48 KiB per arena.
pub const SLOTS: usize = 2048;

#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    /// The size this entry describes (0: empty).
    size: u64,
    /// Running mean of the lifetimes of freed blocks of `size`, in ticks.
    mean: u64,
    /// Running mean of `|lifetime - mean|`, in ticks.
    dev: u64,
}

/// Per-size lifetime statistics: see the [module docs](self).
#[derive(Clone)]
pub struct Lifetimes {
    table: Box<[Entry]>,
}

impl std::fmt::Debug for Lifetimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let known = self.table.iter().filter(|e| e.size != 0).count();
        f.debug_struct("Lifetimes").field("sizes", &known).finish()
    }
}

impl Default for Lifetimes {
    fn default() -> Self {
        Self::new()
    }
}

impl Lifetimes {
    /// An empty table: no size is known: none is predicted short- or long-lived.
    pub fn new() -> Self {
        Lifetimes {
            table: vec![Entry::default(); SLOTS].into_boxed_slice(),
        }
    }

    fn slot(size: u64) -> usize {
        // Fibonacci hashing: sizes are multiples of the alignment, so the
        // low bits alone would crowd a few slots.
        (size.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % SLOTS
    }

    /// Records that a block of `size` bytes lived `life` ticks.
    pub fn observe(&mut self, size: u64, life: u64) {
        let e = &mut self.table[Self::slot(size)];
        if e.size != size {
            *e = Entry {
                size,
                mean: life,
                dev: 0,
            };
            return;
        }
        // Weight 1/2 for the newest: a program point's lifetime is what
        // the last step or two showed, and a changed program is followed
        // within a few frees.
        let dev = life.abs_diff(e.mean);
        e.mean = e.mean / 2 + life / 2;
        e.dev = e.dev / 2 + dev / 2;
    }

    /// Whether blocks of `size` are expected to die within `horizon` ticks:
    /// their mean lifetime plus its mean deviation is below it. Unknown
    /// sizes are not (they keep the default, low placement). Sizes whose
    /// lifetimes scatter (random programs) seldom pass, so their placement
    /// stays as it was.
    pub fn short_lived(&self, size: u64, horizon: u64) -> bool {
        let e = &self.table[Self::slot(size)];
        e.size == size && e.mean.saturating_add(e.dev) < horizon
    }

    /// Whether blocks of `size` are expected to live longer than `horizon`
    /// ticks: their mean lifetime minus its mean deviation is above it.
    /// Unknown sizes are not (a block never freed teaches nothing).
    pub fn long_lived(&self, size: u64, horizon: u64) -> bool {
        let e = &self.table[Self::slot(size)];
        e.size == size && e.mean.saturating_sub(e.dev) > horizon
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_sizes_are_long_lived() {
        let l = Lifetimes::new();
        assert!(!l.short_lived(4096, u64::MAX));
    }

    #[test]
    fn consistent_short_lifetimes_are_short() {
        let mut l = Lifetimes::new();
        for _ in 0..4 {
            l.observe(4096, 10);
        }
        assert!(l.short_lived(4096, 100));
        assert!(!l.short_lived(4096, 10));
        // Another size is unaffected.
        assert!(!l.short_lived(8192, 100));
    }

    #[test]
    fn scattered_lifetimes_are_not_short() {
        let mut l = Lifetimes::new();
        for life in [1, 190, 2, 180, 3, 170] {
            l.observe(4096, life);
        }
        // The mean alone (~90) is below 100; with its deviation it is not.
        assert!(!l.short_lived(4096, 100));
    }

    #[test]
    fn a_long_life_is_followed() {
        let mut l = Lifetimes::new();
        l.observe(4096, 10);
        assert!(l.short_lived(4096, 100));
        l.observe(4096, 1_000);
        assert!(!l.short_lived(4096, 100));
    }
}
