//! The elastic region: grow or compact, and give memory back.
//!
//! An elastic arena's backend reserves a range of `capacity_bytes` (the
//! limit) and maps a prefix of it in chunks. The placement index covers
//! the mapped prefix only, so the policies place and compact below the
//! mapped end exactly as in a fixed arena of that size; this module moves
//! the end.
//!
//! **Grow or compact** ([`grow_target`], one place, one parameter: the
//! slack `s`, default 1%). When a request fits in no hole, with `need` the
//! live bytes plus the request and `allowed(x) = x + max(granule, s × x)`:
//!
//! 1. if the request fits above the highest block within
//!    `allowed(max(need, largest live of the trim window))`, the arena maps
//!    what it needs (and at least 1/256 of what is mapped): no moves;
//! 2. else, if it fits above the highest block within `allowed(max(need,
//!    largest live ever))`, the arena maps just what it needs: no moves, and
//!    the peak stays within the slack of the peak live bytes; the automatic
//!    trim takes it back when the window no longer needs it;
//! 3. else it compacts (the policy, as a fixed arena of the mapped size
//!    does), after mapping up to the second bound if even a full compaction
//!    could not hold the request in what is mapped.
//!
//! At the limit (or when the driver cannot map more) it compacts, spills or
//! fails exactly as a fixed arena. Growing on fragmentation below the peak
//! (2.) rather than compacting keeps the bytes moved near naive's at a fixed
//! capacity of the peak: without it, `llm-decode_s1` of the corpus moved
//! 40.9 GiB (naive: 0.47 GiB), with it 1.7 GiB.
//!
//! **Chunks** ([`chunk_ends`]): a chunk is at most `1/128` of the mapped
//! bytes below it (never below the granule). Mapping costs about the same
//! per chunk whatever its size (the driver calls, not the bytes), so chunks
//! should be large; but a chunk is unmapped whole, so the one holding the live end
//! after a trim is waste, and at `1/128` of its offset it stays below the
//! trim's promise of `max(granule, 1% of live)`. A growth from nothing to
//! 40 GiB takes 853 chunks.
//!
//! **Trim**: compacts only when the highest block is above the target (by
//! evacuating just the blocks above it into holes below, when that moves
//! less than a full compaction; under the default policy in free mode,
//! naive's layout is trimmed alike and the arena's plan runs as the
//! policy's potential affords, `policy/trim.rs`), then unmaps every chunk
//! above the highest block (the backend unmaps in stream order). The automatic trim, on
//! allocation and free, targets the largest live bytes of the last window
//! (`trim_window_us`), looks when they fall and at least once per eighth
//! of a window, acts only
//! when mapped exceeds the target by half a tolerance, compacts only on
//! allocation (frees never move blocks), and only within a budget of bytes
//! moved (`TRIM_BUDGET_BASE`): unbudgeted full-compaction trims moved
//! 59 GiB on `convnext-varres-amp_s0` (naive at its peak: 7.4 GiB), whose
//! live bytes swing across windows.

use std::collections::VecDeque;

use super::Arena;
use crate::backend::Backend;
use crate::config::ArenaConfig;
use crate::error::Result;
use crate::plan::planner;
use crate::plan::planner::evacuate::plan_evacuate;

/// The automatic trim's budget of bytes moved: this many peak live bytes
/// (the largest so far), plus one more per `TRIM_BUDGET_WINDOWS` windows of
/// time. Trimming compacts only within it, so that a trace whose live bytes
/// swing across windows again and again does not pay a compaction per
/// swing: tuned on the design half of the corpus (`benches/elastic.rs`)
/// against issue 34's check, moved <= naive's at peak live + 2 x peak live.
const TRIM_BUDGET_BASE: f64 = 1.5;
const TRIM_BUDGET_WINDOWS: f64 = 1024.0;

/// Chunks are at most this fraction (1/`CHUNK_FRACTION`) of what is mapped below them.
const CHUNK_FRACTION: u64 = 128;

/// The elastic state: the window's live bytes and what was done.
#[derive(Debug)]
pub(crate) struct Elastic {
    slack: f64,
    window_us: u64,
    /// (until, live bytes): the live bytes held from one allocation or free
    /// until the next (`u64::MAX` for the last), kept with decreasing live
    /// bytes (a level followed by a higher one never is the window's
    /// largest): the window's largest is the front, once the levels that
    /// ended before the window are gone.
    peaks: VecDeque<(u64, u64)>,
    /// When the automatic trim last looked, and when the arena first noted
    /// its live bytes.
    last_check_us: u64,
    /// The window's largest live bytes when the automatic trim last looked:
    /// it looks again at once when they fall.
    checked_peak: u64,
    start_us: Option<u64>,
    /// Bytes the trims' compactions moved.
    trim_moved: u64,
    pub(super) trims: u64,
    pub(super) peak_mapped_bytes: u64,
}

/// `x` rounded up to a multiple of `g` (a power of two).
fn round_up(x: u64, g: u64) -> u64 {
    x.saturating_add(g - 1) & !(g - 1)
}

/// What may be mapped for live bytes `base`: `base + max(g, s × base)`,
/// rounded down to the granule, never below `base` rounded up.
pub(crate) fn allowed(base: u64, slack: f64, g: u64) -> u64 {
    let tol = ((base as f64 * slack) as u64).max(g);
    (base.saturating_add(tol) & !(g - 1)).max(round_up(base, g))
}

/// The facts the grow-or-compact rule reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Room {
    /// Bytes live (reserved by blocks) before the request.
    pub live: u64,
    /// The request's bytes and alignment.
    pub reserved: u64,
    pub align: u64,
    /// Where the highest block ends.
    pub used_end: u64,
    /// The mapped end, the limit, the granule.
    pub mapped: u64,
    pub limit: u64,
    pub granule: u64,
    /// The largest live bytes of the trim window, and of all time.
    pub window_peak: u64,
    pub all_peak: u64,
}

/// The grow-or-compact rule (see the module docs), for a request that fits
/// in no hole: the mapped end to grow to first (`None`: do not grow), given
/// `hole_after_full(capacity)`, the largest hole a full compaction would
/// leave at that capacity.
pub(crate) fn grow_target(
    r: Room,
    slack: f64,
    mut hole_after_full: impl FnMut(u64) -> u64,
) -> Option<u64> {
    let g = r.granule;
    let need = r.live.saturating_add(r.reserved);
    // What the window has needed, and what the arena has ever needed: the
    // first bounds the mapping the automatic trim keeps, the second the
    // peak.
    let cap_window = allowed(need.max(r.window_peak), slack, g).min(r.limit);
    let cap_peak = allowed(need.max(r.all_peak), slack, g).min(r.limit);
    let top = round_up(round_up(r.used_end, r.align).saturating_add(r.reserved), g);
    let grow = |to: u64| (to > r.mapped).then_some(to);
    if top <= cap_window {
        // Fits above the blocks within what the window needs: no moves.
        // A little more than the request (1/256 of what is mapped), so
        // that a rise maps in few calls, not all the slack at once.
        let step = round_up(r.mapped.saturating_add((r.mapped / 256).max(g)), g);
        return grow(top.max(step).min(cap_window));
    }
    if top <= cap_peak {
        // Below the peak so far: still no moves, and only what the request
        // needs, which the automatic trim takes back if the window does not
        // need it.
        return grow(top);
    }
    if hole_after_full(r.mapped) >= r.reserved {
        // Compaction makes room within what is mapped.
        return None;
    }
    if cap_peak > r.mapped && hole_after_full(cap_peak) >= r.reserved {
        return grow(cap_peak);
    }
    // Pins or padding: map above the blocks, as far as the limit allows.
    grow(top.min(r.limit))
}

/// The chunk ends from `mapped` up to `to` (multiples of `g`, `to` one):
/// each at most `max(g, start / CHUNK_FRACTION)` long.
pub(crate) fn chunk_ends(mapped: u64, to: u64, g: u64) -> Vec<u64> {
    let mut ends = Vec::new();
    let mut at = mapped;
    while at < to {
        let len = ((at / CHUNK_FRACTION) & !(g - 1)).max(g);
        at = at.saturating_add(len).min(to);
        ends.push(at);
    }
    ends
}

impl Elastic {
    pub(super) fn new(config: &ArenaConfig) -> Option<Self> {
        config.elastic.then(|| Self {
            slack: config.elastic_slack,
            window_us: config.trim_window_us,
            peaks: VecDeque::new(),
            last_check_us: 0,
            checked_peak: 0,
            start_us: None,
            trim_moved: 0,
            trims: 0,
            peak_mapped_bytes: 0,
        })
    }

    /// Notes `live` bytes at `now`; returns the largest live bytes that
    /// held at some time of the window `[now - window, now]`.
    fn note(&mut self, now: u64, live: u64) -> u64 {
        self.start_us.get_or_insert(now);
        if let Some(back) = self.peaks.back_mut() {
            back.0 = now;
        }
        while self.peaks.back().is_some_and(|&(_, l)| l <= live) {
            self.peaks.pop_back();
        }
        self.peaks.push_back((u64::MAX, live));
        let from = now.saturating_sub(self.window_us);
        while self.peaks.front().is_some_and(|&(until, _)| until <= from) {
            self.peaks.pop_front();
        }
        self.peaks.front().map_or(live, |&(_, l)| l)
    }
}

impl<B: Backend> Arena<B> {
    /// The live bytes (reserved by blocks in the region).
    fn live_bytes(&self) -> u64 {
        self.core.capacity() - self.core.index.free_bytes()
    }

    /// Maps up to `end` in chunks (the index and the policy follow). On a
    /// map failure the chunks mapped by this call are unmapped again and
    /// the error comes back: the arena is as it was.
    fn grow_to(&mut self, end: u64) -> Result<()> {
        let g = self.core.backend.granularity_bytes();
        let mapped = self.core.capacity();
        for e in chunk_ends(mapped, end, g) {
            if let Err(err) = self.core.backend.map_to(e) {
                if self.core.capacity() > mapped {
                    self.set_capacity(mapped)?;
                    self.core.backend.unmap_to(mapped)?;
                }
                return Err(err);
            }
            self.set_capacity(e)?;
        }
        Ok(())
    }

    /// The index and the policy now cover `[0, end)`.
    fn set_capacity(&mut self, end: u64) -> Result<()> {
        let old = self.core.capacity();
        let r = if end >= old {
            self.core.index.grow_to(end)
        } else {
            self.core.index.shrink_to(end)
        };
        if let Err(e) = r {
            return Err(self.core.broken("resizing the placement index", e));
        }
        if let Err(e) = self.policy.resize(end) {
            return Err(self.core.broken("resizing naive's layout", e));
        }
        if let Some(e) = &mut self.elastic {
            e.peak_mapped_bytes = e.peak_mapped_bytes.max(end);
        }
        Ok(())
    }

    /// Elastic: before the policy places `reserved` bytes at `align`, grows
    /// the mapped end if the rule says so. A map the device refuses leaves
    /// the policy to compact (or fail) within what is mapped.
    pub(super) fn make_room(&mut self, reserved: u64, align: u64) -> Result<()> {
        let Some(e) = &mut self.elastic else {
            return Ok(());
        };
        let now = self.core.backend.now_us();
        let live = self.core.capacity() - self.core.index.free_bytes();
        let window_peak = e.note(now, live);
        let slack = e.slack;
        self.auto_trim(now, window_peak, true)?;
        if self.core.index.can_alloc(reserved, align) {
            return Ok(());
        }
        let core = &mut self.core;
        let room = Room {
            live: core.capacity() - core.index.free_bytes(),
            reserved,
            align,
            used_end: core.index.used_end(),
            mapped: core.capacity(),
            limit: core.backend.capacity_bytes(),
            granule: core.backend.granularity_bytes(),
            window_peak,
            all_peak: core.counters.peak_allocated_bytes,
        };
        let mut collected = false;
        let target = grow_target(room, slack, |capacity| {
            if capacity.saturating_sub(room.live) < reserved {
                return 0;
            }
            if !collected {
                core.collect_live();
                collected = true;
            }
            planner::largest_hole_after_full(&core.live, capacity, align)
        });
        match target.map(|t| self.grow_to(t)) {
            // The driver has no more: compact within what is mapped.
            Some(Err(e)) if e.is_out_of_memory() => Ok(()),
            Some(r) => r,
            None => Ok(()),
        }
    }

    /// Elastic: notes the live bytes after a free, and gives back what the
    /// window no longer needs without moving anything.
    pub(super) fn after_free(&mut self) -> Result<()> {
        let Some(e) = &mut self.elastic else {
            return Ok(());
        };
        let now = self.core.backend.now_us();
        let live = self.core.capacity() - self.core.index.free_bytes();
        let window_peak = e.note(now, live);
        self.auto_trim(now, window_peak, false)
    }

    /// The automatic trim (see the module docs): `may_move` on allocation.
    fn auto_trim(&mut self, now: u64, window_peak: u64, may_move: bool) -> Result<()> {
        let Some(e) = &mut self.elastic else {
            return Ok(());
        };
        // Looks at once when the window's largest live bytes fall (a
        // phase ended: what it held can go back now, not up to an eighth
        // of a window later), else once per eighth of a window.
        let fell = window_peak < e.checked_peak;
        if e.window_us == 0 || (!fell && now.saturating_sub(e.last_check_us) < e.window_us / 8) {
            return Ok(());
        }
        e.last_check_us = now;
        e.checked_peak = window_peak;
        let g = self.core.backend.granularity_bytes();
        let target = allowed(window_peak, e.slack, g);
        let mapped = self.core.capacity();
        // Give back only more than half a tolerance over the target, so
        // that a window's own rise and fall costs nothing.
        let hysteresis = g.max((window_peak as f64 * e.slack / 2.0) as u64);
        if mapped <= target.saturating_add(hysteresis) {
            return Ok(());
        }
        if !may_move && self.core.index.used_end() >= target {
            return Ok(());
        }
        let windows = now.saturating_sub(e.start_us.unwrap_or(now)) as f64 / e.window_us as f64;
        let peak = self.core.counters.peak_allocated_bytes as f64;
        let budget = (peak * (TRIM_BUDGET_BASE + windows / TRIM_BUDGET_WINDOWS)) as u64;
        let left = budget.saturating_sub(e.trim_moved);
        self.trim_to(target, target, may_move.then_some(left))
            .map(|_| ())
    }

    /// Gives back every mapped chunk above the live blocks: compacts first
    /// only if the highest block ends above `live + max(granule, slack ×
    /// live)`, then unmaps. Returns the bytes unmapped.
    ///
    /// Only an elastic arena ([`ArenaConfig::elastic`]) maps and unmaps; a
    /// fixed one returns 0 and does nothing. On the CUDA backend a chunk's
    /// memory is released once the work queued so far on every registered
    /// stream has completed (polled on later calls; never waited for here:
    /// [`synchronize`](Self::synchronize) after a trim waits).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    ///
    /// // The automatic trim off: only `trim` gives memory back here.
    /// let mut arena = Arena::host(ArenaConfig::elastic().with_trim_window_us(0))?;
    /// let keep = arena.alloc(1 << 20)?;
    /// let batch = (0..15).map(|_| arena.alloc(1 << 20)).collect::<Result<Vec<_>, _>>()?;
    /// let mapped = arena.stats().capacity_bytes;
    /// for h in batch {
    ///     arena.free(h)?;
    /// }
    /// let unmapped = arena.trim()?;
    /// assert!(unmapped > 0);
    /// assert_eq!(arena.stats().capacity_bytes, mapped - unmapped);
    /// assert!(arena.stats().capacity_bytes >= arena.info(keep)?.reserved_bytes);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn trim(&mut self) -> Result<u64> {
        self.check_usable()?;
        if self.elastic.is_none() {
            return Ok(0);
        }
        // Storages dropped since the last call are not live: their blocks
        // go first, so that the target counts only what is.
        self.drain_reclaim()?;
        let Some(e) = &self.elastic else {
            return Ok(0);
        };
        let g = self.core.backend.granularity_bytes();
        let target = allowed(self.live_bytes(), e.slack, g);
        self.trim_to(target, 0, Some(u64::MAX))
    }

    /// Unmaps the chunks above the blocks and `keep`, compacting first
    /// (with a budget of bytes to move: `None` moves nothing) when that
    /// leaves more than `target` mapped. Returns the bytes unmapped.
    fn trim_to(&mut self, target: u64, keep: u64, budget: Option<u64>) -> Result<u64> {
        let mapped = self.core.capacity();
        let may_move = budget.is_some();
        let moved_before = self.core.counters.bytes_moved;
        if may_move {
            self.drain_reclaim()?;
            // Deferred bytes may lie above every index entry.
            self.policy.settle(&mut self.core)?;
        } else if self.policy.defers() {
            return Ok(0);
        }
        let mut end = self.unmap_above(keep)?;
        if end > target && may_move {
            self.compact_below(target.max(keep), budget.unwrap_or(0))?;
            end = self.unmap_above(keep)?;
            // The chunk holding the new end may reach past the target: an
            // explicit trim keeps its promise with a full compaction.
            if end > target && keep == 0 {
                self.policy.compact(&mut self.core)?;
                end = self.unmap_above(keep)?;
            }
        }
        let moved = self.core.counters.bytes_moved - moved_before;
        if let Some(e) = &mut self.elastic {
            e.trim_moved = e.trim_moved.saturating_add(moved);
            if end < mapped {
                e.trims += 1;
            }
        }
        Ok(mapped - end)
    }

    /// Moves the blocks above `cut` below it: the evacuation of just those
    /// blocks into holes when it moves no more than a full compaction (and
    /// the policy keeps no separate layout), else the policy's full
    /// compaction.
    fn compact_below(&mut self, cut: u64, budget: u64) -> Result<()> {
        let unlimited = budget == u64::MAX;
        if !self.policy.in_free_mode() {
            let t0 = std::time::Instant::now();
            self.core.collect_live();
            let full = planner::plan_full(&self.core.live, self.core.capacity());
            if let Some(plan) = plan_evacuate(&self.core.live, cut) {
                if plan.bytes_moved() <= full.bytes_moved() && plan.bytes_moved() <= budget {
                    if plan.is_empty() {
                        return Ok(());
                    }
                    self.policy.note_external(plan.bytes_moved());
                    self.core.run(plan, t0)?;
                    return Ok(());
                }
            }
            if full.bytes_moved() > budget {
                return Ok(());
            }
        } else if self
            .policy
            .bounded()
            .map_or(Ok(false), |b| b.trim_free(&mut self.core, cut, budget))?
            || !unlimited
        {
            // Free mode: naive's layout and the arena's evacuated below
            // the cut, as the potential affords (`policy/trim.rs`); only
            // an explicit trim goes on to the handover and a full
            // compaction.
            return Ok(());
        }
        self.policy.compact(&mut self.core).map(|_| ())
    }

    /// Unmaps every chunk above the highest block (and naive's, and
    /// `keep`); returns the new mapped end.
    fn unmap_above(&mut self, keep: u64) -> Result<u64> {
        let mapped = self.core.capacity();
        let floor = self
            .core
            .index
            .used_end()
            .max(self.policy.shrink_floor())
            .max(keep);
        if floor >= mapped {
            return Ok(mapped);
        }
        self.set_capacity(floor)?;
        let end = match self.core.backend.unmap_to(floor) {
            Ok(end) => end,
            Err(err) => {
                self.set_capacity(mapped)?;
                return Err(err);
            }
        };
        if end != floor {
            self.set_capacity(end)?;
        }
        Ok(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn room(live: u64, reserved: u64, used_end: u64, mapped: u64) -> Room {
        Room {
            live,
            reserved,
            align: 256,
            used_end,
            mapped,
            limit: 1 << 40,
            granule: 2 * MIB,
            window_peak: 0,
            all_peak: 0,
        }
    }

    #[test]
    fn allowed_is_one_granule_or_the_slack_over_live() {
        assert_eq!(allowed(0, 0.01, 2 * MIB), 2 * MIB);
        assert_eq!(allowed(MIB, 0.01, 2 * MIB), 2 * MIB);
        assert_eq!(allowed(100 * MIB, 0.01, 2 * MIB), 102 * MIB);
        assert_eq!(allowed(1000 * MIB, 0.01, 2 * MIB), 1010 * MIB);
    }

    #[test]
    fn grows_without_moves_when_the_request_fits_above_the_blocks() {
        // 100 MiB live, packed; a 10 MiB request: map what it needs.
        let t = grow_target(room(100 * MIB, 10 * MIB, 100 * MIB, 100 * MIB), 0.01, |_| 0);
        assert_eq!(t, Some(110 * MIB));
        // A small request maps 1/256 of the mapped bytes (a granule here).
        let t = grow_target(room(100 * MIB, MIB, 100 * MIB, 100 * MIB), 0.01, |_| 0);
        assert_eq!(t, Some(102 * MIB));
        // 50 MiB live spread up to 150 MiB, 200 MiB live once: below that
        // peak the arena maps rather than moves.
        let r = Room {
            all_peak: 200 * MIB,
            ..room(50 * MIB, 10 * MIB, 150 * MIB, 150 * MIB)
        };
        assert_eq!(grow_target(r, 0.01, |_| 0), Some(160 * MIB));
    }

    #[test]
    fn compacts_when_growth_would_exceed_the_slack() {
        // 50 MiB live spread up to 100 MiB: compaction fits it in place.
        let r = room(50 * MIB, 10 * MIB, 100 * MIB, 100 * MIB);
        assert_eq!(grow_target(r, 0.01, |c| c - 50 * MIB), None);
        // 95 MiB live up to 100 MiB, 10 MiB more: grow to the slack, then compact.
        let r = room(95 * MIB, 10 * MIB, 100 * MIB, 100 * MIB);
        let t = grow_target(r, 0.01, |c| c.saturating_sub(95 * MIB));
        assert_eq!(t, Some(allowed(105 * MIB, 0.01, 2 * MIB)));
        // Pins: no compaction helps; map above the blocks.
        let t = grow_target(r, 0.01, |_| 0);
        assert_eq!(t, Some(110 * MIB));
        // At the limit: nothing to grow.
        let r = Room {
            limit: 100 * MIB,
            ..r
        };
        assert_eq!(grow_target(r, 0.01, |_| 0), None);
    }

    #[test]
    fn chunks_are_a_fraction_of_the_mapped_bytes() {
        let g = 2 * MIB;
        let ends = chunk_ends(0, 40 << 30, g);
        assert_eq!(*ends.last().unwrap(), 40 << 30);
        let mut start = 0;
        for &e in &ends {
            assert!(e - start <= g.max(start / CHUNK_FRACTION));
            assert_eq!(e % g, 0);
            start = e;
        }
        assert!(ends.len() < 900, "{} chunks", ends.len());
    }

    #[test]
    fn the_window_keeps_its_largest_live_bytes() {
        let mut e = Elastic::new(&ArenaConfig::elastic().with_trim_window_us(100)).unwrap();
        assert_eq!(e.note(0, 10), 10);
        assert_eq!(e.note(10, 50), 50);
        assert_eq!(e.note(20, 5), 50);
        assert_eq!(e.note(100, 7), 50);
        // The 50 B held until 20, before the window [21, 121].
        assert_eq!(e.note(121, 6), 7);
        assert_eq!(e.note(500, 1), 6);
        assert_eq!(e.note(601, 1), 1);
    }
}
