//! The crate's error: shape and dtype checks of its own, the arena's errors
//! nested as they are.

use cuarena::DType;

/// `Result` with [`Error`] as its default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in a tensor call. Shape and dtype errors say what was
/// asked and what the tensor has; the arena's errors (out of memory, a
/// stale storage, a call made inside the arena's own closure) come through
/// unchanged as [`Error::Arena`]. A call that returns an error changed no
/// tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The arena refused a call (see [`cuarena::Error`]).
    #[error(transparent)]
    Arena(#[from] cuarena::Error),

    /// A dimension index past the tensor's rank.
    #[error("dimension {dim} is out of range for a tensor of rank {rank} (dimensions 0..{rank})")]
    DimOutOfRange {
        /// The dimension asked for.
        dim: usize,
        /// The tensor's number of dimensions.
        rank: usize,
    },

    /// `narrow` past the end of its dimension.
    #[error(
        "narrow(dim {dim}, start {start}, len {len}) needs {start} + {len} elements \
         in a dimension of {size}"
    )]
    NarrowOutOfRange {
        /// The dimension narrowed.
        dim: usize,
        /// First index asked for.
        start: usize,
        /// Elements asked for.
        len: usize,
        /// Elements the dimension has.
        size: usize,
    },

    /// A shape whose element count, byte size or strides overflow.
    #[error("shape {shape:?} of {dtype} is too large: its size in bytes overflows")]
    SizeOverflow {
        /// The shape asked for.
        shape: Vec<usize>,
        /// Its dtype.
        dtype: DType,
    },

    /// Host data of the wrong length for the shape.
    #[error(
        "{got_bytes} B of data given for a {dtype} tensor of shape {shape:?}, \
         which holds {expected_bytes} B"
    )]
    DataLength {
        /// The shape asked for.
        shape: Vec<usize>,
        /// Its dtype.
        dtype: DType,
        /// Bytes the shape holds.
        expected_bytes: u64,
        /// Bytes given.
        got_bytes: u64,
    },

    /// `reshape` to a shape with another number of elements.
    #[error("cannot reshape {from:?} ({from_numel} elements) into {to:?} ({to_numel} elements)")]
    ReshapeNumel {
        /// The tensor's shape.
        from: Vec<usize>,
        /// Its elements.
        from_numel: usize,
        /// The shape asked for.
        to: Vec<usize>,
        /// Elements of that shape (saturated at `usize::MAX`).
        to_numel: usize,
    },

    /// A call that needs a contiguous tensor got a strided view.
    #[error(
        "{op} needs a contiguous tensor, this one has shape {shape:?} and strides {strides:?} \
         (call contiguous() first)"
    )]
    NotContiguous {
        /// The call.
        op: &'static str,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// Its strides, in elements.
        strides: Vec<usize>,
    },

    /// A typed call (or a copy) whose dtype is not the tensor's.
    #[error(
        "{op}: the tensor holds {tensor}, the call asked for {requested} \
         (reinterpret it with as_dtype, or read its bytes)"
    )]
    DTypeMismatch {
        /// The call.
        op: &'static str,
        /// The tensor's dtype.
        tensor: DType,
        /// The dtype of the call (or of the other tensor).
        requested: DType,
    },

    /// Two tensors of different shapes where one shape is needed.
    #[error("{op}: shapes differ, source {src:?}, destination {dst:?}")]
    ShapeMismatch {
        /// The call.
        op: &'static str,
        /// The source's shape.
        src: Vec<usize>,
        /// The destination's shape.
        dst: Vec<usize>,
    },

    /// A copy between tensors of two arenas (device copies stay in one).
    #[error(
        "copy between arenas: the source lives in arena #{src_arena}, the destination \
         in #{dst_arena} (copy through the host: to_bytes, then from_bytes)"
    )]
    ArenaMismatch {
        /// The source's arena.
        src_arena: u64,
        /// The destination's arena.
        dst_arena: u64,
    },

    /// `as_dtype` that cannot reinterpret this layout.
    #[error(
        "cannot view a {from} tensor of shape {shape:?} and strides {strides:?} as {to}: {reason}"
    )]
    IncompatibleView {
        /// The tensor's dtype.
        from: DType,
        /// The dtype asked for.
        to: DType,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// Its strides, in elements of `from`.
        strides: Vec<usize>,
        /// What does not fit.
        reason: String,
    },
}
