//! Errors of the DCP reader and writer: one variant per rule, each naming the key and the file involved
//! and saying what was expected and what was found.

use std::path::PathBuf;

use ckpt_tensor::Fault;
use ckpt_tensor::FormatError;

/// What went wrong reading, verifying, writing or converting a DCP checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system error on a path.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The directory holds neither `.metadata`, nor per-rank `__{rank}.metadata` files, nor a Hugging Face
    /// safetensors layout.
    #[error(
        "{}: not a torch.distributed.checkpoint directory (no .metadata, no __<rank>.metadata, no *.safetensors)",
        dir.display()
    )]
    NotACheckpoint {
        /// The directory.
        dir: PathBuf,
    },
    /// The `.metadata` pickle cannot be decoded (truncated, corrupt, or over the decoder's limits).
    #[error("{}: metadata pickle: {source}", path.display())]
    MetadataPickle {
        /// The metadata file.
        path: PathBuf,
        /// The pickle decoder's error.
        #[source]
        source: ckpt_pickle::Error,
    },
    /// An object of an unknown class appears where a known DCP class is expected.
    #[error("{}: {context}: expected {expected}, found {found}", path.display())]
    UnexpectedClass {
        /// The metadata file.
        path: PathBuf,
        /// Where in the metadata (`state_dict_metadata["model.w"].properties`).
        context: String,
        /// The class (or classes) allowed there.
        expected: &'static str,
        /// What was found (`module.Name`, or the Python type).
        found: String,
    },
    /// A field of a DCP object has the wrong type or an impossible value.
    #[error("{}: {context}: expected {expected}, found {found}", path.display())]
    BadField {
        /// The metadata file.
        path: PathBuf,
        /// Where in the metadata.
        context: String,
        /// What the field must hold.
        expected: String,
        /// What it holds.
        found: String,
    },
    /// A required field of a DCP object is missing.
    #[error("{}: {context}: missing field {field:?}", path.display())]
    MissingField {
        /// The metadata file.
        path: PathBuf,
        /// Where in the metadata.
        context: String,
        /// The field.
        field: &'static str,
    },
    /// A dtype that no torch version has.
    #[error("{}: {context}: unknown dtype torch.{name}", path.display())]
    UnknownDType {
        /// The metadata file.
        path: PathBuf,
        /// Where in the metadata.
        context: String,
        /// The dtype name.
        name: String,
    },
    /// Per-rank metadata files disagree about a key.
    #[error("{key}: per-rank metadata files disagree: {detail}")]
    MergeConflict {
        /// The flattened key.
        key: String,
        /// What differs.
        detail: String,
    },
    /// A data file path that is absolute or leaves the checkpoint directory.
    #[error("{key}: data file path {file:?} is absolute or escapes the checkpoint directory")]
    UnsafePath {
        /// The key whose item it holds.
        key: String,
        /// The path as written in the metadata.
        file: String,
    },
    /// A data file named by the metadata does not exist.
    #[error("{key}: data file {file:?} does not exist")]
    MissingFile {
        /// The key whose item it holds.
        key: String,
        /// The file.
        file: String,
    },
    /// An item's byte range reaches past the end of its file.
    #[error("{key}: item at offset {offset}, length {length} reaches past the end of {file:?} ({file_len} bytes)")]
    ItemOutOfFile {
        /// The key.
        key: String,
        /// The file.
        file: String,
        /// Item offset.
        offset: u64,
        /// Item length.
        length: u64,
        /// File size.
        file_len: u64,
    },
    /// A chunk's rank differs from its tensor's.
    #[error("{key}: chunk {chunk} has {found} dimensions, the tensor has {expected}")]
    ChunkRank {
        /// The key.
        key: String,
        /// Chunk position.
        chunk: usize,
        /// Tensor dimensions.
        expected: usize,
        /// Chunk dimensions.
        found: usize,
    },
    /// A chunk lies (partly) outside its tensor.
    #[error("{key}: chunk {chunk} (offsets {offsets:?}, sizes {sizes:?}) is outside the tensor of shape {shape:?}")]
    ChunkOutOfBounds {
        /// The key.
        key: String,
        /// Chunk position.
        chunk: usize,
        /// Chunk offsets.
        offsets: Vec<usize>,
        /// Chunk sizes.
        sizes: Vec<usize>,
        /// Tensor shape.
        shape: Vec<usize>,
    },
    /// Two chunks of one tensor overlap.
    #[error("{key}: chunks {a} (offsets {a_offsets:?}) and {b} (offsets {b_offsets:?}) overlap")]
    OverlappingChunks {
        /// The key.
        key: String,
        /// First chunk position.
        a: usize,
        /// Its offsets.
        a_offsets: Vec<usize>,
        /// Second chunk position.
        b: usize,
        /// Its offsets.
        b_offsets: Vec<usize>,
    },
    /// The chunks of a tensor leave part of it uncovered.
    #[error("{key}: chunks cover {covered} of the {total} elements of the tensor")]
    IncompleteCoverage {
        /// The key.
        key: String,
        /// Elements covered.
        covered: u128,
        /// Elements of the tensor.
        total: u128,
    },
    /// A chunk has no entry in `storage_data`.
    #[error("{key}: chunk at offsets {offsets:?} has no storage_data entry (its item is missing)")]
    MissingItem {
        /// The key.
        key: String,
        /// Chunk offsets (`None` for a non-tensor item).
        offsets: Option<Vec<usize>>,
    },
    /// An item is not a valid `torch.save` archive.
    #[error("{key}: item in {file:?}: {source}")]
    BadItem {
        /// The key.
        key: String,
        /// The file.
        file: String,
        /// The torch codec's error.
        #[source]
        source: Box<ckpt_torch::Error>,
    },
    /// A tensor item holds something else than a tensor.
    #[error("{key}: item in {file:?} holds a {found}, not a tensor")]
    ItemNotTensor {
        /// The key.
        key: String,
        /// The file.
        file: String,
        /// What it holds.
        found: String,
    },
    /// A tensor item's shape differs from its chunk's sizes.
    #[error("{key}: item in {file:?} has shape {found:?}, its chunk has sizes {expected:?}")]
    ChunkShapeMismatch {
        /// The key.
        key: String,
        /// The file.
        file: String,
        /// Chunk sizes.
        expected: Vec<usize>,
        /// Item shape.
        found: Vec<usize>,
    },
    /// A tensor item's dtype differs from the tensor's properties.
    #[error("{key}: item in {file:?} is {found}, the metadata says {expected}")]
    DTypeMismatch {
        /// The key.
        key: String,
        /// The file.
        file: String,
        /// Metadata dtype.
        expected: ckpt_tensor::DType,
        /// Item dtype.
        found: ckpt_tensor::DType,
    },
    /// A stream transform this library does not implement.
    #[error("{key}: unknown transform {descriptor:?} (only stream.zstd/1 is known)")]
    UnknownTransform {
        /// The key.
        key: String,
        /// The descriptor.
        descriptor: String,
    },
    /// Bytes of an item could not be made present before they were read (a checkpoint read lazily from an
    /// object store, `ReadOptions::fill`: the transfer failed, or the object is shorter than listed).
    #[error("{key}: cannot fetch bytes {start}..{end} of {file:?}: {source}")]
    Fetch {
        /// The key read.
        key: String,
        /// The data file (relative path).
        file: String,
        /// First byte wanted, in the file.
        start: u64,
        /// End of the bytes wanted, in the file.
        end: u64,
        /// The fill's error (kind `UnexpectedEof` for an object shorter than the range).
        #[source]
        source: std::io::Error,
    },
    /// A zstd-transformed item cannot be decompressed.
    #[error("{key}: zstd item in {file:?}: {source}")]
    Zstd {
        /// The key.
        key: String,
        /// The file.
        file: String,
        /// The decoder's error.
        #[source]
        source: std::io::Error,
    },
    /// A `.metadata` file is larger than [`ReadOptions::max_metadata_bytes`](crate::ReadOptions).
    #[error("{}: the metadata file is {len} bytes, over the limit of {limit} bytes (max_metadata_bytes)", path.display())]
    MetadataTooLarge {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The limit.
        limit: u64,
    },
    /// A zstd-transformed item decompresses to more than the configured limit.
    #[error("{key}: zstd item in {file:?} decompresses to more than {limit} bytes")]
    DecompressedTooLarge {
        /// The key.
        key: String,
        /// The file.
        file: String,
        /// The limit.
        limit: u64,
    },
    /// A safetensors data file of the Hugging Face layout cannot be read as safetensors.
    #[error("{}: {source}", path.display())]
    UnreadableSafetensors {
        /// The file.
        path: PathBuf,
        /// The safetensors reader's error.
        #[source]
        source: ckpt_tensor::Error,
    },
    /// A safetensors data file of the Hugging Face layout is invalid.
    #[error("{}: {reason}", path.display())]
    BadSafetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// There is no entry with this key.
    #[error("no entry {0:?} in the checkpoint")]
    NoSuchEntry(String),
    /// The entry is not a tensor.
    #[error("{0:?} is not a tensor entry")]
    NotATensor(String),
    /// A region that is not inside its tensor.
    #[error("{key}: region (offsets {offsets:?}, sizes {sizes:?}) is not inside the tensor of shape {shape:?}")]
    RegionOutOfBounds {
        /// The key.
        key: String,
        /// Region offsets.
        offsets: Vec<usize>,
        /// Region sizes.
        sizes: Vec<usize>,
        /// Tensor shape.
        shape: Vec<usize>,
    },
    /// A value or layout the writer cannot store, or an invalid writer argument.
    #[error("cannot write {key:?}: {reason}")]
    Unwritable {
        /// The key (empty when not about one key).
        key: String,
        /// Why.
        reason: String,
    },
    /// The target already holds a checkpoint and overwriting was not allowed.
    #[error("{}: a checkpoint already exists (overwrite is off)", path.display())]
    AlreadyExists {
        /// The `.metadata` file.
        path: PathBuf,
    },
    /// Another rank of a multi-rank save failed.
    #[error("rank {rank} failed: {message}")]
    RankFailed {
        /// The failing rank.
        rank: usize,
        /// Its error.
        message: String,
    },
    /// Per-rank state (one row per rank) saved by one number of ranks, loaded by another
    /// ([`crate::DcpReader::read_rank_row`]).
    #[error(
        "{key}: per-rank state saved by {saved} ranks cannot be loaded by {ranks} ranks: restart with {saved} ranks, or reshard the state"
    )]
    RankCountMismatch {
        /// The entry.
        key: String,
        /// Ranks that saved it (its first dimension).
        saved: usize,
        /// Ranks loading it.
        ranks: usize,
    },
    /// A Megatron-Core checkpoint's `metadata.json` is not JSON.
    #[error("{}: not JSON: {source}", path.display())]
    MegatronJson {
        /// The `metadata.json` file.
        path: PathBuf,
        /// The JSON parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// The index of a Hugging Face layout is not JSON.
    #[error("{}: invalid JSON: {source}", path.display())]
    IndexJson {
        /// The index file.
        path: PathBuf,
        /// The JSON parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A Megatron-Core checkpoint's `metadata.json` is missing, not JSON, or names a backend other than
    /// `torch_dist` (`zarr` checkpoints are not read).
    #[error("{}: {problem}", path.display())]
    MegatronMetadata {
        /// The `metadata.json` file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A Megatron-Core tensor does not have the layout a name map needs (a `linear_qkv` whose rows are not
    /// the head layout in `args`, missing `args`).
    #[error("{key}: {problem}")]
    MegatronLayout {
        /// The tensor (or `args`).
        key: String,
        /// What does not fit.
        problem: String,
    },
    /// A layer-stacked Megatron-Core tensor has more layers than [`crate::megatron::MAX_STACKED_LAYERS`]:
    /// splitting it per layer would make that many entries (a tensor of shape `[N, 0]` holds no data).
    #[error("{key}: {layers} stacked layers, over the limit of {max} (--unstack-layers makes an entry per layer)")]
    MegatronTooManyLayers {
        /// The stacked tensor.
        key: String,
        /// Its leading (layer) dimension.
        layers: usize,
        /// The limit.
        max: usize,
    },
    /// A copy between chunks whose boxes are not inside their tensors.
    #[error("invalid argument: chunk copy outside its tensors")]
    ChunkCopyOutside,
    /// More storage items than a `u32` counts.
    #[error("limit exceeded: more than 2^32 storage items")]
    TooManyStorageItems,
    /// A region whose byte count overflows `usize`.
    #[error("limit exceeded: region {sizes:?} of {key} is too large")]
    RegionTooLarge {
        /// The entry's key.
        key: String,
        /// The region's sizes.
        sizes: Vec<usize>,
    },
    /// A save of no ranks.
    #[error("invalid argument: a save needs at least one rank")]
    NoRanks,
    /// A writer thread of a multi-rank save panicked.
    #[error("invalid argument: a writer thread panicked")]
    WriterPanicked,
    /// A multi-rank save whose ranks returned neither metadata nor an error.
    #[error("invalid argument: no rank returned")]
    NoRankReturned,
    /// A `torch.save` file (conversion source or target) failed.
    #[error(transparent)]
    Torch(#[from] ckpt_torch::Error),
    /// A core error (allocation, collective, safetensors).
    #[error(transparent)]
    Core(#[from] ckpt_tensor::Error),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    pub(crate) fn unwritable(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Unwritable { key: key.into(), reason: reason.into() }
    }
}

impl FormatError for Error {
    /// Who is at fault.
    fn fault(&self) -> Fault {
        match self {
            Error::Io { .. } => Fault::Io,
            Error::Fetch { source, .. } if source.kind() == std::io::ErrorKind::UnexpectedEof => Fault::Malformed,
            Error::Fetch { .. } => Fault::Io,
            Error::Core(c) => c.fault(),
            Error::Torch(t) => t.fault(),
            Error::BadItem { source, .. } => source.fault(),
            // Over the decoder's limits is a limit, as for the torch codec.
            Error::MetadataPickle { source, .. } if source.kind() == ckpt_pickle::ErrorKind::Limit => Fault::Limit,
            Error::NoSuchEntry(_)
            | Error::NotATensor(_)
            | Error::RegionOutOfBounds { .. }
            | Error::Unwritable { .. }
            | Error::AlreadyExists { .. }
            | Error::RankCountMismatch { .. }
            | Error::ChunkCopyOutside
            | Error::NoRanks
            | Error::WriterPanicked
            | Error::NoRankReturned => Fault::InvalidArgument,
            Error::UnknownTransform { .. } => Fault::Unsupported,
            Error::MegatronMetadata { problem, .. } if problem.contains("backend") => Fault::Unsupported,
            Error::DecompressedTooLarge { .. }
            | Error::MetadataTooLarge { .. }
            | Error::MegatronTooManyLayers { .. }
            | Error::TooManyStorageItems
            | Error::RegionTooLarge { .. } => Fault::Limit,
            Error::NotACheckpoint { .. }
            | Error::MetadataPickle { .. }
            | Error::UnexpectedClass { .. }
            | Error::BadField { .. }
            | Error::MissingField { .. }
            | Error::UnknownDType { .. }
            | Error::MergeConflict { .. }
            | Error::UnsafePath { .. }
            | Error::MissingFile { .. }
            | Error::ItemOutOfFile { .. }
            | Error::ChunkRank { .. }
            | Error::ChunkOutOfBounds { .. }
            | Error::OverlappingChunks { .. }
            | Error::IncompleteCoverage { .. }
            | Error::MissingItem { .. }
            | Error::ItemNotTensor { .. }
            | Error::ChunkShapeMismatch { .. }
            | Error::DTypeMismatch { .. }
            | Error::Zstd { .. }
            | Error::BadSafetensors { .. }
            // Malformed whatever the reader's own fault, as before the reader's error was kept.
            | Error::UnreadableSafetensors { .. }
            | Error::RankFailed { .. }
            | Error::MegatronMetadata { .. }
            | Error::MegatronJson { .. }
            | Error::IndexJson { .. }
            | Error::MegatronLayout { .. } => Fault::Malformed,
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

/// `Result` with the DCP [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<ckpt_io::CommitError> for Error {
    /// A durable commit's error, as the tensor model holds it ([`Error::Core`]): plain I/O as
    /// `ckpt_tensor::Error::Io`, the rest (disk full, locked, ...) kept whole, found with
    /// `format_error::<ckpt_io::CommitError>()`.
    fn from(e: ckpt_io::CommitError) -> Self {
        Error::Core(e.into())
    }
}
