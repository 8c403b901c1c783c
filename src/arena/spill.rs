//! Spilling: never OOM, slow down instead.
//!
//! With `spill_host_bytes > 0`, a request that even compaction cannot fit
//! evicts the least recently used unpinned blocks to the host tier, then
//! compacts and places it. A block is "used" when it is resolved for a
//! kernel (views, pointers, [`Arena::resolve`]), a transfer or a pin.
//! Spilled handles stay valid: transfers and pins bring them back on their
//! own; views, pointers and reads under a shared lock need
//! [`Arena::make_resident`] first (they borrow the arena immutably, so they
//! cannot move anything). A [`crate::SharedArena`] does that itself in its
//! reads and `with_kernel_args`, and offers `make_resident`.
//!
//! Errors keep the arena's contract: arguments (handle, length, type,
//! range, pattern) are checked before any residency change, and the
//! evictions a request needs are planned, with their host-tier space
//! reserved, before the first one runs. A request that fails with
//! [`Error::OutOfMemory`] or [`Error::HostTierFull`] has spilled,
//! moved and written nothing (see [`Arena::make_resident`] for several
//! handles at once).

use std::sync::atomic::Ordering;

use super::{Arena, Place};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::handle::{BlockKey, Handle};
use crate::placement::Allocation;
use crate::plan::planner;

impl<B: Backend> Arena<B> {
    /// Brings `handles` back one at a time, each atomically (see
    /// [`Arena::make_room_for_all`] for several).
    pub(super) fn restore_each(&mut self, handles: &[Handle], keep: &[BlockKey]) -> Result<()> {
        for &h in handles {
            let Some(b) = self.core.blocks.get(h.key) else {
                continue;
            };
            b.last_use.store(self.core.tick(), Ordering::Relaxed);
            let Place::Host(t) = &b.place else {
                continue;
            };
            let (host, reserved, align, size) = (t.offset(), b.reserved(), b.align(), b.size);
            let node = self.place_on_device(reserved, align, keep)?;
            let (dev, slot) = (node.offset(), node.slot());
            // The restore writes on the arena stream: later kernel arguments
            // on other streams must wait for it.
            self.core.order.queued();
            if let Err(e) = self.core.backend.restore(host, dev, size) {
                // Give the node back: left used without an owner, a later
                // compaction would read a stale owner entry.
                let _ = self.core.index.free(node);
                self.core
                    .poison(format!("restoring a spilled block failed: {e}"));
                return Err(e);
            }
            let old = match self.core.blocks.get_mut(h.key) {
                Some(b) => std::mem::replace(&mut b.place, Place::Device(node)),
                None => Place::Device(node),
            };
            if let (Place::Host(t), Some(tier)) = (old, self.tier.as_mut()) {
                if let Err(e) = tier.free(t) {
                    // Unreachable: the tier's allocations are its own.
                    return Err(self.core.broken("freeing a host-tier block failed", e));
                }
            }
            self.core.set_owner(slot, h.key);
            self.core.set_entry(h.key, Some((dev, size)));
            self.core.counters.restores += 1;
            self.core.counters.bytes_restored =
                self.core.counters.bytes_restored.saturating_add(size);
        }
        Ok(())
    }

    /// Makes room for the spilled blocks `spilled` (two or more) to come
    /// back together, with `keep` resident, or changes nothing: afterwards
    /// each of them, placed in order, finds a hole. If they all fit in the
    /// holes as they are, nothing is done. Otherwise the least recently
    /// used blocks (not pinned, not in `keep`) are evicted until, after a
    /// full compaction, all of them fit, then that compaction runs. Both
    /// are checked on a copy of the placement index (placement is
    /// deterministic: the copy decides what the index will), and the
    /// evictions' host-tier space is reserved, before anything changes.
    pub(super) fn make_room_for_all(
        &mut self,
        spilled: &[Handle],
        keep: &[BlockKey],
    ) -> Result<()> {
        let sizes: Vec<(u64, u64)> = spilled
            .iter()
            .filter_map(|h| self.core.blocks.get(h.key))
            .map(|b| (b.reserved(), b.align()))
            .collect();
        let fits = |index: &mut crate::placement::FreeIndex| {
            sizes.iter().all(|&(r, a)| index.alloc(r, a).is_some())
        };
        if fits(&mut self.core.index.clone()) {
            return Ok(());
        }
        let capacity = self.core.capacity();
        let fit = self.core.index.fit();
        self.core.collect_live();
        let mut live = self.core.live.clone();
        let after_full = |live: &[planner::LiveBlock]| {
            let mut spans: Vec<(u64, u64)> = live.iter().map(|l| (l.offset, l.len)).collect();
            let at: std::collections::HashMap<u64, usize> =
                live.iter().enumerate().map(|(i, l)| (l.key, i)).collect();
            // In wave order: a block's last move is where it ends.
            for m in planner::plan_full(live, capacity).moves() {
                if let Some(&i) = at.get(&m.key) {
                    spans[i].0 = m.dst;
                }
            }
            spans.sort_unstable();
            let mut index = crate::placement::FreeIndex::new(capacity).with_fit(fit);
            index.rebuild(&spans, &mut Vec::new()).is_ok() && fits(&mut index)
        };
        let mut candidates: Vec<(u64, BlockKey)> = self
            .core
            .blocks
            .iter()
            .filter(|(k, b)| {
                matches!(b.place, Place::Device(_)) && b.pins == 0 && !keep.contains(k)
            })
            .map(|(k, b)| (b.last_use.load(Ordering::Relaxed), k))
            .collect();
        candidates.sort_unstable_by_key(|c| c.0);
        let mut next = candidates.into_iter();
        let mut victims: Vec<BlockKey> = Vec::new();
        while !after_full(&live) {
            let Some((_, victim)) = next.next() else {
                self.core.counters.failed_allocs += 1;
                let needed = live
                    .iter()
                    .map(|l| l.len)
                    .chain(sizes.iter().map(|s| s.0))
                    .fold(0, u64::saturating_add);
                let align = sizes.iter().map(|s| s.1).max().unwrap_or(1);
                return Err(Error::OutOfMemory {
                    requested_bytes: needed,
                    free_bytes: self.core.index.free_bytes(),
                    largest_free_bytes: self.core.index.largest_free(),
                    reachable_bytes: planner::largest_hole_after_full(&live, capacity, align),
                });
            };
            let bits = victim.to_bits();
            live.retain(|l| l.key != bits);
            victims.push(victim);
        }
        // The victims' space in the host tier, all of it before the first
        // eviction (the restored blocks keep theirs until they are back).
        let mut reserved: Vec<(BlockKey, Allocation)> = Vec::new();
        let mut tier_needed = 0u64;
        for &v in &victims {
            let len = self.core.blocks.get(v).map_or(0, |b| b.reserved());
            tier_needed = tier_needed.saturating_add(len);
            let node = match self.tier.as_mut() {
                Some(tier) => tier.alloc(len, 1),
                None => None,
            };
            match node {
                Some(node) => reserved.push((v, node)),
                None => {
                    for (_, t) in reserved {
                        self.release_tier(t);
                    }
                    self.core.counters.failed_allocs += 1;
                    let r = self.tier.as_ref().map(|t| t.report()).unwrap_or_default();
                    return Err(Error::HostTierFull {
                        requested_bytes: sizes.iter().map(|s| s.0).fold(0, u64::saturating_add),
                        needed_bytes: tier_needed,
                        host_tier_bytes: self.tier.as_ref().map_or(0, |t| t.capacity()),
                        host_free_bytes: r.free_bytes,
                        host_largest_free_bytes: r.largest_free_bytes,
                    });
                }
            }
        }
        let mut reserved = reserved.into_iter();
        while let Some((key, tier_node)) = reserved.next() {
            if let Err(e) = self.spill_to(key, tier_node) {
                for (_, t) in reserved {
                    self.release_tier(t);
                }
                return Err(e);
            }
        }
        // The compaction the check planned: the same live blocks, the
        // same plan, the same rebuilt index.
        self.policy.settle(&mut self.core)?;
        let t0 = std::time::Instant::now();
        self.core.collect_live();
        let plan = planner::plan_full(&self.core.live, capacity);
        self.core.counters.planning += t0.elapsed();
        self.core.run(plan, t0)?;
        Ok(())
    }

    /// Spills LRU blocks until a full compaction can make a hole for the
    /// request, then compacts and places it.
    ///
    /// The evictions are decided and their host-tier space reserved before
    /// anything moves: when the request cannot be met
    /// ([`Error::OutOfMemory`], [`Error::HostTierFull`]), nothing has
    /// been spilled, moved or written.
    pub(super) fn alloc_by_spilling(
        &mut self,
        reserved: u64,
        align: u64,
        keep: &[BlockKey],
    ) -> Result<Allocation> {
        let victims = self.plan_evictions(reserved, align, keep)?;
        // Evicting and compacting work on the bytes' layout.
        if let Err(e) = self.policy.settle(&mut self.core) {
            for (_, t) in victims {
                self.release_tier(t);
            }
            return Err(e);
        }
        let mut victims = victims.into_iter();
        while let Some((key, tier_node)) = victims.next() {
            if let Err(e) = self.spill_to(key, tier_node) {
                // `spill_to` released its own reservation; release the rest.
                for (_, t) in victims {
                    self.release_tier(t);
                }
                return Err(e);
            }
        }
        let capacity = self.core.capacity();
        // The last eviction may have opened a hole that fits as it is.
        if let Some(node) = self.core.index.alloc(reserved, align) {
            return Ok(node);
        }
        // A targeted compaction moves only the blocks around one window.
        let t0 = std::time::Instant::now();
        self.core.collect_live();
        let req = planner::Request {
            size: reserved,
            align,
        };
        let plan = planner::plan_targeted(&self.core.live, capacity, req);
        self.core.counters.planning += t0.elapsed();
        if let Some(plan) = plan {
            self.core.run(plan, t0)?;
            if let Some(node) = self.core.index.alloc(reserved, align) {
                return Ok(node);
            }
        }
        let t0 = std::time::Instant::now();
        self.core.collect_live();
        let plan = planner::plan_full(&self.core.live, capacity);
        self.core.counters.planning += t0.elapsed();
        self.core.run(plan, t0)?;
        self.core.index.alloc(reserved, align).ok_or_else(|| {
            // Unreachable: the evictions were planned so that a full
            // compaction makes this hole.
            let reason = "spilling planned a hole that compaction did not make";
            self.core.poison(reason.to_string());
            Error::Poisoned {
                reason: reason.to_string(),
            }
        })
    }

    /// The least recently used unpinned blocks not in `keep` whose eviction
    /// lets a full compaction make a hole of `reserved` bytes at `align`,
    /// in LRU order, each with its host-tier space reserved. Changes nothing
    /// but the reservations; on an error, not even those.
    pub(super) fn plan_evictions(
        &mut self,
        reserved: u64,
        align: u64,
        keep: &[BlockKey],
    ) -> Result<Vec<(BlockKey, Allocation)>> {
        let capacity = self.core.capacity();
        self.core.collect_live();
        let mut live = std::mem::take(&mut self.core.live);
        let mut candidates: Vec<(u64, BlockKey, u64)> = self
            .core
            .blocks
            .iter()
            .filter(|(k, b)| {
                matches!(b.place, Place::Device(_)) && b.pins == 0 && !keep.contains(k)
            })
            .map(|(k, b)| (b.last_use.load(Ordering::Relaxed), k, b.reserved()))
            .collect();
        candidates.sort_unstable_by_key(|c| c.0);
        let mut victims: Vec<(BlockKey, Allocation)> = Vec::new();
        let mut next = candidates.into_iter();
        let mut tier_needed = 0u64;
        let outcome = loop {
            let reachable = planner::largest_hole_after_full(&live, capacity, align);
            if reachable >= reserved {
                break Ok(());
            }
            let Some((_, victim, victim_reserved)) = next.next() else {
                // Everything left is pinned or needed by this request.
                // Saturating: near 2^64 B the sum can exceed u64.
                let needed = live
                    .iter()
                    .filter(|l| l.pinned)
                    .map(|l| l.len)
                    .chain(
                        keep.iter()
                            .filter_map(|k| self.core.blocks.get(*k))
                            .filter(|b| b.pins == 0 && matches!(b.place, Place::Device(_)))
                            .map(|b| b.reserved()),
                    )
                    .fold(reserved, u64::saturating_add);
                break Err(Error::OutOfMemory {
                    requested_bytes: needed,
                    free_bytes: self.core.index.free_bytes(),
                    largest_free_bytes: self.core.index.largest_free(),
                    reachable_bytes: reachable,
                });
            };
            tier_needed = tier_needed.saturating_add(victim_reserved);
            let Some(tier) = self.tier.as_mut() else {
                break Err(crate::backend::no_host_tier(reserved));
            };
            let Some(node) = tier.alloc(victim_reserved, 1) else {
                break Err(Error::HostTierFull {
                    requested_bytes: reserved,
                    needed_bytes: tier_needed,
                    host_tier_bytes: tier.capacity(),
                    host_free_bytes: 0, // filled in below, reservations released
                    host_largest_free_bytes: 0,
                });
            };
            victims.push((victim, node));
            let bits = victim.to_bits();
            live.retain(|l| l.key != bits);
        };
        self.core.live = live;
        match outcome {
            Ok(()) => Ok(victims),
            Err(mut e) => {
                self.core.counters.failed_allocs += 1;
                if let Some(tier) = self.tier.as_mut() {
                    for (_, t) in victims {
                        let _ = tier.free(t);
                    }
                    if let Error::HostTierFull {
                        host_free_bytes,
                        host_largest_free_bytes,
                        ..
                    } = &mut e
                    {
                        let r = tier.report();
                        *host_free_bytes = r.free_bytes;
                        *host_largest_free_bytes = r.largest_free_bytes;
                    }
                }
                Err(e)
            }
        }
    }

    /// Gives a reservation back to the host tier.
    pub(super) fn release_tier(&mut self, node: Allocation) {
        if let Some(t) = self.tier.as_mut() {
            // Cannot fail: the allocation was made by this tier.
            let _ = t.free(node);
        }
    }

    /// Copies one block to the host tier, into `tier_node` (reserved for it),
    /// and frees its space in the region. On an error the reservation is
    /// released.
    pub(super) fn spill_to(&mut self, key: BlockKey, tier_node: Allocation) -> Result<()> {
        let Some(b) = self.core.blocks.get(key) else {
            self.release_tier(tier_node);
            return Ok(());
        };
        let (Some(dev), size) = (b.real_offset(), b.size) else {
            self.release_tier(tier_node);
            return Ok(());
        };
        // The copy to the host reads the block on the arena stream, and its
        // space is reused after it: wait for the streams that used it.
        if let Err(e) = self.core.wait_uses(key) {
            self.release_tier(tier_node);
            return Err(e);
        }
        self.core.order.queued();
        if let Err(e) = self.core.backend.spill(dev, tier_node.offset(), size) {
            self.release_tier(tier_node);
            self.core.poison(format!("spilling a block failed: {e}"));
            return Err(e);
        }
        let old = match self.core.blocks.get_mut(key) {
            Some(b) => std::mem::replace(&mut b.place, Place::Host(tier_node)),
            None => Place::Host(tier_node),
        };
        let lag = self.core.blocks.get_mut(key).and_then(|b| b.lag.take());
        self.policy.spilled(lag);
        if let Place::Device(node) = old {
            if let Err(e) = self.core.index.free(node) {
                // Unreachable: the arena holds only its index's allocations.
                return Err(self
                    .core
                    .broken("freeing a spilled block's space failed", e));
            }
        }
        self.core.set_entry(key, None);
        self.core.counters.evictions += 1;
        self.core.counters.bytes_evicted = self.core.counters.bytes_evicted.saturating_add(size);
        Ok(())
    }
}
