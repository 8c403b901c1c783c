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
mod mapping;
mod meta;

// The one module that talks to the driver, and the only one allowed `unsafe`.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod cuda;

pub use crate::handle::TableEntry;
pub use any::{AnyBackend, AnyStream};
pub use host::HostBackend;
pub(crate) use host::HOST_GRANULARITY;
pub use meta::MetaBackend;
pub(crate) use meta::META_GRANULARITY;

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

    /// Bytes of the region: the reserved range. Only its mapped prefix
    /// ([`mapped_bytes`](Self::mapped_bytes)) may be touched.
    fn capacity_bytes(&self) -> u64;

    /// The mapped prefix `[0, mapped_bytes())` of the region: the bytes
    /// that transfers, plans, spills and fills may touch
    /// ([`Error::OutOfBounds`] above it). All of it on a fixed region.
    fn mapped_bytes(&self) -> u64 {
        self.capacity_bytes()
    }

    /// What mapping is done in: every chunk's end is a multiple of it (a
    /// power of two; 2 MiB on CUDA). A fixed region maps nothing more.
    fn granularity_bytes(&self) -> u64 {
        1
    }

    /// Maps `[mapped_bytes(), end)` as one chunk, unmapped whole later.
    /// `end` is above the mapped end, a multiple of the granularity and
    /// within the region ([`Error::InvalidInput`] otherwise); a device out
    /// of memory is [`Error::OutOfMemory`], and nothing changes on any error.
    /// Returns at once: no queued work is waited for. A fixed region has
    /// everything mapped, so this refuses.
    fn map_to(&mut self, end: u64) -> Result<()> {
        Err(Error::InvalidInput {
            input: "mapping",
            reason: format!(
                "this backend's region is fixed: all {} B mapped, nothing to map up to {end} B",
                self.capacity_bytes()
            ),
        })
    }

    /// Unmaps every chunk that lies wholly at or above `end` and returns the
    /// new mapped end (the end of the chunk holding byte `end - 1`, or 0).
    /// The caller guarantees no live byte lies above `end`. In stream order:
    /// a backend with queued work (CUDA) frees a chunk's memory once the
    /// work queued so far on every registered stream has completed, and
    /// until then may map it back for free; it never waits here. A fixed
    /// region unmaps nothing.
    fn unmap_to(&mut self, end: u64) -> Result<u64> {
        let _ = end;
        Ok(self.mapped_bytes())
    }

    /// Time in microseconds, for the automatic trim's window: a monotonic
    /// clock by default; the host and metadata backends can be set by
    /// hand (tests, and replays, which run on a trace's time).
    fn now_us(&self) -> u64 {
        wall_clock_us()
    }

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

/// Microseconds since the first call in this process (monotonic).
pub(crate) fn wall_clock_us() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX)
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
