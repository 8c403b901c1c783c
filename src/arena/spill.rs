//! Spilling: never OOM, slow down instead.
//!
//! With `spill_host_bytes > 0`, a request that even compaction cannot fit
//! evicts the least recently used unpinned blocks to the host tier, then
//! compacts and places it. A block is "used" when it is resolved for a
//! kernel (views, pointers, [`Arena::resolve`]), a transfer or a pin.
//! Spilled handles stay valid: transfers and pins bring them back on their
//! own; views and pointers need [`Arena::make_resident`] first (they borrow
//! the arena immutably, so they cannot move anything).

use std::sync::atomic::Ordering;

use super::{Arena, Place};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::handle::{BlockKey, Handle};
use crate::placement::Allocation;
use crate::plan::planner;

impl<B: Backend> Arena<B> {
    /// Brings every handle in `handles` onto the device together, spilling
    /// others (never these) if needed, and counts them as used. Fails without
    /// changing anything if a handle is bad, or if the blocks together
    /// exceed what the region can hold beside the pinned blocks.
    pub fn make_resident(&mut self, handles: &[Handle]) -> Result<()> {
        let mut keep = smallvec::SmallVec::<[BlockKey; 8]>::new();
        for &h in handles {
            self.block(h)?;
            keep.push(h.key);
        }
        for &h in handles {
            let Some(b) = self.blocks.get(h.key) else {
                continue;
            };
            b.last_use.store(self.tick(), Ordering::Relaxed);
            let Place::Host(t) = &b.place else {
                continue;
            };
            let (host, reserved, align, size) = (t.offset(), b.reserved, b.align, b.size);
            let node = self.place_on_device(reserved, align, &keep)?;
            let (dev, slot) = (node.offset(), node.slot());
            if let Err(e) = self.backend.restore(host, dev, size) {
                self.poison(format!("restoring a spilled block failed: {e}"));
                return Err(e);
            }
            let old = match self.blocks.get_mut(h.key) {
                Some(b) => std::mem::replace(&mut b.place, Place::Device(node)),
                None => Place::Device(node),
            };
            if let (Place::Host(t), Some(tier)) = (old, self.tier.as_mut()) {
                if let Err(e) = tier.free(t) {
                    // Unreachable: the tier's allocations are its own.
                    self.poison(format!("freeing a host-tier block failed: {e}"));
                    return Err(e);
                }
            }
            self.set_owner(slot, h.key);
            self.set_entry(h.key, Some((dev, size)));
            self.counters.restores += 1;
            self.counters.bytes_restored = self.counters.bytes_restored.saturating_add(size);
        }
        Ok(())
    }

    /// The least recently used block in the region that may be spilled.
    pub(super) fn lru_victim(&self, keep: &[BlockKey]) -> Option<BlockKey> {
        self.blocks
            .iter()
            .filter(|(k, b)| {
                matches!(b.place, Place::Device(_)) && b.pins == 0 && !keep.contains(k)
            })
            .min_by_key(|(_, b)| b.last_use.load(Ordering::Relaxed))
            .map(|(k, _)| k)
    }

    /// Spills LRU blocks until a full compaction can make a hole for the
    /// request, then compacts and places it.
    pub(super) fn alloc_by_spilling(
        &mut self,
        reserved: u64,
        align: u64,
        keep: &[BlockKey],
    ) -> Result<Allocation> {
        let capacity = self.config.capacity_bytes;
        loop {
            // The last eviction may have opened a hole that fits as it is.
            if let Some(node) = self.index.alloc(reserved, align) {
                return Ok(node);
            }
            if self.index.free_bytes() >= reserved {
                // A targeted compaction moves only the blocks around one window.
                let t0 = std::time::Instant::now();
                self.collect_live();
                let plan = planner::plan_targeted(
                    &self.live,
                    capacity,
                    planner::Request {
                        size: reserved,
                        align,
                    },
                );
                self.counters.planning += t0.elapsed();
                if let Some(plan) = plan {
                    self.execute(plan, t0)?;
                    if let Some(node) = self.index.alloc(reserved, align) {
                        return Ok(node);
                    }
                }
                self.collect_live();
                if planner::largest_hole_after_full(&self.live, capacity, align) >= reserved {
                    let t0 = std::time::Instant::now();
                    let plan = planner::plan_full(&self.live, capacity);
                    self.counters.planning += t0.elapsed();
                    self.execute(plan, t0)?;
                    if let Some(node) = self.index.alloc(reserved, align) {
                        return Ok(node);
                    }
                }
            }
            let Some(victim) = self.lru_victim(keep) else {
                // Everything left is pinned or needed by this request.
                self.counters.failed_allocs += 1;
                self.collect_live();
                // Saturating: near 2^64 B the sum can exceed u64.
                let needed = self
                    .live
                    .iter()
                    .filter(|l| l.pinned)
                    .map(|l| l.len)
                    .chain(
                        keep.iter()
                            .filter_map(|k| self.blocks.get(*k))
                            .filter(|b| b.pins == 0 && matches!(b.place, Place::Device(_)))
                            .map(|b| b.reserved),
                    )
                    .fold(reserved, u64::saturating_add);
                return Err(Error::WorkingSetTooLarge {
                    needed_bytes: needed,
                    reachable_bytes: planner::largest_hole_after_full(&self.live, capacity, align),
                });
            };
            self.spill(victim, reserved)?;
        }
    }

    /// Copies one block to the host tier and frees its space in the region.
    pub(super) fn spill(&mut self, key: BlockKey, requested: u64) -> Result<()> {
        let Some(b) = self.blocks.get(key) else {
            return Ok(());
        };
        let (Place::Device(node), reserved, size) = (&b.place, b.reserved, b.size) else {
            return Ok(());
        };
        let dev = node.offset();
        let Some(tier) = self.tier.as_mut() else {
            return Err(Error::NoHostTier {
                requested_bytes: reserved,
            });
        };
        let Some(tier_node) = tier.alloc(reserved, 1) else {
            self.counters.failed_allocs += 1;
            let r = tier.report();
            return Err(Error::HostTierFull {
                requested_bytes: requested,
                needed_bytes: reserved,
                host_tier_bytes: tier.capacity(),
                host_free_bytes: r.free_bytes,
                host_largest_free_bytes: r.largest_free_bytes,
            });
        };
        // The copy to the host reads the block on the arena stream, and its
        // space is reused after it: wait for the streams that used it.
        if let Err(e) = self.wait_uses(key) {
            if let Some(t) = self.tier.as_mut() {
                let _ = t.free(tier_node);
            }
            return Err(e);
        }
        self.epoch += 1;
        if let Err(e) = self.backend.spill(dev, tier_node.offset(), size) {
            if let Some(t) = self.tier.as_mut() {
                // Cannot fail: the allocation was just made by this tier.
                let _ = t.free(tier_node);
            }
            self.poison(format!("spilling a block failed: {e}"));
            return Err(e);
        }
        let old = match self.blocks.get_mut(key) {
            Some(b) => std::mem::replace(&mut b.place, Place::Host(tier_node)),
            None => Place::Host(tier_node),
        };
        if let Place::Device(node) = old {
            if let Err(e) = self.index.free(node) {
                // Unreachable: the arena holds only its index's allocations.
                self.poison(format!("freeing a spilled block's space failed: {e}"));
                return Err(e);
            }
        }
        self.set_entry(key, None);
        self.counters.evictions += 1;
        self.counters.bytes_evicted = self.counters.bytes_evicted.saturating_add(size);
        Ok(())
    }
}
