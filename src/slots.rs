//! Generational slots: the arena's host table of blocks, keyed by the
//! `(slot, version)` pairs that handles carry and kernels resolve.
//!
//! Hand-written rather than `slotmap` because the key's encoding is an ABI:
//! kernels decode a handle's bits on the device (`kernels/cuarena.cuh`),
//! and slotmap documents its own FFI encoding as unspecified. Here the
//! crate defines it:
//!
//! - bits = `version << 32 | slot`;
//! - a live slot's version is odd, a free slot's even, and a slot never used
//!   (or freed, in the device table) reads as version 0;
//! - a slot whose version would wrap is retired, never reused, so a stale
//!   handle can never match a later block.

/// A slot and its version: what a [`crate::Handle`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SlotKey {
    slot: u32,
    version: u32,
}

impl SlotKey {
    /// A key no slot ever matches (version 0 is never live).
    pub(crate) const NULL: SlotKey = SlotKey {
        slot: 0,
        version: 0,
    };

    /// `version << 32 | slot`: the device ABI.
    pub(crate) fn to_bits(self) -> u64 {
        (u64::from(self.version) << 32) | u64::from(self.slot)
    }

    /// The key encoded by [`to_bits`](Self::to_bits). Any value decodes;
    /// one that names no live slot is rejected by the table.
    pub(crate) fn from_bits(bits: u64) -> Self {
        Self {
            slot: bits as u32,
            version: (bits >> 32) as u32,
        }
    }

    /// Index of the slot.
    pub(crate) fn slot(self) -> u32 {
        self.slot
    }

    /// Version of the slot's occupant (odd).
    pub(crate) fn version(self) -> u32 {
        self.version
    }
}

#[derive(Debug)]
struct Entry<T> {
    version: u32,
    value: Option<T>,
}

/// Slots per chunk of [`Slots`] (a power of two).
const CHUNK_BITS: u32 = 10;
const CHUNK: usize = 1 << CHUNK_BITS;

/// The table. Invariant: `entry(i).value.is_some()` exactly when
/// `entry(i).version` is odd; `free` holds the even, unretired slots.
///
/// Entries live in chunks of [`CHUNK`] slots, never moved once made: one
/// flat `Vec` would copy the whole table at every doubling (tens of MiB
/// for a few hundred thousand blocks, a tenth of a replay's time) and, past
/// the C allocator's mmap threshold, take fresh pages from the kernel for
/// every arena (a page fault per 4 KiB on first touch). Chunks of about
/// 100 KiB grow the table by one allocation per thousand slots and reuse
/// memory that earlier arenas freed. A lookup costs one more load (the
/// chunk pointers, a few KiB, stay in cache).
#[derive(Debug)]
pub(crate) struct Slots<T> {
    chunks: Vec<Vec<Entry<T>>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self {
            chunks: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Slots<T> {
    /// Occupied slots.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Slots ever used (occupied, free or retired): the device table's size.
    pub(crate) fn slot_count(&self) -> usize {
        self.chunks
            .last()
            .map_or(0, |last| (self.chunks.len() - 1) * CHUNK + last.len())
    }

    #[inline]
    fn entry(&self, slot: u32) -> Option<&Entry<T>> {
        let i = slot as usize;
        self.chunks.get(i >> CHUNK_BITS)?.get(i & (CHUNK - 1))
    }

    #[inline]
    fn entry_mut(&mut self, slot: u32) -> Option<&mut Entry<T>> {
        let i = slot as usize;
        self.chunks
            .get_mut(i >> CHUNK_BITS)?
            .get_mut(i & (CHUNK - 1))
    }

    /// Stores `value`; gives it back when every one of the 2^32 slots is
    /// taken or retired.
    #[inline]
    pub(crate) fn insert(&mut self, value: T) -> Result<SlotKey, T> {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let Ok(slot) = u32::try_from(self.slot_count()) else {
                    return Err(value);
                };
                if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
                    self.chunks.push(Vec::with_capacity(CHUNK));
                }
                if let Some(chunk) = self.chunks.last_mut() {
                    chunk.push(Entry {
                        version: 0,
                        value: None,
                    });
                }
                slot
            }
        };
        let Some(entry) = self.entry_mut(slot) else {
            return Err(value);
        };
        entry.version += 1; // even -> odd; retired slots are never in `free`
        entry.value = Some(value);
        let version = entry.version;
        self.len += 1;
        Ok(SlotKey { slot, version })
    }

    /// Removes and returns the value of a live key; `None` for a stale or
    /// made-up key (the table is unchanged).
    #[inline]
    pub(crate) fn remove(&mut self, key: SlotKey) -> Option<T> {
        let entry = self.entry_mut(key.slot)?;
        if entry.version != key.version {
            return None;
        }
        let value = entry.value.take()?;
        // odd -> even; the last odd version retires the slot for good.
        entry.version = entry.version.wrapping_add(1);
        if entry.version != 0 {
            self.free.push(key.slot);
        } else {
            entry.version = u32::MAX - 1; // even: not live, and never reused
        }
        self.len -= 1;
        Some(value)
    }

    /// The value of a live key.
    #[inline]
    pub(crate) fn get(&self, key: SlotKey) -> Option<&T> {
        let entry = self.entry(key.slot)?;
        (entry.version == key.version)
            .then_some(entry.value.as_ref())
            .flatten()
    }

    /// The value of a live key, mutably.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: SlotKey) -> Option<&mut T> {
        let entry = self.entry_mut(key.slot)?;
        if entry.version != key.version {
            return None;
        }
        entry.value.as_mut()
    }

    /// The value of a key the caller knows is live (a compaction's live
    /// list); a stale key, which would be a bug there, gives `None` in
    /// release builds (the version sits in the same entry, so checking it
    /// costs no extra cache line) and panics in debug builds.
    pub(crate) fn get_mut_live_slot(&mut self, key: SlotKey) -> Option<&mut T> {
        let entry = self.entry_mut(key.slot)?;
        debug_assert_eq!(entry.version, key.version, "stale key {key:?}");
        if entry.version != key.version {
            return None;
        }
        entry.value.as_mut()
    }

    /// True for a live key.
    pub(crate) fn contains_key(&self, key: SlotKey) -> bool {
        self.get(key).is_some()
    }

    /// Live keys and values, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SlotKey, &T)> {
        self.chunks
            .iter()
            .flatten()
            .enumerate()
            .filter_map(|(slot, e)| {
                let value = e.value.as_ref()?;
                Some((
                    SlotKey {
                        slot: slot as u32,
                        version: e.version,
                    },
                    value,
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_abi_is_version_high_slot_low_with_odd_live_versions() {
        let mut s = Slots::default();
        let a = s.insert('a').unwrap();
        let b = s.insert('b').unwrap();
        assert_eq!(a.to_bits(), 1 << 32);
        assert_eq!(b.to_bits(), (1 << 32) | 1);
        assert_eq!(s.remove(a), Some('a'));
        let c = s.insert('c').unwrap();
        // Slot 0 reused with the next odd version: the old key is stale.
        assert_eq!(c.to_bits(), 3 << 32);
        assert_eq!(s.get(a), None);
        assert_eq!(s.get(c), Some(&'c'));
        assert_eq!(SlotKey::from_bits(c.to_bits()), c);
        assert_eq!((c.slot(), c.version()), (0, 3));
    }

    #[test]
    fn stale_and_made_up_keys_change_nothing() {
        let mut s = Slots::default();
        let a = s.insert(1u8).unwrap();
        for bits in [0, 2 << 32, (1 << 32) | 7, u64::MAX] {
            let k = SlotKey::from_bits(bits);
            assert_eq!(s.remove(k), None);
            assert_eq!(s.get_mut(k), None);
        }
        assert_eq!(s.len(), 1);
        assert_eq!(s.remove(a), Some(1));
        assert_eq!(s.remove(a), None, "double remove");
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn a_slot_whose_version_would_wrap_is_retired() {
        let mut s = Slots::default();
        let k = s.insert(()).unwrap();
        s.remove(k);
        // Jump to the last odd version.
        s.chunks[0][0].version = u32::MAX - 1;
        let last = s.insert(()).unwrap();
        assert_eq!(last.version(), u32::MAX);
        s.remove(last);
        let next = s.insert(()).unwrap();
        assert_eq!(next.slot(), 1, "slot 0 is retired");
        assert_eq!(s.slot_count(), 2);
        assert_eq!(
            s.get(SlotKey::from_bits(u64::from(u32::MAX - 1) << 32)),
            None
        );
    }

    #[test]
    fn slots_past_a_chunk_work_like_the_first() {
        let mut s = Slots::default();
        let keys: Vec<_> = (0..3 * CHUNK + 5).map(|i| s.insert(i).unwrap()).collect();
        assert_eq!(s.slot_count(), 3 * CHUNK + 5);
        for k in keys.iter().skip(CHUNK - 2).step_by(CHUNK) {
            assert_eq!(s.remove(*k), Some(k.slot() as usize));
        }
        let again = s.insert(7).unwrap();
        assert_eq!(again.slot() as usize, 3 * CHUNK - 2, "the last freed slot");
        assert_eq!(s.get(again), Some(&7));
        assert_eq!(s.get(keys[3 * CHUNK - 2]), None, "stale");
        assert_eq!(s.get(keys[3 * CHUNK + 4]), Some(&(3 * CHUNK + 4)));
        assert_eq!(s.iter().count(), s.len());
        assert_eq!(s.slot_count(), 3 * CHUNK + 5);
    }

    #[test]
    fn iteration_sees_exactly_the_live_slots() {
        let mut s = Slots::default();
        let keys: Vec<_> = (0..10).map(|i| s.insert(i).unwrap()).collect();
        for k in keys.iter().step_by(3) {
            s.remove(*k);
        }
        let live: Vec<_> = s.iter().map(|(_, v)| *v).collect();
        assert_eq!(live, vec![1, 2, 4, 5, 7, 8]);
        if let Some(v) = s.get_mut(keys[1]) {
            *v *= 10;
        }
        assert_eq!(s.get(keys[1]), Some(&10));
    }
}
