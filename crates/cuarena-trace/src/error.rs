//! The tooling's error type, apart from the allocator's [`cuarena::Error`]:
//! a trace file that cannot be read, a verification that found bytes that
//! changed, or an arena call that failed during a replay.

/// `Result` with [`ToolError`] as its default error.
pub type Result<T, E = ToolError> = std::result::Result<T, E>;

/// What can go wrong in the trace readers and replays.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// An arena or backend call failed.
    #[error(transparent)]
    Arena(#[from] cuarena::Error),

    /// A trace file could not be read or parsed.
    #[error("trace {path}: record {record}: {message}")]
    Trace {
        /// File being read.
        path: String,
        /// 1-based line (CSV) or event index (pickle) at fault; 0 for the whole file.
        record: u64,
        /// What is wrong.
        message: String,
    },

    /// A trace file goes past one of the reader's limits (see
    /// [`crate::trace::limits`] for the limits and
    /// [`crate::trace`] for the memory bound they give).
    #[error("trace {path}: {what} reached {asked}, past the reader's limit {name} = {limit}")]
    Limit {
        /// File being read.
        path: String,
        /// What went past its limit (nesting depth, memo entries, ...).
        what: &'static str,
        /// The limit's name in [`crate::trace::limits`].
        name: &'static str,
        /// How much the file asked for when it was stopped (at least
        /// `limit + 1`, or the size it claimed).
        asked: u64,
        /// The limit.
        limit: u64,
    },

    /// Reading a trace needed more memory than the process could allocate
    /// (an allocation failed: reported, never an abort).
    #[error("trace {path}: out of memory: could not allocate {asked} bytes for {what}")]
    OutOfMemory {
        /// File being read.
        path: String,
        /// What the memory was for.
        what: &'static str,
        /// Bytes the failed allocation would have brought the total to.
        asked: u64,
    },

    /// A verification found bytes that are not what was written: a tensor
    /// lost its data (reported by the replay checks, never expected).
    #[error("data mismatch: {mismatched_words} words of {what} do not hold what was written")]
    DataMismatch {
        /// Which tensor or check.
        what: String,
        /// 32-bit words that differ.
        mismatched_words: u64,
    },

    /// An alloc/free program cannot be replayed: an op names a block the
    /// program holds no size for, or a baseline completed it at no capacity
    /// the device can give. Unlike [`ToolError::Arena`], this is not an
    /// allocator's refusal: it is what the tool was given.
    #[error("program: {reason}")]
    Program {
        /// What is wrong, and where.
        reason: String,
    },

    /// The tool was asked for something it cannot do (bad options, or its
    /// parts used together wrongly).
    #[error("{reason}")]
    Usage {
        /// What is wrong.
        reason: String,
    },
}
