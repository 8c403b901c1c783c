//! The placement index's own error type.

/// What the placement index refuses. The arena never gives it such input:
/// either is a bug there, which poisons the arena.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// An allocation of another index, or made before this one was rebuilt.
    #[error("allocation at offset {offset} does not belong to this index (another index, or one since rebuilt)")]
    ForeignAllocation {
        /// The allocation's offset.
        offset: u64,
    },
    /// A layout to rebuild from that breaks the index's rules (blocks out
    /// of order, overlapping, empty, out of bounds).
    #[error("invalid layout: {reason}")]
    InvalidLayout {
        /// Which rule, and which blocks.
        reason: String,
    },
}
