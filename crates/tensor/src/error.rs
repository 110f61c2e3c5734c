//! The core error type, split by who is at fault.

use std::path::PathBuf;

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
/// Format crates have their own precise error enums. They convert into this one (`From<their Error>`) as
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
            Error::Malformed(_) => Fault::Malformed,
            Error::Unsupported(_) => Fault::Unsupported,
            Error::Limit(_) => Fault::Limit,
            Error::InvalidArgument(_) => Fault::InvalidArgument,
            Error::Io { .. } => Fault::Io,
            Error::Format { fault, .. } => *fault,
        }
    }

    /// The format crate's error, when this is an [`Error::Format`] holding an `E`.
    pub fn format_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Error::Format { source, .. } => source.downcast_ref::<E>(),
            _ => None,
        }
    }
}

/// `Result` with the core [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_a_fault() {
        assert_eq!(Error::Malformed(String::new()).fault(), Fault::Malformed);
        assert_eq!(Error::Unsupported(String::new()).fault(), Fault::Unsupported);
        assert_eq!(Error::Limit(String::new()).fault(), Fault::Limit);
        assert_eq!(Error::InvalidArgument(String::new()).fault(), Fault::InvalidArgument);
        assert_eq!(Error::io("/x", std::io::Error::other("disk")).fault(), Fault::Io);
        let e = Error::format(Fault::Limit, std::io::Error::other("too big"));
        assert_eq!(e.fault(), Fault::Limit);
        // The format crate's error is the source, not a string.
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("too big"));
        assert!(e.format_error::<std::io::Error>().is_some());
        assert!(Error::Limit(String::new()).format_error::<std::io::Error>().is_none());
    }
}
