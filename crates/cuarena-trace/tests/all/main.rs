//! The trace crate's integration tests in one binary, a module per topic.
//! The `cuarena` command's own tests are in `crates/cuarena-cli`. The
//! recorded traces and the input builders they share with it are the test
//! kit's (`cuarena_testkit::trace`).
#[cfg(feature = "cuda")]
mod gpu_replay;
mod hostile;
mod pytorch;
mod trace;
