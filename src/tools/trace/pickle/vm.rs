//! The pickle virtual machine: one loop over the opcodes, no recursion, every
//! allocation charged to the [`Budget`] and every stack bounded.

use std::collections::HashMap;
use std::rc::Rc;

use super::value::{extend, Budget, Kind, Node, Value};
use crate::tools::trace::limits::{MAX_INT_BYTES, MAX_MARKS, MAX_MEMO_ENTRIES};
use crate::tools::{Result, ToolError};

/// Bytes charged per value slot (stack, container item, memo entry).
const SLOT: u64 = std::mem::size_of::<Value>() as u64;
/// Bytes charged per container, beyond its slot.
const NODE: u64 = std::mem::size_of::<Node>() as u64 + 16;
/// Bytes charged per memo entry (hash table overhead included).
const MEMO_ENTRY: u64 = 2 * SLOT + 16;

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
struct Stack {
    values: Vec<Value>,
    skipped: Vec<bool>,
}

impl Stack {
    fn push(&mut self, v: Value) {
        let skipped = match &v {
            Value::Node(n) => n.skipped,
            _ => self.skipped.last().copied().unwrap_or(false),
        };
        self.values.push(v);
        self.skipped.push(skipped);
    }

    fn truncate(&mut self, len: usize) -> Vec<Value> {
        self.skipped.truncate(len);
        self.values.split_off(len)
    }

    /// Whether a container made now should be skipped: after a key that is
    /// not needed, or inside a skipped container.
    fn next_container_skipped(&self) -> bool {
        match self.values.last() {
            Some(Value::Str(k)) => !NEEDED_KEYS.contains(&&**k),
            Some(_) => self.skipped.last().copied().unwrap_or(false),
            None => false,
        }
    }
}

pub(super) struct Vm<'a> {
    input: &'a [u8],
    pos: usize,
    source: &'a str,
    stack: Stack,
    marks: Vec<usize>,
    /// The memo: dense indices (what picklers write: MEMOIZE, sequential
    /// BINPUTs) in a vector, any others in a map.
    memo: Vec<Value>,
    sparse_memo: HashMap<u32, Value>,
    pub(super) budget: Budget,
}

impl<'a> Vm<'a> {
    pub(super) fn new(input: &'a [u8], source: &'a str) -> Vm<'a> {
        Vm {
            input,
            pos: 0,
            source,
            stack: Stack::default(),
            marks: Vec::new(),
            memo: Vec::new(),
            sparse_memo: HashMap::new(),
            budget: Budget::for_input(input.len()),
        }
    }

    fn bad(&self, message: String) -> ToolError {
        ToolError::Trace {
            path: self.source.to_owned(),
            record: 0,
            message: format!("not a valid pickle: at byte {}: {message}", self.pos),
        }
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let left = self.input.len() - self.pos;
        if n > left as u64 {
            return Err(self.bad(format!(
                "{what} claims {n} bytes but only {left} remain (truncated file?)"
            )));
        }
        let s = &self.input[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn uint(&mut self, n: u64, what: &str) -> Result<u64> {
        let b = self.take(n, what)?;
        Ok(b.iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }

    fn push(&mut self, v: Value) -> Result<()> {
        self.budget.charge(SLOT, self.source)?;
        self.stack.push(v);
        Ok(())
    }

    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self, op: &str) -> Result<Value> {
        if self.stack.values.len() <= self.floor() {
            return Err(self.bad(format!("{op} on an empty stack")));
        }
        self.stack.skipped.pop();
        self.stack
            .values
            .pop()
            .ok_or_else(|| self.bad(format!("{op} on an empty stack")))
    }

    fn top(&self, op: &str) -> Result<&Value> {
        match self.stack.values.last() {
            Some(v) if self.stack.values.len() > self.floor() => Ok(v),
            _ => Err(self.bad(format!("{op} on an empty stack"))),
        }
    }

    fn pop_mark(&mut self, op: &str) -> Result<Vec<Value>> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| self.bad(format!("{op} without a MARK")))?;
        Ok(self.stack.truncate(mark))
    }

    /// The container on top of the stack, which must be of `kind`.
    fn target(&self, kind: &[Kind], op: &str) -> Result<Rc<Node>> {
        match self.top(op)? {
            Value::Node(n) if kind.contains(&n.kind) => Ok(n.clone()),
            other => Err(self.bad(format!("{op} onto a {}", other.type_name()))),
        }
    }

    fn new_node(&mut self, kind: Kind, items: Vec<Value>, op: &str) -> Result<()> {
        if kind == Kind::Dict && items.len() % 2 != 0 {
            return Err(self.bad(format!("{op} with an odd number of items")));
        }
        self.budget.charge(NODE, self.source)?;
        let node = Rc::new(Node::new(kind, self.stack.next_container_skipped()));
        extend(&node, items, self.source)?;
        self.push(Value::Node(node))
    }

    fn int(&mut self, n: u64, op: &str) -> Result<()> {
        if n > MAX_INT_BYTES {
            return Err(ToolError::Limit {
                path: self.source.to_owned(),
                what: "integer width in bytes",
                name: "MAX_INT_BYTES",
                asked: n,
                limit: MAX_INT_BYTES,
            });
        }
        let b = self.take(n, op)?;
        let v = if b.len() > 16 {
            Value::Huge
        } else {
            let negative = b.last().is_some_and(|&x| x & 0x80 != 0);
            let fill: i128 = if negative { -1 } else { 0 };
            let v = b
                .iter()
                .rev()
                .fold(fill, |acc, &x| (acc << 8) | i128::from(x));
            i64::try_from(v).map_or(Value::Wide(v), Value::Int)
        };
        self.push(v)
    }

    fn text(&mut self, n: u64, op: &str) -> Result<()> {
        let b = self.take(n, op)?;
        self.budget.charge(n + 16, self.source)?;
        let s: Rc<str> = String::from_utf8_lossy(b).into();
        self.push(Value::Str(s))
    }

    fn bytes(&mut self, n: u64, op: &str) -> Result<()> {
        let b = self.take(n, op)?;
        self.budget.charge(n + 16, self.source)?;
        self.push(Value::Bytes(b.into()))
    }

    fn memo_put(&mut self, index: u64) -> Result<()> {
        let v = self.top("memo put")?.clone();
        let index = u32::try_from(index).map_err(|_| self.bad("memo index past u32".into()))?;
        let i = index as usize;
        if i < self.memo.len() {
            self.memo[i] = v;
            return Ok(());
        }
        if let Some(slot) = self.sparse_memo.get_mut(&index) {
            *slot = v;
            return Ok(());
        }
        let entries = (self.memo.len() + self.sparse_memo.len()) as u64;
        if entries >= MAX_MEMO_ENTRIES {
            return Err(ToolError::Limit {
                path: self.source.to_owned(),
                what: "memo entries",
                name: "MAX_MEMO_ENTRIES",
                asked: entries + 1,
                limit: MAX_MEMO_ENTRIES,
            });
        }
        self.budget.charge(MEMO_ENTRY, self.source)?;
        if i == self.memo.len() {
            self.memo.push(v);
        } else {
            self.sparse_memo.insert(index, v);
        }
        Ok(())
    }

    fn memo_get(&mut self, index: u64) -> Result<()> {
        let v = u32::try_from(index)
            .ok()
            .and_then(|i| {
                self.memo
                    .get(i as usize)
                    .or_else(|| self.sparse_memo.get(&i))
            })
            .cloned()
            .ok_or_else(|| self.bad(format!("memo get of {index}, never put")))?;
        self.push(v)
    }

    /// Runs to STOP and returns the pickled value.
    pub(super) fn run(mut self) -> Result<(Value, Budget)> {
        loop {
            let op = *self
                .input
                .get(self.pos)
                .ok_or_else(|| self.bad("ends without STOP (truncated file?)".into()))?;
            self.pos += 1;
            match op {
                0x80 => {
                    let p = self.uint(1, "PROTO")?;
                    if p > 5 {
                        return Err(self.bad(format!("unsupported pickle protocol {p}")));
                    }
                }
                0x95 => {
                    self.uint(8, "FRAME")?;
                }
                b'.' => {
                    let v = self.pop("STOP")?;
                    return Ok((v, self.budget));
                }
                b'(' => {
                    if self.marks.len() as u64 >= MAX_MARKS {
                        return Err(ToolError::Limit {
                            path: self.source.to_owned(),
                            what: "open MARKs",
                            name: "MAX_MARKS",
                            asked: self.marks.len() as u64 + 1,
                            limit: MAX_MARKS,
                        });
                    }
                    self.budget.charge(8, self.source)?;
                    self.marks.push(self.stack.values.len());
                }
                b'1' => {
                    self.pop_mark("POP_MARK")?;
                }
                b'0' => {
                    if self.stack.values.len() > self.floor() {
                        self.pop("POP")?;
                    } else {
                        self.pop_mark("POP")?;
                    }
                }
                b'2' => {
                    let v = self.top("DUP")?.clone();
                    self.push(v)?;
                }
                b'}' => self.new_node(Kind::Dict, Vec::new(), "EMPTY_DICT")?,
                b']' => self.new_node(Kind::List, Vec::new(), "EMPTY_LIST")?,
                b')' => self.new_node(Kind::Tuple, Vec::new(), "EMPTY_TUPLE")?,
                0x8f => self.new_node(Kind::Set, Vec::new(), "EMPTY_SET")?,
                b'd' => {
                    let items = self.pop_mark("DICT")?;
                    self.new_node(Kind::Dict, items, "DICT")?;
                }
                b'l' => {
                    let items = self.pop_mark("LIST")?;
                    self.new_node(Kind::List, items, "LIST")?;
                }
                b't' => {
                    let items = self.pop_mark("TUPLE")?;
                    self.new_node(Kind::Tuple, items, "TUPLE")?;
                }
                0x91 => {
                    let items = self.pop_mark("FROZENSET")?;
                    self.new_node(Kind::Set, items, "FROZENSET")?;
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop("TUPLEn")?);
                    }
                    items.reverse();
                    self.new_node(Kind::Tuple, items, "TUPLEn")?;
                }
                b's' => {
                    let v = self.pop("SETITEM")?;
                    let k = self.pop("SETITEM")?;
                    let d = self.target(&[Kind::Dict], "SETITEM")?;
                    extend(&d, vec![k, v], self.source)?;
                }
                b'u' => {
                    let items = self.pop_mark("SETITEMS")?;
                    if items.len() % 2 != 0 {
                        return Err(self.bad("SETITEMS with an odd number of items".into()));
                    }
                    let d = self.target(&[Kind::Dict], "SETITEMS")?;
                    extend(&d, items, self.source)?;
                }
                b'a' => {
                    let v = self.pop("APPEND")?;
                    let l = self.target(&[Kind::List], "APPEND")?;
                    extend(&l, vec![v], self.source)?;
                }
                b'e' => {
                    let items = self.pop_mark("APPENDS")?;
                    let l = self.target(&[Kind::List], "APPENDS")?;
                    extend(&l, items, self.source)?;
                }
                0x90 => {
                    let items = self.pop_mark("ADDITEMS")?;
                    let s = self.target(&[Kind::Set], "ADDITEMS")?;
                    extend(&s, items, self.source)?;
                }
                b'N' => self.push(Value::None)?,
                0x88 => self.push(Value::Bool(true))?,
                0x89 => self.push(Value::Bool(false))?,
                b'J' => {
                    let v = self.uint(4, "BININT")? as u32 as i32;
                    self.push(Value::Int(i64::from(v)))?;
                }
                b'K' => {
                    let v = self.uint(1, "BININT1")?;
                    self.push(Value::Int(v as i64))?;
                }
                b'M' => {
                    let v = self.uint(2, "BININT2")?;
                    self.push(Value::Int(v as i64))?;
                }
                0x8a => {
                    let n = self.uint(1, "LONG1")?;
                    self.int(n, "LONG1")?;
                }
                0x8b => {
                    let n = self.uint(4, "LONG4")? as u32 as i32;
                    let n = u64::try_from(n)
                        .map_err(|_| self.bad(format!("LONG4 of negative length {n}")))?;
                    self.int(n, "LONG4")?;
                }
                b'G' => {
                    let b = self.take(8, "BINFLOAT")?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.push(Value::Float(f64::from_be_bytes(a)))?;
                }
                0x8c | b'U' => {
                    let n = self.uint(1, "SHORT_BINUNICODE")?;
                    self.text(n, "SHORT_BINUNICODE")?;
                }
                b'X' | b'T' => {
                    let n = self.uint(4, "BINUNICODE")?;
                    self.text(n, "BINUNICODE")?;
                }
                0x8d => {
                    let n = self.uint(8, "BINUNICODE8")?;
                    self.text(n, "BINUNICODE8")?;
                }
                b'C' => {
                    let n = self.uint(1, "SHORT_BINBYTES")?;
                    self.bytes(n, "SHORT_BINBYTES")?;
                }
                b'B' => {
                    let n = self.uint(4, "BINBYTES")?;
                    self.bytes(n, "BINBYTES")?;
                }
                0x8e | 0x96 => {
                    let n = self.uint(8, "BINBYTES8")?;
                    self.bytes(n, "BINBYTES8")?;
                }
                0x94 => {
                    let index = self.memo.len() as u64;
                    self.memo_put(index)?;
                }
                b'q' => {
                    let i = self.uint(1, "BINPUT")?;
                    self.memo_put(i)?;
                }
                b'r' => {
                    let i = self.uint(4, "LONG_BINPUT")?;
                    self.memo_put(i)?;
                }
                b'h' => {
                    let i = self.uint(1, "BINGET")?;
                    self.memo_get(i)?;
                }
                b'j' => {
                    let i = self.uint(4, "LONG_BINGET")?;
                    self.memo_get(i)?;
                }
                // Objects are accepted and kept opaque: a snapshot holds
                // none, but they may sit in parts the reader ignores.
                0x93 => {
                    self.pop("STACK_GLOBAL")?;
                    self.pop("STACK_GLOBAL")?;
                    self.push(Value::Object)?;
                }
                b'R' | 0x81 => {
                    self.pop("REDUCE")?;
                    self.pop("REDUCE")?;
                    self.push(Value::Object)?;
                }
                0x92 => {
                    for _ in 0..3 {
                        self.pop("NEWOBJ_EX")?;
                    }
                    self.push(Value::Object)?;
                }
                b'b' => {
                    self.pop("BUILD")?;
                    self.top("BUILD")?;
                }
                other => {
                    self.pos -= 1;
                    return Err(self.bad(format!("unsupported opcode 0x{other:02x}")));
                }
            }
        }
    }
}
