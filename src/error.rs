//! The crate's one error type.
//!
//! Every variant names what was asked and what was available, in bytes, so a
//! caller can decide what to do: retry after freeing, compact, shrink a batch.
//! Every fallible call that returns an error leaves the arena exactly as it
//! was before the call (the poisoned state is the one exception: it is
//! reported by every later call).

/// `Result` with [`Error`] as its default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in cuarena.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A zero-byte allocation was asked for; every block has at least one byte.
    #[error("zero-sized allocation requested (a block must hold at least 1 byte)")]
    ZeroSize,

    /// The alignment is not a power of two, or is above the arena's maximum.
    #[error("alignment {align_bytes} B is not a power of two in 1..={max_align_bytes}")]
    InvalidAlignment {
        /// Alignment asked for.
        align_bytes: u64,
        /// Largest alignment the arena supports.
        max_align_bytes: u64,
    },

    /// Rounding the size up to the alignment overflows `u64`.
    #[error("size {requested_bytes} B rounded up to {align_bytes} B overflows u64")]
    SizeOverflow {
        /// Size asked for.
        requested_bytes: u64,
        /// Alignment it was rounded to.
        align_bytes: u64,
    },

    /// The request can never fit: it is larger than the whole arena.
    #[error("request of {requested_bytes} B exceeds the arena's capacity of {capacity_bytes} B")]
    TooLarge {
        /// Bytes asked for, rounded up to the alignment.
        requested_bytes: u64,
        /// The arena's capacity.
        capacity_bytes: u64,
    },

    /// Not now: the live blocks leave no room for the request, even after
    /// compaction. Freeing blocks (or unpinning them) can make it fit.
    #[error(
        "out of memory: requested {requested_bytes} B, free {free_bytes} B, \
         largest free hole {largest_free_bytes} B, largest hole compaction can reach {reachable_bytes} B"
    )]
    OutOfMemory {
        /// Bytes asked for, rounded up to the alignment.
        requested_bytes: u64,
        /// Free bytes in the arena.
        free_bytes: u64,
        /// Largest contiguous free region now.
        largest_free_bytes: u64,
        /// Largest hole, at the request's alignment, that the arena's
        /// compactions make for it: the full compaction's (blocks packed in
        /// address order, or by alignment where that pads less and can be
        /// staged) and, with pins and a compacting policy, the gap
        /// packing's (one gap between pinned blocks emptied into the others). Under a compacting policy
        /// a request of this many bytes succeeds (a manual arena's reach is
        /// the full compaction's, run by `compact`). Less than `free_bytes` when pinned blocks split
        /// the free space or alignment padding remains (two blocks aligned
        /// to half the region can leave no hole larger than half of it).
        reachable_bytes: u64,
    },

    /// The handle was freed, or its slot was reused by a newer allocation.
    #[error("stale handle: it was freed (or never belonged to a live block)")]
    StaleHandle,

    /// The handle belongs to another arena.
    #[error("handle belongs to arena #{handle_arena}, not to this arena #{arena}")]
    ForeignHandle {
        /// Id of the arena the handle came from.
        handle_arena: u64,
        /// Id of the arena it was given to.
        arena: u64,
    },

    /// The block is spilled to the host tier; bring it back with
    /// [`crate::Arena::make_resident`] or
    /// [`crate::SharedArena::make_resident`] before taking a view or
    /// pointer (`SharedArena`'s reads and `with_kernel_args` do it).
    #[error("block is spilled to host memory: bring it back with make_resident (Arena or SharedArena) first")]
    NotResident,

    /// Spilling cannot make room: the host tier is full. Nothing was
    /// spilled for the request that failed.
    #[error(
        "cannot spill {needed_bytes} B to make room for {requested_bytes} B: \
         host tier of {host_tier_bytes} B has {host_free_bytes} B free (largest hole {host_largest_free_bytes} B)"
    )]
    HostTierFull {
        /// Bytes of the request that needed room.
        requested_bytes: u64,
        /// Bytes the evictions the request needed would take in the tier
        /// (the blocks to spill, together, up to the one that found no room).
        needed_bytes: u64,
        /// Size of the host tier.
        host_tier_bytes: u64,
        /// Free bytes in it.
        host_free_bytes: u64,
        /// Largest free region in it.
        host_largest_free_bytes: u64,
    },

    /// The tensors needed at once do not fit on the device together, even
    /// with everything else spilled.
    #[error(
        "{needed_bytes} B are needed on the device at once (pinned or in use by this request), \
         more than the largest hole of {reachable_bytes} B the region can offer"
    )]
    WorkingSetTooLarge {
        /// Bytes that must be resident together.
        needed_bytes: u64,
        /// Largest hole the region could offer with everything else spilled.
        reachable_bytes: u64,
    },

    /// A pinned block cannot be freed; unpin it first.
    #[error("block is pinned ({pins} pin(s) outstanding); unpin before freeing")]
    Pinned {
        /// Outstanding pins.
        pins: u32,
    },

    /// `unpin` on a block that holds no pin.
    #[error("block is not pinned")]
    NotPinned,

    /// A host slice does not match the block's length.
    #[error("length mismatch: block holds {block_bytes} B, host slice has {slice_bytes} B")]
    LengthMismatch {
        /// Bytes of the block (its requested size).
        block_bytes: u64,
        /// Bytes of the host slice.
        slice_bytes: u64,
    },

    /// A typed access (or a copy) whose element type is not the range's
    /// dtype. Byte-level calls (`read_bytes`, `write_bytes`) take any
    /// range; `as_dtype` reinterprets one.
    #[error("dtype mismatch: the range holds {block_type}, the access asked for {requested_type} (read or write its bytes, or reinterpret it with as_dtype)")]
    TypeMismatch {
        /// The range's dtype (its block's, unless reinterpreted).
        block_type: &'static str,
        /// The dtype of the access.
        requested_type: &'static str,
    },

    /// An element count whose bytes overflow `u64`.
    #[error("{numel} elements of {elem_bytes} B overflow u64")]
    ElemCountOverflow {
        /// Elements asked for.
        numel: u64,
        /// Bytes per element.
        elem_bytes: u64,
    },

    /// A typed access, or a reinterpretation, of a range whose bytes are
    /// not a whole number of elements.
    #[error("range of {block_bytes} B is not a whole number of {elem_bytes}-byte elements")]
    NotWholeElements {
        /// Bytes of the range.
        block_bytes: u64,
        /// Size of one element.
        elem_bytes: u64,
    },

    /// A kernel's output views would alias: one block named twice among
    /// the outputs, or as both an input and an output.
    #[error("output view {output} names a block that is also another output or an input (a block may be written through one view only)")]
    AliasedViews {
        /// Index of the offending output handle.
        output: usize,
    },

    /// A typed view, or a reinterpretation, at an offset not aligned for
    /// the type (a block allocated with an alignment below the element's,
    /// or a slice starting inside an element).
    #[error(
        "offset {offset} B is not aligned for {requested_type} ({elem_align_bytes}-byte alignment)"
    )]
    MisalignedView {
        /// The offset: in the region for a view, in the storage for a slice.
        offset: u64,
        /// The view's element type.
        requested_type: &'static str,
        /// Alignment the type needs.
        elem_align_bytes: u64,
    },

    /// A byte range outside the arena's region (a backend bounds check).
    #[error("range {offset}..{offset}+{len} is outside the region of {capacity_bytes} B")]
    OutOfBounds {
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// Size of the region.
        capacity_bytes: u64,
    },

    /// A pin on a block that already holds `u32::MAX` pins.
    #[error("block already holds {pins} pins, the most a block can hold")]
    PinOverflow {
        /// Pins the block holds.
        pins: u32,
    },

    /// Spilling was asked of a backend that has no host tier (or of an
    /// arena whose `spill_host_bytes` is 0).
    #[error("no host tier: {requested_bytes} B asked of a backend without one")]
    NoHostTier {
        /// Bytes asked of the host tier.
        requested_bytes: u64,
    },

    /// The backend's region is smaller than the configured capacity.
    #[error("backend region of {backend_bytes} B is smaller than the configured capacity of {capacity_bytes} B")]
    BackendTooSmall {
        /// Bytes of the backend's region.
        backend_bytes: u64,
        /// Capacity the config asks for.
        capacity_bytes: u64,
    },

    /// Host memory for `what` could not be allocated (the request exceeds
    /// what this machine's allocator can give). Nothing was changed.
    #[error("cannot allocate {requested_bytes} B of host memory for {what}")]
    HostMemory {
        /// Bytes asked for.
        requested_bytes: u64,
        /// What they were for (region, host tier, read buffer, ...).
        what: &'static str,
    },

    /// A size does not fit in this machine's address space (`usize`).
    #[error("{requested_bytes} B exceed this machine's address space of {max_bytes} B")]
    ExceedsAddressSpace {
        /// Bytes asked for.
        requested_bytes: u64,
        /// Largest size the address space can hold (`usize::MAX`).
        max_bytes: u64,
    },

    /// The handle table would need more slots than a table can hold.
    #[error("a handle table of {requested_slots} slots exceeds the largest possible table of {max_slots} slots")]
    TableOverflow {
        /// Slots asked for.
        requested_slots: u64,
        /// Most slots a table can hold.
        max_slots: u64,
    },

    /// A CUDA graph capture recorded no work.
    #[error("the graph capture recorded no work")]
    EmptyCapture,

    /// A captured graph can no longer run: the handle table's device buffer
    /// (or the region) moved since the capture, because the table grew.
    #[error(
        "the handle table's device buffer moved since this graph was captured \
         (it grew past the {reserved_slots} slots it held then, for {slots_in_use} in use now); \
         reserve_handle_table for the most blocks live at once, then capture again"
    )]
    TableMoved {
        /// Slots the table held at capture.
        reserved_slots: usize,
        /// Slots in use now.
        slots_in_use: usize,
    },

    /// The CUDA region would hold no bytes: the device's free memory times
    /// the fraction asked for rounds down to 0.
    #[error("a region of {requested_bytes} B (of {free_device_bytes} B free on the device, rounded down to a multiple of {multiple_of_bytes} B) holds nothing")]
    EmptyRegion {
        /// Bytes the fraction came to, before rounding.
        requested_bytes: u64,
        /// Free device memory reported by the driver.
        free_device_bytes: u64,
        /// The multiple the capacity is rounded down to.
        multiple_of_bytes: u64,
    },

    /// A placement allocation given to an index that
    /// did not make it, or made before the index was rebuilt.
    #[error("allocation at offset {offset} does not belong to this index (another index, or one since rebuilt)")]
    ForeignAllocation {
        /// The allocation's offset.
        offset: u64,
    },

    /// A layout given to the placement index or the planner breaks its rules
    /// (blocks out of order, overlapping, empty, out of bounds, misaligned).
    #[error("invalid layout: {reason}")]
    InvalidLayout {
        /// Which rule, and which blocks.
        reason: String,
    },

    /// A compaction plan breaks the wave rule (see [`crate::plan::Plan`]).
    #[error("invalid plan: {reason}")]
    InvalidPlan {
        /// Which rule, and which moves.
        reason: String,
    },

    /// The configuration is inconsistent (an arena's capacity or
    /// alignment, a backend's options): fix the values passed.
    #[error("invalid config: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },

    /// No usable CUDA driver or device.
    #[error("no CUDA device: {reason}")]
    NoDevice {
        /// Why (no driver library, no device, bad ordinal).
        reason: String,
    },

    /// A CUDA driver call failed. The driver's result code is kept in
    /// `source` ([`DriverError::code`], [`DriverError::is_out_of_memory`]).
    #[error("CUDA driver call {call} failed: {source}")]
    Driver {
        /// The driver call (or cudarc method) that failed.
        call: &'static str,
        /// The driver's error, with its result code.
        #[source]
        source: DriverError,
    },

    /// The device reported a fault while running the arena's own kernels
    /// (for example the move kernel's watchdog: a tile waited too long for
    /// an earlier one). Not a failed driver call; the region's contents
    /// are undefined and the arena is poisoned.
    #[error("device fault: {reason}")]
    DeviceFault {
        /// What the device reported.
        reason: String,
    },

    /// A stream that cannot be registered with this arena: it belongs to
    /// another CUDA context (events order streams of one context only).
    #[error("stream refused: {reason}")]
    ForeignStream {
        /// Why (the two contexts).
        reason: String,
    },

    /// A stream id that was not registered with this arena.
    #[error("stream #{stream} is not registered with this arena ({registered} streams are, #0 being the arena's own)")]
    UnknownStream {
        /// The id given.
        stream: u32,
        /// Streams registered.
        registered: u32,
    },

    /// A byte range of a storage or block that reaches past its end.
    #[error("range of {len_bytes} B at offset {offset_bytes} B reaches past the {available_bytes} B available")]
    RangeOutOfBounds {
        /// Start of the range asked for, in bytes.
        offset_bytes: u64,
        /// Bytes asked for.
        len_bytes: u64,
        /// Bytes of the storage, slice or block it was asked of.
        available_bytes: u64,
    },

    /// A range `start..end` with `end < start`.
    #[error("range {start}..{end} ends before it starts")]
    ReversedRange {
        /// Start asked for.
        start: u64,
        /// End asked for.
        end: u64,
    },

    /// A copy whose source and destination overlap (in one block).
    #[error(
        "copy of {len_bytes} B from region offset {src_offset} to {dst_offset}: the ranges overlap"
    )]
    OverlappingRanges {
        /// Region offset of the source.
        src_offset: u64,
        /// Region offset of the destination.
        dst_offset: u64,
        /// Bytes of the copy.
        len_bytes: u64,
    },

    /// A fill pattern that is not 1, 2, 4, 8 or 16 bytes, or a length that
    /// is not a whole number of patterns.
    #[error("fill pattern of {pattern_bytes} B over {len_bytes} B: the pattern must be 1, 2, 4, 8 or 16 B and divide the length")]
    InvalidPattern {
        /// Bytes of the pattern.
        pattern_bytes: u64,
        /// Bytes to fill.
        len_bytes: u64,
    },

    /// An NCCL call failed, or peers did not answer within the
    /// communicator's timeout (the communicator was then aborted, and the
    /// reason says so). Feature `nccl`.
    #[error("NCCL {call}: {reason}")]
    Nccl {
        /// The NCCL call (or step) that failed.
        call: &'static str,
        /// NCCL's result, or what timed out.
        reason: String,
    },

    /// NVRTC could not compile a kernel from `kernels/`.
    #[error("NVRTC failed to compile {source_name}: {log}")]
    Nvrtc {
        /// The kernel source file.
        source_name: &'static str,
        /// The compiler's log.
        log: String,
    },

    /// A `SharedArena` call made while this thread holds an arena's lock
    /// (inside [`crate::SharedArena::with`] or
    /// [`with_mut`](crate::SharedArena::with_mut)) that could deadlock:
    /// the same arena again, or one taken out of order (a thread holding
    /// several takes them in increasing id order). Nothing was done.
    #[error(
        "SharedArena::{call} on arena #{arena} from a thread that holds arena #{held}'s lock: \
         inside with/with_mut use the Arena given to the closure \
         (a nested call may only take an arena of higher id)"
    )]
    Reentrant {
        /// The call that was refused.
        call: &'static str,
        /// Id of the arena it was made on.
        arena: u64,
        /// Id of the arena whose lock this thread holds (the highest).
        held: u64,
    },

    /// A fixed limit was reached: arena ids in this process, or streams
    /// registered with one arena. Nothing was changed.
    #[error("no more {what}: all {limit} are in use")]
    LimitReached {
        /// What ran out.
        what: &'static str,
        /// How many there can be.
        limit: u64,
    },

    /// An earlier failure left device memory and the arena's table in
    /// disagreement; the arena refuses all further work.
    #[error("arena is unusable after an earlier failure: {reason}")]
    Poisoned {
        /// The failure that poisoned it.
        reason: String,
    },
}

/// A CUDA driver error: the `CUresult` code and its name, without a
/// dependency on the driver bindings (the core builds without them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverError {
    code: u32,
    name: String,
}

impl DriverError {
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub const OUT_OF_MEMORY: u32 = 2;

    /// An error of driver result `code`, named `name` (for example
    /// `CUDA_ERROR_OUT_OF_MEMORY`).
    pub fn new(code: u32, name: impl Into<String>) -> Self {
        Self {
            code,
            name: name.into(),
        }
    }

    /// The driver's result code (`CUresult`).
    pub fn code(&self) -> u32 {
        self.code
    }

    /// The result code's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True for `CUDA_ERROR_OUT_OF_MEMORY`: the device could not provide
    /// the memory (make the region smaller, or free memory elsewhere).
    pub fn is_out_of_memory(&self) -> bool {
        self.code == Self::OUT_OF_MEMORY
    }
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (CUresult {})", self.name, self.code)
    }
}

impl std::error::Error for DriverError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_errors_keep_their_code_as_source() {
        let e = Error::Driver {
            call: "cuMemAlloc",
            source: DriverError::new(DriverError::OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"),
        };
        let src = std::error::Error::source(&e).expect("source");
        assert!(src.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"));
        assert!(e.to_string().contains("cuMemAlloc"));
        match e {
            Error::Driver { source, .. } => {
                assert!(source.is_out_of_memory());
                assert_eq!(source.code(), 2);
                assert_eq!(source.name(), "CUDA_ERROR_OUT_OF_MEMORY");
            }
            _ => unreachable!(),
        }
        assert!(!DriverError::new(1, "CUDA_ERROR_INVALID_VALUE").is_out_of_memory());
    }
}
