//! Best fit with the wilderness last: the choice [`Fit::Best`] makes.
//!
//! An elastic arena maps memory only up to where its highest block ends,
//! and gives back what lies free above it. There the free region at the
//! top of the space (the wilderness, as dlmalloc calls it) is not a hole
//! like the others: a block carved from it raises the end that has to stay
//! mapped, while a hole below costs nothing. And good fit's shortcut (the
//! head of a class whose every region holds the request) passes over the
//! holes of the request's own class, which are just the ones a buffer that
//! grows a little at a time (a KV cache) leaves behind: it then takes a
//! larger region, often the wilderness, and the holes it skipped stay.
//! Best fit with the wilderness last is the classic answer to both (it and
//! address-ordered first fit fragment least on real programs: Johnstone
//! and Wilson, "The memory fragmentation problem: solved?", ISMM 1998).

use super::bins::bin_round_down;
use super::nodes::{fit, NIL};
use super::FreeIndex;

/// How [`FreeIndex::alloc`] chooses among the free regions that hold a
/// request. Either way it fails only if no region holds the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Fit {
    /// The head of the smallest class whose regions all hold the request
    /// (OffsetAllocator's good fit): O(1). Fixed arenas.
    #[default]
    Good,
    /// The smallest region that holds the request, the lowest on a tie,
    /// and the region at the top of the space only when no other holds
    /// it. Looks at up to [`BEST_SCAN`] regions of each class it visits:
    /// O(1) still, best among those. Elastic arenas.
    Best,
}

/// Regions looked at per class by [`Fit::Best`]: a bound on the cost of
/// an allocation, not a tuned figure (a class holds regions within 1/16 of
/// each other in size, so past a few the choice barely matters).
pub(super) const BEST_SCAN: usize = 16;

/// A candidate region: its size and offset (the order of preference), node,
/// class and padding.
type Pick = (u64, u64, u32, u32, u64);

impl FreeIndex {
    /// [`Fit::Best`]'s region for `size` at `align_mask`: node, class and
    /// padding, or `None` if no region holds it.
    pub(super) fn best_fit(&self, size: u64, align_mask: u64) -> Option<(u32, u32, u64)> {
        let mut top: Option<Pick> = None;
        // Whether a class had regions past the bound that were not looked at.
        let mut cut = false;
        // The request's own class, where regions may be too small, then the
        // classes above it, where (but for padding) all hold it.
        let mut next = self.classes.first_at_or_above(bin_round_down(size));
        while let Some((bin, head)) = next {
            let mut best: Option<Pick> = None;
            let mut node = head;
            let mut seen = 0;
            while node != NIL && seen < BEST_SCAN {
                let n = &self.nodes[node as usize];
                if let Some(pad) = fit(n, size, align_mask) {
                    let pick = (n.size, n.offset, node, bin, pad);
                    let slot = if n.addr_next == NIL {
                        &mut top
                    } else {
                        &mut best
                    };
                    if slot.is_none_or(|b| (pick.0, pick.1) < (b.0, b.1)) {
                        *slot = Some(pick);
                    }
                }
                node = n.bin_next;
                seen += 1;
            }
            if let Some((_, _, node, bin, pad)) = best {
                return Some((node, bin, pad));
            }
            cut |= node != NIL;
            next = self.classes.first_at_or_above(bin + 1);
        }
        // Only the top, or nothing, among the regions looked at: what the
        // bound left unseen may still hold the request below the top.
        let below_top = cut.then(|| self.scan_where(size, align_mask, |n| n.addr_next != NIL));
        match (below_top.flatten(), top) {
            (Some(found), _) => Some(found),
            (None, Some((_, _, node, bin, pad))) => Some((node, bin, pad)),
            (None, None) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Holes of 1000 and 1080 bytes below a large free top, each between
    /// used blocks; and the index's used blocks, to free.
    fn two_holes_and_a_top(fit: Fit) -> FreeIndex {
        let mut ix = FreeIndex::new(100_000).with_fit(fit);
        let mut blocks = Vec::new();
        for size in [500, 1000, 500, 1080, 500] {
            blocks.push(ix.alloc(size, 1).expect("fits"));
        }
        ix.free(blocks.swap_remove(3)).expect("live");
        ix.free(blocks.swap_remove(1)).expect("live");
        std::mem::forget(blocks);
        ix
    }

    #[test]
    fn best_fit_takes_the_smallest_hole_that_holds_the_request() {
        // 1050 bytes fit only the 1080-byte hole (at 2000); 990 fit both,
        // and the smaller one (at 500) is taken.
        let mut ix = two_holes_and_a_top(Fit::Best);
        assert_eq!(ix.alloc(1050, 1).map(|a| a.offset()), Some(2000));
        let mut ix = two_holes_and_a_top(Fit::Best);
        assert_eq!(ix.alloc(990, 1).map(|a| a.offset()), Some(500));
        ix.check_invariants().expect("valid");
    }

    #[test]
    fn the_top_is_taken_only_when_no_hole_below_holds_the_request() {
        // Good fit takes the head of a class whose regions all hold 1050
        // bytes: the top (the 1080-byte hole shares 1050's class,
        // [1024, 1088)). Best fit takes the hole.
        let mut good = two_holes_and_a_top(Fit::Good);
        assert_eq!(good.alloc(1050, 1).map(|a| a.offset()), Some(3580));
        let mut best = two_holes_and_a_top(Fit::Best);
        assert_eq!(best.alloc(1050, 1).map(|a| a.offset()), Some(2000));
        // Nothing below holds 1200 bytes: the top, at its bottom.
        assert_eq!(best.alloc(1200, 1).map(|a| a.offset()), Some(3580));
        // Nothing at all holds more than the top: exact failure.
        assert!(best.alloc(100_000, 1).is_none());
        best.check_invariants().expect("valid");
    }

    #[test]
    fn a_larger_hole_below_is_taken_before_a_smaller_top() {
        // A 5000-byte hole, then a block, then 1200 free bytes at the top.
        let mut ix = FreeIndex::new(7000).with_fit(Fit::Best);
        let low = ix.alloc(5000, 1).expect("fits");
        let _mid = ix.alloc(800, 1).expect("fits");
        ix.free(low).expect("live");
        assert_eq!(ix.alloc(1100, 1).map(|a| a.offset()), Some(0));
        ix.check_invariants().expect("valid");
    }

    #[test]
    fn a_hole_past_the_bound_is_taken_before_the_top() {
        // One 1080-byte hole, then more than BEST_SCAN holes of 1030 bytes
        // in the same class, freed after it (so first in its list), each
        // between used blocks; 1050 bytes fit only the first hole.
        let mut ix = FreeIndex::new(1 << 20).with_fit(Fit::Best);
        let first = ix.alloc(1080, 1).expect("fits");
        let mut keep = vec![ix.alloc(100, 1).expect("fits")];
        let mut small = Vec::new();
        for _ in 0..BEST_SCAN + 4 {
            small.push(ix.alloc(1030, 1).expect("fits"));
            keep.push(ix.alloc(100, 1).expect("fits"));
        }
        ix.free(first).expect("live");
        for a in small {
            ix.free(a).expect("live");
        }
        assert_eq!(ix.alloc(1050, 1).map(|a| a.offset()), Some(0));
        ix.check_invariants().expect("valid");
        std::mem::forget(keep);
    }

    #[test]
    fn a_rebuilt_index_keeps_its_fit() {
        let mut ix = FreeIndex::new(10_000).with_fit(Fit::Best);
        let mut out = Vec::new();
        ix.rebuild(&[(0, 100)], &mut out).expect("valid layout");
        assert_eq!(ix.fit(), Fit::Best);
        assert_eq!(FreeIndex::new(10).fit(), Fit::Good);
    }
}
