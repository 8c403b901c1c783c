//! Virtual memory management: one reserved address range whose prefix is
//! mapped to physical memory in chunks (`cuMemAddressReserve`,
//! `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`; back with `cuMemUnmap`,
//! `cuMemRelease`, `cuMemAddressFree`). The base address never changes, so
//! pointers, the device handle table, captured graphs and NCCL buffers stay
//! valid across growth.
//!
//! A chunk is unmapped in stream order: [`Vmm::retire`] takes the top
//! chunks out of the mapped prefix with an event recorded on every stream
//! that may touch them, and [`Vmm::poll`] (called on later calls, never
//! waiting) unmaps and releases those whose events have completed. Until
//! then a retired chunk can be taken back whole, free.
//!
//! The move kernels read whole aligned 16-byte vectors that hold a byte
//! they move; chunk ends are multiples of the granularity (2 MiB), so those
//! vectors never cross the mapped end: the fixed region's 16-byte slack is
//! not needed here.

use cudarc::driver::sys;
use cudarc::driver::{CudaEvent, CudaStream};

use super::{driver_err, CudaBackend};
use crate::error::{BackendError, Error, Result};

/// One physical allocation mapped at `[start, start + len)` of the range.
#[derive(Debug)]
struct Chunk {
    handle: sys::CUmemGenericAllocationHandle,
    start: u64,
    len: u64,
}

/// A chunk out of the mapped prefix whose memory waits for the work queued
/// before it was retired.
#[derive(Debug)]
struct Retired {
    chunk: Chunk,
    events: Vec<CudaEvent>,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Vmm {
    base: sys::CUdeviceptr,
    reserved: u64,
    granularity: u64,
    device: i32,
    /// Mapped chunks, ascending and contiguous from the base.
    chunks: Vec<Chunk>,
    /// Retired chunks, ascending, above the mapped prefix.
    retired: Vec<Retired>,
}

fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    r.result().map_err(driver_err(call))
}

/// The allocation properties of plain device memory on `device`.
fn prop(device: i32) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct of integers and a pointer, for which all
    // zeroes is the documented default (no handle types, no flags).
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device;
    p
}

impl Vmm {
    /// The mapping granularity of `device`, or a clear error when its
    /// driver has no virtual memory management.
    pub(crate) fn granularity(device: i32) -> Result<u64> {
        let mut supported = 0i32;
        // SAFETY: writes one int; `device` is a valid ordinal (the caller
        // made a context on it).
        check("cuDeviceGetAttribute", unsafe {
            sys::cuDeviceGetAttribute(
                &mut supported,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
                device,
            )
        })?;
        if supported == 0 {
            return Err(Error::Backend(BackendError::NoDevice {
                reason: format!(
                    "device {device} has no virtual memory management (cuMemCreate/cuMemMap): \
                     an elastic arena needs it; use a fixed capacity instead"
                ),
            }));
        }
        let mut g = 0usize;
        let p = prop(device);
        // SAFETY: `p` is a valid property struct; writes one usize.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &p,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        })?;
        Ok((g as u64).max(1).next_power_of_two())
    }

    /// Reserves `bytes` (rounded down to the granularity) of address space
    /// on `device`, nothing mapped. The context must be current.
    pub(crate) fn reserve(device: i32, bytes: u64) -> Result<Self> {
        let granularity = Self::granularity(device)?;
        let reserved = bytes / granularity * granularity;
        if reserved == 0 {
            return Err(Error::InvalidInput {
                input: "CUDA elastic limit",
                reason: format!("{bytes} B holds no granule of {granularity} B"),
            });
        }
        let mut base: sys::CUdeviceptr = 0;
        let size = usize::try_from(reserved).map_err(|_| Error::LimitReached {
            what: "bytes of a reserved CUDA range (this machine's address space)",
            requested: reserved,
            limit: usize::MAX as u64,
        })?;
        // SAFETY: writes the reserved base; no fixed address asked for.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut base, size, granularity as usize, 0, 0)
        })?;
        Ok(Self {
            base,
            reserved,
            granularity,
            device,
            chunks: Vec::new(),
            retired: Vec::new(),
        })
    }

    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    pub(crate) fn reserved(&self) -> u64 {
        self.reserved
    }

    pub(crate) fn granularity_bytes(&self) -> u64 {
        self.granularity
    }

    /// The mapped prefix's end.
    pub(crate) fn mapped(&self) -> u64 {
        self.chunks.last().map_or(0, |c| c.start + c.len)
    }

    /// Chunks mapped, and retired ones not yet released.
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.chunks.len(), self.retired.len())
    }

    /// Maps `[mapped, end)` as one chunk (`end` checked by the caller: a
    /// granule multiple within the range). A retired chunk of exactly that
    /// range comes back free; one in the way is released first (waiting
    /// for its events: the rare path of a range re-grown to another end
    /// before its streams finished). On failure nothing changed.
    pub(crate) fn map(&mut self, end: u64) -> Result<()> {
        let start = self.mapped();
        if let Some(r) = self.retired.first() {
            if r.chunk.start == start && r.chunk.start + r.chunk.len == end {
                let r = self.retired.remove(0);
                self.chunks.push(r.chunk);
                return Ok(());
            }
        }
        // Retired chunks overlapping the new one go first, lowest first,
        // each with the rest of its group (the run up to the chunk that
        // holds the group's events), once those events complete.
        while self.retired.first().is_some_and(|r| r.chunk.start < end) {
            let j = self
                .retired
                .iter()
                .position(|r| !r.events.is_empty())
                .unwrap_or(self.retired.len() - 1);
            for e in &self.retired[j].events {
                e.synchronize().map_err(driver_err("cuEventSynchronize"))?;
            }
            for r in self.retired.drain(..=j).collect::<Vec<_>>() {
                self.release(r.chunk)?;
            }
        }
        let len = end - start;
        let size = len as usize;
        let p = prop(self.device);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `p` is valid; writes the new allocation's handle.
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut handle, size, &p, 0)
        })?;
        let at = self.base + start;
        // SAFETY: `[at, at + size)` lies in our reserved range, below
        // nothing mapped (the prefix ends at `start`, retired chunks in the
        // way were released above); `handle` holds `size` bytes.
        if let Err(e) = check("cuMemMap", unsafe { sys::cuMemMap(at, size, 0, handle, 0) }) {
            // SAFETY: the handle was created above and mapped nowhere.
            let _ = unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        let mut access: sys::CUmemAccessDesc = sys::CUmemAccessDesc {
            location: p.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        access.location.id = self.device;
        // SAFETY: `[at, at + size)` was just mapped; one descriptor.
        if let Err(e) = check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(at, size, &access, 1)
        }) {
            // SAFETY: undoing the mapping and the allocation made above.
            unsafe {
                let _ = sys::cuMemUnmap(at, size);
                let _ = sys::cuMemRelease(handle);
            }
            return Err(e);
        }
        self.chunks.push(Chunk { handle, start, len });
        Ok(())
    }

    /// The number of top chunks to unmap so that the mapped end is the
    /// lowest chunk end at or above `end`, and that end.
    pub(crate) fn above(&self, end: u64) -> (usize, u64) {
        let keep = if end == 0 {
            0
        } else {
            let k = self.chunks.partition_point(|c| c.start + c.len < end);
            (k + 1).min(self.chunks.len())
        };
        let new_end = keep.checked_sub(1).map_or(0, |i| {
            let c = &self.chunks[i];
            c.start + c.len
        });
        (self.chunks.len() - keep, new_end)
    }

    /// Takes the top `n` chunks out of the mapped prefix; their memory goes
    /// once the work queued now on each of `streams` has completed.
    pub(crate) fn retire<'a>(
        &mut self,
        n: usize,
        streams: impl IntoIterator<Item = &'a CudaStream>,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let events = streams
            .into_iter()
            .map(|s| s.record_event(flags).map_err(driver_err("cuEventRecord")))
            .collect::<Result<Vec<_>>>()?;
        let at = self.chunks.len() - n;
        let mut taken: Vec<Retired> = self
            .chunks
            .drain(at..)
            .map(|chunk| Retired {
                chunk,
                events: Vec::new(),
            })
            .collect();
        if let Some(last) = taken.last_mut() {
            last.events = events;
        }
        // One set of events covers all the chunks taken together: the
        // lower ones wait for the top one's events (see `poll`).
        taken.append(&mut self.retired);
        self.retired = taken;
        Ok(())
    }

    /// Releases the retired chunks whose streams are done with them, from
    /// the top down (a chunk's events may be kept by the one above it).
    /// Never waits. Returns how many were released.
    pub(crate) fn poll(&mut self) -> Result<usize> {
        let mut released = 0;
        // Groups: a run of chunks ending with one that holds events.
        let mut i = 0;
        while i < self.retired.len() {
            let mut j = i;
            while j < self.retired.len() && self.retired[j].events.is_empty() {
                j += 1;
            }
            if j == self.retired.len() {
                break;
            }
            let done = self.retired[j].events.iter().all(CudaEvent::is_complete);
            if !done {
                i = j + 1;
                continue;
            }
            for r in self.retired.drain(i..=j).collect::<Vec<_>>() {
                self.release(r.chunk)?;
                released += 1;
            }
        }
        Ok(released)
    }

    /// Waits for every retired chunk's streams and releases them all.
    pub(crate) fn flush(&mut self) -> Result<()> {
        for r in &self.retired {
            for e in &r.events {
                e.synchronize().map_err(driver_err("cuEventSynchronize"))?;
            }
        }
        for r in std::mem::take(&mut self.retired) {
            self.release(r.chunk)?;
        }
        Ok(())
    }

    /// Unmaps and releases one chunk no stream uses any more.
    fn release(&mut self, c: Chunk) -> Result<()> {
        // SAFETY: `c` was mapped at this range by `map` with this handle,
        // and no queued work touches it (its events completed, or the
        // caller waited for every stream).
        check("cuMemUnmap", unsafe {
            sys::cuMemUnmap(self.base + c.start, c.len as usize)
        })?;
        // SAFETY: the handle's only mapping was removed just above.
        check("cuMemRelease", unsafe { sys::cuMemRelease(c.handle) })
    }
}

impl Drop for Vmm {
    /// Unmaps everything and frees the range. The backend's `Drop` has
    /// synchronised every stream first (and bound the context). Errors are
    /// dropped: there is nothing to report them to.
    fn drop(&mut self) {
        let mut all: Vec<Chunk> = self.chunks.drain(..).collect();
        all.extend(self.retired.drain(..).map(|r| r.chunk));
        for c in all {
            let _ = self.release(c);
        }
        // SAFETY: the range was reserved by `reserve` and nothing is
        // mapped in it any more.
        let _ = unsafe { sys::cuMemAddressFree(self.base, self.reserved as usize) };
    }
}

impl CudaBackend {
    /// Chunks of an elastic region: mapped now, and unmapped by a trim but
    /// not yet released (their streams were still busy when last polled).
    /// `(1, 0)` for a fixed region.
    pub fn mapped_chunks(&self) -> (usize, usize) {
        self.vmm.as_ref().map_or((1, 0), Vmm::counts)
    }

    pub(super) fn reserved_bytes(&self) -> u64 {
        self.vmm.as_ref().map_or(self.capacity_bytes, Vmm::reserved)
    }

    pub(super) fn vmm_granularity(&self) -> u64 {
        self.vmm.as_ref().map_or(1, Vmm::granularity_bytes)
    }

    /// [`Backend::map_to`](crate::backend::Backend::map_to).
    pub(super) fn map_chunk(&mut self, end: u64) -> Result<()> {
        let mapped = self.capacity_bytes;
        let Some(v) = self.vmm.as_mut() else {
            return Err(Error::InvalidInput {
                input: "mapping",
                reason: format!("this CUDA region is fixed: nothing to map up to {end} B"),
            });
        };
        let g = v.granularity_bytes();
        if end <= mapped || end % g != 0 || end > v.reserved() {
            return Err(Error::InvalidInput {
                input: "mapping",
                reason: format!(
                    "a chunk must end above the mapped end {mapped} B, at a multiple of the \
                     granularity {g} B, within the reserve of {} B: not at {end} B",
                    v.reserved()
                ),
            });
        }
        self.ctx
            .bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))?;
        v.poll()?;
        v.map(end)?;
        self.capacity_bytes = end;
        Ok(())
    }

    /// [`Backend::unmap_to`](crate::backend::Backend::unmap_to): the
    /// chunks go in stream order (see the module docs).
    pub(super) fn unmap_chunks(&mut self, end: u64) -> Result<u64> {
        let Some(v) = self.vmm.as_mut() else {
            return Ok(self.capacity_bytes);
        };
        self.ctx
            .bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))?;
        let (n, new_end) = v.above(end);
        v.retire(n, self.streams.iter().map(|r| &*r.stream))?;
        v.poll()?;
        self.capacity_bytes = new_end;
        Ok(new_end)
    }
}
