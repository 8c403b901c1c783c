//! Allocation traces: PyTorch's memory-history recordings, read, turned into
//! alloc/free programs, and replayed against an arena.
//!
//! Two file formats are read, both optionally gzipped (detected by the magic
//! bytes `1f 8b`, not by the file name):
//!
//! - the snapshot pickle that `torch.cuda.memory._dump_snapshot` writes (first
//!   byte `0x80`), in the layouts of the PyTorch 2.x releases: a dict whose
//!   `device_traces` holds one list of event dicts per device and whose
//!   `segments` lists the caching allocator's segments and their blocks at
//!   the dump ([`Segment`]). Every other key, and every extra key of an event
//!   (`frames`, `compile_context`, ...), is ignored whatever its Python type.
//! - a CSV with the header `action,addr,size,stream,time_us` (an optional
//!   `device` column, and any further columns, are accepted; empty `addr`,
//!   `stream` and `time_us` fields read as 0).
//!
//! Reading is pure: [`Trace`] holds the events, [`Trace::ops`] pairs allocs
//! with frees into an [`Ops`] program (with the blocks that were live when
//! recording began, see [`ops`](Trace::ops)), and [`replay()`] runs a
//! program against a metadata-only arena. Malformed input of any kind is a
//! [`crate::ToolError::Trace`] naming the file and the 1-based line
//! (CSV) or event (pickle); nothing here panics on bad input.
//!
//! # Events kept
//!
//! Only what a replay uses is kept: `alloc`, `free_requested`,
//! `free_completed`, the four segment actions and `oom`. `snapshot` events
//! and actions this reader does not know are counted in
//! [`Trace::counts`] and dropped as they are read.
//!
//! # Bounded input
//!
//! The readers never recurse on the input, take time linear in its
//! decompressed size `D` whatever the pickle shares through its memo (each
//! distinct event dict is decoded once), and never use more memory than the
//! bounds below. Each limit is a constant in [`limits`]; going past one is a
//! [`ToolError::Limit`] that names it. A failed allocation of the reader's
//! large buffers (the decompressed bytes, the events) is a
//! [`ToolError::OutOfMemory`], never an abort.
//!
//! - gzip is inflated in a streaming way and stopped at
//!   [`limits::MAX_DECOMPRESSED_BYTES`] (4 GiB; a larger plain file is
//!   refused before it is read), or as soon as the output passes
//!   [`limits::MAX_GZIP_RATIO`] (256) × the compressed bytes consumed plus
//!   [`limits::GZIP_RATIO_SLACK_BYTES`] (64 MiB), so a gzip bomb stops early;
//! - a CSV is read line by line as it is inflated, never held whole; a line
//!   is at most [`limits::MAX_CSV_LINE_BYTES`] (64 KiB);
//! - a pickle nests containers at most [`limits::MAX_NESTING`] (1,000) deep,
//!   has at most [`limits::MAX_MARKS`] (1,000) MARKs open, at most
//!   [`limits::MAX_MEMO_ENTRIES`] (2^26) memo entries, integers of at most
//!   [`limits::MAX_INT_BYTES`] (64) bytes, and no string or bytes longer
//!   than what remains of the input; shared values (memo, DUP) are shared,
//!   never copied;
//! - everything the pickle reader builds (values, memo, stacks) is charged
//!   against [`limits::MEMORY_PER_INPUT_BYTE`] (16) × `D` +
//!   [`limits::MEMORY_BASE_BYTES`] (64 MiB);
//! - an event is [`EVENT_BYTES`] (40) bytes, and the events vector grows by
//!   an eighth at a time; a dict keeps each key a trace reads once (a key
//!   set again replaces its value), so a lookup scans at most 38 keys;
//! - an event list, a segment or a block that is the same object as an
//!   earlier one is an error (PyTorch writes each once).
//!
//! The resulting bound, for `E` events kept: a CSV takes at most about
//! **1.125 × 40 × E + 128 KiB** (no more than one line is held besides the
//! events); a pickle at most **D + 2 × (16 × D + 64 MiB) + 45 × E** (the
//! decompressed bytes, the charged values with vectors' spare capacity,
//! the events) + **48 × B** for the `B` blocks of `segments` (each block
//! must be a dict of its own, so `B` is at most `D / 3`). `E` is at most
//! `D / 8` for a CSV (the shortest line that is kept is 8 bytes).
//!
//! # Bounded stages after reading
//!
//! A few bytes of input can stand for many events (a pickle's memo shares
//! one event dict among millions), so what is built from the events is
//! bounded too: the alloc/free program ([`Trace::ops`]), the model of
//! PyTorch's allocator ([`crate::pytorch`]) and the best-fit replay
//! ([`crate::bestfit`]) each charge what they build against
//! [`Trace::memory_budget`], the reader's own budget (16 × `D` + 64 MiB),
//! and grow their vectors with fallible reservations. Going past it is a
//! [`ToolError::Limit`] named `MEMORY_PER_INPUT_BYTE × input bytes +
//! MEMORY_BASE_BYTES`; a failed allocation is a [`ToolError::OutOfMemory`].
//! A program is refused before any work when its allocs alone (40 bytes
//! each, at least) would pass the budget.

mod budget;
mod counts;
mod csv;
pub mod elastic;
mod input;
pub mod limits;
pub(crate) mod ops;
pub(crate) mod pairing;
mod pickle;
pub mod replay;
mod segments;
#[cfg(test)]
mod tests;

use std::io::Read;
use std::path::Path;

use crate::pytorch::AllocatorSettings;
use crate::{Result, ToolError};

pub use budget::MemoryBudget;
pub use counts::ActionCounts;
#[cfg(feature = "cuda")]
pub(crate) use ops::round_up;
pub use ops::{FreePoint, Op, Ops};
pub use replay::{
    find_min_capacity, find_min_capacity_observed, find_min_capacity_with, replay, replay_prefix,
    replay_with, Allocator, CompactionStats, MinCapacity, Outcome, ReplayOptions, ReplayReport,
};
pub use segments::{ActiveBytes, Block, BlockState, Reserved, Segment};

/// [`TraceEvent::addr`] of an `oom` event that does not say how many bytes
/// the device had free.
pub const DEVICE_FREE_UNKNOWN: u64 = u64::MAX;

/// Bytes one kept event takes in memory.
pub const EVENT_BYTES: u64 = std::mem::size_of::<TraceEvent>() as u64;

/// What a trace event records (PyTorch's `action` strings). Only the
/// actions a replay uses; the others are counted in [`ActionCounts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `alloc`: a block was handed to a tensor.
    Alloc,
    /// `free_requested`: the tensor released the block; PyTorch's
    /// `allocated_bytes` drops here.
    FreeRequested,
    /// `free_completed`: the block is reusable (other streams done with it).
    /// PyTorch releases before 2.1 wrote `free` for it; it reads as this.
    FreeCompleted,
    /// `segment_alloc`: the caching allocator called `cudaMalloc`.
    SegmentAlloc,
    /// `segment_free`: the caching allocator called `cudaFree`.
    SegmentFree,
    /// `segment_map`: an expandable segment grew.
    SegmentMap,
    /// `segment_unmap`: an expandable segment shrank.
    SegmentUnmap,
    /// `oom`: an allocation failed. Its [`TraceEvent::addr`] holds the bytes
    /// the device had free (PyTorch's `device_free`), its `size` the request.
    Oom,
}

impl Action {
    /// Every action, in [`ActionCounts`] order.
    pub const ALL: [Action; 8] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Oom,
    ];

    /// Parses PyTorch's action string; `None` for one a replay does not
    /// use (`snapshot`, or an unknown string).
    pub fn parse(s: &str) -> Option<Action> {
        Some(match s {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" | "free" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "oom" => Action::Oom,
            _ => return None,
        })
    }

    /// PyTorch's string for the action.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
        }
    }

    /// Whether the event has an `addr` PyTorch always writes (all but `oom`).
    pub(crate) fn needs_addr(self) -> bool {
        self != Action::Oom
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One recorded allocator event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEvent {
    /// What happened.
    pub action: Action,
    /// Device ordinal (index of the `device_traces` list; 0 for a CSV
    /// without a `device` column).
    pub device: u32,
    /// Device address PyTorch handed out (reused after a free). For
    /// [`Action::Oom`]: the bytes the device had free (`device_free`), where
    /// PyTorch itself keeps it, or [`DEVICE_FREE_UNKNOWN`] when absent.
    pub addr: u64,
    /// Bytes, as recorded (for `oom`: the request).
    pub size: u64,
    /// CUDA stream (an opaque identifier; 0 when absent).
    pub stream: i64,
    /// Microsecond clock (0 when absent).
    pub time_us: i64,
}

/// Which format a trace was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// `action,addr,size,stream,time_us` lines.
    Csv,
    /// A `torch.cuda.memory._dump_snapshot` pickle.
    Pickle,
}

/// A recorded trace: every kept event of every device, in file order, and
/// the allocator's state at the dump when the file has it.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Where it was read from (used in error messages and reports).
    pub source: String,
    /// The format it was read from.
    pub format: TraceFormat,
    /// Events in recording order (per device; a pickle lists device 0's
    /// events first, then device 1's, ...).
    pub events: Vec<TraceEvent>,
    /// The snapshot's `segments` (every device's), as at the dump; `None`
    /// for a file without them (a CSV, or a pickle of `device_traces` alone).
    pub segments: Option<Vec<Segment>>,
    /// How many events of each action were read, and those skipped.
    pub counts: ActionCounts,
    /// Distinct event dicts a pickle's events were decoded from (the work
    /// done: a dict the file shares through its memo is decoded once); 0 for
    /// a CSV.
    pub decoded_event_dicts: u64,
    /// The allocator settings the snapshot recorded (`allocator_settings`,
    /// PyTorch 2.1 and later); `None` for a CSV or an older snapshot.
    pub allocator_settings: Option<AllocatorSettings>,
    /// Bytes of the trace once decompressed: the stages after reading (the
    /// program, the allocator models, the replays) are each bounded by
    /// [`limits::MEMORY_PER_INPUT_BYTE`] × these + [`limits::MEMORY_BASE_BYTES`].
    pub input_bytes: u64,
}

/// gzip's magic bytes.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// Pickle protocol 2+ streams start with the PROTO opcode.
const PICKLE_PROTO: u8 = 0x80;

impl Trace {
    /// Reads a trace file: gzip is detected by its magic bytes and
    /// inflated as it is read, then the content is a snapshot pickle (first
    /// byte `0x80`) or a CSV (header `action,addr,size,stream,time_us`).
    pub fn read(path: &Path) -> Result<Trace> {
        let source = path.display().to_string();
        let cannot = |e: std::io::Error| ToolError::Trace {
            path: source.clone(),
            record: 0,
            message: format!("cannot read file: {e}"),
        };
        let file = std::fs::File::open(path).map_err(cannot)?;
        if let Ok(meta) = file.metadata() {
            // Refused unread: even gzipped, such a file inflates past the limit.
            input::check_size(meta.len(), &source)?;
            if meta.is_dir() {
                return Err(ToolError::Trace {
                    path: source,
                    record: 0,
                    message: "is a directory, not a trace file".to_owned(),
                });
            }
        }
        input::read(file, &source)
    }

    /// Like [`Trace::read`], from bytes already in memory; `source` names
    /// them in errors.
    pub fn from_bytes(bytes: &[u8], source: &str) -> Result<Trace> {
        input::read(bytes, source)
    }

    /// Reads a CSV trace (not gzipped) from `reader`, line by line; `source`
    /// names it in errors, whose `record` is the 1-based line.
    pub fn from_csv_reader<R: Read>(reader: R, source: &str) -> Result<Trace> {
        let mut counts = ActionCounts::default();
        let mut counted = input::Counting {
            inner: reader,
            bytes: 0,
        };
        let events = csv::parse(std::io::BufReader::new(&mut counted), source, &mut counts)?;
        Ok(Trace {
            source: source.to_owned(),
            format: TraceFormat::Csv,
            events,
            segments: None,
            counts,
            decoded_event_dicts: 0,
            allocator_settings: None,
            input_bytes: counted.bytes,
        })
    }

    /// Reads a `torch.cuda.memory._dump_snapshot` pickle (not gzipped);
    /// `source` names it in errors, whose `record` is the 1-based event.
    pub fn from_pickle_bytes(bytes: &[u8], source: &str) -> Result<Trace> {
        input::check_size(bytes.len() as u64, source)?;
        let mut counts = ActionCounts::default();
        let p = pickle::parse(bytes, source, &mut counts)?;
        Ok(Trace {
            source: source.to_owned(),
            format: TraceFormat::Pickle,
            events: p.events,
            segments: p.segments,
            counts,
            decoded_event_dicts: p.decoded_event_dicts,
            allocator_settings: p.allocator_settings,
            input_bytes: bytes.len() as u64,
        })
    }

    /// Device ordinals that have at least one event or segment, ascending.
    pub fn devices(&self) -> Vec<u32> {
        let mut d = std::collections::BTreeSet::new();
        d.extend(self.events.iter().map(|e| e.device));
        if let Some(segs) = &self.segments {
            d.extend(segs.iter().map(|s| s.device));
        }
        d.into_iter().collect()
    }

    /// The alloc/free program of `device`, each alloc freed where its memory
    /// becomes reusable ([`FreePoint::Completed`]).
    ///
    /// The program starts with the blocks that were live when recording
    /// began, reconstructed as PyTorch's memory viewer does: the blocks
    /// active in `segments` at the dump that the trace did not allocate,
    /// plus those the trace frees without having allocated them (allocated
    /// before recording, or dropped from a ring buffer), at their sizes.
    /// Blocks live at the dump take the size `segments` gives them (the
    /// caching allocator's block, at least the size asked for), so the bytes
    /// live at the end of the program are the bytes active in `segments`.
    ///
    /// The program's memory is bounded by [`Trace::memory_budget`]: a trace
    /// whose program would need more is a [`ToolError::Limit`] that names
    /// the budget, and a failed allocation a [`ToolError::OutOfMemory`].
    pub fn ops(&self, device: u32) -> Result<Ops> {
        self.ops_with(device, FreePoint::Completed)
    }

    /// The alloc/free program of `device`, frees placed at `free_point`.
    pub fn ops_with(&self, device: u32, free_point: FreePoint) -> Result<Ops> {
        let mut budget = self.memory_budget();
        ops::build(
            &self.events,
            self.segments.as_deref(),
            device,
            free_point,
            &mut budget,
        )
    }

    /// The memory budget of each stage after reading on this trace:
    /// [`limits::MEMORY_PER_INPUT_BYTE`] × [`Trace::input_bytes`] +
    /// [`limits::MEMORY_BASE_BYTES`], the reader's own, nothing charged yet.
    pub fn memory_budget(&self) -> MemoryBudget {
        MemoryBudget::for_input(self.input_bytes, &self.source)
    }

    /// Bytes the blocks of `device` in `segments` held at the dump (`None`
    /// without `segments`).
    pub fn active_at_dump(&self, device: u32) -> Option<ActiveBytes> {
        self.segments
            .as_deref()
            .map(|s| segments::active_bytes(s, device))
    }

    /// What the caching allocator reserved from the driver on `device`:
    /// at the start of the recording (from `segments` and the segment
    /// events), its peak, and every change.
    pub fn reserved(&self, device: u32) -> Reserved {
        segments::reserved(&self.events, self.segments.as_deref(), device)
    }

    /// Bytes reserved from the driver, as `(event index, reserved bytes)`
    /// at the start and at every change on `device` (see
    /// [`Trace::reserved`]).
    pub fn reserved_series(&self, device: u32) -> Vec<(u64, u64)> {
        self.reserved(device).series
    }
}

/// Refuses a block size past [`limits::MAX_BLOCK_BYTES`] in the events a
/// program is built from.
pub(crate) fn check_event_size(e: &TraceEvent, source: &str, record: u64) -> Result<()> {
    let block = matches!(
        e.action,
        Action::Alloc | Action::FreeRequested | Action::FreeCompleted
    );
    if block && e.size > limits::MAX_BLOCK_BYTES {
        return Err(ToolError::Trace {
            path: source.to_owned(),
            record,
            message: format!(
                "`{}` of size {} B, past the largest block a trace may hold ({} B, \
                 limits::MAX_BLOCK_BYTES)",
                e.action,
                e.size,
                limits::MAX_BLOCK_BYTES
            ),
        });
    }
    Ok(())
}
