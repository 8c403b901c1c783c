//! Plan execution: scratch sizing, staging the waves of a plan chunk by
//! chunk, the launches of the move kernels, and the error word they
//! report. The rest of the `Backend` implementation is in `transfers`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{result, LaunchConfig, PushKernelArg};

use super::buffers::Blocked;
use super::pool::Pool;
use super::scratch::Staging;
use super::wave::WaveArgs;
use super::{driver_err, stage, CudaBackend, CTL_WORDS};
use crate::error::{BackendError, Error, Result};
use crate::plan::Plan;

/// Bit of the kernels' error word (`kernels/moves.h`) for a wait that timed
/// out; the other bit (1) is a plan breaking rule 3.
const ERR_TIMEOUT: u32 = 2;

impl CudaBackend {
    /// Sizes plan execution's scratch from the region's capacity, so that
    /// a compaction grows nothing (see [`stage::presize_for`]): staging for
    /// plans of that many moves (two page-locked buffers), descriptors and
    /// flags for a chunk over the whole region. Where memory is short for
    /// that, a first chunk's share (the buffers then grow in stream order
    /// when a plan first needs them, which does not block the host either).
    pub(super) fn presize(&mut self) -> Result<()> {
        let (moves, tiles) = stage::presize_for(self.capacity_bytes, self.primary.info.tile_bytes);
        if self.reserve_scratch(moves, tiles, 2).is_err() {
            self.reserve_scratch(stage::FIRST_CHUNK_MOVES, 4096, 0)?;
        }
        // The upload stream's kernels use these buffers: order it after
        // their allocation on the arena stream.
        let s = &self.scratch;
        s.grown
            .record(&self.stream)
            .map_err(driver_err("cuEventRecord"))?;
        s.upload_stream
            .wait(&s.grown)
            .map_err(driver_err("cuStreamWaitEvent"))?;
        self.scratch.counters = Default::default();
        Ok(())
    }

    /// Grows the scratch to hold a plan of `moves` moves in chunks of up to
    /// `chunk_tiles` tiles, with `staging` idle page-locked buffers of the
    /// plan's size in the pool (and, if any, one for table updates).
    fn reserve_scratch(&mut self, moves: usize, chunk_tiles: usize, staging: usize) -> Result<()> {
        let pooled = self.ctx.has_async_alloc();
        let words = stage::staging_words(moves);
        let stream = &self.stream;
        let s = &mut self.scratch;
        let b = &mut s.counters.blocked;
        s.moves
            .grow(words * 8, usize::MAX, false, stream, pooled, b)?;
        // Two halves (see `chunk_done`), each 256-aligned.
        let desc = (chunk_tiles * stage::TILE_DESC_BYTES).next_multiple_of(256);
        s.tiles
            .grow(2 * desc, usize::MAX, false, stream, pooled, b)?;
        if s.flags
            .grow(chunk_tiles * 4, usize::MAX, true, stream, pooled, b)?
        {
            s.epoch = 0;
        }
        for _ in 0..staging {
            let size = s.staging.size_for(words);
            s.staging.add_idle(Staging::new(&self.ctx, size)?);
        }
        if staging > 0 {
            let size = s.table_staging.size_for(0);
            s.table_staging.add_idle(Staging::new(&self.ctx, size)?);
        }
        Ok(())
    }

    /// Looks at the kernels' error word copied back by the last plan:
    /// waits for it when `wait`, else only if the GPU is already done.
    ///
    /// Faults are sticky: the device's error word is never cleared, so once
    /// a plan broke the wave rule or the watchdog fired, every later check
    /// reports it again (the arena poisons itself the first time).
    pub(crate) fn check_status(&self, wait: bool) -> Result<()> {
        let s = &self.scratch;
        if !s.status_pending.load(Ordering::Acquire) {
            return Ok(());
        }
        if wait {
            s.status_ready
                .synchronize()
                .map_err(driver_err("cuEventSynchronize"))?;
        } else if !s
            .status_ready
            .try_is_complete()
            .map_err(driver_err("cuEventQuery"))?
        {
            return Ok(());
        }
        // Word 1 of each block of control words (see `Scratch::ctl`).
        let bits = (s.status.load(0) >> 32) as u32 | (s.status.load(CTL_WORDS / 2) >> 32) as u32;
        if bits == 0 {
            s.status_pending.store(false, Ordering::Release);
            return Ok(());
        }
        if bits & ERR_TIMEOUT != 0 {
            return Err(Error::Backend(BackendError::DeviceFault {
                reason: format!(
                    "the move kernel's watchdog fired: a tile waited too long for an earlier \
                     tile (error bits {bits:#x}); the region's contents are undefined"
                ),
            }));
        }
        Err(Error::Backend(BackendError::DeviceFault {
            reason: format!(
                "the move kernel found a destination over the source of a later move in its \
                 wave (rule 3 of the plan; error bits {bits:#x}); the region's contents are undefined"
            ),
        }))
    }

    /// Orders the arena stream after everything enqueued on the upload
    /// stream so far (uploads and prep kernels).
    pub(super) fn arena_waits_for_uploads(&self) -> Result<()> {
        let s = &self.scratch;
        s.chunk_uploaded
            .record(&s.upload_stream)
            .map_err(driver_err("cuEventRecord"))?;
        self.stream
            .wait(&s.chunk_uploaded)
            .map_err(driver_err("cuStreamWaitEvent"))
    }
}

/// Hands `staging` back to `pool` behind the work enqueued on `stream`
/// so far (the copies that read it): its event is recorded there. If that
/// fails, waits for the stream (an error path, counted in `blocked`) and
/// hands it back idle.
pub(super) fn hand_back(
    pool: &mut Pool<Staging>,
    staging: Staging,
    stream: &cudarc::driver::CudaStream,
    blocked: &mut Blocked,
) -> Result<()> {
    match staging.done.record(stream) {
        Ok(()) => {
            pool.put_busy(staging);
            Ok(())
        }
        Err(e) => {
            let _ = blocked.count(|| stream.synchronize());
            pool.put_idle(staging);
            Err(driver_err("cuEventRecord")(e))
        }
    }
}

impl CudaBackend {
    /// [`Backend::execute`]: never waits for the device. The plan's
    /// records are staged in a page-locked buffer that no queued upload
    /// reads (from a pool: buffers still read by the uploads of earlier
    /// plans, queued behind whatever the streams hold, are replaced, not
    /// waited for), and device scratch that must grow grows in stream order.
    pub(super) fn execute_now(&mut self, plan: &Plan) -> Result<()> {
        self.check_status(false)?;
        if plan.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let (wave_words, words) = stage::wave_offsets(plan);
        let ctx = Arc::clone(&self.ctx);
        let mut staging = self
            .scratch
            .staging
            .take(words, |w| Staging::new(&ctx, w))?;
        let result = self.enqueue_plan(plan, &wave_words, words, &mut staging);
        // Whatever happened, the arena stream waits for every upload
        // enqueued (so that synchronising it covers them, as drop assumes,
        // and the next plan's uploads, ordered after its start on the arena
        // stream, cannot overwrite `moves` under them), and the staging
        // buffer goes back to the pool behind the uploads that read it.
        let waited = self.arena_waits_for_uploads();
        let upload = Arc::clone(&self.scratch.upload_stream);
        let s = &mut self.scratch;
        let back = match waited {
            Ok(()) => hand_back(&mut s.staging, staging, &upload, &mut s.counters.blocked),
            Err(e) => {
                // The arena stream may not wait for the uploads: wait here,
                // so that neither the staging buffer nor `moves` is reused
                // under them (an error path: the arena poisons itself).
                let _ = s.counters.blocked.count(|| upload.synchronize());
                s.staging.put_idle(staging);
                Err(e)
            }
        };
        result?;
        back?;

        // Bring the error word home without waiting for it.
        let s = &mut self.scratch;
        let status = s.status.as_mut_slice();
        let status = &mut status[..CTL_WORDS];
        // SAFETY: `status` is page-locked host memory owned by self and read
        // only after `status_ready` completes; ctl holds both blocks,
        // `2 * CTL_WORDS` u32s (the size of `status`).
        unsafe { result::memcpy_dtoh_async(status, s.ctl.ptr, self.stream.cu_stream()) }
            .map_err(driver_err("cuMemcpyDtoHAsync"))?;
        s.status_ready
            .record(&self.stream)
            .map_err(driver_err("cuEventRecord"))?;
        s.status_pending.store(true, Ordering::Release);
        Ok(())
    }

    /// Grows the device copy of the plan's records to `bytes` (in the
    /// order of the arena stream, before the plan starts there: the
    /// uploads wait for that start).
    fn grow_moves(&mut self, bytes: usize) -> Result<()> {
        if self.scratch.moves.bytes >= bytes {
            return Ok(());
        }
        // The old records are read by the last plan's prep and check
        // kernels on the upload stream: the arena stream, where the old
        // buffer is freed, waits for them first.
        self.arena_waits_for_uploads()?;
        let pooled = self.ctx.has_async_alloc();
        let s = &mut self.scratch;
        let b = &mut s.counters.blocked;
        if s.moves
            .grow(bytes, usize::MAX, false, &self.stream, pooled, b)?
        {
            s.counters.grown += 1;
        }
        Ok(())
    }

    /// Grows what one chunk needs on the device: the side buffer to
    /// `side_bytes` (up to the options' cap), each half of the descriptors
    /// to `desc_bytes`, the flags to `tiles`. Never blocks the host where
    /// the device has memory pools: the old buffers are freed and the new
    /// ones made in the order of the arena stream, which first waits for
    /// the upload stream (whose prep kernels read the old descriptors),
    /// and the upload stream then waits for the arena stream (its next
    /// prep kernel writes the new ones).
    fn grow_chunk_scratch(
        &mut self,
        side_bytes: usize,
        desc_bytes: usize,
        tiles: usize,
    ) -> Result<()> {
        let s = &self.scratch;
        let need = s.side.bytes < side_bytes
            || (s.tiles.bytes / 2) & !255 < desc_bytes
            || s.flags.bytes < tiles * 4;
        if !need {
            return Ok(());
        }
        self.arena_waits_for_uploads()?;
        let pooled = self.ctx.has_async_alloc();
        let most = self.options.side_buffer_bytes as usize;
        let stream = &self.stream;
        let s = &mut self.scratch;
        let b = &mut s.counters.blocked;
        let mut grown = 0;
        grown += u64::from(s.side.grow(side_bytes, most, false, stream, pooled, b)?);
        grown += u64::from(
            s.tiles
                .grow(2 * desc_bytes, usize::MAX, false, stream, pooled, b)?,
        );
        if s.flags
            .grow(tiles * 4, usize::MAX, true, stream, pooled, b)?
        {
            s.epoch = 0;
            grown += 1;
        }
        s.counters.grown += grown;
        s.grown
            .record(stream)
            .map_err(driver_err("cuEventRecord"))?;
        s.upload_stream
            .wait(&s.grown)
            .map_err(driver_err("cuStreamWaitEvent"))
    }

    /// Checks, lays out, uploads and launches every chunk of `plan`, its
    /// records staged in `staging` (at least `words` words).
    fn enqueue_plan(
        &mut self,
        plan: &Plan,
        wave_words: &[usize],
        words: usize,
        staging: &mut Staging,
    ) -> Result<()> {
        self.grow_moves(words * 8)?;
        let prep_cap = self.sm_count.saturating_mul(8);
        // Uploads overwrite `moves`, which the last plan's kernels read.
        let upload = Arc::clone(&self.scratch.upload_stream);
        self.scratch
            .plan_start
            .record(&self.stream)
            .map_err(driver_err("cuEventRecord"))?;
        upload
            .wait(&self.scratch.plan_start)
            .map_err(driver_err("cuStreamWaitEvent"))?;
        for (w, wave) in plan.waves.iter().enumerate() {
            let n = wave.moves.len();
            if n == 0 {
                continue;
            }
            let wo = wave_words[w];
            let mut prev_end = None;
            let mut chunk_count = 0usize;
            let mut chunks = super::chunks::Chunks::new(n, self.copy_bytes_per_ns);
            while let Some((start, len)) = chunks.next_chunk() {
                let host_start = Instant::now();
                // Check and lay out this chunk while the GPU runs the
                // last, for the primary kernel's tiles; a chunk whose
                // moves are large on average goes to the large kernel,
                // whose tiles differ.
                let words = &mut staging.buf.as_mut_slice()[wo..];
                let recs = stage::wave_records(words, n)?;
                let primary_shift = self.primary.info.tile_bytes.trailing_zeros();
                let (options, primary, large) = (&self.options, &self.primary, &self.large);
                let (staged, tiles, large) = stage::stage_for_kernel(
                    w,
                    start,
                    &wave.moves[start..start + len],
                    recs,
                    &mut prev_end,
                    self.capacity_bytes,
                    primary_shift,
                    |staged| {
                        options.for_chunk(staged.bytes, len as u64)?;
                        let set = super::kernels::KernelSet::pick(primary, large, true);
                        Some(set.info.tile_bytes.trailing_zeros())
                    },
                )?;
                // Deferring tiles share what the options allow; the
                // rest wait (the prep kernel checks the room).
                let most = self.options.side_buffer_bytes;
                let side_cap = staged.side_bytes.min(u64::from(most)) as u32;
                // Halves start 256-aligned: a half is the buffer's half
                // rounded down, so the need is rounded up to match.
                let desc_bytes = (tiles as usize * stage::TILE_DESC_BYTES).next_multiple_of(256);
                // Growing is not the host's staging rate, which sizes the
                // next chunk.
                let grow_start = Instant::now();
                self.grow_chunk_scratch(side_cap as usize, desc_bytes, tiles as usize)?;
                let grow_time = grow_start.elapsed();
                let s = &mut self.scratch;
                // This chunk's half of the descriptors.
                let q = s.chunk_parity;
                let half = ((s.tiles.bytes / 2) & !255) as u64;
                let tiles_ptr = s.tiles.ptr + q as u64 * half;
                let ctl_ptr = s.ctl.ptr + (q * CTL_WORDS * 4) as u64;
                // The chunk's records: one upload.
                let chunk_words =
                    wo + stage::REC_WORDS * start..wo + stage::REC_WORDS * (start + len);
                let chunk_dev = s.moves.ptr + 8 * chunk_words.start as u64;
                let staged_words = &staging.buf.as_mut_slice()[chunk_words];
                // SAFETY: `moves` holds the plan's staging words (grown
                // above, in stream order before `plan_start`, which the
                // upload stream waits for) at the same offsets as the
                // page-locked staging buffer, and the chunk's words lie
                // inside this wave's area, which no kernel enqueued after
                // `plan_start` reads before this chunk. The staging buffer
                // came from the pool (no queued copy reads it) and is not
                // written again before `staging.done`, recorded on this
                // stream after the plan's last upload, has completed.
                unsafe { result::memcpy_htod_async(chunk_dev, staged_words, upload.cu_stream()) }
                    .map_err(driver_err("cuMemcpyHtoDAsync"))?;
                let epoch = self.next_epoch()?;
                let args = WaveArgs {
                    base: self.region_ptr,
                    moves: chunk_dev,
                    tiles: tiles_ptr,
                    flags: self.scratch.flags.ptr,
                    ctl: ctl_ptr,
                    n_moves: len as u32,
                    n_tiles: tiles,
                    epoch,
                    bulk_stages: 0,
                    side: self.scratch.side.ptr,
                    side_cap,
                    pad: 0,
                };
                self.launch_chunk(&args, large, prep_cap, q)?;
                let host_ns = host_start.elapsed().saturating_sub(grow_time).as_nanos();
                chunks.feedback(
                    len,
                    staged.bytes,
                    u64::try_from(host_ns).unwrap_or(u64::MAX),
                );
                self.scratch.chunk_parity = 1 - q;
                chunk_count += 1;
            }
            if chunk_count > 1 {
                // Rule 3 across the chunks of the wave, on the upload
                // stream: it reads only the records, so it runs beside
                // the last chunk's moves instead of after them.
                let args = WaveArgs {
                    base: self.region_ptr,
                    moves: self.scratch.moves.ptr + 8 * wo as u64,
                    tiles: self.scratch.tiles.ptr,
                    flags: self.scratch.flags.ptr,
                    ctl: self.scratch.ctl.ptr,
                    n_moves: n as u32,
                    n_tiles: 0,
                    epoch: self.scratch.epoch,
                    bulk_stages: 0,
                    side: 0,
                    side_cap: 0,
                    pad: 0,
                };
                let cfg = LaunchConfig {
                    grid_dim: ((n as u32).div_ceil(256).clamp(1, prep_cap), 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut check = upload.launch_builder(&self.primary.kernels.check);
                check.arg(&args);
                // SAFETY: `cuarena_check(WaveArgs)` reads the wave's
                // records (n of them, uploaded above on this stream)
                // and sets bits of ctl[1] atomically; nothing else.
                unsafe { check.launch(cfg) }
                    .map_err(driver_err("cuLaunchKernel(cuarena_check)"))?;
            }
        }
        Ok(())
    }
}
