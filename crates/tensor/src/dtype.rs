//! Every element type a PyTorch checkpoint can hold, with the names each format uses for it.

use std::fmt;

/// A torch dtype.
///
/// Every dtype that `torch.save` can write is listed; an unknown name is an error that names it
/// ([`DType::from_torch_name`] returns `None`, callers turn that into a format error), never a silent skip.
///
/// ```
/// use ckpt_tensor::DType;
/// assert_eq!(DType::F32.torch_name(), "float32");
/// assert_eq!(DType::F32.size(), 4);
/// assert_eq!(DType::from_torch_name("torch.bfloat16"), Some(DType::BF16));
/// assert_eq!(DType::BF16.safetensors_code(), Some("BF16"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DType {
    /// `torch.bool`: one byte, 0 or 1.
    Bool,
    /// `torch.uint8`.
    U8,
    /// `torch.uint16`.
    U16,
    /// `torch.uint32`.
    U32,
    /// `torch.uint64`.
    U64,
    /// `torch.int8`.
    I8,
    /// `torch.int16`.
    I16,
    /// `torch.int32`.
    I32,
    /// `torch.int64`.
    I64,
    /// `torch.float16`.
    F16,
    /// `torch.bfloat16`.
    BF16,
    /// `torch.float32`.
    F32,
    /// `torch.float64`.
    F64,
    /// `torch.complex32` (two f16).
    C32,
    /// `torch.complex64` (two f32).
    C64,
    /// `torch.complex128` (two f64).
    C128,
    /// `torch.float8_e4m3fn`.
    F8E4M3Fn,
    /// `torch.float8_e5m2`.
    F8E5M2,
    /// `torch.float8_e4m3fnuz`.
    F8E4M3Fnuz,
    /// `torch.float8_e5m2fnuz`.
    F8E5M2Fnuz,
    /// `torch.float8_e8m0fnu`.
    F8E8M0Fnu,
    /// `torch.float4_e2m1fn_x2`: two 4-bit floats packed in one byte.
    F4E2M1FnX2,
    /// `torch.qint8` (quantized storage element).
    QInt8,
    /// `torch.quint8`.
    QUInt8,
    /// `torch.qint32`.
    QInt32,
    /// `torch.quint4x2`.
    QUInt4x2,
    /// `torch.quint2x4`.
    QUInt2x4,
    /// `torch.bits8`: an opaque byte.
    Bits8,
    /// `torch.bits16`: an opaque 2-byte value.
    Bits16,
    /// `torch.bits1x8`: eight packed bits.
    Bits1x8,
    /// `torch.bits2x4`: four packed 2-bit values.
    Bits2x4,
    /// `torch.bits4x2`: two packed 4-bit values.
    Bits4x2,
    /// safetensors' `F6_E2M3` (OCP MX FP6, e2m3): four 6-bit floats packed in three bytes, as safetensors
    /// packs them. torch has no such dtype: ckpt names it `float6_e2m3fn_x4` and keeps its bytes as they are.
    F6E2M3FnX4,
    /// safetensors' `F6_E3M2` (OCP MX FP6, e3m2): four 6-bit floats packed in three bytes. torch has no
    /// such dtype: ckpt names it `float6_e3m2fn_x4` and keeps its bytes as they are.
    F6E3M2FnX4,
}

/// How a storage's element count is counted in a `torch.save` persistent id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageClass {
    /// A legacy typed storage class (`torch FloatStorage`); numel counts elements; tensors use
    /// `_rebuild_tensor_v2`.
    Typed(&'static str),
    /// `torch.storage UntypedStorage`; numel counts bytes; tensors use `_rebuild_tensor_v3` with the dtype.
    Untyped,
}

struct Info {
    dtype: DType,
    torch: &'static str,
    size: usize,
    storage: StorageClass,
    safetensors: Option<&'static str>,
    numpy: Option<&'static str>,
}

const fn info(
    dtype: DType,
    torch: &'static str,
    size: usize,
    storage: StorageClass,
    safetensors: Option<&'static str>,
    numpy: Option<&'static str>,
) -> Info {
    Info { dtype, torch, size, storage, safetensors, numpy }
}

use StorageClass::{Typed, Untyped};

/// The dtype table: one row per dtype, in the enum's order.
const TABLE: &[Info] = &[
    info(DType::Bool, "bool", 1, Typed("BoolStorage"), Some("BOOL"), Some("|b1")),
    info(DType::U8, "uint8", 1, Typed("ByteStorage"), Some("U8"), Some("|u1")),
    info(DType::U16, "uint16", 2, Untyped, Some("U16"), Some("<u2")),
    info(DType::U32, "uint32", 4, Untyped, Some("U32"), Some("<u4")),
    info(DType::U64, "uint64", 8, Untyped, Some("U64"), Some("<u8")),
    info(DType::I8, "int8", 1, Typed("CharStorage"), Some("I8"), Some("|i1")),
    info(DType::I16, "int16", 2, Typed("ShortStorage"), Some("I16"), Some("<i2")),
    info(DType::I32, "int32", 4, Typed("IntStorage"), Some("I32"), Some("<i4")),
    info(DType::I64, "int64", 8, Typed("LongStorage"), Some("I64"), Some("<i8")),
    info(DType::F16, "float16", 2, Typed("HalfStorage"), Some("F16"), Some("<f2")),
    info(DType::BF16, "bfloat16", 2, Typed("BFloat16Storage"), Some("BF16"), None),
    info(DType::F32, "float32", 4, Typed("FloatStorage"), Some("F32"), Some("<f4")),
    info(DType::F64, "float64", 8, Typed("DoubleStorage"), Some("F64"), Some("<f8")),
    info(DType::C32, "complex32", 4, Untyped, None, None),
    info(DType::C64, "complex64", 8, Typed("ComplexFloatStorage"), Some("C64"), Some("<c8")),
    info(DType::C128, "complex128", 16, Typed("ComplexDoubleStorage"), None, Some("<c16")),
    info(DType::F8E4M3Fn, "float8_e4m3fn", 1, Untyped, Some("F8_E4M3"), None),
    info(DType::F8E5M2, "float8_e5m2", 1, Untyped, Some("F8_E5M2"), None),
    info(DType::F8E4M3Fnuz, "float8_e4m3fnuz", 1, Untyped, Some("F8_E4M3FNUZ"), None),
    info(DType::F8E5M2Fnuz, "float8_e5m2fnuz", 1, Untyped, Some("F8_E5M2FNUZ"), None),
    info(DType::F8E8M0Fnu, "float8_e8m0fnu", 1, Untyped, Some("F8_E8M0"), None),
    info(DType::F4E2M1FnX2, "float4_e2m1fn_x2", 1, Untyped, Some("F4"), None),
    info(DType::QInt8, "qint8", 1, Typed("QInt8Storage"), None, None),
    info(DType::QUInt8, "quint8", 1, Typed("QUInt8Storage"), None, None),
    info(DType::QInt32, "qint32", 4, Typed("QInt32Storage"), None, None),
    info(DType::QUInt4x2, "quint4x2", 1, Typed("QUInt4x2Storage"), None, None),
    info(DType::QUInt2x4, "quint2x4", 1, Typed("QUInt2x4Storage"), None, None),
    info(DType::Bits8, "bits8", 1, Untyped, None, None),
    info(DType::Bits16, "bits16", 2, Untyped, None, None),
    info(DType::Bits1x8, "bits1x8", 1, Untyped, None, None),
    info(DType::Bits2x4, "bits2x4", 1, Untyped, None, None),
    info(DType::Bits4x2, "bits4x2", 1, Untyped, None, None),
    info(DType::F6E2M3FnX4, "float6_e2m3fn_x4", 3, Untyped, Some("F6_E2M3"), None),
    info(DType::F6E3M2FnX4, "float6_e3m2fn_x4", 3, Untyped, Some("F6_E3M2"), None),
];

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 34] = [
        DType::Bool,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::C32,
        DType::C64,
        DType::C128,
        DType::F8E4M3Fn,
        DType::F8E5M2,
        DType::F8E4M3Fnuz,
        DType::F8E5M2Fnuz,
        DType::F8E8M0Fnu,
        DType::F4E2M1FnX2,
        DType::QInt8,
        DType::QUInt8,
        DType::QInt32,
        DType::QUInt4x2,
        DType::QUInt2x4,
        DType::Bits8,
        DType::Bits16,
        DType::Bits1x8,
        DType::Bits2x4,
        DType::Bits4x2,
        DType::F6E2M3FnX4,
        DType::F6E3M2FnX4,
    ];

    fn info(self) -> &'static Info {
        // TABLE is in declaration order and has one row per variant (checked by a test); the fallback row is
        // unreachable but keeps this function panic-free.
        TABLE.get(self as usize).filter(|i| i.dtype == self).unwrap_or(&TABLE[0])
    }

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        self.info().size
    }

    /// The torch name without the `torch.` prefix (`float32`).
    pub fn torch_name(self) -> &'static str {
        self.info().torch
    }

    /// The storage class `torch.save` pickles for this dtype.
    pub fn storage_class(self) -> StorageClass {
        self.info().storage
    }

    /// The legacy typed storage class name (`FloatStorage`), if this dtype has one.
    pub fn legacy_storage_name(self) -> Option<&'static str> {
        match self.info().storage {
            Typed(name) => Some(name),
            Untyped => None,
        }
    }

    /// The safetensors dtype code (`F32`), if safetensors can hold this dtype.
    pub fn safetensors_code(self) -> Option<&'static str> {
        self.info().safetensors
    }

    /// The numpy type string (`<f4`) for HDF5/numpy interchange, if numpy has this dtype.
    pub fn numpy_str(self) -> Option<&'static str> {
        self.info().numpy
    }

    /// How many values one element packs along the last dimension: 2 for `float4_e2m1fn_x2`, 4 for the
    /// float6 dtypes, 1 for every other dtype. safetensors counts values, not packed elements, in its
    /// shapes ([`DType::safetensors_shape`]).
    pub fn packed_values(self) -> usize {
        match self {
            DType::F4E2M1FnX2 => 2,
            DType::F6E2M3FnX4 | DType::F6E3M2FnX4 => 4,
            _ => 1,
        }
    }

    /// Whether torch has this dtype (every one but the float6 dtypes, which only safetensors defines).
    pub fn in_torch(self) -> bool {
        !matches!(self, DType::F6E2M3FnX4 | DType::F6E3M2FnX4)
    }

    /// The shape a safetensors header gives a tensor of this dtype and `shape`: the last dimension counts
    /// values, [`DType::packed_values`] per element (a `float4_e2m1fn_x2` tensor `[4, 8]` is `F4 [4, 16]`,
    /// as `safetensors` ≥ 0.6 writes it). `None` for a 0-dimensional packed tensor, which safetensors cannot
    /// hold (its one value would not fill a byte: `safetensors` refuses it too).
    ///
    /// ```
    /// use ckpt_tensor::DType;
    /// assert_eq!(DType::F4E2M1FnX2.safetensors_shape(&[4, 8]), Some(vec![4, 16]));
    /// assert_eq!(DType::F32.safetensors_shape(&[4, 8]), Some(vec![4, 8]));
    /// ```
    pub fn safetensors_shape(self, shape: &[usize]) -> Option<Vec<usize>> {
        let n = self.packed_values();
        let mut out = shape.to_vec();
        if n > 1 {
            let last = out.last_mut()?;
            *last = last.checked_mul(n)?;
        }
        Some(out)
    }

    /// The tensor shape of a safetensors header's `shape` for this dtype ([`DType::safetensors_shape`]
    /// reversed); `None` when the last dimension is not a whole number of packed elements (or a packed
    /// dtype has no dimension).
    ///
    /// ```
    /// use ckpt_tensor::DType;
    /// assert_eq!(DType::F4E2M1FnX2.shape_from_safetensors(&[4, 16]), Some(vec![4, 8]));
    /// assert_eq!(DType::F4E2M1FnX2.shape_from_safetensors(&[4, 3]), None);
    /// ```
    pub fn shape_from_safetensors(self, shape: &[usize]) -> Option<Vec<usize>> {
        let n = self.packed_values();
        if n == 1 {
            return Some(shape.to_vec());
        }
        let mut out = shape.to_vec();
        let last = out.last_mut()?;
        if *last % n != 0 {
            return None;
        }
        *last /= n;
        Some(out)
    }

    /// Whether this is a floating-point type (including float8/float4 and complex).
    pub fn is_floating_point(self) -> bool {
        matches!(
            self,
            DType::F16
                | DType::BF16
                | DType::F32
                | DType::F64
                | DType::F8E4M3Fn
                | DType::F8E5M2
                | DType::F8E4M3Fnuz
                | DType::F8E5M2Fnuz
                | DType::F8E8M0Fnu
                | DType::F4E2M1FnX2
                | DType::F6E2M3FnX4
                | DType::F6E3M2FnX4
        )
    }

    /// Whether this is a complex type.
    pub fn is_complex(self) -> bool {
        matches!(self, DType::C32 | DType::C64 | DType::C128)
    }

    /// Parses a torch dtype name, with or without the `torch.` prefix, including torch's aliases
    /// (`float` = float32, `half`, `double`, `long`, `int`, `short`, `cfloat`, `cdouble`, `chalf`).
    pub fn from_torch_name(name: &str) -> Option<DType> {
        let name = name.strip_prefix("torch.").unwrap_or(name);
        let alias = match name {
            "float" => Some(DType::F32),
            "double" => Some(DType::F64),
            "half" => Some(DType::F16),
            "long" => Some(DType::I64),
            "int" => Some(DType::I32),
            "short" => Some(DType::I16),
            "cfloat" => Some(DType::C64),
            "cdouble" => Some(DType::C128),
            "chalf" => Some(DType::C32),
            _ => None,
        };
        alias.or_else(|| TABLE.iter().find(|i| i.torch == name).map(|i| i.dtype))
    }

    /// Parses a legacy storage class name (`FloatStorage`, also `torch.cuda.FloatStorage`'s last part).
    pub fn from_legacy_storage_name(name: &str) -> Option<DType> {
        TABLE.iter().find(|i| matches!(i.storage, Typed(s) if s == name)).map(|i| i.dtype)
    }

    /// Parses a safetensors dtype code (`F32`). Also accepts the lowercase `bool` that some writers emit.
    pub fn from_safetensors_code(code: &str) -> Option<DType> {
        if code == "bool" {
            return Some(DType::Bool);
        }
        TABLE.iter().find(|i| i.safetensors == Some(code)).map(|i| i.dtype)
    }

    /// Parses a numpy type string (`<f4`, `|u1`, also `=f4`/`f4` without the byte-order character).
    pub fn from_numpy_str(s: &str) -> Option<DType> {
        let body = s.trim_start_matches(['<', '|', '=']);
        TABLE.iter().find(|i| i.numpy.is_some_and(|n| n.get(1..) == Some(body))).map(|i| i.dtype)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.torch_name())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn table_matches_declaration_order() {
        assert_eq!(TABLE.len(), DType::ALL.len());
        for (i, d) in DType::ALL.iter().enumerate() {
            assert_eq!(TABLE[i].dtype, *d);
            assert_eq!(*d as usize, i);
        }
    }

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_torch_name(d.torch_name()), Some(d));
            assert_eq!(DType::from_torch_name(&format!("torch.{d}")), Some(d));
            if let Some(s) = d.legacy_storage_name() {
                assert_eq!(DType::from_legacy_storage_name(s), Some(d));
            }
            if let Some(c) = d.safetensors_code() {
                assert_eq!(DType::from_safetensors_code(c), Some(d));
            }
            if let Some(n) = d.numpy_str() {
                assert_eq!(DType::from_numpy_str(n), Some(d));
            }
        }
        assert_eq!(DType::from_torch_name("float"), Some(DType::F32));
        assert_eq!(DType::from_torch_name("nonsense"), None);
        assert_eq!(DType::from_safetensors_code("bool"), Some(DType::Bool));
    }

    #[test]
    fn sizes() {
        assert_eq!(DType::C128.size(), 16);
        assert_eq!(DType::C32.size(), 4);
        assert_eq!(DType::F8E5M2.size(), 1);
        assert_eq!(DType::U16.storage_class(), StorageClass::Untyped);
        assert_eq!(DType::F32.storage_class(), StorageClass::Typed("FloatStorage"));
        assert_eq!(DType::F6E2M3FnX4.size(), 3);
    }

    #[test]
    fn packed_shapes_count_values_in_safetensors() {
        assert_eq!(DType::from_safetensors_code("F4"), Some(DType::F4E2M1FnX2));
        assert_eq!(DType::from_safetensors_code("F6_E3M2"), Some(DType::F6E3M2FnX4));
        assert_eq!(DType::F6E2M3FnX4.safetensors_shape(&[2, 3]), Some(vec![2, 12]));
        assert_eq!(DType::F6E2M3FnX4.shape_from_safetensors(&[2, 12]), Some(vec![2, 3]));
        assert_eq!(DType::F6E2M3FnX4.shape_from_safetensors(&[2, 6]), None);
        assert_eq!(DType::F4E2M1FnX2.safetensors_shape(&[]), None);
        assert_eq!(DType::F32.safetensors_shape(&[]), Some(vec![]));
        assert_eq!(DType::F4E2M1FnX2.shape_from_safetensors(&[]), None);
        assert_eq!(DType::I8.shape_from_safetensors(&[]), Some(vec![]));
        assert!(DType::ALL.iter().all(|d| d.in_torch() != d.torch_name().starts_with("float6_")));
    }
}
