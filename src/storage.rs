//! Storage a framework's tensor can own (see [`Storage`]).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::handle::Handle;

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

    /// Moves every queued handle into `out`. Every allocation calls it:
    /// inline, an empty queue costs a load and a test.
    #[inline]
    pub(crate) fn take(&self, out: &mut Vec<Handle>) {
        if self.nonempty.load(Ordering::Acquire) {
            self.take_queued(out);
        }
    }

    fn take_queued(&self, out: &mut Vec<Handle>) {
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
    dtype: Option<DType>,
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
/// drops.
///
/// A [`Storage`] is one block of an arena held by shared ownership: `Send +
/// Sync`, cheap to clone (an `Arc`), with its length and [`DType`] (or none:
/// untyped bytes) readable without touching the arena. When the last clone (and the last
/// [`StorageSlice`] of it) is dropped, on whatever thread, its handle goes
/// to the arena's reclaim queue; the arena frees it at its next allocation
/// or compaction, or when asked ([`crate::Arena::reclaim`]), waiting then for
/// the streams that used it (see [`StreamId`](crate::StreamId)). Dropping never touches
/// the arena, never blocks on it, and never panics.
///
/// A storage of zero bytes is valid and holds no block: a framework creates
/// empty tensors all the time.
///
/// A [`StorageSlice`] is a byte range of a storage (a tensor's `narrow` or
/// `slice`), read as its storage's dtype or, reinterpreted without a copy,
/// as another ([`StorageSlice::as_dtype`]); it keeps the storage alive.
/// Lengths are unambiguous: `len_bytes` counts bytes, `numel` elements of
/// the dtype (bytes, for untyped storage). Slices, storages and plain handles
/// all name bytes through [`AsRange`], which every device-side operation
/// and kernel-argument call takes; they are resolved to addresses when
/// used, so compaction may move the block in between.
#[derive(Debug, Clone)]
pub struct Storage {
    inner: Arc<Inner>,
}

impl Storage {
    pub(crate) fn new(
        handle: Option<Handle>,
        len_bytes: u64,
        dtype: Option<DType>,
        arena: u64,
        reclaim: Arc<Reclaim>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                handle,
                len_bytes,
                dtype,
                arena,
                reclaim,
            }),
        }
    }

    /// Bytes of the storage.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage_dtype(DType::F32, 10)?;
    /// assert_eq!(s.len_bytes(), 40);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn len_bytes(&self) -> u64 {
        self.inner.len_bytes
    }

    /// Elements of its dtype; an untyped storage's elements are bytes.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage_dtype(DType::F16, 10)?;
    /// assert_eq!(s.numel(), 10);
    /// assert_eq!(arena.alloc_storage(10)?.numel(), 10); // untyped: bytes
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn numel(&self) -> u64 {
        self.inner.len_bytes / elem_bytes(self.inner.dtype)
    }

    /// True for a storage of zero bytes (which holds no block).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let empty = arena.alloc_storage_dtype(DType::F32, 0)?;
    /// assert!(empty.is_empty() && empty.handle().is_none()); // no block
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.inner.len_bytes == 0
    }

    /// The dtype it was allocated for; `None` for untyped bytes.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// assert_eq!(arena.alloc_storage_dtype(DType::BF16, 4)?.dtype(), Some(DType::BF16));
    /// assert_eq!(arena.alloc_storage(4)?.dtype(), None);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn dtype(&self) -> Option<DType> {
        self.inner.dtype
    }

    /// The block's handle (`None` for an empty storage). The handle is a
    /// plain value: it goes stale when the last owner drops.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage(256)?;
    /// let h = s.handle().expect("a block");
    /// assert_eq!(arena.info(h)?.size_bytes, 256);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn handle(&self) -> Option<Handle> {
        self.inner.handle
    }

    /// Id of the arena it belongs to.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage(256)?;
    /// assert_eq!(s.arena_id(), arena.id());
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn arena_id(&self) -> u64 {
        self.inner.arena
    }

    /// True when both are clones of one storage.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage(256)?;
    /// let t = s.clone();
    /// assert!(s.same_storage(&t));
    /// assert!(!s.same_storage(&arena.alloc_storage(256)?));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn same_storage(&self, other: &Storage) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Owners now (clones and slices alive).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage(256)?;
    /// let view = s.slice(0..16)?; // a slice owns it too
    /// assert_eq!(s.owners(), 2);
    /// drop(view);
    /// assert_eq!(s.owners(), 1);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn owners(&self) -> u64 {
        Arc::strong_count(&self.inner) as u64
    }

    /// The whole storage as a slice.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage_dtype(DType::U32, 8)?;
    /// let all = s.whole();
    /// assert_eq!((all.offset_bytes(), all.numel()), (0, 8));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn whole(&self) -> StorageSlice {
        StorageSlice {
            storage: self.clone(),
            offset_bytes: 0,
            len_bytes: self.inner.len_bytes,
            dtype: self.inner.dtype,
        }
    }

    /// Elements `start..end` of the storage, as a slice that keeps it
    /// alive (see [`StorageSlice::slice`]).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage_dtype(DType::F32, 8)?;
    /// let rows = s.slice(2..6)?; // elements
    /// assert_eq!((rows.offset_bytes(), rows.len_bytes()), (8, 16));
    /// assert!(s.slice(6..9).is_err()); // past the end
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn slice(&self, range: Range<u64>) -> Result<StorageSlice> {
        self.whole().slice(range)
    }

    /// Bytes `start..end` of the storage (see [`StorageSlice::slice_bytes`]).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage_dtype(DType::F32, 8)?;
    /// assert_eq!(s.slice_bytes(4..12)?.numel(), 2);
    /// assert!(s.slice_bytes(2..6).is_err()); // inside an element: Misaligned
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn slice_bytes(&self, range: Range<u64>) -> Result<StorageSlice> {
        self.whole().slice_bytes(range)
    }

    /// The whole storage read as `dtype`, without a copy (see
    /// [`StorageSlice::as_dtype`]).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage_dtype(DType::F32, 2)?;
    /// arena.write(&s, &[1.0f32, 2.0])?;
    /// let bits = s.as_dtype(DType::U32)?; // the same bytes, no copy
    /// assert_eq!(arena.read::<u32>(&bits)?, [1.0f32.to_bits(), 2.0f32.to_bits()]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn as_dtype(&self, dtype: DType) -> Result<StorageSlice> {
        self.whole().as_dtype(dtype)
    }
}

/// Bytes of one element of `dtype` (1 for untyped bytes).
fn elem_bytes(dtype: Option<DType>) -> u64 {
    dtype.map_or(1, DType::size_bytes)
}

/// Bytes `offset_bytes..offset_bytes + len_bytes` of a [`Storage`], which it
/// keeps alive, read as a dtype: a tensor's view after `narrow`, `slice` or
/// a reinterpreting `view(dtype)`.
#[derive(Debug, Clone)]
pub struct StorageSlice {
    storage: Storage,
    offset_bytes: u64,
    len_bytes: u64,
    dtype: Option<DType>,
}

impl StorageSlice {
    /// The storage it is a slice of.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage(64)?;
    /// assert!(s.slice(8..16)?.storage().same_storage(&s));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Offset in the storage, in bytes.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage_dtype(DType::F64, 4)?;
    /// assert_eq!(s.slice(1..3)?.offset_bytes(), 8);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn offset_bytes(&self) -> u64 {
        self.offset_bytes
    }

    /// Bytes of the slice.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage_dtype(DType::F64, 4)?;
    /// assert_eq!(s.slice(1..3)?.len_bytes(), 16);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// Elements of its dtype in the slice; bytes when untyped.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage_dtype(DType::F64, 4)?;
    /// assert_eq!(s.slice(1..3)?.numel(), 2);
    /// assert_eq!(s.slice(1..3)?.as_dtype(DType::U8)?.numel(), 16);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn numel(&self) -> u64 {
        self.len_bytes / elem_bytes(self.dtype)
    }

    /// True for a slice of zero bytes.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage_dtype(DType::F32, 4)?;
    /// assert!(s.slice(2..2)?.is_empty());
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    /// The dtype the slice is read as: its storage's, or the one
    /// [`as_dtype`](StorageSlice::as_dtype) gave it; `None` for untyped
    /// bytes.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage_dtype(DType::F32, 4)?;
    /// assert_eq!(s.whole().dtype(), Some(DType::F32));
    /// assert_eq!(s.as_dtype(DType::I32)?.dtype(), Some(DType::I32));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn dtype(&self) -> Option<DType> {
        self.dtype
    }

    /// Elements `start..end` of this slice, in its dtype (bytes when
    /// untyped). [`Error::OutOfBounds`] (in bytes) past its end or when
    /// `end < start`.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage_dtype(DType::U16, 10)?;
    /// let mid = s.slice(2..8)?.slice(1..3)?; // elements 3..5 of s
    /// assert_eq!((mid.offset_bytes(), mid.numel()), (6, 2));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn slice(&self, range: Range<u64>) -> Result<StorageSlice> {
        let e = elem_bytes(self.dtype);
        // Saturated: a byte offset past u64::MAX is past any end.
        self.sub(range.start.saturating_mul(e), range.end.saturating_mul(e))
    }

    /// Bytes `start..end` of this slice, keeping its dtype: both ends must
    /// fall on element boundaries ([`Error::Misaligned`]); any byte range
    /// of an untyped slice. [`Error::OutOfBounds`] past its end or when
    /// `end < start`.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage(16)?; // untyped: any byte range
    /// let bytes = s.whole().slice_bytes(3..7)?;
    /// assert_eq!((bytes.offset_bytes(), bytes.len_bytes()), (3, 4));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn slice_bytes(&self, range: Range<u64>) -> Result<StorageSlice> {
        let s = self.sub(range.start, range.end)?;
        if let Some(d) = self.dtype {
            check_bitcast(s.offset_bytes, s.len_bytes, d)?;
        }
        Ok(s)
    }

    /// The same bytes read as `dtype`, without a copy (a bitcast, as a
    /// framework's `view(dtype)`): the length must be a whole number of
    /// `dtype`'s elements and the offset in the storage a multiple of its
    /// size ([`Error::Misaligned`]).
    /// Typed calls on the result check against `dtype`; the block's own
    /// alignment is checked when a kernel view is taken.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage_dtype(DType::U8, 8)?;
    /// let words = s.slice(4..8)?.as_dtype(DType::U32)?; // 4 bytes at 4: one u32
    /// assert_eq!(words.numel(), 1);
    /// assert!(s.slice(1..5)?.as_dtype(DType::U32).is_err()); // offset 1: Misaligned
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn as_dtype(&self, dtype: DType) -> Result<StorageSlice> {
        check_bitcast(self.offset_bytes, self.len_bytes, dtype)?;
        Ok(StorageSlice {
            dtype: Some(dtype),
            ..self.clone()
        })
    }

    /// Bytes `start..end` of this slice: [`Error::OutOfBounds`] unless
    /// `start <= end <= len`.
    fn sub(&self, start: u64, end: u64) -> Result<StorageSlice> {
        if start > end || end > self.len_bytes {
            return Err(Error::OutOfBounds {
                start_bytes: start,
                end_bytes: end,
                available_bytes: self.len_bytes,
            });
        }
        Ok(StorageSlice {
            storage: self.storage.clone(),
            offset_bytes: self.offset_bytes + start,
            len_bytes: end - start,
            dtype: self.dtype,
        })
    }
}

/// Checks that `len` bytes at `offset` (in a block) hold whole, aligned
/// elements of `dtype`.
fn check_bitcast(offset: u64, len: u64, dtype: DType) -> Result<()> {
    let e = dtype.size_bytes();
    if len % e != 0 || offset % e != 0 {
        return Err(Error::Misaligned {
            offset_bytes: offset,
            len_bytes: len,
            elem_type: dtype.name(),
            elem_bytes: e,
        });
    }
    Ok(())
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
    /// The dtype the bytes are read as; `None`: the block's own (a plain
    /// handle, or a storage as allocated).
    pub dtype: Option<DType>,
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
            dtype: None,
        }
    }
}

impl AsRange for Storage {
    fn block_range(&self) -> BlockRange {
        BlockRange {
            handle: self.handle(),
            offset_bytes: 0,
            len_bytes: Some(self.len_bytes()),
            dtype: self.dtype(),
        }
    }
}

impl AsRange for StorageSlice {
    fn block_range(&self) -> BlockRange {
        BlockRange {
            handle: self.storage.handle(),
            offset_bytes: self.offset_bytes,
            len_bytes: Some(self.len_bytes),
            dtype: self.dtype,
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
    use crate::{Arena, ArenaConfig, DType, Error, StorageSlice};

    #[test]
    fn dropped_storages_are_freed_at_the_next_allocation() {
        let mut a = Arena::host(ArenaConfig::new(1 << 16)).unwrap();
        let s = a.alloc_storage_dtype(DType::F32, 100).unwrap();
        let t = s.clone();
        assert_eq!((s.numel(), s.len_bytes(), s.owners()), (100, 400, 2));
        let h = s.handle().unwrap();
        drop(s);
        assert_eq!(a.stats().pending_reclaim, 0, "one owner left");
        let th = std::thread::spawn(move || drop(t));
        th.join().unwrap();
        assert_eq!(a.stats().pending_reclaim, 1);
        assert!(a.info(h).is_ok(), "not freed until the arena's next call");
        let _u = a.alloc_storage(8).unwrap();
        assert!(a.info(h).is_err());
        assert_eq!(a.stats().pending_reclaim, 0);
    }

    #[test]
    fn empty_storages_hold_no_block_and_slices_check_their_range() {
        let mut a = Arena::host(ArenaConfig::new(1 << 16)).unwrap();
        let e = a.alloc_storage_dtype(DType::F32, 0).unwrap();
        assert!(e.is_empty() && e.handle().is_none());
        assert_eq!(a.stats().live_blocks, 0);
        assert_eq!(a.read::<f32>(&e).unwrap(), Vec::<f32>::new());
        a.write::<f32>(&e, &[]).unwrap();
        let s = a.alloc_storage_dtype(DType::U32, 10).unwrap();
        let mid: StorageSlice = s.slice(2..5).unwrap();
        assert_eq!(
            (mid.offset_bytes(), mid.len_bytes(), mid.numel()),
            (8, 12, 3)
        );
        assert!(matches!(
            s.slice(5..11),
            Err(Error::OutOfBounds {
                start_bytes: 20,
                end_bytes: 44,
                available_bytes: 40
            })
        ));
        assert!(mid.slice(0..4).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = s.slice(3..2);
        assert_eq!(
            backwards.err(),
            Some(Error::OutOfBounds {
                start_bytes: 12,
                end_bytes: 8,
                available_bytes: 40
            })
        );
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
        let x = a.alloc_storage_dtype(DType::U32, 8).unwrap();
        a.fill(&x, 0u32).unwrap();
        let y = a.alloc_storage_dtype(DType::U32, 8).unwrap();
        assert_eq!(a.read::<u32>(&x).unwrap(), vec![0; 8]);
        a.fill(&y, 7u32).unwrap();
        a.write(x.slice(2..4).unwrap(), &[1u32, 2]).unwrap();
        a.copy(x.slice(0..4).unwrap(), y.slice(4..8).unwrap())
            .unwrap();
        a.copy(y.slice(0..2).unwrap(), y.slice(2..4).unwrap())
            .unwrap();
        assert_eq!(a.read::<u32>(&y).unwrap(), [7, 7, 7, 7, 0, 0, 1, 2]);
        let before = a.read::<u32>(&y).unwrap();
        let stats = a.stats();
        for e in [
            a.copy(y.slice(0..3).unwrap(), y.slice(2..5).unwrap())
                .unwrap_err(),
            a.copy(x.slice(0..3).unwrap(), y.slice(0..2).unwrap())
                .unwrap_err(),
            a.write(y.slice(0..2).unwrap(), &[1u32]).unwrap_err(),
            a.write(&y, &[1.0f32; 8]).unwrap_err(),
            a.fill(&y, 1u8).unwrap_err(),
            a.fill(y.as_dtype(DType::U8).unwrap().slice(0..3).unwrap(), 0u32)
                .unwrap_err(),
        ] {
            assert!(
                matches!(
                    e,
                    Error::Overlap { .. }
                        | Error::LengthMismatch { .. }
                        | Error::TypeMismatch { .. }
                ),
                "{e}"
            );
        }
        assert_eq!(a.read::<u32>(&y).unwrap(), before);
        assert_eq!(a.stats().allocs, stats.allocs);
        a.fill(y.as_dtype(DType::U8).unwrap(), 0xffu8).unwrap();
        assert_eq!(a.read::<u32>(&y).unwrap(), vec![u32::MAX; 8]);
    }

    #[test]
    fn streams_are_checked_and_uses_recorded() {
        let mut a = Arena::host(ArenaConfig::new(1 << 16)).unwrap();
        let s = a.register_stream(()).unwrap();
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
        let sb = b.register_stream(()).unwrap();
        assert_eq!(sb.index(), s.index());
        assert!(matches!(
            a.record_stream(&x, sb),
            Err(Error::Foreign { kind: "stream", .. })
        ));
        assert!(a.wait_on_arena(sb).is_err());
        a.record_stream(&x, crate::StreamId::ARENA).unwrap();
        drop(x);
        assert_eq!(a.reclaim().unwrap(), 1);
    }

    #[test]
    fn dtypes_reinterpret_without_a_copy_and_bytes_ignore_them() {
        use crate::DType;
        let mut a = Arena::host(ArenaConfig::new(1 << 16)).unwrap();
        let x = a.alloc_storage_dtype(DType::F32, 4).unwrap();
        assert_eq!(
            (x.dtype(), x.numel(), x.len_bytes()),
            (Some(DType::F32), 4, 16)
        );
        a.write(&x, &[1.0f32, -2.0, 0.5, 8.0]).unwrap();
        // Bytes of any dtype; typed access checked against the dtype.
        let bytes = a.read_bytes(&x).unwrap();
        assert_eq!(&bytes[..4], &1.0f32.to_le_bytes());
        assert!(matches!(
            a.read::<u8>(&x),
            Err(Error::TypeMismatch {
                range_type: "f32",
                requested_type: "u8"
            })
        ));
        // A bitcast: the same bytes as u32s, or as bf16 pairs.
        let bits = x.as_dtype(DType::U32).unwrap();
        assert_eq!(a.read::<u32>(&bits).unwrap()[0], 1.0f32.to_bits());
        let halves = x.slice(1..3).unwrap().as_dtype(DType::BF16).unwrap();
        assert_eq!((halves.offset_bytes(), halves.numel()), (4, 4));
        assert_eq!(a.read::<half::bf16>(&halves).unwrap().len(), 4);
        // Checked: whole elements, aligned offsets.
        let odd = x.as_dtype(DType::U8).unwrap().slice(1..7).unwrap();
        assert_eq!(
            odd.as_dtype(DType::I16).err(),
            Some(Error::Misaligned {
                offset_bytes: 1,
                len_bytes: 6,
                elem_type: "i16",
                elem_bytes: 2
            })
        );
        assert_eq!(
            odd.slice(1..4).unwrap().as_dtype(DType::I16).err(),
            Some(Error::Misaligned {
                offset_bytes: 2,
                len_bytes: 3,
                elem_type: "i16",
                elem_bytes: 2
            })
        );
        assert!(x.slice_bytes(2..6).is_err());
        assert_eq!(x.slice_bytes(4..12).unwrap().numel(), 2);
        // Byte writes into a typed range; bool and fp8 go through bytes.
        a.write_bytes(x.slice(0..1).unwrap(), &2.0f32.to_le_bytes())
            .unwrap();
        assert_eq!(a.read::<f32>(&x).unwrap()[0], 2.0);
        let mask = a.alloc_storage_dtype(DType::Bool, 3).unwrap();
        a.write_bytes(&mask, &[1, 0, 1]).unwrap();
        assert_eq!(
            a.read::<u8>(&mask.as_dtype(DType::U8).unwrap()).unwrap(),
            [1, 0, 1]
        );
        // Copies need one dtype, or a reinterpretation.
        let y = a.alloc_storage_dtype(DType::U32, 4).unwrap();
        assert!(matches!(a.copy(&x, &y), Err(Error::TypeMismatch { .. })));
        a.copy(&bits, &y).unwrap();
        assert_eq!(a.read::<u32>(&y).unwrap()[0], 2.0f32.to_bits());
        // Element counts that overflow say so.
        assert_eq!(
            a.alloc_storage_dtype(DType::F64, u64::MAX / 2).err(),
            Some(Error::LimitReached {
                what: "elements of this dtype in one block (its bytes must fit in u64)",
                requested: u64::MAX / 2,
                limit: u64::MAX / 8
            })
        );
    }
}
