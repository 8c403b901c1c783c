//! The CUDA backend's `Backend` implementation: transfers between the
//! host and the region, copies and fills inside it, spills to and restores
//! from the host tier, and the handle table's upload. Plans run in
//! `moves`.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{result, sys, CudaStream, DevicePtr, DevicePtrMut};

use super::moves::hand_back;
use super::scratch::Staging;
use super::{driver_err, CudaBackend};
use crate::backend::{check_disjoint, check_pattern, check_range, Backend};
use crate::error::{Error, Result};
use crate::handle::TableEntry;
use crate::plan::Plan;
use crate::stream::StreamId;

impl Backend for CudaBackend {
    /// A stream of the backend's CUDA context.
    type Stream = Arc<CudaStream>;

    fn capacity_bytes(&self) -> u64 {
        self.reserved_bytes()
    }

    fn mapped_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn granularity_bytes(&self) -> u64 {
        self.vmm_granularity()
    }

    fn map_to(&mut self, end: u64) -> Result<()> {
        self.map_chunk(end)
    }

    fn unmap_to(&mut self, end: u64) -> Result<u64> {
        self.unmap_chunks(end)
    }

    /// See [`Arena::register_stream`](crate::Arena::register_stream): a
    /// stream of another context is
    /// [`BackendError::ForeignStream`](crate::BackendError::ForeignStream).
    fn register_stream(&mut self, stream: Arc<CudaStream>) -> Result<StreamId> {
        self.register(stream)
    }

    fn synchronize(&mut self) -> Result<()> {
        CudaBackend::synchronize(self)
    }

    fn stream_count(&self) -> u32 {
        self.registered_count()
    }

    /// An event recorded on `stream`, waited for by the arena stream.
    fn wait_stream(&self, stream: StreamId) -> Result<()> {
        self.arena_waits_for(stream)
    }

    /// An event recorded on the arena stream, waited for by `stream`.
    fn join_arena(&self, stream: StreamId) -> Result<()> {
        self.waits_for_arena(stream)
    }

    fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        check_range(offset, bytes.len() as u64, self.capacity_bytes)?;
        self.check_status(false)?;
        if bytes.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let (base, _record) = self.region.device_ptr_mut(&self.stream);
        // SAFETY: the range lies in the region (checked above). From pageable
        // memory the driver copies `bytes` into its staging area before it
        // returns, so the slice may be dropped afterwards; the copy into the
        // region is ordered on the arena stream.
        unsafe { result::memcpy_htod_async(base + offset, bytes, self.stream.cu_stream()) }
            .map_err(driver_err("cuMemcpyHtoDAsync"))
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        check_range(offset, out.len() as u64, self.capacity_bytes)?;
        if !out.is_empty() {
            self.bind()?;
            let (base, record) = self.region.device_ptr(&self.stream);
            // SAFETY: the range lies in the region (checked above); the
            // stream is synchronised below before `out` is used again.
            unsafe { result::memcpy_dtoh_async(out, base + offset, self.stream.cu_stream()) }
                .map_err(driver_err("cuMemcpyDtoHAsync"))?;
            drop(record);
            self.stream
                .synchronize()
                .map_err(driver_err("cuStreamSynchronize"))?;
        }
        self.check_status(true)
    }

    fn copy(&mut self, src: u64, dst: u64, len: u64) -> Result<()> {
        check_range(src, len, self.capacity_bytes)?;
        check_range(dst, len, self.capacity_bytes)?;
        check_disjoint(src, dst, len)?;
        self.check_status(false)?;
        if len == 0 {
            return Ok(());
        }
        let n = usize::try_from(len).map_err(|_| address_space(len))?;
        self.bind()?;
        let (base, _record) = self.region.device_ptr_mut(&self.stream);
        // SAFETY: both ranges lie in the region and do not overlap (checked
        // above); the copy is ordered on the arena stream.
        unsafe { result::memcpy_dtod_async(base + dst, base + src, n, self.stream.cu_stream()) }
            .map_err(driver_err("cuMemcpyDtoDAsync"))
    }

    fn fill(&mut self, offset: u64, len: u64, pattern: &[u8]) -> Result<()> {
        check_range(offset, len, self.capacity_bytes)?;
        check_pattern(offset, len, pattern)?;
        self.check_status(false)?;
        if len == 0 {
            return Ok(());
        }
        let too_big = |_| address_space(len);
        // The widest memset whose unit the pattern repeats in, at an
        // address aligned for it; a pattern that repeats in no unit of 4
        // bytes or less goes through `fill_staged`.
        let address = self.region_ptr + offset;
        let unit = [4usize, 2, 1].into_iter().find(|&u| {
            pattern.len() % u == 0
                && address % u as u64 == 0
                && len % u as u64 == 0
                && pattern.chunks_exact(u).all(|c| c == &pattern[..u])
        });
        let Some(unit) = unit else {
            return self.fill_staged(offset, len, pattern);
        };
        self.bind()?;
        let (base, _record) = self.region.device_ptr_mut(&self.stream);
        let dst = base + offset;
        let stream = self.stream.cu_stream();
        // For all three: `len` bytes at `dst` lie in the region (checked
        // above), `dst` is aligned for the unit, and the memset is ordered on
        // the arena stream.
        let r = match unit {
            4 => {
                let v = u32::from_ne_bytes([pattern[0], pattern[1], pattern[2], pattern[3]]);
                let n = usize::try_from(len / 4).map_err(too_big)?;
                // SAFETY: as above, 4-byte units.
                unsafe { sys::cuMemsetD32Async(dst, v, n, stream) }.result()
            }
            2 => {
                let v = u16::from_ne_bytes([pattern[0], pattern[1]]);
                let n = usize::try_from(len / 2).map_err(too_big)?;
                // SAFETY: as above, 2-byte units.
                unsafe { sys::cuMemsetD16Async(dst, v, n, stream) }.result()
            }
            _ => {
                let n = usize::try_from(len).map_err(too_big)?;
                // SAFETY: as above, bytes.
                unsafe { result::memset_d8_async(dst, pattern[0], n, stream) }
            }
        };
        r.map_err(driver_err("cuMemsetAsync"))
    }

    fn reserve_host_tier(&mut self, bytes: u64) -> Result<()> {
        let words = usize::try_from(bytes.div_ceil(8)).map_err(|_| Error::TooLarge {
            requested_bytes: bytes,
            capacity_bytes: usize::MAX as u64,
        })?;
        self.bind()?;
        // Copies from an older tier may still be in flight.
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        self.scratch.host_tier.release();
        self.scratch.host_tier.reserve(words)?;
        self.scratch.host_tier_bytes = bytes;
        Ok(())
    }

    fn spill(&mut self, offset: u64, host_offset: u64, len: u64) -> Result<()> {
        if !self.begin_tier_copy(offset, host_offset, len)? {
            return Ok(());
        }
        let (base, _record) = self.region.device_ptr(&self.stream);
        let tier: &mut [u8] = bytemuck::cast_slice_mut(self.scratch.host_tier.as_mut_slice());
        let (h, l) = (host_offset as usize, len as usize);
        // SAFETY: both ranges were checked above; the tier is page-locked
        // memory owned by the backend that the host never reads or writes
        // (only stream-ordered copies touch it, and Drop waits for them),
        // so the asynchronous copy cannot race with the host.
        unsafe {
            result::memcpy_dtoh_async(&mut tier[h..h + l], base + offset, self.stream.cu_stream())
        }
        .map_err(driver_err("cuMemcpyDtoHAsync"))
    }

    fn restore(&mut self, host_offset: u64, offset: u64, len: u64) -> Result<()> {
        if !self.begin_tier_copy(offset, host_offset, len)? {
            return Ok(());
        }
        let (base, _record) = self.region.device_ptr_mut(&self.stream);
        let tier: &[u8] = bytemuck::cast_slice(self.scratch.host_tier.as_mut_slice());
        let (h, l) = (host_offset as usize, len as usize);
        // SAFETY: as in `spill`; the copy reads the tier in stream order
        // after the spill that filled it.
        unsafe {
            result::memcpy_htod_async(base + offset, &tier[h..h + l], self.stream.cu_stream())
        }
        .map_err(driver_err("cuMemcpyHtoDAsync"))
    }

    fn sync_table(&mut self, entries: &[TableEntry], first: usize) -> Result<()> {
        let t = Instant::now();
        let r = self.sync_table_now(entries, first);
        self.scratch.counters.staging += t.elapsed();
        r
    }

    fn execute(&mut self, plan: &Plan) -> Result<()> {
        let t = Instant::now();
        let r = self.execute_now(plan);
        self.scratch.counters.staging += t.elapsed();
        r
    }
}

impl CudaBackend {
    /// [`Backend::sync_table`]: the entries go through a page-locked
    /// buffer that no queued upload reads (from a pool, never waited for)
    /// and up in the order of the arena stream, after the moves that
    /// produced their offsets.
    fn sync_table_now(&mut self, entries: &[TableEntry], first: usize) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let slots = first
            .checked_add(entries.len())
            .ok_or_else(|| Error::LimitReached {
                what: "handle table slots (this machine's address space)",
                requested: (first as u64).saturating_add(entries.len() as u64),
                limit: usize::MAX as u64,
            })?;
        self.reserve_table(slots)?;
        let bytes: &[u8] = bytemuck::cast_slice(entries);
        let words = bytes.len().div_ceil(8);
        let ctx = Arc::clone(&self.ctx);
        let mut staging = self
            .scratch
            .table_staging
            .take(words, |w| Staging::new(&ctx, w))?;
        let staged =
            &mut bytemuck::cast_slice_mut::<u64, u8>(staging.buf.as_mut_slice())[..bytes.len()];
        staged.copy_from_slice(bytes);
        let entry = std::mem::size_of::<TableEntry>();
        // SAFETY: the table holds `slots` entries (reserved above); the
        // source is page-locked staging that no queued copy reads (the
        // pool hands out only buffers whose event completed) and that the
        // host does not touch again before `staging.done`, recorded right
        // after on the same stream, completes. The copy is ordered on the
        // arena stream after the moves that produced these offsets.
        let copied = unsafe {
            result::memcpy_htod_async(
                self.scratch.table.ptr + (first * entry) as u64,
                &*staged,
                self.stream.cu_stream(),
            )
        }
        .map_err(driver_err("cuMemcpyHtoDAsync"));
        let stream = Arc::clone(&self.stream);
        let back = hand_back(
            &mut self.scratch.table_staging,
            staging,
            &stream,
            &mut self.scratch.counters.blocked,
        );
        copied?;
        back
    }

    /// Fills `len` bytes at `offset` with a pattern of 8 or 16 bytes that no
    /// memset unit repeats, by uploading it from the host in chunks of at
    /// most 4 MiB (pageable uploads are staged by the driver before the call
    /// returns). Correct for every pattern, at upload bandwidth.
    fn fill_staged(&mut self, offset: u64, len: u64, pattern: &[u8]) -> Result<()> {
        const CHUNK: u64 = 4 << 20;
        let chunk = CHUNK.min(len) as usize / pattern.len() * pattern.len();
        let buf: Vec<u8> = pattern
            .iter()
            .copied()
            .cycle()
            .take(chunk.max(pattern.len()))
            .collect();
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            self.write(offset + done, &buf[..n])?;
            done += n as u64;
        }
        Ok(())
    }
}

/// [`Error::LimitReached`] for a copy or fill of `len` bytes, more than
/// one driver call takes (`usize`).
fn address_space(len: u64) -> Error {
    Error::LimitReached {
        what: "bytes of one copy or fill (this machine's address space)",
        requested: len,
        limit: usize::MAX as u64,
    }
}
