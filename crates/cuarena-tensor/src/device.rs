//! Every call this crate makes on the arena: allocation, reads, copies.
//! Kept in one place so that a change of the core's API is one edit here.

use cuarena::backend::Backend;
use cuarena::{DType, SharedArena, Storage, StorageSlice};

use crate::error::Result;
use crate::layout::{Layout, Runs};

/// What a new storage holds.
pub(crate) enum Init<'a> {
    /// Whatever the arena's bytes were.
    Uninit,
    /// Zero bytes.
    Zeros,
    /// These bytes (exactly the storage's length).
    Bytes(&'a [u8]),
}

/// A storage of `numel` elements of `dtype`, allocated and initialised
/// under one exclusive lock (if the write fails, the storage is dropped and
/// its block goes back at the arena's next call).
pub(crate) fn alloc<B: Backend>(
    arena: &SharedArena<B>,
    dtype: DType,
    numel: u64,
    init: Init<'_>,
) -> Result<Storage> {
    let storage = arena.with_mut(|a| {
        let s = a.alloc_storage_dtype(dtype, numel)?;
        match init {
            Init::Uninit => {}
            Init::Zeros => a.fill(s.as_dtype(DType::U8)?, 0u8)?,
            Init::Bytes(bytes) => a.write_bytes(&s, bytes)?,
        }
        Ok::<Storage, cuarena::Error>(s)
    })??;
    Ok(storage)
}

/// The bytes `span` names, under the shared lock (a spilled block is
/// brought back first).
pub(crate) fn read<B: Backend>(arena: &SharedArena<B>, span: &StorageSlice) -> Result<Vec<u8>> {
    Ok(arena.read_bytes(span)?)
}

/// Strided copies with more runs than this go through the host.
pub(crate) const MAX_DEVICE_RUNS: usize = 256;

/// One side of a copy: the bytes a tensor spans and its layout in them.
pub(crate) struct Side<'a> {
    pub(crate) span: &'a StorageSlice,
    pub(crate) layout: &'a Layout,
}

/// True when both spans name a byte of one storage.
fn overlap(a: &StorageSlice, b: &StorageSlice) -> bool {
    a.storage().same_storage(b.storage())
        && a.offset_bytes() < b.offset_bytes() + b.len_bytes()
        && b.offset_bytes() < a.offset_bytes() + a.len_bytes()
}

/// Copies the elements of `src` into `dst` (one shape, one dtype of
/// `elem_bytes`, one arena): one device copy per run of elements contiguous
/// in both, under one exclusive lock, when there are at most
/// [`MAX_DEVICE_RUNS`] runs and the spans do not overlap; otherwise a host
/// round trip under the exclusive lock (read both spans, move the
/// elements, write the destination's span back), which also gives copies
/// between overlapping views the meaning "read everything, then write".
pub(crate) fn copy<B: Backend>(
    arena: &SharedArena<B>,
    src: Side<'_>,
    dst: Side<'_>,
    elem_bytes: usize,
) -> Result<()> {
    let runs = Runs::new(src.layout, dst.layout);
    if runs.count() == 0 {
        return Ok(());
    }
    if !overlap(src.span, dst.span) && runs.count() <= MAX_DEVICE_RUNS {
        if runs.count() == 1 {
            // Both dense: the spans are the elements.
            arena.copy(src.span, dst.span)?;
            return Ok(());
        }
        let run = runs.run() as u64;
        arena.with_mut(|a| {
            runs.try_for_each(|s, d| {
                let (s, d) = (s as u64, d as u64);
                a.copy(&src.span.slice(s..s + run)?, &dst.span.slice(d..d + run)?)
            })
        })??;
        return Ok(());
    }
    let run_bytes = runs.run() * elem_bytes;
    arena.with_mut(|a| {
        a.make_resident(&[src.span, dst.span])?;
        let from = a.read_bytes(src.span)?;
        let mut to = if dst.layout.is_contiguous() {
            // The span is the elements: every byte is written below.
            vec![0u8; run_bytes * runs.count()]
        } else {
            a.read_bytes(dst.span)?
        };
        runs.try_for_each(|s, d| {
            let (s, d) = (s * elem_bytes, d * elem_bytes);
            to[d..d + run_bytes].copy_from_slice(&from[s..s + run_bytes]);
            Ok::<(), cuarena::Error>(())
        })?;
        a.write_bytes(dst.span, &to)
    })??;
    Ok(())
}
