//! Allocation traces: PyTorch's memory-history recordings, read, turned into
//! alloc/free programs, and replayed against an arena.
//!
//! Two file formats are read, both optionally gzipped (detected by the magic
//! bytes `1f 8b`, not by the file name):
//!
//! - the snapshot pickle that `torch.cuda.memory._dump_snapshot` writes (first
//!   byte `0x80`): a dict whose `device_traces` holds one list of event dicts
//!   per device. Every other key, and every extra key of an event (`frames`,
//!   `compile_context`, ...), is ignored whatever its Python type.
//! - a CSV with the header `action,addr,size,stream,time_us` (an optional
//!   `device` column, and any further columns, are accepted).
//!
//! Reading is pure: [`Trace`] holds the events, [`Trace::ops`] pairs allocs
//! with frees into an [`Ops`] program, and [`replay()`] runs a program against a
//! metadata-only arena. Malformed input of any kind is an
//! [`crate::tools::ToolError::Trace`] naming the file and the 1-based line (CSV) or event
//! (pickle); nothing here panics on bad input.
//!
//! # Bounded input
//!
//! The readers never recurse on the input and never use more memory than a
//! bound proportional to the decompressed size `D` of the file. Each limit
//! below is a constant in [`limits`]; going past one is a
//! [`ToolError::Limit`] that names it.
//!
//! - gzip is inflated in a streaming way and stopped at
//!   [`limits::MAX_DECOMPRESSED_BYTES`] (4 GiB; a larger plain file is
//!   refused before it is read), or as soon as the output passes
//!   [`limits::MAX_GZIP_RATIO`] (256) × the compressed bytes consumed plus
//!   [`limits::GZIP_RATIO_SLACK_BYTES`] (64 MiB), so a gzip bomb stops early;
//! - a CSV line is at most [`limits::MAX_CSV_LINE_BYTES`] (64 KiB);
//! - a pickle nests containers at most [`limits::MAX_NESTING`] (1,000) deep,
//!   has at most [`limits::MAX_MARKS`] (1,000) MARKs open, at most
//!   [`limits::MAX_MEMO_ENTRIES`] (2^26) memo entries, integers of at most
//!   [`limits::MAX_INT_BYTES`] (64) bytes, and no string or bytes longer
//!   than what remains of the input; shared values (memo, DUP) are shared,
//!   never copied;
//! - everything the pickle reader builds (values, memo, stacks, the events
//!   it returns) is charged against [`limits::MEMORY_PER_INPUT_BYTE`] (16)
//!   × `D` + [`limits::MEMORY_BASE_BYTES`] (64 MiB).
//!
//! The resulting bound: reading a trace takes at most about
//! **2 × D (the decompressed bytes, as the buffer grows) + 2 × (16 × D +
//! 64 MiB)** of memory (the factor 2 on the charges covers vectors' spare
//! capacity), and time linear in `D`. The CSV reader keeps one event
//! (~48 bytes) per line of at least 10 bytes, within the same bound.

mod csv;
pub mod limits;
mod ops;
mod pickle;
pub mod replay;

use std::cell::Cell;
use std::io::Read;
use std::path::Path;

use crate::tools::{Result, ToolError};

#[cfg(feature = "cuda")]
pub(crate) use ops::round_up;
pub use ops::{FreePoint, Op, Ops};
pub use replay::{
    find_min_capacity, find_min_capacity_observed, find_min_capacity_with, replay, replay_prefix,
    replay_with, Allocator, MinCapacity, Outcome, ReplayOptions, ReplayReport,
};

/// What a trace event records (PyTorch's `action` strings).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// `alloc`: a block was handed to a tensor.
    Alloc,
    /// `free_requested`: the tensor released the block; PyTorch's
    /// `allocated_bytes` drops here.
    FreeRequested,
    /// `free_completed`: the block is reusable (other streams done with it).
    FreeCompleted,
    /// `segment_alloc`: the caching allocator called `cudaMalloc`.
    SegmentAlloc,
    /// `segment_free`: the caching allocator called `cudaFree`.
    SegmentFree,
    /// `segment_map`: an expandable segment grew.
    SegmentMap,
    /// `segment_unmap`: an expandable segment shrank.
    SegmentUnmap,
    /// `oom`: an allocation failed.
    Oom,
    /// `snapshot`: a snapshot was taken.
    Snapshot,
    /// Any other action string, kept verbatim.
    Other(String),
}

impl Action {
    /// Parses PyTorch's action string; unknown strings become [`Action::Other`].
    pub fn parse(s: &str) -> Action {
        match s {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "oom" => Action::Oom,
            "snapshot" => Action::Snapshot,
            other => Action::Other(other.to_owned()),
        }
    }

    /// PyTorch's string for the action.
    pub fn as_str(&self) -> &str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::Snapshot => "snapshot",
            Action::Other(s) => s,
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One recorded allocator event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    /// What happened.
    pub action: Action,
    /// Device address PyTorch handed out (reused after a free).
    pub addr: u64,
    /// Bytes, as recorded.
    pub size: u64,
    /// CUDA stream (an opaque identifier).
    pub stream: i64,
    /// Microsecond clock.
    pub time_us: i64,
    /// Device ordinal (index of the `device_traces` list; 0 for a CSV
    /// without a `device` column).
    pub device: u32,
}

/// Which format a trace was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// `action,addr,size,stream,time_us` lines.
    Csv,
    /// A `torch.cuda.memory._dump_snapshot` pickle.
    Pickle,
}

/// A recorded trace: every event of every device, in file order.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Where it was read from (used in error messages and reports).
    pub source: String,
    /// The format it was read from.
    pub format: TraceFormat,
    /// Events in recording order (per device; a pickle lists device 0's
    /// events first, then device 1's, ...).
    pub events: Vec<TraceEvent>,
}

/// gzip's magic bytes.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// Pickle protocol 2+ streams start with the PROTO opcode.
const PICKLE_PROTO: u8 = 0x80;

impl Trace {
    /// Reads a trace file: gzip is detected by its magic bytes and
    /// decompressed, then the content is a snapshot pickle (first byte
    /// `0x80`) or a CSV (header `action,addr,size,stream,time_us`).
    pub fn read(path: &Path) -> Result<Trace> {
        let source = path.display().to_string();
        if let Ok(meta) = std::fs::metadata(path) {
            check_size(meta.len(), &source)?;
        }
        let bytes = std::fs::read(path).map_err(|e| ToolError::Trace {
            path: source.clone(),
            record: 0,
            message: format!("cannot read file: {e}"),
        })?;
        Trace::from_bytes(&bytes, &source)
    }

    /// Like [`Trace::read`], from bytes already in memory; `source` names
    /// them in errors.
    pub fn from_bytes(bytes: &[u8], source: &str) -> Result<Trace> {
        if bytes.starts_with(&GZIP_MAGIC) {
            let raw = gunzip(bytes, source)?;
            // A gzip inside a gzip is not a trace; don't recurse on it.
            return Trace::from_plain_bytes(&raw, source);
        }
        Trace::from_plain_bytes(bytes, source)
    }

    fn from_plain_bytes(bytes: &[u8], source: &str) -> Result<Trace> {
        check_size(bytes.len() as u64, source)?;
        match bytes.first() {
            Some(&PICKLE_PROTO) => Trace::from_pickle_bytes(bytes, source),
            Some(_) if csv::looks_like_csv(bytes) => Trace::from_csv_reader(bytes, source),
            Some(_) => Err(ToolError::Trace {
                path: source.to_owned(),
                record: 0,
                message: "unrecognized format: neither a pickle (first byte 0x80) nor a CSV \
                          starting with `action,addr,size,stream,time_us`"
                    .to_owned(),
            }),
            None => Err(ToolError::Trace {
                path: source.to_owned(),
                record: 0,
                message: "empty file".to_owned(),
            }),
        }
    }

    /// Reads a CSV trace (not gzipped) from `reader`; `source` names it in
    /// errors, whose `record` is the 1-based line.
    pub fn from_csv_reader<R: Read>(reader: R, source: &str) -> Result<Trace> {
        let mut bytes = Vec::new();
        reader
            .take(limits::MAX_DECOMPRESSED_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| ToolError::Trace {
                path: source.to_owned(),
                record: 0,
                message: format!("read error: {e}"),
            })?;
        check_size(bytes.len() as u64, source)?;
        let events = csv::parse(&bytes, source)?;
        Ok(Trace {
            source: source.to_owned(),
            format: TraceFormat::Csv,
            events,
        })
    }

    /// Reads a `torch.cuda.memory._dump_snapshot` pickle (not gzipped);
    /// `source` names it in errors, whose `record` is the 1-based event.
    pub fn from_pickle_bytes(bytes: &[u8], source: &str) -> Result<Trace> {
        check_size(bytes.len() as u64, source)?;
        let events = pickle::parse(bytes, source)?;
        Ok(Trace {
            source: source.to_owned(),
            format: TraceFormat::Pickle,
            events,
        })
    }

    /// Device ordinals that have at least one event, ascending.
    pub fn devices(&self) -> Vec<u32> {
        let mut d: Vec<u32> = self.events.iter().map(|e| e.device).collect();
        d.sort_unstable();
        d.dedup();
        d
    }

    /// The alloc/free program of `device`, each alloc freed where its memory
    /// becomes reusable ([`FreePoint::Completed`]).
    pub fn ops(&self, device: u32) -> Ops {
        self.ops_with(device, FreePoint::Completed)
    }

    /// The alloc/free program of `device`, frees placed at `free_point`.
    pub fn ops_with(&self, device: u32, free_point: FreePoint) -> Ops {
        ops::build(&self.events, device, free_point)
    }

    /// Bytes the caching allocator held from the driver (`segment_alloc`
    /// and `segment_map` add, `segment_free` and `segment_unmap` subtract),
    /// as `(event index, reserved bytes)` at every change on `device`.
    /// Segments reserved before recording began are unknown; the series
    /// starts at zero.
    pub fn reserved_series(&self, device: u32) -> Vec<(u64, u64)> {
        let mut reserved: u64 = 0;
        let mut out = Vec::new();
        for (i, e) in self.events.iter().enumerate() {
            if e.device != device {
                continue;
            }
            let next = match e.action {
                Action::SegmentAlloc | Action::SegmentMap => reserved.saturating_add(e.size),
                Action::SegmentFree | Action::SegmentUnmap => reserved.saturating_sub(e.size),
                _ => continue,
            };
            reserved = next;
            out.push((i as u64, reserved));
        }
        out
    }
}

/// Refuses input larger than [`limits::MAX_DECOMPRESSED_BYTES`].
fn check_size(len: u64, source: &str) -> Result<()> {
    if len > limits::MAX_DECOMPRESSED_BYTES {
        return Err(ToolError::Limit {
            path: source.to_owned(),
            what: "(decompressed) input size in bytes",
            name: "MAX_DECOMPRESSED_BYTES",
            asked: len,
            limit: limits::MAX_DECOMPRESSED_BYTES,
        });
    }
    Ok(())
}

/// Reads from a slice, counting the bytes handed out.
struct Counting<'a> {
    rest: &'a [u8],
    consumed: &'a Cell<u64>,
}

impl Read for Counting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.rest.read(buf)?;
        self.consumed.set(self.consumed.get() + n as u64);
        Ok(n)
    }
}

/// Inflates gzip (several members too: `cat a.gz b.gz` is valid gzip),
/// stopping at [`limits::MAX_DECOMPRESSED_BYTES`] or when the output
/// outgrows [`limits::MAX_GZIP_RATIO`] × the input consumed so far plus
/// [`limits::GZIP_RATIO_SLACK_BYTES`].
fn gunzip(bytes: &[u8], source: &str) -> Result<Vec<u8>> {
    let consumed = Cell::new(0u64);
    let mut dec = flate2::read::MultiGzDecoder::new(Counting {
        rest: bytes,
        consumed: &consumed,
    });
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match dec.read(&mut buf) {
            Ok(0) => return Ok(raw),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(ToolError::Trace {
                    path: source.to_owned(),
                    record: 0,
                    message: format!("gzip: {e}"),
                })
            }
        };
        raw.extend_from_slice(&buf[..n]);
        let out = raw.len() as u64;
        check_size(out, source)?;
        let allowed = consumed
            .get()
            .saturating_mul(limits::MAX_GZIP_RATIO)
            .saturating_add(limits::GZIP_RATIO_SLACK_BYTES);
        if out > allowed {
            return Err(ToolError::Limit {
                path: source.to_owned(),
                what: "gzip output in bytes (a gzip bomb?)",
                name: "MAX_GZIP_RATIO × compressed bytes + GZIP_RATIO_SLACK_BYTES",
                asked: out,
                limit: allowed,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_round_trips() {
        for s in [
            "alloc",
            "free_requested",
            "free_completed",
            "segment_alloc",
            "segment_free",
            "segment_map",
            "segment_unmap",
            "oom",
            "snapshot",
            "user_defined",
        ] {
            assert_eq!(Action::parse(s).as_str(), s);
        }
        assert_eq!(Action::parse("weird"), Action::Other("weird".into()));
    }

    #[test]
    fn detects_formats_and_rejects_garbage() {
        let csv = b"action,addr,size,stream,time_us\nalloc,1,2,0,3\n";
        let t = Trace::from_bytes(csv, "x").unwrap();
        assert_eq!(t.format, TraceFormat::Csv);
        assert_eq!(t.events.len(), 1);
        assert!(matches!(
            Trace::from_bytes(b"hello", "x"),
            Err(ToolError::Trace { record: 0, .. })
        ));
        assert!(matches!(
            Trace::from_bytes(b"", "x"),
            Err(ToolError::Trace { record: 0, .. })
        ));
        // Truncated gzip.
        assert!(matches!(
            Trace::from_bytes(&[0x1f, 0x8b, 8, 0], "x"),
            Err(ToolError::Trace { record: 0, .. })
        ));
    }

    #[test]
    fn reserved_series_follows_segments() {
        let csv = b"action,addr,size,stream,time_us\n\
                    segment_alloc,0,100,0,0\nalloc,0,10,0,1\nsegment_map,100,50,0,2\n\
                    segment_free,0,100,0,3\n";
        let t = Trace::from_bytes(csv, "x").unwrap();
        assert_eq!(t.reserved_series(0), vec![(0, 100), (2, 150), (3, 50)]);
        assert!(t.reserved_series(1).is_empty());
    }
}
