//! Runtime dtypes: reinterpretation without a copy (checked), typed reads
//! and copies that must match, and the dtypes with no Rust element type.

use cuarena::backend::Backend;
use cuarena::half::{bf16, f16};
use cuarena::{DType, SharedArena};
use cuarena_tensor::{Error, Tensor};

use crate::support::host_arena;

/// Reinterpretations, typed reads and their errors on any backend.
pub fn dtypes_reinterpret_and_check<B: Backend>(arena: &SharedArena<B>) {
    let vals = [1.0f32, -2.5, 0.5, 1e9, 3.0, -0.0];
    let x = Tensor::from_slice(arena, &vals, &[2, 3]).expect("x");
    assert_eq!((x.dtype(), x.size_bytes()), (DType::F32, 24));
    // The same bytes, four ways, no copy.
    let bits = x.as_dtype(DType::U32).expect("u32");
    assert_eq!((bits.shape(), bits.dtype()), (&[2, 3][..], DType::U32));
    let want: Vec<u32> = vals.iter().map(|v| v.to_bits()).collect();
    assert_eq!(bits.to_vec::<u32>().expect("bits"), want);
    let bytes = x.as_dtype(DType::U8).expect("u8");
    assert_eq!(
        (bytes.shape(), bytes.strides()),
        (&[2, 12][..], &[12, 1][..])
    );
    let le: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(bytes.to_vec::<u8>().expect("bytes"), le);
    assert_eq!(x.to_bytes().expect("to_bytes"), le);
    let halves = x.as_dtype(DType::BF16).expect("bf16");
    assert_eq!(halves.shape(), [2, 6]);
    assert_eq!(halves.to_vec::<bf16>().expect("bf16").len(), 12);
    assert!(bytes.storage().same_storage(x.storage()));
    assert_eq!(
        bytes
            .as_dtype(DType::F32)
            .expect("back")
            .to_vec::<f32>()
            .expect("f32"),
        vals
    );
    // A view of a view: row 1's bytes as i32s.
    let row = bytes
        .narrow(0, 1, 1)
        .expect("row")
        .as_dtype(DType::I32)
        .expect("i32");
    assert_eq!(row.storage_offset(), 3);
    let row_bits: Vec<i32> = vals[3..].iter().map(|v| v.to_bits() as i32).collect();
    assert_eq!(row.to_vec::<i32>().expect("i32"), row_bits);

    // Typed reads and copies must match the dtype.
    assert_eq!(
        x.to_vec::<i32>().expect_err("i32 of f32"),
        Error::DTypeMismatch {
            op: "to_vec",
            tensor: DType::F32,
            requested: DType::I32
        }
    );
    let ints = Tensor::zeros(arena, DType::I32, &[2, 3]).expect("ints");
    let e = ints.copy_from(&x).expect_err("f32 into i32");
    assert!(e.to_string().contains("as_dtype"), "{e}");
    ints.copy_from(&x.as_dtype(DType::I32).expect("bitcast"))
        .expect("bitcast copy");
    let all_bits: Vec<i32> = want.iter().map(|&b| b as i32).collect();
    assert_eq!(ints.to_vec::<i32>().expect("read"), all_bits);

    // Reinterpretations that cannot be: checked, with the reason.
    let e = x.as_dtype(DType::F64).expect_err("3 f32s");
    assert!(
        matches!(
            e,
            Error::IncompatibleView {
                from: DType::F32,
                to: DType::F64,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("3 elements"), "{e}");
    let e = x
        .transpose(0, 1)
        .expect("t")
        .as_dtype(DType::F16)
        .expect_err("stride");
    assert!(e.to_string().contains("stride 3"), "{e}");
    let odd = bytes.narrow(1, 1, 8).expect("bytes 1..9");
    let e = odd.as_dtype(DType::U32).expect_err("misaligned");
    assert!(e.to_string().contains("byte 1"), "{e}");
    assert!(bytes
        .narrow(1, 4, 8)
        .expect("n")
        .as_dtype(DType::U32)
        .is_ok());
    let e = bytes
        .narrow(1, 0, 6)
        .expect("n")
        .as_dtype(DType::U32)
        .expect_err("6 bytes");
    assert!(e.to_string().contains("6 elements"), "{e}");
    // Same-size reinterpretation works on any layout.
    let tt = x
        .transpose(0, 1)
        .expect("t")
        .as_dtype(DType::I32)
        .expect("same size");
    assert_eq!(tt.strides(), [1, 3]);
}

#[test]
fn dtypes_reinterpret_and_check_on_the_host() {
    dtypes_reinterpret_and_check(&host_arena(1 << 16));
}

#[test]
fn every_dtype_round_trips_and_zeros_are_zero_bytes() {
    let arena = host_arena(1 << 16);
    for d in DType::ALL {
        let z = Tensor::zeros(&arena, d, &[3, 5]).expect("zeros");
        assert_eq!(
            z.to_bytes().expect("bytes"),
            vec![0; 15 * d.size_bytes() as usize],
            "{d}"
        );
        let bytes: Vec<u8> = (0..15 * d.size_bytes() as u8).collect();
        let t = Tensor::from_bytes(&arena, d, &[3, 5], &bytes).expect("from_bytes");
        assert_eq!(t.to_bytes().expect("bytes"), bytes, "{d}");
        let tt = t.transpose(0, 1).expect("t").contiguous().expect("c");
        let e = d.size_bytes() as usize;
        let mut want = Vec::new();
        for c in 0..5 {
            for r in 0..3 {
                want.extend_from_slice(&bytes[(r * 5 + c) * e..][..e]);
            }
        }
        assert_eq!(tt.to_bytes().expect("bytes"), want, "{d} transposed");
    }
    let h =
        Tensor::from_slice(&arena, &[f16::from_f32(1.5), f16::from_f32(-2.0)], &[2]).expect("f16");
    assert_eq!(h.dtype(), DType::F16);
    assert_eq!(h.to_vec::<f16>().expect("read")[1].to_f32(), -2.0);
}

#[test]
fn bool_and_fp8_go_through_bytes() {
    let arena = host_arena(1 << 16);
    let mask = Tensor::from_bytes(&arena, DType::Bool, &[2, 2], &[1, 0, 0, 1]).expect("mask");
    assert_eq!(
        mask.to_vec::<u8>().expect_err("u8 of bool"),
        Error::DTypeMismatch {
            op: "to_vec",
            tensor: DType::Bool,
            requested: DType::U8
        }
    );
    assert_eq!(
        mask.as_dtype(DType::U8)
            .expect("u8")
            .to_vec::<u8>()
            .expect("read"),
        [1, 0, 0, 1]
    );
    assert_eq!(
        mask.transpose(0, 1).expect("t").to_bytes().expect("read"),
        [1, 0, 0, 1]
    );
    let f8 = Tensor::from_bytes(&arena, DType::F8E4M3, &[4], &[0x38, 0x40, 0xb8, 0]).expect("fp8");
    let pairs = f8.as_dtype(DType::U16).expect("u16 pairs");
    assert_eq!(pairs.shape(), [2]);
    assert_eq!(pairs.to_vec::<u16>().expect("read"), [0x4038, 0x00b8]);
    let e = Tensor::from_bytes(&arena, DType::Bool, &[3], &[1, 0]).expect_err("2 of 3");
    assert!(
        e.to_string().contains("2 B") && e.to_string().contains("3 B"),
        "{e}"
    );
}
