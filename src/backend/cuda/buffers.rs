//! Scratch buffers the backend owns besides the region: device memory and
//! page-locked host memory, freed on drop.

use cudarc::driver::{result, sys, CudaStream};

use super::driver_err;
use crate::error::Result;

/// A device allocation this backend owns (scratch, not the region).
#[derive(Debug)]
pub(super) struct DeviceBuf {
    pub(super) ptr: sys::CUdeviceptr,
    pub(super) bytes: usize,
}

impl DeviceBuf {
    pub(super) const EMPTY: DeviceBuf = DeviceBuf { ptr: 0, bytes: 0 };

    /// Makes sure the buffer holds `bytes`; a new one is zeroed on `stream`
    /// when `zeroed`. Growing waits for the stream (the old buffer may be in
    /// use by enqueued work) and returns true.
    pub(super) fn reserve(
        &mut self,
        bytes: usize,
        zeroed: bool,
        stream: &CudaStream,
    ) -> Result<bool> {
        self.reserve_capped(bytes, usize::MAX, zeroed, stream)
    }

    /// As [`reserve`](Self::reserve), growing (2x, so that a slowly
    /// growing need reallocates rarely) to at most `cap` bytes, or
    /// `bytes` where that is more.
    pub(super) fn reserve_capped(
        &mut self,
        bytes: usize,
        cap: usize,
        zeroed: bool,
        stream: &CudaStream,
    ) -> Result<bool> {
        if self.bytes >= bytes {
            return Ok(false);
        }
        let want = bytes.max(self.bytes.saturating_mul(2).max(256).min(cap));
        stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        self.release();
        // SAFETY: a plain allocation; the context is bound by the caller.
        // The memory is uninitialised, which is fine for bytes we overwrite
        // before reading (or zero right below).
        let ptr = unsafe { result::malloc_sync(want) }.map_err(driver_err("cuMemAlloc"))?;
        self.ptr = ptr;
        self.bytes = want;
        if zeroed {
            // SAFETY: `ptr` holds `want` bytes and is ours; the memset is
            // ordered before every later use on the same stream.
            unsafe { result::memset_d8_async(ptr, 0, want, stream.cu_stream()) }
                .map_err(driver_err("cuMemsetD8Async"))?;
        }
        Ok(true)
    }

    pub(super) fn release(&mut self) {
        if self.ptr != 0 {
            // SAFETY: `ptr` came from cuMemAlloc and no enqueued work uses it
            // (callers synchronise the stream first). Errors cannot be
            // reported from here; the driver keeps them for later calls.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
        // Field by field: assigning a whole value would drop the old one,
        // and its Drop calls this again.
        self.ptr = 0;
        self.bytes = 0;
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        self.release();
    }
}

/// Page-locked host memory (so uploads are truly asynchronous).
#[derive(Debug)]
pub(super) struct PinnedBuf {
    ptr: *mut u64,
    words: usize,
}

// SAFETY: the buffer is plain memory owned by this value; it is only
// touched through `&mut self` (or by copies the owner orders with events).
unsafe impl Send for PinnedBuf {}
// SAFETY: through `&PinnedBuf` the memory is only read (`load`, a
// volatile read of a word the owner waited for); writes need `&mut`.
unsafe impl Sync for PinnedBuf {}

impl PinnedBuf {
    pub(super) const EMPTY: PinnedBuf = PinnedBuf {
        ptr: std::ptr::null_mut(),
        words: 0,
    };

    pub(super) fn reserve(&mut self, words: usize) -> Result<()> {
        if self.words >= words {
            return Ok(());
        }
        let want = words.max(self.words.saturating_mul(2)).max(64);
        self.release();
        // SAFETY: a plain page-locked allocation (flags 0); the context is
        // bound by the caller.
        let ptr =
            unsafe { result::malloc_host(want * 8, 0) }.map_err(driver_err("cuMemHostAlloc"))?;
        // Zero it so that it can be viewed as initialised `u64`s.
        // SAFETY: `ptr` points to `want * 8` writable bytes.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, want * 8) };
        self.ptr = ptr.cast();
        self.words = want;
        Ok(())
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [u64] {
        if self.ptr.is_null() {
            return &mut [];
        }
        // SAFETY: `ptr` holds `words` initialised (zeroed, then written)
        // u64s owned by self, and `&mut self` makes this the only access
        // from the host. The owner waits for copies that read or write it
        // before handing it out (see `upload_done` / `status_ready`).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.words) }
    }

    /// Word `i` (0 when out of range), read volatile: the device writes it
    /// by an async copy that the caller has waited for (an event).
    pub(super) fn load(&self, i: usize) -> u64 {
        if i >= self.words {
            return 0;
        }
        // SAFETY: `i < words`, the buffer holds `words` initialised u64s,
        // and the caller waited for the copy that wrote it; a volatile read
        // of a u64 through a shared reference creates no `&mut` alias.
        unsafe { std::ptr::read_volatile(self.ptr.add(i)) }
    }

    pub(super) fn release(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: `ptr` came from cuMemHostAlloc; callers wait for the
            // copies that use it first.
            let _ = unsafe { result::free_host(self.ptr.cast()) };
        }
        // Field by field (see DeviceBuf::release).
        self.ptr = std::ptr::null_mut();
        self.words = 0;
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_buffers_drop_without_touching_the_driver() {
        let mut d = DeviceBuf::EMPTY;
        d.release();
        drop(d);
        let mut p = PinnedBuf::EMPTY;
        assert!(p.as_mut_slice().is_empty());
        p.release();
        drop(p);
    }
}
