//! Conversions between [`Tensor`] and [`tch::Tensor`] (libtorch through the `tch` crate, version 0.26).
//!
//! Both directions **copy** the bytes: a `tch::Tensor` owns libtorch memory and a [`Tensor`] owns (or maps)
//! Rust memory, and neither can safely borrow the other's. What the copy keeps is chosen with
//! [`CopyMode`]; the plain conversions ([`to_tch`], [`from_tch`] and the `TryFrom` impls) use
//! [`CopyMode::Storage`], which keeps everything torch would: dtype, shape, strides, storage offset and
//! `requires_grad`.
//!
//! | ckpt [`DType`] | [`tch::Kind`] |
//! |---|---|
//! | `bool`, `uint8`, `int8`, `int16`, `int32`, `int64` | `Bool`, `Uint8`, `Int8`, `Int16`, `Int`, `Int64` |
//! | `float16`, `bfloat16`, `float32`, `float64` | `Half`, `BFloat16`, `Float`, `Double` |
//! | `complex32`, `complex64`, `complex128` | `ComplexHalf`, `ComplexFloat`, `ComplexDouble` |
//! | `float8_e4m3fn`, `float8_e5m2` | `Float8e4m3fn`, `Float8e5m2` |
//! | `float8_e4m3fnuz`, `float8_e5m2fnuz` | `Float8e4m3fnuz`, `Float8e5m2fnuz` |
//!
//! Every other dtype is refused ([`TchError::QuantizedDtype`], [`TchError::NoKind`]): `uint16`, `uint32`, `uint64`, `float8_e8m0fnu`,
//! `float4_e2m1fn_x2` and the `bits*` dtypes have no `tch::Kind` in tch 0.26, and the quantized dtypes (`qint8`, `quint8`,
//! `qint32`, `quint4x2`, `quint2x4`) need a scale and zero point that a [`Tensor`] does not carry (tch has
//! `QInt8`/`QUInt8`/`QInt32` kinds, but a quantized `tch::Tensor` is rejected too).
//!
//! ```
//! use ckpt_tensor::Tensor;
//! use ckpt_tensor::tch_interop::{from_tch, to_tch};
//!
//! let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?.transpose(0, 1)?;
//! let tt = to_tch(&t)?; // a copy, with the transposed strides kept
//! assert_eq!(tt.size(), [3, 2]);
//! assert_eq!(tt.stride(), [1, 3]);
//! assert_eq!(tt.double_value(&[2, 1]), 6.0);
//!
//! let back = from_tch(&(&tt * 2.0))?; // tch's result, converted back (another copy)
//! assert_eq!(back.to_vec::<f32>()?, [2.0, 8.0, 4.0, 10.0, 6.0, 12.0]);
//! # Ok::<(), ckpt_tensor::Error>(())
//! ```

use tch::{Device, Kind};

use crate::aligned::AlignedBytes;
use crate::buffer::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Fault, Result};
use crate::tensor::{Tensor, required_storage_elements};

/// The rules of a conversion between [`Tensor`] and [`tch::Tensor`], one variant each.
///
/// They convert into the core error as [`Error::Format`] with their fault ([`crate::FormatError::fault`]), keeping this error
/// as the source ([`Error::format_error`] finds it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TchError {
    /// A quantized dtype: its scale and zero point are not in a [`Tensor`].
    #[error("unsupported: dtype {} is quantized; quantized tensors cannot be converted to tch", dtype.torch_name())]
    QuantizedDtype {
        /// The tensor's dtype.
        dtype: DType,
    },
    /// A dtype that has no [`tch::Kind`] in tch 0.26.
    #[error("unsupported: dtype {} has no tch::Kind in tch 0.26", dtype.torch_name())]
    NoKind {
        /// The tensor's dtype.
        dtype: DType,
    },
    /// A quantized [`tch::Kind`]: its scale and zero point have no place in a [`Tensor`].
    #[error("unsupported: quantized tch kind {kind:?}: its scale and zero point have no place in a ckpt tensor")]
    QuantizedKind {
        /// The tch kind.
        kind: Kind,
    },
    /// A tensor that requires grad with a dtype that torch does not let require gradients.
    #[error(
        "unsupported: a {dtype} tensor that requires grad: torch only lets floating point and complex tensors \
         require gradients"
    )]
    GradOnNonFloat {
        /// The tensor's dtype.
        dtype: DType,
    },
    /// An undefined `tch::Tensor`.
    #[error("invalid argument: undefined tch tensor")]
    Undefined,
    /// A `tch::Tensor` with the mkldnn layout.
    #[error("unsupported: tch tensor with the mkldnn layout (only strided tensors convert)")]
    Mkldnn,
    /// A sparse `tch::Tensor`.
    #[error("unsupported: sparse tch tensor (only strided tensors convert)")]
    Sparse,
    /// A `tch::Tensor` whose layout libtorch cannot tell as strided.
    #[error("unsupported: tch tensor without a strided layout: {source}")]
    NotStrided {
        /// libtorch's error.
        #[source]
        source: tch::TchError,
    },
    /// A libtorch scalar type that tch 0.26 has no kind for.
    #[error(
        "unsupported: tch tensor of libtorch scalar type {code}, which tch 0.26 has no kind for (uint16/32/64, \
         float8_e8m0fnu, float4_e2m1fn_x2, ...)"
    )]
    UnknownScalarType {
        /// libtorch's scalar type code.
        code: i32,
    },
    /// A byte count of a copy that overflows `usize`.
    #[error("invalid argument: {numel} elements of {element_size} bytes overflow")]
    CopyOverflow {
        /// The elements.
        numel: usize,
        /// The bytes of one element.
        element_size: usize,
    },
    /// A libtorch call that failed.
    #[error("invalid argument: libtorch {operation}: {source}")]
    Libtorch {
        /// The libtorch operation.
        operation: &'static str,
        /// libtorch's error.
        #[source]
        source: tch::TchError,
    },
    /// A size, stride or offset that does not fit libtorch's `i64`.
    #[error("invalid argument: {what} {value} does not fit libtorch's i64")]
    TooLargeForLibtorch {
        /// What the number is (size, stride, storage offset, ...).
        what: &'static str,
        /// The number.
        value: usize,
    },
    /// A negative size, stride or offset of a `tch::Tensor`.
    #[error("unsupported: tch tensor with {what} {value}")]
    Negative {
        /// What the number is (size, stride, storage offset).
        what: &'static str,
        /// The number.
        value: i64,
    },
}

impl crate::FormatError for TchError {
    /// Who is at fault.
    fn fault(&self) -> Fault {
        match self {
            TchError::QuantizedDtype { .. }
            | TchError::NoKind { .. }
            | TchError::QuantizedKind { .. }
            | TchError::GradOnNonFloat { .. }
            | TchError::Mkldnn
            | TchError::Sparse
            | TchError::NotStrided { .. }
            | TchError::UnknownScalarType { .. }
            | TchError::Negative { .. } => Fault::Unsupported,
            TchError::Undefined
            | TchError::CopyOverflow { .. }
            | TchError::Libtorch { .. }
            | TchError::TooLargeForLibtorch { .. } => Fault::InvalidArgument,
        }
    }
}

/// What a conversion copies, and so which parts of the layout survive it.
///
/// A view's *span* is the run of storage elements from its first addressed element (the storage offset)
/// to its last; its *elements* are the `numel` values it shows. Whatever the mode, dtype, shape, values and
/// `requires_grad` are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CopyMode {
    /// Copy the storage from its start through the last element the view addresses; the result has the same
    /// strides **and storage offset** as the source (a faithful replica of the view, as torch lays it out).
    ///
    /// Costs `storage_offset + span` elements, which for a small view deep inside a large shared storage (a
    /// parameter of a flat FSDP buffer) is most of that storage: use [`CopyMode::Span`] there.
    #[default]
    Storage,
    /// Copy only the view's span; the result has the same strides and storage offset 0. Costs `span`
    /// elements: `numel` for dense views (transposes, permutes, contiguous slices), less for zero-stride
    /// expansions, more for views that step over elements.
    Span,
    /// Copy only the view's elements, in row-major order; the result is contiguous with storage offset 0.
    /// Costs exactly `numel` elements.
    Contiguous,
}

/// The [`tch::Kind`] of a dtype.
///
/// # Errors
/// [`TchError::NoKind`] naming the dtype if tch has no kind for it (the unsigned 16/32/64-bit integers,
/// `float8_e8m0fnu`, `float4_e2m1fn_x2`, the `bits*` dtypes), [`TchError::QuantizedDtype`] if it is
/// quantized (both [`Fault::Unsupported`]).
pub fn dtype_to_kind(dtype: DType) -> Result<Kind> {
    Ok(match dtype {
        DType::Bool => Kind::Bool,
        DType::U8 => Kind::Uint8,
        DType::I8 => Kind::Int8,
        DType::I16 => Kind::Int16,
        DType::I32 => Kind::Int,
        DType::I64 => Kind::Int64,
        DType::F16 => Kind::Half,
        DType::BF16 => Kind::BFloat16,
        DType::F32 => Kind::Float,
        DType::F64 => Kind::Double,
        DType::C32 => Kind::ComplexHalf,
        DType::C64 => Kind::ComplexFloat,
        DType::C128 => Kind::ComplexDouble,
        DType::F8E4M3Fn => Kind::Float8e4m3fn,
        DType::F8E5M2 => Kind::Float8e5m2,
        DType::F8E4M3Fnuz => Kind::Float8e4m3fnuz,
        DType::F8E5M2Fnuz => Kind::Float8e5m2fnuz,
        DType::QInt8 | DType::QUInt8 | DType::QInt32 | DType::QUInt4x2 | DType::QUInt2x4 => {
            return Err(TchError::QuantizedDtype { dtype }.into());
        }
        other => {
            return Err(TchError::NoKind { dtype: other }.into());
        }
    })
}

/// The dtype of a [`tch::Kind`].
///
/// # Errors
/// [`TchError::QuantizedKind`] for the quantized kinds (`QInt8`, `QUInt8`, `QInt32`).
pub fn kind_to_dtype(kind: Kind) -> Result<DType> {
    Ok(match kind {
        Kind::Bool => DType::Bool,
        Kind::Uint8 => DType::U8,
        Kind::Int8 => DType::I8,
        Kind::Int16 => DType::I16,
        Kind::Int => DType::I32,
        Kind::Int64 => DType::I64,
        Kind::Half => DType::F16,
        Kind::BFloat16 => DType::BF16,
        Kind::Float => DType::F32,
        Kind::Double => DType::F64,
        Kind::ComplexHalf => DType::C32,
        Kind::ComplexFloat => DType::C64,
        Kind::ComplexDouble => DType::C128,
        Kind::Float8e4m3fn => DType::F8E4M3Fn,
        Kind::Float8e5m2 => DType::F8E5M2,
        Kind::Float8e4m3fnuz => DType::F8E4M3Fnuz,
        Kind::Float8e5m2fnuz => DType::F8E5M2Fnuz,
        Kind::QInt8 | Kind::QUInt8 | Kind::QInt32 => {
            return Err(TchError::QuantizedKind { kind }.into());
        }
    })
}

/// Converts a [`Tensor`] to a CPU [`tch::Tensor`], copying with [`CopyMode::Storage`]: dtype, shape, strides,
/// storage offset and `requires_grad` are kept.
///
/// The copy is of the storage from its start through the view's last element (see [`CopyMode`] for the
/// cost); use [`to_tch_with`] to copy less. Bytes are copied verbatim: a `bool` tensor whose bytes are not 0
/// or 1 stays that way.
///
/// # Errors
/// As [`dtype_to_kind`]; [`TchError::GradOnNonFloat`] if the tensor requires grad but is not floating
/// point or complex (torch forbids that); [`TchError::TooLargeForLibtorch`] if a size, stride or offset does
/// not fit in `i64`; [`TchError::Libtorch`] if libtorch fails.
///
/// ```
/// use ckpt_tensor::Tensor;
/// let t = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6], &[2, 3])?.narrow(1, 1, 2)?;
/// let tt = ckpt_tensor::tch_interop::to_tch(&t)?;
/// assert_eq!((tt.size(), tt.stride(), tt.storage_offset()), (vec![2, 2], vec![3, 1], 1));
/// assert_eq!(tt.int64_value(&[1, 0]), 5);
/// # Ok::<(), ckpt_tensor::Error>(())
/// ```
pub fn to_tch(tensor: &Tensor) -> Result<tch::Tensor> {
    to_tch_with(tensor, CopyMode::Storage)
}

/// Converts a [`Tensor`] to a CPU [`tch::Tensor`], copying what `mode` says (see [`CopyMode`]).
///
/// # Errors
/// As [`to_tch`].
///
/// ```
/// use ckpt_tensor::Tensor;
/// use ckpt_tensor::tch_interop::{CopyMode, to_tch_with};
/// let t = Tensor::from_slice(&[0.5f64; 1000], &[1000])?.narrow(0, 990, 10)?;
/// let tt = to_tch_with(&t, CopyMode::Span)?; // copies 10 elements, not 1000
/// assert_eq!((tt.size(), tt.storage_offset()), (vec![10], 0));
/// # Ok::<(), ckpt_tensor::Error>(())
/// ```
pub fn to_tch_with(tensor: &Tensor, mode: CopyMode) -> Result<tch::Tensor> {
    let dtype = tensor.dtype();
    let kind = dtype_to_kind(dtype)?;
    if tensor.requires_grad() && !(dtype.is_floating_point() || dtype.is_complex()) {
        return Err(TchError::GradOnNonFloat { dtype }.into());
    }
    let size = to_i64s(tensor.shape(), "size")?;
    let es = dtype.size();
    let out = match mode {
        CopyMode::Contiguous => {
            let data = tensor.data()?;
            tch_call("from_data_size", tch::Tensor::f_from_data_size(&data, &size, kind))?
        }
        CopyMode::Storage | CopyMode::Span => {
            let end = required_storage_elements(tensor.shape(), tensor.strides(), tensor.storage_offset()).ok_or_else(
                || Error::ViewOverflow {
                    storage_offset: tensor.storage_offset(),
                    shape: tensor.shape().to_vec(),
                    strides: tensor.strides().to_vec(),
                },
            )?;
            // An empty view addresses nothing (`end` is 0); keep its offset only when copying the storage.
            let (start, offset) = match mode {
                CopyMode::Storage => (0, tensor.storage_offset()),
                _ => (end.min(tensor.storage_offset()), 0),
            };
            let bytes = tensor.storage().as_bytes().get(start * es..end * es).ok_or(Error::ViewOutsideStorage)?;
            let flat_len = to_i64(end - start, "storage length")?;
            let flat = tch_call("from_data_size", tch::Tensor::f_from_data_size(bytes, &[flat_len], kind))?;
            let stride = to_i64s(tensor.strides(), "stride")?;
            let offset = to_i64(offset, "storage offset")?;
            let view = tch_call("as_strided", flat.f_as_strided(size.as_slice(), stride.as_slice(), Some(offset)))?;
            // A plain tensor sharing the storage, not an autograd view of `flat`.
            tch_call("detach", view.f_detach())?
        }
    };
    if tensor.requires_grad() { tch_call("set_requires_grad", out.f_set_requires_grad(true)) } else { Ok(out) }
}

/// Converts a [`tch::Tensor`] to a [`Tensor`], copying with [`CopyMode::Storage`]: dtype, shape, strides,
/// storage offset and `requires_grad` are kept.
///
/// A tensor on another device is first copied to the CPU with `to(Device::Cpu)` (which keeps the strides
/// of dense tensors but not the storage offset); a tensor with the lazy conjugate or negative bit set
/// (`conj()` of a complex tensor) is materialised first (its storage offset becomes 0). Use
/// [`from_tch_with`] to copy less.
///
/// # Errors
/// [`Fault::Unsupported`] for non-strided layouts ([`TchError::Sparse`], [`TchError::Mkldnn`],
/// [`TchError::NotStrided`]), quantized kinds and scalar types tch 0.26 has no kind for
/// ([`TchError::UnknownScalarType`], `uint16`, ...); [`TchError::Undefined`] for an undefined tensor;
/// [`TchError::Libtorch`] if libtorch fails (for example moving a `meta` tensor to the CPU).
///
/// ```
/// let t = tch::Tensor::arange(6, (tch::Kind::Float, tch::Device::Cpu)).view([2, 3]).tr();
/// let c = ckpt_tensor::tch_interop::from_tch(&t)?;
/// assert_eq!((c.shape(), c.strides()), (&[3, 2][..], &[1, 3][..]));
/// assert_eq!(c.to_vec::<f32>()?, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
/// # Ok::<(), ckpt_tensor::Error>(())
/// ```
pub fn from_tch(tensor: &tch::Tensor) -> Result<Tensor> {
    from_tch_with(tensor, CopyMode::Storage)
}

/// Converts a [`tch::Tensor`] to a [`Tensor`], copying what `mode` says (see [`CopyMode`] and
/// [`from_tch`]).
///
/// # Errors
/// As [`from_tch`].
pub fn from_tch_with(tensor: &tch::Tensor, mode: CopyMode) -> Result<Tensor> {
    if !tensor.defined() {
        return Err(TchError::Undefined.into());
    }
    // Layout first: size()/stride() panic inside tch on layouts without strides.
    if tensor.is_mkldnn() {
        return Err(TchError::Mkldnn.into());
    }
    match tensor.f_sparse_dim() {
        Ok(0) if !tensor.is_sparse() => {}
        Ok(_) => {
            return Err(TchError::Sparse.into());
        }
        Err(e) => {
            return Err(TchError::NotStrided { source: e }.into());
        }
    }
    let kind = tensor.f_kind().map_err(|e| match e {
        tch::TchError::UnknownKind(code) => TchError::UnknownScalarType { code },
        other => TchError::Libtorch { operation: "scalar_type", source: other },
    })?;
    let dtype = kind_to_dtype(kind)?;
    let requires_grad = tensor.requires_grad();

    let mut t = tch_call("detach", tensor.f_detach())?;
    if t.device() != Device::Cpu {
        t = tch_call("to(cpu)", t.f_to(Device::Cpu))?;
    }
    if tch_call("is_conj", t.f_is_conj())? {
        t = tch_call("resolve_conj", t.f_resolve_conj())?;
    }
    if tch_call("is_neg", t.f_is_neg())? {
        t = tch_call("resolve_neg", t.f_resolve_neg())?;
    }

    let shape = to_usizes(&t.size(), "size")?;
    let es = dtype.size();
    let mut out = match mode {
        CopyMode::Contiguous => {
            let numel = shape
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| Error::ShapeOverflow { shape: shape.clone() })?;
            let storage = copy_out(&t, numel, es)?;
            Tensor::from_buffer(dtype, &shape, storage)?
        }
        CopyMode::Storage | CopyMode::Span => {
            let strides = to_usizes(&t.stride(), "stride")?;
            let offset = to_usize(tch_call("storage_offset", t.f_storage_offset())?, "storage offset")?;
            let end = required_storage_elements(&shape, &strides, offset).ok_or_else(|| Error::ViewOverflow {
                storage_offset: offset,
                shape: shape.clone(),
                strides: strides.clone(),
            })?;
            let (start, keep_offset) = match mode {
                CopyMode::Storage => (0, offset),
                _ => (end.min(offset), 0),
            };
            let len = end - start;
            // A flat 1-d view of the storage run to copy; libtorch checks it lies inside the storage.
            let flat = tch_call(
                "as_strided",
                t.f_as_strided(
                    [to_i64(len, "storage length")?].as_slice(),
                    [1i64].as_slice(),
                    Some(to_i64(start, "storage offset")?),
                ),
            )?;
            let storage = copy_out(&flat, len, es)?;
            Tensor::from_parts(dtype, &shape, &strides, keep_offset, storage)?
        }
    };
    out.set_requires_grad(requires_grad);
    Ok(out)
}

impl TryFrom<&Tensor> for tch::Tensor {
    type Error = Error;

    /// [`to_tch`]: a copy keeping dtype, shape, strides, storage offset and `requires_grad`.
    fn try_from(tensor: &Tensor) -> Result<Self> {
        to_tch(tensor)
    }
}

impl TryFrom<&tch::Tensor> for Tensor {
    type Error = Error;

    /// [`from_tch`]: a copy keeping dtype, shape, strides, storage offset and `requires_grad`.
    fn try_from(tensor: &tch::Tensor) -> Result<Self> {
        from_tch(tensor)
    }
}

/// Copies the first `numel` elements of `t` (in row-major order) into a new 64-byte aligned buffer.
fn copy_out(t: &tch::Tensor, numel: usize, element_size: usize) -> Result<Buffer> {
    let len = numel.checked_mul(element_size).ok_or(TchError::CopyOverflow { numel, element_size })?;
    let mut bytes = AlignedBytes::zeroed(len)?;
    if len > 0 {
        tch_call("copy_data", t.f_copy_data_u8(bytes.as_mut_bytes(), numel))?;
    }
    Ok(Buffer::from_owner(bytes))
}

/// Maps a libtorch failure to [`TchError::Libtorch`], naming the operation and keeping libtorch's error.
fn tch_call<T>(operation: &'static str, r: std::result::Result<T, tch::TchError>) -> Result<T> {
    r.map_err(|source| TchError::Libtorch { operation, source }.into())
}

fn to_i64(v: usize, what: &'static str) -> Result<i64> {
    i64::try_from(v).map_err(|_| TchError::TooLargeForLibtorch { what, value: v }.into())
}

fn to_i64s(v: &[usize], what: &'static str) -> Result<Vec<i64>> {
    v.iter().map(|&x| to_i64(x, what)).collect()
}

fn to_usize(v: i64, what: &'static str) -> Result<usize> {
    usize::try_from(v).map_err(|_| TchError::Negative { what, value: v }.into())
}

fn to_usizes(v: &[i64], what: &'static str) -> Result<Vec<usize>> {
    v.iter().map(|&x| to_usize(x, what)).collect()
}
