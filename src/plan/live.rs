//! A live block as the planners see it: their one input type, below
//! every planner so that each can name it.

/// A live block as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveBlock {
    /// Opaque identifier carried into the [`Move`](super::Move)s.
    pub key: u64,
    /// Current offset.
    pub offset: u64,
    /// Bytes the block occupies (its reservation).
    pub len: u64,
    /// Bytes that hold data and must be copied (`<= len`).
    pub copy_len: u64,
    /// Alignment its offset must keep (power of two).
    pub align: u64,
    /// Pinned blocks never move.
    pub pinned: bool,
}

impl LiveBlock {
    /// End of the block (exclusive); saturating, so a block that
    /// [`check_live`](super::planner::check_live) would refuse cannot wrap around.
    pub(crate) fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

#[cfg(test)]
impl LiveBlock {
    /// An unpinned block whose bytes all hold data (the tests' block).
    pub(crate) fn at(key: u64, offset: u64, len: u64, align: u64) -> Self {
        Self {
            key,
            offset,
            len,
            copy_len: len,
            align,
            pinned: false,
        }
    }
}
