//! Opcode operands that allocate: integers, strings, bytes and the memo;
//! each checked against its limit and charged to the budget.

use std::rc::Rc;

use super::value::Value;
use super::vm::{Vm, MEMO_ENTRY};
use crate::trace::limits::{MAX_INT_BYTES, MAX_MEMO_ENTRIES};
use crate::{Result, ToolError};

impl Vm<'_> {
    pub(super) fn int(&mut self, n: u64, op: &str) -> Result<()> {
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
            i64::try_from(v).map_or_else(|_| Value::Wide(Box::new(v)), Value::Int)
        };
        self.push(v)
    }

    pub(super) fn text(&mut self, n: u64, op: &str) -> Result<()> {
        let b = self.take(n, op)?;
        self.budget.charge(n + 16, self.source)?;
        let s = Rc::new(String::from_utf8_lossy(b).into_owned());
        self.push(Value::Str(s))
    }

    pub(super) fn bytes(&mut self, n: u64, op: &str) -> Result<()> {
        let b = self.take(n, op)?;
        self.budget.charge(n + 16, self.source)?;
        self.push(Value::Bytes(Rc::new(b.to_vec())))
    }

    #[inline]
    pub(super) fn memo_put(&mut self, index: u64) -> Result<()> {
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

    #[inline]
    pub(super) fn memo_get(&mut self, index: u64) -> Result<()> {
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
}
