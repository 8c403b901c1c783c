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

/// Brings `handles` back one at a time, each atomically (see
/// [`Arena::make_room_for_all`] for several).
pub(super) fn restore_each<B: Backend>(
    arena: &mut Arena<B>,
    handles: &[Handle],
    keep: &[BlockKey],
) -> Result<()> {
    for &h in handles {
        let Some(b) = arena.core.blocks.get(h.key) else {
            continue;
        };
        b.last_use.store(arena.core.tick(), Ordering::Relaxed);
        let Place::Host(t) = &b.place else {
            continue;
        };
        let (host, reserved, align, size) = (t.offset(), b.reserved(), b.align(), b.size);
        let node = arena.place_on_device(reserved, align, keep)?;
        let (dev, slot) = (node.offset(), node.slot());
        // The restore writes on the arena stream: later kernel arguments
        // on other streams must wait for it.
        arena.core.epoch += 1;
        if let Err(e) = arena.core.backend.restore(host, dev, size) {
            // Give the node back: left used without an owner, a later
            // compaction would read a stale owner entry.
            let _ = arena.core.index.free(node);
            arena
                .core
                .poison(format!("restoring a spilled block failed: {e}"));
            return Err(e);
        }
        let old = match arena.core.blocks.get_mut(h.key) {
            Some(b) => std::mem::replace(&mut b.place, Place::Device(node)),
            None => Place::Device(node),
        };
        if let (Place::Host(t), Some(tier)) = (old, arena.tier.as_mut()) {
            if let Err(e) = tier.free(t) {
                // Unreachable: the tier's allocations are its own.
                return Err(arena.core.broken("freeing a host-tier block failed", e));
            }
        }
        arena.core.set_owner(slot, h.key);
        arena.core.set_entry(h.key, Some((dev, size)));
        arena.core.counters.restores += 1;
        arena.core.counters.bytes_restored =
            arena.core.counters.bytes_restored.saturating_add(size);
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
pub(super) fn make_room_for_all<B: Backend>(
    arena: &mut Arena<B>,
    spilled: &[Handle],
    keep: &[BlockKey],
) -> Result<()> {
    let sizes: Vec<(u64, u64)> = spilled
        .iter()
        .filter_map(|h| arena.core.blocks.get(h.key))
        .map(|b| (b.reserved(), b.align()))
        .collect();
    let fits = |index: &mut crate::placement::FreeIndex| {
        sizes.iter().all(|&(r, a)| index.alloc(r, a).is_some())
    };
    if fits(&mut arena.core.index.clone()) {
        return Ok(());
    }
    let capacity = arena.core.capacity();
    arena.core.collect_live();
    let mut live = arena.core.live.clone();
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
        let mut index = crate::placement::FreeIndex::new(capacity);
        index.rebuild(&spans, &mut Vec::new()).is_ok() && fits(&mut index)
    };
    let mut candidates: Vec<(u64, BlockKey)> = arena
        .core
        .blocks
        .iter()
        .filter(|(k, b)| matches!(b.place, Place::Device(_)) && b.pins == 0 && !keep.contains(k))
        .map(|(k, b)| (b.last_use.load(Ordering::Relaxed), k))
        .collect();
    candidates.sort_unstable_by_key(|c| c.0);
    let mut next = candidates.into_iter();
    let mut victims: Vec<BlockKey> = Vec::new();
    while !after_full(&live) {
        let Some((_, victim)) = next.next() else {
            arena.core.counters.failed_allocs += 1;
            let needed = live
                .iter()
                .map(|l| l.len)
                .chain(sizes.iter().map(|s| s.0))
                .fold(0, u64::saturating_add);
            let align = sizes.iter().map(|s| s.1).max().unwrap_or(1);
            return Err(Error::OutOfMemory {
                requested_bytes: needed,
                free_bytes: arena.core.index.free_bytes(),
                largest_free_bytes: arena.core.index.largest_free(),
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
        let len = arena.core.blocks.get(v).map_or(0, |b| b.reserved());
        tier_needed = tier_needed.saturating_add(len);
        let node = match arena.tier.as_mut() {
            Some(tier) => tier.alloc(len, 1),
            None => None,
        };
        match node {
            Some(node) => reserved.push((v, node)),
            None => {
                for (_, t) in reserved {
                    release_tier(arena, t);
                }
                arena.core.counters.failed_allocs += 1;
                let r = arena.tier.as_ref().map(|t| t.report()).unwrap_or_default();
                return Err(Error::HostTierFull {
                    requested_bytes: sizes.iter().map(|s| s.0).fold(0, u64::saturating_add),
                    needed_bytes: tier_needed,
                    host_tier_bytes: arena.tier.as_ref().map_or(0, |t| t.capacity()),
                    host_free_bytes: r.free_bytes,
                    host_largest_free_bytes: r.largest_free_bytes,
                });
            }
        }
    }
    let mut reserved = reserved.into_iter();
    while let Some((key, tier_node)) = reserved.next() {
        if let Err(e) = spill_to(arena, key, tier_node) {
            for (_, t) in reserved {
                release_tier(arena, t);
            }
            return Err(e);
        }
    }
    // The compaction the check planned: the same live blocks, the
    // same plan, the same rebuilt index.
    arena.policy.settle(&mut arena.core)?;
    let t0 = std::time::Instant::now();
    arena.core.collect_live();
    let plan = planner::plan_full(&arena.core.live, capacity);
    arena.core.counters.planning += t0.elapsed();
    arena.core.run(plan, t0)?;
    Ok(())
}

/// Spills LRU blocks until a full compaction can make a hole for the
/// request, then compacts and places it.
///
/// The evictions are decided and their host-tier space reserved before
/// anything moves: when the request cannot be met
/// ([`Error::OutOfMemory`], [`Error::HostTierFull`]), nothing has
/// been spilled, moved or written.
pub(super) fn alloc_by_spilling<B: Backend>(
    arena: &mut Arena<B>,
    reserved: u64,
    align: u64,
    keep: &[BlockKey],
) -> Result<Allocation> {
    let victims = plan_evictions(arena, reserved, align, keep)?;
    // Evicting and compacting work on the bytes' layout.
    if let Err(e) = arena.policy.settle(&mut arena.core) {
        for (_, t) in victims {
            release_tier(arena, t);
        }
        return Err(e);
    }
    let mut victims = victims.into_iter();
    while let Some((key, tier_node)) = victims.next() {
        if let Err(e) = spill_to(arena, key, tier_node) {
            // `spill_to` released its own reservation; release the rest.
            for (_, t) in victims {
                release_tier(arena, t);
            }
            return Err(e);
        }
    }
    let capacity = arena.core.capacity();
    // The last eviction may have opened a hole that fits as it is.
    if let Some(node) = arena.core.index.alloc(reserved, align) {
        return Ok(node);
    }
    // A targeted compaction moves only the blocks around one window.
    let t0 = std::time::Instant::now();
    arena.core.collect_live();
    let req = planner::Request {
        size: reserved,
        align,
    };
    let plan = planner::plan_targeted(&arena.core.live, capacity, req);
    arena.core.counters.planning += t0.elapsed();
    if let Some(plan) = plan {
        arena.core.run(plan, t0)?;
        if let Some(node) = arena.core.index.alloc(reserved, align) {
            return Ok(node);
        }
    }
    let t0 = std::time::Instant::now();
    arena.core.collect_live();
    let plan = planner::plan_full(&arena.core.live, capacity);
    arena.core.counters.planning += t0.elapsed();
    arena.core.run(plan, t0)?;
    arena.core.index.alloc(reserved, align).ok_or_else(|| {
        // Unreachable: the evictions were planned so that a full
        // compaction makes this hole.
        let reason = "spilling planned a hole that compaction did not make";
        arena.core.poison(reason.to_string());
        Error::Poisoned {
            reason: reason.to_string(),
        }
    })
}

/// The least recently used unpinned blocks not in `keep` whose eviction
/// lets a full compaction make a hole of `reserved` bytes at `align`,
/// in LRU order, each with its host-tier space reserved. Changes nothing
/// but the reservations; on an error, not even those.
pub(super) fn plan_evictions<B: Backend>(
    arena: &mut Arena<B>,
    reserved: u64,
    align: u64,
    keep: &[BlockKey],
) -> Result<Vec<(BlockKey, Allocation)>> {
    let capacity = arena.core.capacity();
    arena.core.collect_live();
    let mut live = std::mem::take(&mut arena.core.live);
    let mut candidates: Vec<(u64, BlockKey, u64)> = arena
        .core
        .blocks
        .iter()
        .filter(|(k, b)| matches!(b.place, Place::Device(_)) && b.pins == 0 && !keep.contains(k))
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
                        .filter_map(|k| arena.core.blocks.get(*k))
                        .filter(|b| b.pins == 0 && matches!(b.place, Place::Device(_)))
                        .map(|b| b.reserved()),
                )
                .fold(reserved, u64::saturating_add);
            break Err(Error::OutOfMemory {
                requested_bytes: needed,
                free_bytes: arena.core.index.free_bytes(),
                largest_free_bytes: arena.core.index.largest_free(),
                reachable_bytes: reachable,
            });
        };
        tier_needed = tier_needed.saturating_add(victim_reserved);
        let Some(tier) = arena.tier.as_mut() else {
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
    arena.core.live = live;
    match outcome {
        Ok(()) => Ok(victims),
        Err(mut e) => {
            arena.core.counters.failed_allocs += 1;
            if let Some(tier) = arena.tier.as_mut() {
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
pub(super) fn release_tier<B: Backend>(arena: &mut Arena<B>, node: Allocation) {
    if let Some(t) = arena.tier.as_mut() {
        // Cannot fail: the allocation was made by this tier.
        let _ = t.free(node);
    }
}

/// Copies one block to the host tier, into `tier_node` (reserved for it),
/// and frees its space in the region. On an error the reservation is
/// released.
pub(super) fn spill_to<B: Backend>(
    arena: &mut Arena<B>,
    key: BlockKey,
    tier_node: Allocation,
) -> Result<()> {
    let Some(b) = arena.core.blocks.get(key) else {
        release_tier(arena, tier_node);
        return Ok(());
    };
    let (Some(dev), size) = (b.real_offset(), b.size) else {
        release_tier(arena, tier_node);
        return Ok(());
    };
    // The copy to the host reads the block on the arena stream, and its
    // space is reused after it: wait for the streams that used it.
    if let Err(e) = arena.core.wait_uses(key) {
        release_tier(arena, tier_node);
        return Err(e);
    }
    arena.core.epoch += 1;
    if let Err(e) = arena.core.backend.spill(dev, tier_node.offset(), size) {
        release_tier(arena, tier_node);
        arena.core.poison(format!("spilling a block failed: {e}"));
        return Err(e);
    }
    let old = match arena.core.blocks.get_mut(key) {
        Some(b) => std::mem::replace(&mut b.place, Place::Host(tier_node)),
        None => Place::Host(tier_node),
    };
    let lag = arena.core.blocks.get_mut(key).and_then(|b| b.lag.take());
    arena.policy.spilled(lag);
    if let Place::Device(node) = old {
        if let Err(e) = arena.core.index.free(node) {
            // Unreachable: the arena holds only its index's allocations.
            return Err(arena
                .core
                .broken("freeing a spilled block's space failed", e));
        }
    }
    arena.core.set_entry(key, None);
    arena.core.counters.evictions += 1;
    arena.core.counters.bytes_evicted = arena.core.counters.bytes_evicted.saturating_add(size);
    Ok(())
}
