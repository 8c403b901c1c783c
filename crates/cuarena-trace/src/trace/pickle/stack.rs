//! The VM's value stack, and the rule that decides which containers are
//! built skipped.

use super::value::Value;

/// Dict keys whose entries are kept at all (see [`super::value::extend`]):
/// the needed containers, the scalar fields of events, segments and
/// blocks, and the allocator settings a model of PyTorch's allocator uses.
pub(super) fn kept_key(k: &str) -> bool {
    needed_key(k)
        || matches!(
            k,
            "action"
                | "addr"
                | "size"
                | "stream"
                | "time_us"
                | "device_free"
                | "device"
                | "address"
                | "total_size"
                | "state"
                | "requested_size"
                | "is_expandable"
                | "segment_type"
                | "PYTORCH_CUDA_ALLOC_CONF"
                | "max_split_size"
                | "garbage_collection_threshold"
                | "expandable_segments"
        )
        || divisions_key(k)
}

/// The keys of `roundup_power2_divisions`: `"1"`, `"2"`, ... `"32768"`
/// (MiB), one per interval.
fn divisions_key(k: &str) -> bool {
    k.len() <= 5
        && k.parse::<u32>()
            .is_ok_and(|v| v.is_power_of_two() && v <= 32768)
}

/// Values under these dict keys are kept; a container appearing as the
/// value of any other key is built skipped (see [`Value::Skipped`]).
pub(super) fn needed_key(k: &str) -> bool {
    matches!(
        k,
        "device_traces" | "segments" | "blocks" | "allocator_settings" | "roundup_power2_divisions"
    )
}

/// The value stack, with, per slot, whether the nearest container at or
/// below it is skipped (a container made while one is being filled inherits
/// that).
#[derive(Default)]
pub(super) struct Stack {
    pub(super) values: Vec<Value>,
    pub(super) skipped: Vec<bool>,
}

impl Stack {
    #[inline(always)]
    pub(super) fn push(&mut self, v: Value) {
        let skipped = match &v {
            Value::Node(n) => n.skipped,
            Value::Skipped(_) => true,
            _ => self.skipped.last().copied().unwrap_or(false),
        };
        self.values.push(v);
        self.skipped.push(skipped);
    }

    /// Drops the values above `len` where they lie.
    pub(super) fn drop_to(&mut self, len: usize) {
        self.skipped.truncate(len);
        self.values.truncate(len);
    }

    pub(super) fn truncate(&mut self, len: usize) -> Vec<Value> {
        self.skipped.truncate(len);
        self.values.split_off(len)
    }

    /// Whether a container made now should be skipped: after a key that is
    /// not needed, or inside a skipped container.
    #[inline]
    pub(super) fn next_container_skipped(&self) -> bool {
        self.skipped_after(self.values.len())
    }

    /// [`Stack::next_container_skipped`] once the stack is cut to `len`.
    #[inline]
    pub(super) fn skipped_after(&self, len: usize) -> bool {
        match len.checked_sub(1).and_then(|i| self.values.get(i)) {
            Some(Value::Str(k)) => !needed_key(k),
            Some(_) => self.skipped[len - 1],
            None => false,
        }
    }
}
