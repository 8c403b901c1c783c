//! An arena many threads share.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytemuck::Pod;

use super::Arena;
use crate::backend::{Backend, HostBackend};
use crate::error::{Error, Result};
use crate::storage::{AsRange, Storage};

/// A thread-safe arena: `Clone`, `Send + Sync` (for a `Send + Sync`
/// backend), shared by every thread of a framework. Reads take a read lock
/// (many at once); everything that can allocate, move or write takes the
/// write lock. [`Storage`]s it hands out are freed when their last owner
/// drops, on any thread, without taking the lock: the handle waits in the
/// reclaim queue for the arena's next allocation, compaction or
/// [`reclaim`](SharedArena::reclaim).
///
/// The single-owner [`Arena`] stays the type for custom loops; this wraps
/// one, and [`write`](SharedArena::write) gives the whole `Arena` API.
#[derive(Debug)]
pub struct SharedArena<B: Backend = HostBackend> {
    inner: Arc<RwLock<Arena<B>>>,
}

impl<B: Backend> Clone for SharedArena<B> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// A thread panicked while holding the lock: the arena may be part-way
/// through an operation.
fn lock_poisoned() -> Error {
    Error::Poisoned {
        reason: "a thread panicked while it held the shared arena's lock".to_string(),
    }
}

impl<B: Backend> SharedArena<B> {
    /// Shares `arena`.
    pub fn new(arena: Arena<B>) -> Self {
        Self {
            inner: Arc::new(RwLock::new(arena)),
        }
    }

    /// The arena, exclusively (blocks while others hold the lock).
    pub fn write(&self) -> Result<RwLockWriteGuard<'_, Arena<B>>> {
        self.inner.write().map_err(|_| lock_poisoned())
    }

    /// The arena, shared with other readers.
    pub fn read(&self) -> Result<RwLockReadGuard<'_, Arena<B>>> {
        self.inner.read().map_err(|_| lock_poisoned())
    }

    /// [`Arena::alloc_storage`].
    pub fn alloc_storage(&self, bytes: u64) -> Result<Storage> {
        self.write()?.alloc_storage(bytes)
    }

    /// [`Arena::alloc_storage_elems`].
    pub fn alloc_storage_elems<T: Pod>(&self, n: u64) -> Result<Storage> {
        self.write()?.alloc_storage_elems::<T>(n)
    }

    /// [`Arena::alloc_storage_zeroed`].
    pub fn alloc_storage_zeroed<T: Pod>(&self, n: u64) -> Result<Storage> {
        self.write()?.alloc_storage_zeroed::<T>(n)
    }

    /// [`Arena::write_range`].
    pub fn write_range<T: Pod>(&self, dst: &impl AsRange, data: &[T]) -> Result<()> {
        self.write()?.write_range(dst, data)
    }

    /// [`Arena::read_range`], under the read lock.
    pub fn read_range<T: Pod>(&self, src: &impl AsRange) -> Result<Vec<T>> {
        self.read()?.read_range(src)
    }

    /// [`Arena::copy`].
    pub fn copy(&self, src: &impl AsRange, dst: &impl AsRange) -> Result<()> {
        self.write()?.copy(src, dst)
    }

    /// [`Arena::fill`].
    pub fn fill<T: Pod>(&self, dst: &impl AsRange, value: T) -> Result<()> {
        self.write()?.fill(dst, value)
    }

    /// [`Arena::reclaim`].
    pub fn reclaim(&self) -> Result<usize> {
        self.write()?.reclaim()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::StorageSlice;

    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn shared_arenas_and_storages_cross_threads() {
        send_sync::<SharedArena<HostBackend>>();
        send_sync::<SharedArena<crate::backend::MetaBackend>>();
        #[cfg(feature = "cuda")]
        send_sync::<SharedArena<crate::backend::cuda::CudaBackend>>();
        send_sync::<Storage>();
        send_sync::<StorageSlice>();
    }
}
