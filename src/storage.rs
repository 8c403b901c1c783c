//! Storage a framework's tensor can own.
//!
//! A [`Storage`] is one block of an arena held by shared ownership: `Send +
//! Sync`, cheap to clone (an `Arc`), with its length and element type
//! readable without touching the arena. When the last clone (and the last
//! [`StorageSlice`] of it) is dropped, on whatever thread, its handle goes
//! to the arena's reclaim queue; the arena frees it at its next allocation
//! or compaction, or when asked ([`crate::Arena::reclaim`]), waiting then for
//! the streams that used it (see [`crate::stream`]). Dropping never touches
//! the arena, never blocks on it, and never panics.
//!
//! A storage of zero bytes is valid and holds no block: a framework creates
//! empty tensors all the time.
//!
//! A [`StorageSlice`] is a byte range of a storage (a tensor's `narrow` or
//! `slice`); it keeps the storage alive. Slices, storages and plain handles
//! all name bytes through [`AsRange`], which every device-side operation
//! and kernel-argument call takes; they are resolved to addresses when
//! used, so compaction may move the block in between.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::{Error, Result};
use crate::handle::{ElemType, Handle};

/// Handles of dropped storages, waiting for their arena to free them.
#[derive(Debug, Default)]
pub(crate) struct Reclaim {
    queue: Mutex<Vec<Handle>>,
    /// True while `queue` may hold handles: lets the arena skip the lock
    /// when there are none. Written only under the lock; a plain store, so
    /// a drop costs one lock and no other read-modify-write.
    nonempty: AtomicBool,
}

impl Reclaim {
    fn lock(&self) -> MutexGuard<'_, Vec<Handle>> {
        // A panic elsewhere while the lock was held cannot leave the Vec
        // inconsistent, so a poisoned lock is used as it is.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, h: Handle) {
        let mut q = self.lock();
        q.push(h);
        self.nonempty.store(true, Ordering::Release);
    }

    /// Moves every queued handle into `out`.
    pub(crate) fn take(&self, out: &mut Vec<Handle>) {
        if !self.nonempty.load(Ordering::Acquire) {
            return;
        }
        let mut q = self.lock();
        self.nonempty.store(false, Ordering::Relaxed);
        out.append(&mut q);
    }

    /// Handles waiting to be freed.
    pub(crate) fn pending(&self) -> usize {
        if self.nonempty.load(Ordering::Acquire) {
            self.lock().len()
        } else {
            0
        }
    }
}

#[derive(Debug)]
struct Inner {
    /// `None` for a zero-byte storage.
    handle: Option<Handle>,
    len_bytes: u64,
    elem: Option<ElemType>,
    arena: u64,
    reclaim: Arc<Reclaim>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(h) = self.handle {
            self.reclaim.push(h);
        }
    }
}

/// One block of an arena, owned by every clone of this value; freed (at
/// the arena's next allocation, compaction or `reclaim`) when the last one
/// drops. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Storage {
    inner: Arc<Inner>,
}

impl Storage {
    pub(crate) fn new(
        handle: Option<Handle>,
        len_bytes: u64,
        elem: Option<ElemType>,
        arena: u64,
        reclaim: Arc<Reclaim>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                handle,
                len_bytes,
                elem,
                arena,
                reclaim,
            }),
        }
    }

    /// Bytes of the storage.
    pub fn len_bytes(&self) -> u64 {
        self.inner.len_bytes
    }

    /// Elements of its element type (bytes for an untyped storage).
    pub fn len(&self) -> u64 {
        match self.inner.elem {
            Some(e) if e.size_bytes > 0 => self.inner.len_bytes / e.size_bytes as u64,
            _ => self.inner.len_bytes,
        }
    }

    /// True for a storage of zero bytes (which holds no block).
    pub fn is_empty(&self) -> bool {
        self.inner.len_bytes == 0
    }

    /// The element type it was allocated for, if typed.
    pub fn elem(&self) -> Option<ElemType> {
        self.inner.elem
    }

    /// The block's handle (`None` for an empty storage). The handle is a
    /// plain value: it goes stale when the last owner drops.
    pub fn handle(&self) -> Option<Handle> {
        self.inner.handle
    }

    /// Id of the arena it belongs to.
    pub fn arena_id(&self) -> u64 {
        self.inner.arena
    }

    /// True when both are clones of one storage.
    pub fn same_storage(&self, other: &Storage) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Owners now (clones and slices alive).
    pub fn owners(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// Elements `start..end` of the storage (bytes for an untyped one), as
    /// a slice that keeps it alive. [`Error::RangeOutOfBounds`] past its end.
    pub fn slice(&self, range: std::ops::Range<u64>) -> Result<StorageSlice> {
        self.whole().slice(range)
    }

    /// The whole storage as a slice.
    pub fn whole(&self) -> StorageSlice {
        StorageSlice {
            storage: self.clone(),
            offset_bytes: 0,
            len_bytes: self.inner.len_bytes,
        }
    }
}

/// Bytes `offset_bytes..offset_bytes + len_bytes` of a [`Storage`], which it
/// keeps alive: a tensor's view after `narrow` / `slice`.
#[derive(Debug, Clone)]
pub struct StorageSlice {
    storage: Storage,
    offset_bytes: u64,
    len_bytes: u64,
}

impl StorageSlice {
    /// The storage it is a slice of.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Offset in the storage, in bytes.
    pub fn offset_bytes(&self) -> u64 {
        self.offset_bytes
    }

    /// Bytes of the slice.
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// Elements of the storage's type in the slice (bytes if untyped).
    pub fn len(&self) -> u64 {
        self.len_bytes / self.elem_bytes()
    }

    /// True for a slice of zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    fn elem_bytes(&self) -> u64 {
        match self.storage.elem() {
            Some(e) if e.size_bytes > 0 => e.size_bytes as u64,
            _ => 1,
        }
    }

    /// Elements `start..end` of this slice (bytes if untyped).
    /// [`Error::RangeOutOfBounds`] past its end.
    pub fn slice(&self, range: std::ops::Range<u64>) -> Result<StorageSlice> {
        let e = self.elem_bytes();
        let out = || Error::RangeOutOfBounds {
            offset_bytes: range.start.saturating_mul(e),
            len_bytes: range.end.saturating_sub(range.start).saturating_mul(e),
            available_bytes: self.len_bytes,
        };
        if range.start > range.end {
            return Err(out());
        }
        let start = range.start.checked_mul(e).ok_or_else(out)?;
        let end = range.end.checked_mul(e).ok_or_else(out)?;
        if end > self.len_bytes {
            return Err(out());
        }
        Ok(StorageSlice {
            storage: self.storage.clone(),
            offset_bytes: self.offset_bytes + start,
            len_bytes: end - start,
        })
    }
}

/// Bytes of one block: what a [`Handle`], a [`Storage`] or a
/// [`StorageSlice`] names, resolved to an address only when used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRange {
    /// The block (`None`: zero bytes, no block).
    pub handle: Option<Handle>,
    /// Offset in the block, in bytes.
    pub offset_bytes: u64,
    /// Bytes; `None` for "to the block's end".
    pub len_bytes: Option<u64>,
}

/// Anything that names bytes of an arena block.
pub trait AsRange {
    /// The bytes it names.
    fn block_range(&self) -> BlockRange;
}

impl AsRange for Handle {
    fn block_range(&self) -> BlockRange {
        BlockRange {
            handle: Some(*self),
            offset_bytes: 0,
            len_bytes: None,
        }
    }
}

impl AsRange for Storage {
    fn block_range(&self) -> BlockRange {
        BlockRange {
            handle: self.handle(),
            offset_bytes: 0,
            len_bytes: Some(self.len_bytes()),
        }
    }
}

impl AsRange for StorageSlice {
    fn block_range(&self) -> BlockRange {
        BlockRange {
            handle: self.storage.handle(),
            offset_bytes: self.offset_bytes,
            len_bytes: Some(self.len_bytes),
        }
    }
}

impl<R: AsRange + ?Sized> AsRange for &R {
    fn block_range(&self) -> BlockRange {
        (**self).block_range()
    }
}

#[cfg(test)]
mod tests {
    use crate::{Arena, ArenaConfig, Error, StorageSlice};

    #[test]
    fn dropped_storages_are_freed_at_the_next_allocation() {
        let mut a = Arena::host(ArenaConfig::new(1 << 16)).unwrap();
        let s = a.alloc_storage_elems::<f32>(100).unwrap();
        let t = s.clone();
        assert_eq!((s.len(), s.len_bytes(), s.owners()), (100, 400, 2));
        let h = s.handle().unwrap();
        drop(s);
        assert_eq!(a.pending_reclaim(), 0, "one owner left");
        let th = std::thread::spawn(move || drop(t));
        th.join().unwrap();
        assert_eq!(a.pending_reclaim(), 1);
        assert!(a.contains(h), "not freed until the arena's next call");
        let _u = a.alloc_storage(8).unwrap();
        assert!(!a.contains(h));
        assert_eq!(a.pending_reclaim(), 0);
    }

    #[test]
    fn empty_storages_hold_no_block_and_slices_check_their_range() {
        let mut a = Arena::host(ArenaConfig::new(1 << 16)).unwrap();
        let e = a.alloc_storage_elems::<f32>(0).unwrap();
        assert!(e.is_empty() && e.handle().is_none());
        assert_eq!(a.stats().live_blocks, 0);
        assert_eq!(a.read_range::<f32>(&e).unwrap(), Vec::<f32>::new());
        a.write_range::<f32>(&e, &[]).unwrap();
        let s = a.alloc_storage_elems::<u32>(10).unwrap();
        let mid: StorageSlice = s.slice(2..5).unwrap();
        assert_eq!((mid.offset_bytes(), mid.len_bytes(), mid.len()), (8, 12, 3));
        assert!(matches!(
            s.slice(5..11),
            Err(Error::RangeOutOfBounds {
                offset_bytes: 20,
                len_bytes: 24,
                available_bytes: 40
            })
        ));
        assert!(mid.slice(0..4).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = s.slice(3..2);
        assert!(backwards.is_err());
        drop(s);
        // The slice keeps the storage alive.
        a.reclaim().unwrap();
        assert_eq!(a.stats().live_blocks, 1);
        drop(mid);
        assert_eq!(a.reclaim().unwrap(), 1);
        assert_eq!(a.stats().live_blocks, 0);
    }

    #[test]
    fn device_ops_on_ranges_match_a_model_and_bad_calls_change_nothing() {
        let mut a = Arena::host(ArenaConfig::new(1 << 16)).unwrap();
        let x = a.alloc_storage_zeroed::<u32>(8).unwrap();
        let y = a.alloc_storage_elems::<u32>(8).unwrap();
        assert_eq!(a.read_range::<u32>(&x).unwrap(), vec![0; 8]);
        a.fill(&y, 7u32).unwrap();
        a.write_range(&x.slice(2..4).unwrap(), &[1u32, 2]).unwrap();
        a.copy(&x.slice(0..4).unwrap(), &y.slice(4..8).unwrap())
            .unwrap();
        a.copy(&y.slice(0..2).unwrap(), &y.slice(2..4).unwrap())
            .unwrap();
        assert_eq!(a.read_range::<u32>(&y).unwrap(), [7, 7, 7, 7, 0, 0, 1, 2]);
        let before = a.read_range::<u32>(&y).unwrap();
        let stats = a.stats();
        for e in [
            a.copy(&y.slice(0..3).unwrap(), &y.slice(2..5).unwrap())
                .unwrap_err(),
            a.copy(&x.slice(0..3).unwrap(), &y.slice(0..2).unwrap())
                .unwrap_err(),
            a.write_range(&y.slice(0..2).unwrap(), &[1u32]).unwrap_err(),
            a.write_range(&y, &[1.0f32; 8]).unwrap_err(),
            a.fill(&y, 1u8).unwrap_err(),
            a.fill(&y, [0u8; 3]).unwrap_err(),
        ] {
            assert!(
                matches!(
                    e,
                    Error::OverlappingRanges { .. }
                        | Error::LengthMismatch { .. }
                        | Error::TypeMismatch { .. }
                        | Error::InvalidPattern { .. }
                ),
                "{e}"
            );
        }
        assert_eq!(a.read_range::<u32>(&y).unwrap(), before);
        assert_eq!(a.stats().allocs, stats.allocs);
        a.fill_bytes(&y, 0xff).unwrap();
        assert_eq!(a.read_range::<u32>(&y).unwrap(), vec![u32::MAX; 8]);
    }

    #[test]
    fn streams_are_checked_and_uses_recorded() {
        let mut a = Arena::host(ArenaConfig::new(1 << 16)).unwrap();
        let s = a.register_stream().unwrap();
        let x = a.alloc_storage(64).unwrap();
        a.record_stream(&x, s).unwrap();
        a.wait_on_arena(s).unwrap();
        let bogus = crate::StreamId(9, a.id());
        assert!(matches!(
            a.record_stream(&x, bogus),
            Err(Error::UnknownStream {
                stream: 9,
                registered: 2
            })
        ));
        assert!(a.wait_on_arena(bogus).is_err());
        // Another arena's stream is refused even where its index exists.
        let mut b = Arena::host(ArenaConfig::new(1 << 16)).unwrap();
        let sb = b.register_stream().unwrap();
        assert_eq!(sb.index(), s.index());
        assert!(matches!(
            a.record_stream(&x, sb),
            Err(Error::UnknownStream { .. })
        ));
        assert!(a.wait_on_arena(sb).is_err());
        a.record_stream(&x, crate::StreamId::ARENA).unwrap();
        drop(x);
        assert_eq!(a.reclaim().unwrap(), 1);
    }
}
