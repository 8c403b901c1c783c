//! Pictures (being written).
