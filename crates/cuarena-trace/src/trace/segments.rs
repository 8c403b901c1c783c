//! What a snapshot's `segments` say: the caching allocator's segments and
//! blocks at the dump, the bytes they held, and with the segment events,
//! what it had reserved from the driver from the start of the recording.

use super::{Action, TraceEvent};

/// A block of a segment, as at the dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Device address (PyTorch 2.0 wrote none: the segment's address plus
    /// the sizes of the blocks before it, as PyTorch's viewer computes it).
    pub address: u64,
    /// Bytes the caching allocator gave the block (rounded up from the
    /// request, and sometimes more: a remainder too small to split).
    pub size: u64,
    /// Bytes the tensor asked for (`size` when the snapshot omits it).
    pub requested_size: u64,
    /// Whether a tensor held it.
    pub state: BlockState,
}

/// A block's `state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// `active_allocated`: a tensor holds it.
    ActiveAllocated,
    /// `active_pending_free`: freed by its tensor, still in use by a stream.
    ActivePendingFree,
    /// `inactive`: free, cached by the allocator.
    Inactive,
    /// Any other string.
    Unknown,
}

impl BlockState {
    /// Parses PyTorch's state string.
    pub fn parse(s: &str) -> BlockState {
        match s {
            "active_allocated" => BlockState::ActiveAllocated,
            "active_pending_free" => BlockState::ActivePendingFree,
            "inactive" => BlockState::Inactive,
            _ => BlockState::Unknown,
        }
    }

    /// Whether the block's memory was in use at the dump.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            BlockState::ActiveAllocated | BlockState::ActivePendingFree
        )
    }
}

/// A segment (one `cudaMalloc`, or an expandable segment's mapped range).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Device ordinal (0 when the snapshot omits it).
    pub device: u32,
    /// Device address of its start.
    pub address: u64,
    /// Bytes reserved from the driver.
    pub total_size: u64,
    /// Stream it serves.
    pub stream: i64,
    /// An expandable segment (`expandable_segments:True`).
    pub expandable: bool,
    /// In the small pool (`segment_type` `small`: blocks of at most 1 MiB)
    /// or the large one; `None` when the snapshot does not say.
    pub is_small: Option<bool>,
    /// Its blocks in address order.
    pub blocks: Vec<Block>,
}

/// Bytes the blocks of one device held at the dump.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActiveBytes {
    /// Sum of `size` over `active_allocated` blocks (what PyTorch's
    /// `memory_allocated()` counts).
    pub allocated: u64,
    /// Sum of `size` over `active_pending_free` blocks.
    pub pending_free: u64,
    /// Sum of `requested_size` over `active_allocated` blocks.
    pub requested: u64,
    /// Number of `active_allocated` blocks.
    pub allocated_blocks: u64,
    /// Sum of `total_size` over the device's segments.
    pub reserved: u64,
}

pub(super) fn active_bytes(segments: &[Segment], device: u32) -> ActiveBytes {
    let mut a = ActiveBytes::default();
    for s in segments.iter().filter(|s| s.device == device) {
        a.reserved = a.reserved.saturating_add(s.total_size);
        for b in &s.blocks {
            match b.state {
                BlockState::ActiveAllocated => {
                    a.allocated = a.allocated.saturating_add(b.size);
                    a.requested = a.requested.saturating_add(b.requested_size);
                    a.allocated_blocks += 1;
                }
                BlockState::ActivePendingFree => {
                    a.pending_free = a.pending_free.saturating_add(b.size)
                }
                _ => {}
            }
        }
    }
    a
}

/// What the caching allocator reserved from the driver on one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reserved {
    /// Bytes reserved when recording began: those of `segments` at the
    /// dump less what the segment events added since. `None` without
    /// `segments` (the series then starts at zero, a lower bound).
    pub initial: Option<u64>,
    /// Bytes reserved at the dump (`None` without `segments`).
    pub at_dump: Option<u64>,
    /// The most reserved at any point of the recording.
    pub peak: u64,
    /// Index in [`super::Trace::events`] where `peak` was first reached
    /// (`None`: at the start).
    pub peak_event: Option<u64>,
    /// `(event index, reserved bytes)`: the start (with `segments`), then
    /// every change.
    pub series: Vec<(u64, u64)>,
}

impl Reserved {
    /// Bytes reserved just after event `event`.
    pub fn at(&self, event: u64) -> u64 {
        let i = self.series.partition_point(|&(e, _)| e <= event);
        match i {
            0 => self.initial.unwrap_or(0),
            i => self.series[i - 1].1,
        }
    }
}

pub(super) fn reserved(
    events: &[TraceEvent],
    segments: Option<&[Segment]>,
    device: u32,
) -> Reserved {
    let delta = |e: &TraceEvent| -> Option<i128> {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => Some(i128::from(e.size)),
            Action::SegmentFree | Action::SegmentUnmap => Some(-i128::from(e.size)),
            _ => None,
        }
    };
    let on_device = || {
        events
            .iter()
            .enumerate()
            .filter(|(_, e)| e.device == device)
    };
    let net: i128 = on_device().filter_map(|(_, e)| delta(e)).sum();
    let at_dump = segments.map(|s| active_bytes(s, device).reserved);
    let initial = at_dump.map(|d| clamp(i128::from(d) - net));
    let mut out = Reserved {
        initial,
        at_dump,
        ..Reserved::default()
    };
    let mut now = i128::from(initial.unwrap_or(0));
    out.peak = clamp(now);
    if let Some(start) = initial {
        let first = on_device().next().map_or(0, |(i, _)| i as u64);
        out.series.push((first, start));
    }
    for (i, e) in on_device() {
        let Some(d) = delta(e) else { continue };
        now += d;
        let r = clamp(now);
        out.series.push((i as u64, r));
        if r > out.peak {
            out.peak = r;
            out.peak_event = Some(i as u64);
        }
    }
    out
}

fn clamp(v: i128) -> u64 {
    u64::try_from(v.max(0)).unwrap_or(u64::MAX)
}
