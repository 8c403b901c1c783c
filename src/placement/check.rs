//! The invariant checker of [`FreeIndex`] (for tests and debugging).

use super::bins::{bin_min_size, bin_round_down, NUM_BINS};
use super::nodes::{NIL, VACANT};
use super::FreeIndex;

impl FreeIndex {
    /// Checks every invariant of the [module docs](super); for tests. O(nodes).
    ///
    /// # Errors
    ///
    /// A description of the first broken invariant found.
    pub fn check_invariants(&self) -> Result<(), String> {
        let slots = self.nodes.len();
        let mut seen = vec![false; slots];

        // Address list: covers [0, capacity) exactly, links consistent.
        let (mut cursor, mut prev, mut node) = (0u64, NIL, self.addr_head);
        let (mut free_bytes, mut free_regions, mut used_blocks) = (0u64, 0usize, 0usize);
        let mut prev_free = false;
        while node != NIL {
            let n = self
                .nodes
                .get(node as usize)
                .ok_or(format!("address list: node {node} out of range"))?;
            if std::mem::replace(&mut seen[node as usize], true) {
                return Err(format!("address list: node {node} appears twice"));
            }
            if n.bin_prev == VACANT {
                return Err(format!("address list: node {node} is vacant"));
            }
            if n.addr_prev != prev {
                return Err(format!("node {node}: addr_prev {} != {prev}", n.addr_prev));
            }
            if n.offset != cursor || n.size == 0 {
                return Err(format!(
                    "node {node}: [{}, +{}) but expected offset {cursor}",
                    n.offset, n.size
                ));
            }
            cursor = n
                .offset
                .checked_add(n.size)
                .ok_or(format!("node {node}: end overflows"))?;
            if n.is_free() {
                if prev_free {
                    return Err(format!(
                        "node {node}: free and adjacent to free node {prev}"
                    ));
                }
                free_bytes += n.size;
                free_regions += 1;
            } else {
                used_blocks += 1;
            }
            prev_free = n.is_free();
            prev = node;
            node = n.addr_next;
        }
        if cursor != self.capacity {
            return Err(format!(
                "regions end at {cursor}, capacity is {}",
                self.capacity
            ));
        }
        if (self.addr_head == NIL) != (self.capacity == 0) {
            return Err("addr_head is NIL iff capacity is 0".into());
        }
        if (free_bytes, free_regions, used_blocks)
            != (self.free_bytes, self.free_regions, self.used_blocks)
        {
            return Err(format!(
                "counters (free_bytes, free_regions, used_blocks) = {:?}, address list says {:?}",
                (self.free_bytes, self.free_regions, self.used_blocks),
                (free_bytes, free_regions, used_blocks)
            ));
        }

        // Class lists: exactly the free regions, each in its own class.
        let mut binned = 0usize;
        for bin in 0..NUM_BINS as u32 {
            let head = self.classes.heads[bin as usize];
            if (head != NIL) != self.classes.map.get(bin) {
                return Err(format!("class {bin}: bitmap bit disagrees with list"));
            }
            let (mut prev, mut node) = (NIL, head);
            while node != NIL {
                let n = self
                    .nodes
                    .get(node as usize)
                    .ok_or(format!("class {bin}: node {node} out of range"))?;
                // A head's `bin_prev` may be stale (see `Node::bin_prev`).
                if !n.is_free() || (prev != NIL && n.bin_prev != prev) {
                    return Err(format!(
                        "class {bin}: node {node} not free or bin_prev wrong"
                    ));
                }
                if bin_round_down(n.size) != bin || bin_min_size(bin) > n.size {
                    return Err(format!(
                        "class {bin}: node {node} of size {} misfiled",
                        n.size
                    ));
                }
                binned += 1;
                if binned > free_regions {
                    return Err(format!("class lists hold more than {free_regions} regions"));
                }
                prev = node;
                node = n.bin_next;
            }
        }
        if binned != free_regions {
            return Err(format!(
                "class lists hold {binned} regions, address list {free_regions}"
            ));
        }
        if !self.classes.map.summary_consistent() {
            return Err("bitmap summary disagrees with leaf words".into());
        }

        // Vacant slots: the rest, all on the vacant list.
        let mut vacant = 0usize;
        let mut node = self.vacant_head;
        while node != NIL {
            let n = self
                .nodes
                .get(node as usize)
                .ok_or(format!("vacant list: node {node} out of range"))?;
            if std::mem::replace(&mut seen[node as usize], true) || n.bin_prev != VACANT {
                return Err(format!("vacant list: node {node} is live or listed twice"));
            }
            vacant += 1;
            node = n.bin_next;
        }
        if vacant != self.vacant_slots() || seen.iter().any(|&s| !s) {
            return Err("some slot is neither live nor on the vacant list".into());
        }
        Ok(())
    }
}
