//! The ops of the model-based programs, and the seeded generators of the
//! random programs (the proptest strategies are beside their tests in
//! `model.rs`).

use cuarena_testkit::Rng;

/// One step of a program. Indices pick a live block modulo the live count.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Alloc {
        size: u64,
        align_log2: u8,
    },
    /// Asks for a fraction (1..=255 / 255) of the free bytes: usually more
    /// than the largest hole, so it forces a compaction.
    AllocFree {
        frac: u8,
    },
    Free {
        idx: usize,
    },
    Write {
        idx: usize,
        seed: u8,
    },
    Pin {
        idx: usize,
    },
    Unpin {
        idx: usize,
    },
    Compact,
    /// Bad input: each must fail with its own error and change nothing.
    ZeroAlloc,
    BadAlign,
    TooLarge,
    DoubleFree,
    ForeignHandle,
    WrongLengthRead {
        idx: usize,
    },
    /// Owned storage. `kind % 4`: untyped bytes, `u32`, `f32`, zeroed
    /// `u32`; `len` elements (zero included).
    AllocStorage {
        kind: u8,
        len: u64,
    },
    /// Another owner: a clone of the storage.
    CloneStorage {
        idx: usize,
    },
    /// Another owner: a slice of elements `a..b` (reduced modulo the
    /// length + 2, so some are out of range: `RangeOutOfBounds`, unchanged).
    SliceStorage {
        idx: usize,
        a: u64,
        b: u64,
    },
    /// Drops one owner; the last one sends the block to the reclaim queue.
    DropOwner {
        idx: usize,
        which: usize,
    },
    Reclaim,
    /// `write_range` on elements `a..b`; some calls have a wrong length or
    /// type (the error, unchanged).
    WriteRange {
        idx: usize,
        a: u64,
        b: u64,
        seed: u8,
    },
    ReadRange {
        idx: usize,
        a: u64,
        b: u64,
    },
    /// Copies between two storages or within one (overlapping:
    /// `OverlappingRanges`, unchanged); `extra` makes the lengths differ.
    CopyRange {
        src: usize,
        dst: usize,
        len: u64,
        at: u64,
        to: u64,
        extra: bool,
    },
    /// Fills elements `a..b`; `width % 7`: a 1/2/4/8-byte value (of the
    /// range's dtype or not), or one byte over the range reinterpreted as
    /// bytes (`as_dtype(U8)`).
    FillRange {
        idx: usize,
        a: u64,
        b: u64,
        width: u8,
        seed: u8,
    },
    /// `record_stream` on a registered stream, the arena's, or (the last
    /// choice) another arena's id: `Foreign`, unchanged.
    RecordStream {
        idx: usize,
        stream: u8,
    },
    WaitOnArena {
        stream: u8,
    },
}

/// A weighted random op over a small arena.
pub(super) fn gen_op(rng: &mut Rng, cap: u64) -> Op {
    let mut next = || rng.next();
    let k = next() % 140;
    let idx = next() as usize;
    match k {
        100..=139 => gen_storage_op(k - 100, idx, &mut next),
        0..=34 => {
            // Log-uniform sizes from 1 B to cap/8.
            let max_log = 64 - (cap / 8).leading_zeros() as u64;
            let size = 1 + next() % (1u64 << (next() % max_log.max(1)));
            let align_log2 = if next() % 5 == 0 {
                9 + (next() % 4) as u8
            } else {
                0
            };
            Op::Alloc { size, align_log2 }
        }
        35..=39 => Op::AllocFree {
            frac: (next() % 255 + 1) as u8,
        },
        40..=69 => Op::Free { idx },
        70..=77 => Op::Write {
            idx,
            seed: next() as u8,
        },
        78..=81 => Op::Pin { idx },
        82..=86 => Op::Unpin { idx },
        87..=89 => Op::Compact,
        90 => Op::ZeroAlloc,
        91 => Op::BadAlign,
        92 => Op::TooLarge,
        93..=95 => Op::DoubleFree,
        96 => Op::ForeignHandle,
        _ => Op::WrongLengthRead { idx },
    }
}

/// One of the storage ops, for `k` in `0..40`.
fn gen_storage_op(k: u64, idx: usize, next: &mut impl FnMut() -> u64) -> Op {
    match k {
        0..=7 => Op::AllocStorage {
            kind: next() as u8,
            len: if next() % 8 == 0 {
                0
            } else {
                1 + next() % 1024
            },
        },
        8..=9 => Op::CloneStorage { idx },
        10..=12 => Op::SliceStorage {
            idx,
            a: next(),
            b: next(),
        },
        13..=19 => Op::DropOwner {
            idx,
            which: next() as usize,
        },
        20 => Op::Reclaim,
        21..=24 => Op::WriteRange {
            idx,
            a: next(),
            b: next(),
            seed: next() as u8,
        },
        25..=28 => Op::ReadRange {
            idx,
            a: next(),
            b: next(),
        },
        29..=32 => Op::CopyRange {
            src: idx,
            dst: if next() % 4 == 0 {
                idx
            } else {
                next() as usize
            },
            len: next(),
            at: next(),
            to: next(),
            extra: next() % 6 == 0,
        },
        33..=36 => Op::FillRange {
            idx,
            a: next(),
            b: next(),
            width: next() as u8,
            seed: next() as u8,
        },
        37..=38 => Op::RecordStream {
            idx,
            stream: next() as u8,
        },
        _ => Op::WaitOnArena {
            stream: next() as u8,
        },
    }
}

/// A weighted random op over an arena near 2^64 B: sizes from bytes to
/// 2^63, alignments up to the maximum, and the same bad input.
pub(super) fn gen_huge_op(rng: &mut Rng, cap: u64) -> Op {
    let mut next = || rng.next();
    let k = next() % 100;
    let idx = next() as usize;
    match k {
        0..=39 => {
            let size = match next() % 6 {
                0 => 1 + next() % 4096,
                1 => 1 + next() % (1u64 << (20 + next() % 42)),
                // Near 2^62 and 2^63.
                2 | 3 => (1u64 << 62) + next() % (1u64 << 62),
                4 => (1u64 << 63) - next() % (1u64 << 40),
                _ => 1 + next() % (cap / 3).max(1),
            };
            let align_log2 = match next() % 4 {
                0 => 0,
                1 => 30, // MAX_ALIGN
                _ => (next() % 31) as u8,
            };
            Op::Alloc { size, align_log2 }
        }
        // All the free bytes half the time: fills the region to its last
        // byte, so holes open next to 2^64 when blocks there are freed.
        40..=49 => Op::AllocFree {
            frac: if next() % 2 == 0 {
                255
            } else {
                (next() % 255 + 1) as u8
            },
        },
        50..=74 => Op::Free { idx },
        75..=79 => Op::Pin { idx },
        80..=84 => Op::Unpin { idx },
        85..=89 => Op::Compact,
        90 => Op::ZeroAlloc,
        91 => Op::BadAlign,
        92..=93 => Op::TooLarge,
        94..=96 => Op::DoubleFree,
        97 => Op::ForeignHandle,
        _ => Op::Write { idx, seed: 0 },
    }
}
