//! [`CompactionPolicy::Auto`](crate::CompactionPolicy::Auto): naive's
//! layout, with the moves deferred until something needs their bytes out
//! of the way. Never more bytes moved than naive compact-on-failure, with
//! no additive constant; the argument is in `src/plan/lag.rs`.
//!
//! The default policy's *mirror* mode is this policy too (`bounded.rs`).

use std::num::NonZeroU64;
use std::time::Instant;

use super::targeted;
use crate::arena::core::Core;
use crate::arena::{CompactionReport, Place};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::handle::BlockKey;
use crate::placement::Allocation;
use crate::plan::lag::{self, Lag, Lagging};
use crate::plan::pacer::Pacer;
use crate::plan::planner;
use crate::plan::planner::Request;
use crate::plan::{Plan, PlanKind};

/// The state of [`CompactionPolicy::Auto`](crate::CompactionPolicy::Auto).
#[derive(Debug, Default)]
pub(crate) struct Strict {
    /// Blocks whose bytes lie above their index entry.
    pub(super) lag: Lag,
    /// Bytes naive compact-on-failure moved on the same requests (`N`).
    pub(super) naive_bytes: u64,
    /// Requests naive would have failed (the comparison ends at the first).
    pub(super) naive_failures: u64,
    /// For the requests naive cannot serve (pins, alignment padding).
    pub(super) pacer: Pacer,
}

impl Strict {
    /// Space for `reserved` bytes at `align`: a hole, else naive's
    /// compaction applied to the index (its moves deferred where they
    /// can be), else the targeted mechanism. The space is free of bytes
    /// too: deferred blocks there have gone home.
    pub(super) fn place<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        req: Request,
    ) -> Result<Allocation> {
        let (node, at_compaction) = match core.index.alloc(req.size, req.align) {
            Some(node) => (node, false),
            None => self.slow(core, req.size, req.align)?,
        };
        self.cleared(core, node, at_compaction)
    }

    /// `node`, with the deferred bytes in its way sent home; given back to
    /// the index if that fails (nothing moved, or the arena is poisoned).
    pub(super) fn cleared<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        node: Allocation,
        at_compaction: bool,
    ) -> Result<Allocation> {
        let (lo, hi) = (node.offset(), node.offset() + node.size());
        if let Err(e) = self.clear_range(core, lo, hi, at_compaction) {
            let _ = core.index.free(node);
            return Err(e);
        }
        Ok(node)
    }

    /// No hole: naive's compaction, or (naive fails) the targeted
    /// mechanism. Returns the node and whether naive compacted for it.
    fn slow<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        reserved: u64,
        align: u64,
    ) -> Result<(Allocation, bool)> {
        core.check_usable()?;
        if reserved <= core.index.free_bytes() {
            let t0 = Instant::now();
            core.collect_live();
            if planner::largest_hole_after_full(&core.live, core.capacity(), align) >= reserved {
                let plan = planner::plan_full(&core.live, core.capacity());
                return self
                    .naive_compaction(core, plan, reserved, align, t0)
                    .map(|n| (n, true));
            }
        }
        // Naive's full compaction would leave no hole (pins, or alignment
        // padding), or the request exceeds the free bytes: naive fails.
        self.naive_failures += 1;
        self.fallback(core, reserved, align).map(|n| (n, false))
    }

    /// The targeted mechanism, on the real layout (every lagging block
    /// goes home before a plan runs).
    pub(super) fn fallback<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        reserved: u64,
        align: u64,
    ) -> Result<Allocation> {
        let mut settled = Ok(());
        let lag = &mut self.lag;
        let node = targeted::make_room(core, &mut self.pacer, reserved, align, |core, _| {
            // Sending the lagging blocks home changes no placement: the
            // plan, made from the index, still applies.
            settled = settle(lag, core);
            settled.is_ok()
        });
        settled?;
        node
    }

    /// Naive's compaction `plan` (made from `core.live`) for a request it
    /// makes room for: applied to the index with the moves deferred when
    /// the plan allows it, run at once otherwise (see `src/plan/lag.rs`).
    pub(super) fn naive_compaction<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        plan: Plan,
        reserved: u64,
        align: u64,
        t0: Instant,
    ) -> Result<Allocation> {
        core.counters.planning += t0.elapsed();
        self.pacer.full_ran(0, 2 * core.live.len() as u64);
        self.naive_bytes = self.naive_bytes.saturating_add(plan.bytes_moved());
        if lag::is_downward(&plan) {
            self.defer_full(core, &plan)?;
        } else {
            // Sending the lagging blocks home changes no placement: the
            // plan, made from the index, still applies.
            self.settle(core)?;
            core.run(plan, t0)?;
        }
        core.index.alloc(reserved, align).ok_or_else(|| {
            // Unreachable: the full compaction was checked to make the hole.
            core.broken("naive's compaction", "it did not make the hole it reaches")
        })
    }

    /// Applies naive's full compaction `plan` (made from `core.live`, one
    /// downward wave: [`lag::is_downward`]) to the index without moving a
    /// byte: every block it moves lags from then on, unless its bytes are
    /// already at its new place.
    fn defer_full<B: Backend>(&mut self, core: &mut Core<B>, plan: &Plan) -> Result<()> {
        debug_assert!(lag::is_downward(plan));
        // The layout of homes the plan leaves is checked like any plan's
        // (this also moves `core.live` to it, for the rebuild).
        core.check_final_layout(plan)?;
        for m in plan.moves() {
            let key = BlockKey::from_bits(m.key);
            let Some(b) = core.blocks.get_mut(key) else {
                continue; // unreachable: the check matched every move
            };
            let len = b.reserved();
            let at = b.lag.map_or(m.src, NonZeroU64::get);
            if b.lag.is_some() {
                self.lag.remove(at);
            }
            // Dominance: `at >= src > dst` (the plan only moves blocks down).
            b.lag = NonZeroU64::new(at).filter(|_| at != m.dst);
            if b.lag.is_some() {
                self.lag.insert(Lagging {
                    key: m.key,
                    at,
                    home: m.dst,
                    len,
                    copy_len: m.len,
                });
            }
        }
        core.rebuild_index()?;
        Ok(())
    }

    /// Sends home the lagging blocks whose bytes lie in `[lo, hi)` (a
    /// range free in the index, about to be placed), with those in their
    /// way. `at_compaction`: this is the request naive just compacted
    /// for, so a plan that leaves nothing lagging is naive's compaction,
    /// done.
    pub(super) fn clear_range<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        lo: u64,
        hi: u64,
        at_compaction: bool,
    ) -> Result<()> {
        if self.lag.is_empty() {
            return Ok(());
        }
        let blocks = self.lag.closure(lo, hi, &[]);
        if !at_compaction && !blocks.is_empty() {
            // Something after naive's compaction needs deferred bytes out
            // of the way: finish that compaction in one plan rather than
            // piece by piece (the same bytes either way: every block sent
            // home costs what it saves in deferred bytes; one plan is one
            // launch where pieces would be one per allocation).
            return self.settle(core);
        }
        send_home(&mut self.lag, core, blocks, at_compaction)
    }

    /// Sends block `key` home if it lags (with every other lagging block,
    /// as [`clear_range`](Self::clear_range) does after a compaction).
    pub(super) fn bring_home<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        key: BlockKey,
    ) -> Result<()> {
        if core.blocks.get(key).is_some_and(|b| b.lag.is_some()) {
            self.settle(core)?;
        }
        Ok(())
    }

    /// Sends every lagging block home: afterwards the bytes are where the
    /// index says, as the planners and spilling assume. The rest of
    /// naive's compaction: a full plan.
    pub(super) fn settle<B: Backend>(&mut self, core: &mut Core<B>) -> Result<()> {
        settle(&mut self.lag, core)
    }

    /// Forgets block `key`'s deferred move (it is freed or spilled).
    pub(super) fn forget(&mut self, lag_at: Option<NonZeroU64>) {
        if let Some(at) = lag_at {
            self.lag.remove(at.get());
        }
    }

    /// An explicit full compaction: every lagging block home first (a
    /// separate plan), then naive's own full compaction, which naive,
    /// asked for the same compaction, would run too (counted in `N`).
    pub(super) fn compact<B: Backend>(&mut self, core: &mut Core<B>) -> Result<CompactionReport> {
        self.settle(core)?;
        let t0 = Instant::now();
        core.collect_live();
        let plan = planner::plan_full(&core.live, core.capacity());
        self.naive_bytes = self.naive_bytes.saturating_add(plan.bytes_moved());
        core.counters.planning += t0.elapsed();
        self.pacer
            .full_ran(plan.move_count(), core.live.len() as u64);
        core.run(plan, t0)
    }
}

/// [`Strict::settle`] on the lag alone (for callers that borrow the rest).
fn settle<B: Backend>(lag: &mut Lag, core: &mut Core<B>) -> Result<()> {
    if lag.is_empty() {
        return Ok(());
    }
    let blocks = lag.everything();
    send_home(lag, core, blocks, true)
}

/// Moves `blocks` (a closure of [`Lag`], sorted by real offset) home in
/// one wave, and the table with them. The plan is full if it completes
/// naive's compaction (`completes`, and nothing lags afterwards),
/// targeted otherwise.
fn send_home<B: Backend>(
    lag: &mut Lag,
    core: &mut Core<B>,
    blocks: Vec<Lagging>,
    completes: bool,
) -> Result<()> {
    if blocks.is_empty() {
        return Ok(());
    }
    let t0 = Instant::now();
    let done = blocks.len() == lag.len();
    let kind = if done && completes {
        PlanKind::Full
    } else {
        PlanKind::Targeted
    };
    let plan = lag::plan_home(&blocks, kind);
    // The closure's guarantee, checked where it is cheap: each block is
    // the one the table knows there, and no lagging block outside the
    // plan lies over a destination. (Blocks at home cannot: homes are
    // disjoint index entries.)
    let mut used_on_streams = false;
    let mut finals = Vec::with_capacity(blocks.len());
    for l in &blocks {
        let key = BlockKey::from_bits(l.key);
        let b = core.blocks.get(key);
        let matches = b.is_some_and(|b| {
            b.lag.map(NonZeroU64::get) == Some(l.at)
                && matches!(&b.place, Place::Device(a) if a.offset() == l.home)
                && b.size == l.copy_len
        });
        let in_way = lag
            .overlapping(l.home, l.home.saturating_add(l.len))
            .any(|o| blocks.binary_search_by_key(&o.at, |x| x.at).is_err());
        if !matches || in_way {
            return Err(Error::InvalidInput {
                input: "plan",
                reason: format!("a deferred move does not match its block: {l:?}"),
            });
        }
        used_on_streams |= b.is_some_and(|b| !b.uses().is_empty());
        finals.push((key, l.home, l.copy_len));
    }
    core.counters.planning += t0.elapsed();
    if used_on_streams {
        for l in &blocks {
            core.wait_uses(BlockKey::from_bits(l.key))?;
        }
    }
    core.run_moves(&plan, &finals, t0)?;
    for l in &blocks {
        lag.remove(l.at);
        if let Some(b) = core.blocks.get_mut(BlockKey::from_bits(l.key)) {
            b.lag = None;
        }
    }
    Ok(())
}
