//! Backends: where the arena's bytes live and how a plan's moves run.
//!
//! The trait is deliberately narrow: bounds-checked byte transfers and plan
//! execution. Placement, planning and the handle table stay in the arena,
//! so every backend executes the same [`Plan`] value.
//!
//! - [`HostBackend`]: plain host memory, strict enough to catch a wrong plan.
//! - [`MetaBackend`]: stores no bytes; placement and planning run, moves are
//!   only counted (replays of traces larger than this machine's memory).
//! - `CudaBackend` (feature `cuda`): one device allocation, moves run by our
//!   own NVRTC-compiled kernels.
//! - [`AnyBackend`]: the host or the CUDA backend, chosen at run time (one
//!   arena type for both).

mod any;
mod host;
mod meta;

// The one module that talks to the driver, and the only one allowed `unsafe`.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod cuda;

pub use crate::handle::TableEntry;
pub use any::{AnyBackend, AnyStream};
pub use host::HostBackend;
pub use meta::MetaBackend;

use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::stream::StreamId;

/// Storage for one arena's region.
///
/// Every method checks that ranges lie inside the region and returns
/// [`Error::OutOfBounds`] otherwise; none may panic on any input. Failures
/// of the device itself are [`Error::Backend`].
pub trait Backend {
    /// What registers as a stream ([`crate::Arena::register_stream`]): a
    /// CUDA stream on the CUDA backend; `()` on backends whose work is
    /// synchronous, where a stream is an id only.
    type Stream;

    /// Bytes of the region.
    fn capacity_bytes(&self) -> u64;

    /// False for a backend that keeps no bytes (reads return zeros).
    fn stores_bytes(&self) -> bool {
        true
    }

    /// Copies `bytes` into the region at `offset`.
    fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<()>;

    /// Copies `out.len()` bytes of the region at `offset` into `out`, after
    /// the work enqueued on the arena stream so far (the host waits for it).
    /// Takes `&self`: reading back needs no exclusive access.
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<()>;

    /// Copies `len` bytes from region offset `src` to `dst`, in arena-stream
    /// order. The ranges must not overlap ([`Error::Overlap`]).
    fn copy(&mut self, src: u64, dst: u64, len: u64) -> Result<()>;

    /// Fills `len` bytes at `offset` with `pattern` repeated, in arena-stream
    /// order. `pattern` holds 1, 2, 4, 8 or 16 bytes and `len` is a multiple
    /// of its length ([`Error::Misaligned`] otherwise).
    fn fill(&mut self, offset: u64, len: u64, pattern: &[u8]) -> Result<()>;

    /// Streams this backend knows: ids `0..stream_count()` are valid, and 0
    /// is the arena stream. Backends register streams of their own kind
    /// (CUDA streams on the CUDA backend, ids alone on the host backend).
    fn stream_count(&self) -> u32 {
        1
    }

    /// Registers `stream` and returns its id, `stream_count()` before the
    /// call for a new one (a stream registered already keeps its id). The
    /// default registers none ([`Error::LimitReached`]: the arena stream is
    /// the only one).
    fn register_stream(&mut self, stream: Self::Stream) -> Result<StreamId> {
        let _ = stream;
        Err(Error::LimitReached {
            what: "streams of this backend (its own included)",
            requested: 2,
            limit: 1,
        })
    }

    /// Waits for the work enqueued on the arena stream and reports a fault
    /// the device found in it ([`BackendError::DeviceFault`](crate::BackendError::DeviceFault)). The default has
    /// nothing to wait for.
    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }

    /// Makes the arena stream's later work wait for everything enqueued on
    /// `stream` so far (CUDA: an event recorded there, waited for on the
    /// arena stream; the host does not wait). A no-op for the arena stream.
    fn wait_stream(&self, stream: StreamId) -> Result<()> {
        check_stream(stream, self.stream_count())
    }

    /// Makes `stream`'s later work wait for everything enqueued on the arena
    /// stream so far (moves, writes, fills). A no-op for the arena stream.
    fn join_arena(&self, stream: StreamId) -> Result<()> {
        check_stream(stream, self.stream_count())
    }

    /// Executes every wave of `plan` in order, honouring the wave rule of
    /// [`crate::plan`]. On error the caller must assume any subset of the
    /// moves happened.
    fn execute(&mut self, plan: &Plan) -> Result<()>;

    /// Receives the handle table's entries `first..first + entries.len()`
    /// after they changed: always after a compaction's moves (in the same
    /// stream order), and before kernels resolve handles allocated since
    /// (`graph::handle_args` and the graph calls send them).
    /// Backends whose kernels resolve handles on the device keep a copy;
    /// the default ignores it.
    fn sync_table(&mut self, entries: &[TableEntry], first: usize) -> Result<()> {
        let _ = (entries, first);
        Ok(())
    }

    /// Sets up a host tier of `bytes` for spilling (page-locked memory on
    /// the CUDA backend). The default has none.
    fn reserve_host_tier(&mut self, bytes: u64) -> Result<()> {
        Err(no_host_tier(bytes))
    }

    /// Copies `len` bytes at region offset `offset` to host-tier offset
    /// `host_offset` (in stream order on the CUDA backend).
    fn spill(&mut self, offset: u64, host_offset: u64, len: u64) -> Result<()> {
        let _ = (offset, host_offset);
        Err(no_host_tier(len))
    }

    /// Copies `len` bytes at host-tier offset `host_offset` back to region
    /// offset `offset`.
    fn restore(&mut self, host_offset: u64, offset: u64, len: u64) -> Result<()> {
        let _ = (host_offset, offset);
        Err(no_host_tier(len))
    }
}

/// [`Error::HostTierFull`] of a backend without a host tier (one of 0
/// bytes), asked for `bytes`.
pub(crate) fn no_host_tier(bytes: u64) -> Error {
    Error::HostTierFull {
        requested_bytes: bytes,
        needed_bytes: bytes,
        host_tier_bytes: 0,
        host_free_bytes: 0,
        host_largest_free_bytes: 0,
    }
}

/// Checks that `stream` is one of `count` registered streams.
pub(crate) fn check_stream(stream: StreamId, count: u32) -> Result<()> {
    if stream.0 < count {
        Ok(())
    } else {
        Err(Error::UnknownStream {
            stream: stream.0,
            registered: count,
        })
    }
}

/// Checks a fill pattern: 1, 2, 4, 8 or 16 bytes, `len` a multiple of it.
pub(crate) fn check_pattern(offset: u64, len: u64, pattern: &[u8]) -> Result<()> {
    let p = pattern.len() as u64;
    if matches!(p, 1 | 2 | 4 | 8 | 16) && len % p == 0 {
        Ok(())
    } else {
        Err(Error::Misaligned {
            offset_bytes: offset,
            len_bytes: len,
            elem_type: "fill pattern (1, 2, 4, 8 or 16 B)",
            elem_bytes: p,
        })
    }
}

/// Checks that a copy's source and destination do not overlap.
pub(crate) fn check_disjoint(src: u64, dst: u64, len: u64) -> Result<()> {
    let apart = src.saturating_add(len) <= dst || dst.saturating_add(len) <= src;
    if apart || len == 0 {
        Ok(())
    } else {
        Err(Error::Overlap {
            first_offset: src,
            first_bytes: len,
            second_offset: dst,
            second_bytes: len,
        })
    }
}

/// Checks `offset..offset+len` against a region of `capacity_bytes`.
pub(crate) fn check_range(offset: u64, len: u64, capacity_bytes: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= capacity_bytes => Ok(()),
        _ => Err(Error::OutOfBounds {
            start_bytes: offset,
            end_bytes: offset.saturating_add(len),
            available_bytes: capacity_bytes,
        }),
    }
}
