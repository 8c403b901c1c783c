//! Pattern fill and check kernels for GPU trace replay (being written).
