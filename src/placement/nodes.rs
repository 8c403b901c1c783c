//! The node table's slots and the size-class lists of free regions.

use super::bins::{bin_round_down, Bitmap, NUM_BINS};

/// No node (end of a list).
pub(super) const NIL: u32 = u32::MAX;
/// `Node::bin_prev` of a used block.
pub(super) const USED: u32 = u32::MAX - 1;
/// `Node::bin_prev` of a slot that holds no region.
pub(super) const VACANT: u32 = u32::MAX - 2;
/// Node ids are below this, so they never collide with the markers above.
pub(super) const MAX_NODES: usize = VACANT as usize;

/// A slot of [`FreeIndex::nodes`]: a used block, a free region, or vacant.
/// 32 bytes, two per cache line (the state lives in `bin_prev` for that), and
/// aligned so that no node straddles two lines: the large `Vec` allocation
/// is only 16-byte aligned otherwise, and a straddling node costs two misses.
#[derive(Debug, Clone, Copy)]
#[repr(align(32))]
pub(super) struct Node {
    /// First byte of the region.
    pub(super) offset: u64,
    /// Exact length in bytes, > 0 (never rounded to a class).
    pub(super) size: u64,
    /// Node just below in address order, or `NIL` for the one at offset 0.
    pub(super) addr_prev: u32,
    /// Node just above in address order, or `NIL` for the last one.
    pub(super) addr_next: u32,
    /// Used block: `USED`. Vacant slot: `VACANT`. Free region: the previous
    /// node in its class list, except at the head of the list, where it is
    /// any other value (`NIL` or stale): heads are recognised by
    /// [`Classes::heads`], so popping a head never touches the next node.
    pub(super) bin_prev: u32,
    /// Free region: next node in its class list, or `NIL`.
    /// Vacant slot: next vacant slot, or `NIL`. Used block: unused.
    pub(super) bin_next: u32,
}

impl Node {
    #[inline]
    pub(super) fn is_free(&self) -> bool {
        self.bin_prev != USED && self.bin_prev != VACANT
    }

    /// A used block (not in any class list).
    #[inline]
    pub(super) fn used(offset: u64, size: u64, addr_prev: u32, addr_next: u32) -> Self {
        Node {
            offset,
            size,
            addr_prev,
            addr_next,
            bin_prev: USED,
            bin_next: NIL,
        }
    }
}

/// The size-class lists of free regions. Kept apart from the node table so
/// that the hot paths can hold the table as a plain slice (its pointer and
/// length stay in registers) while they edit the lists.
#[derive(Clone)]
pub(super) struct Classes {
    /// Head of each class's list of free regions, or `NIL`. Class `b` holds
    /// exactly the free regions with `bin_round_down(size) == b`.
    pub(super) heads: Box<[u32; NUM_BINS]>,
    /// Bit `b` set iff `heads[b] != NIL`.
    pub(super) map: Bitmap,
}

impl Classes {
    pub(super) fn new() -> Self {
        Classes {
            heads: Box::new([NIL; NUM_BINS]),
            map: Bitmap::default(),
        }
    }

    pub(super) fn clear(&mut self) {
        self.heads.fill(NIL);
        self.map = Bitmap::default();
    }

    /// The first nonempty class `>= bin` and its head.
    #[inline]
    pub(super) fn first_at_or_above(&self, bin: u32) -> Option<(u32, u32)> {
        let bin = self.map.first_at_or_above(bin)?;
        Some((bin, self.heads[bin as usize]))
    }

    /// Files the free region `node` at the head of class `bin`, which must
    /// be its class.
    #[inline]
    pub(super) fn link(&mut self, nodes: &mut [Node], node: u32, bin: u32) {
        debug_assert_eq!(bin, bin_round_down(nodes[node as usize].size));
        let head = self.heads[bin as usize];
        let n = &mut nodes[node as usize];
        n.bin_prev = NIL;
        n.bin_next = head;
        if head != NIL {
            nodes[head as usize].bin_prev = node;
        } else {
            self.map.set(bin);
        }
        self.heads[bin as usize] = node;
    }

    /// Removes the free region `node` from the list of `bin`, its class.
    /// Leaves `node`'s own links as they were.
    #[inline]
    pub(super) fn unlink(&mut self, nodes: &mut [Node], node: u32, bin: u32) {
        let Node {
            bin_prev, bin_next, ..
        } = nodes[node as usize];
        if self.heads[bin as usize] == node {
            // The new head's `bin_prev` goes stale rather than being reset
            // (see `Node::bin_prev`), which saves a likely cache miss.
            self.heads[bin as usize] = bin_next;
            if bin_next == NIL {
                self.map.clear(bin);
            }
        } else {
            nodes[bin_prev as usize].bin_next = bin_next;
            if bin_next != NIL {
                nodes[bin_next as usize].bin_prev = bin_prev;
            }
        }
    }
}

/// Stores `node` in a vacant slot (the last released) or a new one, and
/// returns its id. The caller checked that an id is available.
#[inline]
pub(super) fn new_node(nodes: &mut Vec<Node>, vacant_head: &mut u32, node: Node) -> u32 {
    if *vacant_head != NIL {
        let id = *vacant_head;
        let slot = &mut nodes[id as usize];
        *vacant_head = slot.bin_next;
        *slot = node;
        id
    } else {
        let id = nodes.len() as u32;
        nodes.push(node);
        id
    }
}

/// Puts a slot (already out of every list) on the vacant list.
#[inline]
pub(super) fn release(nodes: &mut [Node], vacant_head: &mut u32, node: u32) {
    let n = &mut nodes[node as usize];
    n.bin_prev = VACANT;
    n.bin_next = *vacant_head;
    *vacant_head = node;
}

/// Whether node `id` is a free region (`false` for `NIL`).
#[inline]
pub(super) fn is_free_at(nodes: &[Node], id: u32) -> bool {
    nodes.get(id as usize).is_some_and(Node::is_free)
}

/// The front padding at which `n` holds `size` bytes aligned to
/// `align_mask + 1`, or `None` if it does not hold them.
#[inline]
pub(super) fn fit(n: &Node, size: u64, align_mask: u64) -> Option<u64> {
    let pad = n.offset.wrapping_neg() & align_mask;
    (n.size >= pad && n.size - pad >= size).then_some(pad)
}
