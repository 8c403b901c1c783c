//! Carving a used block out of a free region (the second half of `alloc`).

use super::bins::bin_round_down;
use super::nodes::{new_node, Node, MAX_NODES, NIL, USED};
use super::FreeIndex;

impl FreeIndex {
    /// Turns `size` bytes at `offset + pad` of the free region `node` (filed
    /// in `bin`) into a used block; the front padding and the tail, if any,
    /// stay free. Neither can touch another free region, because `node`'s
    /// neighbours are used (no two free regions are adjacent).
    #[inline]
    pub(super) fn take(&mut self, node: u32, bin: u32, pad: u64, size: u64) -> Option<(u32, u64)> {
        let n = self.nodes[node as usize];
        let tail = n.size - pad - size;
        let needed = usize::from(pad > 0) + usize::from(tail > 0);
        if self.nodes.len() + needed > MAX_NODES && self.vacant_slots() < needed {
            return None;
        }
        if pad > 0 {
            return Some(self.take_padded(node, bin, pad, size));
        }
        self.free_bytes -= size;
        self.used_blocks += 1;
        if tail == 0 {
            // Exact fit: the region becomes the block.
            let nodes = &mut self.nodes[..];
            self.classes.unlink(nodes, node, bin);
            nodes[node as usize].bin_prev = USED;
            self.free_regions -= 1;
            return Some((node, n.offset));
        }
        let tail_bin = bin_round_down(tail);
        if tail_bin == bin {
            // The rest stays in the same class: carve the block off the front
            // into a new node and leave the free node where it is in its list
            // (no list neighbours touched, which is the arena's fill pattern).
            let used = new_node(
                &mut self.nodes,
                &mut self.vacant_head,
                Node::used(n.offset, size, n.addr_prev, node),
            );
            let nodes = &mut self.nodes[..];
            if n.addr_prev == NIL {
                self.addr_head = used;
            } else {
                nodes[n.addr_prev as usize].addr_next = used;
            }
            let m = &mut nodes[node as usize];
            m.offset += size;
            m.size = tail;
            m.addr_prev = used;
            return Some((used, n.offset));
        }
        // The region becomes the block; the tail moves to a new free node.
        let t = new_node(
            &mut self.nodes,
            &mut self.vacant_head,
            Node::used(n.offset + size, tail, node, n.addr_next),
        );
        let nodes = &mut self.nodes[..];
        self.classes.unlink(nodes, node, bin);
        let m = &mut nodes[node as usize];
        m.size = size;
        m.addr_next = t;
        m.bin_prev = USED;
        if n.addr_next != NIL {
            nodes[n.addr_next as usize].addr_prev = t;
        }
        self.classes.link(nodes, t, tail_bin);
        Some((node, n.offset))
    }

    /// `take` with front padding (`pad > 0`): when `align` exceeds the
    /// alignment of the free regions' offsets, and for every block carved
    /// from the top of its region (`FreeIndex::alloc_high`), where the
    /// padding is the rest of the region, left free below the block. Out
    /// of line, which keeps `take` small: most blocks are carved from the
    /// bottom (large ones and, with lifetime placement, short-lived ones
    /// come here).
    #[inline(never)]
    fn take_padded(&mut self, node: u32, bin: u32, pad: u64, size: u64) -> (u32, u64) {
        let n = self.nodes[node as usize];
        let offset = n.offset + pad;
        let tail = n.size - pad - size;
        let p = new_node(
            &mut self.nodes,
            &mut self.vacant_head,
            Node::used(n.offset, pad, n.addr_prev, node),
        );
        let t = if tail > 0 {
            new_node(
                &mut self.nodes,
                &mut self.vacant_head,
                Node::used(offset + size, tail, node, n.addr_next),
            )
        } else {
            n.addr_next
        };
        let nodes = &mut self.nodes[..];
        self.classes.unlink(nodes, node, bin);
        {
            let m = &mut nodes[node as usize];
            m.offset = offset;
            m.size = size;
            m.addr_prev = p;
            m.addr_next = t;
            m.bin_prev = USED;
        }
        if n.addr_prev == NIL {
            self.addr_head = p;
        } else {
            nodes[n.addr_prev as usize].addr_next = p;
        }
        self.classes.link(nodes, p, bin_round_down(pad));
        if tail > 0 {
            if n.addr_next != NIL {
                nodes[n.addr_next as usize].addr_prev = t;
            }
            self.classes.link(nodes, t, bin_round_down(tail));
            self.free_regions += 1;
        }
        self.free_bytes -= size;
        self.used_blocks += 1;
        (node, offset)
    }

    /// Slots on the vacant list.
    pub(super) fn vacant_slots(&self) -> usize {
        self.nodes.len() - self.free_regions - self.used_blocks
    }
}
