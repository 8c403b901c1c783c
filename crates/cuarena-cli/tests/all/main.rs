//! The `cuarena` command's tests in one binary: its figures, help and exit
//! statuses (`cli`), hostile files and its memory bound (`hostile`), its
//! verdicts on the shipped snapshots (`snapshots`, `fixtures`) and the verdict's parts
//! (`verdict`). The fixtures and input builders are the trace crate's
//! (`support`).
mod cli;
mod fixtures;
#[cfg(target_os = "linux")]
mod hostile;
mod snapshots;
#[path = "../../../cuarena-trace/tests/all/support.rs"]
mod support;
mod verdict;
