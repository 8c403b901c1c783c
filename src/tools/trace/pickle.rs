//! The snapshot pickle of `torch.cuda.memory._dump_snapshot`.
//!
//! Layout (PyTorch 2.x): a dict with `segments`, `device_traces`,
//! `allocator_settings` and `external_annotations`. `device_traces[d]` is
//! device `d`'s list of event dicts, each with `action`, `addr`, `size`,
//! `stream`, `time_us` and keys we ignore (`frames`, `compile_context`,
//! `user_metadata`, `device_free` on `oom`, ...).
//!
//! The whole pickle is decoded with `serde-pickle` into its generic `Value`
//! so that any Python type in the ignored parts is accepted; only the five
//! event fields are checked.

use serde_pickle::{DeOptions, HashableValue, Value};

use super::{Action, TraceEvent};
use crate::tools::{Result, ToolError};

/// Stack for the decoding thread. `serde-pickle` converts nested values
/// recursively, so a deeply nested (hostile or broken) pickle could overflow
/// a normal thread's stack; this is address space, committed only as used.
const DECODE_STACK_BYTES: usize = 512 << 20;

fn err(source: &str, record: u64, message: String) -> ToolError {
    ToolError::Trace {
        path: source.to_owned(),
        record,
        message,
    }
}

/// Runs `f` on a thread with a large stack; a panic inside becomes an
/// error rather than unwinding into the caller.
fn on_big_stack<T: Send>(source: &str, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let joined = std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("trace-pickle".to_owned())
            .stack_size(DECODE_STACK_BYTES)
            .spawn_scoped(s, f)
            .map(|h| h.join())
    });
    match joined {
        Err(e) => Err(err(source, 0, format!("cannot start decoder thread: {e}"))),
        Ok(Err(_panic)) => Err(err(source, 0, "pickle decoder panicked".to_owned())),
        Ok(Ok(r)) => r,
    }
}

fn key<'a>(
    dict: &'a std::collections::BTreeMap<HashableValue, Value>,
    k: &str,
) -> Option<&'a Value> {
    dict.get(&HashableValue::String(k.to_owned()))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::None => "None",
        Value::Bool(_) => "bool",
        Value::I64(_) | Value::Int(_) => "int",
        Value::F64(_) => "float",
        Value::Bytes(_) => "bytes",
        Value::String(_) => "str",
        Value::List(_) => "list",
        Value::Tuple(_) => "tuple",
        Value::Set(_) => "set",
        Value::FrozenSet(_) => "frozenset",
        Value::Dict(_) => "dict",
    }
}

/// An integer field as i128 (covers both u64 addresses and i64 clocks).
fn int_of(v: &Value) -> Option<i128> {
    match v {
        Value::I64(i) => Some(i128::from(*i)),
        Value::Int(b) => b.to_string().parse::<i128>().ok(),
        Value::Bool(b) => Some(i128::from(*b)),
        _ => None,
    }
}

/// Parses a snapshot pickle into events (device from the list index).
///
/// Decoding, extraction and dropping the decoded tree (recursive too) all
/// happen on one big-stack thread.
pub(super) fn parse(bytes: &[u8], source: &str) -> Result<Vec<TraceEvent>> {
    on_big_stack(source, || {
        let options = DeOptions::new()
            .replace_unresolved_globals()
            .replace_recursive_structures()
            .decode_strings();
        let top = serde_pickle::value_from_slice(bytes, options)
            .map_err(|e| err(source, 0, format!("not a valid pickle: {e}")))?;
        events_of(top, source)
    })
}

fn events_of(top: Value, source: &str) -> Result<Vec<TraceEvent>> {
    let Value::Dict(top) = top else {
        return Err(err(
            source,
            0,
            format!(
                "not a PyTorch memory snapshot: top level is a {}, not a dict",
                type_name(&top)
            ),
        ));
    };
    let Some(traces) = key(&top, "device_traces") else {
        let keys: Vec<String> = top.keys().take(8).map(|k| format!("{k:?}")).collect();
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
    let (Value::List(devices) | Value::Tuple(devices)) = traces else {
        return Err(err(
            source,
            0,
            format!("`device_traces` is a {}, not a list", type_name(traces)),
        ));
    };

    let total: usize = devices
        .iter()
        .map(|d| match d {
            Value::List(v) | Value::Tuple(v) => v.len(),
            _ => 0,
        })
        .sum();
    let mut events = Vec::with_capacity(total);
    for (dev, list) in devices.iter().enumerate() {
        let device = u32::try_from(dev)
            .map_err(|_| err(source, 0, format!("device index {dev} out of range")))?;
        let (Value::List(list) | Value::Tuple(list)) = list else {
            return Err(err(
                source,
                0,
                format!(
                    "`device_traces[{dev}]` is a {}, not a list",
                    type_name(list)
                ),
            ));
        };
        for ev in list {
            let record = events.len() as u64 + 1;
            events.push(parse_event(ev, device, source, record)?);
        }
    }
    Ok(events)
}

fn parse_event(ev: &Value, device: u32, source: &str, record: u64) -> Result<TraceEvent> {
    let Value::Dict(d) = ev else {
        return Err(err(
            source,
            record,
            format!("device {device} event is a {}, not a dict", type_name(ev)),
        ));
    };
    let action = match key(d, "action") {
        Some(Value::String(s)) => Action::parse(s),
        Some(Value::Bytes(b)) => Action::parse(&String::from_utf8_lossy(b)),
        Some(other) => {
            return Err(err(
                source,
                record,
                format!("`action` is a {}, not a str", type_name(other)),
            ))
        }
        None => return Err(err(source, record, "event has no `action`".to_owned())),
    };
    // addr and size are required; stream and time_us default to 0 because
    // older PyTorch versions and synthetic snapshots omit them.
    let field = |name: &str, required: bool| -> Result<i128> {
        match key(d, name) {
            Some(v) => int_of(v).ok_or_else(|| {
                err(
                    source,
                    record,
                    format!("`{name}` is a {}, not an int", type_name(v)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn s(x: &str) -> HashableValue {
        HashableValue::String(x.to_owned())
    }

    fn event(action: &str, addr: i64, size: i64) -> Value {
        let mut d = BTreeMap::new();
        d.insert(s("action"), Value::String(action.to_owned()));
        d.insert(s("addr"), Value::I64(addr));
        d.insert(s("size"), Value::I64(size));
        d.insert(s("stream"), Value::I64(0));
        d.insert(s("time_us"), Value::I64(7));
        d.insert(s("frames"), Value::List(vec![Value::None, Value::F64(1.5)]));
        Value::Dict(d)
    }

    fn snapshot(devices: Vec<Vec<Value>>) -> Vec<u8> {
        let mut d = BTreeMap::new();
        d.insert(s("segments"), Value::List(vec![]));
        d.insert(
            s("device_traces"),
            Value::List(devices.into_iter().map(Value::List).collect()),
        );
        d.insert(s("allocator_settings"), Value::Dict(BTreeMap::new()));
        serde_pickle::value_to_vec(&Value::Dict(d), serde_pickle::SerOptions::new()).unwrap()
    }

    #[test]
    fn reads_events_with_device_from_list_index() {
        let bytes = snapshot(vec![
            vec![event("alloc", 1 << 40, 512)],
            vec![event("alloc", 5, 6), event("free_completed", 5, 6)],
        ]);
        let ev = parse(&bytes, "p").unwrap();
        assert_eq!(ev.len(), 3);
        assert_eq!((ev[0].addr, ev[0].device), (1 << 40, 0));
        assert_eq!(ev[2].action, Action::FreeCompleted);
        assert_eq!(ev[2].device, 1);
        assert_eq!(ev[2].time_us, 7);
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        // PROTO 2, N x EMPTY_LIST, (N-1) x APPEND, STOP: a list nested N deep.
        let n = 200_000;
        let mut b = vec![0x80, 2];
        b.resize(2 + n, b']');
        b.resize(2 + 2 * n - 1, b'a');
        b.push(b'.');
        assert!(matches!(
            parse(&b, "p"),
            Err(ToolError::Trace { record: 0, .. })
        ));
    }

    #[test]
    fn rejects_non_snapshots_and_bad_events() {
        let list = serde_pickle::value_to_vec(&Value::List(vec![]), Default::default()).unwrap();
        assert!(matches!(
            parse(&list, "p"),
            Err(ToolError::Trace { record: 0, .. })
        ));
        let bytes = snapshot(vec![vec![event("alloc", 1, 2), event("alloc", -1, 2)]]);
        match parse(&bytes, "p") {
            Err(ToolError::Trace {
                record, message, ..
            }) => {
                assert_eq!(record, 2);
                assert!(message.contains("addr"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&[0x80, 0x04, 0x95], "p"),
            Err(ToolError::Trace { record: 0, .. })
        ));
    }
}
