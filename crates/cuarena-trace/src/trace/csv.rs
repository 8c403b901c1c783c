//! The CSV form: a header naming the columns, then one event per line, read
//! line by line (the file is never held whole).
//!
//! Columns are found by name, so their order may vary and extra columns are
//! ignored; `action`, `addr`, `size`, `stream` and `time_us` are required in
//! the header, `device` is optional (0 when absent). Empty `addr` (an
//! `oom`'s), `stream` and `time_us` fields read as 0. Blank lines are
//! skipped; `\r\n` line ends are accepted. A line longer than
//! [`MAX_CSV_LINE_BYTES`] is a [`ToolError::Limit`].

use std::io::{BufRead, Read};

use super::input::{io_error, out_of_memory};
use super::limits::MAX_CSV_LINE_BYTES;
use super::{Action, ActionCounts, TraceEvent};
use crate::{Result, ToolError};

const REQUIRED: [&str; 5] = ["action", "addr", "size", "stream", "time_us"];

/// True when the bytes start with a header line that begins with `action,`.
pub(super) fn looks_like_csv(bytes: &[u8]) -> bool {
    // A UTF-8 byte-order mark is tolerated: spreadsheet exports write one.
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    bytes.starts_with(b"action,")
}

/// Column positions of one header.
struct Columns {
    action: usize,
    addr: usize,
    size: usize,
    stream: usize,
    time_us: usize,
    device: Option<usize>,
    count: usize,
}

fn err(source: &str, line: u64, message: String) -> ToolError {
    ToolError::Trace {
        path: source.to_owned(),
        record: line,
        message,
    }
}

fn parse_header(line: &str, source: &str) -> Result<Columns> {
    let names: Vec<&str> = line.split(',').map(str::trim).collect();
    let find = |name: &str| names.iter().position(|n| *n == name);
    let mut pos = [0usize; 5];
    for (slot, name) in pos.iter_mut().zip(REQUIRED) {
        *slot = find(name).ok_or_else(|| {
            err(
                source,
                1,
                format!(
                    "header `{line}` lacks column `{name}` (expected {})",
                    REQUIRED.join(",")
                ),
            )
        })?;
    }
    Ok(Columns {
        action: pos[0],
        addr: pos[1],
        size: pos[2],
        stream: pos[3],
        time_us: pos[4],
        device: find("device"),
        count: names.len(),
    })
}

/// Reads the next line (without its `\n`) into `line`; false at the end.
fn next_line<R: BufRead>(r: &mut R, line: &mut Vec<u8>, source: &str) -> Result<bool> {
    line.clear();
    let n = r
        .by_ref()
        .take(MAX_CSV_LINE_BYTES + 2)
        .read_until(b'\n', line)
        .map_err(|e| io_error(e, source, "read error"))?;
    if line.last() == Some(&b'\n') {
        line.pop();
    }
    if line.len() as u64 > MAX_CSV_LINE_BYTES {
        return Err(ToolError::Limit {
            path: source.to_owned(),
            what: "CSV line length in bytes",
            name: "MAX_CSV_LINE_BYTES",
            asked: line.len() as u64,
            limit: MAX_CSV_LINE_BYTES,
        });
    }
    Ok(n > 0)
}

/// Parses a whole CSV trace, counting its actions into `counts`.
pub(super) fn parse<R: BufRead>(
    mut r: R,
    source: &str,
    counts: &mut ActionCounts,
) -> Result<Vec<TraceEvent>> {
    let mut raw = Vec::with_capacity(256);
    next_line(&mut r, &mut raw, source)?;
    let header = raw.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&raw);
    let header = std::str::from_utf8(header)
        .map_err(|_| err(source, 1, "header is not UTF-8".to_owned()))?
        .trim_end_matches('\r');
    let cols = parse_header(header, source)?;

    let mut events: Vec<TraceEvent> = Vec::new();
    // Field boundaries of the current line, reused from line to line.
    let mut spans: Vec<(usize, usize)> = Vec::with_capacity(cols.count);
    let mut line_no = 1u64;
    let mut raw_line = Vec::with_capacity(256);
    while next_line(&mut r, &mut raw_line, source)? {
        line_no += 1;
        let line = std::str::from_utf8(&raw_line)
            .map_err(|_| err(source, line_no, "line is not UTF-8".to_owned()))?
            .trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        spans.clear();
        let mut start = 0;
        for (i, b) in line.bytes().enumerate() {
            if b == b',' {
                spans.push((start, i));
                start = i + 1;
            }
        }
        spans.push((start, line.len()));
        let field = |c: usize| line[spans[c].0..spans[c].1].trim();
        if spans.len() != cols.count {
            return Err(err(
                source,
                line_no,
                format!(
                    "expected {} fields as in the header, found {}",
                    cols.count,
                    spans.len()
                ),
            ));
        }
        let name = field(cols.action);
        if name.is_empty() {
            return Err(err(source, line_no, "empty action".to_owned()));
        }
        let Some(action) = Action::parse(name) else {
            counts.skip(name);
            continue;
        };
        let num_u64 = |col: usize, what: &str, required: bool| -> Result<u64> {
            let f = field(col);
            if f.is_empty() && !required {
                return Ok(0);
            }
            f.parse::<u64>().map_err(|e| {
                err(
                    source,
                    line_no,
                    format!("column `{what}`: `{f}` is not a byte count ({e})"),
                )
            })
        };
        let num_i64 = |col: usize, what: &str| -> Result<i64> {
            let f = field(col);
            if f.is_empty() {
                return Ok(0);
            }
            // Streams are pointer-sized identifiers: accept the full u64
            // range and keep the bits.
            f.parse::<i64>()
                .or_else(|_| f.parse::<u64>().map(|u| u as i64))
                .map_err(|e| {
                    err(
                        source,
                        line_no,
                        format!("column `{what}`: `{f}` is not an integer ({e})"),
                    )
                })
        };
        let device = match cols.device {
            Some(c) => field(c).parse::<u32>().map_err(|e| {
                err(
                    source,
                    line_no,
                    format!(
                        "column `device`: `{}` is not a device ordinal ({e})",
                        field(c)
                    ),
                )
            })?,
            None => 0,
        };
        let event = TraceEvent {
            action,
            device,
            addr: match (action, field(cols.addr).is_empty()) {
                (Action::Oom, true) => super::DEVICE_FREE_UNKNOWN,
                _ => num_u64(cols.addr, "addr", action.needs_addr())?,
            },
            size: num_u64(cols.size, "size", true)?,
            stream: num_i64(cols.stream, "stream")?,
            time_us: num_i64(cols.time_us, "time_us")?,
        };
        super::check_event_size(&event, source, line_no)?;
        push_event(&mut events, event, source)?;
        counts.keep(action);
    }
    Ok(events)
}

/// Pushes onto the events vector, growing it by an eighth with a fallible
/// reservation.
pub(super) fn push_event(
    events: &mut Vec<TraceEvent>,
    event: TraceEvent,
    source: &str,
) -> Result<()> {
    if events.len() == events.capacity() {
        let grow = (events.len() / 8).max(1024);
        events.try_reserve_exact(grow).map_err(|_| {
            out_of_memory(
                source,
                "the trace's events",
                ((events.len() + grow) as u64).saturating_mul(super::EVENT_BYTES),
            )
        })?;
    }
    events.push(event);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &[u8], source: &str) -> Result<Vec<TraceEvent>> {
        parse(text, source, &mut ActionCounts::default())
    }

    #[test]
    fn parses_lines_and_columns_by_name() {
        let text = "time_us,action,size,addr,stream,device,extra\r\n\
                    5,alloc,512,4096,0,1,x\r\n\
                    \r\n\
                    6,free_completed,512,4096,18446744073709551615,1,y\r\n\
                    7,snapshot,0,0,0,1,z\r\n\
                    8,oom,4096,,,1,z\r\n";
        let mut counts = ActionCounts::default();
        let ev = parse(text.as_bytes(), "t", &mut counts).unwrap();
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[0].action, Action::Alloc);
        assert_eq!((ev[0].addr, ev[0].size, ev[0].time_us), (4096, 512, 5));
        assert_eq!(ev[0].device, 1);
        assert_eq!(ev[1].stream, -1);
        assert_eq!(
            (ev[2].action, ev[2].addr, ev[2].size),
            (Action::Oom, super::super::DEVICE_FREE_UNKNOWN, 4096)
        );
        assert_eq!(counts.snapshot, 1);
        assert_eq!(counts.of(Action::Oom), 1);
    }

    #[test]
    fn errors_name_the_line() {
        let text = "action,addr,size,stream,time_us\nalloc,1,2,0,0\nalloc,1,x2,0,0\n";
        match parse_str(text.as_bytes(), "f.csv") {
            Err(ToolError::Trace {
                path,
                record,
                message,
            }) => {
                assert_eq!(path, "f.csv");
                assert_eq!(record, 3);
                assert!(message.contains("size"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let short = "action,addr,size,stream,time_us\nalloc,1,2,0\n";
        assert!(matches!(
            parse_str(short.as_bytes(), "f"),
            Err(ToolError::Trace { record: 2, .. })
        ));
        let neg = "action,addr,size,stream,time_us\nalloc,1,-2,0,0\n";
        assert!(matches!(
            parse_str(neg.as_bytes(), "f"),
            Err(ToolError::Trace { record: 2, .. })
        ));
        let no_addr = "action,addr,size,stream,time_us\nalloc,,2,0,0\n";
        assert!(matches!(
            parse_str(no_addr.as_bytes(), "f"),
            Err(ToolError::Trace { record: 2, .. })
        ));
        let bad_header = "action,addr,size\n";
        assert!(matches!(
            parse_str(bad_header.as_bytes(), "f"),
            Err(ToolError::Trace { record: 1, .. })
        ));
        let bad_utf8 = b"action,addr,size,stream,time_us\nalloc,\xff,2,0,0\n";
        assert!(matches!(
            parse_str(bad_utf8, "f"),
            Err(ToolError::Trace { record: 2, .. })
        ));
    }
}
