//! The trace crate's integration tests in one binary, a module per topic.
//! The `cuarena` command's own tests are in `crates/cuarena-cli`.
#[cfg(feature = "cuda")]
mod gpu_replay;
// The core's GPU check: one skip line for every crate's GPU tests.
#[cfg(feature = "cuda")]
#[path = "../../../../tests/all/gpu_skip.rs"]
mod gpu_skip;
mod hostile;
mod pytorch;
mod support;
mod trace;
