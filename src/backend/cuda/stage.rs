//! Host half of plan execution: checks a plan's moves and lays them out as
//! the arrays the kernels read (plain data, tested without a GPU).
//!
//! Each wave of `n` moves gets, in both the page-locked staging buffer and
//! the device buffer, at the same word offset: `n` source offsets, `n`
//! destination offsets and `n` lengths (`u64` each), then `n` tile indices
//! (`u32`): [`staging_words`] words. A wave is executed in chunks (see
//! [`chunks`]): each chunk is checked, laid out, uploaded and launched while
//! the host goes on with the next, so the host's work overlaps the GPU's
//! instead of delaying it. Tile indices count from 0 in every chunk; the
//! prep kernel turns them into one [`TILE_DESC_BYTES`] descriptor per tile.

use crate::backend::check_range;
use crate::error::{Error, Result};
use crate::plan::{Move, Plan};

/// The most tiles one chunk may have: the kernel indexes tiles with `u32`
/// and its ticket counter overshoots by up to one ticket per CTA (the bulk
/// kernel: one per slot of each CTA's ring, at most 16).
pub(crate) const MAX_CHUNK_TILES: u64 = (u32::MAX as u64) - (1 << 24);

/// Moves of the first chunk of a wave: small, so that the GPU starts soon.
pub(crate) const FIRST_CHUNK_MOVES: usize = 1024;

/// Moves of the largest chunk. Chunks grow 2x from the first up to this.
pub(crate) const MAX_CHUNK_MOVES: usize = 65536;

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
    /// Tiles of the chunk.
    pub(crate) tiles: u32,
    /// At least the side-buffer bytes its deferring tiles would take (the
    /// prep kernel takes at most `DEFER_MAX + 48` per tile; see
    /// [`side_bytes_of`]).
    pub(crate) side_bytes: u64,
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

/// `u64` words of a wave of `n` moves.
pub(crate) fn staging_words(n: usize) -> usize {
    3 * n + n.div_ceil(2)
}

/// Word offset of each wave's arrays, and the words of the whole plan.
pub(crate) fn wave_offsets(plan: &Plan) -> (Vec<usize>, usize) {
    let mut offsets = Vec::with_capacity(plan.waves.len());
    let mut words = 0;
    for wave in &plan.waves {
        offsets.push(words);
        words += staging_words(wave.moves.len());
    }
    (offsets, words)
}

/// The chunks `(first move, moves)` of a wave of `n` moves: each twice the
/// last. The host lays out chunk k+1 while the GPU runs chunk k, so the
/// GPU idles whenever that takes longer; laying out a move costs the host
/// about half of what the GPU spends moving a 4-64 KiB block, so doubling
/// keeps the host ahead where growing 4x did not (0.07-0.29 ms idle over
/// 100,000 such moves in two H100 runs).
pub(crate) fn chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut start = 0;
    let mut size = FIRST_CHUNK_MOVES;
    std::iter::from_fn(move || {
        if start >= n {
            return None;
        }
        let len = size.min(n - start);
        let chunk = (start, len);
        start += len;
        size = (size * 2).min(MAX_CHUNK_MOVES);
        Some(chunk)
    })
}

/// Word offsets, relative to the wave's, of a wave's four arrays, for a
/// wave of `n` moves: `(src, dst, len, tile_base)`; `tile_base` holds
/// `u32`s.
pub(crate) fn array_words(n: usize) -> [usize; 4] {
    [0, n, 2 * n, 3 * n]
}

/// A wave's arrays in the staging buffer.
pub(crate) struct WaveArrays<'a> {
    pub(crate) src: &'a mut [u64],
    pub(crate) dst: &'a mut [u64],
    pub(crate) len: &'a mut [u64],
    pub(crate) tile_base: &'a mut [u32],
}

/// Splits `words` (at least [`staging_words`]`(n)` long) into a wave's arrays.
pub(crate) fn wave_arrays(words: &mut [u64], n: usize) -> Result<WaveArrays<'_>> {
    if words.len() < staging_words(n) {
        return Err(Error::InvalidPlan {
            reason: format!(
                "internal: staging area of {} words for {n} moves",
                words.len()
            ),
        });
    }
    let (head, tail) = words.split_at_mut(3 * n);
    let (src, rest) = head.split_at_mut(n);
    let (dst, len) = rest.split_at_mut(n);
    let tile_base: &mut [u32] = bytemuck::cast_slice_mut(&mut tail[..n.div_ceil(2)]);
    Ok(WaveArrays {
        src,
        dst,
        len,
        tile_base: &mut tile_base[..n],
    })
}

/// Checks the moves `start..start + moves.len()` of wave `w` (non-empty,
/// inside the region, sources ascending and disjoint, also across chunks
/// through `prev_end`) and writes them into `arrays` at `start`, with tile
/// indices from 0. Returns the chunk's tiles and side-buffer bound.
/// `tile_shift` is log2 of the tile size.
///
/// Rule 3 is checked on the device (per tile by the prep kernel, per move
/// over the whole wave by the check kernel); rules 2 and 4 are the
/// planner's obligation (see [`Plan::validate`]).
pub(crate) fn stage_chunk(
    w: usize,
    start: usize,
    moves: &[Move],
    arrays: &mut WaveArrays<'_>,
    prev_end: &mut Option<u64>,
    capacity_bytes: u64,
    tile_shift: u32,
) -> Result<Staged> {
    let round = (1u64 << tile_shift) - 1;
    let end = start + moves.len();
    let (src, dst, len) = (
        &mut arrays.src[start..end],
        &mut arrays.dst[start..end],
        &mut arrays.len[start..end],
    );
    let tile_base = &mut arrays.tile_base[start..end];
    let mut tiles: u64 = 0;
    let mut side_bytes: u64 = 0;
    for (k, m) in moves.iter().enumerate() {
        check_range(m.src, m.len, capacity_bytes)?;
        check_range(m.dst, m.len, capacity_bytes)?;
        if m.len == 0 {
            return Err(Error::InvalidPlan {
                reason: format!("wave {w} move {} is empty", start + k),
            });
        }
        if prev_end.is_some_and(|e| e > m.src) {
            return Err(Error::InvalidPlan {
                reason: format!(
                    "wave {w}: move {} source is not after the previous move's source \
                     (sources must ascend and be disjoint)",
                    start + k
                ),
            });
        }
        *prev_end = Some(m.src + m.len);
        src[k] = m.src;
        dst[k] = m.dst;
        len[k] = m.len;
        // `tiles` stays below MAX_CHUNK_TILES < u32::MAX (checked below).
        tile_base[k] = tiles as u32;
        // Tiles are a power of two: shift, not divide (a division per move
        // was most of this loop's cost).
        let move_tiles = (m.len >> tile_shift) + u64::from(m.len & round != 0);
        tiles += move_tiles;
        side_bytes += side_bytes_of(m, move_tiles, tile_shift);
        if tiles > MAX_CHUNK_TILES {
            return Err(Error::InvalidPlan {
                reason: format!(
                    "wave {w}: moves {start}.. hold more than {MAX_CHUNK_TILES} tiles of \
                     {} B; split the wave",
                    1u64 << tile_shift
                ),
            });
        }
    }
    Ok(Staged {
        tiles: tiles as u32,
        side_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Move, PlanKind, Wave};

    fn mv(src: u64, dst: u64, len: u64) -> Move {
        Move {
            key: src,
            src,
            dst,
            len,
        }
    }

    /// The bounds mirror the kernels' header, and only small slides down
    /// count.
    #[test]
    fn side_bytes_bound_small_slides_only() {
        let header = include_str!("../../../kernels/moves.h");
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
        let mut arrays = wave_arrays(&mut words, 2).expect("fits");
        let staged = stage_chunk(
            0,
            0,
            &[mv(256, 0, 1 << 20), mv((2 << 20) + 4096, 2 << 20, 1 << 20)],
            &mut arrays,
            &mut None,
            8 << 20,
            shift,
        )
        .expect("valid");
        assert_eq!(
            staged,
            Staged {
                tiles: 32,
                side_bytes: 16 * (256 + 48)
            }
        );
    }

    fn stage_wave(moves: &[Move], capacity: u64, shift: u32) -> Result<(Vec<u64>, Vec<u32>)> {
        let n = moves.len();
        let mut words = vec![0u64; staging_words(n)];
        let mut arrays = wave_arrays(&mut words, n)?;
        let mut prev_end = None;
        let mut tiles = Vec::new();
        for (start, len) in chunks(n) {
            tiles.push(
                stage_chunk(
                    0,
                    start,
                    &moves[start..start + len],
                    &mut arrays,
                    &mut prev_end,
                    capacity,
                    shift,
                )?
                .tiles,
            );
        }
        Ok((words, tiles))
    }

    #[test]
    fn lays_out_a_wave() {
        let moves = [mv(100, 0, 100), mv(250, 100, 250), mv(1000, 2000, 1)];
        let (words, tiles) = stage_wave(&moves, 4096, 7).expect("valid");
        assert_eq!(&words[..9], &[100, 250, 1000, 0, 100, 2000, 100, 250, 1]);
        let tb: &[u32] = bytemuck::cast_slice(&words[9..]);
        assert_eq!(&tb[..3], &[0, 1, 3]);
        assert_eq!(tiles, vec![4]);
    }

    #[test]
    fn chunks_grow_and_cover_the_wave() {
        let c: Vec<_> = chunks(100_000).collect();
        assert_eq!(c[0], (0, FIRST_CHUNK_MOVES));
        assert_eq!(c[1], (FIRST_CHUNK_MOVES, 2 * FIRST_CHUNK_MOVES));
        assert!(c.iter().all(|&(_, len)| len <= MAX_CHUNK_MOVES));
        assert_eq!(c.iter().map(|&(_, len)| len).sum::<usize>(), 100_000);
        assert!(c.windows(2).all(|p| p[0].0 + p[0].1 == p[1].0));
        assert_eq!(chunks(0).count(), 0);
        assert_eq!(chunks(5).collect::<Vec<_>>(), vec![(0, 5)]);
    }

    #[test]
    fn tile_indices_restart_in_every_chunk() {
        let moves: Vec<Move> = (0..3000u64).map(|i| mv(i * 300, i * 300, 200)).collect();
        let (words, tiles) = stage_wave(&moves, 1 << 30, 7).expect("valid");
        let tb: &[u32] = bytemuck::cast_slice(&words[3 * 3000..]);
        assert_eq!(
            tb[FIRST_CHUNK_MOVES - 1],
            2 * (FIRST_CHUNK_MOVES as u32 - 1)
        );
        assert_eq!(tb[FIRST_CHUNK_MOVES], 0);
        assert_eq!(tiles, vec![2048, 2 * (3000 - 1024) as u32]);
    }

    #[test]
    fn rejects_bad_moves() {
        let unsorted = [mv(200, 0, 10), mv(100, 50, 10)];
        assert!(matches!(
            stage_wave(&unsorted, 1000, 6),
            Err(Error::InvalidPlan { .. })
        ));
        let outside = [mv(995, 0, 10)];
        assert!(matches!(
            stage_wave(&outside, 1000, 6),
            Err(Error::OutOfBounds { .. })
        ));
        let empty = [mv(0, 10, 0)];
        assert!(matches!(
            stage_wave(&empty, 1000, 6),
            Err(Error::InvalidPlan { .. })
        ));
        let overflow = [mv(0, u64::MAX - 5, 10)];
        assert!(matches!(
            stage_wave(&overflow, 1000, 6),
            Err(Error::OutOfBounds { .. })
        ));
        // Source order is checked across chunk boundaries too.
        let mut moves: Vec<Move> = (0..1100u64)
            .map(|i| mv(i * 10, 100_000 + i * 10, 5))
            .collect();
        moves[FIRST_CHUNK_MOVES].src = 0;
        assert!(matches!(
            stage_wave(&moves, 1 << 20, 6),
            Err(Error::InvalidPlan { .. })
        ));
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
        assert_eq!(array_words(3), [0, 3, 6, 9]);
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
            let mut arrays = wave_arrays(&mut words, n).expect("fits");
            let mut prev_end = None;
            let mut tiles = 0u64;
            for (start, len) in chunks(n) {
                tiles += u64::from(
                    stage_chunk(
                        0,
                        start,
                        &moves[start..start + len],
                        &mut arrays,
                        &mut prev_end,
                        u64::MAX / 2,
                        15,
                    )
                    .expect("ok")
                    .tiles,
                );
            }
            println!("stage: {:?} ({tiles} tiles)", t.elapsed());
        }
    }
}
