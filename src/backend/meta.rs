//! A backend that stores no bytes: placement and planning run for real,
//! moves are bounds-checked and counted but copy nothing. It replays traces
//! of any size (a 25 GB trace on a machine with less memory).

use super::{check_disjoint, check_pattern, check_range, Backend};
use crate::error::Result;
use crate::plan::Plan;
use crate::stream::StreamId;

/// Metadata-only backend.
#[derive(Debug, Clone)]
pub struct MetaBackend {
    capacity_bytes: u64,
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
            bytes_moved: 0,
            waves: 0,
            host_tier_bytes: 0,
            streams: 1,
        }
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
        self.capacity_bytes
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
