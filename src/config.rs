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
    /// Bytes of the arena's region. In an elastic arena ([`Self::elastic`]),
    /// the limit its mapped memory may grow to (the virtual range it
    /// reserves); 0 there means the device's total memory (on the host and
    /// metadata backends, [`Self::ELASTIC_HOST_LIMIT`]).
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
    /// An elastic region: reserved, mapped in chunks only as the blocks
    /// need it, and given back by [`crate::Arena::trim`] and the automatic
    /// trim. Off (the default): all of `capacity_bytes` held from creation.
    pub elastic: bool,
    /// Elastic: the slack of mapped bytes over the live bytes (the largest
    /// of the trim window, and the request) that growth may leave before
    /// the arena compacts instead (a fraction; 0.01 by default). Growth
    /// never maps beyond `live + max(one granule, slack × live)`.
    pub elastic_slack: f64,
    /// Elastic: the automatic trim's window in microseconds of the
    /// backend's clock ([`crate::backend::Backend::now_us`]): mapped memory
    /// is kept near the largest live bytes of the last window. 0 turns the
    /// automatic trim off. Default 4 s: a shorter window gives memory back
    /// sooner, a longer one spares the moves of trimming what the
    /// workload's own cycle (a training step, a served request from its
    /// prefill to its last token) needs again; 4 s is the shortest of the
    /// windows measured (1, 2, 4 and 8 s) at which each of the 48
    /// recordings the arena was designed on meets the elastic checks
    /// (BENCHMARKS.md, "Choosing the window").
    pub trim_window_us: u64,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self {
            capacity_bytes: 64 << 20,
            alignment_bytes: 256,
            compaction: CompactionPolicy::Bounded,
            spill_host_bytes: 0,
            elastic: false,
            elastic_slack: 0.01,
            trim_window_us: 4_000_000,
        }
    }
}

impl ArenaConfig {
    /// Largest alignment an allocation (or the arena's own alignment) may
    /// ask for: 1 GiB.
    pub const MAX_ALIGN: u64 = MAX_ALIGN;

    /// The elastic limit of the host and metadata backends when none is
    /// given: 1 TiB (reserved, never held: memory is mapped as needed).
    pub const ELASTIC_HOST_LIMIT: u64 = 1 << 40;

    /// The limit of an elastic host or metadata arena: the capacity, or
    /// [`Self::ELASTIC_HOST_LIMIT`] where none is given.
    pub(crate) fn elastic_limit(&self) -> u64 {
        match self.capacity_bytes {
            0 => Self::ELASTIC_HOST_LIMIT,
            c => c,
        }
    }

    /// An elastic arena with no capacity to give: it maps memory as its
    /// blocks need it, up to the device's memory, and gives it back
    /// ([`crate::Arena::trim`]). [`with_capacity_bytes`](Self::with_capacity_bytes)
    /// sets a limit.
    pub fn elastic() -> Self {
        Self {
            capacity_bytes: 0,
            elastic: true,
            ..Self::default()
        }
    }

    /// Sets the elastic slack (see [`Self::elastic_slack`]).
    pub fn with_elastic_slack(mut self, slack: f64) -> Self {
        self.elastic_slack = slack;
        self
    }

    /// Sets the automatic trim's window (0: off).
    pub fn with_trim_window_us(mut self, window_us: u64) -> Self {
        self.trim_window_us = window_us;
        self
    }

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
        if !(0.0..=1.0).contains(&self.elastic_slack) {
            return Err(Error::InvalidInput {
                input: "config",
                reason: format!(
                    "the elastic slack {} must lie in [0, 1]",
                    self.elastic_slack
                ),
            });
        }
        let zero_ok = self.elastic && self.capacity_bytes == 0;
        if (self.capacity_bytes == 0 && !zero_ok) || self.capacity_bytes % self.alignment_bytes != 0
        {
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
