//! Growing and shrinking the index's range at its top: what an elastic
//! arena does when it maps or unmaps memory above its blocks.
//!
//! Both keep every live [`Allocation`] valid (no new epoch): the blocks do
//! not move, only the free space above the highest one changes. Both are
//! O(nodes) to find the top node (the address list keeps no tail), which
//! is fine for operations that run once per mapping change, next to a
//! driver call of tens of microseconds.

use super::bins::{bin_round_down, bin_round_up};
use super::nodes::{fit, new_node, release, Node, MAX_NODES, NIL, USED, VACANT};
use super::{FreeIndex, PlacementError, Result};

impl FreeIndex {
    /// The node whose region ends at `capacity` (`None` iff `capacity == 0`).
    fn top_node(&self) -> Option<u32> {
        self.nodes
            .iter()
            .position(|n| n.bin_prev != VACANT && n.size > 0 && n.offset + n.size == self.capacity)
            .map(|i| i as u32)
    }

    /// Where the highest used block ends: the capacity minus the free
    /// region at the top (0 for an index with no used block).
    pub fn used_end(&self) -> u64 {
        match self.top_node() {
            Some(t) if self.nodes[t as usize].is_free() => self.nodes[t as usize].offset,
            _ => self.capacity,
        }
    }

    /// Whether [`alloc`](Self::alloc) would succeed now, changing nothing:
    /// good fit's search (sure fit, exact scan) without the carve; both
    /// fits fail exactly when no region holds the request.
    pub fn can_alloc(&self, size: u64, align: u64) -> bool {
        let size = size.max(1);
        let align_mask = if align.is_power_of_two() {
            align - 1
        } else {
            0
        };
        let fits_at = |bin: u32| {
            self.classes
                .first_at_or_above(bin)
                .is_some_and(|(_, node)| {
                    fit(&self.nodes[node as usize], size, align_mask).is_some()
                })
        };
        if fits_at(bin_round_up(size)) || fits_at(bin_round_up(size.saturating_add(align_mask))) {
            return true;
        }
        self.scan(size, align_mask).is_some()
    }

    /// Extends the range to `[0, capacity)`: the free region at the top
    /// grows, or a new one starts above the highest block. Every allocation
    /// stays valid.
    ///
    /// # Errors
    ///
    /// [`PlacementError::InvalidLayout`], with nothing changed, if
    /// `capacity` is below the current one or the node table is full.
    pub fn grow_to(&mut self, capacity: u64) -> Result<()> {
        if capacity < self.capacity {
            return Err(PlacementError::InvalidLayout {
                reason: format!(
                    "growing to {capacity} B, below the capacity of {} B",
                    self.capacity
                ),
            });
        }
        let delta = capacity - self.capacity;
        if delta == 0 {
            return Ok(());
        }
        match self.top_node() {
            Some(t) if self.nodes[t as usize].is_free() => {
                let n = self.nodes[t as usize];
                self.classes
                    .unlink(&mut self.nodes, t, bin_round_down(n.size));
                self.nodes[t as usize].size = n.size + delta;
                self.classes
                    .link(&mut self.nodes, t, bin_round_down(n.size + delta));
            }
            top => {
                if self.nodes.len() >= MAX_NODES && self.vacant_head == NIL {
                    return Err(PlacementError::InvalidLayout {
                        reason: "the node table is full".into(),
                    });
                }
                let prev = top.unwrap_or(NIL);
                let node = Node {
                    offset: self.capacity,
                    size: delta,
                    addr_prev: prev,
                    addr_next: NIL,
                    bin_prev: USED,
                    bin_next: NIL,
                };
                let id = new_node(&mut self.nodes, &mut self.vacant_head, node);
                if prev == NIL {
                    self.addr_head = id;
                } else {
                    self.nodes[prev as usize].addr_next = id;
                }
                self.classes
                    .link(&mut self.nodes, id, bin_round_down(delta));
                self.free_regions += 1;
            }
        }
        self.free_bytes += delta;
        self.capacity = capacity;
        Ok(())
    }

    /// Cuts the range to `[0, capacity)`: only free bytes at the top go.
    /// Every allocation stays valid.
    ///
    /// # Errors
    ///
    /// [`PlacementError::InvalidLayout`], with nothing changed, if
    /// `capacity` is above the current one or below [`used_end`](Self::used_end).
    pub fn shrink_to(&mut self, capacity: u64) -> Result<()> {
        let used_end = self.used_end();
        if capacity > self.capacity || capacity < used_end {
            return Err(PlacementError::InvalidLayout {
                reason: format!(
                    "shrinking to {capacity} B: outside [{used_end}, {}] (the highest block's \
                     end, the capacity)",
                    self.capacity
                ),
            });
        }
        let delta = self.capacity - capacity;
        if delta == 0 {
            return Ok(());
        }
        // The top node is free here: `used_end < self.capacity`.
        let Some(t) = self.top_node() else {
            return Ok(());
        };
        let n = self.nodes[t as usize];
        self.classes
            .unlink(&mut self.nodes, t, bin_round_down(n.size));
        if n.size == delta {
            if n.addr_prev == NIL {
                self.addr_head = NIL;
            } else {
                self.nodes[n.addr_prev as usize].addr_next = NIL;
            }
            release(&mut self.nodes, &mut self.vacant_head, t);
            self.free_regions -= 1;
        } else {
            self.nodes[t as usize].size = n.size - delta;
            self.classes
                .link(&mut self.nodes, t, bin_round_down(n.size - delta));
        }
        self.free_bytes -= delta;
        self.capacity = capacity;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Allocation;

    fn check(index: &FreeIndex) {
        if let Err(e) = index.check_invariants() {
            panic!("invariant broken: {e}\n{index:?}");
        }
    }

    #[test]
    fn grow_extends_the_top_free_region_or_adds_one() {
        let mut ix = FreeIndex::new(0);
        assert_eq!(ix.used_end(), 0);
        ix.grow_to(100).unwrap();
        check(&ix);
        assert_eq!((ix.free_bytes(), ix.largest_free()), (100, 100));
        let a = ix.alloc(100, 1).unwrap();
        assert_eq!(ix.used_end(), 100);
        ix.grow_to(150).unwrap();
        check(&ix);
        assert_eq!((ix.free_bytes(), ix.used_end()), (50, 100));
        ix.grow_to(400).unwrap();
        check(&ix);
        assert_eq!(ix.largest_free(), 300);
        // The old allocation is still this index's.
        ix.free(a).unwrap();
        check(&ix);
        assert_eq!(ix.largest_free(), 400);
        assert!(ix.grow_to(10).is_err());
    }

    #[test]
    fn shrink_removes_free_bytes_at_the_top_only() {
        let mut ix = FreeIndex::new(1000);
        let a = ix.alloc(100, 1).unwrap();
        let b = ix.alloc(100, 1).unwrap();
        assert!(ix.shrink_to(150).is_err(), "below the highest block");
        assert!(ix.shrink_to(2000).is_err());
        ix.shrink_to(500).unwrap();
        check(&ix);
        assert_eq!((ix.capacity(), ix.free_bytes()), (500, 300));
        ix.shrink_to(200).unwrap();
        check(&ix);
        assert_eq!((ix.free_bytes(), ix.used_end()), (0, 200));
        ix.free(b).unwrap();
        ix.shrink_to(100).unwrap();
        check(&ix);
        ix.free(a).unwrap();
        ix.shrink_to(0).unwrap();
        check(&ix);
        assert_eq!(ix.regions().count(), 0);
        ix.grow_to(64).unwrap();
        check(&ix);
        assert!(ix.alloc(64, 1).is_some());
    }

    /// Random programs of alloc, free, grow and shrink keep the invariants,
    /// and every allocation stays valid across them.
    #[test]
    fn random_programs_keep_the_invariants() {
        let mut rng = 0x1234_5678u64;
        let mut next = move || {
            rng = rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let mut ix = FreeIndex::new(256);
        let mut live: Vec<Allocation> = Vec::new();
        for _ in 0..4000 {
            match next() % 5 {
                0 | 1 => {
                    if let Some(a) = ix.alloc(1 + next() % 64, 1 << (next() % 4)) {
                        live.push(a);
                    }
                }
                2 if !live.is_empty() => {
                    let i = (next() % live.len() as u64) as usize;
                    ix.free(live.swap_remove(i)).unwrap();
                }
                3 => ix.grow_to(ix.capacity() + next() % 128).unwrap(),
                _ => {
                    let lo = ix.used_end();
                    let to = lo + next() % (ix.capacity() - lo + 1);
                    ix.shrink_to(to).unwrap();
                    assert_eq!(ix.capacity(), to);
                }
            }
            check(&ix);
            let (size, align) = (1 + next() % 96, 1 << (next() % 5));
            let probe = ix.clone().alloc(size, align).is_some();
            assert_eq!(ix.can_alloc(size, align), probe);
            let used: u64 = live.iter().map(|a| a.size()).sum();
            assert_eq!(used + ix.free_bytes(), ix.capacity());
        }
        for a in live {
            ix.free(a).unwrap();
        }
        check(&ix);
    }
}
