//! Streams and storage lifetimes: which streams used a block, the waits
//! that keep the arena from moving or reusing bytes under them, and the
//! reclaim queue that dropped [`Storage`]s leave their blocks in. The
//! contract is in [`StreamId`](crate::StreamId).

use super::Arena;
use crate::backend::{check_stream, Backend};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::handle::BlockKey;
use crate::storage::{AsRange, Storage};
use crate::stream::StreamId;

impl<B: Backend> Arena<B> {
    /// Records that the bytes `r` names are used by work enqueued on
    /// `stream` (PyTorch's `record_stream`): the arena will not free, move,
    /// spill or write the block before that work is done, waiting with
    /// stream waits, never on the host. Record after enqueueing the work or
    /// before; the wait covers whatever `stream` holds when it happens.
    /// Kernel arguments taken for a stream record it themselves.
    ///
    /// Takes `&self` (the records have a lock of their own): threads
    /// sharing the arena record under its shared lock.
    pub fn record_stream(&self, r: &impl AsRange, stream: StreamId) -> Result<()> {
        self.check_usable()?;
        self.check_own_stream(stream)?;
        let Some(h) = r.block_range().handle else {
            return Ok(()); // an empty storage uses nothing
        };
        let b = self.block(h)?;
        if stream != StreamId::ARENA {
            b.with_streams(|s| {
                let u = s.get_or_insert_with(Default::default);
                if !u.uses.contains(&stream) {
                    u.uses.push(stream);
                }
            });
        }
        Ok(())
    }

    /// Checks that `stream` is registered with this arena (not another's).
    pub(crate) fn check_own_stream(&self, stream: StreamId) -> Result<()> {
        if stream.1 != 0 && stream.1 != self.id {
            return Err(Error::UnknownStream {
                stream: stream.0,
                registered: self.backend.stream_count(),
            });
        }
        check_stream(stream, self.backend.stream_count())
    }

    /// Makes the arena stream wait for the streams that used block `key`.
    pub(super) fn wait_uses(&self, key: BlockKey) -> Result<()> {
        if let Some(b) = self.blocks.get(key) {
            for s in b.uses() {
                self.backend.wait_stream(s)?;
            }
        }
        Ok(())
    }

    /// Makes later work on `stream` wait for the arena stream's work it has
    /// not waited for yet (moves, writes, fills, copies, frees): call it
    /// before enqueueing work that uses arena bytes on `stream` (kernel
    /// arguments taken for a stream do). An event record and a stream wait
    /// when there is such work, nothing otherwise; the host never waits.
    ///
    /// Takes `&self`: several threads sharing the arena join their streams
    /// at once (a stream joined twice waits twice, which is harmless).
    pub fn wait_on_arena(&self, stream: StreamId) -> Result<()> {
        self.check_usable()?;
        self.check_own_stream(stream)?;
        if stream == StreamId::ARENA {
            return Ok(());
        }
        // Registration sized the table; a missing entry is an unknown stream.
        let joined = self
            .joined
            .get(stream.0 as usize)
            .ok_or(Error::UnknownStream {
                stream: stream.0,
                registered: self.backend.stream_count(),
            })?;
        // `epoch` changes only under `&mut self`, so it is stable here.
        if joined.load(std::sync::atomic::Ordering::Acquire) != self.epoch {
            self.backend.join_arena(stream)?;
            joined.store(self.epoch, std::sync::atomic::Ordering::Release);
        }
        Ok(())
    }

    // ---- owned storage --------------------------------------------------------

    /// Allocates `bytes` as an owned [`Storage`] (untyped): freed when its
    /// last owner drops. Zero bytes is valid and takes no block.
    pub fn alloc_storage(&mut self, bytes: u64) -> Result<Storage> {
        self.storage(bytes, self.config.alignment_bytes, None)
    }

    /// `numel` elements of `dtype` as an owned [`Storage`], aligned for
    /// them: a framework's allocation for a runtime dtype.
    pub fn alloc_storage_dtype(&mut self, dtype: DType, numel: u64) -> Result<Storage> {
        let (bytes, align) = self.typed_layout(dtype, numel)?;
        self.storage(bytes, align, Some(dtype))
    }

    /// `numel` elements of `T` as an owned [`Storage`] of `T`'s dtype.
    pub fn alloc_storage_elems<T: Element>(&mut self, numel: u64) -> Result<Storage> {
        self.alloc_storage_dtype(T::DTYPE, numel)
    }

    /// `numel` zeroed elements of `T` as an owned [`Storage`] (filled on
    /// the arena stream).
    pub fn alloc_storage_zeroed<T: Element>(&mut self, numel: u64) -> Result<Storage> {
        let s = self.alloc_storage_elems::<T>(numel)?;
        if let Some(h) = s.handle() {
            self.fill_bytes(&h, &[0])?;
        }
        Ok(s)
    }

    fn storage(&mut self, bytes: u64, align: u64, dtype: Option<DType>) -> Result<Storage> {
        let handle = if bytes == 0 {
            self.check_usable()?;
            None
        } else {
            Some(self.alloc_impl(bytes, align, dtype)?)
        };
        Ok(Storage::new(
            handle,
            bytes,
            dtype,
            self.id,
            std::sync::Arc::clone(&self.reclaim),
        ))
    }

    /// Frees the blocks of storages dropped since the last call (it runs by
    /// itself at every allocation and compaction). A block still pinned
    /// waits for its last unpin. Returns the blocks freed.
    pub fn reclaim(&mut self) -> Result<u64> {
        self.check_usable()?;
        self.drain_reclaim()
    }

    /// Blocks of dropped storages waiting to be freed.
    pub fn pending_reclaim(&self) -> u64 {
        (self.reclaim.pending() + self.reclaiming.len()) as u64
    }

    pub(super) fn drain_reclaim(&mut self) -> Result<u64> {
        self.reclaim.take(&mut self.reclaiming);
        let mut freed = 0;
        let mut i = 0;
        while i < self.reclaiming.len() {
            let h = self.reclaiming[i];
            match self.free(h) {
                Ok(()) => {
                    self.reclaiming.swap_remove(i);
                    freed += 1;
                }
                Err(Error::Pinned { .. }) => i += 1,
                // Freed by hand through its handle already.
                Err(Error::StaleHandle) => {
                    self.reclaiming.swap_remove(i);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(freed)
    }
}
