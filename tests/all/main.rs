//! All integration tests in one binary (one link, one run), a module per topic.
mod trace;
mod gpu;
