//! Shape and stride math: views, contiguous copies and device copies
//! checked element by element against the naive reference (`Dense`), on
//! any backend.

use cuarena::backend::Backend;
use cuarena::{DType, SharedArena};
use cuarena_tensor::{Error, Tensor};

use crate::support::{host_arena, Dense, Rng};

fn check<B: Backend>(t: &Tensor<B>, want: &Dense, what: &str) {
    assert_eq!(t.shape(), &want.shape[..], "{what}: shape");
    assert_eq!(t.numel(), want.data.len(), "{what}: numel");
    assert_eq!(t.to_vec::<u32>().expect("to_vec"), want.data, "{what}");
    assert_eq!(t.layout().offsets().len(), t.numel(), "{what}: offsets");
}

/// A shape of `numel` elements other than `shape`: rotated, flattened, or
/// with a unit dimension put in.
fn another_shape(rng: &mut Rng, shape: &[usize]) -> Vec<usize> {
    let numel: usize = shape.iter().product();
    match rng.index(4) {
        0 => vec![numel],
        1 if numel == 1 => vec![],
        1 | 2 => {
            let mut s = shape.to_vec();
            if !s.is_empty() {
                s.rotate_left(1);
            }
            s
        }
        _ => {
            let mut s = shape.to_vec();
            s.insert(rng.index(s.len() + 1), 1);
            s
        }
    }
}

/// Random programs of views and copies, each step checked against the
/// reference.
pub fn random_views<B: Backend>(arena: &SharedArena<B>, seed: u64, programs: usize) {
    let mut rng = Rng::new(seed);
    for p in 0..programs {
        let rank = rng.index_range(1, 4);
        let shape: Vec<usize> = (0..rank)
            .map(|_| {
                if rng.index(16) == 0 {
                    0
                } else {
                    rng.index_range(1, 6)
                }
            })
            .collect();
        let mut want = Dense::iota(&shape, (p as u32) << 12);
        let mut t = Tensor::from_slice(arena, &want.data, &shape).expect("from_slice");
        for step in 0..10 {
            let what = format!("seed {seed} program {p} step {step}");
            let rank = t.rank();
            match rng.index(6) {
                0 | 1 if rank > 0 => {
                    let dim = rng.index(rank);
                    let size = t.shape()[dim];
                    let start = rng.index_range(0, size);
                    let len = rng.index_range(0, size - start);
                    t = t.narrow(dim, start, len).expect("narrow");
                    want = want.narrow(dim, start, len);
                }
                0 | 1 => {
                    let e = t.narrow(0, 0, 1).expect_err("a scalar has no dims");
                    assert_eq!(e, Error::DimOutOfRange { dim: 0, rank: 0 });
                }
                2 if rank > 0 => {
                    let (d0, d1) = (rng.index(rank), rng.index(rank));
                    t = t.transpose(d0, d1).expect("transpose");
                    want = want.transpose(d0, d1);
                }
                2 | 3 => {
                    let to = another_shape(&mut rng, &want.shape);
                    match t.reshape(&to) {
                        Ok(r) => {
                            assert!(t.is_contiguous(), "{what}: reshaped a strided view");
                            assert!(r.storage().same_storage(t.storage()));
                            t = r;
                            want = want.reshape(&to);
                        }
                        Err(Error::NotContiguous { op: "reshape", .. }) => {
                            assert!(!t.is_contiguous(), "{what}");
                        }
                        Err(e) => panic!("{what}: {e}"),
                    }
                }
                4 => {
                    let c = t.contiguous().expect("contiguous");
                    assert!(c.is_contiguous());
                    let shared = c.storage().same_storage(t.storage());
                    assert_eq!(
                        shared,
                        t.is_contiguous(),
                        "{what}: copied only when strided"
                    );
                    t = c;
                }
                _ => {
                    // A device copy into a strided destination: the
                    // transpose of a fresh tensor.
                    let mut back = want.shape.clone();
                    if rank > 1 {
                        back.swap(0, rank - 1);
                    }
                    let dst = Tensor::zeros(arena, DType::U32, &back).expect("zeros");
                    let view = if rank > 1 {
                        dst.transpose(0, rank - 1).expect("t")
                    } else {
                        dst.clone()
                    };
                    view.copy_from(&t).expect("copy_from");
                    check(&view, &want, &what);
                    t = view;
                }
            }
            check(&t, &want, &what);
        }
    }
}

#[test]
fn random_views_match_the_naive_reference() {
    let arena = host_arena(1 << 20);
    for seed in 0..4 {
        random_views(&arena, seed, 150);
    }
    // Everything was dropped: the arena frees it all.
    arena.reclaim().expect("reclaim");
    assert_eq!(arena.stats().live_blocks, 0);
}

/// Narrow, transpose and contiguous on a 3-D tensor, with the strides and
/// storage offsets a framework expects; then copies whose runs take the
/// device path (few runs) and the host path (many).
pub fn strides_offsets_and_copy_paths<B: Backend>(arena: &SharedArena<B>) {
    let want = Dense::iota(&[2, 3, 4], 0);
    let x = Tensor::from_slice(arena, &want.data, &[2, 3, 4]).expect("x");
    assert_eq!((x.strides(), x.storage_offset()), (&[12, 4, 1][..], 0));
    let n = x.narrow(1, 1, 2).expect("narrow");
    assert_eq!((n.strides(), n.storage_offset()), (&[12, 4, 1][..], 4));
    assert_eq!((n.span().len_bytes(), n.is_contiguous()), (20 * 4, false));
    check(&n, &want.narrow(1, 1, 2), "narrow");
    let t = n.transpose(0, 2).expect("transpose");
    assert_eq!((t.shape(), t.strides()), (&[4, 2, 2][..], &[1, 4, 12][..]));
    check(&t, &want.narrow(1, 1, 2).transpose(0, 2), "transpose");
    let c = t.contiguous().expect("contiguous");
    assert_eq!((c.strides(), c.storage_offset()), (&[4, 2, 1][..], 0));
    check(&c, &want.narrow(1, 1, 2).transpose(0, 2), "contiguous");
    assert!(c.reshape(&[16]).is_ok());
    assert_eq!(x.narrow(0, 1, 1).expect("row").storage_offset(), 12);

    // Few runs (4 rows of 300): one device copy per row.
    let wide = Dense::iota(&[4, 600], 7);
    let w = Tensor::from_slice(arena, &wide.data, &[4, 600]).expect("w");
    let half = w
        .narrow(1, 150, 300)
        .expect("narrow")
        .contiguous()
        .expect("c");
    check(&half, &wide.narrow(1, 150, 300), "few runs");
    // Many runs (a 40x40 transpose: 1600 single elements): the host path.
    let sq = Dense::iota(&[40, 40], 9);
    let s = Tensor::from_slice(arena, &sq.data, &[40, 40]).expect("s");
    let st = s.transpose(0, 1).expect("t").contiguous().expect("c");
    check(&st, &sq.transpose(0, 1), "many runs");
    // Both into a strided destination that leaves bytes between untouched.
    let dst = Tensor::from_slice(arena, &vec![u32::MAX; 4 * 600], &[4, 600]).expect("dst");
    dst.narrow(1, 0, 300)
        .expect("narrow")
        .copy_from(&half)
        .expect("copy");
    let got = dst.to_vec::<u32>().expect("read");
    for r in 0..4 {
        assert_eq!(
            &got[r * 600..r * 600 + 300],
            &half.to_vec::<u32>().expect("h")[r * 300..][..300]
        );
        assert!(got[r * 600 + 300..(r + 1) * 600]
            .iter()
            .all(|&v| v == u32::MAX));
    }
    let sdst = Tensor::zeros(arena, DType::U32, &[40, 80]).expect("sdst");
    let right = sdst.narrow(1, 40, 40).expect("narrow");
    right
        .copy_from(&s.transpose(0, 1).expect("t"))
        .expect("copy");
    check(
        &right,
        &sq.transpose(0, 1),
        "many runs, strided destination",
    );
    check(
        &sdst.narrow(1, 0, 40).expect("narrow"),
        &Dense {
            shape: vec![40, 40],
            data: vec![0; 1600],
        },
        "untouched half",
    );
}

#[test]
fn strides_offsets_and_both_copy_paths_on_the_host() {
    strides_offsets_and_copy_paths(&host_arena(1 << 20));
}

/// Copies between overlapping views of one storage read everything first.
pub fn overlapping_copies<B: Backend>(arena: &SharedArena<B>) {
    let t = Tensor::from_slice(arena, &(0u32..10).collect::<Vec<_>>(), &[10]).expect("t");
    let (lo, hi) = (
        t.narrow(0, 0, 8).expect("lo"),
        t.narrow(0, 2, 8).expect("hi"),
    );
    lo.copy_from(&hi).expect("down");
    assert_eq!(
        t.to_vec::<u32>().expect("read"),
        [2, 3, 4, 5, 6, 7, 8, 9, 8, 9]
    );
    hi.copy_from(&lo).expect("up");
    assert_eq!(
        t.to_vec::<u32>().expect("read"),
        [2, 3, 2, 3, 4, 5, 6, 7, 8, 9]
    );
    t.copy_from(&t).expect("onto itself");
    // Interleaved columns of one matrix: disjoint elements, overlapping spans.
    let m = Tensor::from_slice(arena, &(0u32..8).collect::<Vec<_>>(), &[4, 2]).expect("m");
    m.narrow(1, 1, 1)
        .expect("right")
        .copy_from(&m.narrow(1, 0, 1).expect("left"))
        .expect("copy");
    assert_eq!(m.to_vec::<u32>().expect("read"), [0, 0, 2, 2, 4, 4, 6, 6]);
}

#[test]
fn overlapping_copies_on_the_host() {
    overlapping_copies(&host_arena(1 << 16));
}

#[test]
fn empty_and_scalar_tensors() {
    let arena = host_arena(1 << 16);
    let e = Tensor::zeros(&arena, DType::F32, &[3, 0]).expect("empty");
    assert_eq!((e.numel(), e.size_bytes(), e.is_contiguous()), (0, 0, true));
    assert!(e.storage().is_empty(), "no block for no bytes");
    assert_eq!(e.to_vec::<f32>().expect("read"), Vec::<f32>::new());
    assert_eq!(e.transpose(0, 1).expect("t").shape(), [0, 3]);
    let f = Tensor::zeros(&arena, DType::F32, &[0, 3]).expect("f");
    f.copy_from(&e.transpose(0, 1).expect("t"))
        .expect("copy nothing");
    let x = Tensor::from_slice(&arena, &[1u32, 2, 3], &[3]).expect("x");
    let none = x.narrow(0, 3, 0).expect("an empty narrow at the end");
    assert_eq!((none.numel(), none.span().len_bytes()), (0, 0));
    assert_eq!(arena.stats().live_blocks, 1);
    let s = Tensor::from_slice(&arena, &[42i64], &[]).expect("scalar");
    assert_eq!(
        (s.rank(), s.numel(), s.to_vec::<i64>().expect("read")),
        (0, 1, vec![42])
    );
    assert_eq!(
        s.reshape(&[1, 1])
            .expect("r")
            .to_vec::<i64>()
            .expect("read"),
        [42]
    );
    assert_eq!(
        s.transpose(0, 0).expect_err("no dims"),
        Error::DimOutOfRange { dim: 0, rank: 0 }
    );
}

#[test]
fn bad_shapes_are_errors_that_say_what_was_asked() {
    let arena = host_arena(1 << 16);
    let x = Tensor::from_slice(&arena, &[0u32; 12], &[3, 4]).expect("x");
    let e = x.narrow(1, 3, 2).expect_err("past the end");
    assert_eq!(
        e,
        Error::NarrowOutOfRange {
            dim: 1,
            start: 3,
            len: 2,
            size: 4
        }
    );
    assert!(e.to_string().contains("dimension of 4"), "{e}");
    assert!(x.narrow(0, usize::MAX, 2).is_err(), "start + len overflows");
    assert_eq!(
        x.transpose(0, 2).expect_err("rank 2"),
        Error::DimOutOfRange { dim: 2, rank: 2 }
    );
    let e = x.reshape(&[5, 2]).expect_err("10 elements");
    assert!(
        e.to_string().contains("12 elements") && e.to_string().contains("10"),
        "{e}"
    );
    assert!(matches!(
        x.reshape(&[usize::MAX, 2]),
        Err(Error::ReshapeNumel {
            to_numel: usize::MAX,
            ..
        })
    ));
    let e = x
        .transpose(0, 1)
        .expect("t")
        .reshape(&[12])
        .expect_err("strided");
    assert!(e.to_string().contains("contiguous()"), "{e}");
    let y = Tensor::zeros(&arena, DType::U32, &[4, 3]).expect("y");
    assert_eq!(
        y.copy_from(&x).expect_err("shapes"),
        Error::ShapeMismatch {
            op: "copy_from",
            src: vec![3, 4],
            dst: vec![4, 3]
        }
    );
    let e = Tensor::from_slice(&arena, &[1u32, 2, 3], &[2, 2]).expect_err("3 of 4");
    assert_eq!(
        e,
        Error::DataLength {
            shape: vec![2, 2],
            dtype: DType::U32,
            expected_bytes: 16,
            got_bytes: 12
        }
    );
    assert!(matches!(
        Tensor::zeros(&arena, DType::F64, &[usize::MAX / 2, 2]),
        Err(Error::SizeOverflow { .. })
    ));
    // Larger than the arena: the core's error, passed on.
    assert!(matches!(
        Tensor::zeros(&arena, DType::F32, &[1 << 20]),
        Err(Error::Arena(cuarena::Error::TooLarge { .. }))
    ));
    // Another arena's tensor.
    let other = host_arena(1 << 16);
    let z = Tensor::zeros(&other, DType::U32, &[3, 4]).expect("z");
    assert_eq!(
        z.copy_from(&x).expect_err("arenas"),
        Error::ArenaMismatch {
            src_arena: arena.id(),
            dst_arena: other.id()
        }
    );
    // Nothing above changed x or left a block behind.
    assert_eq!(x.to_vec::<u32>().expect("read"), [0; 12]);
    arena.reclaim().expect("reclaim");
    assert_eq!(arena.stats().live_blocks, 2);
}

#[test]
fn spilled_tensors_are_brought_back_by_reads_and_copies() {
    use cuarena::{Arena, ArenaConfig};
    let config = ArenaConfig::new(8 << 10).with_spill_host_bytes(64 << 10);
    let arena = SharedArena::new(Arena::host(config).expect("arena"));
    let refs: Vec<Dense> = (0..8).map(|i| Dense::iota(&[16, 32], i << 16)).collect();
    let tensors: Vec<Tensor> = refs
        .iter()
        .map(|d| Tensor::from_slice(&arena, &d.data, &d.shape).expect("tensor"))
        .collect();
    assert!(arena.stats().evictions > 0, "weak test: nothing spilled");
    for (i, (t, d)) in tensors.iter().zip(&refs).enumerate() {
        check(t, d, "read back");
        // Host path (512 single-element runs) and device path (16 runs).
        let (j, k) = ((i + 3) % 8, (i + 5) % 8);
        let tt = tensors[j]
            .transpose(0, 1)
            .expect("t")
            .contiguous()
            .expect("c");
        check(&tt, &refs[j].transpose(0, 1), "transposed");
        tensors[k]
            .narrow(1, 0, 16)
            .expect("n")
            .copy_from(&t.narrow(1, 16, 16).expect("n"))
            .expect("copy");
        let mut want = refs[k].clone();
        let moved = d.narrow(1, 16, 16);
        for r in 0..16 {
            want.data[r * 32..r * 32 + 16].copy_from_slice(&moved.data[r * 16..][..16]);
        }
        check(&tensors[k], &want, "copied into");
        tensors[k]
            .copy_from(&Tensor::from_slice(&arena, &refs[k].data, &[16, 32]).expect("r"))
            .expect("restore");
    }
    assert!(arena.stats().restores > 0);
}
