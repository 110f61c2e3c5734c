//! Errors of the PBG checkpoint codec: one variant per rule, each naming the file and what was expected.

use std::path::{Path, PathBuf};

use ckpt_tensor::Fault;
use ckpt_tensor::FormatError;

/// What went wrong reading, writing or checking a PyTorch-BigGraph checkpoint.
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
    /// The file does not exist: PBG's `CouldNotLoadData` (training falls back to `init_path` or random
    /// initialisation on this error in its first iteration, and fails on it afterwards).
    #[error("{}: could not load data: the file does not exist", path.display())]
    CouldNotLoad {
        /// The missing file (after resolving snapshot links).
        path: PathBuf,
    },
    /// The file exists but is not an HDF5 file (no superblock signature).
    #[error("{}: not an HDF5 file (no HDF5 signature at offset 0, 512, 1024, ...; first bytes {head:02x?})", path.display())]
    NotHdf5 {
        /// The file.
        path: PathBuf,
        /// Its first bytes (up to 8).
        head: Vec<u8>,
    },
    /// The file is shorter than the end-of-file address its superblock records (a truncated copy or an
    /// interrupted write).
    #[error("{}: truncated: the HDF5 superblock says the file ends at byte {expected}, it has {found} bytes", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Size the superblock records.
        expected: u64,
        /// Actual size.
        found: u64,
    },
    /// The HDF5 library refused the file or an operation on it.
    #[error("{}: HDF5: {source}", path.display())]
    Hdf5 {
        /// The file.
        path: PathBuf,
        /// The library's error.
        #[source]
        source: hdf5::Error,
    },
    /// The root `format_version` attribute is missing or not 1 (PBG: "Version mismatch in ... file").
    #[error("{}: format version mismatch: expected attribute format_version = 1, found {found}", path.display())]
    FormatVersion {
        /// The file.
        path: PathBuf,
        /// What the file has (`missing`, `2`, `"1"`, ...).
        found: String,
    },
    /// A required dataset is absent.
    #[error("{}: no dataset {name:?}", path.display())]
    MissingDataset {
        /// The file.
        path: PathBuf,
        /// The dataset path inside the file.
        name: String,
    },
    /// A dataset has an element type PBG cannot use there.
    #[error("{}: dataset {name:?} has type {found}, expected {expected}", path.display())]
    WrongDtype {
        /// The file.
        path: PathBuf,
        /// The dataset path inside the file.
        name: String,
        /// What the format requires.
        expected: &'static str,
        /// What the file has.
        found: String,
    },
    /// A dataset has the wrong number of dimensions.
    #[error("{}: dataset {name:?} has {found} dimensions {shape:?}, expected {expected}", path.display())]
    WrongRank {
        /// The file.
        path: PathBuf,
        /// The dataset path inside the file.
        name: String,
        /// Required rank.
        expected: usize,
        /// Actual rank.
        found: usize,
        /// Actual shape.
        shape: Vec<usize>,
    },
    /// A dataset's storage is not where or what its header says (truncated file, overlapping data).
    #[error("{}: dataset {name:?}: {reason}", path.display())]
    BadStorage {
        /// The file.
        path: PathBuf,
        /// The dataset path inside the file.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The number of embeddings disagrees with `entity_count_<entity>_<part>.txt`.
    #[error(
        "{}: {found} embeddings for entity {entity:?} partition {partition}, but {} says {expected}",
        path.display(), count_file.display()
    )]
    CountMismatch {
        /// The embeddings file.
        path: PathBuf,
        /// The count file.
        count_file: PathBuf,
        /// Entity type.
        entity: String,
        /// Partition.
        partition: u32,
        /// The count file's number.
        expected: u64,
        /// Rows in the embeddings dataset.
        found: u64,
    },
    /// The embeddings of a partition do not have the dimension the config gives.
    #[error("{}: embeddings of entity {entity:?} have dimension {found}, the config says {expected}", path.display())]
    DimensionMismatch {
        /// The embeddings file.
        path: PathBuf,
        /// Entity type.
        entity: String,
        /// The config's dimension.
        expected: u64,
        /// Columns in the embeddings dataset.
        found: u64,
    },
    /// The `optimizer/state_dict` blob is not a readable `torch.save` archive.
    #[error("{}: corrupt optimizer/state_dict blob: {source}", path.display())]
    OptimizerBlob {
        /// The file holding the blob (empty when the blob is not from a file).
        path: PathBuf,
        /// Why torch.load would fail.
        #[source]
        source: ckpt_torch::Error,
    },
    /// The decoded optimizer state is not shaped like a torch optimizer `state_dict()`.
    #[error("optimizer state: {0}")]
    OptimizerLayout(String),
    /// A model dataset name matches none of PBG's public-name patterns (PBG: "Couldn't find a match for
    /// dataset name").
    #[error("{}: no PBG mapping for model parameter {name:?} (expected relations/<i>/operator/<side>/<param> or entities/<type>/global_embedding)", path.display())]
    UnmappedParameter {
        /// The model file (empty for names given in memory).
        path: PathBuf,
        /// The offending name.
        name: String,
    },
    /// A root attribute has a type or value the format does not allow.
    #[error("{}: attribute {name:?}: expected {expected}, found {found}", path.display())]
    BadAttribute {
        /// The file.
        path: PathBuf,
        /// Attribute name.
        name: String,
        /// What is allowed.
        expected: &'static str,
        /// What the file has.
        found: String,
    },
    /// `checkpoint_version.txt` holds something other than a non-negative integer.
    #[error("{}: checkpoint version file holds {content:?}, expected a non-negative integer", path.display())]
    BadVersionFile {
        /// The version file.
        path: PathBuf,
        /// Its (trimmed) content.
        content: String,
    },
    /// `config.json` is not a PBG config.
    #[error("{}: bad config: {reason}", path.display())]
    BadConfig {
        /// The config file (or the HDF5 file whose `config/json` attribute it is).
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A config that is not JSON.
    #[error("{}: not JSON: {source}", path.display())]
    ConfigJson {
        /// The config file (or the HDF5 file whose `config/json` attribute it is).
        path: PathBuf,
        /// The JSON parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// An entity-path JSON file that is not JSON.
    #[error("{}: not JSON: {source}", path.display())]
    EntityFileJson {
        /// The file.
        path: PathBuf,
        /// The JSON parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// An entity-path file (`entity_count_*.txt`, `entity_names_*.json`, `dynamic_rel_names.json`) is
    /// malformed.
    #[error("{}: {reason}", path.display())]
    BadEntityFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A name that cannot be used in a PBG file name (empty, contains `/` or NUL).
    #[error("invalid {what} {name:?}: {reason}")]
    InvalidName {
        /// Which name (entity, parameter, ...).
        what: &'static str,
        /// The name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// Data handed to a writer that the format cannot hold.
    #[error("cannot write {what}: {reason}")]
    InvalidInput {
        /// What was being written.
        what: String,
        /// Why it cannot be.
        reason: String,
    },
    /// An output file that must be new already exists (PBG opens export outputs with mode `"xt"`; a snapshot
    /// link that already exists fails with `FileExistsError`).
    #[error("{}: already exists", path.display())]
    AlreadyExists {
        /// The path.
        path: PathBuf,
    },
    /// The names file of a partition does not have one name per embedding.
    #[error("{}: {names} names for {rows} embeddings of entity {entity:?} partition {partition}", path.display())]
    NamesMismatch {
        /// The names file.
        path: PathBuf,
        /// Entity type.
        entity: String,
        /// Partition.
        partition: u32,
        /// Names in the file.
        names: usize,
        /// Rows in the embeddings.
        rows: usize,
    },
    /// The relation-type names file disagrees with the config (PBG: "Mismatch in relations names").
    #[error("relation {index}: named {found:?} in the relation-type dictionary and {expected:?} in the config")]
    RelationNameMismatch {
        /// Relation index.
        index: usize,
        /// Name in the config.
        expected: String,
        /// Name in `dynamic_rel_names.json`.
        found: String,
    },
    /// Entries given to [`crate::save`] hold neither entity partitions nor model parameters.
    #[error(
        "no `embeddings/<entity>/<partition>` or `model/<parameter>` entries: a PyTorch-BigGraph checkpoint is \
         entity embedding partitions and relation operators"
    )]
    NoEmbeddings,
    /// Entries given to [`crate::save`] without a `config` entry, and no config in the options.
    #[error(
        "no `config` entry: a PyTorch-BigGraph checkpoint needs the training config that defines its entities, \
         partitions and relations"
    )]
    NoConfig,
    /// Entries given to [`crate::save`] that do not fit the config's layout.
    #[error("the entries do not fit the config: {reason}")]
    LayoutMismatch {
        /// What does not fit.
        reason: String,
    },
    /// A model parameter that an operation needs is absent from the model file.
    #[error("the model has no parameter {0:?}")]
    MissingParameter(String),
    /// A checkpoint entry that does not exist.
    #[error("no entry named {0:?}")]
    NoSuchEntry(String),
    /// An error from the tensor model (allocation, views).
    #[error(transparent)]
    Core(#[from] ckpt_tensor::Error),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    pub(crate) fn hdf5(path: &Path, source: hdf5::Error) -> Self {
        Error::Hdf5 { path: path.to_path_buf(), source }
    }
}

impl FormatError for Error {
    /// Who is at fault: bad files are malformed, missing files and OS errors I/O, bad arguments the caller's.
    fn fault(&self) -> Fault {
        match self {
            Error::Io { .. } | Error::CouldNotLoad { .. } => Fault::Io,
            Error::Core(c) => c.fault(),
            // A blob over the pickle decoder's limits is a limit, as for the torch codec; other failures are
            // damage.
            Error::OptimizerBlob { source, .. } if source.fault() == Fault::Limit => Fault::Limit,
            Error::InvalidName { .. }
            | Error::InvalidInput { .. }
            | Error::AlreadyExists { .. }
            | Error::NoSuchEntry(_)
            | Error::MissingParameter(_)
            | Error::NoEmbeddings
            | Error::NoConfig
            | Error::LayoutMismatch { .. } => Fault::InvalidArgument,
            Error::NotHdf5 { .. }
            | Error::Truncated { .. }
            | Error::Hdf5 { .. }
            | Error::FormatVersion { .. }
            | Error::MissingDataset { .. }
            | Error::WrongDtype { .. }
            | Error::WrongRank { .. }
            | Error::BadStorage { .. }
            | Error::CountMismatch { .. }
            | Error::DimensionMismatch { .. }
            | Error::OptimizerBlob { .. }
            | Error::OptimizerLayout(_)
            | Error::UnmappedParameter { .. }
            | Error::BadAttribute { .. }
            | Error::BadVersionFile { .. }
            | Error::BadConfig { .. }
            | Error::ConfigJson { .. }
            | Error::EntityFileJson { .. }
            | Error::BadEntityFile { .. }
            | Error::NamesMismatch { .. }
            | Error::RelationNameMismatch { .. } => Fault::Malformed,
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

/// `Result` with the PBG codec's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<ckpt_io::CommitError> for Error {
    /// A durable commit's error, as the tensor model holds it ([`Error::Core`]): plain I/O as
    /// `ckpt_tensor::Error::Io`, the rest (disk full, locked, ...) kept whole, found with
    /// `format_error::<ckpt_io::CommitError>()`.
    fn from(e: ckpt_io::CommitError) -> Self {
        Error::Core(e.into())
    }
}
