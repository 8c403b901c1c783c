//! The `cuarena` command's tests in one binary: its figures, help, exit
//! statuses and memory bound (`cli`), and its verdicts on the shipped
//! snapshots (`snapshots`), the verdict's parts (`verdict`). The fixtures and input builders are the trace
//! crate's (`support`).
mod cli;
mod snapshots;
#[path = "../../../cuarena-trace/tests/all/support.rs"]
mod support;
mod verdict;
