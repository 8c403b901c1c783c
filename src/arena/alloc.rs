//! Allocation: blocks named by handles (freed by hand) and owned storages
//! (freed when their last owner drops, through the reclaim queue), frees
//! and pins.

use std::sync::atomic::AtomicU64;

use super::{Arena, Block, Place};
use crate::arena::core::Core;
use crate::backend::Backend;
use crate::config::MAX_ALIGN;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::handle::Handle;
use crate::storage::Storage;

impl<B: Backend> Arena<B> {
    /// Allocates `bytes` at the arena's default alignment.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let h = arena.alloc(1000)?;
    /// let info = arena.info(h)?;
    /// assert_eq!((info.size_bytes, info.reserved_bytes), (1000, 1024)); // 256 B alignment
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn alloc(&mut self, bytes: u64) -> Result<Handle> {
        self.alloc_impl(bytes, self.config.alignment_bytes, None)
    }

    /// Allocates `bytes` at `align_bytes` (a power of two; the arena's
    /// alignment is the floor).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let h = arena.alloc_aligned(100, 4096)?;
    /// assert_eq!(arena.resolve(h)? % 4096, 0);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn alloc_aligned(&mut self, bytes: u64, align_bytes: u64) -> Result<Handle> {
        self.alloc_impl(bytes, align_bytes, None)
    }

    /// Allocates `numel` elements of `dtype`, aligned for them; the block
    /// is typed (typed calls check their element type against it). For a
    /// Rust element type `T`: `alloc_dtype(T::DTYPE, n)`.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let x = arena.alloc_dtype(DType::F32, 256)?; // 1 KiB of f32
    /// arena.write(x, &[0.5f32; 256])?;
    /// assert_eq!(arena.info(x)?.dtype, Some(DType::F32));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn alloc_dtype(&mut self, dtype: DType, numel: u64) -> Result<Handle> {
        let (bytes, align) = self.typed_layout(dtype, numel)?;
        self.alloc_impl(bytes, align, Some(dtype))
    }

    /// Bytes and alignment of `numel` elements of `dtype` in this arena.
    pub(super) fn typed_layout(&self, dtype: DType, numel: u64) -> Result<(u64, u64)> {
        let elem = dtype.size_bytes();
        let bytes = numel.checked_mul(elem).ok_or(Error::LimitReached {
            what: "elements of this dtype in one block (its bytes must fit in u64)",
            requested: numel,
            limit: u64::MAX / elem,
        })?;
        Ok((bytes, elem.max(self.config.alignment_bytes)))
    }

    pub(super) fn alloc_impl(
        &mut self,
        bytes: u64,
        align: u64,
        dtype: Option<DType>,
    ) -> Result<Handle> {
        self.check_usable()?;
        if bytes == 0 {
            return Err(Error::ZeroSize);
        }
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(Error::InvalidAlignment {
                align_bytes: align,
                max_align_bytes: MAX_ALIGN,
            });
        }
        let align = align.max(self.config.alignment_bytes);
        let granule = self.config.alignment_bytes;
        // An elastic arena may map up to its limit.
        let capacity = match self.elastic {
            Some(_) => self.core.backend.capacity_bytes(),
            None => self.core.capacity(),
        };
        let reserved = bytes
            .checked_add(granule - 1)
            .map(|b| b & !(granule - 1))
            // Past u64::MAX once rounded: larger than any region.
            .ok_or(Error::TooLarge {
                requested_bytes: bytes,
                capacity_bytes: capacity,
            })?;
        if reserved > capacity {
            return Err(Error::TooLarge {
                requested_bytes: reserved,
                capacity_bytes: capacity,
            });
        }
        self.drain_reclaim()?;
        let node = self.place_on_device(reserved, align, &[])?;
        let (slot, offset) = (node.slot(), node.offset());
        let core = &mut self.core;
        let now = core.tick_mut();
        let inserted = core.blocks.insert(Block {
            place: Place::Device(node),
            size: bytes,
            dtype,
            streams: Default::default(),
            last_use: AtomicU64::new(now),
            // `align <= MAX_ALIGN < 2^32`, checked above.
            align: u32::try_from(align).unwrap_or(u32::MAX),
            pins: 0,
            lag: None,
        });
        let key = match inserted {
            Ok(key) => key,
            Err(block) => {
                // Every one of the 2^32 handle slots is in use: give the
                // space back, unchanged.
                self.policy.abandon();
                if let Place::Device(node) = block.place {
                    self.core.give_back(node)?;
                }
                return Err(Error::LimitReached {
                    what: "handle table slots (blocks live at once)",
                    requested: core_slots(&self.core) + 1,
                    limit: 1 << 32,
                });
            }
        };
        let core = &mut self.core;
        core.set_owner(slot, key);
        self.policy
            .commit(key, bytes, u32::try_from(align).unwrap_or(u32::MAX), offset);
        core.set_entry(key, Some((offset, bytes)));
        let allocated = core.index.capacity() - core.index.free_bytes();
        let c = &mut core.counters;
        c.allocs += 1;
        // Exact: live sizes add up to at most the region plus the host
        // tier, which `ArenaConfig::validate` keeps within u64.
        c.requested_bytes = c.requested_bytes.saturating_add(bytes);
        c.peak_allocated_bytes = c.peak_allocated_bytes.max(allocated);
        Ok(Handle {
            key,
            arena: core.id,
        })
    }

    /// Frees a block. Pinned blocks cannot be freed.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let h = arena.alloc(4096)?;
    /// arena.free(h)?;
    /// assert!(arena.info(h).is_err()); // the handle is stale now
    /// assert_eq!(arena.stats().live_blocks, 0);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn free(&mut self, h: Handle) -> Result<()> {
        let b = self.block(h)?;
        if b.pins > 0 {
            return Err(Error::Pinned { pins: b.pins });
        }
        let (size, lag) = (b.size, b.lag);
        // Its bytes are reused in arena-stream order: after the streams that
        // used it are done with them. Under `&mut self` the use records need
        // no lock, and most blocks have none.
        let used = self.core.blocks.get_mut(h.key).is_some_and(|b| {
            b.streams
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_some()
        });
        if used {
            self.core.wait_uses(h.key)?;
        }
        self.policy.free(&self.core, h.key, size, lag)?;
        let core = &mut self.core;
        core.order.queued();
        let Some(b) = core.blocks.remove(h.key) else {
            return Err(Error::StaleHandle);
        };
        let freed = match b.place {
            Place::Device(a) => core.index.free(a),
            Place::Host(a) => match self.tier.as_mut() {
                Some(tier) => tier.free(a),
                None => Ok(()),
            },
        };
        if let Err(e) = freed {
            // Unreachable: the arena only holds allocations of its own indexes.
            return Err(core.broken("freeing a block's placement failed", e));
        }
        core.set_entry(h.key, None);
        core.counters.frees += 1;
        core.counters.requested_bytes = core.counters.requested_bytes.saturating_sub(size);
        // The free is done: a failure to give memory back (which leaves
        // the mapping as it was) is no failure of the free.
        let _ = self.after_free();
        Ok(())
    }

    // ---- pinning ----------------------------------------------------------------

    /// Pins a block: it never moves until every pin is released. Pins nest.
    /// A spilled block is brought back first.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let h = arena.alloc(4096)?;
    /// assert_eq!(arena.pin(h)?, 1);
    /// let at = arena.resolve(h)?;
    /// arena.compact()?;
    /// assert_eq!(arena.resolve(h)?, at); // pinned: it did not move
    /// assert!(arena.free(h).is_err()); // nor can it be freed
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn pin(&mut self, h: Handle) -> Result<u32> {
        let pins = self.block(h)?.pins;
        if pins == u32::MAX {
            // Before any residency change.
            return Err(pin_limit());
        }
        self.make_resident(&[h])?;
        // A pinned block cannot move later: its bytes go where they stay.
        if pins == 0 {
            self.policy.before_pin(&mut self.core, h.key)?;
        }
        let b = self.block_mut(h)?;
        b.pins = b.pins.checked_add(1).ok_or_else(pin_limit)?;
        let pins = b.pins;
        if pins == 1 {
            self.core.counters.pinned_blocks += 1;
            self.core.sync_pinned(h.key);
            self.policy.pinned(h.key, true);
        }
        Ok(pins)
    }

    /// Releases one pin; returns the pins left.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let h = arena.alloc(4096)?;
    /// arena.pin(h)?;
    /// arena.pin(h)?;
    /// assert_eq!(arena.unpin(h)?, 1); // pins nest
    /// assert_eq!(arena.unpin(h)?, 0);
    /// arena.free(h)?;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn unpin(&mut self, h: Handle) -> Result<u32> {
        let b = self.block_mut(h)?;
        if b.pins == 0 {
            return Err(Error::Pinned { pins: 0 });
        }
        b.pins -= 1;
        let pins = b.pins;
        if pins == 0 {
            self.core.counters.pinned_blocks -= 1;
            self.core.sync_pinned(h.key);
            self.policy.pinned(h.key, false);
        }
        Ok(pins)
    }

    // ---- owned storage --------------------------------------------------------

    /// Allocates `bytes` as an owned [`Storage`] (untyped): freed when its
    /// last owner drops. Zero bytes is valid and takes no block.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage(64)?;
    /// arena.write_bytes(&s, &[1; 64])?;
    /// drop(s); // the last owner: the block waits for the arena's next call
    /// assert_eq!(arena.reclaim()?, 1);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn alloc_storage(&mut self, bytes: u64) -> Result<Storage> {
        self.storage(bytes, self.config.alignment_bytes, None)
    }

    /// `numel` elements of `dtype` as an owned [`Storage`], aligned for
    /// them: a framework's allocation for a runtime dtype.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage_dtype(DType::BF16, 8)?;
    /// assert_eq!((s.numel(), s.len_bytes(), s.dtype()), (8, 16, Some(DType::BF16)));
    /// arena.fill(&s, cuarena::half::bf16::ONE)?;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn alloc_storage_dtype(&mut self, dtype: DType, numel: u64) -> Result<Storage> {
        let (bytes, align) = self.typed_layout(dtype, numel)?;
        self.storage(bytes, align, Some(dtype))
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
            self.core.id,
            std::sync::Arc::clone(&self.reclaim),
        ))
    }

    /// Frees the blocks of storages dropped since the last call (it runs by
    /// itself at every allocation and compaction). A block still pinned
    /// waits for its last unpin. Returns the blocks freed.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig};
    /// let mut arena = Arena::host(ArenaConfig::new(1 << 20))?;
    /// let s = arena.alloc_storage(256)?;
    /// std::thread::spawn(move || drop(s)).join().unwrap(); // dropped elsewhere
    /// assert_eq!(arena.stats().pending_reclaim, 1);
    /// assert_eq!(arena.reclaim()?, 1); // freed here
    /// assert_eq!(arena.stats().live_blocks, 0);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn reclaim(&mut self) -> Result<u64> {
        self.check_usable()?;
        self.drain_reclaim()
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

/// Handle slots in use (for the error of a full slot table).
fn core_slots<B: Backend>(core: &Core<B>) -> u64 {
    core.blocks.slot_count() as u64
}

/// [`Error::LimitReached`] for a pin past the most a block can hold.
fn pin_limit() -> Error {
    Error::LimitReached {
        what: "pins on one block",
        requested: u64::from(u32::MAX) + 1,
        limit: u64::from(u32::MAX),
    }
}
