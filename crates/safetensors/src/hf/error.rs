//! Errors of the Hugging Face format.

use std::path::PathBuf;

use ckpt_tensor::Fault;
use ckpt_tensor::FormatError;

/// Errors of reading and writing Hugging Face sharded checkpoints.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The index or the directory is not a Hugging Face checkpoint as transformers writes it.
    #[error("{}: {reason}", path.display())]
    Malformed {
        /// The index or directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The index is not JSON.
    #[error("{}: invalid JSON: {source}", path.display())]
    IndexJson {
        /// The index.
        path: PathBuf,
        /// The JSON parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A `--max-shard-size` that transformers would not accept.
    #[error("invalid shard size {text:?}: an integer (bytes) or a number with a unit (5GB, 500MB, 64KB, 2GiB)")]
    BadSize {
        /// The text given.
        text: String,
    },
    /// An I/O error on a path.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An error of the tensor model or of a shard's safetensors file.
    #[error(transparent)]
    Core(#[from] ckpt_tensor::Error),
}

impl Error {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        Error::Io { path: path.to_path_buf(), source }
    }
}

impl FormatError for Error {
    /// Who is at fault.
    fn fault(&self) -> Fault {
        match self {
            Error::Malformed { .. } | Error::IndexJson { .. } => Fault::Malformed,
            Error::BadSize { .. } => Fault::InvalidArgument,
            Error::Io { .. } => Fault::Io,
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

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
