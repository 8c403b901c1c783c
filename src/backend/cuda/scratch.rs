//! The buffers and events the backend owns besides the region: plan
//! execution's scratch, the handle table's device copy, the host tier.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use super::buffers::{DeviceBuf, PinnedBuf};
use super::driver_err;
use crate::error::Result;

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
    /// Page-locked sources of table uploads, double-buffered like `staging`
    /// so that they never block the host.
    pub(super) table_staging: [PinnedBuf; 2],
    /// Recorded after the upload from `table_staging[i]`.
    pub(super) table_upload_done: [CudaEvent; 2],
    /// Which table staging buffer the next sync uses.
    pub(super) table_parity: usize,
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
    /// Host side of the per-move upload, double-buffered: a plan fills one
    /// while the uploads of the previous plan (queued behind whatever the
    /// stream holds) still read the other, so the host never waits for them.
    pub(super) staging: [PinnedBuf; 2],
    /// Host copy of the error word.
    pub(super) status: PinnedBuf,
    /// Recorded after the uploads from `staging[i]`.
    pub(super) upload_done: [CudaEvent; 2],
    /// Per-move uploads run here, so that a chunk's upload overlaps the
    /// kernels of the chunk before it (on the arena stream they would
    /// queue behind them: 0.13 ms more device time for 100,000 moves on
    /// an H100).
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
    /// Which staging buffer the next plan uses.
    pub(super) parity: usize,
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

impl Scratch {
    /// Empty buffers (they grow on first use) and the events and upload
    /// stream, on `ctx`.
    pub(super) fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        Ok(Scratch {
            host_tier: PinnedBuf::EMPTY,
            host_tier_bytes: 0,
            table: DeviceBuf::EMPTY,
            retired_tables: Vec::new(),
            table_staging: [PinnedBuf::EMPTY, PinnedBuf::EMPTY],
            table_upload_done: [
                ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
                ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
            ],
            table_parity: 0,
            moves: DeviceBuf::EMPTY,
            tiles: DeviceBuf::EMPTY,
            flags: DeviceBuf::EMPTY,
            ctl: DeviceBuf::EMPTY,
            side: DeviceBuf::EMPTY,
            staging: [PinnedBuf::EMPTY, PinnedBuf::EMPTY],
            status: PinnedBuf::EMPTY,
            upload_done: [
                ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
                ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
            ],
            parity: 0,
            upload_stream: ctx.new_stream().map_err(driver_err("cuStreamCreate"))?,
            plan_start: ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
            chunk_uploaded: ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
            chunk_done: [
                ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
                ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
            ],
            chunk_parity: 0,
            status_ready: ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
            status_pending: std::sync::atomic::AtomicBool::new(false),
            epoch: 0,
        })
    }

    /// Frees every buffer. The caller has synchronised every stream that
    /// could still use them.
    pub(super) fn release(&mut self) {
        self.moves.release();
        self.tiles.release();
        self.flags.release();
        self.ctl.release();
        self.side.release();
        self.table.release();
        for t in &mut self.retired_tables {
            t.release();
        }
        for b in &mut self.table_staging {
            b.release();
        }
        for b in &mut self.staging {
            b.release();
        }
        self.status.release();
        self.host_tier.release();
    }
}
