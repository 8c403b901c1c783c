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
    /// Made by `cuMemAllocAsync` (the device's default memory pool): freed
    /// in stream order ([`release_on`](Self::release_on)).
    pub(super) pooled: bool,
}

/// Host time spent blocked on the device (a stream or event
/// synchronisation) on the paths that should never block: only taken
/// where the device has no memory pools, and on error paths.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Blocked {
    pub(super) time: std::time::Duration,
    pub(super) calls: u64,
}

impl Blocked {
    /// Runs `wait` (a blocking driver call) and counts its time.
    pub(super) fn count<R>(&mut self, wait: impl FnOnce() -> R) -> R {
        let t = std::time::Instant::now();
        let r = wait();
        self.time += t.elapsed();
        self.calls += 1;
        r
    }
}

impl DeviceBuf {
    pub(super) const EMPTY: DeviceBuf = DeviceBuf {
        ptr: 0,
        bytes: 0,
        pooled: false,
    };

    /// Makes sure the buffer holds `bytes` (doubling, so that a slowly
    /// growing need reallocates rarely, to at most `cap` bytes, or `bytes`
    /// where that is more); a new one is zeroed on `stream` when `zeroed`.
    /// Returns true when it grew (the address changed).
    ///
    /// With `pooled` (the device has memory pools), growth never blocks the
    /// host: the old buffer is freed and the new one allocated in the order
    /// of `stream` (`cuMemFreeAsync`, `cuMemAllocAsync`). The caller must
    /// have ordered `stream` after every use of the old buffer on other
    /// streams, and must order other streams after the new one's
    /// allocation before they use it. Without, growth waits for `stream`
    /// (counted in `blocked`), then frees and allocates.
    pub(super) fn grow(
        &mut self,
        bytes: usize,
        cap: usize,
        zeroed: bool,
        stream: &CudaStream,
        pooled: bool,
        blocked: &mut Blocked,
    ) -> Result<bool> {
        if self.bytes >= bytes {
            return Ok(false);
        }
        let want = bytes.max(self.bytes.saturating_mul(2).max(256).min(cap));
        let cu = stream.cu_stream();
        if pooled {
            if self.ptr != 0 {
                // SAFETY: `ptr` is ours; every use of it is ordered before
                // this point of `stream` (the caller's obligation), so the
                // memory is released only once they are done. It is never
                // used again (the fields are replaced below).
                unsafe { result::free_async(self.ptr, cu) }
                    .map_err(driver_err("cuMemFreeAsync"))?;
                self.ptr = 0;
                self.bytes = 0;
            }
            // SAFETY: a stream-ordered allocation on `stream`, valid for
            // work ordered after this point of it (the caller orders other
            // streams); uninitialised, which is fine for bytes we overwrite
            // before reading (or zero right below).
            let ptr =
                unsafe { result::malloc_async(cu, want) }.map_err(driver_err("cuMemAllocAsync"))?;
            self.ptr = ptr;
            self.pooled = true;
        } else {
            blocked
                .count(|| stream.synchronize())
                .map_err(driver_err("cuStreamSynchronize"))?;
            self.release();
            // SAFETY: a plain allocation; the context is bound by the
            // caller. The memory is uninitialised, which is fine for bytes
            // we overwrite before reading (or zero right below).
            let ptr = unsafe { result::malloc_sync(want) }.map_err(driver_err("cuMemAlloc"))?;
            self.ptr = ptr;
            self.pooled = false;
        }
        self.bytes = want;
        if zeroed {
            // SAFETY: `ptr` holds `want` bytes and is ours; the memset is
            // ordered before every later use on the same stream.
            unsafe { result::memset_d8_async(self.ptr, 0, want, cu) }
                .map_err(driver_err("cuMemsetD8Async"))?;
        }
        Ok(true)
    }

    /// As [`grow`](Self::grow) without memory pools and without a cap:
    /// for buffers made once, before any work is enqueued.
    pub(super) fn reserve(
        &mut self,
        bytes: usize,
        zeroed: bool,
        stream: &CudaStream,
    ) -> Result<bool> {
        self.grow(
            bytes,
            usize::MAX,
            zeroed,
            stream,
            false,
            &mut Blocked::default(),
        )
    }

    /// Frees the buffer in the order of `stream` (a pooled one; a plain
    /// one is freed at once). The caller synchronises `stream` afterwards,
    /// and has ordered it after every use.
    pub(super) fn release_on(&mut self, stream: &CudaStream) {
        if self.pooled && self.ptr != 0 {
            // SAFETY: `ptr` came from cuMemAllocAsync and every use of it
            // is ordered before this point of `stream` (the caller's
            // obligation); it is not used again.
            let _ = unsafe { result::free_async(self.ptr, stream.cu_stream()) };
            self.ptr = 0;
            self.bytes = 0;
            self.pooled = false;
        }
        self.release();
    }

    pub(super) fn release(&mut self) {
        if self.ptr != 0 {
            // SAFETY: `ptr` came from cuMemAlloc (or cuMemAllocAsync, which
            // cuMemFree accepts too) and no enqueued work uses it (callers
            // synchronise first). Errors cannot be reported from here; the
            // driver keeps them for later calls.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
        // Field by field: assigning a whole value would drop the old one,
        // and its Drop calls this again.
        self.ptr = 0;
        self.bytes = 0;
        self.pooled = false;
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

    /// A buffer of exactly `words` words (at least one), zeroed.
    pub(super) fn with_words(words: usize) -> Result<Self> {
        let mut b = Self::EMPTY;
        b.alloc(words.max(1))?;
        Ok(b)
    }

    /// Words the buffer holds.
    pub(super) fn words(&self) -> usize {
        self.words
    }

    pub(super) fn reserve(&mut self, words: usize) -> Result<()> {
        if self.words >= words {
            return Ok(());
        }
        let want = words.max(self.words.saturating_mul(2)).max(64);
        self.release();
        self.alloc(want)
    }

    /// Allocates `want` zeroed words into an empty buffer.
    fn alloc(&mut self, want: usize) -> Result<()> {
        debug_assert!(self.ptr.is_null());
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
        // from the host. The owner hands it out only once the copies that
        // read or write it are done (see `pool::Pool`, `status_ready`).
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
