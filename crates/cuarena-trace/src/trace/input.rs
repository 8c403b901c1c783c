//! From bytes (a file, or memory) to a [`Trace`]: gzip inflated as it is
//! read with its bounds, the format told from the first bytes, a CSV parsed
//! line by line as it arrives, a pickle gathered (with fallible growth) and
//! parsed whole.

use std::cell::Cell;
use std::io::Read;
use std::rc::Rc;

use super::{csv, limits, Trace, GZIP_MAGIC, PICKLE_PROTO};
use crate::{Result, ToolError};

/// Refuses input larger than [`limits::MAX_DECOMPRESSED_BYTES`].
pub(super) fn check_size(len: u64, source: &str) -> Result<()> {
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

/// A memory failure while reading, as the limit it ran into.
pub(super) fn out_of_memory(source: &str, what: &'static str, asked: u64) -> ToolError {
    ToolError::OutOfMemory {
        path: source.to_owned(),
        what,
        asked,
    }
}

/// Counts the bytes read through it (a CSV's decompressed size).
pub(super) struct Counting<R> {
    pub(super) inner: R,
    pub(super) bytes: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

/// Counts the bytes read through it (the compressed side of gzip).
struct Counted<R> {
    inner: R,
    count: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

/// Stops the bytes coming through it at the limits: the decompressed size,
/// and for gzip the ratio to the compressed bytes consumed so far.
struct Bounded<R> {
    inner: R,
    out: u64,
    compressed: Option<Rc<Cell<u64>>>,
    source: String,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.out += n as u64;
        if let Err(e) = check_size(self.out, &self.source) {
            return Err(std::io::Error::other(e));
        }
        if let Some(c) = &self.compressed {
            let allowed = c
                .get()
                .saturating_mul(limits::MAX_GZIP_RATIO)
                .saturating_add(limits::GZIP_RATIO_SLACK_BYTES);
            if self.out > allowed {
                return Err(std::io::Error::other(ToolError::Limit {
                    path: self.source.clone(),
                    what: "gzip output in bytes (a gzip bomb?)",
                    name: "MAX_GZIP_RATIO × compressed bytes + GZIP_RATIO_SLACK_BYTES",
                    asked: self.out,
                    limit: allowed,
                }));
            }
        }
        Ok(n)
    }
}

/// An I/O error as a tool error: a limit passes through, anything else is
/// the file's fault (`what` says which layer).
pub(super) fn io_error(e: std::io::Error, source: &str, what: &str) -> ToolError {
    if let Some(t) = e.get_ref().and_then(|i| i.downcast_ref::<ToolError>()) {
        return t.clone();
    }
    ToolError::Trace {
        path: source.to_owned(),
        record: 0,
        message: format!("{what}: {e}"),
    }
}

/// Reads up to `n` bytes from the front of `r`.
fn head<R: Read>(r: &mut R, n: u64, source: &str, what: &str) -> Result<Vec<u8>> {
    let mut h = Vec::new();
    r.by_ref()
        .take(n)
        .read_to_end(&mut h)
        .map_err(|e| io_error(e, source, what))?;
    Ok(h)
}

/// Reads a trace from `r`, gzipped or not.
pub(super) fn read<R: Read>(mut r: R, source: &str) -> Result<Trace> {
    let magic = head(&mut r, 2, source, "read error")?;
    let rest = std::io::Cursor::new(magic.clone()).chain(r);
    if magic == GZIP_MAGIC {
        let count = Rc::new(Cell::new(0));
        let dec = flate2::read::MultiGzDecoder::new(Counted {
            inner: rest,
            count: count.clone(),
        });
        let bounded = Bounded {
            inner: dec,
            out: 0,
            compressed: Some(count),
            source: source.to_owned(),
        };
        // A gzip inside a gzip is not a trace: the content is read as plain.
        read_plain(bounded, source, "gzip")
    } else {
        let bounded = Bounded {
            inner: rest,
            out: 0,
            compressed: None,
            source: source.to_owned(),
        };
        read_plain(bounded, source, "read error")
    }
}

fn read_plain<R: Read>(mut r: R, source: &str, layer: &str) -> Result<Trace> {
    let first = head(&mut r, 16, source, layer)?;
    let rest = std::io::Cursor::new(first.clone()).chain(r);
    match first.first() {
        Some(&PICKLE_PROTO) => {
            let bytes = gather(rest, source, layer)?;
            Trace::from_pickle_bytes(&bytes, source)
        }
        Some(_) if csv::looks_like_csv(&first) => {
            Trace::from_csv_reader(rest, source).map_err(|e| relabel(e, layer))
        }
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

/// The CSV reader reports its own read errors as "read error"; under gzip
/// they are gzip's.
fn relabel(e: ToolError, layer: &str) -> ToolError {
    match e {
        ToolError::Trace {
            path,
            record,
            message,
        } if layer != "read error" && message.starts_with("read error: ") => ToolError::Trace {
            path,
            record,
            message: format!("{layer}: {}", &message["read error: ".len()..]),
        },
        other => other,
    }
}

/// All of `r`, grown by half at a time with fallible reservations.
fn gather<R: Read>(mut r: R, source: &str, layer: &str) -> Result<Vec<u8>> {
    let mut out: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_error(e, source, layer)),
        };
        if out.capacity() - out.len() < n {
            let grow = (out.len() / 2).max(n).max(1 << 20);
            out.try_reserve_exact(grow).map_err(|_| {
                out_of_memory(source, "the decompressed trace", (out.len() + grow) as u64)
            })?;
        }
        out.extend_from_slice(&buf[..n]);
    }
}
