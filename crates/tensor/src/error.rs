//! The core error type, split by who is at fault.

use std::path::PathBuf;
use std::sync::Arc;

use crate::DType;

/// Who is at fault for an error: the file, the library, a resource cap, the operating system, or the caller.
///
/// Every error of every ckpt crate has one ([`Error::fault`]; each format crate's error has a `fault()` too),
/// so callers can react to the class of a failure without matching on a crate's variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// The data violates its format (a corrupt, truncated or hostile file).
    Malformed,
    /// The data is valid but uses something this library does not handle.
    Unsupported,
    /// A resource limit was reached.
    Limit,
    /// The operating system failed (a missing file, a full disk, a permission).
    Io,
    /// The caller asked for something impossible (a missing entry, a slice out of range, a bad option).
    InvalidArgument,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fault::Malformed => "malformed data",
            Fault::Unsupported => "unsupported",
            Fault::Limit => "limit exceeded",
            Fault::Io => "I/O error",
            Fault::InvalidArgument => "invalid argument",
        })
    }
}

/// Errors raised by `ckpt-tensor` operations, split by who is at fault: the file (malformed), the library
/// (unsupported), a resource cap (limit), the operating system (I/O), or the caller (invalid argument).
///
/// Format crates have their own precise error enums. They convert into this one ([`FormatError`]) as
/// [`Error::Format`], which keeps their error whole as the [source](std::error::Error::source) together with
/// its fault class, so nothing is lost when an error passes through [`crate::CheckpointRead`]:
///
/// ```
/// use ckpt_tensor::{Error, Fault};
/// #[derive(Debug, thiserror::Error)]
/// #[error("record {0:?} is truncated")]
/// struct Truncated(String);
///
/// let e = Error::format(Fault::Malformed, Truncated("data/0".into()));
/// assert_eq!(e.fault(), Fault::Malformed);
/// assert_eq!(e.to_string(), "record \"data/0\" is truncated");
/// assert!(e.format_error::<Truncated>().is_some());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A shape whose element or byte count overflows `usize`.
    #[error("invalid argument: shape {shape:?} overflows")]
    ShapeOverflow {
        /// The shape.
        shape: Vec<usize>,
    },
    /// A buffer whose length is not the byte count of a contiguous tensor.
    #[error("invalid argument: a {dtype} tensor of shape {shape:?} needs {needed} bytes, the buffer has {available}")]
    BufferSizeMismatch {
        /// The element type.
        dtype: DType,
        /// The shape.
        shape: Vec<usize>,
        /// The bytes the tensor needs.
        needed: usize,
        /// The bytes the buffer has.
        available: usize,
    },
    /// A view whose shape and strides have different lengths.
    #[error("invalid argument: shape {shape:?} and strides {strides:?} have different lengths")]
    StridesLengthMismatch {
        /// The shape.
        shape: Vec<usize>,
        /// The strides.
        strides: Vec<usize>,
    },
    /// A view whose extent in its storage overflows `usize`.
    #[error("invalid argument: view (offset {storage_offset}, shape {shape:?}, strides {strides:?}) overflows")]
    ViewOverflow {
        /// The view's offset in its storage, in elements.
        storage_offset: usize,
        /// The shape.
        shape: Vec<usize>,
        /// The strides, in elements.
        strides: Vec<usize>,
    },
    /// A view that reaches past the end of its storage.
    #[error(
        "invalid argument: view (offset {storage_offset}, shape {shape:?}, strides {strides:?}) of {dtype} needs \
         {needed} bytes of storage, the storage has {available}"
    )]
    StorageTooShort {
        /// The element type.
        dtype: DType,
        /// The view's offset in its storage, in elements.
        storage_offset: usize,
        /// The shape.
        shape: Vec<usize>,
        /// The strides, in elements.
        strides: Vec<usize>,
        /// The bytes of storage the view needs.
        needed: usize,
        /// The bytes the storage has.
        available: usize,
    },
    /// A view found outside its storage when its bytes are read (a storage whose deferred fill failed).
    #[error("malformed data: tensor view outside its storage")]
    ViewOutsideStorage,
    /// The conjugation bit on a tensor that is not complex.
    #[error("invalid argument: conjugation bit on a {dtype} tensor")]
    ConjugateNotComplex {
        /// The tensor's element type.
        dtype: DType,
    },
    /// The negation bit on a tensor whose dtype has no negation.
    #[error("unsupported: negation bit on a {dtype} tensor")]
    NegationUnsupported {
        /// The tensor's element type.
        dtype: DType,
    },
    /// Memory that cannot be allocated.
    #[error("limit exceeded: cannot allocate {bytes} bytes")]
    AllocationFailed {
        /// The bytes asked for.
        bytes: usize,
    },
    /// A borrow of a tensor's elements that needs a contiguous tensor without conjugation or negation bits.
    #[error("invalid argument: as_slice needs a contiguous tensor without conjugation/negation bits")]
    NotContiguous,
    /// Tensor data that is not aligned for the element type asked for.
    #[error("invalid argument: tensor data is not aligned for {type_name}")]
    Misaligned {
        /// The Rust element type.
        type_name: &'static str,
    },
    /// A buffer that is not a whole, aligned slice of the type asked for.
    #[error(
        "invalid argument: buffer of {len} bytes at address {address:#x} is not a whole, aligned slice of {type_name}"
    )]
    NotTypedSlice {
        /// The buffer's length in bytes.
        len: usize,
        /// The buffer's address.
        address: usize,
        /// The Rust element type.
        type_name: &'static str,
    },
    /// Elements asked for as a type that is not the tensor's dtype.
    #[error("invalid argument: tensor is {found}, asked for {expected} ({type_name})")]
    DtypeMismatch {
        /// The dtype of the type asked for.
        expected: DType,
        /// The tensor's dtype.
        found: DType,
        /// The Rust element type asked for.
        type_name: &'static str,
    },
    /// A dimension index past a tensor's dimensions.
    #[error("invalid argument: dim {dim} of a {ndim}-dim tensor")]
    DimOutOfRange {
        /// The dimension asked for.
        dim: usize,
        /// The tensor's number of dimensions.
        ndim: usize,
    },
    /// A narrow past the end of its dimension.
    #[error("invalid argument: narrow {start}+{len} of dim {dim} of size {size}")]
    NarrowOutOfRange {
        /// The dimension.
        dim: usize,
        /// The first index.
        start: usize,
        /// The number of indices.
        len: usize,
        /// The dimension's size.
        size: usize,
    },
    /// A region whose offsets or sizes do not have one entry per dimension.
    #[error("invalid argument: region with {offsets} offsets and {sizes} sizes for a {ndim}-dim tensor")]
    RegionRankMismatch {
        /// The number of offsets.
        offsets: usize,
        /// The number of sizes.
        sizes: usize,
        /// The tensor's number of dimensions.
        ndim: usize,
    },
    /// A reshape to a shape of another element count.
    #[error("invalid argument: cannot reshape {from:?} ({numel} elements) to {to:?}")]
    ReshapeMismatch {
        /// The tensor's shape.
        from: Vec<usize>,
        /// The tensor's element count.
        numel: usize,
        /// The shape asked for.
        to: Vec<usize>,
    },
    /// A byte range past the end of a buffer made on demand (or its overflow).
    #[error("invalid argument: bytes {offset}+{len} of {total}")]
    ByteRangeOutOfRange {
        /// The first byte asked for.
        offset: usize,
        /// The number of bytes asked for.
        len: usize,
        /// The bytes there are.
        total: usize,
    },
    /// A slice that is not inside a buffer.
    #[error("invalid argument: slice {start}..{end} out of a buffer of {len} bytes")]
    SliceOutOfRange {
        /// The first byte.
        start: usize,
        /// The byte after the last one.
        end: usize,
        /// The buffer's length.
        len: usize,
    },
    /// A slice whose end overflows `usize`.
    #[error("invalid argument: slice at {offset} of {len} bytes overflows")]
    SliceOverflow {
        /// The first byte.
        offset: usize,
        /// The length.
        len: usize,
    },
    /// The fill of a buffer made on demand failed when its bytes were kept; the error is shared by every
    /// later read of them.
    #[error("malformed data: {source}")]
    DeferredFill {
        /// The fill's error.
        #[source]
        source: Arc<Error>,
    },
    /// A cast to a dtype that is not one of float16, bfloat16, float32, float64.
    #[error("invalid argument: cast to {to}: the targets are float16, bfloat16, float32, float64")]
    CastTarget {
        /// The dtype asked for.
        to: DType,
    },
    /// A cast of a packed float4 or float6 tensor: torch defines no conversion of them (torch 2.13's `.to()`
    /// of a `float4_e2m1fn_x2` tensor raises "copy_kernel not implemented", both ways).
    #[error(
        "unsupported: cast of a {from} tensor: torch defines no conversion of packed float4/float6 values \
         (its .to() raises \"not implemented\"); leave --dtype out, or --exclude these tensors"
    )]
    CastPacked {
        /// The tensor's dtype.
        from: DType,
    },
    /// A cast of a tensor that is not floating point.
    #[error("invalid argument: cast of a {from} tensor: not floating point")]
    CastSource {
        /// The tensor's dtype.
        from: DType,
    },
    /// A mapping key that has no string form in a flattened name.
    #[error("unsupported: str() of a {type_name} mapping key")]
    UnsupportedKey {
        /// The key's type.
        type_name: &'static str,
    },
    /// A state dict that is not a mapping.
    #[error("invalid argument: a state dict must be a mapping, got {type_name}")]
    StateDictNotMapping {
        /// The value's type.
        type_name: &'static str,
    },
    /// Two leaves of a state dict that flatten to one name.
    #[error("invalid argument: duplicated flatten key {key}")]
    DuplicateFlattenKey {
        /// The name.
        key: String,
    },
    /// An unflatten path that does not start with a key.
    #[error("invalid argument: path {path} must start with a key")]
    PathNotKeyFirst {
        /// The path, joined.
        path: String,
    },
    /// An empty unflatten path.
    #[error("invalid argument: empty path")]
    EmptyPath,
    /// An unflatten path with a list index above [`crate::flatten::MAX_UNFLATTEN_INDEX`].
    #[error("invalid argument: list index {index} in path {path} is above the limit {limit}")]
    ListIndexTooLarge {
        /// The index.
        index: usize,
        /// The path, joined.
        path: String,
        /// The largest index allowed.
        limit: usize,
    },
    /// An unflatten path that steps into a value that is neither a mapping nor a list as it asks.
    #[error("invalid argument: path {path} crosses a {type_name} at step {step}")]
    PathCrossesValue {
        /// The path, joined.
        path: String,
        /// The type of the value crossed.
        type_name: &'static str,
        /// The step, as written in a path.
        step: String,
    },
    /// A quantized, sparse or nested tensor whose components do not make a tensor of its layout and shape.
    #[error("malformed {layout} tensor: {reason}; the file is damaged or was not written by torch")]
    BadComposite {
        /// The tensor's layout.
        layout: crate::Layout,
        /// What is wrong.
        reason: String,
    },
    /// A dense form asked of a composite tensor that has none here.
    #[error("a {layout} tensor has no dense form here: {reason}; read its components instead")]
    NoDenseForm {
        /// The tensor's layout.
        layout: crate::Layout,
        /// Why.
        reason: &'static str,
    },
    /// An I/O error on a path.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// An error of another ckpt crate (a format crate, a durable commit of `ckpt-io`, a safetensors header),
    /// kept whole, with who is at fault.
    #[error("{source}")]
    Format {
        /// Who is at fault.
        fault: Fault,
        /// The format crate's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    /// A format crate's error `source`, with who is at fault.
    pub fn format(fault: Fault, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Error::Format { fault, source: Box::new(source) }
    }

    /// Who is at fault.
    pub fn fault(&self) -> Fault {
        match self {
            Error::ViewOutsideStorage | Error::DeferredFill { .. } | Error::BadComposite { .. } => Fault::Malformed,
            Error::NegationUnsupported { .. }
            | Error::UnsupportedKey { .. }
            | Error::CastPacked { .. }
            | Error::NoDenseForm { .. } => Fault::Unsupported,
            Error::AllocationFailed { .. } => Fault::Limit,
            Error::ShapeOverflow { .. }
            | Error::BufferSizeMismatch { .. }
            | Error::StridesLengthMismatch { .. }
            | Error::ViewOverflow { .. }
            | Error::StorageTooShort { .. }
            | Error::ConjugateNotComplex { .. }
            | Error::NotContiguous
            | Error::Misaligned { .. }
            | Error::NotTypedSlice { .. }
            | Error::DtypeMismatch { .. }
            | Error::DimOutOfRange { .. }
            | Error::NarrowOutOfRange { .. }
            | Error::RegionRankMismatch { .. }
            | Error::ReshapeMismatch { .. }
            | Error::ByteRangeOutOfRange { .. }
            | Error::SliceOutOfRange { .. }
            | Error::SliceOverflow { .. }
            | Error::CastTarget { .. }
            | Error::CastSource { .. }
            | Error::StateDictNotMapping { .. }
            | Error::DuplicateFlattenKey { .. }
            | Error::PathNotKeyFirst { .. }
            | Error::EmptyPath
            | Error::ListIndexTooLarge { .. }
            | Error::PathCrossesValue { .. } => Fault::InvalidArgument,
            Error::Io { .. } => Fault::Io,
            Error::Format { fault, .. } => *fault,
        }
    }

    /// The format crate's error, when this is an [`Error::Format`] holding an `E`.
    pub fn format_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Error::Format { source, .. } => source.downcast_ref::<E>(),
            Error::DeferredFill { source } => source.format_error(),
            _ => None,
        }
    }
}

/// An error of a ckpt crate other than the tensor model's own: it says who is at fault, and so converts into
/// the core [`Error`] as [`Error::Format`], kept whole as the source.
///
/// A crate writes only its fault table (an exhaustive `match` over its variants, in `fn fault`); the
/// conversion into [`Error`] (`From`, so `?` works) is written once here, for every implementor. The blanket
/// `impl<E: FormatError> From<E> for Error` is coherent with `impl<T> From<T> for T` because this trait is
/// this crate's own and [`Error`] never implements it (the compiler may rely on that, as `anyhow` does with
/// `std::error::Error`). An error that carries a core error through unchanged (a crate's `Core` variant, a
/// commit's plain I/O error) hands it back in [`FormatError::into_core`], so no core error is ever wrapped
/// in another.
///
/// ```
/// use ckpt_tensor::{Error, Fault, FormatError};
/// #[derive(Debug, thiserror::Error)]
/// enum RecordError {
///     #[error("record {0:?} is truncated")]
///     Truncated(String),
///     #[error(transparent)]
///     Core(#[from] Error),
/// }
///
/// impl FormatError for RecordError {
///     fn fault(&self) -> Fault {
///         match self {
///             RecordError::Truncated(_) => Fault::Malformed,
///             RecordError::Core(c) => c.fault(),
///         }
///     }
///     fn into_core(self) -> Result<Error, Self> {
///         match self {
///             RecordError::Core(c) => Ok(c),
///             e => Err(e),
///         }
///     }
/// }
///
/// let e = Error::from(RecordError::Truncated("data/0".into()));
/// assert_eq!(e.fault(), Fault::Malformed);
/// assert!(e.format_error::<RecordError>().is_some());
/// let core = Error::from(RecordError::Core(Error::EmptyPath));
/// assert!(matches!(core, Error::EmptyPath));
/// ```
pub trait FormatError: std::error::Error + Send + Sync + Sized + 'static {
    /// Who is at fault.
    fn fault(&self) -> Fault;

    /// The core error this one only carries through, given back as it is (`Ok`), or this error (`Err`) to be
    /// kept whole as the source of an [`Error::Format`]. By default every error is kept whole.
    fn into_core(self) -> std::result::Result<Error, Self> {
        Err(self)
    }
}

/// Every ckpt crate's error into the core one: its core error when it carries one, otherwise
/// [`Error::Format`] with its fault and the error kept whole as the source.
impl<E: FormatError> From<E> for Error {
    fn from(e: E) -> Self {
        match e.into_core() {
            Ok(core) => core,
            Err(e) => Error::Format { fault: e.fault(), source: Box::new(e) },
        }
    }
}

/// `Result` with the core [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error's message followed by each of its causes ([`source`](std::error::Error::source)) that the
/// message does not already include, joined by `separator` (`": "` on one line; the `ckpt` tool and the
/// Python package put each cause on a line of its own).
///
/// ```
/// let io = std::io::Error::other("disk on fire");
/// let e = ckpt_tensor::Error::io("/ckpt/model.pt", io);
/// assert_eq!(ckpt_tensor::error_chain(&e, ": "), "/ckpt/model.pt: disk on fire");
/// ```
pub fn error_chain(e: &dyn std::error::Error, separator: &str) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(separator);
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_a_fault() {
        assert_eq!(Error::ViewOutsideStorage.fault(), Fault::Malformed);
        assert_eq!(Error::NegationUnsupported { dtype: DType::U8 }.fault(), Fault::Unsupported);
        assert_eq!(Error::AllocationFailed { bytes: 1 }.fault(), Fault::Limit);
        assert_eq!(Error::EmptyPath.fault(), Fault::InvalidArgument);
        let kept = Error::DeferredFill { source: Arc::new(Error::EmptyPath) };
        assert_eq!(kept.fault(), Fault::Malformed);
        assert_eq!(std::error::Error::source(&kept).map(ToString::to_string), Some(Error::EmptyPath.to_string()));
        assert_eq!(Error::io("/x", std::io::Error::other("disk")).fault(), Fault::Io);
        let e = Error::format(Fault::Limit, std::io::Error::other("too big"));
        assert_eq!(e.fault(), Fault::Limit);
        // The format crate's error is the source, not a string.
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("too big"));
        assert!(e.format_error::<std::io::Error>().is_some());
        assert!(Error::EmptyPath.format_error::<std::io::Error>().is_none());
    }
}
