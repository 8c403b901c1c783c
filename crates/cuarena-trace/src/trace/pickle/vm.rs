//! The pickle virtual machine: one loop over the opcodes, no recursion, every
//! allocation charged to the [`Budget`] and every stack bounded.

use std::collections::HashMap;
use std::rc::Rc;

use super::stack::Stack;
use super::value::{extend, Budget, Kind, Node, Value};
use crate::trace::limits::MAX_MARKS;
use crate::{Result, ToolError};

/// Bytes charged per value slot (stack, container item, memo entry).
pub(super) const SLOT: u64 = std::mem::size_of::<Value>() as u64;
/// Bytes charged per container, beyond its slot.
const NODE: u64 = std::mem::size_of::<Node>() as u64 + 16;
/// Bytes charged per memo entry (hash table overhead included).
pub(super) const MEMO_ENTRY: u64 = 2 * SLOT + 16;

pub(super) struct Vm<'a> {
    pub(super) input: &'a [u8],
    pub(super) pos: usize,
    pub(super) source: &'a str,
    pub(super) stack: Stack,
    pub(super) marks: Vec<usize>,
    /// The memo: dense indices (what picklers write: MEMOIZE, sequential
    /// BINPUTs) in a vector, any others in a map.
    pub(super) memo: Vec<Value>,
    pub(super) sparse_memo: HashMap<u32, Value>,
    pub(super) budget: Budget,
}

/// A vector with room for `n` values if the process can reserve it (about
/// one memo entry per 16 bytes of a snapshot: reserved up front, where
/// untouched pages cost nothing, instead of regrown), else an empty one.
fn presized(n: usize) -> Vec<Value> {
    let mut v = Vec::new();
    let _ = v.try_reserve_exact(n);
    v
}

impl<'a> Vm<'a> {
    pub(super) fn new(input: &'a [u8], source: &'a str) -> Vm<'a> {
        Vm {
            input,
            pos: 0,
            source,
            stack: Stack::default(),
            marks: Vec::new(),
            memo: presized(input.len() / 16),
            sparse_memo: HashMap::new(),
            budget: Budget::for_input(input.len()),
        }
    }

    pub(super) fn bad(&self, message: String) -> ToolError {
        ToolError::Trace {
            path: self.source.to_owned(),
            record: 0,
            message: format!("not a valid pickle: at byte {}: {message}", self.pos),
        }
    }

    #[inline]
    pub(super) fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
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

    #[inline]
    pub(super) fn uint(&mut self, n: u64, what: &str) -> Result<u64> {
        let b = self.take(n, what)?;
        Ok(b.iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }

    #[inline(always)]
    pub(super) fn push(&mut self, v: Value) -> Result<()> {
        self.budget.charge(SLOT, self.source)?;
        self.stack.push(v);
        Ok(())
    }

    #[inline]
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

    #[inline]
    pub(super) fn top(&self, op: &str) -> Result<&Value> {
        match self.stack.values.last() {
            Some(v) if self.stack.values.len() > self.floor() => Ok(v),
            _ => Err(self.bad(format!("{op} on an empty stack"))),
        }
    }

    /// Pops the last MARK and the items above it into a new container of
    /// `kind`; for one that is built skipped they are dropped where they
    /// lie (no vector is made for them).
    fn build_from_mark(&mut self, kind: Kind, op: &str) -> Result<()> {
        let mark = *self
            .marks
            .last()
            .ok_or_else(|| self.bad(format!("{op} without a MARK")))?;
        if self.stack.skipped_after(mark) {
            if kind == Kind::Dict && (self.stack.values.len() - mark) % 2 != 0 {
                return Err(self.bad(format!("{op} with an odd number of items")));
            }
            self.marks.pop();
            self.stack.drop_to(mark);
            return self.push(Value::Skipped(kind));
        }
        let items = self.pop_mark(op)?;
        self.new_node(kind, items, op)
    }

    /// Pops the last MARK and puts the items above it into the container
    /// below them, which must be of `kind`; items for a skipped container
    /// are dropped where they lie.
    fn fill_from_mark(&mut self, kind: Kind, op: &str) -> Result<()> {
        let mark = *self
            .marks
            .last()
            .ok_or_else(|| self.bad(format!("{op} without a MARK")))?;
        if kind == Kind::Dict && (self.stack.values.len() - mark) % 2 != 0 {
            return Err(self.bad(format!("{op} with an odd number of items")));
        }
        let floor = self.marks.len().checked_sub(2).map_or(0, |i| self.marks[i]);
        let below = mark.checked_sub(1).filter(|&i| i >= floor);
        if let Some(i) = below {
            if matches!(self.stack.values[i], Value::Skipped(k) if k == kind) {
                self.marks.pop();
                self.stack.drop_to(mark);
                return Ok(());
            }
        }
        let items = self.pop_mark(op)?;
        if let Some(t) = self.target(&[kind], op)? {
            extend(&t, items, self.source)?;
        }
        Ok(())
    }

    fn pop_mark(&mut self, op: &str) -> Result<Vec<Value>> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| self.bad(format!("{op} without a MARK")))?;
        Ok(self.stack.truncate(mark))
    }

    /// The container on top of the stack, which must be of `kind`; `None`
    /// for a skipped one (what is put in it is dropped).
    fn target(&self, kind: &[Kind], op: &str) -> Result<Option<Rc<Node>>> {
        match self.top(op)? {
            Value::Node(n) if kind.contains(&n.kind) => Ok(Some(n.clone())),
            Value::Skipped(k) if kind.contains(k) => Ok(None),
            other => Err(self.bad(format!("{op} onto a {}", other.type_name()))),
        }
    }

    fn new_node(&mut self, kind: Kind, items: Vec<Value>, op: &str) -> Result<()> {
        if kind == Kind::Dict && items.len() % 2 != 0 {
            return Err(self.bad(format!("{op} with an odd number of items")));
        }
        if self.stack.next_container_skipped() {
            return self.push(Value::Skipped(kind));
        }
        self.budget.charge(NODE, self.source)?;
        let node = Rc::new(Node::new(kind, false));
        extend(&node, items, self.source)?;
        self.push(Value::Node(node))
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
                b'd' => self.build_from_mark(Kind::Dict, "DICT")?,
                b'l' => self.build_from_mark(Kind::List, "LIST")?,
                b't' => self.build_from_mark(Kind::Tuple, "TUPLE")?,
                0x91 => self.build_from_mark(Kind::Set, "FROZENSET")?,
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
                    if let Some(d) = self.target(&[Kind::Dict], "SETITEM")? {
                        extend(&d, vec![k, v], self.source)?;
                    }
                }
                b'u' => self.fill_from_mark(Kind::Dict, "SETITEMS")?,
                b'a' => {
                    let v = self.pop("APPEND")?;
                    if let Some(l) = self.target(&[Kind::List], "APPEND")? {
                        extend(&l, vec![v], self.source)?;
                    }
                }
                b'e' => self.fill_from_mark(Kind::List, "APPENDS")?,
                0x90 => self.fill_from_mark(Kind::Set, "ADDITEMS")?,
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
