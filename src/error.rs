//! The arena's errors: [`Error`], for what callers act on, with the
//! backend's own failures nested in [`BackendError`]. The placement index
//! and the planner have small error types of their own, which the arena
//! turns into these (their failures are the arena's bugs: it poisons
//! itself).
//!
//! Every variant names what was asked and what was available, in bytes, so
//! a caller can decide what to do: retry after freeing, compact, shrink a
//! batch ([`Error::is_out_of_memory`], [`Error::is_retryable`]). Every
//! fallible call that returns an error leaves the arena exactly as it was
//! before the call (the poisoned state is the one exception: it is
//! reported by every later call).

/// `Result` with [`Error`] as its default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in an arena call.
///
/// Grouped by what the caller does about it: arguments to fix (a size, an
/// alignment, a range, a dtype, an input that breaks a rule), handles and
/// streams of the wrong arena or no longer live, capacity (device, host
/// tier, host memory, fixed limits), residency and state (spilled, pinned,
/// a graph's table, a re-entrant call, poisoning), and the backend's own
/// failures ([`Error::Backend`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- arguments: fix the call --------------------------------------------
    /// A zero-byte allocation was asked for; every block has at least one
    /// byte (an owned storage of 0 bytes is fine: it holds no block).
    #[error("zero-sized allocation requested (a block must hold at least 1 byte)")]
    ZeroSize,

    /// An alignment that is not a power of two, or is above the largest
    /// ([`ArenaConfig::MAX_ALIGN`](crate::ArenaConfig::MAX_ALIGN)): of an
    /// allocation or of the arena's configuration.
    #[error("alignment {align_bytes} B is not a power of two in 1..={max_align_bytes}")]
    InvalidAlignment {
        /// Alignment asked for.
        align_bytes: u64,
        /// Largest alignment the arena supports.
        max_align_bytes: u64,
    },

    /// An input that breaks its rules: an arena's configuration (capacity
    /// 0 or not a multiple of the alignment, a backend smaller than it),
    /// the CUDA backend's options or capacity, a compaction plan that
    /// breaks the wave rule (see [`crate::plan`]), an NCCL unique id.
    /// Nothing was changed.
    #[error("invalid {input}: {reason}")]
    InvalidInput {
        /// What was invalid (`"config"`, `"plan"`, `"CUDA options"`, ...).
        input: &'static str,
        /// Which rule it breaks, with the values given.
        reason: String,
    },

    /// A host slice (or a copy's source) whose length is not the range's.
    #[error("length mismatch: the range holds {range_bytes} B, {given_bytes} B were given")]
    LengthMismatch {
        /// Bytes of the range (of a block, a storage or a slice; a copy's
        /// destination).
        range_bytes: u64,
        /// Bytes given (the host slice, or a copy's source).
        given_bytes: u64,
    },

    /// A typed access (or a copy) whose element type is not the range's
    /// dtype. Byte-level calls (`read_bytes`, `write_bytes`) take any
    /// range; `as_dtype` reinterprets one.
    #[error(
        "dtype mismatch: the range holds {range_type}, the access asked for {requested_type} \
         (read or write its bytes, or reinterpret it with as_dtype)"
    )]
    TypeMismatch {
        /// The range's dtype (its block's, unless reinterpreted).
        range_type: &'static str,
        /// The dtype of the access.
        requested_type: &'static str,
    },

    /// A range that is not a whole number of elements of a type at an
    /// offset aligned for it: a typed access or a reinterpretation of a
    /// range that ends or starts inside an element, a view of a block
    /// placed below the type's alignment, or a fill pattern of other than
    /// 1, 2, 4, 8 or 16 bytes (or not dividing the range).
    #[error(
        "range of {len_bytes} B at offset {offset_bytes} B is not whole {elem_bytes}-byte \
         elements of {elem_type} at an aligned offset"
    )]
    Misaligned {
        /// Where the range starts: in the region for a view, in its block
        /// or storage otherwise.
        offset_bytes: u64,
        /// Bytes of the range.
        len_bytes: u64,
        /// The element type (or `fill pattern`).
        elem_type: &'static str,
        /// Bytes of one element, which is also its alignment.
        elem_bytes: u64,
    },

    /// A byte range that reaches past the end of what it is taken from (a
    /// block, a storage, a slice, a backend's region), or that ends before
    /// it starts (`start_bytes > end_bytes`: a slice `3..2`).
    #[error("{}", out_of_bounds(*start_bytes, *end_bytes, *available_bytes))]
    OutOfBounds {
        /// Start of the range asked for, in bytes.
        start_bytes: u64,
        /// End of the range asked for, in bytes (exclusive; `u64::MAX` when
        /// start plus length overflows).
        end_bytes: u64,
        /// Bytes of what it was asked of.
        available_bytes: u64,
    },

    /// Two ranges that must not overlap do: a copy's source and
    /// destination in one block, or a kernel's output view and another
    /// view of the same kernel arguments.
    #[error(
        "ranges of {first_bytes} B at {first_offset} B and {second_bytes} B at {second_offset} B \
         overlap (a copy's source and destination, or a kernel's output and another of its views)"
    )]
    Overlap {
        /// Offset of the first range (a copy's source, the earlier view),
        /// in its block for a copy, in the region for views.
        first_offset: u64,
        /// Bytes of the first range.
        first_bytes: u64,
        /// Offset of the second range (a copy's destination, the output).
        second_offset: u64,
        /// Bytes of the second range.
        second_bytes: u64,
    },

    // ---- handles and streams ---------------------------------------------------
    /// The handle was freed, or its slot was reused by a newer allocation.
    #[error("stale handle: it was freed (or never belonged to a live block)")]
    StaleHandle,

    /// A handle, a stream id or a graph of another arena.
    #[error("{kind} belongs to arena #{owner}, not to this arena #{arena}")]
    Foreign {
        /// What was given (`"handle"`, `"stream"`, `"graph"`).
        kind: &'static str,
        /// Id of the arena it belongs to.
        owner: u64,
        /// Id of the arena it was given to.
        arena: u64,
    },

    /// A stream id that is not registered with this arena (or a backend).
    #[error(
        "stream #{stream} is not registered ({registered} streams are, #0 being the arena's own)"
    )]
    UnknownStream {
        /// The id's index.
        stream: u32,
        /// Streams registered.
        registered: u32,
    },

    // ---- capacity --------------------------------------------------------------
    /// The request can never fit: it is larger than the whole arena.
    #[error("request of {requested_bytes} B exceeds the arena's capacity of {capacity_bytes} B")]
    TooLarge {
        /// Bytes asked for, rounded up to the arena's alignment (as asked
        /// when the rounded size would not fit in `u64`).
        requested_bytes: u64,
        /// The arena's capacity.
        capacity_bytes: u64,
    },

    /// Not now: the live blocks leave no room for the request, even after
    /// compaction (and, with spilling, after spilling everything that may
    /// be spilled). Freeing blocks (or unpinning them) can make it fit.
    #[error(
        "out of memory: requested {requested_bytes} B, free {free_bytes} B, \
         largest free hole {largest_free_bytes} B, largest hole compaction can reach {reachable_bytes} B"
    )]
    OutOfMemory {
        /// Bytes asked for, rounded up to the alignment. With spilling on,
        /// everything that must be resident at once for the call: the
        /// blocks asked for and those pinned or kept by it.
        requested_bytes: u64,
        /// Free bytes in the region.
        free_bytes: u64,
        /// Largest contiguous free region now.
        largest_free_bytes: u64,
        /// Largest hole, at the request's alignment, that the arena's
        /// compactions make for it (with spilling, with everything else
        /// spilled): the full compaction's (blocks packed in address order,
        /// or by alignment where that pads less and can be staged) and,
        /// with pins and a compacting policy, the gap packing's (one gap
        /// between pinned blocks emptied into the others). Under a
        /// compacting policy a request of this many bytes succeeds (a
        /// manual arena's reach is the full compaction's, run by
        /// `compact`). Less than `free_bytes` when pinned blocks split the
        /// free space or alignment padding remains.
        reachable_bytes: u64,
    },

    /// Spilling cannot make room: the host tier is full, or there is none
    /// (`host_tier_bytes` 0: an arena without `spill_host_bytes`, a backend
    /// without a tier). Nothing was spilled for the request that failed.
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

    /// Host memory for `what` could not be allocated (the request exceeds
    /// what this machine's allocator can give). Nothing was changed.
    #[error("cannot allocate {requested_bytes} B of host memory for {what}")]
    HostMemory {
        /// Bytes asked for.
        requested_bytes: u64,
        /// What they were for (region, host tier, read buffer, ...).
        what: &'static str,
    },

    /// A fixed limit: arena ids in this process, streams of one arena,
    /// pins of one block, handle-table slots, elements of one allocation
    /// (their bytes must fit in `u64`), bytes of one host buffer (the
    /// address space). Nothing was changed.
    #[error("{what}: {requested} asked for, at most {limit}")]
    LimitReached {
        /// What is limited.
        what: &'static str,
        /// How many the call needed.
        requested: u64,
        /// How many there can be.
        limit: u64,
    },

    // ---- residency and state ----------------------------------------------------
    /// The block is spilled to the host tier; bring it back with
    /// [`crate::Arena::make_resident`] or
    /// [`crate::SharedArena::make_resident`] before reading it, resolving
    /// it or taking a view (`SharedArena`'s reads and `with_kernel_args` do
    /// it themselves).
    #[error("block is spilled to host memory: bring it back with make_resident (Arena or SharedArena) first")]
    NotResident,

    /// A pin state that forbids the call: freeing a block that holds pins
    /// (`pins > 0`: unpin it first), or unpinning one that holds none
    /// (`pins == 0`).
    #[error("block holds {pins} pin(s): free needs none, unpin needs one")]
    Pinned {
        /// Pins the block holds.
        pins: u32,
    },

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

    /// An earlier failure left device memory and the arena's table in
    /// disagreement (a device fault, a compaction that failed part-way);
    /// the arena refuses all further work.
    #[error("arena is unusable after an earlier failure: {reason}")]
    Poisoned {
        /// The failure that poisoned it.
        reason: String,
    },

    // ---- the backend ------------------------------------------------------------
    /// The backend failed: the CUDA driver, NVRTC, NCCL, or a fault the
    /// device reported (which poisons the arena).
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// The message of [`Error::OutOfBounds`]: reversed, or past the end.
fn out_of_bounds(start: u64, end: u64, available: u64) -> String {
    if end < start {
        format!("range {start}..{end} (bytes) ends before it starts")
    } else {
        format!("range {start}..{end} (bytes) reaches past the {available} B available")
    }
}

/// `CUDA_ERROR_OUT_OF_MEMORY`, the driver's result code for memory it
/// could not provide.
const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;

impl Error {
    /// True when memory could not be provided: the request never fits
    /// ([`TooLarge`](Error::TooLarge)), does not fit now
    /// ([`OutOfMemory`](Error::OutOfMemory),
    /// [`HostTierFull`](Error::HostTierFull)), host memory ran out
    /// ([`HostMemory`](Error::HostMemory)), or the driver said so
    /// (`CUDA_ERROR_OUT_OF_MEMORY`). What a framework reports as its own
    /// out-of-memory error.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Error::TooLarge { .. }
            | Error::OutOfMemory { .. }
            | Error::HostTierFull { .. }
            | Error::HostMemory { .. } => true,
            Error::Backend(b) => b.is_out_of_memory(),
            _ => false,
        }
    }

    /// True when the same call can succeed later with the same arguments,
    /// once the state it met changes: memory that other work may free
    /// ([`OutOfMemory`](Error::OutOfMemory),
    /// [`HostTierFull`](Error::HostTierFull),
    /// [`HostMemory`](Error::HostMemory), the driver's out-of-memory), a
    /// spilled block to bring back ([`NotResident`](Error::NotResident)),
    /// a pin to release ([`Pinned`](Error::Pinned) with pins held), a call
    /// to make outside the closure that holds the lock
    /// ([`Reentrant`](Error::Reentrant)). False for arguments, stale or
    /// foreign handles, fixed limits, requests that never fit, poisoning
    /// and the backend's other failures.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::OutOfMemory { .. }
            | Error::HostTierFull { .. }
            | Error::HostMemory { .. }
            | Error::NotResident
            | Error::Reentrant { .. } => true,
            Error::Pinned { pins } => *pins > 0,
            Error::Backend(b) => b.is_out_of_memory(),
            _ => false,
        }
    }
}

/// A failure of the backend: the CUDA driver (with its `CUresult`), NVRTC,
/// NCCL, or a fault the device reported. Nested in [`Error::Backend`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// No usable CUDA driver or device (the host and metadata backends
    /// need none).
    #[error("no CUDA device: {reason}")]
    NoDevice {
        /// Why (no driver library, no device, a bad ordinal).
        reason: String,
    },

    /// A CUDA driver call failed with result `code` (`CUresult`), named
    /// `name` (for example `CUDA_ERROR_OUT_OF_MEMORY`: a region too large
    /// for the device's free memory).
    #[error("CUDA driver call {call} failed: {name} (CUresult {code})")]
    Driver {
        /// The driver call (or cudarc method) that failed.
        call: &'static str,
        /// The driver's result code.
        code: u32,
        /// The result code's name.
        name: String,
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

    /// NVRTC could not compile a kernel.
    #[error("NVRTC failed to compile {source_name}: {log}")]
    Nvrtc {
        /// The kernel source.
        source_name: &'static str,
        /// The compiler's log.
        log: String,
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

    /// A CUDA stream that cannot be registered with the arena: it belongs
    /// to another CUDA context (events order streams of one context only).
    #[error("stream refused: {reason}")]
    ForeignStream {
        /// Why (the two contexts and their devices).
        reason: String,
    },

    /// A CUDA graph capture recorded no work.
    #[error("the graph capture recorded no work")]
    EmptyCapture,
}

impl BackendError {
    /// True for the driver's `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, BackendError::Driver { code, .. } if *code == CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// The failure of driver call `call`, with cudarc's error's result code
    /// and name: for code that calls the driver beside the arena (kernels
    /// of its own, events) and reports through [`Error`].
    #[cfg(feature = "cuda")]
    pub fn driver(call: &'static str, e: cudarc::driver::DriverError) -> Self {
        BackendError::Driver {
            call,
            code: e.0 as u32,
            name: format!("{:?}", e.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_errors_keep_their_code() {
        let e = Error::from(BackendError::Driver {
            call: "cuMemAlloc",
            code: CUDA_ERROR_OUT_OF_MEMORY,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        });
        assert!(e.to_string().contains("cuMemAlloc"));
        assert!(e.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"));
        assert!(e.is_out_of_memory() && e.is_retryable());
        let other = Error::from(BackendError::Driver {
            call: "cuMemcpy",
            code: 1,
            name: "CUDA_ERROR_INVALID_VALUE".into(),
        });
        assert!(!other.is_out_of_memory() && !other.is_retryable());
    }
}
