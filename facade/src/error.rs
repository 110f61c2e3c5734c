//! The facade's error: which path, and the format crate's error kept whole as the cause.

use std::path::{Path, PathBuf};

use ckpt_tensor::{Fault, FormatError};

use crate::format::Format;

/// Errors of the facade: what went wrong, with the path it is about; a format crate's error is kept whole as
/// the [source](std::error::Error::source) (downcast it to `ckpt::torch::Error`, `ckpt::distcp::Error`, ...
/// for the details), and [`Error::fault`] says who is at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Object storage failed (a URL source or target): the storage error says what, and its
    /// [`fault`](ckpt_io::storage::StorageError::fault) who is at fault.
    #[error(transparent)]
    Storage(#[from] ckpt_io::storage::StorageError),
    /// An I/O error.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The format of a path could not be recognised.
    #[error("{}: unknown checkpoint format: {reason}", path.display())]
    UnknownFormat {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The format is known but this build lacks its feature.
    #[error("{}: this is a {format} checkpoint; enable the `{feature}` feature of the ckpt crate to read it", path.display())]
    FeatureDisabled {
        /// The path.
        path: PathBuf,
        /// The format.
        format: Format,
        /// The feature to enable.
        feature: &'static str,
    },
    /// An error of a format crate or of the core, about `path`. The core error says who is at fault and
    /// keeps the format crate's own error as its source ([`ckpt_tensor::Error::Format`]). The message names
    /// the path once: the format crate's message, prefixed with the path unless it names it already.
    #[error("{}", about(path, source))]
    Format {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: ckpt_tensor::Error,
    },
    /// The target format cannot hold the source's data.
    #[error("cannot convert {from} to {to}: {reason}")]
    UnsupportedConversion {
        /// Source format.
        from: Format,
        /// Target format.
        to: Format,
        /// Why.
        reason: String,
    },
    /// The caller asked for something impossible (a world size of 0, resharding a format without shards).
    #[error("{}: {reason}", path.display())]
    InvalidArgument {
        /// The path the request was about.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An option given that does not apply to this source or target (`--world-size` to a torch file, `--tag`
    /// to a DCP checkpoint, `--hfai-large-size` to a distcp target); [`crate::named_options`].
    #[error("option {option} does not apply: {reason}; leave it out")]
    OptionNotApplicable {
        /// The option, as the caller named it (`world_size`, `--world-size`).
        option: String,
        /// Why it does not apply.
        reason: String,
    },
    /// An option name no command takes (`world_sizes`), with the names near it or what ckpt does instead
    /// (`map_location`); [`crate::options::named::unknown_option`].
    #[error("unknown option {option}{hint}")]
    UnknownOption {
        /// The name given.
        option: String,
        /// The names near it, or what ckpt does instead, as a sentence's end.
        hint: String,
    },
    /// An option's value that does not parse.
    #[error("option {option}: {value:?} is not {expected}")]
    InvalidOptionValue {
        /// The option.
        option: String,
        /// The value given.
        value: String,
        /// What it takes.
        expected: String,
    },
    /// A storage option that is not `KEY=VALUE`, or a value of ckpt's own keys it cannot read (the key
    /// named, never the value); [`crate::place::storage_options`].
    #[error(transparent)]
    StorageOption(#[from] ckpt_io::storage::OptionSyntax),
    /// The destination already holds what a write would replace or mix with.
    #[error("{}: {reason}", path.display())]
    AlreadyExists {
        /// The destination.
        path: PathBuf,
        /// What is there.
        reason: String,
    },
    /// A resource limit of [`crate::ReadLimits`] that the facade checks itself was exceeded (the format
    /// crates' own limit errors come as [`Error::Format`], also of [`Fault::Limit`]).
    #[error("{}: {what} of {value} bytes exceeds the limit of {max} bytes ({limit}; raise it for input you trust)", path.display())]
    LimitExceeded {
        /// The file.
        path: PathBuf,
        /// The limit's name, as the field of [`crate::ReadLimits`] (the CLI flag is `--max-...` of it).
        limit: &'static str,
        /// What exceeded it.
        what: &'static str,
        /// Its size.
        value: u64,
        /// The limit.
        max: u64,
    },
    /// Another process of a multi-process run ([`crate::convert_in`], [`crate::reshard_in`]) failed; every
    /// process returns this (the failing one its own error), so none waits for it.
    #[error("process {rank} failed: {message}")]
    RankFailed {
        /// The first process (rank of the outer group) that failed.
        rank: usize,
        /// Who was at fault for its error (so that every process of a job reports the same class, and the
        /// `ckpt` tool the same exit code); [`Fault::Io`] when the processes could not exchange outcomes.
        fault: Fault,
        /// Its error, as text: it crossed the process group as bytes, so its source chain is this message.
        message: String,
    },
    /// A selection selects nothing it names: an include pattern matches no entry of the checkpoint, or the
    /// exclude patterns remove every entry the includes (or the checkpoint) hold. Nothing is written.
    #[error("{}: {}", path.display(), empty_selection_reason(unmatched, removed, nearest))]
    EmptySelection {
        /// The checkpoint the selection was applied to.
        path: PathBuf,
        /// The include patterns that match no entry (empty when the excludes removed everything).
        unmatched: Vec<String>,
        /// How many entries the includes kept before the exclude patterns removed them all (0 when some
        /// include pattern matches nothing).
        removed: usize,
        /// The checkpoint's entry names nearest the patterns that matched nothing, nearest first.
        nearest: Vec<String>,
    },
    /// A write's destination holds something that is not a checkpoint of the target format (a file that is
    /// not a checkpoint, a directory of other files, a checkpoint of another format): a write replaces only
    /// a checkpoint of its own format, or replaces anything when asked to overwrite.
    #[error(
        "{}: {what} is there, which writing {to} would replace; pass --overwrite (Python: overwrite=True) to \
         replace it whole, or write to another path",
        path.display()
    )]
    DestinationTaken {
        /// The destination.
        path: PathBuf,
        /// What is there, in words ("a text file", "an hfai checkpoint", "a directory of 3 files that is not
        /// a checkpoint (notes.txt, ...)").
        what: String,
        /// The format the write would have written.
        to: Format,
    },
    /// A file that no format recognises, with what it looks like ([`crate::format::looks_like`]: a text file, an
    /// empty file, a gzip file, ...).
    #[error(
        "{}: not a checkpoint: this is {looks_like}; ckpt reads torch.save, safetensors, GGUF and pickle files and \
         checkpoint directories (if it is one, name its format: `ckpt convert --from`, Python `ckpt.open(path, format=...)`)",
        path.display()
    )]
    NotACheckpoint {
        /// The file.
        path: PathBuf,
        /// What it looks like.
        looks_like: String,
    },
    /// A path that is neither a regular file nor a directory (a named pipe, a socket, a device): refused at
    /// once, since reading it could block or never end.
    #[error("{}: this is {kind}, not a checkpoint file or directory; give the path of a file or a directory", path.display())]
    SpecialFile {
        /// The path.
        path: PathBuf,
        /// What it is: `a named pipe (FIFO)`, `a socket`, `a character device`, `a block device`.
        kind: &'static str,
    },
    /// No entry of the checkpoint has the name asked for: the names near it, or the number of entries under
    /// it when it is a prefix of names (`state_dict` of `state_dict.model.w`).
    #[error("{}: no entry {name:?}{}", path.display(), no_entry_hint(did_you_mean, *under))]
    NoEntry {
        /// The checkpoint.
        path: PathBuf,
        /// The name asked for.
        name: String,
        /// The entry names near it ([`crate::suggest::did_you_mean`]).
        did_you_mean: Vec<String>,
        /// How many entries are under it (`<name>.*`).
        under: usize,
    },
}

/// Why a selection selects nothing ([`Error::EmptySelection`]): the include patterns that match no
/// entry with the names nearest them, or how many entries the exclude patterns removed.
fn empty_selection_reason(unmatched: &[String], removed: &usize, nearest: &[String]) -> String {
    if unmatched.is_empty() {
        return format!(
            "the exclude patterns remove every entry the selection would otherwise keep ({removed}), so it \
             selects nothing; loosen --exclude (`ckpt inspect --include ...` lists what each pattern matches)"
        );
    }
    let patterns: Vec<String> = unmatched.iter().map(|p| format!("{p:?}")).collect();
    let (what, verb) =
        if unmatched.len() == 1 { ("include pattern", "matches") } else { ("include patterns", "match") };
    let hint = if nearest.is_empty() {
        "the checkpoint has no entries".to_owned()
    } else {
        format!("the nearest names are {}", nearest.join(", "))
    };
    format!(
        "the {what} {} {verb} no entry ({hint}; `ckpt inspect` lists every name, and `*` matches dots too)",
        patterns.join(", ")
    )
}

/// What [`Error::NoEntry`] adds to "no entry X": the entries under it, or the names near it.
fn no_entry_hint(did_you_mean: &[String], under: usize) -> String {
    if under > 0 {
        let (n, are) = if under == 1 { ("entry", "is") } else { ("entries", "are") };
        format!(" ({under} {n} {are} under it: `ckpt cat` and Python's `ck[name]` give them all)")
    } else if did_you_mean.is_empty() {
        "; `ckpt inspect` lists the entries".into()
    } else {
        format!("; did you mean: {}?", did_you_mean.join(", "))
    }
}

impl Error {
    /// Who is at fault.
    pub fn fault(&self) -> Fault {
        match self {
            Error::Io { .. } => Fault::Io,
            Error::Storage(e) => e.fault(),
            Error::UnknownFormat { .. } => Fault::Malformed,
            Error::FeatureDisabled { .. } | Error::UnsupportedConversion { .. } => Fault::Unsupported,
            Error::Format { source, .. } => source.fault(),
            Error::InvalidArgument { .. } | Error::AlreadyExists { .. } => Fault::InvalidArgument,
            Error::RankFailed { fault, .. } => *fault,
            Error::LimitExceeded { .. } => Fault::Limit,
            Error::EmptySelection { .. } => Fault::InvalidArgument,
            Error::DestinationTaken { .. } => Fault::InvalidArgument,
            Error::NotACheckpoint { .. } => Fault::Malformed,
            Error::SpecialFile { .. } | Error::NoEntry { .. } => Fault::InvalidArgument,
            Error::OptionNotApplicable { .. } | Error::UnknownOption { .. } | Error::InvalidOptionValue { .. } => {
                Fault::InvalidArgument
            }
            Error::StorageOption(_) => Fault::InvalidArgument,
        }
    }
}

/// `message` prefixed with `path`, unless it names the path already.
fn about(path: &Path, message: &impl std::fmt::Display) -> String {
    let (path, message) = (path.display().to_string(), message.to_string());
    if message.contains(&path) { message } else { format!("{path}: {message}") }
}

/// `Result` with the facade's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error the facade can attribute to a path: I/O errors, core errors and every format crate's error
/// (each format's adaptor implements this for its crate's error).
pub(crate) trait Cause {
    /// This error, about `path`.
    fn at(self, path: &Path) -> Error;
}

impl Cause for std::io::Error {
    fn at(self, path: &Path) -> Error {
        Error::Io { path: path.to_path_buf(), source: self }
    }
}

/// The facade's own errors already say where.
impl Cause for Error {
    fn at(self, _: &Path) -> Error {
        self
    }
}

impl Cause for ckpt_tensor::Error {
    fn at(self, path: &Path) -> Error {
        Error::Format { path: path.to_path_buf(), source: self }
    }
}

/// Attaches a path to the error of a result: `TorchReader::open(path).at(path)?`. The one place the facade
/// turns other errors into its own.
pub(crate) trait At<T> {
    /// The result, its error about `path`.
    fn at(self, path: &Path) -> Result<T>;
}

impl<T, E: Cause> At<T> for std::result::Result<T, E> {
    fn at(self, path: &Path) -> Result<T> {
        self.map_err(|e| e.at(path))
    }
}

/// A fault as one byte, to cross a process group with an error's text ([`Error::RankFailed`]).
pub(crate) fn fault_code(fault: Fault) -> u8 {
    match fault {
        Fault::Malformed => 1,
        Fault::Unsupported => 2,
        Fault::Limit => 3,
        Fault::InvalidArgument => 5,
        // Io, and a class added to the model later: the environment's.
        _ => 4,
    }
}

/// The fault a byte of [`fault_code`] stands for ([`Fault::Io`] for a byte it never writes).
pub(crate) fn fault_of_code(code: u8) -> Fault {
    match code {
        1 => Fault::Malformed,
        2 => Fault::Unsupported,
        3 => Fault::Limit,
        5 => Fault::InvalidArgument,
        _ => Fault::Io,
    }
}
