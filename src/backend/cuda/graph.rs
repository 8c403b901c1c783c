//! Launching user kernels with handle arguments, and CUDA graph helpers (being written).
