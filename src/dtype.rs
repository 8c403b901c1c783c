//! Element types: the runtime [`DType`] a storage carries, and the Rust
//! types ([`Element`]) that map to one.

use std::fmt;

/// The element type of a storage, as frameworks name them.
///
/// A storage is either typed (allocated for a [`DType`]) or untyped bytes.
/// Byte-level calls (`read_bytes`, `write_bytes`, `copy`) work on any
/// storage whatever its dtype. Typed calls (`read::<T>`, `read_into`,
/// `write`, `fill`, kernel views) take a Rust [`Element`] type and check it
/// against the range's dtype where one is set: `read::<u8>`
/// of an `f32` storage is [`crate::Error::TypeMismatch`], while its bytes
/// are one `read_bytes` away. A range is reinterpreted as another dtype
/// without a copy by [`StorageSlice::as_dtype`](crate::StorageSlice::as_dtype),
/// a checked bitcast.
///
/// Dtypes with no Rust type of their own here (`bool`, the fp8 formats) are
/// read and written as bytes, or reinterpreted as [`DType::U8`].
///
/// # Lengths are `u64`
///
/// Every length, offset and element count in the crate's API is a `u64`:
/// device memory is sized independently of the host's address space (a
/// metadata arena models regions larger than this machine's), and counts
/// multiply into byte sizes, which are `u64` throughout. Host buffers
/// (`&[T]`, `Vec<T>`) keep `usize`; a size that does not fit in one is
/// [`crate::Error::HostMemory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// IEEE 754 binary64.
    F64,
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16 ([`half::f16`]).
    F16,
    /// bfloat16 ([`half::bf16`]).
    BF16,
    /// 8-bit float, 4 exponent and 3 mantissa bits (OCP FP8 E4M3).
    F8E4M3,
    /// 8-bit float, 5 exponent and 2 mantissa bits (OCP FP8 E5M2).
    F8E5M2,
    /// 64-bit signed integer.
    I64,
    /// 32-bit signed integer.
    I32,
    /// 16-bit signed integer.
    I16,
    /// 8-bit signed integer.
    I8,
    /// 64-bit unsigned integer.
    U64,
    /// 32-bit unsigned integer.
    U32,
    /// 16-bit unsigned integer.
    U16,
    /// 8-bit unsigned integer.
    U8,
    /// One byte per element, 0 or 1.
    Bool,
}

impl DType {
    /// Every dtype.
    pub const ALL: [DType; 15] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U64,
        DType::U32,
        DType::U16,
        DType::U8,
        DType::Bool,
    ];

    /// Bytes per element; also the alignment an element needs (a power of
    /// two).
    pub const fn size_bytes(self) -> u64 {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// The name frameworks use (`f32`, `bf16`, `f8e4m3`, `bool`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U64 => "u64",
            DType::U32 => "u32",
            DType::U16 => "u16",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The name of an optional dtype in messages: `untyped` for none.
pub(crate) fn name_of(d: Option<DType>) -> &'static str {
    d.map_or("untyped bytes", DType::name)
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is the element of one [`DType`]: what typed calls
/// (`read::<f32>`, `fill(&x, half::bf16::ONE)`) take; `T::DTYPE` names its
/// dtype (`alloc_dtype(f32::DTYPE, n)`). Sealed:
/// implemented here for `f64`, `f32`, [`half::f16`], [`half::bf16`], the
/// signed and unsigned integers of 8 to 64 bits, and nothing else, so a
/// typed call always means its dtype.
pub trait Element: bytemuck::Pod + sealed::Sealed {
    /// The dtype whose elements this type holds.
    const DTYPE: DType;
}

macro_rules! elements {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

elements! {
    f64 => F64, f32 => F32, half::f16 => F16, half::bf16 => BF16,
    i64 => I64, i32 => I32, i16 => I16, i8 => I8,
    u64 => U64, u32 => U32, u16 => U16, u8 => U8,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size_of<T: Element>() -> u64 {
        assert_eq!(std::mem::size_of::<T>() as u64, T::DTYPE.size_bytes());
        assert!(std::mem::align_of::<T>() as u64 <= T::DTYPE.size_bytes());
        T::DTYPE.size_bytes()
    }

    #[test]
    fn rust_types_match_their_dtypes_in_size_and_alignment() {
        let sizes = [
            size_of::<f64>(),
            size_of::<f32>(),
            size_of::<half::f16>(),
            size_of::<half::bf16>(),
            size_of::<i64>(),
            size_of::<i32>(),
            size_of::<i16>(),
            size_of::<i8>(),
            size_of::<u64>(),
            size_of::<u32>(),
            size_of::<u16>(),
            size_of::<u8>(),
        ];
        assert_eq!(sizes, [8, 4, 2, 2, 8, 4, 2, 1, 8, 4, 2, 1]);
        for d in DType::ALL {
            assert!(d.size_bytes().is_power_of_two(), "{d}");
            assert!(!d.name().is_empty());
        }
        assert_eq!(DType::BF16.to_string(), "bf16");
        assert_eq!(name_of(None), "untyped bytes");
    }
}
