//! The `cuarena` command's tests in one binary: its figures, help and exit
//! statuses (`cli`), hostile files and its memory bound (`hostile`), its
//! verdicts on the shipped snapshots (`snapshots`, `fixtures`) and the verdict's parts
//! (`verdict`). The fixtures and input builders are the test kit's
//! (`cuarena_testkit::trace`), shared with the trace crate's tests.
mod cli;
mod fixtures;
#[cfg(target_os = "linux")]
mod hostile;
mod snapshots;
mod verdict;
