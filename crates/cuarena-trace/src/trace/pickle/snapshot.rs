//! From the VM's value to [`TraceEvent`]s and [`Segment`]s:
//! `device_traces[d]` is device `d`'s list of event dicts, `segments` the
//! allocator's segments at the dump, each with its `blocks`. Only the top
//! dict, these lists and their dicts' fields were kept by the VM;
//! everything else arrives as skipped (empty) containers or scalars, and is
//! not looked at.
//!
//! Work stays linear in the input whatever the pickle shares through its
//! memo: an event dict that appears many times is decoded once, and a
//! device's event list, a segment or a block list that appears twice is an
//! error (PyTorch never writes one object twice; reading it again would
//! multiply the work).

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use super::value::{Kind, Node, Value};
use crate::pytorch::{AllocatorSettings, ROUNDUP_INTERVALS};
use crate::trace::csv::push_event;
use crate::trace::input::out_of_memory;
use crate::trace::limits::MAX_BLOCK_BYTES;
use crate::trace::{
    check_event_size, Action, ActionCounts, Block, BlockState, Segment, TraceEvent,
    DEVICE_FREE_UNKNOWN,
};
use crate::{Result, ToolError};

fn err(source: &str, record: u64, message: String) -> ToolError {
    ToolError::Trace {
        path: source.to_owned(),
        record,
        message,
    }
}

/// The list (or tuple) `v`, or an error naming `what`.
fn list_of(v: &Value, what: &str, source: &str, record: u64) -> Result<Rc<Node>> {
    match v {
        Value::Node(n) if matches!(n.kind, Kind::List | Kind::Tuple) => Ok(n.clone()),
        Value::Skipped(_) => Err(err(
            source,
            record,
            format!("{what} sits where the reader skips values; not a PyTorch snapshot layout"),
        )),
        other => Err(err(
            source,
            record,
            format!("{what} is a {}, not a list", other.type_name()),
        )),
    }
}

/// The dict `v`, or an error naming `what`.
fn dict_of<'v>(v: &'v Value, what: &str, source: &str, record: u64) -> Result<&'v Rc<Node>> {
    match v {
        Value::Node(n) if n.kind == Kind::Dict => Ok(n),
        other => Err(err(
            source,
            record,
            format!("{what} is a {}, not a dict", other.type_name()),
        )),
    }
}

/// Refuses a node seen before (see the module doc).
fn once(seen: &mut HashSet<*const Node>, n: &Rc<Node>, what: &str, source: &str) -> Result<()> {
    if !seen.insert(Rc::as_ptr(n)) {
        return Err(err(
            source,
            0,
            format!("{what} is the same object as an earlier one; not a PyTorch snapshot"),
        ));
    }
    Ok(())
}

/// What a snapshot pickle holds for a trace.
pub(crate) struct Parsed {
    pub(crate) events: Vec<TraceEvent>,
    pub(crate) segments: Option<Vec<Segment>>,
    pub(crate) allocator_settings: Option<AllocatorSettings>,
    /// Distinct event dicts decoded.
    pub(crate) decoded_event_dicts: u64,
}

/// Turns the unpickled top value into events and segments.
pub(super) fn parse_top(top: Value, source: &str, counts: &mut ActionCounts) -> Result<Parsed> {
    let top = match top {
        Value::Node(n) if n.kind == Kind::Dict => n,
        other => {
            return Err(err(
                source,
                0,
                format!(
                    "not a PyTorch memory snapshot: top level is a {}, not a dict",
                    other.type_name()
                ),
            ))
        }
    };
    let Some(traces) = top.get("device_traces") else {
        let keys: Vec<String> = top
            .items()
            .chunks_exact(2)
            .take(8)
            .map(|kv| match &kv[0] {
                Value::Str(s) => format!("{:?}", s.chars().take(40).collect::<String>()),
                other => format!("<{}>", other.type_name()),
            })
            .collect();
        return Err(err(
            source,
            0,
            format!(
                "not a PyTorch memory snapshot: no `device_traces` key (keys: {}); \
                 was memory history recording enabled?",
                keys.join(", ")
            ),
        ));
    };
    let mut seen = HashSet::new();
    let mut decoded = 0;
    let events = events_of(&traces, source, counts, &mut seen, &mut decoded)?;
    let segments = match top.get("segments") {
        Some(v) => Some(segments_of(&v, source, &mut seen)?),
        None => None,
    };
    let allocator_settings = match top.get("allocator_settings") {
        Some(Value::Node(d)) if d.kind == Kind::Dict => Some(settings_of(&d)),
        _ => None,
    };
    Ok(Parsed {
        events,
        segments,
        allocator_settings,
        decoded_event_dicts: decoded,
    })
}

/// The settings a snapshot's `allocator_settings` dict records (PyTorch
/// 2.1 and later). A field that is absent or of another type than PyTorch
/// writes keeps its default: the settings inform a model, they are not
/// needed to read the trace.
fn settings_of(d: &Node) -> AllocatorSettings {
    let conf = match d.get("PYTORCH_CUDA_ALLOC_CONF") {
        Some(Value::Str(s)) => AllocatorSettings::parse_conf(&s).ok(),
        _ => None,
    };
    let mut s = conf.unwrap_or_default();
    match d.get("max_split_size").and_then(|v| v.as_int()) {
        Some(v) if v < 0 => s.max_split_size = u64::MAX,
        Some(v) => s.max_split_size = u64::try_from(v).unwrap_or(u64::MAX),
        None => {}
    }
    match d.get("garbage_collection_threshold") {
        Some(Value::Float(t)) if t.is_finite() && (0.0..1.0).contains(&t) => {
            s.garbage_collection_threshold = t
        }
        _ => {}
    }
    if let Some(Value::Bool(b)) = d.get("expandable_segments") {
        s.expandable_segments = b;
    }
    if let Some(Value::Node(r)) = d.get("roundup_power2_divisions") {
        if r.kind == Kind::Dict {
            for kv in r.items().chunks_exact(2) {
                let (Value::Str(k), Some(v)) = (&kv[0], kv[1].as_int()) else {
                    continue;
                };
                let Ok(mb) = k.parse::<u32>() else { continue };
                let index = (mb.max(1).ilog2() as usize).min(ROUNDUP_INTERVALS - 1);
                s.roundup_power2_divisions[index] = u64::try_from(v).unwrap_or(0);
            }
        }
    }
    s
}

fn events_of(
    traces: &Value,
    source: &str,
    counts: &mut ActionCounts,
    seen: &mut HashSet<*const Node>,
    decoded: &mut u64,
) -> Result<Vec<TraceEvent>> {
    let devices = list_of(traces, "`device_traces`", source, 0)?;
    let devices = devices.items();
    let mut events = Vec::new();
    // Event dicts that appear more than once, decoded once.
    let mut shared: HashMap<*const Node, Decoded> = HashMap::new();
    let mut record = 0u64;
    for (dev, list) in devices.iter().enumerate() {
        let device = u32::try_from(dev)
            .map_err(|_| err(source, 0, format!("device index {dev} out of range")))?;
        let what = format!("`device_traces[{dev}]`");
        let list = list_of(list, &what, source, 0)?;
        once(seen, &list, &what, source)?;
        for ev in list.items().iter() {
            record += 1;
            let d = dict_of(ev, &format!("device {device} event"), source, record)?;
            let decoded = if Rc::strong_count(d) > 1 {
                let key = Rc::as_ptr(d);
                // Decoded once; the device is the list's, not the first one's.
                match shared.get(&key) {
                    Some(p) => p.clone().map(|e| TraceEvent { device, ..e }),
                    None => {
                        *decoded += 1;
                        let p = parse_event(d, device, source, record)?;
                        shared.insert(key, p.clone());
                        p
                    }
                }
            } else {
                *decoded += 1;
                parse_event(d, device, source, record)?
            };
            match decoded {
                Ok(e) => {
                    counts.keep(e.action);
                    push_event(&mut events, e, source)?;
                }
                Err(name) => counts.skip(&name),
            }
        }
    }
    Ok(events)
}

/// An event kept, or the name of the action it was skipped for.
type Decoded = std::result::Result<TraceEvent, Rc<str>>;

/// One event dict, or the name of an action a replay does not use.
fn parse_event(d: &Node, device: u32, source: &str, record: u64) -> Result<Decoded> {
    let name = match d.get("action") {
        Some(Value::Str(s)) => s.to_string(),
        Some(Value::Bytes(b)) => String::from_utf8_lossy(&b).into_owned(),
        Some(other) => {
            return Err(err(
                source,
                record,
                format!("`action` is a {}, not a str", other.type_name()),
            ))
        }
        None => return Err(err(source, record, "event has no `action`".to_owned())),
    };
    let Some(action) = Action::parse(&name) else {
        return Ok(Err(name.into()));
    };
    let f = Fields {
        d,
        source,
        record,
        what: action.as_str(),
    };
    // `oom` writes `device_free` where the others write `addr`; `stream`
    // and `time_us` are absent from old releases and hand-made snapshots.
    let addr = if action == Action::Oom {
        f.unsigned("device_free", Some(DEVICE_FREE_UNKNOWN))?
    } else {
        f.unsigned("addr", None)?
    };
    let e = TraceEvent {
        action,
        device,
        addr,
        size: f.unsigned("size", None)?,
        stream: f.signed("stream")?,
        time_us: f.signed("time_us")?,
    };
    check_event_size(&e, source, record)?;
    Ok(Ok(e))
}

/// Integer fields of one dict, with errors naming the record.
struct Fields<'a> {
    d: &'a Node,
    source: &'a str,
    record: u64,
    what: &'a str,
}

impl Fields<'_> {
    fn int(&self, name: &str) -> Result<Option<i128>> {
        match self.d.get(name) {
            None | Some(Value::None) => Ok(None),
            Some(Value::Huge) => Err(err(
                self.source,
                self.record,
                format!("`{name}` is an int wider than 128 bits"),
            )),
            Some(v) => v.as_int().map(Some).ok_or_else(|| {
                err(
                    self.source,
                    self.record,
                    format!("`{name}` is a {}, not an int", v.type_name()),
                )
            }),
        }
    }

    /// An unsigned field; `default` when absent, or an error without one.
    fn unsigned(&self, name: &str, default: Option<u64>) -> Result<u64> {
        match (self.int(name)?, default) {
            (Some(v), _) => u64::try_from(v).map_err(|_| {
                err(
                    self.source,
                    self.record,
                    format!("`{name}` = {v} is out of range"),
                )
            }),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(err(
                self.source,
                self.record,
                format!("`{}` has no `{name}`", self.what),
            )),
        }
    }

    /// A signed field, 0 when absent; a u64 keeps its bits (streams are
    /// pointer-sized identifiers).
    fn signed(&self, name: &str) -> Result<i64> {
        match self.int(name)? {
            None => Ok(0),
            Some(v) => i64::try_from(v)
                .or_else(|_| u64::try_from(v).map(|u| u as i64))
                .map_err(|_| {
                    err(
                        self.source,
                        self.record,
                        format!("`{name}` = {v} is out of range"),
                    )
                }),
        }
    }
}

fn segments_of(v: &Value, source: &str, seen: &mut HashSet<*const Node>) -> Result<Vec<Segment>> {
    let list = list_of(v, "`segments`", source, 0)?;
    let mut out = Vec::new();
    for (i, s) in list.items().iter().enumerate() {
        let what = format!("`segments[{i}]`");
        let d = dict_of(s, &what, source, 0)?;
        once(seen, d, &what, source)?;
        let f = Fields {
            d,
            source,
            record: 0,
            what: &what,
        };
        let address = f.unsigned("address", None)?;
        let device = f.unsigned("device", Some(0))?;
        let device = u32::try_from(device)
            .map_err(|_| err(source, 0, format!("{what}: device {device} out of range")))?;
        let mut seg = Segment {
            device,
            address,
            total_size: f.unsigned("total_size", None)?,
            stream: f.signed("stream")?,
            is_small: match d.get("segment_type") {
                Some(Value::Str(t)) => match t.as_str() {
                    "small" => Some(true),
                    "large" => Some(false),
                    _ => None,
                },
                _ => None,
            },
            expandable: match d.get("is_expandable") {
                None | Some(Value::None) => false,
                Some(Value::Bool(b)) => b,
                Some(other) => {
                    return Err(err(
                        source,
                        0,
                        format!(
                            "{what}: `is_expandable` is a {}, not a bool",
                            other.type_name()
                        ),
                    ))
                }
            },
            blocks: Vec::new(),
        };
        if let Some(blocks) = d.get("blocks") {
            let what = format!("{what}.blocks");
            let blocks = list_of(&blocks, &what, source, 0)?;
            once(seen, &blocks, &what, source)?;
            let mut next = address;
            for (j, b) in blocks.items().iter().enumerate() {
                let what = format!("{what}[{j}]");
                let bd = dict_of(b, &what, source, 0)?;
                // Each block its own dict: a shared one would let a file of
                // one byte a block (DUP) build 32 bytes a block.
                once(seen, bd, &what, source)?;
                let f = Fields {
                    d: bd,
                    source,
                    record: 0,
                    what: &what,
                };
                let size = f.unsigned("size", None)?;
                if size > MAX_BLOCK_BYTES {
                    return Err(err(
                        source,
                        0,
                        format!(
                            "{what}: size {size} B is past the largest block ({MAX_BLOCK_BYTES} B)"
                        ),
                    ));
                }
                // PyTorch 2.0 wrote no block addresses: they follow each other.
                let address = f.unsigned("address", Some(next))?;
                next = address.saturating_add(size);
                let state = match bd.get("state") {
                    Some(Value::Str(s)) => BlockState::parse(s.as_str()),
                    None | Some(Value::None) => BlockState::Unknown,
                    Some(other) => {
                        return Err(err(
                            source,
                            0,
                            format!("{what}: `state` is a {}, not a str", other.type_name()),
                        ))
                    }
                };
                if seg.blocks.len() == seg.blocks.capacity() {
                    let grow = (seg.blocks.len() / 2).max(16);
                    seg.blocks.try_reserve_exact(grow).map_err(|_| {
                        out_of_memory(
                            source,
                            "the blocks of `segments`",
                            (seg.blocks.len() + grow) as u64 * 32,
                        )
                    })?;
                }
                seg.blocks.push(Block {
                    address,
                    size,
                    requested_size: f.unsigned("requested_size", Some(size))?,
                    state,
                });
            }
        }
        out.push(seg);
    }
    Ok(out)
}
