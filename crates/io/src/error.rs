//! Errors of the commit protocol, split by what the caller can do about them.

use ckpt_tensor::FormatError;
use std::io;
use std::path::{Path, PathBuf};

/// Why one rank of a multi-rank save failed, as it tells rank 0 in its report ([`crate::DirCommit::commit`],
/// [`crate::DirCommit::report`]): the failing rank's error in words.
///
/// It crosses the process group as its message alone, in the same bytes as before it had a type of its own
/// (a report of tag 0 followed by the message), so ranks agree on it whatever their build. Rank 0 answers
/// every rank with [`CommitError::RankFailed`], which names the rank and carries this message; the rank that
/// failed keeps its own error, source intact, for itself.
///
/// ```
/// let e = std::io::Error::other("no space left on the device");
/// let failure = ckpt_io::RankFailure::from(e);
/// assert_eq!(failure.message(), "no space left on the device");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankFailure {
    message: String,
}

impl RankFailure {
    /// A failure told in words that come from outside this library's errors (a Python exception's text).
    pub fn new(message: impl Into<String>) -> Self {
        RankFailure { message: message.into() }
    }

    /// What went wrong, as the other ranks are told.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for RankFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Any error as a rank's failure: its message (`to_string`), the text the other ranks get. Works on a
/// borrowed error too (`result.as_ref().map_err(RankFailure::from)`).
impl<E: std::error::Error> From<E> for RankFailure {
    fn from(e: E) -> Self {
        RankFailure { message: e.to_string() }
    }
}

/// How a rank's part in a save does not match the save rank 0 prepared ([`CommitError::TicketMismatch`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TicketRule {
    /// A rank that is rank 0, or not below the save's number of ranks, joins.
    #[error("rank {rank} cannot join a save of {world} ranks prepared by rank 0")]
    RankOutside {
        /// The rank that joins.
        rank: usize,
        /// The save's number of ranks.
        world: usize,
    },
    /// A rank joins a save to another destination.
    #[error("rank 0 saves to {}", target.display())]
    OtherDestination {
        /// Rank 0's destination.
        target: PathBuf,
    },
    /// A commit on a rank other than 0, or with a number of reports other than the number of ranks.
    #[error("rank {rank} committed with {reports} reports; rank 0 commits with one report from each of {world} ranks")]
    ReportCount {
        /// The rank that commits.
        rank: usize,
        /// The reports it has.
        reports: usize,
        /// The save's number of ranks.
        world: usize,
    },
}

/// Why a durable commit failed. Every variant names the destination (or the file inside a staging
/// directory) and keeps the operating system's error as its [`source`](std::error::Error::source), so
/// callers can match the cause (`DiskFull` → free space and retry; `Locked` → another save is running).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// No space left: `ENOSPC`, a quota (`EDQUOT`), or the process's file size limit (`EFBIG`, from
    /// `RLIMIT_FSIZE`). Nothing of the previous checkpoint was touched.
    #[error("{}: not enough space to save ({source})", path.display())]
    DiskFull {
        /// The destination being written.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The file system is mounted read-only (`EROFS`).
    #[error("{}: the file system is read-only ({source})", path.display())]
    ReadOnly {
        /// The destination being written.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The destination or its directory may not be written (`EACCES`, `EPERM`).
    #[error("{}: permission denied ({source})", path.display())]
    PermissionDenied {
        /// The path that could not be written.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// Another save to the same destination holds its advisory lock.
    #[error("{}: another save to this destination is in progress{}", path.display(), holder.as_deref().map(|h| format!(" ({h})")).unwrap_or_default())]
    Locked {
        /// The destination.
        path: PathBuf,
        /// Who holds the lock, as the holder recorded it (`pid 1234 on host`), when known.
        holder: Option<String>,
    },
    /// The destination cannot be replaced this way: it is of the wrong kind (a file where a directory
    /// is saved), a mount point, or it holds entries the commit would have to drop.
    #[error("{}: {reason}", path.display())]
    Refused {
        /// The destination.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Another rank of a multi-rank save failed; this rank's files were not committed.
    #[error("rank {rank} failed: {message}")]
    RankFailed {
        /// The rank that failed first.
        rank: usize,
        /// Its error, as text.
        message: String,
    },
    /// The process group failed (a collective operation returned an error).
    #[error("the process group failed: {source}")]
    Group {
        /// The collective's error.
        #[source]
        source: ckpt_tensor::Error,
    },
    /// The object store refused or failed (a destination URL): its own error, with what to do about it.
    #[error("{source}")]
    Storage {
        /// The store's classified error.
        #[source]
        source: crate::storage::StorageError,
    },
    /// A commit ticket ([`crate::CommitTicket`]) that is not one: the message between the ranks was damaged
    /// or is not a ticket.
    #[error("the commit ticket from rank 0 is unreadable ({field})")]
    TicketUnreadable {
        /// The field that is missing or not of its type.
        field: &'static str,
    },
    /// A commit ticket ([`crate::CommitTicket`]) that is not JSON: the message between the ranks was damaged
    /// or is not a ticket.
    #[error("the commit ticket from rank 0 is unreadable ({source})")]
    TicketNotJson {
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A rank joined or committed a save that is not its own: another destination, a rank outside the
    /// save, or a commit with the wrong number of reports.
    #[error("{}: {rule}", path.display())]
    TicketMismatch {
        /// This rank's destination.
        path: PathBuf,
        /// What does not match.
        rule: TicketRule,
    },
    /// A rank does not see the staging directory rank 0 made: the ranks of a multi-rank save to a local path
    /// must share its file system.
    #[error(
        "{}: rank 0's staging directory {} is not visible on this rank; every rank must save to the same shared \
         file system (or save to an object-store URL)",
        path.display(),
        staging.display()
    )]
    StagingNotShared {
        /// The destination.
        path: PathBuf,
        /// Rank 0's staging directory.
        staging: PathBuf,
    },
    /// Any other I/O error.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

impl CommitError {
    /// Classifies an I/O error on `path` into the specific variant its `errno` calls for.
    pub fn from_io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        let path = path.into();
        // An object store's error, carried through `io::Error` by a remote writer: kept as it is.
        if source.get_ref().is_some_and(|e| e.is::<crate::storage::StorageError>()) {
            if let Some(inner) = source.into_inner() {
                if let Ok(storage) = inner.downcast::<crate::storage::StorageError>() {
                    return CommitError::Storage { source: *storage };
                }
            }
            return CommitError::Io { path, source: io::Error::other("an object store error") };
        }
        match source.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => CommitError::DiskFull { path, source },
            Some(libc::EROFS) => CommitError::ReadOnly { path, source },
            Some(libc::EACCES | libc::EPERM) => CommitError::PermissionDenied { path, source },
            _ => CommitError::Io { path, source },
        }
    }

    /// The path the error names, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            CommitError::DiskFull { path, .. }
            | CommitError::ReadOnly { path, .. }
            | CommitError::PermissionDenied { path, .. }
            | CommitError::Locked { path, .. }
            | CommitError::Refused { path, .. }
            | CommitError::TicketMismatch { path, .. }
            | CommitError::StagingNotShared { path, .. }
            | CommitError::Io { path, .. } => Some(path),
            CommitError::RankFailed { .. }
            | CommitError::Group { .. }
            | CommitError::Storage { .. }
            | CommitError::TicketUnreadable { .. }
            | CommitError::TicketNotJson { .. } => None,
        }
    }

    /// Whether the cause is a lack of space (disk, quota or file size limit).
    pub fn is_disk_full(&self) -> bool {
        matches!(self, CommitError::DiskFull { .. })
    }
}

impl FormatError for CommitError {
    /// Who is at fault: the caller for a destination that cannot be replaced this way
    /// ([`CommitError::Refused`]), the operating system or the environment for everything else.
    fn fault(&self) -> ckpt_tensor::Fault {
        match self {
            CommitError::Refused { .. } | CommitError::TicketMismatch { .. } | CommitError::StagingNotShared { .. } => {
                ckpt_tensor::Fault::InvalidArgument
            }
            CommitError::TicketUnreadable { .. } | CommitError::TicketNotJson { .. } => ckpt_tensor::Fault::Io,
            CommitError::Storage { source } => source.fault(),
            CommitError::DiskFull { .. }
            | CommitError::ReadOnly { .. }
            | CommitError::PermissionDenied { .. }
            | CommitError::Locked { .. }
            | CommitError::RankFailed { .. }
            | CommitError::Group { .. }
            | CommitError::Io { .. } => ckpt_tensor::Fault::Io,
        }
    }

    /// A commit's plain I/O error becomes [`ckpt_tensor::Error::Io`]; every other kind (disk full, locked,
    /// a failed rank, ...) stays whole as the source of a [`ckpt_tensor::Error::Format`] with its fault, where
    /// [`ckpt_tensor::Error::format_error`] finds it.
    fn into_core(self) -> std::result::Result<ckpt_tensor::Error, Self> {
        match self {
            CommitError::Io { path, source } => Ok(ckpt_tensor::Error::Io { path, source }),
            e => Err(e),
        }
    }
}

/// `CommitError::from_io` as a closure over the path, for `map_err`.
pub(crate) fn at(path: &Path) -> impl FnOnce(io::Error) -> CommitError + '_ {
    move |e| CommitError::from_io(path, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_errno() {
        let e = |n| CommitError::from_io("/x", io::Error::from_raw_os_error(n));
        assert!(matches!(e(libc::ENOSPC), CommitError::DiskFull { .. }));
        assert!(matches!(e(libc::EFBIG), CommitError::DiskFull { .. }));
        assert!(matches!(e(libc::EDQUOT), CommitError::DiskFull { .. }));
        assert!(matches!(e(libc::EROFS), CommitError::ReadOnly { .. }));
        assert!(matches!(e(libc::EACCES), CommitError::PermissionDenied { .. }));
        assert!(matches!(e(libc::EIO), CommitError::Io { .. }));
        let full = e(libc::ENOSPC);
        assert!(full.is_disk_full());
        assert_eq!(full.path(), Some(Path::new("/x")));
        assert!(std::error::Error::source(&full).is_some(), "the io::Error is kept as the source");
        let locked = CommitError::Locked { path: "/d/m.pt".into(), holder: Some("pid 7 on h".into()) };
        assert_eq!(locked.to_string(), "/d/m.pt: another save to this destination is in progress (pid 7 on h)");
        // Into the tensor model's error: plain I/O as Io, the rest kept whole with its fault.
        let core = ckpt_tensor::Error::from(locked);
        assert_eq!(core.fault(), ckpt_tensor::Fault::Io);
        assert!(matches!(core.format_error::<CommitError>(), Some(CommitError::Locked { .. })));
        let io = ckpt_tensor::Error::from(e(libc::EIO));
        assert!(matches!(io, ckpt_tensor::Error::Io { .. }));
    }
}
