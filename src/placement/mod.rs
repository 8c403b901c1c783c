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
//!
//! That is [`Fit::Good`], the default. [`Fit::Best`] (elastic arenas;
//! `best.rs` says why) takes the smallest region that holds the request
//! among up to 16 of each class it visits, and the region at the top of
//! the space only when no other holds it; it fails exactly as good fit
//! does.
//!
//! [`FreeIndex::alloc_high`] takes the same region with the same exact
//! failure but carves the block from the region's top (tests only: no
//! policy places that way now).
#![deny(unsafe_code)]

mod best;
mod bins;
mod carve;
#[cfg(test)]
mod check;
#[cfg(test)]
mod decisions;
mod error;
mod nodes;
mod resize;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use bins::{bin_round_down, bin_round_up};
use nodes::{fit, is_free_at, release, Classes, Node, MAX_NODES, NIL, USED};

pub(crate) use best::Fit;
pub(crate) use error::PlacementError;

type Result<T> = std::result::Result<T, PlacementError>;

/// Source of epochs: every index layout (each [`FreeIndex::new`] and
/// [`FreeIndex::rebuild`]) gets a fresh one, so an [`Allocation`] names the
/// layout that made it.
static NEXT_EPOCH: AtomicU64 = AtomicU64::new(1);

/// A used block of a [`FreeIndex`]: its offset and size are public, the
/// node that holds it is not. Only [`FreeIndex::alloc`] and
/// [`FreeIndex::rebuild`] make one, it cannot be cloned, and
/// [`FreeIndex::free`] consumes it, so a block cannot be freed twice; an
/// allocation from another index, or from before a rebuild, is refused
/// ([`PlacementError::ForeignAllocation`]), never corrupts the index.
#[derive(Debug, PartialEq, Eq, Hash)]
#[must_use = "an allocation that is dropped can never be freed"]
pub struct Allocation {
    offset: u64,
    size: u64,
    /// The layout that made it (see `NEXT_EPOCH`).
    epoch: u64,
    node: u32,
}

impl Allocation {
    /// First byte of the block.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes of the block (exactly what was asked for).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// A small dense number, unique among the index's live allocations, for
    /// side tables (the same number [`Region::slot`] reports). Reused after
    /// the block is freed.
    pub fn slot(&self) -> u32 {
        self.node
    }
}

/// One region of the index's address space, as listed by
/// [`FreeIndex::regions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// First byte of the region.
    pub offset: u64,
    /// Length in bytes (> 0).
    pub size: u64,
    /// `Some(slot)` for a used block (its [`Allocation::slot`]), `None` for
    /// free space.
    pub slot: Option<u32>,
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
    /// The current layout's epoch (see [`Allocation`]).
    epoch: u64,
    /// How `alloc` chooses among the regions that hold a request.
    fit: Fit,
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
            epoch: 0,
            fit: Fit::Good,
        };
        index.reset();
        if capacity > 0 {
            index.push_region(0, capacity, NIL, false);
        }
        index
    }

    /// The index with `fit` as its choice among the regions that hold a
    /// request (kept across [`rebuild`](Self::rebuild)).
    pub(crate) fn with_fit(mut self, fit: Fit) -> Self {
        self.fit = fit;
        self
    }

    /// How `alloc` chooses among the regions that hold a request.
    pub(crate) fn fit(&self) -> Fit {
        self.fit
    }

    /// Size of the managed address space in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Allocates `size` bytes at an offset that is a multiple of `align`.
    ///
    /// `size > 0` and `align` a power of two (debug-asserted). Returns `None`
    /// only if no free region can hold `size` bytes at an `align`-aligned
    /// offset (or, unreachably in practice, if the index already has ~4
    /// billion nodes). O(1) unless no region of a surely-fitting class exists
    /// (see the [module docs](self)).
    #[inline]
    pub fn alloc(&mut self, size: u64, align: u64) -> Option<Allocation> {
        let (node, offset) = self.alloc_node(size, align, false)?;
        Some(Allocation {
            offset,
            size: size.max(1),
            epoch: self.epoch,
            node,
        })
    }

    /// [`alloc`](Self::alloc), but the block is carved from the *top* of
    /// the free region that `alloc` would choose (the same choice, the
    /// same exact failure): the rest of the region stays free below it.
    /// O(1) like `alloc`.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn alloc_high(&mut self, size: u64, align: u64) -> Option<Allocation> {
        let (node, offset) = self.alloc_node(size, align, true)?;
        Some(Allocation {
            offset,
            size: size.max(1),
            epoch: self.epoch,
            node,
        })
    }

    /// `alloc` (`high`: `alloc_high`), returning the node and the offset.
    /// Out of line, with `alloc` inline around it: the caller builds the
    /// `Allocation` in place, and one copy of the search serves both.
    #[inline(never)]
    fn alloc_node(&mut self, size: u64, align: u64, high: bool) -> Option<(u32, u64)> {
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
        // Carves from the region's bottom (`pad`, the lowest aligned
        // offset) or, when `high`, from its top: the highest aligned offset
        // that holds `size`, at or above the lowest since the region fits.
        let carve = |this: &mut Self, bin: u32, node: u32, pad: u64| {
            let pad = if high {
                let n = &this.nodes[node as usize];
                ((n.offset + n.size - size) & !align_mask) - n.offset
            } else {
                pad
            };
            this.take(node, bin, pad, size)
        };

        if self.fit == Fit::Best {
            let (node, bin, pad) = self.best_fit(size, align_mask)?;
            return carve(self, bin, node, pad);
        }
        // Good fit: the smallest class whose regions all hold `size`.
        if let Some((bin, node)) = self.classes.first_at_or_above(bin_round_up(size)) {
            if let Some(pad) = fit(&self.nodes[node as usize], size, align_mask) {
                return carve(self, bin, node, pad);
            }
            // Padding made the head too short: a class whose regions all hold
            // `size + align - 1` fits at any offset.
            let sure = bin_round_up(size.saturating_add(align_mask));
            if let Some((bin, node)) = self.classes.first_at_or_above(sure) {
                if let Some(pad) = fit(&self.nodes[node as usize], size, align_mask) {
                    return carve(self, bin, node, pad);
                }
            }
        }
        // Rare (the index is nearly full or badly fragmented for this
        // request): the exact scan, carved low either way.
        self.alloc_scan(size, align_mask)
    }

    /// The exact fallback: walks every region of the classes that may but
    /// need not fit, `[class of size, class that surely fits)`, in ascending
    /// class order. Classes at or above the upper bound were found empty.
    #[cold]
    fn alloc_scan(&mut self, size: u64, align_mask: u64) -> Option<(u32, u64)> {
        let (node, bin, pad) = self.scan(size, align_mask)?;
        self.take(node, bin, pad, size)
    }

    /// The exact scan's find: the first region (its node, class and
    /// padding) of the classes `[class of size, class that surely fits)`
    /// that holds `size` at `align_mask`.
    fn scan(&self, size: u64, align_mask: u64) -> Option<(u32, u32, u64)> {
        self.scan_where(size, align_mask, |_| true)
    }

    /// [`scan`](Self::scan) among the regions `take` accepts.
    fn scan_where(
        &self,
        size: u64,
        align_mask: u64,
        take: impl Fn(&Node) -> bool,
    ) -> Option<(u32, u32, u64)> {
        let end = bin_round_up(size.saturating_add(align_mask));
        let mut next = self.classes.first_at_or_above(bin_round_down(size));
        while let Some((bin, head)) = next {
            if bin >= end {
                break;
            }
            let mut node = head;
            while node != NIL {
                let n = &self.nodes[node as usize];
                if let Some(pad) = fit(n, size, align_mask).filter(|_| take(n)) {
                    return Some((node, bin, pad));
                }
                node = n.bin_next;
            }
            next = self.classes.first_at_or_above(bin + 1);
        }
        None
    }

    /// Frees a block, coalescing it with free neighbours. O(1).
    ///
    /// # Errors
    ///
    /// [`PlacementError::ForeignAllocation`] for an allocation that another index
    /// made, or this one before its last [`rebuild`](Self::rebuild); the
    /// index is unchanged then.
    pub fn free(&mut self, a: Allocation) -> Result<()> {
        let owned = a.epoch == self.epoch
            && self
                .nodes
                .get(a.node as usize)
                .is_some_and(|n| n.bin_prev == USED && n.offset == a.offset && n.size == a.size);
        if !owned {
            return Err(PlacementError::ForeignAllocation { offset: a.offset });
        }
        self.free_node(a.node);
        Ok(())
    }

    /// Frees the used block `node` (checked by the caller).
    fn free_node(&mut self, node: u32) {
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
                slot: (!n.is_free()).then_some(node),
            };
            node = n.addr_next;
            Some(region)
        })
    }

    /// Resets the index to a layout in which `used` (`(offset, size)` pairs)
    /// are the used blocks and the space between them is free. Clears `out`
    /// and pushes each block's new [`Allocation`], in the order of `used`.
    /// Every allocation made before is void afterwards (freeing one is
    /// [`PlacementError::ForeignAllocation`]). O(n); reuses the index's allocations.
    ///
    /// # Errors
    ///
    /// [`PlacementError::InvalidLayout`], leaving the index (and `out`) unchanged,
    /// unless the blocks ascend, do not overlap, lie in `[0, capacity)` and
    /// have sizes > 0, and there are few enough to name (below ~2^31).
    pub fn rebuild(&mut self, used: &[(u64, u64)], out: &mut Vec<Allocation>) -> Result<()> {
        self.check_layout(used)?;
        out.clear();
        out.reserve(used.len());
        self.rebuild_checked(used, |_, a| out.push(a));
        Ok(())
    }

    /// [`rebuild`](Self::rebuild), handing each block's new [`Allocation`]
    /// to `each` with its index in `used` rather than collecting them: the
    /// arena stores them straight into its block table, with no table of
    /// allocations in between (32 bytes per block on every compaction).
    ///
    /// # Errors
    ///
    /// As [`rebuild`](Self::rebuild); `each` is not called then.
    pub fn rebuild_with(
        &mut self,
        used: &[(u64, u64)],
        each: impl FnMut(usize, Allocation),
    ) -> Result<()> {
        self.check_layout(used)?;
        self.rebuild_checked(used, each);
        Ok(())
    }

    /// The rebuild of a layout that passed `check_layout`.
    fn rebuild_checked(&mut self, used: &[(u64, u64)], mut each: impl FnMut(usize, Allocation)) {
        self.reset();
        self.used_blocks = used.len();
        let mut cursor = 0u64;
        let mut last = NIL;
        for (i, &(offset, size)) in used.iter().enumerate() {
            if offset > cursor {
                last = self.push_region(cursor, offset - cursor, last, false);
            }
            last = self.push_region(offset, size, last, true);
            each(
                i,
                Allocation {
                    offset,
                    size,
                    epoch: self.epoch,
                    node: last,
                },
            );
            // Checked above: `offset + size <= capacity`.
            cursor = offset + size;
        }
        if self.capacity > cursor {
            self.push_region(cursor, self.capacity - cursor, last, false);
        }
    }

    /// The checks of [`rebuild`](Self::rebuild).
    fn check_layout(&self, used: &[(u64, u64)]) -> Result<()> {
        let invalid = |reason: String| Err(PlacementError::InvalidLayout { reason });
        if used.len() >= MAX_NODES / 2 {
            return invalid(format!(
                "{} blocks exceed the index's node id space ({} blocks)",
                used.len(),
                MAX_NODES / 2
            ));
        }
        let mut cursor = 0u64;
        for (i, &(offset, size)) in used.iter().enumerate() {
            let end = offset.checked_add(size).filter(|&e| e <= self.capacity);
            let Some(end) = end.filter(|_| size > 0) else {
                return invalid(format!(
                    "block {i} at {offset} of {size} B is empty or outside [0, {})",
                    self.capacity
                ));
            };
            if offset < cursor {
                return invalid(format!(
                    "block {i} at {offset} starts below the end {cursor} of the block before it \
                     (blocks must ascend and not overlap)"
                ));
            }
            cursor = end;
        }
        Ok(())
    }

    /// Empties the node table and starts a new epoch.
    fn reset(&mut self) {
        self.nodes.clear();
        self.addr_head = NIL;
        self.vacant_head = NIL;
        self.classes.clear();
        self.free_bytes = 0;
        self.free_regions = 0;
        self.used_blocks = 0;
        self.epoch = NEXT_EPOCH.fetch_add(1, Ordering::Relaxed);
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
}
