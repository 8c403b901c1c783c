//! A framework's tensor on [`cuarena`]'s public API: a runtime
//! [`DType`](cuarena::DType), a shape and element strides over
//! reference-counted arena storage, views that share bytes (`narrow`,
//! `transpose`, `reshape`, `as_dtype`), host data in and out, and copies
//! between tensors on the device. It runs on any backend: the host backend
//! for tests, CUDA (`cuarena::backend::cuda::CudaBackend`, feature `cuda`)
//! for work.
//!
//! ```
//! use cuarena::{Arena, ArenaConfig, DType, SharedArena};
//! use cuarena_tensor::Tensor;
//!
//! // One arena for the process, shared by every thread (on a GPU:
//! // `Arena::cuda(config, 0)`; everything below is the same).
//! let arena = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
//! let x = Tensor::from_slice(&arena, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
//! // Views share the bytes: a transpose swaps strides, a narrow moves the start.
//! let xt = x.transpose(0, 1)?;
//! assert_eq!((xt.shape(), xt.strides()), (&[3, 2][..], &[1, 3][..]));
//! let y = xt.contiguous()?; // a copy, row-major
//! assert_eq!(y.to_vec::<f32>()?, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
//! // Runtime dtypes: reinterpret the same bytes, checked; typed reads check too.
//! assert_eq!(x.as_dtype(DType::U32)?.to_vec::<u32>()?[0], 1.0f32.to_bits());
//! assert!(x.to_vec::<i32>().is_err());
//! // Device copies between tensors of one arena, strided or not.
//! let z = Tensor::zeros(&arena, DType::F32, &[2, 3])?;
//! z.narrow(1, 0, 2)?.copy_from(&x.narrow(1, 1, 2)?)?;
//! assert_eq!(z.to_vec::<f32>()?, [2.0, 3.0, 0.0, 5.0, 6.0, 0.0]);
//! // A "kernel launch": arguments taken under the arena's shared lock,
//! // several threads at once (on CUDA: `arena.with_kernel_args`).
//! let bytes = arena.with(|a| a.read_bytes(&z))??;
//! assert_eq!(bytes.len(), 24);
//! // Tensors are Send: dropped on any thread, their blocks are freed at the
//! // arena's next allocation, compaction or `reclaim`.
//! std::thread::spawn(move || drop((x, xt, y, z))).join().unwrap();
//! assert_eq!((arena.reclaim()?, arena.stats().live_blocks), (3, 0));
//! # Ok::<(), cuarena_tensor::Error>(())
//! ```
//!
//! # What a tensor is
//!
//! A [`Tensor`] holds a clone of its [`SharedArena`](cuarena::SharedArena),
//! a [`StorageSlice`](cuarena::StorageSlice) of its storage (the *span*:
//! the bytes from its first element to its last, read as its dtype), and a
//! [`Layout`]: shape and strides in elements, relative to the span's start.
//! Strides are never negative and views made by these calls never name one
//! element twice. Shapes are `usize` (they index host data); the core's
//! byte and element counts are `u64`, and the conversion is lossless.
//!
//! The arena moves blocks when it compacts. A tensor never holds an
//! address: the span is a handle and a byte range, resolved when used. Kernel
//! arguments are taken under the shared lock, which compaction waits for:
//!
//! - on CUDA, `tensor.arena().with_kernel_args(stream, &[&t], |args| …)`
//!   and `args.input::<f32>(&t)` (a tensor is an [`AsRange`](cuarena::AsRange));
//!   pass [`Tensor::strides`] and the element count to the kernel;
//! - on any backend, `tensor.arena().with(|a| a.read_bytes(&t))` reads the
//!   span while nothing can move; [`Layout::offsets`] walks its elements.
//!
//! # Host data and copies
//!
//! [`Tensor::to_bytes`] and [`Tensor::to_vec`] read the span (one read) and
//! gather a strided tensor's elements on the host. [`Tensor::copy_from`]
//! copies on the device, one contiguous run at a time (one copy for two
//! contiguous tensors); a copy of more than 256 runs (a transpose, say), or
//! between overlapping views of one storage, goes through the host under
//! the arena's exclusive lock (read, gather, write back). [`Tensor::contiguous`]
//! is such a copy into a new storage.
//!
//! # Threads
//!
//! `Tensor<B>` is `Send + Sync` for the host and CUDA backends. Dropping the
//! last tensor over a storage, on any thread, queues its block for the
//! arena, which frees it at its next allocation, compaction or
//! [`reclaim`](cuarena::SharedArena::reclaim) (see `cuarena::Storage`).
//! Calls on a tensor take the arena's lock: made from inside that arena's
//! own `with`/`with_mut` closure they return [`Error::Arena`] with
//! `cuarena::Error::Reentrant` rather than wait on themselves; use the
//! closure's `Arena` there.
//!
//! # Errors
//!
//! Bad input is an [`Error`] saying what was asked and what the tensor has;
//! nothing panics on user input. The arena's errors (out of memory, a call
//! inside its own closure) are passed on as [`Error::Arena`].
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod device;
mod error;
mod layout;
mod tensor;

pub use error::{Error, Result};
pub use layout::{Layout, Offsets};
pub use tensor::Tensor;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
