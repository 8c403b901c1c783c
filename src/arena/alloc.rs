//! Allocation, freeing and pinning.

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use super::shadow::Handover;
use super::{Arena, Block, Place};
use crate::backend::Backend;
use crate::config::{CompactionPolicy, MAX_ALIGN};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::handle::{BlockKey, Handle};
use crate::placement::Allocation;
use crate::plan::lag;
use crate::plan::planner::{self, Request};

impl<B: Backend> Arena<B> {
    /// Allocates `bytes` at the arena's default alignment.
    pub fn alloc(&mut self, bytes: u64) -> Result<Handle> {
        self.alloc_impl(bytes, self.config.alignment_bytes, None)
    }

    /// Allocates `bytes` at `align_bytes` (a power of two; the arena's
    /// alignment is the floor).
    pub fn alloc_aligned(&mut self, bytes: u64, align_bytes: u64) -> Result<Handle> {
        self.alloc_impl(bytes, align_bytes, None)
    }

    /// Allocates `numel` elements of `T`, aligned for them; the block's
    /// dtype is `T`'s.
    pub fn alloc_elems<T: Element>(&mut self, numel: u64) -> Result<Handle> {
        let (bytes, align) = self.typed_layout(T::DTYPE, numel)?;
        self.alloc_impl(bytes, align, Some(T::DTYPE))
    }

    /// Bytes and alignment of `numel` elements of `dtype` in this arena.
    pub(super) fn typed_layout(&self, dtype: DType, numel: u64) -> Result<(u64, u64)> {
        let elem = dtype.size_bytes();
        let bytes = numel.checked_mul(elem).ok_or(Error::ElemCountOverflow {
            numel,
            elem_bytes: elem,
        })?;
        Ok((bytes, elem.max(self.config.alignment_bytes)))
    }

    pub(super) fn alloc_impl(
        &mut self,
        bytes: u64,
        align: u64,
        dtype: Option<DType>,
    ) -> Result<Handle> {
        self.check_usable()?;
        if bytes == 0 {
            return Err(Error::ZeroSize);
        }
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(Error::InvalidAlignment {
                align_bytes: align,
                max_align_bytes: MAX_ALIGN,
            });
        }
        let align = align.max(self.config.alignment_bytes);
        let granule = self.config.alignment_bytes;
        let reserved = bytes
            .checked_add(granule - 1)
            .map(|b| b & !(granule - 1))
            .ok_or(Error::SizeOverflow {
                requested_bytes: bytes,
                align_bytes: granule,
            })?;
        if reserved > self.config.capacity_bytes {
            return Err(Error::TooLarge {
                requested_bytes: reserved,
                capacity_bytes: self.config.capacity_bytes,
            });
        }
        self.drain_reclaim()?;
        // Naive places the request first: under `Budgeted` its bytes moved
        // bound what the arena may move for it.
        self.shadow_place(reserved, align)?;
        // Large blocks and blocks of sizes that reliably outlive half the
        // average block (and, with lifetime placement, those that reliably
        // die young) go to the top of their free region, the rest to the
        // bottom (`ArenaConfig`). By Little's law the number of live blocks
        // is the mean lifetime in allocation ticks. Only the targeted
        // policy does this; the others keep naive's plain placement (`Auto`
        // must: its bound rests on placing exactly as naive does).
        let live = self.blocks.len() as u64;
        let large = reserved >= self.large_block_bytes;
        let high = self.config.compaction == CompactionPolicy::Targeted
            && (large
                || self.lifetimes.as_ref().is_some_and(|l| {
                    (self.long_lived_high && l.long_lived(reserved, live / 2))
                        || (self.config.lifetime_placement && l.short_lived(reserved, live))
                }));
        let node = match self.place_on_device(reserved, align, &[], high) {
            Ok(node) => node,
            Err(e) => {
                self.shadow_abandon();
                return Err(e);
            }
        };
        let (slot, offset) = (node.slot(), node.offset());
        let inserted = self.blocks.insert(Block {
            place: Place::Device(node),
            size: bytes,
            dtype,
            streams: Default::default(),
            born: self.counters.allocs,
            last_use: AtomicU64::new(self.tick()),
            // `align <= MAX_ALIGN < 2^32`, checked above.
            align: u32::try_from(align).unwrap_or(u32::MAX),
            pins: 0,
            lag: None,
        });
        let key = match inserted {
            Ok(key) => key,
            Err(block) => {
                // Every one of the 2^32 handle slots is in use: give the
                // space back, unchanged.
                self.shadow_abandon();
                if let Place::Device(node) = block.place {
                    self.index.free(node)?;
                }
                return Err(Error::TableOverflow {
                    requested_slots: self.blocks.slot_count() as u64 + 1,
                    max_slots: 1 << 32,
                });
            }
        };
        self.set_owner(slot, key);
        self.shadow_commit(key, bytes, u32::try_from(align).unwrap_or(u32::MAX));
        self.set_entry(key, Some((offset, bytes)));
        let c = &mut self.counters;
        c.allocs += 1;
        // Exact: live sizes add up to at most the region plus the host
        // tier, which `ArenaConfig::validate` keeps within u64.
        c.requested_bytes = c.requested_bytes.saturating_add(bytes);
        let allocated = self.config.capacity_bytes - self.index.free_bytes();
        c.peak_allocated_bytes = c.peak_allocated_bytes.max(allocated);
        Ok(Handle {
            key,
            arena: self.id,
        })
    }

    /// Space for `reserved` bytes in the region: a hole (carved from its
    /// top if `high`), else a compaction, else (spilling on) evicting least
    /// recently used blocks not in `keep`. The space is free of bytes too:
    /// blocks whose moves were deferred there have gone home.
    pub(super) fn place_on_device(
        &mut self,
        reserved: u64,
        align: u64,
        keep: &[BlockKey],
        high: bool,
    ) -> Result<Allocation> {
        let hole = if high {
            self.index.alloc_high(reserved, align)
        } else {
            self.index.alloc(reserved, align)
        };
        let placed = match hole {
            Some(node) => Ok((node, false)),
            None => match self.alloc_by_compacting(reserved, align) {
                Err(Error::OutOfMemory { .. }) if self.tier.is_some() => self
                    .alloc_by_spilling(reserved, align, keep)
                    .map(|node| (node, false)),
                r => r,
            },
        };
        let (node, naive_compacted) = placed?;
        let (lo, hi) = (node.offset(), node.offset() + node.size());
        if let Err(e) = self.clear_range(lo, hi, naive_compacted) {
            // Nothing moved (or the arena is poisoned): give the space back.
            let _ = self.index.free(node);
            return Err(e);
        }
        Ok(node)
    }

    /// The slow path: compact (if allowed and useful), then place. Returns
    /// the node and whether it was placed after naive's own compaction
    /// (deferred: the caller sends home what is in its way).
    pub(super) fn alloc_by_compacting(
        &mut self,
        reserved: u64,
        align: u64,
    ) -> Result<(Allocation, bool)> {
        // Compaction trusts the layout, which a poisoned arena does not.
        self.check_usable()?;
        let capacity = self.config.capacity_bytes;
        let policy = self.config.compaction;
        if let Some(budget) = self.shadow_budget() {
            // The first phase of `Budgeted`: the targeted policy within what
            // naive has moved beyond the arena, else naive's layout.
            match self.alloc_by_targeted(reserved, align, Some(budget)) {
                Ok(node) => return Ok((node, false)),
                Err(Error::OutOfMemory { .. }) if self.shadow_has_pending() => {}
                Err(e) => return Err(e),
            }
            if let Handover::Done {
                pending: Some(node),
                ..
            } = self.shadow_handover()?
            {
                return Ok((node, false));
            }
            // No handover now (a pinned block away from naive's place, or
            // no free spot to stage a move): this request goes over budget.
            let before = self.counters.bytes_moved;
            let node = self.alloc_by_targeted(reserved, align, None)?;
            let over = self.counters.bytes_moved.saturating_sub(before);
            self.counters.overrun_bytes = self.counters.overrun_bytes.saturating_add(over);
            return Ok((node, false));
        }
        if matches!(policy, CompactionPolicy::Budgeted | CompactionPolicy::Auto) {
            if reserved > self.index.free_bytes() {
                self.counters.naive_failures += 1;
            } else {
                let t0 = Instant::now();
                self.collect_live();
                if planner::largest_hole_after_full(&self.live, capacity, align) >= reserved {
                    return self
                        .alloc_after_naive(reserved, align, t0)
                        .map(|n| (n, true));
                }
                // Naive's full compaction would leave no hole (pins, or
                // alignment padding): naive fails here, the arena goes on
                // as the targeted policy would.
                self.counters.naive_failures += 1;
            }
        }
        self.alloc_by_targeted(reserved, align, None)
            .map(|n| (n, false))
    }

    /// Naive's compaction for a request it makes room for (`self.live`
    /// collected): applied to the index with the moves deferred when the
    /// plan allows it, run at once otherwise (see `src/plan/lag.rs`).
    fn alloc_after_naive(&mut self, reserved: u64, align: u64, t0: Instant) -> Result<Allocation> {
        let capacity = self.config.capacity_bytes;
        let plan = planner::plan_full(&self.live, capacity);
        self.counters.planning += t0.elapsed();
        self.pacer.full_ran(0, 2 * self.live.len() as u64);
        if lag::is_downward(&plan) {
            self.defer_full(&plan)?;
        } else {
            self.counters.naive_bytes_moved = self
                .counters
                .naive_bytes_moved
                .saturating_add(plan.bytes_moved());
            // Sending the lagging blocks home changes no placement: the
            // plan, made from the index, still applies.
            self.settle()?;
            self.execute(plan, t0)?;
        }
        self.index.alloc(reserved, align).ok_or_else(|| {
            // Unreachable: the full compaction was checked to make the hole.
            let reason = "naive's full compaction did not make the hole it reaches";
            self.poison(reason.to_string());
            Error::Poisoned {
                reason: reason.to_string(),
            }
        })
    }

    /// The slow path of the targeted policy (and of `Auto` where naive
    /// fails): a targeted or full plan as the pacer chooses, falling back to
    /// a full one. Plans are made on the index; one that runs first sends
    /// every lagging block home, so that the bytes are where it planned
    /// them (which changes no placement, so the plan still applies).
    ///
    /// With a `budget`, no plan runs that would take the bytes moved for
    /// this request past it (the request fails instead, uncounted).
    fn alloc_by_targeted(
        &mut self,
        reserved: u64,
        align: u64,
        budget: Option<u64>,
    ) -> Result<Allocation> {
        let capacity = self.config.capacity_bytes;
        let policy = self.config.compaction;
        let mut left = budget;
        let mut affords = |bytes: u64| match left.as_mut() {
            None => true,
            Some(l) if bytes <= *l => {
                *l -= bytes;
                true
            }
            Some(_) => false,
        };
        if policy != CompactionPolicy::Manual && reserved <= self.index.free_bytes() {
            let req = Request {
                size: reserved,
                align,
            };
            let t0 = Instant::now();
            self.collect_live();
            let ops = self.counters.allocs.saturating_add(self.counters.frees);
            let plan = self.pacer.plan(&self.live, capacity, req, ops);
            self.counters.planning += t0.elapsed();
            if let Some((plan, _)) = plan.filter(|(p, _)| affords(p.bytes_moved())) {
                self.settle()?;
                self.execute(plan, t0)?;
                if let Some(node) = self.index.alloc(reserved, align) {
                    return Ok(node);
                }
            }
            // Targeted could not (pins, or holes too small for evacuees):
            // a full compaction, if it would make a hole big enough.
            let t0 = Instant::now();
            self.collect_live();
            if planner::largest_hole_after_full(&self.live, capacity, align) >= reserved {
                let plan = planner::plan_full(&self.live, capacity);
                self.counters.planning += t0.elapsed();
                if affords(plan.bytes_moved()) {
                    // Two passes: the reach above and the plan.
                    let visits = 2 * self.live.len() as u64;
                    self.pacer.full_ran(plan.move_count(), visits);
                    self.settle()?;
                    self.execute(plan, t0)?;
                    if let Some(node) = self.index.alloc(reserved, align) {
                        return Ok(node);
                    }
                }
            }
            // Pins leave the room in gaps the full compaction fills: empty
            // the gap that can hold the most for this request.
            let t0 = Instant::now();
            self.collect_live();
            let gap = planner::plan_gap(&self.live, capacity, req);
            if let Some(plan) = gap.filter(|p| affords(p.bytes_moved())) {
                self.counters.planning += t0.elapsed();
                self.pacer
                    .full_ran(plan.move_count(), 2 * self.live.len() as u64);
                self.settle()?;
                self.execute(plan, t0)?;
                if let Some(node) = self.index.alloc(reserved, align) {
                    return Ok(node);
                }
            }
        }
        if self.tier.is_none() && budget.is_none() {
            self.counters.failed_allocs += 1;
        }
        self.collect_live();
        // What the last two plans above reach: the most this request's
        // compactions can make (a manual arena's: what `compact` makes).
        let mut reachable = planner::largest_hole_after_full(&self.live, capacity, align);
        if policy != CompactionPolicy::Manual {
            reachable = reachable.max(planner::largest_hole_by_gaps(&self.live, capacity, align));
        }
        Err(Error::OutOfMemory {
            requested_bytes: reserved,
            free_bytes: self.index.free_bytes(),
            largest_free_bytes: self.index.largest_free(),
            reachable_bytes: reachable,
        })
    }

    /// Frees a block. Pinned blocks cannot be freed.
    pub fn free(&mut self, h: Handle) -> Result<()> {
        let b = self.block(h)?;
        if b.pins > 0 {
            return Err(Error::Pinned { pins: b.pins });
        }
        // Its bytes are reused in arena-stream order: after the streams that
        // used it are done with them.
        self.wait_uses(h.key)?;
        self.epoch += 1;
        let Some(b) = self.blocks.remove(h.key) else {
            return Err(Error::StaleHandle);
        };
        let size = b.size;
        if let Some(l) = self.lifetimes.as_mut() {
            l.observe(b.reserved(), self.counters.allocs.saturating_sub(b.born));
        }
        if let Some(at) = b.lag {
            self.lag.remove(at.get());
        }
        let freed = match b.place {
            Place::Device(a) => self.index.free(a),
            Place::Host(a) => match self.tier.as_mut() {
                Some(tier) => tier.free(a),
                None => Ok(()),
            },
        };
        if let Err(e) = freed {
            // Unreachable: the arena only holds allocations of its own indexes.
            self.poison(format!("freeing a block's placement failed: {e}"));
            return Err(e);
        }
        if let Err(e) = self.shadow_free(h.key) {
            // Unreachable: the shadow holds one node per live block.
            self.poison(format!("freeing a block in naive's shadow failed: {e}"));
            return Err(e);
        }
        self.set_entry(h.key, None);
        self.counters.frees += 1;
        self.counters.requested_bytes = self.counters.requested_bytes.saturating_sub(size);
        Ok(())
    }

    // ---- pinning ----------------------------------------------------------------

    /// Pins a block: it never moves until every pin is released. Pins nest.
    /// A spilled block is brought back first.
    pub fn pin(&mut self, h: Handle) -> Result<u32> {
        let pins = self.block(h)?.pins;
        if pins == u32::MAX {
            // Before any residency change.
            return Err(Error::PinOverflow { pins });
        }
        self.make_resident(&[h])?;
        // A pinned block cannot go home later: it goes now.
        self.bring_home(h.key)?;
        let b = self.block_mut(h)?;
        b.pins = b
            .pins
            .checked_add(1)
            .ok_or(Error::PinOverflow { pins: b.pins })?;
        let pins = b.pins;
        if pins == 1 {
            self.counters.pinned_blocks += 1;
            self.sync_pinned(h.key);
        }
        Ok(pins)
    }

    /// Releases one pin; returns the pins left.
    pub fn unpin(&mut self, h: Handle) -> Result<u32> {
        let b = self.block_mut(h)?;
        if b.pins == 0 {
            return Err(Error::NotPinned);
        }
        b.pins -= 1;
        let pins = b.pins;
        if pins == 0 {
            self.counters.pinned_blocks -= 1;
            self.sync_pinned(h.key);
        }
        Ok(pins)
    }
}
