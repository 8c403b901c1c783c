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
//! fails exactly as a fixed arena. Under `CompactionPolicy::Manual`,
//! which never compacts for a request, 3. maps what the request needs
//! instead (and maps nothing where even the limit would not hold it). Growing on fragmentation below the peak
//! (2.) rather than compacting keeps the bytes moved near naive's at a fixed
//! capacity of the peak: a decode loop whose growing buffers leave holes
//! would otherwise compact at almost every step.
//!
//! **Placement.** An elastic arena places by best fit with its free top
//! last ([`crate::placement::Fit::Best`]): a block goes into the smallest
//! hole that holds it, and above the highest block only when no hole does,
//! so the end that has to stay mapped rises only when it must. Good fit
//! (a fixed arena's O(1) choice) passes over the holes of the request's
//! own size class, which are the ones a buffer that grows a little each
//! step leaves behind.
//!
//! **Chunks** ([`chunk_ends`], in `rule.rs` with the rest of the pure
//! rules): a chunk is at most `1/128` of the mapped bytes below it (never
//! below the granule). Mapping costs about the same per chunk whatever its
//! size (the driver calls, not the bytes), so chunks should be large; but
//! a chunk is unmapped whole, so the one holding the live end after a trim
//! is waste, and at `1/128` of its offset it stays below the trim's
//! promise of `max(granule, 1% of live)`. A growth from nothing to 40 GiB
//! takes 853 chunks.
//!
//! **Trim** ([`Arena::trim`]): compacts only when the highest block ends
//! above `allowed(live)` (the blocks above it evacuated into holes below
//! when that moves no more than a full compaction, else a full
//! compaction), then unmaps every chunk above the highest block (the
//! backend unmaps in stream order).
//!
//! **The automatic trim**, on allocation and free, targets
//! `allowed(largest live of the last window)` (`trim_window_us`). It looks
//! when that falls and otherwise once per eighth of a window, and acts
//! when mapped exceeds the target by more than half a tolerance: what lies
//! free above the blocks is unmapped at once; a compaction runs only on
//! allocation (frees never move blocks) and is paid by rent or buy (each
//! look that an excess lasts pays for moving as many bytes as it holds),
//! so an excess that lasts (a phase that needs less) goes within a few
//! looks whatever it takes to move, while one that every step recreates
//! (the holes a growing KV cache leaves) is not moved again and again for
//! a few bytes each time. The compaction is the one that lowers the mapped
//! end most within what is paid ([`plan_trim`]: the blocks above a cut
//! evacuated into holes, or the top slid down onto the blocks below where
//! the holes are too small), and all of them stay within a budget of
//! bytes moved (`TRIM_BUDGET_BASE`), so that a trace whose live bytes
//! swing across windows again and again does not pay a compaction per
//! swing. A trim compaction whose result holds earns its bytes back
//! ([`Payback`]): once the memory it gave back has stayed given back for
//! as long as rent or buy would have taken to pay for moving them, they
//! return to the budget. So a long run whose trims last keeps trimming
//! (the budget is spent only by trims that the workload undoes at once,
//! which no amount of moving makes last). Under the default policy in free
//! mode, naive's layout is trimmed alike and the arena's plan runs as the
//! policy's potential affords (`policy/trim.rs`).

mod rule;

use std::collections::VecDeque;

use rule::{allowed, chunk_ends, grow_target, Room};

use super::Arena;
use crate::backend::Backend;
use crate::config::ArenaConfig;
use crate::error::Result;
use crate::plan::planner;
use crate::plan::planner::evacuate::{plan_evacuate, plan_trim};
use crate::plan::PlanKind;

/// The automatic trim's budget of bytes moved: this many peak live bytes
/// (the largest so far), plus one more per `TRIM_BUDGET_WINDOWS` windows of
/// time. Trimming compacts only within it, so that a trace whose live bytes
/// swing across windows again and again does not pay a compaction per
/// swing: chosen on the design half of the recorded corpus
/// (`cuarena-trace`'s `elastic` bench) against the check that the bytes
/// moved stay within naive's at a fixed capacity of the peak live bytes
/// plus twice the peak live bytes
/// (BENCHMARKS.md#the-elastic-arena-on-the-recorded-corpus).
const TRIM_BUDGET_BASE: f64 = 1.5;
const TRIM_BUDGET_WINDOWS: f64 = 1024.0;

/// The automatic trim looks this many times per window (and at once when
/// the window's largest live bytes fall).
const LOOKS_PER_WINDOW: u64 = 8;

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
    /// The bytes mapped over the trim's target, summed over time
    /// (byte-microseconds, each look's excess times the time since the
    /// last look) since mapped rose above it or a trim last moved: what a
    /// trim may move (see `auto_trim`).
    waste: f64,
    start_us: Option<u64>,
    /// Where the mapped chunks end, ascending (the last is the mapped
    /// end): where a trim can cut.
    chunks: Vec<u64>,
    /// Bytes the trims' compactions moved, less those paid back.
    trim_moved: u64,
    /// The last trim compaction, until it is paid back or undone.
    payback: Option<Payback>,
    pub(super) trims: u64,
    pub(super) peak_mapped_bytes: u64,
}

impl Elastic {
    pub(super) fn new(config: &ArenaConfig) -> Option<Self> {
        config.elastic.then(|| Self {
            slack: config.elastic_slack,
            window_us: config.trim_window_us,
            peaks: VecDeque::new(),
            last_check_us: 0,
            checked_peak: 0,
            waste: 0.0,
            start_us: None,
            chunks: Vec::new(),
            trim_moved: 0,
            payback: None,
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

/// A trim compaction that has not paid for itself yet: it moved `moved`
/// bytes to lower the mapped end from `from`; while the mapped end stays at
/// or below `hold` (where the trim left it, plus the look's tolerance), each
/// look adds what stays given back to `given_back`, in the rent's units
/// (byte-microseconds). Mapped rising above `hold` undoes it.
#[derive(Debug, Clone, Copy)]
struct Payback {
    moved: u64,
    from: u64,
    hold: u64,
    given_back: f64,
}

impl Payback {
    /// Notes a look at `mapped` bytes, `since` microseconds after the last
    /// one. Returns `Some(bytes)` to give back to the budget once paid,
    /// `Some(0)` once undone (both end it), `None` while it runs.
    fn look(&mut self, mapped: u64, since: u64, window_us: u64) -> Option<u64> {
        if mapped > self.hold {
            return Some(0);
        }
        self.given_back += self.from.saturating_sub(mapped) as f64 * since as f64;
        let paid = self.given_back * LOOKS_PER_WINDOW as f64 / window_us as f64;
        (paid >= self.moved as f64).then_some(self.moved)
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
                    self.chunks_end_at(mapped);
                }
                return Err(err);
            }
            if let Some(el) = &mut self.elastic {
                el.chunks.push(e);
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
            compacts: self.policy.compacts(),
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
        if e.window_us == 0
            || (!fell && now.saturating_sub(e.last_check_us) < e.window_us / LOOKS_PER_WINDOW)
        {
            return Ok(());
        }
        let g = self.core.backend.granularity_bytes();
        let target = allowed(window_peak, e.slack, g);
        let mapped = self.core.capacity();
        // Give back only more than half a tolerance over the target, so
        // that a window's own rise and fall costs nothing.
        let hysteresis = g.max((window_peak as f64 * e.slack / 2.0) as u64);
        let over = mapped > target.saturating_add(hysteresis);
        if over && !may_move && self.core.index.used_end() >= target {
            // Only a compaction gives this back: the look is left to the
            // next allocation.
            return Ok(());
        }
        let since = now.saturating_sub(e.last_check_us);
        e.last_check_us = now;
        if let Some(back) = e
            .payback
            .as_mut()
            .and_then(|p| p.look(mapped, since, e.window_us))
        {
            e.trim_moved = e.trim_moved.saturating_sub(back);
            e.payback = None;
        }
        e.checked_peak = window_peak;
        if !over {
            e.waste = 0.0;
            return Ok(());
        }
        // Rent or buy: keeping an excess mapped costs its bytes for as
        // long as it lasts; compacting it away costs the bytes moved, once.
        // Each look an excess lasts pays for moving as many bytes as it
        // holds: one that lasts (a phase that needs less) is given back
        // within a few looks whatever it takes to move, while one that
        // each step recreates (blocks that outgrow the holes they leave)
        // is not moved again and again for a few bytes each time.
        e.waste += (mapped - target) as f64 * since as f64;
        let windows = now.saturating_sub(e.start_us.unwrap_or(now)) as f64 / e.window_us as f64;
        let peak = self.core.counters.peak_allocated_bytes as f64;
        let budget = (peak * (TRIM_BUDGET_BASE + windows / TRIM_BUDGET_WINDOWS)) as u64;
        let rent = (e.waste * LOOKS_PER_WINDOW as f64 / e.window_us as f64) as u64;
        let left = budget.saturating_sub(e.trim_moved).min(rent);
        let moved_before = self.core.counters.bytes_moved;
        self.trim_to(target, target, may_move.then_some(left))?;
        let moved = self.core.counters.bytes_moved - moved_before;
        if moved > 0 {
            let hold = self.core.capacity().saturating_add(hysteresis);
            if let Some(e) = &mut self.elastic {
                // What a compaction left over is a new excess.
                e.waste = 0.0;
                e.payback = Some(Payback {
                    moved,
                    from: mapped,
                    hold,
                    given_back: 0.0,
                });
            }
        }
        Ok(())
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

    /// Lowers the highest block to `cut` or below, moving at most `budget`
    /// bytes (`u64::MAX`: an explicit trim, which reaches the cut whatever
    /// it moves). Within a budget, the plan that reaches the lowest chunk
    /// end at or above the cut ([`plan_trim`]: an evacuation into holes,
    /// or the top slid down); else the evacuation of the blocks above the
    /// cut when it moves no more than a full compaction, or the policy's
    /// full compaction. In free mode naive's layout is trimmed alike and
    /// the arena's plan runs as the potential affords (`policy/trim.rs`).
    fn compact_below(&mut self, cut: u64, budget: u64) -> Result<()> {
        let t0 = std::time::Instant::now();
        let unlimited = budget == u64::MAX;
        self.core.collect_live();
        let live = &self.core.live;
        let (plan, cut) = if unlimited {
            let full = planner::plan_full(live, self.core.capacity());
            match plan_evacuate(live, cut) {
                Some(p) if p.bytes_moved() <= full.bytes_moved() => (p, cut),
                _ => (full, cut),
            }
        } else {
            // A cut inside the last chunk gives nothing back.
            let chunks = self.elastic.as_ref().map_or(&[][..], |e| &e.chunks[..]);
            let below = &chunks[..chunks.len().saturating_sub(1)];
            match plan_trim(live, below, cut, budget) {
                Some(found) => found,
                None => return Ok(()),
            }
        };
        if self.policy.in_free_mode() {
            let trimmed = self
                .policy
                .bounded()
                .map_or(Ok(false), |b| b.trim_free(&mut self.core, cut, plan, t0))?;
            if trimmed || !unlimited {
                return Ok(());
            }
            // An explicit trim the potential does not afford yet: the
            // handover to mirror mode, and its full compaction.
        } else if plan.kind() != PlanKind::Full {
            if !plan.is_empty() {
                self.policy.note_external(plan.bytes_moved());
                self.core.run(plan, t0)?;
            }
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
        self.chunks_end_at(end);
        Ok(end)
    }

    /// The chunks above `end` are unmapped.
    fn chunks_end_at(&mut self, end: u64) {
        if let Some(e) = &mut self.elastic {
            while e.chunks.last().is_some_and(|&c| c > end) {
                e.chunks.pop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_trim_is_paid_back_while_it_holds_and_undone_when_mapped_rises() {
        // Moved 800 B to go from 1000 to 400 mapped, holding up to 420.
        let fresh = Payback {
            moved: 800,
            from: 1000,
            hold: 420,
            given_back: 0.0,
        };
        // 600 B, then 590 B, given back for 100 us each of a 1000 us
        // window pay 480 B, then 952 B (8 looks a window): paid.
        let mut p = fresh;
        assert_eq!(p.look(400, 100, 1000), None);
        assert_eq!(p.look(410, 100, 1000), Some(800));
        // Mapped above where the trim left it: undone, nothing paid.
        let mut p = fresh;
        assert_eq!(p.look(400, 100, 1000), None);
        assert_eq!(p.look(421, 100, 1000), Some(0));
    }
}
