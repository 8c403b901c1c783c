//! All integration tests in one binary (one link, one run), a module per topic.
mod arena;
mod gpu;
mod gpu_graph;
mod gpu_spill;
mod model;
mod spill;
mod trace;
