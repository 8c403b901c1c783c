//! Handles: the only way a user names a tensor.
//!
//! A [`Handle`] is a generational slot key plus the id of the arena that
//! issued it. It never caches an offset: the offset lives in one place, the
//! arena's placement index, and changes when compaction moves the block.
//! A freed handle, a handle whose slot was reused, and a handle from another
//! arena are all detected and rejected.

use crate::dtype::DType;

/// Slot key of a block in its arena's table (generational; see
/// [`crate::slots`] for the encoding kernels rely on).
pub(crate) type BlockKey = crate::slots::SlotKey;

/// A tensor in an arena. Cheap to copy; meaningless to any other arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle {
    pub(crate) key: BlockKey,
    pub(crate) arena: u64,
}

impl Handle {
    /// The handle as a `u64`, `version << 32 | slot`, for passing a handle
    /// through FFI or into a kernel. This encoding is the crate's device ABI
    /// (`kernels/cuarena.cuh`): live versions are odd, a free slot reads as
    /// version 0. See [`Handle::from_bits`].
    pub fn to_bits(self) -> u64 {
        self.key.to_bits()
    }

    /// Rebuilds a handle of arena `arena_id` from [`Handle::to_bits`]. A
    /// forged or stale value is rejected by the arena when used.
    pub fn from_bits(bits: u64, arena_id: u64) -> Self {
        Self {
            key: BlockKey::from_bits(bits),
            arena: arena_id,
        }
    }

    /// Id of the arena that issued the handle.
    pub fn arena_id(self) -> u64 {
        self.arena
    }
}

/// What the arena knows about a live block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlockInfo {
    /// The block's handle.
    pub handle: Handle,
    /// Current offset in the region: valid until the next compaction
    /// unless the block is pinned; 0 while the block is spilled.
    pub offset: u64,
    /// False while the block is spilled to the host tier.
    pub resident: bool,
    /// Bytes asked for.
    pub size_bytes: u64,
    /// Bytes reserved (the size rounded up to the arena's alignment).
    pub reserved_bytes: u64,
    /// Alignment of the offset.
    pub align_bytes: u64,
    /// The dtype it was allocated for (`None`: untyped bytes).
    pub dtype: Option<DType>,
    /// Outstanding pins.
    pub pins: u32,
}

/// One slot of the handle table that kernels read to resolve handles on the
/// device (`kernels/cuarena.cuh`): the block's current offset in the region
/// and the slot's version. A handle's bits are `version << 32 | slot`, so a
/// kernel resolves `base + table[bits as u32].offset`, and the checked
/// variant compares `table[..].version` with `bits >> 32`. Live versions are
/// odd; a free slot has version 0, so a stale handle never matches.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct TableEntry {
    /// Offset of the block in the region.
    pub offset: u64,
    /// Version of the live handle in this slot; 0 when the slot is free.
    pub version: u32,
    /// Bytes of the block, saturated to `u32::MAX` (for checked resolves).
    pub len: u32,
}
