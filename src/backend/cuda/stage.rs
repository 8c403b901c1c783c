//! Host half of plan execution: checks a plan's moves and lays them out as
//! the records the kernels read (plain data, tested without a GPU).
//!
//! Each wave of `n` moves gets, in both the page-locked staging buffer and
//! the device buffer, at the same word offset, `n` [`MoveRec`]s (source,
//! destination, length, first tile): [`staging_words`] words. A wave is
//! executed in chunks (see [`Chunks`](super::chunks::Chunks)): each chunk
//! is checked, laid out, uploaded and launched while the host goes on with
//! the next, so the host's work overlaps the GPU's instead of delaying it.
//! Tile indices count from 0 in every chunk; the prep kernel turns them
//! into one [`TILE_DESC_BYTES`] descriptor per tile.

use crate::backend::check_range;
use crate::error::{Error, Result};
use crate::plan::{Move, Plan};

#[cfg(test)]
use super::chunks::chunks;
pub(crate) use super::chunks::{FIRST_CHUNK_MOVES, MAX_CHUNK_MOVES};

/// The most tiles one chunk may have: the kernel indexes tiles with `u32`
/// and its ticket counter overshoots by up to one ticket per CTA (the bulk
/// kernel: one per slot of each CTA's ring, at most 16).
pub(crate) const MAX_CHUNK_TILES: u64 = (u32::MAX as u64) - (1 << 24);

/// Most moves a plan's scratch is sized for ahead of time (4 MiB of
/// records; see [`presize_for`]).
pub(crate) const PRESIZE_MAX_MOVES: usize = 1 << 17;

/// Most tiles a chunk's descriptors are sized for ahead of time (32 MiB a
/// half; see [`presize_for`]).
pub(crate) const PRESIZE_MAX_TILES: usize = 1 << 20;

/// What plan execution's scratch is sized for when a backend of
/// `capacity_bytes` is made, so that compactions grow nothing: `(moves of
/// a plan, tiles of a chunk)`.
///
/// A plan's moves are its live blocks at most; one per 4 KiB of region
/// (at least a first chunk's, at most [`PRESIZE_MAX_MOVES`]). A chunk's
/// tiles are at most its bytes over the tile size plus one per move, and
/// its bytes at most the region ([`PRESIZE_MAX_TILES`] at most). Larger
/// plans grow the buffers in stream order when they first need it, which
/// costs the host an allocation, never a wait; so does the side buffer,
/// which stays empty until a plan first slides a block by a small shift.
pub(crate) fn presize_for(capacity_bytes: u64, tile_bytes: u64) -> (usize, usize) {
    let clamp = |v: u64, lo: usize, hi: usize| usize::try_from(v).unwrap_or(hi).clamp(lo, hi);
    let moves = clamp(capacity_bytes / 4096, FIRST_CHUNK_MOVES, PRESIZE_MAX_MOVES);
    let chunk_moves = moves.min(MAX_CHUNK_MOVES + MAX_CHUNK_MOVES / 4);
    let tiles = clamp(
        (capacity_bytes / tile_bytes.max(1)).saturating_add(chunk_moves as u64),
        1,
        PRESIZE_MAX_TILES,
    );
    (moves, tiles)
}

/// Bytes of one `TileDesc` (kernels/moves.h).
pub(crate) const TILE_DESC_BYTES: usize = 32;

/// A tile defers its waiting part through the side buffer only when it is
/// at most this many bytes (`CUARENA_DEFER_MAX`, kernels/moves.h) ...
pub(crate) const DEFER_MAX: u64 = 4096;
/// ... and at most 1/`DEFER_RATIO` of the tile (`CUARENA_DEFER_RATIO`).
pub(crate) const DEFER_RATIO: u64 = 32;

/// What a staged chunk needs on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Staged {
    /// Tiles of the chunk, not yet checked against [`MAX_CHUNK_TILES`]
    /// (see [`check_tiles`]).
    pub(crate) tiles: u64,
    /// At least the side-buffer bytes its deferring tiles would take (the
    /// prep kernel takes at most `DEFER_MAX + 48` per tile; see
    /// [`side_bytes_of`]).
    pub(crate) side_bytes: u64,
    /// Bytes the chunk moves (picks its kernel).
    pub(crate) bytes: u64,
}

/// Side-buffer bytes the tiles of move `m` may take: only a move sliding
/// down by a small shift has tiles that defer (every tile's waiting part is
/// then `shift` bytes; a move further from its source waits whole tiles).
/// Each takes the shift rounded to 16 bytes plus a vector each side.
pub(crate) fn side_bytes_of(m: &Move, tiles: u64, tile_shift: u32) -> u64 {
    let shift = m.src.wrapping_sub(m.dst);
    if m.src > m.dst && shift <= DEFER_MAX && shift * DEFER_RATIO <= 1u64 << tile_shift {
        tiles * (shift + 48)
    } else {
        0
    }
}

/// Tiles of `1 << tile_shift` bytes that a move of `len` bytes covers
/// (a power of two: shift, not divide; this is on the staging loop).
fn tiles_of(len: u64, tile_shift: u32) -> u64 {
    (len >> tile_shift) + u64::from(len & ((1u64 << tile_shift) - 1) != 0)
}

/// One move as the kernels read it (`struct MoveRec`, kernels/moves.h):
/// a record per move, so that a chunk is one upload.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct MoveRec {
    pub(crate) src: u64,
    pub(crate) dst: u64,
    pub(crate) len: u64,
    /// Index of the move's first tile, from 0 in each chunk.
    pub(crate) tile_base: u32,
    pub(crate) pad: u32,
}

/// `u64` words of one [`MoveRec`].
pub(crate) const REC_WORDS: usize = std::mem::size_of::<MoveRec>() / 8;

/// `u64` words of a wave of `n` moves.
pub(crate) fn staging_words(n: usize) -> usize {
    REC_WORDS * n
}

/// Word offset of each wave's records, and the words of the whole plan.
pub(crate) fn wave_offsets(plan: &Plan) -> (Vec<usize>, usize) {
    let mut offsets = Vec::with_capacity(plan.waves.len());
    let mut words = 0;
    for wave in &plan.waves {
        offsets.push(words);
        words += staging_words(wave.moves.len());
    }
    (offsets, words)
}

/// The records of a wave of `n` moves in `words` (at least
/// [`staging_words`]`(n)` long).
pub(crate) fn wave_records(words: &mut [u64], n: usize) -> Result<&mut [MoveRec]> {
    let have = words.len();
    let recs: &mut [MoveRec] = bytemuck::cast_slice_mut(&mut words[..have / REC_WORDS * REC_WORDS]);
    recs.get_mut(..n).ok_or_else(|| Error::InvalidInput {
        input: "plan",
        reason: format!("internal: staging area of {have} words for {n} moves"),
    })
}

/// Checks the moves `start..start + moves.len()` of wave `w` (non-empty,
/// inside the region, sources ascending and disjoint, also across chunks
/// through `prev_end`) and writes them into `recs` at `start`, with tile
/// indices from 0. Returns the chunk's tiles, side-buffer bound and bytes.
/// `tile_shift` is log2 of the tile size; [`retile`] redoes the tile
/// indices for another.
///
/// The loop only folds every check into one flag and, when it is set,
/// [`first_error`] finds which move broke which rule: this loop is on the
/// path between a plan and its first launch, so it takes one branch per
/// chunk, not one per rule and move, and no second pass.
///
/// Rule 3 is checked on the device (per tile by the prep kernel, per move
/// over the whole wave by the check kernel); rules 2 and 4 are the
/// planner's obligation (see [`Plan::validate`]).
pub(crate) fn stage_chunk(
    w: usize,
    start: usize,
    moves: &[Move],
    recs: &mut [MoveRec],
    prev_end: &mut Option<u64>,
    capacity_bytes: u64,
    tile_shift: u32,
) -> Result<Staged> {
    let end = start + moves.len();
    let cap = capacity_bytes;
    let mut bad = false;
    let mut prev = prev_end.unwrap_or(0);
    let mut tiles: u64 = 0;
    let mut side_bytes: u64 = 0;
    let mut bytes: u64 = 0;
    for (m, rec) in moves.iter().zip(&mut recs[start..end]) {
        let (s, d, l) = (m.src, m.dst, m.len);
        let (s_end, d_end) = (s.wrapping_add(l), d.wrapping_add(l));
        // A wrapped end is below its start (l > 0 is checked alongside).
        bad |= (l == 0) | (s_end < s) | (s_end > cap) | (d_end < d) | (d_end > cap) | (s < prev);
        prev = s_end;
        // `tile_base` is wrong only once `tiles` passed MAX_CHUNK_TILES:
        // `check_tiles` then rejects the chunk, unless `retile` redoes them
        // for larger tiles first.
        *rec = MoveRec {
            src: s,
            dst: d,
            len: l,
            tile_base: tiles as u32,
            pad: 0,
        };
        let move_tiles = tiles_of(l, tile_shift);
        tiles = tiles.saturating_add(move_tiles);
        side_bytes = side_bytes.saturating_add(side_bytes_of(m, move_tiles, tile_shift));
        bytes = bytes.saturating_add(l);
    }
    if bad {
        return Err(first_error(w, start, moves, *prev_end, capacity_bytes));
    }
    *prev_end = Some(prev);
    Ok(Staged {
        tiles,
        side_bytes,
        bytes,
    })
}

/// Redoes the tile indices of the chunk `start..start + n`, staged by
/// [`stage_chunk`], for tiles of `1 << tile_shift` bytes (a chunk of large
/// moves goes to a kernel with larger tiles; its moves are few for their
/// bytes, so the second pass is cheap next to moving them).
pub(crate) fn retile(start: usize, n: usize, recs: &mut [MoveRec], tile_shift: u32) -> Staged {
    let end = start + n;
    let (mut tiles, mut side_bytes, mut bytes) = (0u64, 0u64, 0u64);
    for rec in &mut recs[start..end] {
        rec.tile_base = tiles as u32;
        let len = rec.len;
        let move_tiles = tiles_of(len, tile_shift);
        tiles = tiles.saturating_add(move_tiles);
        let m = Move {
            key: 0,
            src: rec.src,
            dst: rec.dst,
            len,
        };
        side_bytes = side_bytes.saturating_add(side_bytes_of(&m, move_tiles, tile_shift));
        bytes = bytes.saturating_add(len);
    }
    Staged {
        tiles,
        side_bytes,
        bytes,
    }
}

/// Stages the chunk `start..start + moves.len()` of wave `w` (as
/// [`stage_chunk`], for the primary kernel's tiles of `1 << primary_shift`
/// bytes) for the kernel that runs it: `large_shift` says, from the staged
/// chunk, whether it goes to the large kernel and that kernel's tile shift;
/// the chunk is then retiled. Returns the staged chunk, its tile count,
/// checked for that kernel's tiles (a chunk with too many primary tiles may
/// fit the large kernel's), and whether it goes to the large kernel.
#[allow(clippy::too_many_arguments)] // the stage_chunk arguments, plus the kernel choice
pub(crate) fn stage_for_kernel(
    w: usize,
    start: usize,
    moves: &[Move],
    recs: &mut [MoveRec],
    prev_end: &mut Option<u64>,
    capacity_bytes: u64,
    primary_shift: u32,
    large_shift: impl FnOnce(&Staged) -> Option<u32>,
) -> Result<(Staged, u32, bool)> {
    let mut staged = stage_chunk(
        w,
        start,
        moves,
        recs,
        prev_end,
        capacity_bytes,
        primary_shift,
    )?;
    let large = large_shift(&staged);
    let shift = large.unwrap_or(primary_shift);
    if shift != primary_shift {
        staged = retile(start, moves.len(), recs, shift);
    }
    let tiles = check_tiles(w, start, staged.tiles, shift)?;
    Ok((staged, tiles, large.is_some()))
}

/// The tile count of a staged chunk, for the kernel whose tiles are
/// `1 << tile_shift` bytes, once it fits the kernels' `u32` tile indices.
/// Checked after the kernel is picked (see [`stage_for_kernel`]).
fn check_tiles(w: usize, start: usize, tiles: u64, tile_shift: u32) -> Result<u32> {
    match u32::try_from(tiles) {
        Ok(t) if tiles <= MAX_CHUNK_TILES => Ok(t),
        _ => Err(Error::InvalidInput {
            input: "plan",
            reason: format!(
                "wave {w}: moves {start}.. hold more than {MAX_CHUNK_TILES} tiles of {} B; \
                 split the wave",
                1u64 << tile_shift
            ),
        }),
    }
}

/// The error of the first move of a chunk that [`stage_chunk`] flagged.
fn first_error(
    w: usize,
    start: usize,
    moves: &[Move],
    mut prev_end: Option<u64>,
    capacity_bytes: u64,
) -> Error {
    for (k, m) in moves.iter().enumerate() {
        let checks = check_range(m.src, m.len, capacity_bytes)
            .and_then(|()| check_range(m.dst, m.len, capacity_bytes));
        if let Err(e) = checks {
            return e;
        }
        if m.len == 0 {
            return Error::InvalidInput {
                input: "plan",
                reason: format!("wave {w} move {} is empty", start + k),
            };
        }
        if prev_end.is_some_and(|e| e > m.src) {
            return Error::InvalidInput {
                input: "plan",
                reason: format!(
                    "wave {w}: move {} source is not after the previous move's source \
                     (sources must ascend and be disjoint)",
                    start + k
                ),
            };
        }
        prev_end = Some(m.src + m.len);
    }
    Error::InvalidInput {
        input: "plan",
        reason: format!("internal: wave {w}: a move from {start} was flagged but passes"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::MOVES_H;
    use super::super::wave::tests::{c_fields, rust_fields};
    use super::*;
    use crate::plan::tests::mv;
    use crate::plan::{PlanKind, Wave};

    /// The bounds mirror the kernels' header, and only small slides down
    /// count.
    #[test]
    fn side_bytes_bound_small_slides_only() {
        let header = MOVES_H;
        for (name, value) in [
            ("CUARENA_DEFER_MAX", DEFER_MAX),
            ("CUARENA_DEFER_RATIO", DEFER_RATIO),
        ] {
            assert!(
                header.contains(&format!("#define {name} {value}u")),
                "{name} differs from kernels/moves.h"
            );
        }
        let shift = 16; // 64 KiB tiles
        assert_eq!(
            side_bytes_of(&mv(256, 0, 1 << 20), 16, shift),
            16 * (256 + 48)
        );
        assert_eq!(side_bytes_of(&mv(1, 0, 100), 1, shift), 49);
        // Up to 1/32 of a tile (2 KiB here), never more than DEFER_MAX.
        assert_eq!(
            side_bytes_of(&mv(2048, 0, 1 << 20), 16, shift),
            16 * (2048 + 48)
        );
        assert_eq!(side_bytes_of(&mv(2049, 0, 1 << 20), 16, shift), 0);
        assert_eq!(side_bytes_of(&mv(8192, 0, 1 << 20), 16, 20), 0);
        // Not sliding down: nothing waits on itself.
        assert_eq!(side_bytes_of(&mv(0, 256, 1 << 20), 16, shift), 0);
        assert_eq!(side_bytes_of(&mv(256, 256, 1 << 20), 16, shift), 0);
        let mut words = vec![0u64; staging_words(2)];
        let recs = wave_records(&mut words, 2).expect("fits");
        let staged = stage_chunk(
            0,
            0,
            &[mv(256, 0, 1 << 20), mv((2 << 20) + 4096, 2 << 20, 1 << 20)],
            recs,
            &mut None,
            8 << 20,
            shift,
        )
        .expect("valid");
        assert_eq!(
            staged,
            Staged {
                tiles: 32,
                side_bytes: 16 * (256 + 48),
                bytes: 2 << 20,
            }
        );
        // Retiled for 1 MiB tiles: one tile per move, and the 4 KiB slide
        // is now at most 1/32 of its tile, so it defers too.
        let retiled = retile(0, 2, recs, 20);
        assert_eq!(
            retiled,
            Staged {
                tiles: 2,
                side_bytes: (256 + 48) + (4096 + 48),
                bytes: 2 << 20,
            }
        );
        assert_eq!([recs[0].tile_base, recs[1].tile_base], [0, 1]);
    }

    #[test]
    fn tile_limit_is_checked_for_the_kernel_that_runs() {
        // One 128 TiB move: 2^32 tiles of 32 KiB (the primary kernel's),
        // past the limit, but 2^31 of 64 KiB (the default large kernel's)
        // fit.
        let moves = [mv(1 << 47, 0, 1 << 47)];
        let mut words = vec![0u64; staging_words(1)];
        let recs = wave_records(&mut words, 1).expect("fits");
        let stage = |recs: &mut [MoveRec], large: Option<u32>| {
            stage_for_kernel(0, 0, &moves, recs, &mut None, 1 << 48, 15, |staged| {
                assert_eq!(staged.tiles, 1 << 32, "staged for the primary tiles first");
                large
            })
        };
        assert!(matches!(
            stage(recs, None),
            Err(Error::InvalidInput { input: "plan", .. })
        ));
        let (staged, tiles, large) = stage(recs, Some(16)).expect("fits the large tiles");
        assert_eq!((staged.tiles, tiles, large), (1 << 31, 1 << 31, true));
        // A large kernel with the primary's tiles (no large shape
        // compiled): no retile, and the limit still holds.
        assert!(matches!(
            stage(recs, Some(15)),
            Err(Error::InvalidInput { input: "plan", .. })
        ));
    }

    fn stage_wave(moves: &[Move], capacity: u64, shift: u32) -> Result<(Vec<MoveRec>, Vec<u32>)> {
        let n = moves.len();
        let mut words = vec![0u64; staging_words(n)];
        let recs = wave_records(&mut words, n)?;
        let mut prev_end = None;
        let mut tiles = Vec::new();
        for (start, len) in chunks(n) {
            let staged = stage_chunk(
                0,
                start,
                &moves[start..start + len],
                recs,
                &mut prev_end,
                capacity,
                shift,
            )?;
            tiles.push(check_tiles(0, start, staged.tiles, shift)?);
        }
        Ok((recs.to_vec(), tiles))
    }

    #[test]
    fn lays_out_a_wave() {
        let moves = [mv(100, 0, 100), mv(250, 100, 250), mv(1000, 2000, 1)];
        let (recs, tiles) = stage_wave(&moves, 4096, 7).expect("valid");
        let rec = |src, dst, len, tile_base| MoveRec {
            src,
            dst,
            len,
            tile_base,
            pad: 0,
        };
        assert_eq!(
            recs,
            vec![
                rec(100, 0, 100, 0),
                rec(250, 100, 250, 1),
                rec(1000, 2000, 1, 3)
            ]
        );
        assert_eq!(tiles, vec![4]);
        // The kernels' record is 32 bytes: src, dst, len, tile_base, pad.
        assert_eq!(std::mem::size_of::<MoveRec>(), 32);
        assert_eq!(
            c_fields(MOVES_H, "MoveRec"),
            rust_fields!(MoveRec: src, dst, len, tile_base, pad)
        );
    }

    #[test]
    fn tile_indices_restart_in_every_chunk() {
        let moves: Vec<Move> = (0..3000u64).map(|i| mv(i * 300, i * 300, 200)).collect();
        let (recs, tiles) = stage_wave(&moves, 1 << 30, 7).expect("valid");
        assert_eq!(
            recs[FIRST_CHUNK_MOVES - 1].tile_base,
            2 * (FIRST_CHUNK_MOVES as u32 - 1)
        );
        assert_eq!(recs[FIRST_CHUNK_MOVES].tile_base, 0);
        assert_eq!(tiles, vec![2048, 2 * (3000 - 1024) as u32]);
    }

    #[test]
    fn rejects_bad_moves() {
        let unsorted = [mv(200, 0, 10), mv(100, 50, 10)];
        assert!(matches!(
            stage_wave(&unsorted, 1000, 6),
            Err(Error::InvalidInput { input: "plan", .. })
        ));
        let outside = [mv(995, 0, 10)];
        assert!(matches!(
            stage_wave(&outside, 1000, 6),
            Err(Error::OutOfBounds { .. })
        ));
        let empty = [mv(0, 10, 0)];
        assert!(matches!(
            stage_wave(&empty, 1000, 6),
            Err(Error::InvalidInput { input: "plan", .. })
        ));
        let overflow = [mv(0, u64::MAX - 5, 10)];
        assert!(matches!(
            stage_wave(&overflow, 1000, 6),
            Err(Error::OutOfBounds { .. })
        ));
        // Source order is checked across chunk boundaries too (2000 moves:
        // two chunks; a remainder of at most a quarter would join the first).
        assert_eq!(chunks(2000).count(), 2);
        let mut moves: Vec<Move> = (0..2000u64)
            .map(|i| mv(i * 10, 100_000 + i * 10, 5))
            .collect();
        assert!(stage_wave(&moves, 1 << 20, 6).is_ok());
        moves[FIRST_CHUNK_MOVES].src = 0;
        assert!(matches!(
            stage_wave(&moves, 1 << 20, 6),
            Err(Error::InvalidInput { input: "plan", .. })
        ));
    }

    #[test]
    fn scratch_is_sized_from_the_capacity() {
        // A small arena: a first chunk, its tiles and the region's.
        assert_eq!(
            presize_for(1 << 20, 32 << 10),
            (FIRST_CHUNK_MOVES, 32 + FIRST_CHUNK_MOVES)
        );
        // 64 MiB: 16,384 moves (plans of 10,000 need no growth).
        assert_eq!(presize_for(64 << 20, 32 << 10), (16_384, 2048 + 16_384));
        // An 80 GB card's worth: both at their caps.
        assert_eq!(
            presize_for(80 << 30, 32 << 10),
            (PRESIZE_MAX_MOVES, PRESIZE_MAX_TILES)
        );
        // A 5 GiB region: a full chunk's moves plus the region's tiles.
        let (moves, tiles) = presize_for(5 << 30, 32 << 10);
        assert_eq!(moves, PRESIZE_MAX_MOVES);
        assert_eq!(tiles, 163_840 + MAX_CHUNK_MOVES + MAX_CHUNK_MOVES / 4);
    }

    #[test]
    fn wave_offsets_stack_the_waves() {
        let mut p = Plan::empty(PlanKind::Full);
        p.waves.push(Wave {
            moves: vec![mv(0, 10, 1); 3],
        });
        p.waves.push(Wave {
            moves: vec![mv(0, 10, 1); 2],
        });
        let (offsets, words) = wave_offsets(&p);
        assert_eq!(offsets, vec![0, staging_words(3)]);
        assert_eq!(words, staging_words(3) + staging_words(2));
    }
}

#[cfg(test)]
mod timing {
    use super::*;

    #[test]
    #[ignore = "timing probe"]
    fn stage_100k_moves() {
        let mut moves = Vec::new();
        let (mut src, mut dst) = (0u64, 0u64);
        for i in 0..100_000u64 {
            src += (i * 7919 % 256) * 256;
            let len = (16 + i * 104_729 % 240) * 256;
            moves.push(Move {
                key: i,
                src,
                dst,
                len,
            });
            src += len;
            dst += len;
        }
        let n = moves.len();
        let mut words = vec![0u64; staging_words(n)];
        for _ in 0..5 {
            let t = std::time::Instant::now();
            let recs = wave_records(&mut words, n).expect("fits");
            let mut prev_end = None;
            let mut tiles = 0u64;
            for (start, len) in chunks(n) {
                tiles += stage_chunk(
                    0,
                    start,
                    &moves[start..start + len],
                    recs,
                    &mut prev_end,
                    u64::MAX / 2,
                    15,
                )
                .expect("ok")
                .tiles;
            }
            println!("stage: {:?} ({tiles} tiles)", t.elapsed());
        }
    }
}
