//! The compaction policies, one file each, chosen in one place
//! ([`Policy::new`]): what the arena does when a request fits in no hole,
//! and what it owes naive compact-on-failure for it. Each owns its state;
//! the arena's core (`super::core`) carries out their plans.
//!
//! - `bounded.rs`: [`CompactionPolicy::Bounded`], the default.
//! - `strict.rs`: [`CompactionPolicy::Auto`] (and the default's mirror mode).
//! - [`CompactionPolicy::Manual`]: no state; a hole or an error.
//! - `targeted.rs`: the targeted mechanism they share; `shadow.rs`:
//!   naive's layout beside the arena's, for the default's free mode.
//!
//! The guarantees and their proofs are in the [`policies`](crate::policies)
//! docs.

mod bounded;
mod shadow;
mod strict;
mod targeted;
mod trim;

use std::num::NonZeroU64;

use super::core::Core;
use super::CompactionReport;
use crate::backend::Backend;
use crate::config::{ArenaConfig, CompactionPolicy};
use crate::error::Result;
use crate::handle::BlockKey;
use crate::placement::Allocation;
use crate::plan::planner;
use crate::plan::planner::Request;

pub(crate) use bounded::Bounded;
pub(crate) use strict::Strict;
pub(crate) use targeted::out_of_memory;

/// The state of the arena's compaction policy.
#[derive(Debug)]
pub(crate) enum Policy {
    Manual,
    Strict(Box<Strict>),
    Bounded(Box<Bounded>),
}

/// What the compaction policy has done and what it owes (its
/// bookkeeping, apart from the arena's [`Stats`](crate::Stats)); see the
/// [`policies`](crate::policies) docs for the bounds these figures enter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyStats {
    /// Bytes naive compact-on-failure moved on the same requests (`N`):
    /// under [`CompactionPolicy::Bounded`] and [`CompactionPolicy::Auto`];
    /// 0 under [`CompactionPolicy::Manual`].
    pub naive_bytes_moved: u64,
    /// Requests naive would have failed (pins or alignment padding leave
    /// no hole after its full compaction, or the request exceeds the free
    /// bytes). From the first, the comparison with naive ends.
    pub naive_failures: u64,
    /// Whether the comparison with naive has ended (a request naive
    /// fails, spilling, or a pin that no free byte could stage).
    pub bound_ended: bool,
    /// Bytes of blocks whose moves are deferred (`D`): naive moved them,
    /// the arena has not yet.
    pub deferred_bytes: u64,
    /// Bytes of blocks the arena has away from naive's place, in the
    /// default policy's free mode (`M`).
    pub away_bytes: u64,
    /// The default policy's bound on `bytes_moved` plus what it owes
    /// (`N + 2P`, `P` the peak live bytes so far); 0 under other policies.
    pub bound_bytes: u64,
    /// Handovers to naive's layout (the default policy).
    pub handovers: u64,
    /// Bytes those handovers moved.
    pub handover_bytes: u64,
    /// Times the default policy left naive's layout for its own.
    pub free_entries: u64,
    /// Block visits of compaction planning by the targeted mechanism:
    /// live blocks per pass of a planner, summed (deterministic, unlike
    /// planning time).
    pub planning_visits: u64,
    /// Full compactions the targeted mechanism chose because planning
    /// would have overdrawn its budget of work per op.
    pub budget_compactions: u64,
}

impl Policy {
    /// The policy `config` names. With spilling on, the default stays in
    /// naive's layout (mirror mode): evictions change residency where
    /// naive has none.
    pub(super) fn new(config: &ArenaConfig) -> Self {
        match config.compaction {
            CompactionPolicy::Manual => Policy::Manual,
            CompactionPolicy::Auto => Policy::Strict(Box::default()),
            CompactionPolicy::Bounded => {
                Policy::Bounded(Box::new(Bounded::new(config.spill_host_bytes > 0)))
            }
        }
    }

    /// Space for `reserved` bytes at `align`, free of bytes: a hole, or
    /// what the policy does when there is none. `OutOfMemory` (nothing
    /// changed) when it cannot.
    pub(super) fn place<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        req: Request,
    ) -> Result<Allocation> {
        match self {
            Policy::Manual => match core.index.alloc(req.size, req.align) {
                Some(node) => Ok(node),
                None => Err(out_of_memory(core, req.size, req.align, false)),
            },
            Policy::Strict(s) => s.place(core, req),
            Policy::Bounded(b) => b.place(core, req),
        }
    }

    /// The block just made as `key` (of `size` bytes at `align`) took the
    /// node [`place`](Self::place) gave, at `offset`.
    pub(super) fn commit(&mut self, key: BlockKey, size: u64, align: u32, offset: u64) {
        if let Policy::Bounded(b) = self {
            b.commit(key, size, align, offset);
        }
    }

    /// The request given a node by [`place`](Self::place) failed.
    pub(super) fn abandon(&mut self) {
        if let Policy::Bounded(b) = self {
            b.abandon();
        }
    }

    /// Block `key` (of `size` bytes, deferred at `lag`) is being freed.
    pub(super) fn free<B: Backend>(
        &mut self,
        core: &Core<B>,
        key: BlockKey,
        size: u64,
        lag: Option<NonZeroU64>,
    ) -> Result<()> {
        match self {
            Policy::Manual => Ok(()),
            Policy::Strict(s) => {
                s.forget(lag);
                Ok(())
            }
            Policy::Bounded(b) => {
                b.mirror.forget(lag);
                b.free(core, key, size)
            }
        }
    }

    /// Block `key` is about to be pinned: its bytes must be where they
    /// will stay (at home, and for the default policy at naive's place).
    pub(super) fn before_pin<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        key: BlockKey,
    ) -> Result<()> {
        match self {
            Policy::Manual => Ok(()),
            Policy::Strict(s) => s.bring_home(core, key),
            Policy::Bounded(b) => b.before_pin(core, key),
        }
    }

    /// Block `key`'s pin state changed.
    pub(super) fn pinned(&mut self, key: BlockKey, pinned: bool) {
        if let Policy::Bounded(b) = self {
            b.pinned(key, pinned);
        }
    }

    /// Sends every deferred block home: the bytes are where the index
    /// says (before planning on the real layout, or spilling).
    pub(super) fn settle<B: Backend>(&mut self, core: &mut Core<B>) -> Result<()> {
        match self {
            Policy::Manual => Ok(()),
            Policy::Strict(s) => s.settle(core),
            Policy::Bounded(b) => b.mirror.settle(core),
        }
    }

    /// Block `key` went to the host tier (its deferred move, if any, is
    /// gone with it): the comparison with naive ends.
    pub(super) fn spilled(&mut self, lag: Option<NonZeroU64>) {
        match self {
            Policy::Manual => {}
            Policy::Strict(s) => s.forget(lag),
            Policy::Bounded(b) => {
                b.mirror.forget(lag);
                b.end();
            }
        }
    }

    /// An explicit full compaction ([`Arena::compact`](crate::Arena::compact)).
    pub(super) fn compact<B: Backend>(&mut self, core: &mut Core<B>) -> Result<CompactionReport> {
        match self {
            Policy::Manual => {
                let t0 = std::time::Instant::now();
                core.collect_live();
                let plan = planner::plan_full(&core.live, core.capacity());
                core.counters.planning += t0.elapsed();
                core.run(plan, t0)
            }
            Policy::Strict(s) => s.compact(core),
            Policy::Bounded(b) => b.compact(core),
        }
    }

    /// The region (mapped prefix of an elastic arena) is now `capacity`
    /// bytes, grown or shrunk at its top: naive's layout in the default
    /// policy's free mode follows the arena's index. The caller checked
    /// (with [`shrink_floor`](Self::shrink_floor)) that a shrink cuts only
    /// free bytes. Naive compared at the same capacity is still naive.
    pub(super) fn resize(&mut self, capacity: u64) -> Result<()> {
        if let Policy::Bounded(b) = self {
            if let Some(index) = b.shadow_index() {
                let r = if capacity >= index.capacity() {
                    index.grow_to(capacity)
                } else {
                    index.shrink_to(capacity)
                };
                r.map_err(|e| crate::error::Error::InvalidInput {
                    input: "naive's layout",
                    reason: e.to_string(),
                })?;
            }
        }
        Ok(())
    }

    /// Whether the default policy keeps naive's layout apart (free mode):
    /// a plan run outside the policy must go through it then.
    pub(super) fn in_free_mode(&mut self) -> bool {
        match self {
            Policy::Bounded(b) => b.shadow_index().is_some(),
            _ => false,
        }
    }

    /// A plan of `bytes` ran outside the policy, in mirror mode (a trim's
    /// evacuation): counted as an explicit compaction is, as bytes naive
    /// moves too (the index is naive's layout, moved with it).
    pub(super) fn note_external(&mut self, bytes: u64) {
        match self {
            Policy::Manual => {}
            Policy::Strict(s) => s.naive_bytes = s.naive_bytes.saturating_add(bytes),
            Policy::Bounded(b) => {
                b.mirror.naive_bytes = b.mirror.naive_bytes.saturating_add(bytes);
            }
        }
    }

    /// The default policy's state, where it is the policy (an elastic
    /// trim in free mode works on it: `trim.rs`).
    pub(super) fn bounded(&mut self) -> Option<&mut Bounded> {
        match self {
            Policy::Bounded(b) => Some(b),
            _ => None,
        }
    }

    /// The lowest capacity the policy's own records allow (naive's
    /// highest block in free mode); deferred moves must be settled first.
    pub(super) fn shrink_floor(&mut self) -> u64 {
        match self {
            Policy::Bounded(b) => b.shadow_index().map_or(0, |i| i.used_end()),
            _ => 0,
        }
    }

    /// Whether a request that fits in no hole may compact
    /// ([`CompactionPolicy::Manual`] never does).
    pub(super) fn compacts(&self) -> bool {
        !matches!(self, Policy::Manual)
    }

    /// Where a block's bytes lag behind its index entry, for a listing in
    /// address order: whether any does.
    pub(super) fn defers(&self) -> bool {
        match self {
            Policy::Manual => false,
            Policy::Strict(s) => !s.lag.is_empty(),
            Policy::Bounded(b) => !b.mirror.lag.is_empty(),
        }
    }

    /// The policy's bookkeeping.
    pub(super) fn stats<B: Backend>(&self, core: &Core<B>) -> PolicyStats {
        match self {
            Policy::Manual => PolicyStats::default(),
            Policy::Strict(s) => PolicyStats {
                naive_bytes_moved: s.naive_bytes,
                naive_failures: s.naive_failures,
                bound_ended: s.naive_failures > 0,
                deferred_bytes: s.lag.deferred_bytes(),
                planning_visits: s.pacer.visits(),
                budget_compactions: s.pacer.escalations(),
                ..PolicyStats::default()
            },
            Policy::Bounded(b) => PolicyStats {
                naive_bytes_moved: b.mirror.naive_bytes,
                naive_failures: b.mirror.naive_failures,
                bound_ended: b.ended,
                deferred_bytes: b.mirror.lag.deferred_bytes(),
                away_bytes: b.away_bytes(),
                bound_bytes: if b.ended { 0 } else { b.bound(core) },
                handovers: b.handovers,
                handover_bytes: b.handover_bytes,
                free_entries: b.free_entries,
                planning_visits: b.mirror.pacer.visits(),
                budget_compactions: b.mirror.pacer.escalations(),
            },
        }
    }
}
