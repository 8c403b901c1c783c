//! The memory budget of the stages after reading: the alloc/free program,
//! the allocator models and the replays are charged, each, against the
//! budget the reader had, `MEMORY_PER_INPUT_BYTE × input bytes +
//! MEMORY_BASE_BYTES` (see [`super::limits`]), and grow their vectors with
//! fallible reservations: a file whose events would need more is an error
//! that names the limit, never an abort.

use super::limits::{MEMORY_BASE_BYTES, MEMORY_PER_INPUT_BYTE};
use crate::ToolError;

/// The limit's name in errors.
pub(crate) const BUDGET_NAME: &str = "MEMORY_PER_INPUT_BYTE × input bytes + MEMORY_BASE_BYTES";

/// The memory budget of one stage after reading: bytes charged so far
/// against the limit (a clone starts from the same count). Get one from
/// [`super::Trace::memory_budget`].
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    used: u64,
    limit: u64,
    source: String,
}

impl MemoryBudget {
    /// The budget of a stage working on a trace of `input_bytes`
    /// (decompressed) read from `source`.
    pub fn for_input(input_bytes: u64, source: &str) -> MemoryBudget {
        MemoryBudget {
            used: 0,
            limit: input_bytes
                .saturating_mul(MEMORY_PER_INPUT_BYTE)
                .saturating_add(MEMORY_BASE_BYTES),
            source: source.to_owned(),
        }
    }

    /// The same budget with a limit of `limit` bytes (tests).
    #[cfg(test)]
    pub(crate) fn with_limit(mut self, limit: u64) -> MemoryBudget {
        self.limit = limit;
        self
    }

    /// The limit, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The error for `asked` bytes of `what`.
    pub(crate) fn exceeded(&self, what: &'static str, asked: u64) -> ToolError {
        ToolError::Limit {
            path: self.source.clone(),
            what,
            name: BUDGET_NAME,
            asked,
            limit: self.limit,
        }
    }

    /// Charges `bytes` for `what`, or fails once the total passes the limit.
    pub(crate) fn charge(&mut self, bytes: u64, what: &'static str) -> crate::Result<()> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limit {
            return Err(self.exceeded(what, self.used));
        }
        Ok(())
    }

    /// Room for `additional` more items in `v`: when it is full, its
    /// capacity grows by at least a half (or `additional`) with a fallible
    /// reservation, and the new capacity is charged.
    pub(crate) fn reserve<T>(
        &mut self,
        v: &mut Vec<T>,
        additional: usize,
        what: &'static str,
    ) -> crate::Result<()> {
        if v.capacity() - v.len() >= additional {
            return Ok(());
        }
        let grow = additional.max(v.len() / 2).max(16);
        let bytes = (grow as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        self.charge(bytes, what)?;
        v.try_reserve_exact(grow)
            .map_err(|_| ToolError::OutOfMemory {
                path: self.source.clone(),
                what,
                asked: self.used,
            })
    }

    /// A vector of `n` copies of `value`, charged and fallibly allocated.
    pub(crate) fn vec_of<T: Clone>(
        &mut self,
        n: usize,
        value: T,
        what: &'static str,
    ) -> crate::Result<Vec<T>> {
        let mut v = Vec::new();
        self.reserve(&mut v, n, what)?;
        v.resize(n, value);
        Ok(v)
    }
}
