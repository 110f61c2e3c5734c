//! The rules a GGUF file, a tensor or a request can break, one variant each.

use ckpt_tensor::Fault;
use ckpt_tensor::FormatError;

use crate::GgmlType;

/// A GGUF rule that a file, a tensor or a request breaks.
///
/// The crate's functions return the core error; these convert into it as [`ckpt_tensor::Error::Format`] with
/// their [`GgufError::fault`], and [`ckpt_tensor::Error::format_error`] finds them again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file does not start with `GGUF`.
    #[error("malformed data: not a GGUF file: it starts with {found:02x?}, a GGUF file with \"GGUF\"")]
    NotGguf {
        /// The first bytes (up to four).
        found: Vec<u8>,
    },
    /// A big-endian GGUF file (its version reads byte-swapped).
    #[error("unsupported: a big-endian GGUF file (version {version}); ckpt reads little-endian GGUF only")]
    BigEndian {
        /// The version, read big-endian.
        version: u32,
    },
    /// A version other than 2 and 3 (version 1 counted with 32 bits and is long gone).
    #[error("unsupported: GGUF version {version}; ckpt reads versions 2 and 3")]
    UnsupportedVersion {
        /// The version field.
        version: u32,
    },
    /// The file ends inside the header.
    #[error(
        "malformed data: GGUF file truncated: {what} at byte {at} needs {needed} bytes, {available} remain (a copy or \
         download cut short?)"
    )]
    Truncated {
        /// What was being read.
        what: String,
        /// Where it starts.
        at: u64,
        /// The bytes it needs.
        needed: u64,
        /// The bytes left in the file.
        available: u64,
    },
    /// A count (of keys, tensors, array elements or string bytes) larger than the rest of the file could hold.
    #[error(
        "malformed data: GGUF {what} counts {count}, but the {available} bytes left in the file hold at most \
         {most} (the file is truncated, or corrupt)"
    )]
    CountTooLarge {
        /// What is counted.
        what: String,
        /// The count read.
        count: u64,
        /// The most the rest of the file can hold.
        most: u64,
        /// The bytes left.
        available: u64,
    },
    /// A metadata value type code GGUF does not define.
    #[error("malformed data: GGUF metadata {key:?}: unknown value type {code}")]
    UnknownValueType {
        /// The key.
        key: String,
        /// The code read.
        code: u32,
    },
    /// Arrays nested deeper than [`crate::MAX_ARRAY_DEPTH`].
    #[error("limit exceeded: GGUF metadata {key:?}: arrays nested deeper than {limit}")]
    NestingTooDeep {
        /// The key.
        key: String,
        /// The limit.
        limit: usize,
    },
    /// A key, string value or tensor name that is not UTF-8.
    #[error("malformed data: GGUF {what} is not UTF-8")]
    NotUtf8 {
        /// Which string.
        what: String,
    },
    /// One key twice.
    #[error("malformed data: GGUF metadata key {key:?} appears twice")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// `general.alignment` that is not a power of two in a UINT32.
    #[error(
        "malformed data: GGUF general.alignment is {found}; it must be a UINT32 power of two (ggml's default is 32)"
    )]
    BadAlignment {
        /// The value, in brief.
        found: String,
    },
    /// A tensor with more dimensions than [`crate::MAX_DIMS`].
    #[error("malformed data: GGUF tensor {tensor:?} has {n_dims} dimensions, at most {limit} are allowed")]
    TooManyDims {
        /// The tensor.
        tensor: String,
        /// The count read.
        n_dims: u32,
        /// The limit.
        limit: u32,
    },
    /// A ggml type code no ggml defines (or a newer one than ckpt knows).
    #[error("unsupported: GGUF tensor {tensor:?} has ggml type {code}, which ckpt does not know")]
    UnknownGgmlType {
        /// The tensor.
        tensor: String,
        /// The code read.
        code: u32,
    },
    /// Dimensions whose product (or byte size) overflows.
    #[error("malformed data: GGUF tensor {tensor:?}: dimensions {dims:?} overflow")]
    ShapeOverflow {
        /// The tensor.
        tensor: String,
        /// Its dimensions, as stored (innermost first).
        dims: Vec<u64>,
    },
    /// A row (the innermost dimension) that is not a whole number of blocks of the tensor's type.
    #[error(
        "malformed data: GGUF tensor {tensor:?}: its rows of {row} values are not whole {ggml_type} blocks of \
         {block_size}"
    )]
    PartialBlock {
        /// The tensor.
        tensor: String,
        /// Its type.
        ggml_type: GgmlType,
        /// The row length (`ne[0]`).
        row: u64,
        /// The type's block size.
        block_size: usize,
    },
    /// A tensor whose data offset is not a multiple of the file's alignment.
    #[error("malformed data: GGUF tensor {tensor:?}: offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        /// The tensor.
        tensor: String,
        /// Its offset, from the start of the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor whose data reaches past the end of the file.
    #[error(
        "malformed data: GGUF tensor {tensor:?}: its data (bytes {start}..{end}) ends past the end of the \
         {file_len}-byte file (truncated?)"
    )]
    TensorOutOfBounds {
        /// The tensor.
        tensor: String,
        /// The first byte, from the start of the file.
        start: u64,
        /// The end of its data.
        end: u64,
        /// The file's length.
        file_len: u64,
    },
    /// Two tensors whose data overlap.
    #[error("malformed data: GGUF tensors {first:?} and {second:?} overlap (bytes {second_start}..{first_end})")]
    OverlappingTensors {
        /// The tensor that starts first.
        first: String,
        /// The one that starts inside it.
        second: String,
        /// Where the second starts (from the start of the file).
        second_start: u64,
        /// Where the first ends.
        first_end: u64,
    },
    /// One tensor name twice.
    #[error("malformed data: GGUF tensor name {name:?} appears twice")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// A ggml type that ckpt does not dequantize (yet): its raw blocks can be read.
    #[error("unsupported: dequantizing {ggml_type} is not implemented yet; read the tensor's raw blocks instead")]
    NotDequantized {
        /// The type.
        ggml_type: GgmlType,
    },
    /// A ggml type that ckpt does not quantize to.
    #[error(
        "unsupported: ckpt writes GGUF tensors as F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 or MXFP4, not {ggml_type}"
    )]
    NotQuantized {
        /// The type.
        ggml_type: GgmlType,
    },
    /// A tensor whose dtype GGUF has no type for (bool, unsigned integers, complex, float8).
    #[error("unsupported: tensor {name:?}: GGUF has no type for {dtype} tensors")]
    UnwritableDtype {
        /// The tensor.
        name: String,
        /// Its dtype.
        dtype: ckpt_tensor::DType,
    },
    /// An alignment to write that is not a power of two.
    #[error("invalid argument: GGUF alignment {alignment} is not a power of two")]
    WriteAlignment {
        /// The alignment asked for.
        alignment: u32,
    },
    /// Block bytes or an output whose length does not fit whole blocks of the type.
    #[error(
        "invalid argument: {ggml_type}: {bytes} bytes of blocks and {values} values do not make whole blocks of \
         {block_size} values in {type_size} bytes"
    )]
    BlockLength {
        /// The type.
        ggml_type: GgmlType,
        /// The bytes given.
        bytes: usize,
        /// The values asked for.
        values: usize,
        /// Values per block.
        block_size: usize,
        /// Bytes per block.
        type_size: usize,
    },
    /// A dtype to dequantize to other than f32, f16 and bf16.
    #[error("invalid argument: GGUF tensors dequantize to float32, float16 or bfloat16, not {dtype}")]
    DequantizeDtype {
        /// The dtype asked for.
        dtype: ckpt_tensor::DType,
    },
    /// An entry (metadata key or tensor) asked for that the file does not hold.
    #[error("invalid argument: the GGUF file has no metadata key or tensor named {name:?}")]
    NoSuchEntry {
        /// The name asked for.
        name: String,
    },
    /// A tensor asked for that the file does not hold.
    #[error("invalid argument: the GGUF file has no tensor named {name:?}")]
    NoSuchTensor {
        /// The name asked for.
        name: String,
    },
}

impl FormatError for GgufError {
    /// Who is at fault.
    fn fault(&self) -> Fault {
        match self {
            GgufError::NotGguf { .. }
            | GgufError::Truncated { .. }
            | GgufError::CountTooLarge { .. }
            | GgufError::UnknownValueType { .. }
            | GgufError::NotUtf8 { .. }
            | GgufError::DuplicateKey { .. }
            | GgufError::BadAlignment { .. }
            | GgufError::TooManyDims { .. }
            | GgufError::ShapeOverflow { .. }
            | GgufError::PartialBlock { .. }
            | GgufError::MisalignedOffset { .. }
            | GgufError::TensorOutOfBounds { .. }
            | GgufError::OverlappingTensors { .. }
            | GgufError::DuplicateTensor { .. } => Fault::Malformed,
            GgufError::BigEndian { .. }
            | GgufError::UnsupportedVersion { .. }
            | GgufError::UnknownGgmlType { .. }
            | GgufError::NotDequantized { .. }
            | GgufError::NotQuantized { .. }
            | GgufError::UnwritableDtype { .. } => Fault::Unsupported,
            GgufError::NestingTooDeep { .. } => Fault::Limit,
            GgufError::BlockLength { .. }
            | GgufError::WriteAlignment { .. }
            | GgufError::DequantizeDtype { .. }
            | GgufError::NoSuchEntry { .. }
            | GgufError::NoSuchTensor { .. } => Fault::InvalidArgument,
        }
    }
}
