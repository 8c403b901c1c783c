//! Deferred moves: naive's compaction applied to the index, and blocks sent
//! home when something needs their bytes out of the way. The argument that
//! this never moves more bytes than naive is in `src/plan/lag.rs`.

use std::num::NonZeroU64;
use std::time::Instant;

use super::{Arena, Place};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::handle::BlockKey;
use crate::plan::lag::{self, Lagging};
use crate::plan::{Plan, PlanKind};

/// Applies naive's full compaction `plan` (made from `arena.live`, one
/// downward wave: [`lag::is_downward`]) to the index without moving a
/// byte: every block it moves lags from then on, unless its bytes are
/// already at its new place.
pub(super) fn defer_full<B: Backend>(arena: &mut Arena<B>, plan: &Plan) -> Result<()> {
    debug_assert!(lag::is_downward(plan));
    // The layout of homes the plan leaves is checked like any plan's
    // (this also moves `arena.live` to it, for the rebuild).
    super::compaction::check_final_layout(arena, plan)?;
    for m in plan.moves() {
        let key = BlockKey::from_bits(m.key);
        let Some(b) = arena.blocks.get_mut(key) else {
            continue; // unreachable: the check matched every move
        };
        let len = b.reserved();
        let at = b.lag.map_or(m.src, NonZeroU64::get);
        if b.lag.is_some() {
            arena.lag.remove(at);
        }
        // Dominance: `at >= src > dst` (the plan only moves blocks down).
        b.lag = NonZeroU64::new(at).filter(|_| at != m.dst);
        if b.lag.is_some() {
            arena.lag.insert(Lagging {
                key: m.key,
                at,
                home: m.dst,
                len,
                copy_len: m.len,
            });
        }
    }
    super::compaction::rebuild_index(arena)?;
    arena.counters.naive_bytes_moved = arena
        .counters
        .naive_bytes_moved
        .saturating_add(plan.bytes_moved());
    Ok(())
}

/// Sends home the lagging blocks whose bytes lie in `[lo, hi)` (a range
/// free in the index, about to be placed), with those in their way.
/// `at_compaction`: this is the request naive just compacted for, so a
/// plan that leaves nothing lagging is naive's full compaction, done.
pub(super) fn clear_range<B: Backend>(
    arena: &mut Arena<B>,
    lo: u64,
    hi: u64,
    at_compaction: bool,
) -> Result<()> {
    if arena.lag.is_empty() {
        return Ok(());
    }
    let blocks = arena.lag.closure(lo, hi, &[]);
    if !at_compaction && !blocks.is_empty() {
        // Something after naive's compaction needs deferred bytes out
        // of the way: finish that compaction in one plan rather than
        // piece by piece (the same bytes either way: every block sent
        // home costs what it saves in deferred bytes; one plan is one
        // launch where pieces would be one per allocation).
        return settle(arena);
    }
    send_home(arena, blocks, at_compaction)
}

/// Sends block `key` home if it lags (with every other lagging block,
/// as [`Arena::clear_range`] does after a compaction).
pub(super) fn bring_home<B: Backend>(arena: &mut Arena<B>, key: BlockKey) -> Result<()> {
    if arena.blocks.get(key).is_some_and(|b| b.lag.is_some()) {
        settle(arena)?;
    }
    Ok(())
}

/// Sends every lagging block home: afterwards the bytes are where the
/// index says, as the planners and spilling assume. The rest of
/// naive's compaction: a full plan.
pub(super) fn settle<B: Backend>(arena: &mut Arena<B>) -> Result<()> {
    if arena.lag.is_empty() {
        return Ok(());
    }
    let blocks = arena.lag.everything();
    send_home(arena, blocks, true)
}

/// Moves `blocks` (a closure of [`crate::plan::lag::Lag`], sorted by
/// real offset) home in one wave, and the table with them. The plan is
/// full if it completes naive's compaction (`completes`, and nothing
/// lags afterwards), targeted otherwise.
pub(super) fn send_home<B: Backend>(
    arena: &mut Arena<B>,
    blocks: Vec<Lagging>,
    completes: bool,
) -> Result<()> {
    if blocks.is_empty() {
        return Ok(());
    }
    let t0 = Instant::now();
    let done = blocks.len() == arena.lag.len();
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
    for l in &blocks {
        let key = BlockKey::from_bits(l.key);
        let b = arena.blocks.get(key);
        let matches = b.is_some_and(|b| {
            b.lag.map(NonZeroU64::get) == Some(l.at)
                && matches!(&b.place, Place::Device(a) if a.offset() == l.home)
                && b.size == l.copy_len
        });
        let in_way = arena
            .lag
            .overlapping(l.home, l.home.saturating_add(l.len))
            .any(|o| blocks.binary_search_by_key(&o.at, |x| x.at).is_err());
        if !matches || in_way {
            return Err(Error::InvalidInput {
                input: "plan",
                reason: format!("a deferred move does not match its block: {l:?}"),
            });
        }
        used_on_streams |= b.is_some_and(|b| !b.uses().is_empty());
    }
    arena.counters.planning += t0.elapsed();
    if used_on_streams {
        for l in &blocks {
            arena.wait_uses(BlockKey::from_bits(l.key))?;
        }
    }
    arena.epoch += 1;
    if let Err(e) = arena.backend.execute(&plan) {
        arena.poison(format!("sending deferred moves home failed part-way: {e}"));
        return Err(e);
    }
    for l in &blocks {
        arena.lag.remove(l.at);
        let key = BlockKey::from_bits(l.key);
        if let Some(b) = arena.blocks.get_mut(key) {
            b.lag = None;
        }
        arena.set_entry(key, Some((l.home, l.copy_len)));
    }
    if let Err(e) = arena.flush_table() {
        arena.poison(format!(
            "handle table update failed after deferred moves: {e}"
        ));
        return Err(e);
    }
    let c = &mut arena.counters;
    match kind {
        PlanKind::Targeted => c.targeted += 1,
        PlanKind::Full => c.full += 1,
    }
    c.moves = c.moves.saturating_add(plan.move_count() as u64);
    c.bytes_moved = c.bytes_moved.saturating_add(plan.bytes_moved());
    c.compaction += t0.elapsed();
    Ok(())
}
