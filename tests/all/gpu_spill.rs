//! GPU tests of spilling (being written).
