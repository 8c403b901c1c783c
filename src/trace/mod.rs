//! Allocation traces (being written).
