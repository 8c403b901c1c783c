//! The CUDA side of the arena that is not a method of it: kernel arguments
//! ([`KernelArgs`](crate::KernelArgs), taken by
//! `Arena::kernel_args`) and the handle table for kernels and graphs that
//! resolve handles on the device ([`graph`]). The backend knows byte ranges
//! of its region, never handles or blocks; these know both.

pub(crate) mod args;
pub mod graph;
