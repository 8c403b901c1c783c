//! The model: a naive mirror of the arena's blocks, storages and streams.
//! `Model::step` runs one op on the arena and on the model (the block
//! ops here, the storage and stream ops in `storage.rs`), then checks every
//! invariant against it.

use cuarena::backend::Backend;
use cuarena::{Arena, ArenaConfig, Error, Handle, StreamId};

use super::ops::Op;
use super::storage::{read_bytes, ModelStorage};

struct ModelBlock {
    handle: Handle,
    size: u64,
    align: u64,
    data: Vec<u8>,
    pins: u32,
}

pub(crate) struct Model<'a, B: Backend> {
    pub(super) arena: &'a mut Arena<B>,
    foreign: Arena,
    blocks: Vec<ModelBlock>,
    freed: Vec<Handle>,
    pub(super) storages: Vec<ModelStorage>,
    /// Blocks of dropped storages the arena has not freed yet: `(handle,
    /// size, reserved)`. Freed at the next allocation that passes its
    /// argument checks, compaction or reclaim.
    pub(super) pending: Vec<(Handle, u64, u64)>,
    /// Streams the arena knows: its own, then the registered ones.
    pub(super) streams: Vec<StreamId>,
    /// A stream id the arena does not know (registered on `foreign`).
    pub(super) bogus_stream: StreamId,
    pub(super) granule: u64,
    /// Read back every block after every step (host), or only after moves (GPU).
    verify_every_step: bool,
    last_moves: u64,
}

/// Blocks above this many bytes hold no model data (metadata arenas near
/// 2^64 B): they are placed and checked, never written or read.
const DATA_LIMIT: u64 = 1 << 20;

pub(super) fn pattern(seed: u64, len: u64) -> Vec<u8> {
    if len > DATA_LIMIT {
        return Vec::new();
    }
    cuarena_testkit::bytes(seed, len)
}

impl<'a, B: Backend> Model<'a, B> {
    pub(crate) fn new(arena: &'a mut Arena<B>, verify_every_step: bool) -> Self {
        let granule = arena.config().alignment_bytes;
        let mut foreign = Arena::host(ArenaConfig::new(4096)).expect("foreign arena");
        let mut bogus_stream = StreamId::ARENA;
        for _ in 0..8 {
            bogus_stream = foreign.register_stream(()).expect("foreign stream");
        }
        Self {
            arena,
            foreign,
            blocks: Vec::new(),
            freed: Vec::new(),
            storages: Vec::new(),
            pending: Vec::new(),
            streams: vec![StreamId::ARENA],
            bogus_stream,
            granule,
            verify_every_step,
            last_moves: 0,
        }
    }

    /// Streams registered on the arena (7 at most), for `record_stream`
    /// and `wait_on_arena`.
    pub(crate) fn with_streams(mut self, streams: &[StreamId]) -> Self {
        assert!(streams.len() < 8, "the bogus stream id is 8");
        self.streams.extend_from_slice(streams);
        self
    }

    /// Live blocks `(offset, size, pins)`, leaving out those of dropped
    /// storages waiting to be freed (an allocation may free them).
    fn snapshot(&self) -> Vec<(u64, u64, u32)> {
        self.arena
            .blocks()
            .iter()
            .filter(|b| !self.pending.iter().any(|p| p.0 == b.handle))
            .map(|b| (b.offset, b.size_bytes, b.pins))
            .collect()
    }

    /// The arena freed the blocks of dropped storages.
    pub(super) fn drained(&mut self) {
        self.freed.extend(self.pending.drain(..).map(|p| p.0));
    }

    /// Bytes the pending blocks hold.
    pub(super) fn pending_reserved(&self) -> u64 {
        self.pending.iter().map(|p| p.2).sum()
    }

    /// Every block at the arena's alignment (the no-fragmentation guarantees
    /// assume it).
    fn all_plain(&self) -> bool {
        self.blocks.iter().all(|b| b.align <= self.granule)
            && self.storages.iter().all(|s| s.align <= self.granule)
    }

    /// The error `e` left everything as it was.
    pub(super) fn unchanged(
        &self,
        step: usize,
        what: &str,
        before: &[(u64, u64, u32)],
        st: &cuarena::Stats,
        pending: u64,
    ) {
        assert_eq!(
            self.snapshot(),
            before,
            "step {step}: {what} changed the arena"
        );
        let now = self.arena.stats();
        assert_eq!(
            (now.allocs, now.frees, now.moves, now.evictions),
            (st.allocs, st.frees, st.moves, st.evictions),
            "step {step}: {what} changed the stats"
        );
        assert_eq!(
            self.arena.stats().pending_reclaim,
            pending,
            "step {step}: {what}"
        );
    }

    /// Runs `op`, then checks every invariant.
    pub(crate) fn step(&mut self, op: &Op, step: usize) {
        let cap = self.arena.config().capacity_bytes;
        let n = self.blocks.len();
        let before = self.snapshot();
        let stats_before = self.arena.stats();
        let expect_unchanged = |m: &Self, what: &str| {
            assert_eq!(
                m.snapshot(),
                before,
                "step {step}: {what} changed the arena"
            );
        };
        match *op {
            Op::Alloc { size, align_log2 } => {
                let align = if align_log2 == 0 {
                    0
                } else {
                    1u64 << align_log2
                };
                self.alloc(size, align, step, &before, &stats_before);
            }
            Op::AllocFree { frac } => {
                let free = stats_before.free_bytes;
                let size = (free as u128 * frac as u128 / 255) as u64;
                if size > 0 {
                    self.alloc(size, 0, step, &before, &stats_before);
                }
            }
            Op::Free { idx } if n > 0 => {
                let i = idx % n;
                let r = self.arena.free(self.blocks[i].handle);
                if self.blocks[i].pins > 0 {
                    assert!(
                        matches!(r, Err(Error::Pinned { .. })),
                        "step {step}: freed a pinned block"
                    );
                    expect_unchanged(self, "freeing a pinned block");
                } else {
                    r.expect("free");
                    let b = self.blocks.swap_remove(i);
                    self.freed.push(b.handle);
                }
            }
            Op::Write { idx, seed } if n > 0 && self.blocks[idx % n].size <= DATA_LIMIT => {
                let i = idx % n;
                let data = pattern(step as u64 * 256 + seed as u64, self.blocks[i].size);
                self.arena
                    .write(self.blocks[i].handle, &data)
                    .expect("write");
                self.blocks[i].data = data;
            }
            Op::Pin { idx } if n > 0 => {
                let i = idx % n;
                let pins = self.arena.pin(self.blocks[i].handle).expect("pin");
                self.blocks[i].pins += 1;
                assert_eq!(pins, self.blocks[i].pins);
            }
            Op::Unpin { idx } if n > 0 => {
                let i = idx % n;
                let r = self.arena.unpin(self.blocks[i].handle);
                if self.blocks[i].pins == 0 {
                    assert_eq!(r, Err(Error::Pinned { pins: 0 }));
                    expect_unchanged(self, "unpinning an unpinned block");
                } else {
                    self.blocks[i].pins -= 1;
                    assert_eq!(r, Ok(self.blocks[i].pins));
                }
            }
            Op::Compact => {
                let pinned: Vec<(u64, u64)> = before
                    .iter()
                    .filter(|b| b.2 > 0)
                    .map(|b| (b.0, b.1))
                    .collect();
                let plain = self.all_plain();
                self.arena.compact().expect("compact");
                self.drained();
                let after = self.arena.stats();
                // Pinned blocks never move.
                let now: Vec<(u64, u64)> = self
                    .snapshot()
                    .iter()
                    .filter(|b| b.2 > 0)
                    .map(|b| (b.0, b.1))
                    .collect();
                assert_eq!(now, pinned, "step {step}: a pinned block moved");
                if pinned.is_empty() && plain {
                    assert!(
                        after.free_regions <= 1,
                        "step {step}: full compaction left {} holes",
                        after.free_regions
                    );
                }
            }
            Op::ZeroAlloc => {
                assert_eq!(self.arena.alloc(0), Err(Error::ZeroSize));
                expect_unchanged(self, "zero alloc");
            }
            Op::BadAlign => {
                let r = self.arena.alloc_aligned(64, 3 * self.granule);
                assert!(matches!(r, Err(Error::InvalidAlignment { .. })), "{r:?}");
                expect_unchanged(self, "bad alignment");
            }
            Op::TooLarge => {
                // Requests are rounded up to the granule, or reported as
                // asked where that overflows u64.
                let too_large = |bytes: u64| {
                    Err(Error::TooLarge {
                        requested_bytes: bytes
                            .checked_next_multiple_of(self.granule)
                            .unwrap_or(bytes),
                        capacity_bytes: cap,
                    })
                };
                if let Some(over) = cap.checked_add(1) {
                    assert_eq!(self.arena.alloc(over).map(drop), too_large(over));
                }
                // With a 1-byte granule, u64::MAX B is a valid request of an
                // arena of u64::MAX B.
                if self.granule > 1 || cap < u64::MAX {
                    assert_eq!(self.arena.alloc(u64::MAX).map(drop), too_large(u64::MAX));
                }
                expect_unchanged(self, "too-large alloc");
            }
            Op::DoubleFree => {
                if let Some(&h) = self.freed.last() {
                    assert_eq!(self.arena.free(h), Err(Error::StaleHandle));
                    assert_eq!(self.arena.read::<u8>(h).err(), Some(Error::StaleHandle));
                    expect_unchanged(self, "double free");
                }
            }
            Op::ForeignHandle => {
                let h = self.foreign.alloc(16).expect("foreign alloc");
                assert!(matches!(self.arena.free(h), Err(Error::Foreign { .. })));
                assert!(matches!(self.arena.pin(h), Err(Error::Foreign { .. })));
                self.foreign.free(h).expect("foreign free");
                expect_unchanged(self, "foreign handle");
            }
            Op::WrongLengthRead { idx } if n > 0 && self.blocks[idx % n].size <= DATA_LIMIT => {
                let b = &self.blocks[idx % n];
                let mut out = vec![0u8; b.size as usize + 1];
                assert!(matches!(
                    self.arena.read_into(b.handle, &mut out),
                    Err(Error::LengthMismatch { .. })
                ));
                let short = vec![0u8; b.size as usize - 1];
                assert!(matches!(
                    self.arena.write(b.handle, &short),
                    Err(Error::LengthMismatch { .. })
                ));
                expect_unchanged(self, "wrong-length transfer");
            }
            ref op => self.storage_step(op, step, &before, &stats_before),
        }
        self.check(step);
    }

    /// An allocation of `size` B at `align` failed with `e`: it must be
    /// `OutOfMemory`, truthful, and have changed nothing but freeing the
    /// blocks of dropped storages.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_oom(
        &self,
        e: Error,
        size: u64,
        align: u64,
        step: usize,
        before: &[(u64, u64, u32)],
        st: &cuarena::Stats,
        pending_free: u64,
    ) {
        // Saturating: only compared with what the arena reports.
        let reserved = size.div_ceil(self.granule).saturating_mul(self.granule);
        let Error::OutOfMemory {
            requested_bytes,
            free_bytes,
            reachable_bytes,
            ..
        } = e
        else {
            panic!("step {step}: unexpected error {e}");
        };
        assert_eq!(requested_bytes, reserved);
        // The blocks of dropped storages were freed first.
        assert_eq!(free_bytes, st.free_bytes + pending_free, "step {step}");
        assert_eq!(free_bytes, self.arena.stats().free_bytes, "step {step}");
        // The guarantee: with no pins (and default alignment) a request
        // fails only if it exceeds the free bytes.
        let plain = st.pinned_blocks == 0 && align <= self.granule && self.all_plain();
        if plain {
            assert!(
                reserved > free_bytes,
                "step {step}: {reserved} B failed with {free_bytes} B free",
            );
        }
        // With mixed alignments and no pins, independently of the planner:
        // packed in address order the blocks lose at most each one's extra
        // alignment as padding, and the request its own (the full
        // compaction packs by alignment only where that pads less).
        if st.pinned_blocks == 0 {
            let padding = self
                .blocks
                .iter()
                .map(|b| b.align)
                .chain(self.storages.iter().map(|s| s.align))
                .chain(std::iter::once(align))
                .map(|a| a - self.granule.min(a))
                .fold(0u64, u64::saturating_add);
            assert!(
                reserved.saturating_add(padding) > free_bytes,
                "step {step}: {reserved} B at {align} failed with {free_bytes} B free and at \
                 most {padding} B of padding"
            );
        }
        assert!(
            reachable_bytes < reserved,
            "step {step}: failed although compaction reaches {reachable_bytes} B"
        );
        assert_eq!(
            self.snapshot(),
            before,
            "step {step}: failed alloc changed the arena"
        );
    }

    fn alloc(
        &mut self,
        size: u64,
        align: u64,
        step: usize,
        before: &[(u64, u64, u32)],
        st: &cuarena::Stats,
    ) {
        let pending_free = self.pending_reserved();
        let r = if align == 0 {
            self.arena.alloc(size)
        } else {
            self.arena.alloc_aligned(size, align)
        };
        // Past its argument checks: the reclaim queue was drained.
        self.drained();
        match r {
            Ok(handle) => {
                let data = pattern(step as u64, size);
                if size <= DATA_LIMIT {
                    self.arena.write(handle, &data).expect("write new block");
                }
                let align = align.max(self.granule);
                self.blocks.push(ModelBlock {
                    handle,
                    size,
                    align,
                    data,
                    pins: 0,
                });
            }
            Err(e) => {
                let reachable = match &e {
                    Error::OutOfMemory {
                        reachable_bytes, ..
                    } => *reachable_bytes,
                    _ => 0,
                };
                self.check_oom(
                    e,
                    size,
                    align.max(self.granule),
                    step,
                    before,
                    st,
                    pending_free,
                );
                // What the error says compaction reaches, it makes: a
                // request of exactly that much (at that alignment) succeeds.
                if reachable > 0 && self.arena.config().spill_host_bytes == 0 {
                    let h = self
                        .arena
                        .alloc_aligned(reachable, align.max(self.granule))
                        .unwrap_or_else(|e| {
                            panic!("step {step}: {reachable} B reachable, then {e}")
                        });
                    let data = pattern(step as u64 + 7, reachable);
                    if reachable <= DATA_LIMIT {
                        self.arena.write(h, &data).expect("write");
                    }
                    self.blocks.push(ModelBlock {
                        handle: h,
                        size: reachable,
                        align: align.max(self.granule),
                        data,
                        pins: 0,
                    });
                }
            }
        }
    }

    /// Every invariant, against the model.
    pub(crate) fn check(&mut self, step: usize) {
        let cap = self.arena.config().capacity_bytes;
        let infos = self.arena.blocks();
        let storage_blocks = self.storages.iter().filter(|s| s.handle.is_some());
        let live = self.blocks.len() + storage_blocks.clone().count() + self.pending.len();
        assert_eq!(infos.len(), live, "step {step}: live count");
        assert_eq!(
            self.arena.stats().pending_reclaim,
            self.pending.len() as u64,
            "step {step}"
        );
        let mut end = 0;
        for b in &infos {
            assert!(
                b.offset >= end,
                "step {step}: blocks overlap at {}",
                b.offset
            );
            assert_eq!(b.offset % b.align_bytes, 0, "step {step}: misaligned block");
            end = b
                .offset
                .checked_add(b.reserved_bytes)
                .filter(|&e| e <= cap)
                .unwrap_or_else(|| panic!("step {step}: block out of bounds"));
        }
        let st = self.arena.stats();
        let reserved = infos
            .iter()
            .try_fold(0u64, |s, b| s.checked_add(b.reserved_bytes))
            .expect("reserved bytes exceed u64: blocks overlap");
        assert_eq!(st.allocated_bytes, reserved);
        assert_eq!(st.free_bytes, cap - reserved);
        assert_eq!(
            st.requested_bytes,
            self.blocks
                .iter()
                .map(|b| b.size)
                .chain(storage_blocks.map(|s| s.size))
                .chain(self.pending.iter().map(|p| p.1))
                .try_fold(0u64, |s, b| s.checked_add(b))
                .expect("requested bytes exceed u64")
        );
        assert_eq!(st.live_blocks, live as u64);
        assert_eq!(
            st.pinned_blocks,
            self.blocks.iter().filter(|b| b.pins > 0).count() as u64
        );
        let free: u64 = crate::free_regions(self.arena).iter().map(|r| r.1).sum();
        assert_eq!(free, st.free_bytes);
        assert!(st.largest_free_bytes <= st.free_bytes);
        // (The handle table kernels read is checked against the blocks by
        // the crate's unit tests, `src/arena/table_tests.rs`.)
        let moved = st.moves != self.last_moves;
        self.last_moves = st.moves;
        if self.verify_every_step || moved {
            self.verify_bytes(step);
        }
    }

    /// Reads every live block back and compares it with the model.
    pub(crate) fn verify_bytes(&mut self, step: usize) {
        if !self.arena.backend().stores_bytes() {
            return;
        }
        for b in self.blocks.iter().filter(|b| b.size <= DATA_LIMIT) {
            let got: Vec<u8> = self.arena.read(b.handle).expect("read");
            assert!(
                got == b.data,
                "step {step}: block of {} B lost its bytes",
                b.size
            );
        }
        for s in &self.storages {
            let got = read_bytes(self.arena, s.storage(), s.kind).expect("read storage");
            assert!(
                got == s.data,
                "step {step}: storage of {} B lost its bytes",
                s.size
            );
        }
    }

    /// Drops every storage, reclaims, and checks that only the handles'
    /// blocks are left.
    pub(crate) fn finish(&mut self, step: usize) {
        self.verify_bytes(step);
        for s in self.storages.drain(..) {
            if let Some(h) = s.handle {
                self.pending.push((h, s.size, s.reserved));
            }
        }
        assert_eq!(
            self.arena.reclaim().expect("reclaim"),
            self.pending.len() as u64
        );
        self.drained();
        self.check(step);
        assert_eq!(self.arena.stats().live_blocks, self.blocks.len() as u64);
    }
}
