//! The core error type, split by who is at fault.

use std::path::PathBuf;

/// Errors raised by `ckpt-core` operations, split by who is at fault: the file (malformed), the library
/// (unsupported), a resource cap (limit), the operating system (I/O), or the caller (invalid argument).
///
/// Format crates have their own precise error enums and convert into this one at the facade.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The data violates its format.
    #[error("malformed data: {0}")]
    Malformed(String),
    /// The data is valid but uses something this library does not handle.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A resource limit was reached.
    #[error("limit exceeded: {0}")]
    Limit(String),
    /// The caller asked for something impossible (a slice out of range, a dtype mismatch).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An I/O error on a path.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A durable commit failed for a reason callers can act on: disk full, read-only, permission denied,
    /// another save holds the destination's lock (plain I/O errors of a commit are [`Error::Io`]).
    #[error(transparent)]
    Commit(crate::commit::CommitError),
    /// A safetensors error from the `safetensors` crate.
    #[error("safetensors: {0}")]
    SafeTensors(#[from] safetensors::SafeTensorError),
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}

impl From<crate::commit::CommitError> for Error {
    /// A commit's plain I/O error becomes [`Error::Io`]; every other kind stays a [`Error::Commit`].
    fn from(e: crate::commit::CommitError) -> Self {
        match e {
            crate::commit::CommitError::Io { path, source } => Error::Io { path, source },
            e => Error::Commit(e),
        }
    }
}

/// `Result` with the core [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
