//! GPU tooling: the real-bytes trace replay ([`replay`]), the pattern
//! kernels that check every tensor's bytes ([`pattern`]), and the
//! `cuMemAlloc` / CUDA memory-pool baselines it is compared with
//! ([`baselines`]).
//!
//! Besides the CUDA backend, this is the one module allowed `unsafe`: it
//! launches its own NVRTC kernels (launches are `unsafe` in cudarc: the
//! driver cannot check a kernel's parameters) and calls the memory-pool
//! driver API for the baselines. Each block says why it holds.

pub mod baselines;
pub mod pattern;
pub mod replay;
mod report;

use cuarena::backend::cuda::cudarc::driver::DriverError;

/// Maps a failed driver call of the tools to the core's `BackendError::Driver`
/// naming `call`, with the driver's `CUresult` code.
pub(crate) fn driver_err(call: &'static str) -> impl Fn(DriverError) -> cuarena::Error {
    move |e| cuarena::Error::from(cuarena::BackendError::driver(call, e))
}
