//! Following a plan's bytes: which block every move copies, where each
//! block's data is after every wave, and where every block ends.
//!
//! A move copies a whole block (`len == copy_len`, the common case) or a
//! *piece* of one: a byte range of its data, as the staged relayouts of
//! [`super::pieces`] make them. A block's data is tracked as pieces, each
//! `(offset in the block, bytes, where it is)`; a move must copy a range
//! that lies inside one piece, which it splits. At the end every moved
//! block's pieces must sit together again, at an offset its alignment
//! allows. A block's padding (its reservation past `copy_len`) holds no
//! data: it is never copied and only checked in the final layout.
#![deny(unsafe_code)]

use std::collections::{BTreeMap, HashMap};

use super::planner::{check_live, LiveBlock};
use super::{Move, Plan, PlanError};

/// The pieces of one block's data: where each lies -> `(offset in the
/// block, bytes)`.
type Pieces = BTreeMap<u64, (u64, u64)>;

fn invalid(reason: String) -> PlanError {
    PlanError::Plan(reason)
}

/// The pieces of the blocks a plan has moved so far, by block index.
#[derive(Default)]
struct Moved {
    pieces: HashMap<usize, Pieces>,
}

impl Moved {
    /// Takes the bytes move `m` of block `i` (`l`) copies out of one of
    /// its pieces, checked: the block is not pinned and the bytes lie in
    /// one piece, which splits around them. Returns the piece `m` makes
    /// (its offset in the block), to [`place`](Self::place) once every
    /// source of the wave is taken.
    fn take(&mut self, w: usize, m: &Move, i: usize, l: &LiveBlock) -> Result<u64, PlanError> {
        if l.pinned || m.len == 0 || m.len > l.copy_len {
            return Err(invalid(format!(
                "wave {w}: move {m:?} does not match its block {l:?}: pinned, empty or longer \
                 than the block's data"
            )));
        }
        let pieces = self
            .pieces
            .entry(i)
            .or_insert_with(|| BTreeMap::from([(l.offset, (0, l.copy_len))]));
        let found = pieces
            .range(..=m.src)
            .next_back()
            .map(|(&pos, &(boff, len))| (pos, boff, len))
            .filter(|&(pos, _, len)| m.src.checked_add(m.len).is_some_and(|e| e <= pos + len));
        let Some((pos, boff, len)) = found else {
            return Err(invalid(format!(
                "wave {w}: move {m:?} does not match its block {l:?}: no piece of it lies at \
                 the source"
            )));
        };
        pieces.remove(&pos);
        let cut = m.src - pos;
        if cut > 0 {
            pieces.insert(pos, (boff, cut));
        }
        if cut + m.len < len {
            pieces.insert(m.src + m.len, (boff + cut + m.len, len - cut - m.len));
        }
        Ok(boff + cut)
    }

    /// Puts the piece of block `i` at offset `boff` in it, `m.len` bytes,
    /// at `m.dst`: where no other piece of the block lies (the layout checks
    /// keep blocks apart; the pieces of one block, here).
    fn place(&mut self, w: usize, m: &Move, i: usize, boff: u64) -> Result<(), PlanError> {
        let pieces = self.pieces.entry(i).or_default();
        if pieces.insert(m.dst, (boff, m.len)).is_some() {
            return Err(invalid(format!(
                "wave {w}: move {m:?} lands on another piece of its block"
            )));
        }
        Ok(())
    }

    /// The final offset of every moved block (checked: its pieces sit
    /// together, in order, at an offset of its alignment).
    fn finals(&self, live: &[LiveBlock]) -> Result<Vec<(usize, u64)>, PlanError> {
        let mut out = Vec::with_capacity(self.pieces.len());
        for (&i, pieces) in &self.pieces {
            let l = &live[i];
            let start = pieces
                .iter()
                .next()
                .and_then(|(&pos, &(boff, _))| pos.checked_sub(boff));
            let together = start.is_some_and(|s| {
                pieces
                    .iter()
                    .all(|(&p, &(b, _))| p.checked_sub(b) == Some(s))
            });
            match start {
                Some(s) if together && s % l.align == 0 => out.push((i, s)),
                _ => {
                    return Err(invalid(format!(
                        "block {l:?} ends in pieces that do not sit together at an offset of \
                         its alignment: {pieces:?}"
                    )))
                }
            }
        }
        Ok(out)
    }
}

/// The final offset of every block `plan` moves, found by following its
/// pieces (`index_of` maps a move's key to the block's index in `live`).
/// Checks each move against its block and that the blocks end whole and
/// aligned; not the layout (the caller checks it).
pub(crate) fn final_offsets(
    plan: &Plan,
    live: &[LiveBlock],
    index_of: impl Fn(u64) -> Option<usize>,
) -> Result<Vec<(usize, u64)>, PlanError> {
    let mut moved = Moved::default();
    let mut taken = Vec::new();
    for (w, wave) in plan.waves.iter().enumerate() {
        taken.clear();
        for m in &wave.moves {
            let i = index_of(m.key)
                .filter(|&i| live.get(i).is_some_and(|l| l.key == m.key))
                .ok_or_else(|| invalid(format!("wave {w}: move {m:?} names no live block")))?;
            taken.push((i, moved.take(w, m, i, &live[i])?));
        }
        for (m, &(i, boff)) in wave.moves.iter().zip(&taken) {
            moved.place(w, m, i, boff)?;
        }
    }
    moved.finals(live)
}

/// Every rule of [`Plan::validate_against`]: see there. Data is tracked
/// range by range: after every wave no byte of a block's data lies where
/// another block's data (or the reservation of a block that has not
/// moved) lies, and the final layout, at reserved lengths, is valid.
pub(crate) fn validate_against(
    plan: &Plan,
    live: &[LiveBlock],
    capacity: u64,
) -> Result<(), PlanError> {
    check_live(live, capacity)?;
    plan.check(capacity)?;
    let mut by_key: Vec<(u64, usize)> = live.iter().enumerate().map(|(i, l)| (l.key, i)).collect();
    by_key.sort_unstable();
    if let Some(w) = by_key.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(PlanError::Layout(format!(
            "two live blocks share key {}",
            w[0].0
        )));
    }
    let index_of = |key: u64| {
        by_key
            .binary_search_by_key(&key, |e| e.0)
            .ok()
            .map(|k| by_key[k].1)
    };
    // Occupied ranges: start -> (end, block). A block that has not moved
    // holds its reservation; one that has, its data pieces.
    let mut occ: BTreeMap<u64, (u64, usize)> = live
        .iter()
        .enumerate()
        .map(|(i, l)| (l.offset, (l.offset + l.len, i)))
        .collect();
    let mut moved = Moved::default();
    for (w, wave) in plan.waves.iter().enumerate() {
        let mut landed: Vec<(u64, u64, usize, u64, Move)> = Vec::with_capacity(wave.moves.len());
        for m in &wave.moves {
            let i = index_of(m.key)
                .ok_or_else(|| invalid(format!("wave {w}: move {m:?} names no live block")))?;
            let l = &live[i];
            // First move of the block: its reservation becomes its data.
            if !moved.pieces.contains_key(&i) {
                occ.insert(l.offset, (l.offset + l.copy_len, i));
            }
            let boff = moved.take(w, m, i, l)?;
            // Vacate the source: it lies inside one occupied range of the
            // block (its piece), which splits around it.
            let (&s, &(e, owner)) = occ
                .range(..=m.src)
                .next_back()
                .filter(|(_, &(e, owner))| owner == i && m.src + m.len <= e)
                .ok_or_else(|| {
                    invalid(format!(
                        "wave {w}: move {m:?} reads bytes its block does not hold"
                    ))
                })?;
            occ.remove(&s);
            if s < m.src {
                occ.insert(s, (m.src, i));
            }
            if m.src + m.len < e {
                occ.insert(m.src + m.len, (e, owner));
            }
            landed.push((m.dst, m.dst + m.len, i, boff, *m));
        }
        for (lo, hi, i, boff, m) in landed {
            moved.place(w, &m, i, boff)?;
            let below = occ.range(..hi).next_back().map(|(&s, &(e, _))| (s, e));
            if below.is_some_and(|(_, e)| e > lo) {
                return Err(invalid(format!(
                    "after wave {w} the data of block {:?} at [{lo}, {hi}) overlaps another \
                     block's bytes",
                    live[i]
                )));
            }
            occ.insert(lo, (hi, i));
        }
    }
    // The final layout, at reserved lengths.
    let mut layout: Vec<(u64, u64)> = live.iter().map(|l| (l.offset, l.len)).collect();
    for (i, f) in moved.finals(live)? {
        layout[i].0 = f;
    }
    layout.sort_unstable();
    let mut cursor = 0u64;
    for &(offset, len) in &layout {
        match offset.checked_add(len).filter(|&e| e <= capacity) {
            Some(end) if offset >= cursor => cursor = end,
            _ => {
                return Err(invalid(format!(
                    "after the plan the block at {offset} of {len} B overlaps another (one \
                     ends at {cursor}) or leaves the region of {capacity} B"
                )))
            }
        }
    }
    Ok(())
}
