//! The rules of reading and writing safetensors files beyond the header's ([`crate::header::HeaderError`]),
//! one variant each.

use ckpt_tensor::FormatError;
use ckpt_tensor::{DType, Fault};

/// A safetensors rule that a file, a tensor or a request breaks.
///
/// The crate's functions return the core error; these convert into it as [`ckpt_tensor::Error::Format`]
/// with their [`SafetensorsError::fault`], and [`ckpt_tensor::Error::format_error`] finds them again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SafetensorsError {
    /// The data region of the tensors to write overflows `usize`.
    #[error("limit exceeded: safetensors data size overflows")]
    DataSizeOverflow,
    /// The header of the tensors to write cannot be serialized.
    #[error("invalid argument: safetensors header: {source}")]
    HeaderJson {
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// The checksum placeholder is missing from the written header.
    #[error("invalid argument: safetensors header: checksum placeholder not found")]
    ChecksumPlaceholderMissing,
    /// A dtype safetensors cannot hold (complex128, complex32, quantized, bits).
    #[error("unsupported: dtype {} cannot be stored in safetensors", dtype.torch_name())]
    UnstorableDtype {
        /// The tensor's dtype.
        dtype: DType,
    },
    /// A safetensors dtype ckpt has no equivalent for (one a later safetensors adds).
    #[error("unsupported: safetensors dtype {dtype:?} has no torch equivalent")]
    NoTorchDtype {
        /// The safetensors dtype.
        dtype: safetensors::Dtype,
    },
    /// A value that the metadata encoding has no form for.
    #[error("unsupported: {at}: {value} cannot be recorded in safetensors metadata")]
    UnrecordableValue {
        /// Where the value is in the state dict.
        at: String,
        /// The value, in brief ([`ckpt_tensor::brief()`]).
        value: String,
    },
    /// A 0-dimensional tensor of a packed dtype (`float4_e2m1fn_x2`, the float6 dtypes): safetensors counts
    /// values in the last dimension, and a tensor without one has no safetensors shape.
    #[error(
        "unsupported: tensor {name:?}: a 0-dimensional {dtype} tensor cannot be stored in safetensors, which \
         counts packed values along the last dimension (reshape it to [1] first)"
    )]
    PackedScalar {
        /// The tensor's name.
        name: String,
        /// Its dtype.
        dtype: DType,
    },
    /// A tensor whose dtype has no same-size stand-in that safetensors holds.
    #[error("unsupported: a {dtype} tensor in safetensors")]
    NoStandInDtype {
        /// The tensor's dtype.
        dtype: DType,
    },
    /// An entry asked for as a tensor that is not a dense tensor.
    #[error("invalid argument: entry {name:?} is not a dense tensor")]
    NotADenseTensor {
        /// The entry's name.
        name: String,
    },
    /// A quantized, sparse or nested tensor asked for as a dense tensor.
    #[error(
        "{name:?} is a {layout} tensor, not a dense one: read its components (ckpt cat, the entry's value) or \
         make it dense (convert --dense)"
    )]
    CompositeTensor {
        /// The entry's name.
        name: String,
        /// Its layout.
        layout: ckpt_tensor::Layout,
    },
    /// A tensor asked for that the file does not hold.
    #[error("invalid argument: no tensor named {name:?}")]
    NoSuchTensor {
        /// The name asked for.
        name: String,
    },
    /// An entry asked for that the file does not hold.
    #[error("invalid argument: no entry named {name:?}")]
    NoSuchEntry {
        /// The name asked for.
        name: String,
    },
    /// Two entries of one name to write.
    #[error("invalid argument: two entries are named {name:?}")]
    DuplicateEntry {
        /// The name.
        name: String,
    },
    /// The bytes of a tensor of a partial local copy could not be made present ([`crate::ReadOptions::fill`]).
    #[error("I/O error: fetching bytes {start}..{end} of {file:?}: {source}")]
    Fetch {
        /// The file, as named to the fill hook.
        file: String,
        /// The first byte asked for.
        start: u64,
        /// The end of the bytes asked for.
        end: u64,
        /// The fill hook's error.
        #[source]
        source: std::io::Error,
    },
}

impl FormatError for SafetensorsError {
    /// Who is at fault.
    fn fault(&self) -> Fault {
        match self {
            SafetensorsError::DataSizeOverflow => Fault::Limit,
            SafetensorsError::Fetch { .. } => Fault::Io,
            SafetensorsError::UnstorableDtype { .. }
            | SafetensorsError::NoTorchDtype { .. }
            | SafetensorsError::PackedScalar { .. }
            | SafetensorsError::UnrecordableValue { .. }
            | SafetensorsError::NoStandInDtype { .. }
            | SafetensorsError::CompositeTensor { .. } => Fault::Unsupported,
            SafetensorsError::HeaderJson { .. }
            | SafetensorsError::ChecksumPlaceholderMissing
            | SafetensorsError::NotADenseTensor { .. }
            | SafetensorsError::NoSuchTensor { .. }
            | SafetensorsError::NoSuchEntry { .. }
            | SafetensorsError::DuplicateEntry { .. } => Fault::InvalidArgument,
        }
    }
}
