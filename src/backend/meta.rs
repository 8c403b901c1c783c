//! A backend that stores no bytes: placement and planning run for real,
//! moves are bounds-checked and counted but copy nothing. It replays traces
//! of any size (a 25 GB trace on a machine with less memory).

use super::mapping::{Chunks, ManualClock};
use super::{check_disjoint, check_pattern, check_range, Backend};
use crate::error::Result;
use crate::plan::Plan;
use crate::stream::StreamId;

/// The metadata backend's mapping granularity in elastic mode: CUDA's on
/// the cards measured (2 MiB), so that replays map what a GPU would.
pub(crate) const META_GRANULARITY: u64 = 2 << 20;

/// Metadata-only backend.
#[derive(Debug, Clone)]
pub struct MetaBackend {
    /// The mapped end (all of the region when fixed).
    capacity_bytes: u64,
    chunks: Chunks,
    clock: ManualClock,
    /// Bytes the executed plans would have copied.
    pub bytes_moved: u64,
    /// Waves executed.
    pub waves: u64,
    host_tier_bytes: u64,
    /// Streams registered, the arena's included (ids only).
    streams: u32,
}

impl MetaBackend {
    /// A region of `capacity_bytes` that holds no memory.
    pub fn new(capacity_bytes: u64) -> Self {
        Self {
            capacity_bytes,
            chunks: Chunks::fixed(capacity_bytes),
            clock: ManualClock::default(),
            bytes_moved: 0,
            waves: 0,
            host_tier_bytes: 0,
            streams: 1,
        }
    }
}

impl MetaBackend {
    /// An elastic region of `reserved_bytes`, nothing mapped, chunks in
    /// multiples of `granularity_bytes` (as [`super::HostBackend::elastic`]).
    pub fn elastic(reserved_bytes: u64, granularity_bytes: u64) -> Self {
        Self {
            capacity_bytes: 0,
            chunks: Chunks::new(reserved_bytes, granularity_bytes),
            ..Self::new(0)
        }
    }

    /// Sets the backend's clock ([`Backend::now_us`]) to `time_us` (a
    /// replay runs on its trace's time).
    pub fn set_time_us(&self, time_us: u64) {
        self.clock.set(time_us);
    }

    /// Chunks mapped now (1 for a fixed region).
    pub fn mapped_chunks(&self) -> usize {
        self.chunks.count()
    }
}

impl Default for MetaBackend {
    /// A region of 0 bytes.
    fn default() -> Self {
        Self::new(0)
    }
}

impl Backend for MetaBackend {
    /// No work runs: a stream is an id only.
    type Stream = ();

    fn register_stream(&mut self, (): ()) -> Result<StreamId> {
        super::host::next_stream(&mut self.streams)
    }

    fn stream_count(&self) -> u32 {
        self.streams
    }

    fn capacity_bytes(&self) -> u64 {
        self.chunks.reserved_bytes()
    }

    fn mapped_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn granularity_bytes(&self) -> u64 {
        self.chunks.granularity_bytes()
    }

    fn map_to(&mut self, end: u64) -> Result<()> {
        self.chunks.check_map(end)?;
        self.chunks.push(end);
        self.capacity_bytes = end;
        Ok(())
    }

    fn unmap_to(&mut self, end: u64) -> Result<u64> {
        let (n, new_end) = self.chunks.above(end);
        self.chunks.pop(n);
        self.capacity_bytes = new_end;
        Ok(new_end)
    }

    fn now_us(&self) -> u64 {
        match self.clock.get() {
            Some(t) => t,
            None => super::wall_clock_us(),
        }
    }

    fn stores_bytes(&self) -> bool {
        false
    }

    fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        check_range(offset, bytes.len() as u64, self.capacity_bytes)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        check_range(offset, out.len() as u64, self.capacity_bytes)?;
        out.fill(0);
        Ok(())
    }

    fn copy(&mut self, src: u64, dst: u64, len: u64) -> Result<()> {
        check_range(src, len, self.capacity_bytes)?;
        check_range(dst, len, self.capacity_bytes)?;
        check_disjoint(src, dst, len)
    }

    fn fill(&mut self, offset: u64, len: u64, pattern: &[u8]) -> Result<()> {
        check_range(offset, len, self.capacity_bytes)?;
        check_pattern(offset, len, pattern)
    }

    fn reserve_host_tier(&mut self, bytes: u64) -> Result<()> {
        self.host_tier_bytes = bytes;
        Ok(())
    }

    fn spill(&mut self, offset: u64, host_offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.capacity_bytes)?;
        check_range(host_offset, len, self.host_tier_bytes)
    }

    fn restore(&mut self, host_offset: u64, offset: u64, len: u64) -> Result<()> {
        self.spill(offset, host_offset, len)
    }

    fn execute(&mut self, plan: &Plan) -> Result<()> {
        // Bounds only: full validation is the host backend's job, and replays
        // of million-event traces should not pay for it.
        for m in plan.moves() {
            check_range(m.src, m.len, self.capacity_bytes)?;
            check_range(m.dst, m.len, self.capacity_bytes)?;
        }
        // A counter: saturates rather than overflow on arenas near 2^64 bytes.
        self.bytes_moved = self.bytes_moved.saturating_add(plan.bytes_moved());
        self.waves += plan.waves().len() as u64;
        Ok(())
    }
}
