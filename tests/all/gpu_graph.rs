//! GPU tests of device-side handle resolution and CUDA graphs (being written).
