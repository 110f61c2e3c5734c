//! Errors of the torch.save codec: one variant per rule, each saying what was expected.

use std::path::PathBuf;

use ckpt_tensor::Fault;
use ckpt_tensor::FormatError;

use crate::zip::ZipError;

/// What went wrong reading or writing a `torch.save` file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error inside a file, with its path.
    #[error("{}: {source}", path.display())]
    At {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: Box<Error>,
    },
    /// An I/O error.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file is empty.
    #[error("the file is empty, not a torch checkpoint")]
    Empty,
    /// A git-LFS pointer was found where the weights should be.
    #[error("this is a git-LFS pointer file, not the weights: run `git lfs pull` to fetch the real file")]
    GitLfsPointer,
    /// An HTML page was found where the weights should be.
    #[error("this is an HTML page, not a checkpoint (a download that returned a web page?)")]
    Html,
    /// A safetensors file was given to the torch reader.
    #[error("this is a safetensors file, not a torch.save file: read it with ckpt_safetensors")]
    Safetensors,
    /// A pre-0.1.10 TAR checkpoint.
    #[error(
        "this is a TAR-era torch checkpoint (torch < 0.1.10), which is not supported; load and re-save it with an old torch"
    )]
    TarFormat,
    /// The 2018 preview format.
    #[error("this is a torch preview-release archive (PYTORCH1), which torch itself no longer reads")]
    PreviewFormat,
    /// Nothing recognisable.
    #[error("not a torch checkpoint: unrecognised leading bytes {head:02x?}")]
    Unrecognized {
        /// The first bytes of the file.
        head: Vec<u8>,
    },
    /// The ZIP container is invalid.
    #[error("zip container: {0}")]
    Zip(#[from] ZipError),
    /// The bytes of a record of a partial local copy could not be made present ([`crate::ReadOptions::fill`]).
    #[error("fetching record {name:?} (bytes {start}..{end} of {file:?}): {source}")]
    Fetch {
        /// Record name without the prefix.
        name: String,
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
    /// A required record is missing from the archive.
    #[error("the archive has no record {name:?}")]
    MissingRecord {
        /// Record name without the prefix.
        name: String,
    },
    /// The `version` record is not a supported version.
    #[error("unsupported archive version {found:?} (expected an integer 1..=10)")]
    BadVersion {
        /// The record's text.
        found: String,
    },
    /// A record uses a compression method other than stored and DEFLATE.
    #[error("record {name:?} is compressed with method {method}; stored (0) and DEFLATE (8) records are read")]
    Compressed {
        /// Record name.
        name: String,
        /// Compression method.
        method: u16,
    },
    /// The `byteorder` record says big-endian.
    #[error(
        "the checkpoint was written on a big-endian machine (byteorder = {found:?}); only little-endian data is supported"
    )]
    BigEndian {
        /// The record's text.
        found: String,
    },
    /// The pickle stream is invalid.
    #[error("pickle {part}: {source}")]
    Pickle {
        /// Which pickle (`data.pkl`, `legacy object`, ...).
        part: &'static str,
        /// The decoder's error.
        #[source]
        source: ckpt_pickle::Error,
    },
    /// A persistent id is not a storage reference torch would accept.
    #[error("bad persistent id: {0}")]
    BadPersistentId(String),
    /// A storage class the reader does not know.
    #[error("unknown storage type {module}.{name}")]
    UnknownStorageType {
        /// Module.
        module: String,
        /// Class name.
        name: String,
    },
    /// A storage record's size disagrees with the element count in its persistent id.
    #[error("storage {key}: record has {actual} bytes, the pickle says {expected}")]
    StorageSize {
        /// Storage key.
        key: String,
        /// Bytes the pickle implies.
        expected: u64,
        /// Bytes in the record.
        actual: u64,
    },
    /// A rebuild call has arguments of the wrong shape.
    #[error("{function}: {reason}")]
    BadRebuild {
        /// The rebuild function.
        function: String,
        /// What is wrong.
        reason: String,
    },
    /// The view a `_rebuild_tensor*` call describes is not a valid view of its storage.
    #[error("tensor view outside its storage: {function}: {source}")]
    BadView {
        /// The rebuild function.
        function: String,
        /// The core error that refused the view (boxed: it would make every `Result` of this crate, and of
        /// the crates that embed this error, larger).
        #[source]
        source: Box<ckpt_tensor::Error>,
    },
    /// An unknown dtype name.
    #[error("unknown dtype torch.{0}")]
    UnknownDType(String),
    /// The legacy stream is malformed.
    #[error("legacy format: {0}")]
    Legacy(String),
    /// An entry that does not exist or is not a tensor.
    #[error("no tensor named {0:?}")]
    NoSuchTensor(String),
    /// An entry that does not exist.
    #[error("no entry named {0:?}")]
    NoSuchEntry(String),
    /// A tensor whose data cannot be read.
    #[error("{name:?} is a {kind:?} tensor; its data cannot be read as a dense tensor")]
    OpaqueTensor {
        /// Entry name.
        name: String,
        /// What kind.
        kind: ckpt_tensor::OpaqueTensorKind,
    },
    /// A quantized, sparse or nested tensor asked for as a dense tensor.
    #[error(
        "{name:?} is a {layout} tensor, not a dense one: read its components (ckpt cat, the entry's value) or \
         make it dense (convert --dense)"
    )]
    CompositeTensor {
        /// Entry name.
        name: String,
        /// Its layout.
        layout: ckpt_tensor::Layout,
    },
    /// A numpy value whose dtype has no tensor counterpart (object arrays, structured dtypes, strings).
    #[error("{name:?}: {reason}")]
    UnsupportedNumpy {
        /// Entry name.
        name: String,
        /// What it is, naming its dtype.
        reason: String,
    },
    /// A plain pickle (`pickle.dump`) holds a persistent id, which only a `torch.save` stream resolves.
    #[error(
        "a plain pickle holds a persistent id (storage {key:?}), which pickle.load cannot resolve: this is not \
         a pickle.dump output; if it is part of a torch.save stream, open the whole .pt file"
    )]
    PersistentIdInPickle {
        /// The storage key the persistent id names.
        key: String,
    },
    /// The bytes of a `torch.storage._load_from_bytes(b"...")` call are not a `torch.save` stream.
    #[error(
        "torch.storage._load_from_bytes holds {len} bytes that are not a torch.save stream ({source}); \
         the file is damaged or was not written by pickling torch tensors"
    )]
    LoadFromBytes {
        /// How many bytes the call holds.
        len: usize,
        /// Why they are not read as a `torch.save` stream.
        #[source]
        source: Box<Error>,
    },
    /// `torch.storage._load_from_bytes` streams nested inside each other deeper than a real file nests them.
    #[error(
        "torch.storage._load_from_bytes streams are nested more than {max} deep (a pickled storage holds one \
         stream); the file is hostile or damaged"
    )]
    NestedTooDeep {
        /// The deepest nesting read.
        max: usize,
    },
    /// A pickled resource of a torch.package archive could not be read.
    #[error("torch.package resource {resource:?}: {source}")]
    PackageResource {
        /// The resource's path in the package.
        resource: String,
        /// Why.
        #[source]
        source: Box<Error>,
    },
    /// A pickled resource of a torch.package archive names a module the package neither holds nor externs.
    #[error(
        "torch.package resource {resource:?} names the module {module:?}, which the package neither holds nor \
         marks extern (extern: {extern_modules}); PackageImporter would refuse it: the archive is incomplete or \
         damaged, re-export it with the module interned or extern"
    )]
    PackageMissingModule {
        /// The resource's path in the package.
        resource: String,
        /// The module it names.
        module: String,
        /// The package's extern modules.
        extern_modules: String,
    },
    /// The value cannot be written by the torch.save writer.
    #[error("cannot write: {0}")]
    Unwritable(String),
    /// A core error (bad view, allocation).
    #[error(transparent)]
    Core(#[from] ckpt_tensor::Error),
}

impl Error {
    /// This error, attributed to `path`.
    pub fn at(self, path: impl Into<PathBuf>) -> Self {
        match self {
            e @ (Error::At { .. } | Error::Io { .. }) => e,
            e => Error::At { path: path.into(), source: Box::new(e) },
        }
    }

    /// The innermost error (without the path wrapper).
    pub fn kind(&self) -> &Error {
        match self {
            Error::At { source, .. } => source.kind(),
            e => e,
        }
    }
}

impl FormatError for Error {
    /// Who is at fault.
    fn fault(&self) -> Fault {
        match self {
            Error::At { source, .. } => source.fault(),
            Error::Io { .. } | Error::Fetch { .. } => Fault::Io,
            Error::Core(c) => c.fault(),
            Error::Pickle { source, .. } => match source.kind() {
                ckpt_pickle::ErrorKind::Limit => Fault::Limit,
                ckpt_pickle::ErrorKind::Unsupported => Fault::Unsupported,
                ckpt_pickle::ErrorKind::Malformed
                | ckpt_pickle::ErrorKind::InvalidArgument
                | ckpt_pickle::ErrorKind::Io => Fault::Malformed,
                // `ErrorKind` is `#[non_exhaustive]` (another crate's): a class added to it later is damage
                // until mapped here.
                _ => Fault::Malformed,
            },
            Error::NoSuchEntry(_) | Error::NoSuchTensor(_) | Error::Unwritable(_) => Fault::InvalidArgument,
            Error::OpaqueTensor { .. }
            | Error::CompositeTensor { .. }
            | Error::TarFormat
            | Error::PreviewFormat
            | Error::BigEndian { .. }
            | Error::Compressed { .. }
            | Error::UnsupportedNumpy { .. } => Fault::Unsupported,
            Error::Empty
            | Error::GitLfsPointer
            | Error::Html
            | Error::Safetensors
            | Error::Unrecognized { .. }
            | Error::Zip(_)
            | Error::MissingRecord { .. }
            | Error::BadVersion { .. }
            | Error::BadPersistentId(_)
            | Error::UnknownStorageType { .. }
            | Error::StorageSize { .. }
            | Error::BadRebuild { .. }
            | Error::BadView { .. }
            | Error::UnknownDType(_)
            | Error::Legacy(_)
            | Error::PersistentIdInPickle { .. }
            | Error::NestedTooDeep { .. } => Fault::Malformed,
            Error::LoadFromBytes { source, .. } | Error::PackageResource { source, .. } => source.fault(),
            Error::PackageMissingModule { .. } => Fault::Malformed,
        }
    }

    /// A core error carried through ([`Error::Core`]) is given back as it was.
    fn into_core(self) -> std::result::Result<ckpt_tensor::Error, Self> {
        match self {
            Error::Core(c) => Ok(c),
            e => Err(e),
        }
    }
}

/// `Result` with the torch codec's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<ckpt_io::CommitError> for Error {
    /// A durable commit's error, as the tensor model holds it ([`Error::Core`]): plain I/O as
    /// `ckpt_tensor::Error::Io`, the rest (disk full, locked, ...) kept whole, found with
    /// `format_error::<ckpt_io::CommitError>()`.
    fn from(e: ckpt_io::CommitError) -> Self {
        Error::Core(e.into())
    }
}
