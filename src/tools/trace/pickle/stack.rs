//! The VM's value stack, and the rule that decides which containers are
//! built skipped.

use super::value::Value;

/// Values under these dict keys are kept; a container appearing as the
/// value of any other key is built skipped (see [`Node`]).
pub(super) const NEEDED_KEYS: [&str; 6] = [
    "device_traces",
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
];

/// The value stack, with, per slot, whether the nearest container at or
/// below it is skipped (a container made while one is being filled inherits
/// that).
#[derive(Default)]
pub(super) struct Stack {
    pub(super) values: Vec<Value>,
    pub(super) skipped: Vec<bool>,
}

impl Stack {
    pub(super) fn push(&mut self, v: Value) {
        let skipped = match &v {
            Value::Node(n) => n.skipped,
            _ => self.skipped.last().copied().unwrap_or(false),
        };
        self.values.push(v);
        self.skipped.push(skipped);
    }

    pub(super) fn truncate(&mut self, len: usize) -> Vec<Value> {
        self.skipped.truncate(len);
        self.values.split_off(len)
    }

    /// Whether a container made now should be skipped: after a key that is
    /// not needed, or inside a skipped container.
    pub(super) fn next_container_skipped(&self) -> bool {
        match self.values.last() {
            Some(Value::Str(k)) => !NEEDED_KEYS.contains(&&**k),
            Some(_) => self.skipped.last().copied().unwrap_or(false),
            None => false,
        }
    }
}
