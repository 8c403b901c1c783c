//! Real allocator baselines for trace replay: a capped CUDA memory pool and plain cuMemAlloc (being written).
