//! The tensor crate's tests, one binary: views against a naive host
//! reference, dtypes, threads (drops, fragmentation at full fill,
//! concurrent launches), and the same on CUDA where a GPU is present.

mod cuda;
mod dtypes;
mod support;
mod threads;
mod views;
