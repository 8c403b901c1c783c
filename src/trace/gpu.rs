//! Trace replay on the GPU (being written).
