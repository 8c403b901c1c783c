//! The elastic region's pure rules: what may be mapped for given live
//! bytes, whether a request that fits in no hole grows the mapping or
//! compacts, and where chunks end. No arena, no backend: data in, decision
//! out (the module above applies them).

/// Chunks are at most this fraction (1/`CHUNK_FRACTION`) of what is mapped below them.
const CHUNK_FRACTION: u64 = 128;

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
    /// Whether the policy may compact for the request (not under
    /// `CompactionPolicy::Manual`, which instead maps up to the limit).
    pub compacts: bool,
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
    if !r.compacts {
        // A policy that never compacts: map what the request needs rather
        // than fail below the limit; nothing where it would not fit.
        return (top <= r.limit).then_some(top).and_then(grow);
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
            compacts: true,
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
    fn a_policy_that_never_compacts_maps_up_to_the_limit() {
        // As in compacts_when_growth_would_exceed_the_slack, but Manual.
        let r = Room {
            compacts: false,
            ..room(50 * MIB, 10 * MIB, 100 * MIB, 100 * MIB)
        };
        assert_eq!(grow_target(r, 0.01, |c| c - 50 * MIB), Some(110 * MIB));
        // Past the limit nothing is mapped: the request fails as it would
        // in a fixed arena.
        let r = Room {
            limit: 105 * MIB,
            ..r
        };
        assert_eq!(grow_target(r, 0.01, |c| c - 50 * MIB), None);
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
}
