//! Compaction plans: data that says which bytes go where, in which wave.
//!
//! A [`Plan`] is made by the arena's compaction planner and executed by a
//! [`crate::backend::Backend`]: the strict host backend and the CUDA kernel
//! run the very same value. A backend reads it through [`Plan::waves`] and
//! [`Wave::moves`]; the wave rule below is its contract. (How the planner
//! chooses moves, and why [`crate::CompactionPolicy::Auto`] never moves
//! more bytes than naive compact-on-failure, is told in [`crate::policies`].)
//!
//! # The wave rule
//!
//! Waves run one after another: every move of wave *k* is complete before any
//! move of wave *k + 1* starts. Within one wave, moves run concurrently under
//! this rule, which [`Plan::validate`] checks:
//!
//! 1. Moves are listed in ascending order of source offset, and sources are
//!    pairwise disjoint (they are distinct live blocks).
//! 2. Destinations are pairwise disjoint, and each lies in the region.
//! 3. A move's destination may overlap the sources of moves listed **before**
//!    it (and its own source, but then only sliding down: `dst <= src`).
//!    It never overlaps the source of a move listed after it.
//! 4. A destination never overlaps a live block that does not move in this
//!    wave (the planner's obligation; the arena checks the final layout).
//!
//! Executors must therefore read each source byte before any write that
//! covers it. Both do it the same way: the wave is cut into chunks in list
//! order, and a chunk may store only after every earlier chunk whose source
//! overlaps its destination has been loaded. Because such chunks always come
//! earlier in the list (rule 3), there is no cycle and no deadlock, and a
//! long chain of blocks sliding down by a few bytes runs as one wave with
//! full parallelism: each chunk waits only for its neighbour's load, not for
//! its store. The rule is a relaxation of the stricter "no destination
//! touches any other move's source" (every such wave is also valid here).
//!
//! A move whose destination overlaps only free space may go in any
//! direction; the planner uses such moves to evacuate a window into holes.

pub(crate) mod lag;
pub(crate) mod live;
pub(crate) mod pacer;
pub(crate) mod pieces;
pub(crate) mod planner;
pub(crate) mod relayout;
pub(crate) mod track;

use smallvec::SmallVec;

use crate::error::Error;

/// What the planner's checks refuse: a plan that breaks the wave rule, or
/// a layout of live blocks that breaks the planner's rules (its own
/// input). A public plan's failures are [`Error::InvalidInput`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PlanError {
    /// A plan that breaks the wave rule or leaves an invalid layout.
    #[error("invalid plan: {0}")]
    Plan(String),
    /// Live blocks out of order, overlapping, empty, misaligned or out of
    /// bounds.
    #[error("invalid layout: {0}")]
    Layout(String),
}

impl From<PlanError> for Error {
    fn from(e: PlanError) -> Self {
        match e {
            PlanError::Plan(reason) => Error::InvalidInput {
                input: "plan",
                reason,
            },
            PlanError::Layout(reason) => Error::InvalidInput {
                input: "layout of live blocks",
                reason,
            },
        }
    }
}

/// One relocation: `len` bytes of one block from `src` to `dst` (offsets in
/// the arena's region). `key` names the block; the planner carries it
/// through untouched (the arena uses its handle's slot key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Move {
    /// Opaque block identifier.
    pub key: u64,
    /// Source offset.
    pub src: u64,
    /// Destination offset.
    pub dst: u64,
    /// Bytes to move (> 0).
    pub len: u64,
}

impl Move {
    /// End of the source range (exclusive).
    pub fn src_end(&self) -> u64 {
        self.src.saturating_add(self.len)
    }
    /// End of the destination range (exclusive).
    pub fn dst_end(&self) -> u64 {
        self.dst.saturating_add(self.len)
    }
}

/// Moves that run concurrently (see the module's wave rule).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wave {
    /// Moves in ascending source order.
    pub(crate) moves: Vec<Move>,
}

impl Wave {
    /// The moves, in the order they are listed (ascending sources in a
    /// valid plan).
    pub fn moves(&self) -> &[Move] {
        &self.moves
    }
}

/// Why a plan was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanKind {
    /// Make one hole large enough for a request, moving as few bytes as possible.
    Targeted,
    /// Merge all free space: one region per gap between pinned blocks.
    Full,
}

/// A compaction plan: waves of moves, executed in order.
///
/// Its fields are private: a plan holds no empty wave, and is read through
/// [`kind`](Plan::kind), [`waves`](Plan::waves) and [`moves`](Plan::moves).
/// [`Plan::new`] builds one by hand (tests and benches of a backend); the
/// wave rule is checked by [`validate`](Plan::validate), which the host
/// backend runs before every plan (unless told not to, to watch a wrong
/// plan corrupt data), and the arena runs only plans it made and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Why it was made.
    pub(crate) kind: PlanKind,
    /// The waves, in execution order. Never holds an empty wave.
    pub(crate) waves: SmallVec<[Wave; 2]>,
}

impl Plan {
    /// A plan of `waves`, run in order, each wave's moves listed as given;
    /// empty waves are dropped. Not checked against the wave rule: see
    /// [`validate`](Plan::validate).
    pub fn new(kind: PlanKind, waves: impl IntoIterator<Item = Vec<Move>>) -> Self {
        Self {
            kind,
            waves: waves
                .into_iter()
                .filter(|moves| !moves.is_empty())
                .map(|moves| Wave { moves })
                .collect(),
        }
    }

    /// A plan that moves nothing.
    pub fn empty(kind: PlanKind) -> Self {
        Self {
            kind,
            waves: SmallVec::new(),
        }
    }

    /// Why it was made.
    pub fn kind(&self) -> PlanKind {
        self.kind
    }

    /// The waves, in execution order (none of them empty).
    pub fn waves(&self) -> &[Wave] {
        &self.waves
    }

    /// True when nothing moves.
    pub fn is_empty(&self) -> bool {
        self.waves.iter().all(|w| w.moves.is_empty())
    }

    /// All moves, wave by wave.
    pub fn moves(&self) -> impl Iterator<Item = &Move> {
        self.waves.iter().flat_map(|w| w.moves.iter())
    }

    /// Number of moves.
    pub fn move_count(&self) -> usize {
        self.waves.iter().map(|w| w.moves.len()).sum()
    }

    /// Bytes copied by the plan.
    pub fn bytes_moved(&self) -> u64 {
        self.moves().map(|m| m.len).fold(0, u64::saturating_add)
    }

    /// Checks rules 1–3 of the wave rule and that every range lies within
    /// `capacity_bytes`: [`Error::InvalidInput`] (`input: "plan"`) naming
    /// the rule and the moves otherwise. Rule 4 needs the live set; the
    /// arena checks it.
    pub fn validate(&self, capacity_bytes: u64) -> Result<(), Error> {
        Ok(self.check(capacity_bytes)?)
    }

    /// [`validate`](Self::validate), with the planner's error.
    pub(crate) fn check(&self, capacity_bytes: u64) -> Result<(), PlanError> {
        for (w, wave) in self.waves.iter().enumerate() {
            validate_wave(w, wave, capacity_bytes)?;
        }
        Ok(())
    }

    /// Every rule, against the live blocks the plan was made from: the
    /// input passes [`planner::check_live`], the waves pass
    /// [`validate`](Self::validate), every move names an unpinned live
    /// block and copies bytes of its data where they are at that wave (the
    /// whole block, or a piece of it: [`track`]), after every wave no
    /// block's data lies on another's (rule 4), and at the end every moved
    /// block is whole again at an offset of its alignment, the blocks (at
    /// their reserved lengths) pairwise disjoint inside the region.
    /// O((blocks + moves) log blocks).
    ///
    /// # Errors
    ///
    /// [`PlanError::Layout`] for bad input, [`PlanError::Plan`] for a
    /// plan that breaks a rule.
    pub(crate) fn validate_against(
        &self,
        live: &[planner::LiveBlock],
        capacity_bytes: u64,
    ) -> Result<(), PlanError> {
        track::validate_against(self, live, capacity_bytes)
    }
}

fn invalid(reason: String) -> PlanError {
    PlanError::Plan(reason)
}

fn validate_wave(w: usize, wave: &Wave, capacity_bytes: u64) -> Result<(), PlanError> {
    let moves = &wave.moves;
    for (i, m) in moves.iter().enumerate() {
        let in_bounds = |start: u64| {
            start
                .checked_add(m.len)
                .is_some_and(|e| e <= capacity_bytes)
        };
        if m.len == 0 || !in_bounds(m.src) || !in_bounds(m.dst) {
            return Err(invalid(format!(
                "wave {w} move {i} ({m:?}) is empty or outside the region of {capacity_bytes} B"
            )));
        }
        if i > 0 && moves[i - 1].src_end() > m.src {
            return Err(invalid(format!(
                "wave {w}: move {i} source is not after move {} source (sources must ascend and be disjoint)",
                i - 1
            )));
        }
    }
    // Rule 2: destinations pairwise disjoint.
    let mut by_dst: Vec<usize> = (0..moves.len()).collect();
    by_dst.sort_unstable_by_key(|&i| moves[i].dst);
    for pair in by_dst.windows(2) {
        let (a, b) = (&moves[pair[0]], &moves[pair[1]]);
        if a.dst_end() > b.dst {
            return Err(invalid(format!(
                "wave {w}: destinations of moves {} and {} overlap",
                pair[0], pair[1]
            )));
        }
    }
    // Rule 3: the last source a destination touches is its own or an earlier one.
    for (i, m) in moves.iter().enumerate() {
        // Sources are sorted and disjoint, so those touching [dst, dst_end)
        // are a contiguous run ending at the last one starting before dst_end.
        let last = moves.partition_point(|o| o.src < m.dst_end());
        if last == 0 {
            continue;
        }
        let last = last - 1;
        if moves[last].src_end() <= m.dst {
            continue; // touches no source at all
        }
        if last > i {
            return Err(invalid(format!(
                "wave {w}: move {i} writes over the source of later move {last} before it is read"
            )));
        }
        if last == i && m.dst > m.src {
            return Err(invalid(format!(
                "wave {w}: move {i} overlaps its own source sliding up (dst > src)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A move of `len` bytes from `src` to `dst`, keyed by its source.
    pub(crate) fn mv(src: u64, dst: u64, len: u64) -> Move {
        Move {
            key: src,
            src,
            dst,
            len,
        }
    }
    fn plan(moves: Vec<Move>) -> Plan {
        let mut p = Plan::empty(PlanKind::Full);
        p.waves.push(Wave { moves });
        p
    }

    #[test]
    fn chain_sliding_down_is_one_valid_wave() {
        // Three adjacent blocks of 100 B each slide down by 10 B.
        let p = plan(vec![mv(10, 0, 100), mv(110, 100, 100), mv(210, 200, 100)]);
        assert_eq!(p.validate(1000), Ok(()));
        assert_eq!(p.bytes_moved(), 300);
    }

    #[test]
    fn writing_over_a_later_source_is_rejected() {
        let p = plan(vec![mv(0, 150, 100), mv(200, 300, 100)]);
        assert!(matches!(
            p.validate(1000),
            Err(Error::InvalidInput { input: "plan", .. })
        ));
    }

    #[test]
    fn overlapping_destinations_are_rejected() {
        let p = plan(vec![mv(0, 500, 100), mv(200, 550, 100)]);
        assert!(matches!(
            p.validate(1000),
            Err(Error::InvalidInput { input: "plan", .. })
        ));
    }

    #[test]
    fn sliding_up_over_itself_is_rejected() {
        let p = plan(vec![mv(0, 10, 100)]);
        assert!(matches!(
            p.validate(1000),
            Err(Error::InvalidInput { input: "plan", .. })
        ));
    }

    #[test]
    fn unsorted_and_out_of_bounds_are_rejected() {
        assert!(plan(vec![mv(200, 0, 10), mv(100, 50, 10)])
            .validate(1000)
            .is_err());
        assert!(plan(vec![mv(995, 0, 10)]).validate(1000).is_err());
        assert!(plan(vec![mv(0, u64::MAX - 5, 10)]).validate(1000).is_err());
        assert!(plan(vec![mv(0, 10, 0)]).validate(1000).is_err());
    }

    #[test]
    fn evacuation_upward_into_free_space_is_valid() {
        let p = plan(vec![mv(0, 900, 50), mv(100, 800, 50)]);
        assert_eq!(p.validate(1000), Ok(()));
    }

    #[test]
    fn validate_against_checks_the_final_layout() {
        use planner::LiveBlock;
        let live = |key, offset, len, pinned| LiveBlock {
            key,
            offset,
            len,
            copy_len: len,
            align: 1,
            pinned,
        };
        let blocks = [live(0, 0, 100, false), live(300, 300, 100, false)];
        // Valid by rules 1-3, but lands on the block at 300 that stays.
        let p = plan(vec![mv(0, 250, 100)]);
        assert_eq!(p.validate(1000), Ok(()));
        assert!(matches!(
            p.validate_against(&blocks, 1000),
            Err(PlanError::Plan(_))
        ));
        assert_eq!(
            plan(vec![mv(0, 150, 100)]).validate_against(&blocks, 1000),
            Ok(())
        );
        // A move of a pinned block, of a block not where it is, or of none.
        let pinned = [live(0, 0, 100, true)];
        assert!(plan(vec![mv(0, 500, 100)])
            .validate_against(&pinned, 1000)
            .is_err());
        let mut wrong_src = mv(0, 500, 100);
        wrong_src.src = 10;
        assert!(plan(vec![wrong_src])
            .validate_against(&blocks, 1000)
            .is_err());
        assert!(plan(vec![mv(7, 500, 100)])
            .validate_against(&blocks, 1000)
            .is_err());
        // Bad input: overlapping live blocks.
        let overlapping = [live(0, 0, 100, false), live(50, 50, 100, false)];
        assert!(matches!(
            Plan::empty(PlanKind::Full).validate_against(&overlapping, 1000),
            Err(PlanError::Layout(_))
        ));
    }
}
