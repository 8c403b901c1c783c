//! The trace readers' limits. Each is checked while reading, and going past
//! one is a [`ToolError::Limit`](crate::ToolError::Limit) that names
//! it; together they give the memory bound stated in [`crate::trace`].

/// Most bytes a trace may hold once decompressed (gzip is inflated in a
/// streaming way and stopped here; a plain file larger than this is refused
/// before it is read).
pub const MAX_DECOMPRESSED_BYTES: u64 = 4 << 30;

/// Most bytes gzip input may inflate to per compressed byte consumed so far
/// (beyond [`GZIP_RATIO_SLACK_BYTES`]): deflate reaches ~1000× only on
/// degenerate data such as a run of zeros, real traces compress 8–15×. This
/// stops a gzip bomb after a few dozen MiB instead of at
/// [`MAX_DECOMPRESSED_BYTES`].
pub const MAX_GZIP_RATIO: u64 = 256;

/// Decompressed bytes allowed before [`MAX_GZIP_RATIO`] is applied.
pub const GZIP_RATIO_SLACK_BYTES: u64 = 64 << 20;

/// Longest CSV line, in bytes (real lines are ~50).
pub const MAX_CSV_LINE_BYTES: u64 = 64 << 10;

/// Deepest nesting of pickle containers (lists, tuples, dicts, sets): a
/// snapshot nests 6 deep.
pub const MAX_NESTING: u64 = 1_000;

/// Most MARKs a pickle may have open at once (one per container being
/// filled, so at most about [`MAX_NESTING`] in a sane file).
pub const MAX_MARKS: u64 = 1_000;

/// Most entries of the pickle memo (one per object a pickler memoized).
pub const MAX_MEMO_ENTRIES: u64 = 1 << 26;

/// Widest integer a pickle may hold, in bytes of LONG1/LONG4 payload
/// (trace fields fit in 9).
pub const MAX_INT_BYTES: u64 = 64;

/// Memory the pickle reader may charge per byte of (decompressed) input for
/// the values it builds, the memo, its stacks and the events it returns.
pub const MEMORY_PER_INPUT_BYTE: u64 = 16;

/// Memory the pickle reader may charge whatever the input's size.
pub const MEMORY_BASE_BYTES: u64 = 64 << 20;

/// Largest block an `alloc` or free event (or a block of `segments`) may
/// have: 1 PiB, past any device. A larger size is a corrupt trace, refused
/// while reading, so no sum over blocks can wrap.
pub const MAX_BLOCK_BYTES: u64 = 1 << 50;
