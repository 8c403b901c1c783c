//! The CSV form: a header naming the columns, then one event per line.
//!
//! Columns are found by name, so their order may vary and extra columns are
//! ignored; `action`, `addr`, `size`, `stream` and `time_us` are required,
//! `device` is optional (0 when absent). Blank lines are skipped; `\r\n`
//! line ends are accepted. A line longer than
//! [`MAX_CSV_LINE_BYTES`] is a [`ToolError::Limit`].

use super::limits::MAX_CSV_LINE_BYTES;
use super::{Action, TraceEvent};
use crate::tools::{Result, ToolError};

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

fn check_line(raw: &[u8], source: &str) -> Result<()> {
    if raw.len() as u64 > MAX_CSV_LINE_BYTES {
        return Err(ToolError::Limit {
            path: source.to_owned(),
            what: "CSV line length in bytes",
            name: "MAX_CSV_LINE_BYTES",
            asked: raw.len() as u64,
            limit: MAX_CSV_LINE_BYTES,
        });
    }
    Ok(())
}

/// Parses a whole CSV trace.
pub(super) fn parse(bytes: &[u8], source: &str) -> Result<Vec<TraceEvent>> {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let mut lines = bytes.split(|&b| b == b'\n');
    let header = lines.next().unwrap_or_default();
    check_line(header, source)?;
    let header = std::str::from_utf8(header)
        .map_err(|_| err(source, 1, "header is not UTF-8".to_owned()))?
        .trim_end_matches('\r');
    let cols = parse_header(header, source)?;

    // A line is ~50 bytes; reserving avoids regrowth on million-line files.
    let mut events = Vec::with_capacity(bytes.len() / 48);
    let mut fields: Vec<&str> = Vec::with_capacity(cols.count);
    for (i, raw) in lines.enumerate() {
        let line_no = i as u64 + 2;
        check_line(raw, source)?;
        let line = std::str::from_utf8(raw)
            .map_err(|_| err(source, line_no, "line is not UTF-8".to_owned()))?
            .trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        fields.clear();
        fields.extend(line.split(',').map(str::trim));
        if fields.len() != cols.count {
            return Err(err(
                source,
                line_no,
                format!(
                    "expected {} fields as in the header, found {}",
                    cols.count,
                    fields.len()
                ),
            ));
        }
        let num_u64 = |col: usize, name: &str| -> Result<u64> {
            fields[col].parse::<u64>().map_err(|e| {
                err(
                    source,
                    line_no,
                    format!(
                        "column `{name}`: `{}` is not a byte count ({e})",
                        fields[col]
                    ),
                )
            })
        };
        let num_i64 = |col: usize, name: &str| -> Result<i64> {
            let f = fields[col];
            // Streams are pointer-sized identifiers: accept the full u64
            // range and keep the bits.
            f.parse::<i64>()
                .or_else(|_| f.parse::<u64>().map(|u| u as i64))
                .map_err(|e| {
                    err(
                        source,
                        line_no,
                        format!("column `{name}`: `{f}` is not an integer ({e})"),
                    )
                })
        };
        let action = fields[cols.action];
        if action.is_empty() {
            return Err(err(source, line_no, "empty action".to_owned()));
        }
        let device = match cols.device {
            Some(c) => fields[c].parse::<u32>().map_err(|e| {
                err(
                    source,
                    line_no,
                    format!(
                        "column `device`: `{}` is not a device ordinal ({e})",
                        fields[c]
                    ),
                )
            })?,
            None => 0,
        };
        events.push(TraceEvent {
            action: Action::parse(action),
            addr: num_u64(cols.addr, "addr")?,
            size: num_u64(cols.size, "size")?,
            stream: num_i64(cols.stream, "stream")?,
            time_us: num_i64(cols.time_us, "time_us")?,
            device,
        });
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_and_columns_by_name() {
        let text = "time_us,action,size,addr,stream,device,extra\r\n\
                    5,alloc,512,4096,0,1,x\r\n\
                    \r\n\
                    6,free_completed,512,4096,18446744073709551615,1,y\r\n";
        let ev = parse(text.as_bytes(), "t").unwrap();
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].action, Action::Alloc);
        assert_eq!((ev[0].addr, ev[0].size, ev[0].time_us), (4096, 512, 5));
        assert_eq!(ev[0].device, 1);
        assert_eq!(ev[1].stream, -1);
    }

    #[test]
    fn errors_name_the_line() {
        let text = "action,addr,size,stream,time_us\nalloc,1,2,0,0\nalloc,1,x2,0,0\n";
        match parse(text.as_bytes(), "f.csv") {
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
            parse(short.as_bytes(), "f"),
            Err(ToolError::Trace { record: 2, .. })
        ));
        let neg = "action,addr,size,stream,time_us\nalloc,1,-2,0,0\n";
        assert!(matches!(
            parse(neg.as_bytes(), "f"),
            Err(ToolError::Trace { record: 2, .. })
        ));
        let bad_header = "action,addr,size\n";
        assert!(matches!(
            parse(bad_header.as_bytes(), "f"),
            Err(ToolError::Trace { record: 1, .. })
        ));
        let bad_utf8 = b"action,addr,size,stream,time_us\nalloc,\xff,2,0,0\n";
        assert!(matches!(
            parse(bad_utf8, "f"),
            Err(ToolError::Trace { record: 2, .. })
        ));
    }
}
