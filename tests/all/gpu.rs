//! GPU tests (being written).
