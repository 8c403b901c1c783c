//! Placement (being written).
