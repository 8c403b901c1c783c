//! Size classes and the two-level occupancy bitmap of [`super::FreeIndex`].
//!
//! A size class ("bin") is a tiny float: 4 mantissa bits under an implicit
//! leading one, so each power of two is cut into 16 classes and a class spans
//! at most 1/16 of its lower bound. Sizes below 16 get one exact class each.
//! Every `u64` maps to a class below [`NUM_BINS`], so there is no overflow bin.

/// Mantissa bits per class; 4 keeps classes within 6.25% of their size, so the
/// fallback scan of a partial class has few candidates, at 976 bins in total.
const MANTISSA_BITS: u32 = 4;
const MANTISSA_VALUE: u64 = 1 << MANTISSA_BITS;
const MANTISSA_MASK: u32 = (1 << MANTISSA_BITS) - 1;

/// Number of size classes: the class of `u64::MAX`, plus one.
pub(super) const NUM_BINS: usize = 976;

/// Words of the leaf bitmap: one bit per class.
const WORDS: usize = NUM_BINS.div_ceil(64);

// The summary word has one bit per leaf word.
const _: () = assert!(WORDS <= 32);
const _: () = assert!(bin_round_down(u64::MAX) as usize == NUM_BINS - 1);

/// The class of a free region of `size` bytes: the largest class whose
/// lower bound is `<= size`. Free regions are filed here.
pub(super) const fn bin_round_down(size: u64) -> u32 {
    if size < MANTISSA_VALUE {
        size as u32
    } else {
        let shift = size.ilog2() - MANTISSA_BITS;
        ((shift + 1) << MANTISSA_BITS) | ((size >> shift) as u32 & MANTISSA_MASK)
    }
}

/// The smallest class whose lower bound is `>= size`: every region filed
/// there or above holds `size` bytes. May return `NUM_BINS` (no such class).
pub(super) const fn bin_round_up(size: u64) -> u32 {
    let bin = bin_round_down(size);
    if size >= MANTISSA_VALUE {
        let shift = size.ilog2() - MANTISSA_BITS;
        if size & ((1 << shift) - 1) != 0 {
            // Carrying out of the mantissa lands on the next exponent's
            // first class, which is exactly the next class up.
            return bin + 1;
        }
    }
    bin
}

/// The smallest size filed in `bin`.
#[cfg(test)]
pub(super) const fn bin_min_size(bin: u32) -> u64 {
    let exp = bin >> MANTISSA_BITS;
    let mantissa = (bin & MANTISSA_MASK) as u64;
    if exp == 0 {
        mantissa
    } else {
        (mantissa | MANTISSA_VALUE) << (exp - 1)
    }
}

/// Which classes hold at least one free region: a bit per class in `leaf`,
/// and a bit per nonzero `leaf` word in `summary`, so "first nonempty class
/// at or above `b`" is two `trailing_zeros`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Bitmap {
    /// Bit `b % 64` of word `b / 64` is set iff class `b` is nonempty.
    leaf: [u64; WORDS],
    /// Bit `w` is set iff `leaf[w] != 0`.
    summary: u32,
}

impl Bitmap {
    /// Marks `bin` nonempty.
    #[inline]
    pub(super) fn set(&mut self, bin: u32) {
        let w = (bin >> 6) as usize;
        self.leaf[w] |= 1 << (bin & 63);
        self.summary |= 1 << w;
    }

    /// Marks `bin` empty.
    #[inline]
    pub(super) fn clear(&mut self, bin: u32) {
        let w = (bin >> 6) as usize;
        self.leaf[w] &= !(1 << (bin & 63));
        if self.leaf[w] == 0 {
            self.summary &= !(1 << w);
        }
    }

    /// Whether `bin` is marked nonempty.
    #[cfg(test)]
    pub(super) fn get(&self, bin: u32) -> bool {
        self.leaf[(bin >> 6) as usize] & (1 << (bin & 63)) != 0
    }

    /// Whether the summary agrees with the leaf words.
    #[cfg(test)]
    pub(super) fn summary_consistent(&self) -> bool {
        (0..WORDS).all(|w| (self.leaf[w] != 0) == (self.summary & (1 << w) != 0))
    }

    /// The first nonempty class `>= bin`, if any.
    #[inline]
    pub(super) fn first_at_or_above(&self, bin: u32) -> Option<u32> {
        if bin as usize >= NUM_BINS {
            return None;
        }
        let w = (bin >> 6) as usize;
        let here = self.leaf[w] & (u64::MAX << (bin & 63));
        if here != 0 {
            return Some(((w as u32) << 6) | here.trailing_zeros());
        }
        // `w + 1 <= WORDS <= 32`; a shift by 32 would overflow, hence u64.
        let above = (self.summary as u64) & (u64::MAX << (w + 1));
        if above == 0 {
            return None;
        }
        let w = above.trailing_zeros();
        Some((w << 6) | self.leaf[w as usize].trailing_zeros())
    }

    /// The last nonempty class, if any.
    #[inline]
    pub(super) fn last(&self) -> Option<u32> {
        if self.summary == 0 {
            return None;
        }
        let w = self.summary.ilog2();
        Some((w << 6) | self.leaf[w as usize].ilog2())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_bracket_sizes() {
        let mut sizes: Vec<u64> = (0..5000).collect();
        for s in 4..64 {
            let p = 1u64 << s;
            sizes.extend([p - 1, p, p + 1, p + p / 16, p + p / 16 - 1, p + p / 16 + 1]);
        }
        sizes.push(u64::MAX);
        for &size in &sizes {
            let down = bin_round_down(size);
            let up = bin_round_up(size);
            assert!((down as usize) < NUM_BINS, "{size}");
            assert!(bin_min_size(down) <= size, "{size}");
            if (down as usize) + 1 < NUM_BINS {
                assert!(bin_min_size(down + 1) > size, "{size}");
            }
            assert!(up == down || up == down + 1, "{size}");
            if (up as usize) < NUM_BINS {
                assert!(bin_min_size(up) >= size, "{size}");
            }
            if up > 0 && up == down + 1 {
                assert!(bin_min_size(up - 1) < size, "{size}");
            }
        }
        assert_eq!(bin_round_up(u64::MAX) as usize, NUM_BINS);
    }

    #[test]
    fn bitmap_search() {
        let mut m = Bitmap::default();
        assert_eq!(m.first_at_or_above(0), None);
        assert_eq!(m.last(), None);
        for b in [3u32, 63, 64, 500, 975] {
            m.set(b);
        }
        assert_eq!(m.first_at_or_above(0), Some(3));
        assert_eq!(m.first_at_or_above(4), Some(63));
        assert_eq!(m.first_at_or_above(64), Some(64));
        assert_eq!(m.first_at_or_above(65), Some(500));
        assert_eq!(m.first_at_or_above(501), Some(975));
        assert_eq!(m.first_at_or_above(976), None);
        assert_eq!(m.last(), Some(975));
        m.clear(975);
        assert_eq!(m.first_at_or_above(501), None);
        assert_eq!(m.last(), Some(500));
        assert!(m.summary_consistent());
    }
}
