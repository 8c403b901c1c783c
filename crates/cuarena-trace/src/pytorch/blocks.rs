//! The caching allocator's blocks: a slab of blocks linked in address order
//! within their segment, and the two pools (small: requests up to 1 MiB,
//! large: the rest) that hold the free ones ordered by stream, size and
//! address, as PyTorch's `BlockComparatorSize` orders them.

use std::collections::BTreeSet;

use crate::trace::MemoryBudget;
use crate::Result;

/// A block id: its index in the slab.
pub(crate) type Id = u32;

/// Bytes a block's place in a pool costs (a B-tree entry and its share of
/// nodes), charged to the memory budget with the slab.
const POOL_ENTRY_BYTES: u64 = 64;
/// What the budget calls the model's blocks.
const WHAT: &str = "blocks of the caching allocator model";

/// One block of a segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    /// Stream, compared as PyTorch compares the pointer (unsigned).
    pub(crate) stream: u64,
    pub(crate) small: bool,
    pub(crate) allocated: bool,
    /// Backed by memory; only an expandable segment's blocks are not.
    pub(crate) mapped: bool,
    pub(crate) prev: Option<Id>,
    pub(crate) next: Option<Id>,
    /// The expandable segment it belongs to.
    pub(crate) expandable: Option<u32>,
    /// The pool's free-block searches when it was last put in the pool
    /// (`gc_count_base`: its age for `garbage_collection_threshold`).
    pub(crate) gc_base: u64,
}

impl Block {
    pub(crate) fn new(addr: u64, size: u64, stream: u64, small: bool) -> Block {
        Block {
            addr,
            size,
            stream,
            small,
            allocated: false,
            mapped: true,
            prev: None,
            next: None,
            expandable: None,
            gc_base: 0,
        }
    }

    pub(crate) fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
}

/// A free block's place in its pool: `(stream, size, address, id)`.
pub(crate) type SizeKey = (u64, u64, u64, Id);
/// An unmapped block's place: `(stream, address, id)`.
pub(crate) type AddrKey = (u64, u64, Id);

/// One pool: its free mapped blocks and (expandable segments) its unmapped
/// address ranges.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    pub(crate) free: BTreeSet<SizeKey>,
    pub(crate) unmapped: BTreeSet<AddrKey>,
    /// Free-block searches so far (`get_free_blocks_call_count`).
    pub(crate) searches: u64,
}

/// Every block, and the pools.
#[derive(Debug)]
pub(crate) struct Blocks {
    slab: Vec<Block>,
    vacant: Vec<Id>,
    /// `[large, small]`.
    pools: [Pool; 2],
    budget: MemoryBudget,
}

impl Blocks {
    pub(crate) fn new(budget: MemoryBudget) -> Blocks {
        Blocks {
            slab: Vec::new(),
            vacant: Vec::new(),
            pools: [Pool::default(), Pool::default()],
            budget,
        }
    }

    pub(crate) fn get(&self, id: Id) -> &Block {
        &self.slab[id as usize]
    }

    pub(crate) fn get_mut(&mut self, id: Id) -> &mut Block {
        &mut self.slab[id as usize]
    }

    pub(crate) fn pool(&self, small: bool) -> &Pool {
        &self.pools[usize::from(small)]
    }

    pub(crate) fn pool_mut(&mut self, small: bool) -> &mut Pool {
        &mut self.pools[usize::from(small)]
    }

    /// A new block in the slab (in no pool yet).
    pub(crate) fn add(&mut self, b: Block) -> Result<Id> {
        if let Some(id) = self.vacant.pop() {
            self.slab[id as usize] = b;
            return Ok(id);
        }
        let id = Id::try_from(self.slab.len()).map_err(|_| self.budget.exceeded(WHAT, u64::MAX))?;
        self.budget.reserve(&mut self.slab, 1, WHAT)?;
        // Every slot may come back to `vacant`: room for it now.
        let room = self.slab.len() + 1 - self.vacant.len();
        self.budget.reserve(&mut self.vacant, room, WHAT)?;
        self.budget.charge(POOL_ENTRY_BYTES, WHAT)?;
        self.slab.push(b);
        Ok(id)
    }

    /// Returns `id`'s slot to the slab (the block must be in no pool).
    pub(crate) fn remove(&mut self, id: Id) {
        self.vacant.push(id);
    }

    fn size_key(&self, id: Id) -> SizeKey {
        let b = self.get(id);
        (b.stream, b.size, b.addr, id)
    }

    fn addr_key(&self, id: Id) -> AddrKey {
        let b = self.get(id);
        (b.stream, b.addr, id)
    }

    /// Puts a free block into its pool (mapped: by size; unmapped: by
    /// address), stamping its age base.
    pub(crate) fn insert(&mut self, id: Id) {
        let (small, mapped) = (self.get(id).small, self.get(id).mapped);
        if mapped {
            let key = self.size_key(id);
            let searches = self.pool(small).searches;
            self.get_mut(id).gc_base = searches;
            self.pool_mut(small).free.insert(key);
        } else {
            let key = self.addr_key(id);
            self.pool_mut(small).unmapped.insert(key);
        }
    }

    /// Takes a block out of its pool (a no-op if it is in none).
    pub(crate) fn take(&mut self, id: Id) {
        let (small, mapped) = (self.get(id).small, self.get(id).mapped);
        if mapped {
            let key = self.size_key(id);
            self.pool_mut(small).free.remove(&key);
        } else {
            let key = self.addr_key(id);
            self.pool_mut(small).unmapped.remove(&key);
        }
    }

    /// Whether a block can join a neighbour or an expansion: not handed out.
    pub(crate) fn is_free(&self, id: Option<Id>) -> bool {
        id.is_some_and(|id| !self.get(id).allocated)
    }

    /// Merges `src` into its neighbour `dst` when `src` is free and mapped
    /// alike (`try_merge_blocks`); returns the bytes merged. `dst` must be
    /// out of its pool; `src` leaves its own.
    pub(crate) fn try_merge(&mut self, dst: Id, src: Option<Id>) -> u64 {
        let Some(src) = src else { return 0 };
        let (d, s) = (*self.get(dst), *self.get(src));
        if s.allocated || s.mapped != d.mapped {
            return 0;
        }
        self.take(src);
        if d.prev == Some(src) {
            let b = self.get_mut(dst);
            b.addr = s.addr;
            b.prev = s.prev;
            if let Some(p) = s.prev {
                self.get_mut(p).next = Some(dst);
            }
        } else {
            self.get_mut(dst).next = s.next;
            if let Some(n) = s.next {
                self.get_mut(n).prev = Some(dst);
            }
        }
        self.get_mut(dst).size += s.size;
        self.remove(src);
        s.size
    }

    /// Splits `size` bytes off the front of `id` into a new block (which
    /// takes `id`'s place in the chain, before it); `id` keeps the rest.
    /// Returns the new block. Neither is put in a pool.
    pub(crate) fn split_front(&mut self, id: Id, size: u64) -> Result<Id> {
        let b = *self.get(id);
        let mut front = Block::new(b.addr, size, b.stream, b.small);
        front.expandable = b.expandable;
        front.mapped = b.mapped;
        front.prev = b.prev;
        front.next = Some(id);
        let f = self.add(front)?;
        if let Some(p) = b.prev {
            self.get_mut(p).next = Some(f);
        }
        let rest = self.get_mut(id);
        rest.prev = Some(f);
        rest.addr += size;
        rest.size -= size;
        Ok(f)
    }

    /// Splits `id` at `size` bytes from its start: `id` keeps the front,
    /// the new block (returned) the back, after it. Neither is put in a
    /// pool.
    pub(crate) fn split_back(&mut self, id: Id, size: u64) -> Result<Id> {
        let b = *self.get(id);
        let mut back = Block::new(b.addr + size, b.size - size, b.stream, b.small);
        back.expandable = b.expandable;
        back.mapped = b.mapped;
        back.prev = Some(id);
        back.next = b.next;
        let n = self.add(back)?;
        if let Some(x) = b.next {
            self.get_mut(x).prev = Some(n);
        }
        let front = self.get_mut(id);
        front.next = Some(n);
        front.size = size;
        Ok(n)
    }

    /// The memory budget the blocks are charged to.
    pub(crate) fn budget(&mut self) -> &mut MemoryBudget {
        &mut self.budget
    }
}
