//! Where a new or returning block goes: the compaction policy's answer
//! (a hole, or what it does when there is none), else, with spilling on,
//! evictions of the least recently used blocks.

use super::Arena;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::handle::BlockKey;
use crate::placement::Allocation;

impl<B: Backend> Arena<B> {
    /// Space for `reserved` bytes at `align` in the region, free of bytes:
    /// the policy's placement, else (spilling on) evictions of least
    /// recently used blocks not in `keep`. A request that fails is counted.
    pub(super) fn place_on_device(
        &mut self,
        reserved: u64,
        align: u64,
        keep: &[BlockKey],
    ) -> Result<Allocation> {
        // An elastic arena maps more first if its rule says so.
        self.make_room(reserved, align)?;
        let placed = match self.policy.place(
            &mut self.core,
            crate::plan::planner::Request {
                size: reserved,
                align,
            },
        ) {
            Err(Error::OutOfMemory { .. }) if self.tier.is_some() => {
                // Evictions plan on the real layout.
                self.policy.settle(&mut self.core)?;
                self.alloc_by_spilling(reserved, align, keep)
            }
            r => r,
        };
        if matches!(placed, Err(Error::OutOfMemory { .. })) && self.tier.is_none() {
            self.core.counters.failed_allocs += 1;
        }
        placed
    }
}
