//! Errors of the hfai reader, writer and resharder: one variant per rule, each naming the file or key and
//! saying what was expected and what was found.

use std::path::PathBuf;

use ckpt_tensor::Fault;
use ckpt_tensor::FormatError;

/// What went wrong reading, writing or resharding an hfai checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The checkpoint path is not a directory (hfai checkpoints are directories, even when named `*.pt`).
    #[error("{}: not a directory; an hfai checkpoint is a directory of PART_XXX.pt files", path.display())]
    NotADirectory {
        /// The path given.
        path: PathBuf,
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
    /// A part is not a readable `torch.save` file (the torch codec's error names the file).
    #[error(transparent)]
    Torch(#[from] ckpt_torch::Error),
    /// A part the checkpoint needs is not in the directory.
    #[error("{}: missing{}", path.display(), of_parts(world_size))]
    MissingPart {
        /// The missing file.
        path: PathBuf,
        /// Its rank.
        rank: usize,
        /// Parts the checkpoint has (`__nshards__` of PART_000.pt), unknown when PART_000.pt itself is missing.
        world_size: Option<usize>,
    },
    /// The directory holds `PART_*.pt` files beyond the parts the checkpoint declares, which hfai's loader
    /// (it counts the files) rejects.
    #[error(
        "{}: {names:?} beyond the {world_size} part(s) PART_000.pt declares (stale parts of an earlier save with more \
         ranks?); hfai's loader counts PART_*.pt files and rejects the directory",
        dir.display()
    )]
    ExtraParts {
        /// The directory.
        dir: PathBuf,
        /// The unexpected file names.
        names: Vec<String>,
        /// Parts the checkpoint declares.
        world_size: usize,
    },
    /// A part has no `__version__`: the hfai 1.0.0 layout, which is not documented and not supported.
    #[error(
        "{}: no \"__version__\" key, so this is an hfai 1.0.0 checkpoint (hfai's loader defaults the version to \
         \"1.0.0\"); only the 2.0.0 layout is supported: load it with hfai 1.x and save it again",
        path.display()
    )]
    Version1 {
        /// The part.
        path: PathBuf,
    },
    /// A part has a `__version__` other than `"2.0.0"`.
    #[error("{}: \"__version__\" is {found}, expected \"2.0.0\"", path.display())]
    UnsupportedVersion {
        /// The part.
        path: PathBuf,
        /// What the part says (Python repr-like).
        found: String,
    },
    /// A part's `__nshards__` disagrees with PART_000.pt's.
    #[error("{}: \"__nshards__\" is {found}, but PART_000.pt says {expected}", path.display())]
    NshardsMismatch {
        /// The part.
        path: PathBuf,
        /// PART_000.pt's value.
        expected: usize,
        /// This part's value.
        found: usize,
    },
    /// A part does not have the structure hfai writes (a missing key, a value of the wrong type).
    #[error("{}: at {at}: expected {expected}, found {found}", path.display())]
    Layout {
        /// The part.
        path: PathBuf,
        /// Where in the part (`model[0].large["w"]`).
        at: String,
        /// What the format requires there.
        expected: &'static str,
        /// What the part holds.
        found: String,
    },
    /// A part has a different number of models or optimizers than PART_000.pt.
    #[error("{}: {found} {what}(s), PART_000.pt has {expected}", path.display())]
    CountMismatch {
        /// The part.
        path: PathBuf,
        /// `model` or `optimizer`.
        what: &'static str,
        /// PART_000.pt's count.
        expected: usize,
        /// This part's count.
        found: usize,
    },
    /// The chunks of a large tensor do not add up to its stored shape.
    #[error(
        "{key}: the chunks of the {world_size} parts hold {found} elements, the stored shape {shape:?} has {expected}"
    )]
    ChunkSizeMismatch {
        /// The tensor (`model[0].w`, `optimizer[0].state[3].exp_avg`).
        key: String,
        /// The stored `torch.Size`.
        shape: Vec<usize>,
        /// Elements of that shape.
        expected: usize,
        /// Elements in all chunks together.
        found: usize,
        /// Number of parts.
        world_size: usize,
    },
    /// The parts disagree on a large tensor's stored shape.
    #[error("{}: {key} has stored shape {found:?}, an earlier part says {expected:?}", path.display())]
    ShapeMismatch {
        /// The part.
        path: PathBuf,
        /// The tensor.
        key: String,
        /// The shape an earlier part stores.
        expected: Vec<usize>,
        /// This part's shape.
        found: Vec<usize>,
    },
    /// The chunks of a large tensor have different dtypes.
    #[error("{}: the chunk of {key} is {found}, an earlier part's is {expected}", path.display())]
    ChunkDType {
        /// The part.
        path: PathBuf,
        /// The tensor.
        key: String,
        /// The dtype of the earlier chunks.
        expected: ckpt_tensor::DType,
        /// This chunk's dtype.
        found: ckpt_tensor::DType,
    },
    /// A chunk of a large tensor is not one-dimensional.
    #[error("{}: the chunk of {key} has shape {shape:?}; chunks are flat (1-D)", path.display())]
    ChunkNotFlat {
        /// The part.
        path: PathBuf,
        /// The tensor.
        key: String,
        /// The chunk's shape.
        shape: Vec<usize>,
    },
    /// A large tensor's name is also a small entry (hfai's loader asserts against this).
    #[error("{key}: present both whole and as chunks")]
    DuplicateKey {
        /// The entry.
        key: String,
    },
    /// A large optimizer tensor belongs to a state entry that no part holds (or that is not a dict).
    #[error("{key}: chunks of an optimizer tensor for state entry {param}, which {problem}")]
    OrphanChunk {
        /// The tensor.
        key: String,
        /// The state entry (parameter id).
        param: String,
        /// `no part holds` or `is not a dict`.
        problem: &'static str,
    },
    /// The writer was asked for zero parts.
    #[error("an hfai checkpoint needs at least one part")]
    ZeroShards,
    /// An `others` key that would clash with the part header.
    #[error("others key {key:?} is reserved (hfai's part header uses __nshards__, __version__, model, optimizer)")]
    ReservedKey {
        /// The key.
        key: String,
    },
    /// A buffer name that is not in the model's state dict.
    #[error("model {model}: buffer {name:?} is not in the state dict")]
    UnknownBuffer {
        /// Index of the model.
        model: usize,
        /// The name.
        name: String,
    },
    /// An optimizer state dict without the structure `Optimizer.state_dict()` has.
    #[error("optimizer {index}: {problem}")]
    BadOptimizer {
        /// Index of the optimizer.
        index: usize,
        /// What is wrong.
        problem: String,
    },
    /// `torch.chunk` yields fewer chunks than there are ranks, so hfai's `chunk(n)[rank]` raises `IndexError`
    /// on the last ranks; the same checkpoint cannot be written (use fewer parts or a larger threshold).
    #[error(
        "{key}: {numel} elements split with torch.chunk into {world_size} parts gives only {chunks} chunks of {chunk_len} \
         (hfai's save raises IndexError on rank {chunks}); use fewer parts or a larger large_size"
    )]
    TooFewChunks {
        /// The tensor.
        key: String,
        /// Its elements.
        numel: usize,
        /// Parts requested.
        world_size: usize,
        /// Chunks `torch.chunk` yields.
        chunks: usize,
        /// Elements per chunk.
        chunk_len: usize,
    },
    /// Another rank failed; its message.
    #[error("rank {rank} failed: {message}")]
    RankFailed {
        /// The rank.
        rank: usize,
        /// Its error.
        message: String,
    },
    /// After the save, a part on disk is not the one its rank wrote.
    #[error("{}: the completion check failed: {problem}", path.display())]
    Incomplete {
        /// The part.
        path: PathBuf,
        /// What is wrong (missing, size, checksum).
        problem: String,
    },
    /// Ranks opening the same checkpoint collectively saw different files.
    #[error("{}: rank {rank} sees different parts than rank 0 ({problem})", dir.display())]
    Inconsistent {
        /// The directory.
        dir: PathBuf,
        /// The rank that disagrees.
        rank: usize,
        /// How.
        problem: String,
    },
    /// The directory holds names matching `PART_*.pt` that are not part names the writer can remove.
    #[error("{}: unexpected files {names:?} match PART_*.pt; hfai's loader would count them as parts", dir.display())]
    ForeignFiles {
        /// The directory.
        dir: PathBuf,
        /// The file names.
        names: Vec<String>,
    },
    /// A range of elements past the end of a chunked tensor.
    #[error("invalid argument: elements {start}+{len} of a {numel}-element tensor")]
    ElementsOutOfRange {
        /// The first element.
        start: usize,
        /// The elements asked for.
        len: usize,
        /// The tensor's elements.
        numel: usize,
    },
    /// The chunks of a chunked tensor cover a range with overlaps.
    #[error("invalid argument: chunk ranges overlap")]
    OverlappingChunkRanges,
    /// A tensor asked for whose data cannot be read as a dense tensor.
    #[error("unsupported: {name:?} is a {kind:?} tensor; its data cannot be read as a dense tensor")]
    OpaqueTensor {
        /// The entry's name.
        name: String,
        /// The kind of tensor.
        kind: ckpt_tensor::OpaqueTensorKind,
    },
    /// A tensor asked for that is another kind of value.
    #[error("invalid argument: {name:?} is a {type_name}, not a tensor")]
    NotATensor {
        /// The entry's name.
        name: String,
        /// The value's type.
        type_name: &'static str,
    },
    /// An entry asked for that the checkpoint does not hold.
    #[error("invalid argument: no entry named {name:?}")]
    NoSuchEntry {
        /// The name asked for.
        name: String,
    },
    /// A core error (bad view, allocation, collective).
    #[error(transparent)]
    Core(#[from] ckpt_tensor::Error),
}

/// `"; the checkpoint has 3 part(s), PART_000.pt .. PART_002.pt"` when the count is known.
fn of_parts(world_size: &Option<usize>) -> String {
    world_size.map_or_else(String::new, |n| {
        format!("; the checkpoint has {n} part(s), PART_000.pt .. {}", crate::part_file_name(n.saturating_sub(1)))
    })
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    /// For a part that is not a readable `torch.save` file, the torch codec's error without its path wrapper.
    pub fn torch_kind(&self) -> Option<&ckpt_torch::Error> {
        match self {
            Error::Torch(e) => Some(e.kind()),
            _ => None,
        }
    }
}

/// `Result` with the hfai [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl FormatError for Error {
    /// Who is at fault.
    fn fault(&self) -> Fault {
        match self {
            Error::Io { .. } => Fault::Io,
            Error::Core(c) => c.fault(),
            Error::Torch(t) => t.fault(),
            Error::Version1 { .. } | Error::UnsupportedVersion { .. } => Fault::Unsupported,
            Error::ZeroShards
            | Error::ReservedKey { .. }
            | Error::UnknownBuffer { .. }
            | Error::BadOptimizer { .. }
            | Error::TooFewChunks { .. }
            | Error::ElementsOutOfRange { .. }
            | Error::OverlappingChunkRanges
            | Error::NotATensor { .. }
            | Error::NoSuchEntry { .. } => Fault::InvalidArgument,
            Error::OpaqueTensor { .. } => Fault::Unsupported,
            Error::NotADirectory { .. }
            | Error::MissingPart { .. }
            | Error::ExtraParts { .. }
            | Error::NshardsMismatch { .. }
            | Error::Layout { .. }
            | Error::CountMismatch { .. }
            | Error::ChunkSizeMismatch { .. }
            | Error::ShapeMismatch { .. }
            | Error::ChunkDType { .. }
            | Error::ChunkNotFlat { .. }
            | Error::DuplicateKey { .. }
            | Error::OrphanChunk { .. }
            | Error::RankFailed { .. }
            | Error::Incomplete { .. }
            | Error::Inconsistent { .. }
            | Error::ForeignFiles { .. } => Fault::Malformed,
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

impl From<ckpt_io::CommitError> for Error {
    /// A durable commit's error, as the tensor model holds it ([`Error::Core`]): plain I/O as
    /// `ckpt_tensor::Error::Io`, the rest (disk full, locked, ...) kept whole, found with
    /// `format_error::<ckpt_io::CommitError>()`.
    fn from(e: ckpt_io::CommitError) -> Self {
        Error::Core(e.into())
    }
}
