//! The placement policy: a pure free-space index over `[0, capacity)`.
//!
//! [`FreeIndex`] knows offsets and sizes and nothing about devices. It is a
//! two-level segregated fit (TLSF) index in the style of Sebastian Aaltonen's
//! OffsetAllocator, with three differences that the arena relies on:
//!
//! - **Exact sizes.** A block occupies exactly the bytes asked for; size
//!   classes only index free regions, they never round what is stored.
//! - **Exact failure.** [`FreeIndex::alloc`] returns `None` only if no free
//!   region holds the request at an aligned offset, so "allocation fails only
//!   if no hole fits" holds for the arena above it.
//! - **64-bit offsets and sizes**, for arenas of terabytes (metadata-only
//!   replays).
//!
//! # Structure
//!
//! Every region, used or free, is a node in one `Vec`; nodes are linked in
//! address order (for O(1) coalescing) and free nodes are also linked into
//! one list per size class. A two-level bitmap says which classes are
//! nonempty. Node slots released by coalescing are recycled through a free
//! list, so a warm index does not allocate.
//!
//! # Invariants
//!
//! - The address list covers `[0, capacity)` exactly: ascending, no gaps, no
//!   overlap, every node's size `> 0`.
//! - No two free regions are adjacent (they are always coalesced).
//! - A free region is in exactly the list of its class
//!   (`bins::bin_round_down(size)`), and a class's bitmap bit is set iff its
//!   list is nonempty.
//! - The counters (`free_bytes`, `free_regions`, `used_blocks`) match the
//!   address list.
//!
//! [`FreeIndex::check_invariants`] verifies all of these.
//!
//! # Complexity
//!
//! | operation | cost |
//! |---|---|
//! | `alloc` | O(1) when a region of a class that surely fits exists; otherwise a scan of the partial classes (see below) |
//! | `free` | O(1) |
//! | `free_bytes` | O(1) |
//! | `largest_free` | O(regions in the largest nonempty class) |
//! | `rebuild` | O(blocks) |
//! | `regions`, `report`, `check_invariants` | O(regions) (`report`: like `largest_free`) |
//!
//! `alloc(size, align)` first takes the head of the smallest nonempty class
//! whose every region is `>= size` (good fit, two bit scans); if alignment
//! padding makes that head too short, the head of the smallest class whose
//! regions are all `>= size + align - 1`. Only if neither exists does it scan
//! the classes in between, whose regions may or may not fit (the request's
//! own class, and for large alignments the classes up to `size + align - 1`).
//! That scan is what makes failure exact; it walks only regions that are too
//! close in size to be sure, and it runs when the index is nearly full or
//! badly fragmented for this request, which is where the arena compacts.
#![deny(unsafe_code)]

mod bins;
#[cfg(test)]
mod tests;

use std::fmt;

use bins::{bin_min_size, bin_round_down, bin_round_up, Bitmap, NUM_BINS};

/// Identifies a node of a [`FreeIndex`]. A used block keeps its id until it is
/// freed or the index is rebuilt; ids of freed blocks are reused.
pub type NodeId = u32;

/// One region of the index's address space, as listed by
/// [`FreeIndex::regions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// First byte of the region.
    pub offset: u64,
    /// Length in bytes (> 0).
    pub size: u64,
    /// `Some(id)` for a used block, `None` for free space.
    pub node: Option<NodeId>,
}

/// A summary of free space, from [`FreeIndex::report`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StorageReport {
    /// Total free bytes.
    pub free_bytes: u64,
    /// Size of the largest free region: the largest request (at alignment 1)
    /// that can succeed now.
    pub largest_free_bytes: u64,
    /// Number of (maximal, coalesced) free regions.
    pub free_regions: usize,
    /// Number of used blocks.
    pub used_blocks: usize,
}

/// No node (end of a list).
const NIL: u32 = u32::MAX;
/// `Node::bin_prev` of a used block.
const USED: u32 = u32::MAX - 1;
/// `Node::bin_prev` of a slot that holds no region.
const VACANT: u32 = u32::MAX - 2;
/// Node ids are below this, so they never collide with the markers above.
const MAX_NODES: usize = VACANT as usize;

/// A slot of [`FreeIndex::nodes`]: a used block, a free region, or vacant.
/// 32 bytes, two per cache line (the state lives in `bin_prev` for that), and
/// aligned so that no node straddles two lines: the large `Vec` allocation
/// is only 16-byte aligned otherwise, and a straddling node costs two misses.
#[derive(Debug, Clone, Copy)]
#[repr(align(32))]
struct Node {
    /// First byte of the region.
    offset: u64,
    /// Exact length in bytes, > 0 (never rounded to a class).
    size: u64,
    /// Node just below in address order, or `NIL` for the one at offset 0.
    addr_prev: u32,
    /// Node just above in address order, or `NIL` for the last one.
    addr_next: u32,
    /// Used block: `USED`. Vacant slot: `VACANT`. Free region: the previous
    /// node in its class list, except at the head of the list, where it is
    /// any other value (`NIL` or stale): heads are recognised by
    /// [`Classes::heads`], so popping a head never touches the next node.
    bin_prev: u32,
    /// Free region: next node in its class list, or `NIL`.
    /// Vacant slot: next vacant slot, or `NIL`. Used block: unused.
    bin_next: u32,
}

impl Node {
    #[inline]
    fn is_free(&self) -> bool {
        self.bin_prev != USED && self.bin_prev != VACANT
    }

    /// A used block (not in any class list).
    #[inline]
    fn used(offset: u64, size: u64, addr_prev: u32, addr_next: u32) -> Self {
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
struct Classes {
    /// Head of each class's list of free regions, or `NIL`. Class `b` holds
    /// exactly the free regions with `bin_round_down(size) == b`.
    heads: Box<[u32; NUM_BINS]>,
    /// Bit `b` set iff `heads[b] != NIL`.
    map: Bitmap,
}

impl Classes {
    fn new() -> Self {
        Classes {
            heads: Box::new([NIL; NUM_BINS]),
            map: Bitmap::default(),
        }
    }

    fn clear(&mut self) {
        self.heads.fill(NIL);
        self.map = Bitmap::default();
    }

    /// The first nonempty class `>= bin` and its head.
    #[inline]
    fn first_at_or_above(&self, bin: u32) -> Option<(u32, u32)> {
        let bin = self.map.first_at_or_above(bin)?;
        Some((bin, self.heads[bin as usize]))
    }

    /// Files the free region `node` at the head of class `bin`, which must
    /// be its class.
    #[inline]
    fn link(&mut self, nodes: &mut [Node], node: u32, bin: u32) {
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
    fn unlink(&mut self, nodes: &mut [Node], node: u32, bin: u32) {
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

/// A free-space index over `[0, capacity)`: exact-size, exact-failure TLSF
/// with O(1) alloc in the common case and O(1) free. See the
/// [module docs](self) for invariants and costs.
#[derive(Clone)]
pub struct FreeIndex {
    /// Size of the managed address space in bytes.
    capacity: u64,
    /// All slots. Live nodes (used or free) form the address list from
    /// `addr_head`; the rest are vacant and form the list from
    /// `vacant_head`. Every slot is in exactly one of the two.
    nodes: Vec<Node>,
    /// The node at offset 0, or `NIL` iff `capacity == 0`.
    addr_head: u32,
    /// First vacant slot, or `NIL`. A stack, so the slot reused next is the
    /// one released last, likely still in cache.
    vacant_head: u32,
    /// Every free region, in the list of its class.
    classes: Classes,
    /// Sum of the sizes of the free regions.
    free_bytes: u64,
    /// Number of free regions.
    free_regions: usize,
    /// Number of used blocks.
    used_blocks: usize,
}

impl fmt::Debug for FreeIndex {
    // The node table can hold millions of entries; print the summary.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FreeIndex")
            .field("capacity", &self.capacity)
            .field("report", &self.report())
            .field("node_slots", &self.nodes.len())
            .finish()
    }
}

impl FreeIndex {
    /// An index whose whole range `[0, capacity)` is one free region (none if
    /// `capacity == 0`).
    pub fn new(capacity: u64) -> Self {
        let mut index = FreeIndex {
            capacity,
            nodes: Vec::new(),
            addr_head: NIL,
            vacant_head: NIL,
            classes: Classes::new(),
            free_bytes: 0,
            free_regions: 0,
            used_blocks: 0,
        };
        let mut ids = Vec::new();
        index.rebuild(&[], &mut ids);
        index
    }

    /// Size of the managed address space in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Allocates `size` bytes at an offset that is a multiple of `align`, and
    /// returns the new block's node and offset.
    ///
    /// `size > 0` and `align` a power of two (debug-asserted). Returns `None`
    /// only if no free region can hold `size` bytes at an `align`-aligned
    /// offset (or, unreachably in practice, if the index already has ~4
    /// billion nodes). O(1) unless no region of a surely-fitting class exists
    /// (see the [module docs](self)).
    pub fn alloc(&mut self, size: u64, align: u64) -> Option<(NodeId, u64)> {
        debug_assert!(size > 0, "alloc of zero bytes");
        debug_assert!(
            align.is_power_of_two(),
            "align {align} is not a power of two"
        );
        // In release, treat bad input as the nearest valid request, not a panic.
        let size = size.max(1);
        let align_mask = if align.is_power_of_two() {
            align - 1
        } else {
            0
        };

        // Good fit: the smallest class whose regions all hold `size`.
        if let Some((bin, node)) = self.classes.first_at_or_above(bin_round_up(size)) {
            if let Some(pad) = fit(&self.nodes[node as usize], size, align_mask) {
                return self.take(node, bin, pad, size);
            }
            // Padding made the head too short: a class whose regions all hold
            // `size + align - 1` fits at any offset.
            let sure = bin_round_up(size.saturating_add(align_mask));
            if let Some((bin, node)) = self.classes.first_at_or_above(sure) {
                if let Some(pad) = fit(&self.nodes[node as usize], size, align_mask) {
                    return self.take(node, bin, pad, size);
                }
            }
        }
        self.alloc_scan(size, align_mask)
    }

    /// The exact fallback: walks every region of the classes that may but
    /// need not fit, `[class of size, class that surely fits)`, in ascending
    /// class order. Classes at or above the upper bound were found empty.
    #[cold]
    fn alloc_scan(&mut self, size: u64, align_mask: u64) -> Option<(NodeId, u64)> {
        let end = bin_round_up(size.saturating_add(align_mask));
        let mut next = self.classes.first_at_or_above(bin_round_down(size));
        while let Some((bin, head)) = next {
            if bin >= end {
                break;
            }
            let mut node = head;
            while node != NIL {
                let n = &self.nodes[node as usize];
                if let Some(pad) = fit(n, size, align_mask) {
                    return self.take(node, bin, pad, size);
                }
                node = n.bin_next;
            }
            next = self.classes.first_at_or_above(bin + 1);
        }
        None
    }

    /// Turns `size` bytes at `offset + pad` of the free region `node` (filed
    /// in `bin`) into a used block; the front padding and the tail, if any,
    /// stay free. Neither can touch another free region, because `node`'s
    /// neighbours are used (no two free regions are adjacent).
    #[inline]
    fn take(&mut self, node: u32, bin: u32, pad: u64, size: u64) -> Option<(NodeId, u64)> {
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

    /// `take` with front padding (`pad > 0`), off the hot path: only when
    /// `align` exceeds the alignment of the free regions' offsets.
    #[cold]
    fn take_padded(&mut self, node: u32, bin: u32, pad: u64, size: u64) -> (NodeId, u64) {
        let n = self.nodes[node as usize];
        let offset = n.offset + pad;
        let tail = n.size - pad - size;
        // `pad > 0` means `n.offset > 0`, so `node` is not the address head.
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

    /// Frees the used block `node`, coalescing it with free neighbours. O(1).
    ///
    /// `node` must be a live used node (debug-asserted); its id may be reused
    /// by a later `alloc`.
    pub fn free(&mut self, node: NodeId) {
        debug_assert!(
            self.nodes
                .get(node as usize)
                .is_some_and(|n| n.bin_prev == USED),
            "free of node {node}, which is not a used block"
        );
        let nodes = &mut self.nodes[..];
        let n = nodes[node as usize];
        let (prev, next) = (n.addr_prev, n.addr_next);
        let prev_free = is_free_at(nodes, prev);
        let next_free = is_free_at(nodes, next);
        self.free_bytes += n.size;
        self.used_blocks -= 1;
        if !prev_free && !next_free {
            // Nothing to merge (the most common case): just file it.
            self.classes.link(nodes, node, bin_round_down(n.size));
            self.free_regions += 1;
            return;
        }
        let (prev_size, outer_prev) = if prev_free {
            (nodes[prev as usize].size, nodes[prev as usize].addr_prev)
        } else {
            (0, prev)
        };
        let (next_size, outer_next) = if next_free {
            (nodes[next as usize].size, nodes[next as usize].addr_next)
        } else {
            (0, next)
        };
        let offset = n.offset - prev_size;
        let size = prev_size + n.size + next_size;
        let bin = bin_round_down(size);
        let prev_bin = prev_free.then(|| bin_round_down(prev_size));
        let next_bin = next_free.then(|| bin_round_down(next_size));

        // The merged region lives in one node. A free neighbour already filed
        // in the merged region's class keeps its place in that list, which
        // saves touching list neighbours (cache misses).
        let keep = if prev_bin == Some(bin) {
            prev
        } else if next_bin == Some(bin) {
            next
        } else {
            node
        };
        if let Some(prev_bin) = prev_bin {
            if prev != keep {
                self.classes.unlink(nodes, prev, prev_bin);
                release(nodes, &mut self.vacant_head, prev);
            }
        }
        if let Some(next_bin) = next_bin {
            if next != keep {
                self.classes.unlink(nodes, next, next_bin);
                release(nodes, &mut self.vacant_head, next);
            }
        }
        {
            let k = &mut nodes[keep as usize];
            k.offset = offset;
            k.size = size;
            k.addr_prev = outer_prev;
            k.addr_next = outer_next;
        }
        // Relink the outer neighbours only where the node next to them changed.
        if (if prev_free { prev } else { node }) != keep {
            if outer_prev == NIL {
                self.addr_head = keep;
            } else {
                nodes[outer_prev as usize].addr_next = keep;
            }
        }
        if (if next_free { next } else { node }) != keep && outer_next != NIL {
            nodes[outer_next as usize].addr_prev = keep;
        }
        if keep == node {
            self.classes.link(nodes, node, bin);
        } else {
            release(nodes, &mut self.vacant_head, node);
        }
        // One region from two or three.
        self.free_regions -= usize::from(prev_free && next_free);
    }

    /// Offset of a live node.
    pub fn offset(&self, node: NodeId) -> u64 {
        debug_assert!(self.is_live(node), "node {node} is not live");
        self.nodes[node as usize].offset
    }

    /// Size in bytes of a live node (exactly the size it was allocated with).
    pub fn size(&self, node: NodeId) -> u64 {
        debug_assert!(self.is_live(node), "node {node} is not live");
        self.nodes[node as usize].size
    }

    /// Total free bytes. O(1).
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Size of the largest free region (0 if none). O(regions in the largest
    /// nonempty class), usually a handful.
    pub fn largest_free(&self) -> u64 {
        let Some(bin) = self.classes.map.last() else {
            return 0;
        };
        let mut largest = 0;
        let mut node = self.classes.heads[bin as usize];
        while node != NIL {
            let n = &self.nodes[node as usize];
            largest = largest.max(n.size);
            node = n.bin_next;
        }
        largest
    }

    /// A summary of free space. Costs as much as [`Self::largest_free`].
    pub fn report(&self) -> StorageReport {
        StorageReport {
            free_bytes: self.free_bytes,
            largest_free_bytes: self.largest_free(),
            free_regions: self.free_regions,
            used_blocks: self.used_blocks,
        }
    }

    /// All regions, used and free, in ascending address order. They cover
    /// `[0, capacity)` exactly, without gaps.
    pub fn regions(&self) -> impl Iterator<Item = Region> + '_ {
        let mut node = self.addr_head;
        std::iter::from_fn(move || {
            let n = self.nodes.get(node as usize)?;
            let region = Region {
                offset: n.offset,
                size: n.size,
                node: (!n.is_free()).then_some(node),
            };
            node = n.addr_next;
            Some(region)
        })
    }

    /// Resets the index to a layout in which `used` (`(offset, size)` pairs,
    /// ascending, non-overlapping, in bounds, sizes > 0: debug-asserted) are
    /// the used blocks and the space between them is free. Clears `out` and
    /// pushes each block's new id, in the order of `used`. O(n); reuses the
    /// index's allocations.
    ///
    /// # Panics
    ///
    /// If the layout needs more than ~4 billion nodes (`used.len()` around
    /// 2^31), which no id could name.
    pub fn rebuild(&mut self, used: &[(u64, u64)], out: &mut Vec<NodeId>) {
        debug_assert!(
            used.windows(2)
                .all(|w| w[0].0.checked_add(w[0].1).is_some_and(|end| end <= w[1].0)),
            "rebuild: blocks overlap or are out of order"
        );
        debug_assert!(
            used.iter()
                .all(|&(o, s)| s > 0 && s <= self.capacity && o <= self.capacity - s),
            "rebuild: a block is empty or out of bounds"
        );
        assert!(
            2 * used.len() < MAX_NODES,
            "rebuild: {} blocks exceed the node id space",
            used.len()
        );
        self.nodes.clear();
        self.addr_head = NIL;
        self.vacant_head = NIL;
        self.classes.clear();
        self.free_bytes = 0;
        self.free_regions = 0;
        self.used_blocks = used.len();
        out.clear();

        let mut cursor = 0u64;
        let mut last = NIL;
        for &(offset, size) in used {
            if offset > cursor {
                last = self.push_region(cursor, offset - cursor, last, false);
            }
            last = self.push_region(offset, size, last, true);
            out.push(last);
            cursor = offset.saturating_add(size);
        }
        if self.capacity > cursor {
            self.push_region(cursor, self.capacity - cursor, last, false);
        }
    }

    /// Appends a region at the top of the address list during `rebuild`.
    fn push_region(&mut self, offset: u64, size: u64, prev: u32, used: bool) -> u32 {
        let id = self.nodes.len() as u32;
        self.nodes.push(Node {
            offset,
            size,
            addr_prev: prev,
            addr_next: NIL,
            bin_prev: USED,
            bin_next: NIL,
        });
        if prev == NIL {
            self.addr_head = id;
        } else {
            self.nodes[prev as usize].addr_next = id;
        }
        if !used {
            self.classes.link(&mut self.nodes, id, bin_round_down(size));
            self.free_bytes += size;
            self.free_regions += 1;
        }
        id
    }

    /// Checks every invariant of the [module docs](self); for tests. O(nodes).
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

    // ---- internals ----

    /// Whether `node` names a used block or a free region.
    fn is_live(&self, node: NodeId) -> bool {
        self.nodes
            .get(node as usize)
            .is_some_and(|n| n.bin_prev != VACANT)
    }

    /// Slots on the vacant list.
    fn vacant_slots(&self) -> usize {
        self.nodes.len() - self.free_regions - self.used_blocks
    }
}

/// Stores `node` in a vacant slot (the last released) or a new one, and
/// returns its id. The caller checked that an id is available.
#[inline]
fn new_node(nodes: &mut Vec<Node>, vacant_head: &mut u32, node: Node) -> u32 {
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
fn release(nodes: &mut [Node], vacant_head: &mut u32, node: u32) {
    let n = &mut nodes[node as usize];
    n.bin_prev = VACANT;
    n.bin_next = *vacant_head;
    *vacant_head = node;
}

/// Whether node `id` is a free region (`false` for `NIL`).
#[inline]
fn is_free_at(nodes: &[Node], id: u32) -> bool {
    nodes.get(id as usize).is_some_and(Node::is_free)
}

/// The front padding at which `n` holds `size` bytes aligned to
/// `align_mask + 1`, or `None` if it does not hold them.
#[inline]
fn fit(n: &Node, size: u64, align_mask: u64) -> Option<u64> {
    let pad = n.offset.wrapping_neg() & align_mask;
    (n.size >= pad && n.size - pad >= size).then_some(pad)
}
