//! Arena configuration: public fields, `Default`, and `with_*` builders.

use crate::error::{Error, Result};

/// Largest alignment an allocation may ask for (1 GiB): [`ArenaConfig::MAX_ALIGN`].
pub(crate) const MAX_ALIGN: u64 = 1 << 30;

/// When the arena compacts on its own, and what it promises about the
/// bytes it moves against *naive* compact-on-failure (the same
/// segregated-fit placement, one full compaction when a request fits in no
/// hole). The guarantees and their proofs: [`policies`](crate::policies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompactionPolicy {
    /// Never move a block unless [`crate::Arena::compact`] is called; an
    /// allocation that fits in no hole fails (a plain non-moving
    /// segregated-fit allocator).
    Manual,
    /// Compacts when a request fits in the free bytes but in no hole, and
    /// never moves more bytes than naive on the same requests, at every
    /// point of every program naive serves, with no additive constant;
    /// where a non-moving segregated fit serves every request, it moves
    /// nothing. It keeps naive's layout and defers naive's moves until
    /// something needs their bytes out of the way. The strict option: it
    /// rarely moves much less than naive.
    Auto,
    /// The default. Compacts when a request fits in the free bytes but in
    /// no hole, with cheap targeted plans while a potential allows them
    /// and naive's layout when it does not: at every point of every
    /// program naive serves, without pins, it has moved at most naive's
    /// bytes plus twice the peak live bytes so far; it serves every
    /// request naive serves; where a non-moving segregated fit serves
    /// every request, it moves nothing. On recorded traces it moves a
    /// fraction of naive's bytes (BENCHMARKS.md, "Bytes moved against
    /// naive").
    #[default]
    Bounded,
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
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self {
            capacity_bytes: 64 << 20,
            alignment_bytes: 256,
            compaction: CompactionPolicy::Bounded,
            spill_host_bytes: 0,
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
