//! From the VM's value to [`TraceEvent`]s: `device_traces[d]` is device
//! `d`'s list of event dicts. Only the top dict, `device_traces`, its lists
//! and the event dicts' needed fields were kept by the VM; everything else
//! arrives as skipped (empty) containers or scalars, and is not looked at.

use std::rc::Rc;

use super::value::{Budget, Kind, Node, Value};
use crate::tools::trace::{Action, TraceEvent};
use crate::tools::{Result, ToolError};

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
        Value::Node(n) if matches!(n.kind, Kind::List | Kind::Tuple) && !n.skipped => Ok(n.clone()),
        Value::Node(n) if n.skipped => Err(err(
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

/// Turns the unpickled top value into events, charging them to `budget`.
pub(super) fn events_of(top: Value, budget: &mut Budget, source: &str) -> Result<Vec<TraceEvent>> {
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
    let devices = list_of(&traces, "`device_traces`", source, 0)?;
    let devices = devices.items();

    let mut events = Vec::new();
    for (dev, list) in devices.iter().enumerate() {
        let device = u32::try_from(dev)
            .map_err(|_| err(source, 0, format!("device index {dev} out of range")))?;
        let what = format!("`device_traces[{dev}]`");
        let list = list_of(list, &what, source, 0)?;
        for ev in list.items().iter() {
            let record = events.len() as u64 + 1;
            let e = parse_event(ev, device, source, record)?;
            let extra = match &e.action {
                Action::Other(s) => s.len() as u64,
                _ => 0,
            };
            budget.charge(std::mem::size_of::<TraceEvent>() as u64 * 2 + extra, source)?;
            events.push(e);
        }
    }
    Ok(events)
}

fn parse_event(ev: &Value, device: u32, source: &str, record: u64) -> Result<TraceEvent> {
    let d = match ev {
        Value::Node(n) if n.kind == Kind::Dict && !n.skipped => n,
        other => {
            return Err(err(
                source,
                record,
                format!(
                    "device {device} event is a {}, not a dict",
                    other.type_name()
                ),
            ))
        }
    };
    let action = match d.get("action") {
        Some(Value::Str(s)) => Action::parse(&s),
        Some(Value::Bytes(b)) => Action::parse(&String::from_utf8_lossy(&b)),
        Some(other) => {
            return Err(err(
                source,
                record,
                format!("`action` is a {}, not a str", other.type_name()),
            ))
        }
        None => return Err(err(source, record, "event has no `action`".to_owned())),
    };
    // addr and size are required; stream and time_us default to 0 because
    // older PyTorch versions and synthetic snapshots omit them.
    let field = |name: &str, required: bool| -> Result<i128> {
        match d.get(name) {
            Some(Value::Huge) => Err(err(
                source,
                record,
                format!("`{name}` is an int wider than 128 bits"),
            )),
            Some(v) => v.as_int().ok_or_else(|| {
                err(
                    source,
                    record,
                    format!("`{name}` is a {}, not an int", v.type_name()),
                )
            }),
            None if required => Err(err(
                source,
                record,
                format!("`{}` event has no `{name}`", action.as_str()),
            )),
            None => Ok(0),
        }
    };
    let unsigned = |name: &str| -> Result<u64> {
        let v = field(name, true)?;
        u64::try_from(v).map_err(|_| err(source, record, format!("`{name}` = {v} is out of range")))
    };
    let signed = |name: &str| -> Result<i64> {
        let v = field(name, false)?;
        // Streams are pointer-sized identifiers: keep the bits of a u64.
        i64::try_from(v)
            .or_else(|_| u64::try_from(v).map(|u| u as i64))
            .map_err(|_| err(source, record, format!("`{name}` = {v} is out of range")))
    };
    Ok(TraceEvent {
        addr: unsigned("addr")?,
        size: unsigned("size")?,
        stream: signed("stream")?,
        time_us: signed("time_us")?,
        action,
        device,
    })
}
