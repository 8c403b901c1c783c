//! Arena configuration: public fields, `Default`, and `with_*` builders.

use crate::error::{Error, Result};

/// Largest alignment an allocation may ask for (1 GiB): [`ArenaConfig::MAX_ALIGN`].
pub(crate) const MAX_ALIGN: u64 = 1 << 30;

/// When the arena compacts on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionPolicy {
    /// Never move a block unless [`crate::Arena::compact`] is called; an
    /// allocation that fits in no hole fails (a plain non-moving allocator,
    /// used as the baseline in benches and the demo).
    Manual,
    /// Compacts when a request fits in the free bytes but in no hole, and
    /// never moves more bytes than naive compact-on-failure on the same
    /// requests, at every point of every program naive serves, with no
    /// additive constant; where a non-moving best fit serves every
    /// request, it moves nothing. It places blocks as naive does and, when
    /// naive would compact, moves only the blocks in the way of the
    /// request, deferring the rest of naive's moves until they are needed
    /// (a block freed before then never moves). See `src/plan/lag.rs`
    /// for the argument. Requests naive cannot serve (pins or alignment
    /// padding in the way) get a targeted compaction as under
    /// [`CompactionPolicy::Targeted`]. It rarely moves much less than
    /// naive: most deferred moves are needed soon after
    /// ([`CompactionPolicy::Budgeted`] bets on moving less). The default.
    Auto,
    /// Compacts when a request fits in the free bytes but in no hole, with
    /// the targeted policy's cheap plans while they keep it within naive
    /// compact-on-failure (best-fit placement, one full compaction when a
    /// request fits in no hole) on the same requests, and naive's own
    /// layout once they would not. At every point of every program naive
    /// serves it has moved at most naive's bytes plus one relayout of the
    /// live blocks (`Stats::handover_bytes`; 0 on programs where the cheap
    /// plans never ran out of budget) and plus `Stats::overrun_bytes`
    /// (compactions run while naive's layout could not be staged, which
    /// the docs of `src/plan/lag.rs` describe); where a non-moving best
    /// fit serves every request, it moves nothing. Blocks are placed best
    /// fit, as naive places them. See `src/plan/lag.rs` ("Two phases").
    /// Without spilling; with a host tier it runs as
    /// [`CompactionPolicy::Auto`]. One gap, with pins or no room to stage
    /// the handover, is described there: it can fail a request naive
    /// would serve, which `Auto` never does.
    Budgeted,
    /// When a request fits in the free bytes but in no hole, run a targeted
    /// compaction (fewest bytes moved now), falling back to a full one
    /// (`src/plan/policy.rs`), with large and long-lived blocks placed
    /// apart ([`ArenaConfig::large_block_divisor`]). It usually moves far
    /// fewer bytes than naive compact-on-failure, but nothing bounds it:
    /// on some programs it moves more, and it can compact where a
    /// non-moving best fit would not need to. [`CompactionPolicy::Auto`]
    /// keeps it to a budget.
    Targeted,
}

/// Configuration of an [`crate::Arena`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ArenaConfig {
    /// Bytes of the arena's region.
    pub capacity_bytes: u64,
    /// Default alignment of every block (power of two). Every size is
    /// rounded up to it, and every offset is a multiple of it. 256 B matches
    /// what CUDA's own allocator guarantees.
    pub alignment_bytes: u64,
    /// When to compact.
    pub compaction: CompactionPolicy,
    /// Host tier for spilling, in bytes; 0 (the default) turns spilling off.
    /// When even compaction cannot fit a request, least recently used
    /// unpinned blocks are copied to this tier (page-locked host memory on
    /// the CUDA backend) and brought back when next resolved.
    pub spill_host_bytes: u64,
    /// Lifetime placement (off by default; only under
    /// [`CompactionPolicy::Targeted`]): blocks whose size has reliably died
    /// young are carved from the top of their free region as well, the
    /// rest from the bottom (see `src/placement/lifetime.rs`). It moves
    /// far fewer bytes on some training traces (the shipped ResNet CSV at
    /// 1.00x: 0.069 of naive), but on others, and on random programs, it
    /// can need a compaction where the default placement needs none
    /// (BENCHMARKS.md), so it is not the default. It never makes an
    /// allocation fail that the free bytes allow.
    pub lifetime_placement: bool,
    /// Large blocks from the top (only under [`CompactionPolicy::Targeted`];
    /// 0 turns it off; `Auto` places as naive does): a block of at least `capacity_bytes /
    /// large_block_divisor` bytes (rounded up) that fits in a hole is
    /// carved from the top of that free region rather than the bottom, so
    /// large blocks gather at the top of free space, in an empty arena from
    /// its end down, and smaller ones at the bottom. A large block with a
    /// hole below it costs at least its size to move when the holes must
    /// merge; kept apart, the holes that the churn of small blocks leaves
    /// lie among small blocks, which are cheap to move. Blocks of a size
    /// that reliably outlived half the average block (by Little's law, half
    /// the live blocks, in allocation ticks; see
    /// `src/placement/lifetime.rs`) join them at the top: a long-lived
    /// block left among the churn is what a compaction at the limit must
    /// slide past. A block placed by
    /// a compaction or brought back from the spill tier goes to the bottom
    /// of its hole (carving it high after a compaction moved more bytes).
    /// Default 32: on the shipped traces 32 and 48 move the same bytes, 16
    /// and 24 trade the ResNet trace against LLM decoding, and 64 and above
    /// compact where naive compact-on-failure does not (BENCHMARKS.md). A
    /// divisor of 1, or one so large that every block counts as large,
    /// keeps no blocks apart. Like any placement, it never makes an
    /// allocation fail that the free bytes allow.
    pub large_block_divisor: u64,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self {
            capacity_bytes: 64 << 20,
            alignment_bytes: 256,
            compaction: CompactionPolicy::Auto,
            spill_host_bytes: 0,
            lifetime_placement: false,
            large_block_divisor: 32,
        }
    }
}

impl ArenaConfig {
    /// Largest alignment an allocation (or the arena's own alignment) may
    /// ask for: 1 GiB.
    pub const MAX_ALIGN: u64 = MAX_ALIGN;

    /// A config of `capacity_bytes` with the defaults otherwise.
    pub fn new(capacity_bytes: u64) -> Self {
        Self {
            capacity_bytes,
            ..Self::default()
        }
    }

    /// Turns lifetime placement on or off (see
    /// [`ArenaConfig::lifetime_placement`]).
    pub fn with_lifetime_placement(mut self, on: bool) -> Self {
        self.lifetime_placement = on;
        self
    }

    /// Sets [`ArenaConfig::large_block_divisor`] (0: every block from the
    /// bottom of its region).
    pub fn with_large_block_divisor(mut self, divisor: u64) -> Self {
        self.large_block_divisor = divisor;
        self
    }

    /// Sets the capacity.
    pub fn with_capacity_bytes(mut self, capacity_bytes: u64) -> Self {
        self.capacity_bytes = capacity_bytes;
        self
    }

    /// Sets the default alignment.
    pub fn with_alignment_bytes(mut self, alignment_bytes: u64) -> Self {
        self.alignment_bytes = alignment_bytes;
        self
    }

    /// Sets the compaction policy.
    pub fn with_compaction(mut self, compaction: CompactionPolicy) -> Self {
        self.compaction = compaction;
        self
    }

    /// Turns spilling on with a host tier of `bytes` (0 turns it off).
    pub fn with_spill_host_bytes(mut self, bytes: u64) -> Self {
        self.spill_host_bytes = bytes;
        self
    }

    /// The size from which a block counts as large
    /// ([`ArenaConfig::large_block_divisor`]): `capacity / divisor` rounded
    /// up; `None` with the divisor 0.
    pub(crate) fn large_block_bytes(&self) -> Option<u64> {
        (self.large_block_divisor > 0)
            .then(|| self.capacity_bytes.div_ceil(self.large_block_divisor))
    }

    /// Whether this config keeps large blocks apart from the rest: some
    /// block sizes count as large and some do not.
    pub(crate) fn keeps_large_apart(&self) -> bool {
        self.large_block_bytes()
            .is_some_and(|t| t > self.alignment_bytes && t < self.capacity_bytes)
    }

    /// Checks the config: alignment a power of two up to [`Self::MAX_ALIGN`],
    /// capacity non-zero and a multiple of the alignment, capacity plus
    /// host tier within `u64`.
    pub fn validate(&self) -> Result<()> {
        if !self.alignment_bytes.is_power_of_two() || self.alignment_bytes > MAX_ALIGN {
            return Err(Error::InvalidAlignment {
                align_bytes: self.alignment_bytes,
                max_align_bytes: MAX_ALIGN,
            });
        }
        if self.capacity_bytes == 0 || self.capacity_bytes % self.alignment_bytes != 0 {
            return Err(Error::InvalidInput {
                input: "config",
                reason: format!(
                    "capacity {} B must be non-zero and a multiple of the alignment {} B",
                    self.capacity_bytes, self.alignment_bytes
                ),
            });
        }
        // Live blocks' sizes add up to at most the region plus the host
        // tier: keeping that sum in a u64 keeps every byte counter exact.
        if self
            .capacity_bytes
            .checked_add(self.spill_host_bytes)
            .is_none()
        {
            return Err(Error::InvalidInput {
                input: "config",
                reason: format!(
                    "capacity {} B plus host tier {} B exceed u64::MAX B",
                    self.capacity_bytes, self.spill_host_bytes
                ),
            });
        }
        Ok(())
    }
}
