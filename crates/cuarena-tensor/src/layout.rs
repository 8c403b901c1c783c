//! Shape and stride arithmetic, with no arena in sight.

use cuarena::DType;

use crate::error::{Error, Result};

/// Shape and strides of a tensor, in elements.
///
/// A layout places a tensor's elements relative to the first element of
/// its span (the bytes [`Tensor::span`](crate::Tensor::span) names):
/// element `[i0, i1, …]` is `i0 * strides[0] + i1 * strides[1] + …`
/// elements past it. Strides are never negative, so the span starts at the
/// tensor's element `[0, 0, …]`, and no two indices of a tensor made by
/// this crate's calls name one element.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
}

/// Row-major strides of `shape`, `None` when they overflow. A dimension of
/// size 0 counts as 1 here (as frameworks do), so an empty tensor's strides
/// are those of the same shape with its zeros made ones.
fn row_major(shape: &[usize]) -> Option<Vec<usize>> {
    let mut strides = vec![0; shape.len()];
    let mut next = 1usize;
    for (s, &n) in strides.iter_mut().zip(shape).rev() {
        *s = next;
        next = next.checked_mul(n.max(1))?;
    }
    Some(strides)
}

impl Layout {
    /// A row-major layout of `shape` for `dtype`: [`Error::SizeOverflow`]
    /// when its elements, strides or bytes overflow.
    pub(crate) fn contiguous(shape: &[usize], dtype: DType) -> Result<Layout> {
        let overflow = || Error::SizeOverflow {
            shape: shape.to_vec(),
            dtype,
        };
        let strides = row_major(shape).ok_or_else(overflow)?;
        let numel = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(overflow)?;
        (numel as u64)
            .checked_mul(dtype.size_bytes())
            .ok_or_else(overflow)?;
        Ok(Layout {
            shape: shape.to_vec(),
            strides,
        })
    }

    /// Elements along each dimension.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Elements between neighbours along each dimension.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Number of dimensions (0 for a scalar).
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (1 for a scalar, 0 when a dimension is 0).
    pub fn numel(&self) -> usize {
        // Bounded by the storage the layout came from: cannot overflow.
        self.shape.iter().product()
    }

    /// True when the elements are packed in row-major order with no gaps
    /// (dimensions of size 1 may have any stride; an empty tensor is
    /// contiguous).
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1usize;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n != 1 {
                if s != expected {
                    return false;
                }
                expected *= n;
            }
        }
        true
    }

    /// Elements from the first to the last, both included: the length of
    /// the tensor's span (its `numel` when contiguous, 0 when empty).
    pub fn extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        1 + self
            .shape
            .iter()
            .zip(&self.strides)
            .map(|(&n, &s)| (n - 1) * s)
            .sum::<usize>()
    }

    /// Offsets of the elements (in elements, from the first of the span) in
    /// row-major index order: what a host-side kernel walks.
    pub fn offsets(&self) -> Offsets<'_> {
        Offsets {
            layout: self,
            index: vec![0; self.rank()],
            offset: 0,
            remaining: self.numel(),
        }
    }

    fn check_dim(&self, dim: usize) -> Result<()> {
        if dim < self.rank() {
            Ok(())
        } else {
            Err(Error::DimOutOfRange {
                dim,
                rank: self.rank(),
            })
        }
    }

    /// Elements `start..start + len` of dimension `dim`: the new layout and
    /// the offset of its first element in this one.
    pub(crate) fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<(Layout, usize)> {
        self.check_dim(dim)?;
        let size = self.shape[dim];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::NarrowOutOfRange {
                dim,
                start,
                len,
                size,
            });
        }
        let mut out = self.clone();
        out.shape[dim] = len;
        let offset = if out.numel() == 0 {
            0
        } else {
            start * self.strides[dim]
        };
        Ok((out, offset))
    }

    /// Dimensions `d0` and `d1` swapped.
    pub(crate) fn transpose(&self, d0: usize, d1: usize) -> Result<Layout> {
        self.check_dim(d0)?;
        self.check_dim(d1)?;
        let mut out = self.clone();
        out.shape.swap(d0, d1);
        out.strides.swap(d0, d1);
        Ok(out)
    }

    /// The same elements in `shape`, row-major: needs a contiguous layout
    /// and the same number of elements.
    pub(crate) fn reshape(&self, shape: &[usize], dtype: DType) -> Result<Layout> {
        if !self.is_contiguous() {
            return Err(Error::NotContiguous {
                op: "reshape",
                shape: self.shape.clone(),
                strides: self.strides.clone(),
            });
        }
        let to_numel = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .unwrap_or(usize::MAX);
        if to_numel != self.numel() {
            return Err(Error::ReshapeNumel {
                from: self.shape.clone(),
                from_numel: self.numel(),
                to: shape.to_vec(),
                to_numel,
            });
        }
        Layout::contiguous(shape, dtype)
    }

    /// This layout of `from` elements read as `to` elements (a bitcast, as
    /// a framework's `view(dtype)`): the last dimension scales by the ratio
    /// of sizes and must have stride 1 when sizes differ; the other strides
    /// and the first element's place (`offset_bytes` in the storage) must
    /// fall on whole `to` elements.
    pub(crate) fn reinterpret(&self, from: DType, to: DType, offset_bytes: u64) -> Result<Layout> {
        let (fs, ts) = (from.size_bytes(), to.size_bytes());
        let refuse = |reason: String| Error::IncompatibleView {
            from,
            to,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            reason,
        };
        if fs == ts {
            return Ok(self.clone());
        }
        let Some(last) = self.rank().checked_sub(1) else {
            return Err(refuse(
                "a scalar (rank 0) cannot change its element size".to_string(),
            ));
        };
        if self.shape[last] > 1 && self.strides[last] != 1 {
            return Err(refuse(format!(
                "its last dimension has stride {}, and changing the element size needs stride 1",
                self.strides[last]
            )));
        }
        let mut out = self.clone();
        out.strides[last] = 1;
        if fs > ts {
            // Each element becomes `r` smaller ones.
            let r = usize::try_from(fs / ts).unwrap_or(usize::MAX);
            let scaled = |n: usize| n.checked_mul(r);
            let overflow = || Error::SizeOverflow {
                shape: self.shape.clone(),
                dtype: to,
            };
            out.shape[last] = scaled(out.shape[last]).ok_or_else(overflow)?;
            for s in &mut out.strides[..last] {
                *s = scaled(*s).ok_or_else(overflow)?;
            }
            return Ok(out);
        }
        // Every `r` elements become one larger one.
        let r = usize::try_from(ts / fs).unwrap_or(usize::MAX);
        if out.shape[last] % r != 0 {
            return Err(refuse(format!(
                "its last dimension's {} elements are not a whole number of {to} elements \
                 ({r} {from} each)",
                out.shape[last]
            )));
        }
        if offset_bytes % ts != 0 {
            return Err(refuse(format!(
                "its first element is at byte {offset_bytes} of the storage, \
                 not on a {ts}-byte {to} boundary"
            )));
        }
        out.shape[last] /= r;
        for (d, s) in out.strides[..last].iter_mut().enumerate() {
            if self.shape[d] > 1 && *s % r != 0 {
                return Err(refuse(format!(
                    "dimension {d}'s stride of {s} {from} elements is not a whole number of \
                     {to} elements"
                )));
            }
            *s /= r;
        }
        Ok(out)
    }
}

/// The element offsets of a [`Layout`] in row-major index order, from
/// [`Layout::offsets`].
#[derive(Debug, Clone)]
pub struct Offsets<'a> {
    layout: &'a Layout,
    index: Vec<usize>,
    offset: usize,
    remaining: usize,
}

impl Iterator for Offsets<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        self.remaining = self.remaining.checked_sub(1)?;
        let at = self.offset;
        // The odometer: bump the last index, carrying into earlier ones.
        for d in (0..self.index.len()).rev() {
            self.index[d] += 1;
            self.offset += self.layout.strides[d];
            if self.index[d] < self.layout.shape[d] {
                break;
            }
            self.offset -= self.layout.shape[d] * self.layout.strides[d];
            self.index[d] = 0;
        }
        Some(at)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Offsets<'_> {}

/// A copy between two layouts of one shape, cut into runs of elements
/// contiguous in both: `count` runs of `run` elements, at the offsets
/// [`Runs::try_for_each`] gives.
#[derive(Debug, Clone)]
pub(crate) struct Runs {
    /// The dimensions outside the runs, with each side's strides.
    outer: Vec<(usize, usize, usize)>,
    run: usize,
    count: usize,
}

impl Runs {
    /// The runs of a copy from `src` to `dst`, which have one shape.
    pub(crate) fn new(src: &Layout, dst: &Layout) -> Runs {
        debug_assert_eq!(src.shape, dst.shape);
        // Dimensions of size 1 place nothing; the rest, innermost first,
        // join the run while both sides are dense across them.
        let mut dims: Vec<(usize, usize, usize)> = src
            .shape
            .iter()
            .zip(src.strides.iter().zip(&dst.strides))
            .filter(|(&n, _)| n != 1)
            .map(|(&n, (&a, &b))| (n, a, b))
            .collect();
        if src.numel() == 0 {
            return Runs {
                outer: Vec::new(),
                run: 0,
                count: 0,
            };
        }
        let mut run = 1usize;
        while let Some(&(n, a, b)) = dims.last() {
            if a != run || b != run {
                break;
            }
            run *= n;
            dims.pop();
        }
        let count = dims.iter().map(|&(n, _, _)| n).product();
        Runs {
            outer: dims,
            run,
            count,
        }
    }

    /// Elements per run.
    pub(crate) fn run(&self) -> usize {
        self.run
    }

    /// Number of runs (0 for an empty tensor).
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Calls `f(src_offset, dst_offset)` for each run, in row-major order,
    /// stopping at the first error.
    pub(crate) fn try_for_each<E>(
        &self,
        mut f: impl FnMut(usize, usize) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let mut index = vec![0usize; self.outer.len()];
        let (mut a, mut b) = (0usize, 0usize);
        for _ in 0..self.count {
            f(a, b)?;
            for (d, &(n, sa, sb)) in self.outer.iter().enumerate().rev() {
                index[d] += 1;
                a += sa;
                b += sb;
                if index[d] < n {
                    break;
                }
                a -= n * sa;
                b -= n * sb;
                index[d] = 0;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lay(shape: &[usize]) -> Layout {
        Layout::contiguous(shape, DType::F32).expect("layout")
    }

    #[test]
    fn row_major_layouts_and_their_offsets() {
        let l = lay(&[2, 3, 4]);
        assert_eq!(l.strides(), [12, 4, 1]);
        assert!(l.is_contiguous());
        assert_eq!((l.numel(), l.extent()), (24, 24));
        assert!(l.offsets().eq(0..24));
        let scalar = lay(&[]);
        assert_eq!((scalar.numel(), scalar.extent(), scalar.rank()), (1, 1, 0));
        assert_eq!(scalar.offsets().collect::<Vec<_>>(), [0]);
        let empty = lay(&[3, 0, 2]);
        assert_eq!(empty.strides(), [2, 2, 1]);
        assert_eq!((empty.numel(), empty.extent()), (0, 0));
        assert!(empty.is_contiguous() && empty.offsets().next().is_none());
    }

    #[test]
    fn views_change_strides_and_offsets() {
        let l = lay(&[2, 3, 4]);
        let t = l.transpose(0, 2).expect("transpose");
        assert_eq!((t.shape(), t.strides()), (&[4, 3, 2][..], &[1, 4, 12][..]));
        assert!(!t.is_contiguous());
        assert_eq!(t.offsets().take(3).collect::<Vec<_>>(), [0, 12, 4]);
        let (n, off) = l.narrow(1, 1, 2).expect("narrow");
        assert_eq!((n.shape(), off, n.extent()), (&[2, 2, 4][..], 4, 20));
        assert!(!n.is_contiguous());
        let (row, off) = l.narrow(0, 1, 1).expect("narrow");
        assert!(row.is_contiguous());
        assert_eq!((off, row.extent()), (12, 12));
        let (none, off) = l.narrow(2, 4, 0).expect("an empty narrow at the end");
        assert_eq!((none.numel(), off), (0, 0));
        assert_eq!(
            l.narrow(1, 2, 2),
            Err(Error::NarrowOutOfRange {
                dim: 1,
                start: 2,
                len: 2,
                size: 3
            })
        );
        assert!(l.narrow(1, usize::MAX, 2).is_err());
        assert_eq!(
            l.transpose(0, 3),
            Err(Error::DimOutOfRange { dim: 3, rank: 3 })
        );
        // Size-1 dimensions may have any stride and stay contiguous.
        let (col, _) = lay(&[4, 1]).narrow(0, 0, 1).expect("narrow");
        assert!(col.transpose(0, 1).expect("t").is_contiguous());
    }

    #[test]
    fn reshape_needs_contiguity_and_the_same_count() {
        let l = lay(&[2, 6]);
        assert_eq!(l.reshape(&[3, 4], DType::F32).expect("r").strides(), [4, 1]);
        assert!(matches!(
            l.reshape(&[5, 2], DType::F32),
            Err(Error::ReshapeNumel {
                from_numel: 12,
                to_numel: 10,
                ..
            })
        ));
        let t = l.transpose(0, 1).expect("t");
        assert!(matches!(
            t.reshape(&[12], DType::F32),
            Err(Error::NotContiguous { op: "reshape", .. })
        ));
        assert!(matches!(
            Layout::contiguous(&[usize::MAX, 3], DType::U8),
            Err(Error::SizeOverflow { .. })
        ));
        assert!(matches!(
            Layout::contiguous(&[usize::MAX / 4], DType::F64),
            Err(Error::SizeOverflow { .. })
        ));
    }

    #[test]
    fn reinterpretation_scales_the_last_dimension() {
        let l = lay(&[2, 3]);
        let bytes = l.reinterpret(DType::F32, DType::U8, 0).expect("to bytes");
        assert_eq!(
            (bytes.shape(), bytes.strides()),
            (&[2, 12][..], &[12, 1][..])
        );
        let back = bytes.reinterpret(DType::U8, DType::F32, 0).expect("back");
        assert_eq!(back, l);
        assert!(l.reinterpret(DType::F32, DType::F64, 0).is_err(), "3 f32s");
        assert!(l.reinterpret(DType::F32, DType::I32, 0).is_ok());
        let (n, _) = bytes.narrow(1, 2, 8).expect("narrow");
        assert!(n.reinterpret(DType::U8, DType::F32, 2).is_err(), "byte 2");
        assert!(n.reinterpret(DType::U8, DType::F32, 4).is_ok());
        let t = l.transpose(0, 1).expect("t");
        let e = t
            .reinterpret(DType::F32, DType::F16, 0)
            .expect_err("stride");
        assert!(e.to_string().contains("stride 3"), "{e}");
        assert!(lay(&[]).reinterpret(DType::F32, DType::U8, 0).is_err());
        assert!(lay(&[]).reinterpret(DType::F32, DType::U32, 0).is_ok());
        // Other strides must hold whole larger elements.
        let (odd, _) = lay(&[2, 6]).narrow(1, 0, 4).expect("narrow");
        assert!(
            odd.reinterpret(DType::U8, DType::U32, 0).is_err(),
            "stride 6"
        );
        assert!(odd.reinterpret(DType::U8, DType::U16, 0).is_ok());
    }

    #[test]
    fn runs_join_the_dimensions_dense_on_both_sides() {
        let l = lay(&[4, 5, 6]);
        let all = Runs::new(&l, &l);
        assert_eq!((all.count(), all.run()), (1, 120));
        let (n, _) = l.narrow(2, 1, 4).expect("narrow");
        let dense = lay(&[4, 5, 4]);
        let r = Runs::new(&n, &dense);
        assert_eq!((r.count(), r.run()), (20, 4));
        let mut seen = Vec::new();
        r.try_for_each(|a, b| {
            seen.push((a, b));
            Ok::<(), ()>(())
        })
        .expect("walk");
        assert_eq!(&seen[..3], [(0, 0), (6, 4), (12, 8)]);
        assert_eq!(seen[5], (30, 20));
        let t = l.transpose(1, 2).expect("t");
        let r = Runs::new(&t, &lay(&[4, 6, 5]));
        assert_eq!((r.count(), r.run()), (120, 1));
        let empty = lay(&[0, 3]);
        assert_eq!(Runs::new(&empty, &empty).count(), 0);
        let scalar = lay(&[]);
        assert_eq!(
            (
                Runs::new(&scalar, &scalar).count(),
                Runs::new(&scalar, &scalar).run()
            ),
            (1, 1)
        );
    }
}
