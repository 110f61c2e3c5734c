//! Errors of the DeepSpeed reader: one variant per rule, each naming the file and saying what was expected
//! and what was found.

use std::path::PathBuf;

use ckpt_tensor::FormatError;
use ckpt_tensor::{DType, Fault};

/// What went wrong reading a DeepSpeed checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O error on a path.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not a readable `torch.save` file (the torch codec's error names the file).
    #[error(transparent)]
    Torch(#[from] ckpt_torch::Error),
    /// The path is neither a checkpoint root (`latest` and tag directories) nor a tag directory
    /// (`*_model_states.pt`, or a universal checkpoint's `zero/`).
    #[error(
        "{}: not a DeepSpeed checkpoint: expected a directory with `latest` (or `latest_universal`) and its tag \
         directory, or a tag directory (global_stepN/) holding *_model_states.pt files",
        path.display()
    )]
    NotACheckpoint {
        /// The path given.
        path: PathBuf,
    },
    /// `latest` names a tag whose directory is not there.
    #[error("{}: the tag {tag:?} ({from}) has no directory", dir.display())]
    MissingTag {
        /// The checkpoint root.
        dir: PathBuf,
        /// The tag.
        tag: String,
        /// Where the tag came from (`latest`, `--tag`).
        from: &'static str,
    },
    /// A file the checkpoint needs is not in the tag directory.
    #[error("{}: missing ({why})", path.display())]
    MissingFile {
        /// The missing file.
        path: PathBuf,
        /// What needs it.
        why: String,
    },
    /// A file does not have the structure DeepSpeed writes (a missing key, a value of the wrong type).
    #[error("{}: at {at}: expected {expected}, found {found}", path.display())]
    Layout {
        /// The file.
        path: PathBuf,
        /// Where in the file (`optimizer_state_dict.zero_stage`).
        at: String,
        /// What DeepSpeed writes there.
        expected: &'static str,
        /// What the file holds.
        found: String,
    },
    /// A checkpoint DeepSpeed writes but this reader does not consolidate (model parallel ranks, expert
    /// parallel files, an unknown ZeRO stage).
    #[error("{}: {what}", path.display())]
    Unsupported {
        /// The file or directory.
        path: PathBuf,
        /// What is not supported.
        what: String,
    },
    /// The number of optimizer state files differs from the data-parallel world size the files declare.
    #[error(
        "{}: {found} *_optim_states.pt file(s), but the checkpoint was saved by {expected} data-parallel ranks \
         (an overwritten or incompletely saved checkpoint?)",
        dir.display()
    )]
    RankCount {
        /// The tag directory.
        dir: PathBuf,
        /// The world size the files declare (`partition_count`).
        expected: usize,
        /// Files found.
        found: usize,
    },
    /// The flat groups of the ranks do not hold the parameters `param_shapes` lists: DeepSpeed's own
    /// consolidation fails on the same check.
    #[error("{}: param group {group}: {problem}", dir.display())]
    FlatGroups {
        /// The tag directory.
        dir: PathBuf,
        /// The param group.
        group: usize,
        /// What does not add up.
        problem: String,
    },
    /// Two entries of the checkpoint would have the same name.
    #[error("{}: two entries are named {name:?}", dir.display())]
    DuplicateName {
        /// The tag directory.
        dir: PathBuf,
        /// The name.
        name: String,
    },
    /// No entry of this name.
    #[error("no entry {name:?}")]
    NoEntry {
        /// The name asked for.
        name: String,
    },
    /// The entry is a value, not a tensor (or the other way around).
    #[error("{name:?} is {found}, not {expected}")]
    WrongKind {
        /// The entry.
        name: String,
        /// What was asked for.
        expected: &'static str,
        /// What it is.
        found: &'static str,
    },
    /// A parameter whose shape's element count overflows `usize`.
    #[error("malformed data: {name}: shape {shape:?} overflows")]
    ShapeOverflow {
        /// The parameter.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A flat group piece that is not a 1-D tensor of the parameter's dtype.
    #[error(
        "malformed data: {name}: a flat piece is {found_dtype} of shape {found_shape:?}, expected a 1-D {dtype} tensor"
    )]
    BadFlatPiece {
        /// The parameter.
        name: String,
        /// The parameter's dtype.
        dtype: DType,
        /// The piece's dtype.
        found_dtype: DType,
        /// The piece's shape.
        found_shape: Vec<usize>,
    },
    /// Flat groups that hold fewer elements than a parameter needs.
    #[error("malformed data: {name}: the flat groups hold {held} of its {numel} elements")]
    FlatGroupsShort {
        /// The parameter.
        name: String,
        /// The elements the groups hold.
        held: usize,
        /// The parameter's elements.
        numel: usize,
    },
    /// An error of the tensor model (a view out of range, an allocation that failed).
    #[error(transparent)]
    Core(#[from] ckpt_tensor::Error),
}

impl FormatError for Error {
    /// Who is at fault.
    fn fault(&self) -> Fault {
        match self {
            Error::Io { .. } => Fault::Io,
            Error::Torch(e) => e.fault(),
            Error::NotACheckpoint { .. }
            | Error::MissingTag { .. }
            | Error::MissingFile { .. }
            | Error::Layout { .. }
            | Error::RankCount { .. }
            | Error::FlatGroups { .. }
            | Error::DuplicateName { .. }
            | Error::ShapeOverflow { .. }
            | Error::BadFlatPiece { .. }
            | Error::FlatGroupsShort { .. } => Fault::Malformed,
            Error::Unsupported { .. } => Fault::Unsupported,
            Error::NoEntry { .. } | Error::WrongKind { .. } => Fault::InvalidArgument,
            Error::Core(e) => e.fault(),
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

/// The result of this crate's operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
