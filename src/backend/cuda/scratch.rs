//! The buffers and events the backend owns besides the region: plan
//! execution's scratch, the handle table's device copy, the host tier.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use super::buffers::{Blocked, DeviceBuf, PinnedBuf};
use super::driver_err;
use super::pool::{Fenced, Pool};
use crate::error::Result;

/// A page-locked staging buffer and the event recorded behind the last
/// copy that reads it (see [`Pool`]).
#[derive(Debug)]
pub(super) struct Staging {
    pub(super) buf: PinnedBuf,
    pub(super) done: CudaEvent,
}

impl Staging {
    /// A buffer of `words` words with its own event, on `ctx`.
    pub(super) fn new(ctx: &Arc<CudaContext>, words: usize) -> Result<Self> {
        Ok(Staging {
            buf: PinnedBuf::with_words(words)?,
            done: ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
        })
    }
}

impl Fenced for Staging {
    fn words(&self) -> usize {
        self.buf.words()
    }

    fn is_done(&self) -> Result<bool> {
        self.done
            .try_is_complete()
            .map_err(driver_err("cuEventQuery"))
    }
}

/// Host time of plan execution and table updates, and what the staging
/// memory grew to (see [`HostStats`](super::HostStats)).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Counters {
    /// Host time inside `execute` and `sync_table`.
    pub(super) staging: Duration,
    /// Of which blocked on the device.
    pub(super) blocked: Blocked,
    /// Device scratch buffers grown after creation.
    pub(super) grown: u64,
}

/// Everything plan execution needs besides the region, and the other
/// buffers the backend owns (host tier, handle table).
#[derive(Debug)]
pub(super) struct Scratch {
    /// Page-locked host tier for spilling (empty unless reserved).
    pub(super) host_tier: PinnedBuf,
    /// Bytes of the host tier.
    pub(super) host_tier_bytes: u64,
    /// Device copy of the arena's handle table.
    pub(super) table: DeviceBuf,
    /// Tables outgrown: kept until drop, since enqueued kernels and
    /// captured graphs may still hold their address.
    pub(super) retired_tables: Vec<DeviceBuf>,
    /// Page-locked sources of table uploads, each reused once its upload
    /// (on the arena stream) is done: they never block the host.
    pub(super) table_staging: Pool<Staging>,
    /// Per-move arrays (see `stage`).
    pub(super) moves: DeviceBuf,
    /// Per-tile descriptors (written by the prep kernel), in two halves:
    /// chunks alternate between them (see `chunk_done`).
    pub(super) tiles: DeviceBuf,
    /// Per-tile "loaded" flags, compared against the launch's epoch.
    pub(super) flags: DeviceBuf,
    /// Two blocks of [`CTL_WORDS`] `u32`s, one per half of `tiles`:
    /// ticket counter, error word, and the side buffer's fill (u64).
    pub(super) ctl: DeviceBuf,
    /// Deferred lower parts of tiles (see `kernels/moves.cu`); grows to
    /// at most `CudaOptions::side_buffer_bytes`, when a plan first needs it.
    pub(super) side: DeviceBuf,
    /// Host side of the per-move uploads: a plan takes a buffer that no
    /// queued upload still reads (the uploads of earlier plans run behind
    /// whatever the streams hold), and hands it back behind its own
    /// uploads, so the host never waits for them.
    pub(super) staging: Pool<Staging>,
    /// Host copy of the error word.
    pub(super) status: PinnedBuf,
    /// Per-move uploads run here, so that a chunk's upload overlaps the
    /// kernels of the chunk before it (on the arena stream they would
    /// queue behind them and add device time to a compaction).
    pub(super) upload_stream: Arc<CudaStream>,
    /// Recorded on the arena stream before a plan's first upload, and on
    /// the upload stream after each chunk's (the other stream waits).
    pub(super) plan_start: CudaEvent,
    pub(super) chunk_uploaded: CudaEvent,
    /// Recorded on the arena stream after the kernels of the last chunk
    /// that used each half of `tiles` (and block of `ctl`): a chunk's prep
    /// kernel runs on the upload stream, overlapping the move kernel of
    /// the chunk before, and waits for the chunk before that.
    pub(super) chunk_done: [CudaEvent; 2],
    /// Which half the next chunk uses.
    pub(super) chunk_parity: usize,
    /// Recorded on the arena stream after scratch grew there, waited for
    /// by the upload stream (whose kernels use the new buffers).
    pub(super) grown: CudaEvent,
    /// Host time of plan execution and table updates.
    pub(super) counters: Counters,
    /// Recorded after the error word was copied into `status`.
    pub(super) status_ready: CudaEvent,
    /// `status_ready` was recorded and not yet looked at.
    pub(super) status_pending: std::sync::atomic::AtomicBool,
    /// Epoch of the last move launch (flags equal to it are "loaded").
    pub(super) epoch: u32,
}

/// `u32`s of one block of the kernels' control words (`kernels/moves.h`):
/// ticket counter, error word, side-buffer fill (`u64`).
pub(super) const CTL_WORDS: usize = 4;

/// Smallest plan staging buffer, in words (1024 moves).
pub(super) const PLAN_STAGING_MIN_WORDS: usize = 4096;

/// Smallest table staging buffer, in words (4 KiB: 256 entries).
pub(super) const TABLE_STAGING_MIN_WORDS: usize = 512;

impl Scratch {
    /// Empty buffers (the backend sizes them from its capacity when it is
    /// made) and the events and upload stream, on `ctx`.
    pub(super) fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        Ok(Scratch {
            host_tier: PinnedBuf::EMPTY,
            host_tier_bytes: 0,
            table: DeviceBuf::EMPTY,
            retired_tables: Vec::new(),
            table_staging: Pool::new(TABLE_STAGING_MIN_WORDS),
            moves: DeviceBuf::EMPTY,
            tiles: DeviceBuf::EMPTY,
            flags: DeviceBuf::EMPTY,
            ctl: DeviceBuf::EMPTY,
            side: DeviceBuf::EMPTY,
            staging: Pool::new(PLAN_STAGING_MIN_WORDS),
            status: PinnedBuf::EMPTY,
            upload_stream: ctx.new_stream().map_err(driver_err("cuStreamCreate"))?,
            plan_start: ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
            chunk_uploaded: ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
            chunk_done: [
                ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
                ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
            ],
            chunk_parity: 0,
            grown: ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
            counters: Counters::default(),
            status_ready: ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
            status_pending: std::sync::atomic::AtomicBool::new(false),
            epoch: 0,
        })
    }

    /// Device bytes held beside the region (retired tables included).
    pub(super) fn device_bytes(&self) -> u64 {
        let bufs = [
            &self.moves,
            &self.tiles,
            &self.flags,
            &self.side,
            &self.ctl,
            &self.table,
        ];
        let held = bufs.into_iter().chain(&self.retired_tables);
        held.map(|b| b.bytes as u64).sum()
    }

    /// Frees every buffer. The caller has synchronised every stream that
    /// could still use them; pooled device buffers are freed in the order
    /// of `stream`, which is synchronised again here.
    pub(super) fn release(&mut self, stream: &CudaStream) {
        for b in [
            &mut self.moves,
            &mut self.tiles,
            &mut self.flags,
            &mut self.side,
        ] {
            b.release_on(stream);
        }
        let _ = stream.synchronize();
        self.ctl.release();
        self.table.release();
        for t in &mut self.retired_tables {
            t.release();
        }
        for mut b in self.table_staging.drain() {
            b.buf.release();
        }
        for mut b in self.staging.drain() {
            b.buf.release();
        }
        self.status.release();
        self.host_tier.release();
    }
}
