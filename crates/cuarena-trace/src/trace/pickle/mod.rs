//! The snapshot pickle of `torch.cuda.memory._dump_snapshot`.
//!
//! Layout (PyTorch 2.x): a dict with `segments`, `device_traces`,
//! `allocator_settings` and `external_annotations`. `device_traces[d]` is
//! device `d`'s list of event dicts, each with `action`, `addr`, `size`,
//! `stream`, `time_us` and keys we ignore (`frames`, `compile_context`,
//! `user_metadata`, `device_free` on `oom`, ...).
//!
//! # Why a hand-written unpickler
//!
//! A general unpickler (`serde-pickle` was used before) recurses while it
//! builds and drops values, so a pickle nested a few hundred thousand levels
//! deep overflows the stack; it copies a shared value (memo get, DUP) at
//! every use, so an 84-byte file of DUP/TUPLE2 opcodes grows past 8 GiB; and
//! it must build the whole file as one value tree before anything can be
//! taken from it. This one ([`vm`]) is a single loop over the opcodes
//! protocols 2–5 use for plain data (PyTorch's snapshots use a subset),
//! shares values instead of copying them, never recurses (not even on drop,
//! see [`value`]) and charges everything it builds to a budget.
//!
//! It also keeps only what a trace needs: a container that appears as the
//! value of a dict key other than `device_traces`, `segments` and `blocks`
//! (`frames`, `history`, `allocator_settings`, ...), or inside such a
//! container, is built *skipped*: its items are dropped as they are put in.
//! Scalars are always kept (the memo may hand them out again later).
//!
//! The limits are in [`crate::trace::limits`]; see
//! [`crate::trace`] for the memory bound they give.

mod operands;
mod snapshot;
mod stack;
mod value;
mod vm;

use super::ActionCounts;
use crate::Result;

/// Parses a snapshot pickle into events (device from the list index) and
/// its segments, counting the actions into `counts`.
pub(super) fn parse(
    bytes: &[u8],
    source: &str,
    counts: &mut ActionCounts,
) -> Result<snapshot::Parsed> {
    let (top, _budget) = vm::Vm::new(bytes, source).run()?;
    snapshot::parse_top(top, source, counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Action, TraceEvent};

    fn parse_events(bytes: &[u8], source: &str) -> Result<Vec<TraceEvent>> {
        parse(bytes, source, &mut ActionCounts::default()).map(|p| p.events)
    }
    use crate::ToolError;
    use serde_pickle::{HashableValue, Value};
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
        let ev = parse_events(&bytes, "p").unwrap();
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
            parse_events(&b, "p"),
            Err(ToolError::Limit {
                name: "MAX_NESTING",
                ..
            })
        ));
    }

    #[test]
    fn rejects_non_snapshots_and_bad_events() {
        let list = serde_pickle::value_to_vec(&Value::List(vec![]), Default::default()).unwrap();
        assert!(matches!(
            parse_events(&list, "p"),
            Err(ToolError::Trace { record: 0, .. })
        ));
        let bytes = snapshot(vec![vec![event("alloc", 1, 2), event("alloc", -1, 2)]]);
        match parse_events(&bytes, "p") {
            Err(ToolError::Trace {
                record, message, ..
            }) => {
                assert_eq!(record, 2);
                assert!(message.contains("addr"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_events(&[0x80, 0x04, 0x95], "p"),
            Err(ToolError::Trace { record: 0, .. })
        ));
    }
}
