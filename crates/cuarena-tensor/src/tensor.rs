//! The tensor: a dtype and a layout over a span of shared storage.

use std::fmt;

use cuarena::backend::{Backend, HostBackend};
use cuarena::bytemuck;
use cuarena::{AsRange, BlockRange, DType, Element, SharedArena, Storage, StorageSlice};

use crate::device::{self, Init, Side};
use crate::error::{Error, Result};
use crate::layout::Layout;

/// A strided view of elements of one runtime [`DType`] in an arena's
/// storage (see the [crate documentation](crate)).
///
/// Cloning is cheap and shares the bytes, as do the views (`narrow`,
/// `transpose`, `reshape`, `as_dtype`): a write through one
/// ([`copy_from`](Tensor::copy_from)) is seen by every tensor over those
/// bytes. The storage's block is freed when the last tensor over it drops,
/// on whatever thread.
///
/// A tensor names its bytes ([`AsRange`]: the span from its first element
/// to its last), so it can be passed straight to the arena's calls, kernel
/// arguments included, with [`strides`](Tensor::strides) placing its
/// elements in that span.
pub struct Tensor<B: Backend = HostBackend> {
    arena: SharedArena<B>,
    /// The bytes from the first element to the last, read as `dtype`.
    span: StorageSlice,
    dtype: DType,
    layout: Layout,
}

impl<B: Backend> Clone for Tensor<B> {
    fn clone(&self) -> Self {
        Self {
            arena: self.arena.clone(),
            span: self.span.clone(),
            dtype: self.dtype,
            layout: self.layout.clone(),
        }
    }
}

impl<B: Backend> fmt::Debug for Tensor<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.layout.shape())
            .field("strides", &self.layout.strides())
            .field("storage_offset", &self.storage_offset())
            .field("arena", &self.arena.id())
            .finish()
    }
}

impl<B: Backend> AsRange for Tensor<B> {
    fn block_range(&self) -> BlockRange {
        self.span.block_range()
    }
}

/// `numel` as the core's element count.
fn count(layout: &Layout) -> u64 {
    layout.numel() as u64
}

impl<B: Backend> Tensor<B> {
    /// A new contiguous tensor and its storage.
    fn alloc(
        arena: &SharedArena<B>,
        dtype: DType,
        shape: &[usize],
        init: Init<'_>,
    ) -> Result<Self> {
        let layout = Layout::contiguous(shape, dtype)?;
        if let Init::Bytes(data) = init {
            // `contiguous` checked that this product fits.
            let expected_bytes = count(&layout) * dtype.size_bytes();
            if data.len() as u64 != expected_bytes {
                return Err(Error::DataLength {
                    shape: shape.to_vec(),
                    dtype,
                    expected_bytes,
                    got_bytes: data.len() as u64,
                });
            }
        }
        let storage = device::alloc(arena, dtype, count(&layout), init)?;
        Ok(Self {
            arena: arena.clone(),
            span: storage.whole(),
            dtype,
            layout,
        })
    }

    /// A contiguous tensor of `shape` whose bytes are whatever the arena
    /// held (fill it before reading it).
    pub fn empty(arena: &SharedArena<B>, dtype: DType, shape: &[usize]) -> Result<Self> {
        Self::alloc(arena, dtype, shape, Init::Uninit)
    }

    /// A contiguous tensor of `shape`, all bytes zero (`0`, `0.0`, `false`).
    pub fn zeros(arena: &SharedArena<B>, dtype: DType, shape: &[usize]) -> Result<Self> {
        Self::alloc(arena, dtype, shape, Init::Zeros)
    }

    /// A contiguous tensor of `shape` holding `data` in row-major order;
    /// its dtype is `T`'s ([`Error::DataLength`] unless `data` has exactly
    /// the shape's elements).
    pub fn from_slice<T: Element>(
        arena: &SharedArena<B>,
        data: &[T],
        shape: &[usize],
    ) -> Result<Self> {
        Self::from_bytes(arena, T::DTYPE, shape, bytemuck::cast_slice(data))
    }

    /// A contiguous tensor of `dtype` and `shape` holding `bytes` (the
    /// elements in row-major order, little-endian): the constructor for
    /// dtypes with no Rust element type here (`bool`, fp8).
    pub fn from_bytes(
        arena: &SharedArena<B>,
        dtype: DType,
        shape: &[usize],
        bytes: &[u8],
    ) -> Result<Self> {
        Self::alloc(arena, dtype, shape, Init::Bytes(bytes))
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Elements along each dimension.
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// Elements between neighbours along each dimension.
    pub fn strides(&self) -> &[usize] {
        self.layout.strides()
    }

    /// Shape and strides together.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Number of dimensions (0 for a scalar).
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// Bytes of its elements (`numel` times the dtype's size).
    pub fn size_bytes(&self) -> u64 {
        count(&self.layout) * self.dtype.size_bytes()
    }

    /// The arena it lives in: where kernel arguments for it are taken.
    pub fn arena(&self) -> &SharedArena<B> {
        &self.arena
    }

    /// The storage it is a view of (shared with every view of it).
    pub fn storage(&self) -> &Storage {
        self.span.storage()
    }

    /// The bytes from its first element to its last, read as its dtype:
    /// what [`AsRange`] names.
    pub fn span(&self) -> &StorageSlice {
        &self.span
    }

    /// Its first element's place in the storage, in elements of its dtype.
    pub fn storage_offset(&self) -> u64 {
        self.span.offset_bytes() / self.dtype.size_bytes()
    }

    /// True when its elements are packed in row-major order (the span is
    /// exactly its elements).
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// A view with `layout` over elements `offset..offset + extent` of
    /// this span, read as `dtype`.
    fn view(&self, layout: Layout, offset: usize) -> Result<Self> {
        let (start, len) = (offset as u64, layout.extent() as u64);
        Ok(Self {
            arena: self.arena.clone(),
            span: self.span.slice(start..start + len)?,
            dtype: self.dtype,
            layout,
        })
    }

    /// A view of elements `start..start + len` of dimension `dim`.
    /// [`Error::DimOutOfRange`], [`Error::NarrowOutOfRange`].
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Self> {
        let (layout, offset) = self.layout.narrow(dim, start, len)?;
        self.view(layout, offset)
    }

    /// A view with dimensions `d0` and `d1` swapped (no copy: the strides
    /// swap). [`Error::DimOutOfRange`].
    pub fn transpose(&self, d0: usize, d1: usize) -> Result<Self> {
        let layout = self.layout.transpose(d0, d1)?;
        self.view(layout, 0)
    }

    /// A view of the same elements in `shape`, for a contiguous tensor
    /// ([`Error::NotContiguous`]: call [`contiguous`](Tensor::contiguous)
    /// first) with as many elements ([`Error::ReshapeNumel`]).
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        let layout = self.layout.reshape(shape, self.dtype)?;
        self.view(layout, 0)
    }

    /// The same bytes read as `dtype`, without a copy (a framework's
    /// `view(dtype)`): the last dimension's size scales by the ratio of
    /// element sizes. When sizes differ, the last dimension needs stride 1,
    /// and a larger dtype needs whole, aligned elements
    /// ([`Error::IncompatibleView`]).
    pub fn as_dtype(&self, dtype: DType) -> Result<Self> {
        let layout = self
            .layout
            .reinterpret(self.dtype, dtype, self.span.offset_bytes())?;
        Ok(Self {
            arena: self.arena.clone(),
            span: self.span.as_dtype(dtype)?,
            dtype,
            layout,
        })
    }

    /// A contiguous tensor with these elements: this one (shared, no copy)
    /// when it already is contiguous, else a new storage filled by
    /// [`copy_from`](Tensor::copy_from).
    pub fn contiguous(&self) -> Result<Self> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let out = Self::empty(&self.arena, self.dtype, self.shape())?;
        out.copy_from(self)?;
        Ok(out)
    }

    /// Its elements in row-major order, as bytes (little-endian).
    /// A strided tensor's span is read and gathered on the host.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let span = device::read(&self.arena, &self.span)?;
        if self.is_contiguous() {
            return Ok(span);
        }
        let e = self.dtype.size_bytes() as usize;
        let mut out = Vec::with_capacity(self.numel() * e);
        for o in self.layout.offsets() {
            out.extend_from_slice(&span[o * e..(o + 1) * e]);
        }
        Ok(out)
    }

    /// Its elements in row-major order as `T`s: [`Error::DTypeMismatch`]
    /// unless `T` is its dtype (reinterpret with
    /// [`as_dtype`](Tensor::as_dtype) first, or read
    /// [`to_bytes`](Tensor::to_bytes)).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_dtype("to_vec", T::DTYPE)?;
        let bytes = self.to_bytes()?;
        let mut out = vec![T::zeroed(); self.numel()];
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes);
        Ok(out)
    }

    /// Copies `src`'s elements into this tensor's, on the device: same
    /// arena ([`Error::ArenaMismatch`]), dtype ([`Error::DTypeMismatch`])
    /// and shape ([`Error::ShapeMismatch`]). Strided tensors are copied one
    /// run of elements contiguous in both at a time, under one exclusive
    /// lock; with more than 256 runs, or when the two overlap in one
    /// storage, through the host instead (read, gather, write back, under
    /// the arena's exclusive lock: overlapping copies read everything
    /// first). Every tensor over the destination's bytes sees the new
    /// values.
    pub fn copy_from(&self, src: &Tensor<B>) -> Result<()> {
        if src.arena.id() != self.arena.id() {
            return Err(Error::ArenaMismatch {
                src_arena: src.arena.id(),
                dst_arena: self.arena.id(),
            });
        }
        self.check_dtype("copy_from", src.dtype)?;
        if src.shape() != self.shape() {
            return Err(Error::ShapeMismatch {
                op: "copy_from",
                src: src.shape().to_vec(),
                dst: self.shape().to_vec(),
            });
        }
        let elem_bytes = self.dtype.size_bytes() as usize;
        device::copy(&self.arena, src.side(), self.side(), elem_bytes)
    }

    fn side(&self) -> Side<'_> {
        Side {
            span: &self.span,
            layout: &self.layout,
        }
    }

    fn check_dtype(&self, op: &'static str, requested: DType) -> Result<()> {
        if requested == self.dtype {
            Ok(())
        } else {
            Err(Error::DTypeMismatch {
                op,
                tensor: self.dtype,
                requested,
            })
        }
    }
}
