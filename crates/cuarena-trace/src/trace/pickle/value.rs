//! The values the pickle VM builds, and the memory budget they are charged
//! against.
//!
//! Containers are reference-counted nodes: a memo get or DUP shares the node,
//! never copies it. A node is frozen once it is put inside another one, and
//! a frozen node can no longer change; with the depth recorded at each
//! insertion this makes cycles impossible and keeps every node's depth
//! exact. Dropping a node is iterative, so no chain of nodes, however long,
//! recurses.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use super::stack::kept_key;
use crate::trace::limits::{MAX_NESTING, MEMORY_BASE_BYTES, MEMORY_PER_INPUT_BYTE};
use crate::{Result, ToolError};

/// A Python value, as far as a trace reader cares.
#[derive(Clone)]
pub(super) enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An int outside `i64` that fits in `i128` (boxed: rare, and a value
    /// stays 16 bytes).
    Wide(Box<i128>),
    /// An int wider than `i128` (its value is not kept).
    Huge,
    Float(f64),
    /// A str (`Rc<String>`, a thin pointer: a value stays 16 bytes).
    Str(Rc<String>),
    Bytes(Rc<Vec<u8>>),
    /// Anything built by REDUCE, NEWOBJ or a global: kept opaque.
    Object,
    Node(Rc<Node>),
    /// A container built where nothing in it is needed (see
    /// [`super::stack`]): nothing is allocated for it, and what is put in
    /// it is dropped at once.
    Skipped(Kind),
}

impl Value {
    /// Python's name for the value's type, for error messages.
    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::Wide(_) | Value::Huge => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::Object => "object",
            Value::Node(n) => n.kind.name(),
            Value::Skipped(k) => k.name(),
        }
    }

    /// The value as an integer, when it is one that fits in `i128`.
    pub(super) fn as_int(&self) -> Option<i128> {
        match self {
            Value::Int(i) => Some(i128::from(*i)),
            Value::Wide(i) => Some(**i),
            Value::Bool(b) => Some(i128::from(*b)),
            _ => None,
        }
    }

    /// Nesting depth: 0 for a scalar.
    pub(super) fn depth(&self) -> u64 {
        match self {
            Value::Node(n) => n.depth.get(),
            _ => 0,
        }
    }
}

/// What a container node is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Kind {
    List,
    Tuple,
    /// Items alternate key, value.
    Dict,
    Set,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::List => "list",
            Kind::Tuple => "tuple",
            Kind::Dict => "dict",
            Kind::Set => "set",
        }
    }
}

/// A container. When `skipped`, the reader decided (from where the node
/// appears) that nothing in it is needed: items put into it are dropped at
/// once, only its depth is tracked.
pub(super) struct Node {
    pub(super) kind: Kind,
    pub(super) skipped: bool,
    depth: Cell<u64>,
    frozen: Cell<bool>,
    items: RefCell<Vec<Value>>,
}

impl Node {
    pub(super) fn new(kind: Kind, skipped: bool) -> Node {
        Node {
            kind,
            skipped,
            depth: Cell::new(1),
            frozen: Cell::new(false),
            items: RefCell::new(Vec::new()),
        }
    }

    /// Borrows the items (key, value alternating for a dict).
    pub(super) fn items(&self) -> std::cell::Ref<'_, Vec<Value>> {
        self.items.borrow()
    }

    /// The value of the string key `key` of a dict (each kept key is held
    /// once, with the last value the file set).
    pub(super) fn get(&self, key: &str) -> Option<Value> {
        let items = self.items.borrow();
        items
            .chunks_exact(2)
            .find(|kv| matches!(&kv[0], Value::Str(s) if s.as_str() == key))
            .map(|kv| kv[1].clone())
    }
}

/// Puts `new` items into `node` (an existing container being filled, or a
/// fresh one): checks that `node` is not frozen and not among `new`, freezes
/// every new item that is a node, and updates the depth.
pub(super) fn extend(node: &Rc<Node>, new: Vec<Value>, source: &str) -> Result<()> {
    if node.frozen.get() {
        return Err(ToolError::Trace {
            path: source.to_owned(),
            record: 0,
            message: format!(
                "a {} is changed after being put inside another container \
                 (recursive structures are not supported)",
                node.kind.name()
            ),
        });
    }
    let mut depth = node.depth.get();
    for v in &new {
        if let Value::Node(child) = v {
            if Rc::ptr_eq(child, node) {
                return Err(ToolError::Trace {
                    path: source.to_owned(),
                    record: 0,
                    message: format!(
                        "a {} is put inside itself (recursive structures are not supported)",
                        node.kind.name()
                    ),
                });
            }
            child.frozen.set(true);
        }
        depth = depth.max(v.depth() + 1);
    }
    if depth > MAX_NESTING {
        return Err(ToolError::Limit {
            path: source.to_owned(),
            what: "container nesting depth",
            name: "MAX_NESTING",
            asked: depth,
            limit: MAX_NESTING,
        });
    }
    node.depth.set(depth);
    if node.skipped {
        return Ok(());
    }
    let mut new = new;
    if node.kind == Kind::Dict {
        // Only the keys a trace reads are kept: an event's other keys
        // (`frames`, `compile_context`, ...) would cost memory per event.
        let mut keep = false;
        let mut i = 0;
        new.retain(|v| {
            if i % 2 == 0 {
                keep = matches!(v, Value::Str(k) if kept_key(k));
            }
            i += 1;
            keep
        });
    }
    let mut items = node.items.borrow_mut();
    if node.kind == Kind::Dict {
        // A key set again replaces its value, as in Python: a dict holds
        // each of the kept keys once, so a lookup is a short scan however
        // many times the file repeats a key.
        let mut pairs = new.into_iter();
        while let (Some(k), Some(v)) = (pairs.next(), pairs.next()) {
            let at = items
                .chunks_exact(2)
                .position(|kv| matches!((&kv[0], &k), (Value::Str(a), Value::Str(b)) if a == b));
            match at {
                Some(i) => items[2 * i + 1] = v,
                None => {
                    items.push(k);
                    items.push(v);
                }
            }
        }
    } else if items.is_empty() {
        *items = new;
    } else {
        items.extend(new);
    }
    Ok(())
}

impl Drop for Node {
    /// Iterative: children that this node alone holds are emptied into a
    /// work list instead of being dropped recursively.
    fn drop(&mut self) {
        let mut work = std::mem::take(self.items.get_mut());
        while let Some(v) = work.pop() {
            if let Value::Node(rc) = v {
                if let Ok(mut node) = Rc::try_unwrap(rc) {
                    work.append(node.items.get_mut());
                }
            }
        }
    }
}

/// Memory charged for what the reader builds, against
/// `MEMORY_PER_INPUT_BYTE × input + MEMORY_BASE_BYTES`. Charges only grow:
/// everything built is counted once, even when it is freed later.
pub(super) struct Budget {
    used: u64,
    limit: u64,
}

impl Budget {
    pub(super) fn for_input(input_len: usize) -> Budget {
        Budget {
            used: 0,
            limit: (input_len as u64)
                .saturating_mul(MEMORY_PER_INPUT_BYTE)
                .saturating_add(MEMORY_BASE_BYTES),
        }
    }

    /// Charges `bytes`, or fails once the total passes the limit.
    #[inline(always)]
    pub(super) fn charge(&mut self, bytes: u64, source: &str) -> Result<()> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limit {
            return Err(ToolError::Limit {
                path: source.to_owned(),
                what: "memory charged for decoded values, in bytes",
                name: "MEMORY_PER_INPUT_BYTE × input bytes + MEMORY_BASE_BYTES",
                asked: self.used,
                limit: self.limit,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_chains_drop_without_recursion() {
        // Built directly (bypassing the depth limit): a million-deep chain.
        let mut v = Value::None;
        for _ in 0..1_000_000 {
            let n = Node::new(Kind::List, false);
            n.items.borrow_mut().push(v);
            v = Value::Node(Rc::new(n));
        }
        drop(v);
    }

    #[test]
    fn nodes_freeze_and_refuse_themselves() {
        let a = Rc::new(Node::new(Kind::List, false));
        let b = Rc::new(Node::new(Kind::List, false));
        assert!(extend(&a, vec![Value::Node(a.clone())], "s").is_err());
        extend(&b, vec![Value::Node(a.clone())], "s").unwrap();
        assert_eq!(b.depth.get(), 2);
        assert!(extend(&a, vec![Value::Int(1)], "s").is_err());
    }
}
#[cfg(test)]
#[test]
fn values_are_two_words() {
    // The stack, the memo and every container hold values: their size is
    // most of the reader's memory.
    assert_eq!(std::mem::size_of::<Value>(), 16);
}
