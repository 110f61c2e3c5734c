//! The rules of the process groups, one variant each.

use ckpt_tensor::Fault;
use ckpt_tensor::FormatError;

/// An error of a process group: one variant per rule.
///
/// The [`Collective`](crate::Collective) trait returns the core error; these convert into it as
/// [`ckpt_tensor::Error::Format`] with their [`Error::fault`], and
/// [`ckpt_tensor::Error::format_error`] finds them again.
///
/// They are local to a process and keep their sources. An error that must reach the other processes of a
/// group crosses the collective as bytes, so it travels as text: the callers do that (`ckpt-io`'s directory
/// commit, the writers' `RankFailed`/`ShardFailed`, the facade's `Error::RankFailed`), never this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A broadcast from a root that is not a rank of the group.
    #[error("invalid argument: broadcast root {root} of {ranks} ranks")]
    BadRoot {
        /// The root asked for.
        root: usize,
        /// The ranks of the group.
        ranks: usize,
    },
    /// A thread group whose operations stopped because one of its ranks failed.
    #[error("invalid argument: the thread group was aborted by a failing rank")]
    Aborted,
    /// A job of 0 ranks.
    #[error("invalid argument: a job needs at least one rank")]
    NoRanks,
    /// A hosted rank that panicked.
    #[error("invalid argument: rank {rank} of {world} panicked")]
    RankPanicked {
        /// The rank.
        rank: usize,
        /// The ranks of the job.
        world: usize,
    },
    /// A process that sent a message out of step with the others.
    #[error(
        "invalid argument: process {process} sent a message out of step (do all processes run the same ranks' \
         operations?)"
    )]
    OutOfStep {
        /// The process.
        process: usize,
    },
    /// A collective message that ends early.
    #[error("malformed data: a collective message is truncated")]
    TruncatedMessage,
    /// An MPI operation on more bytes than one MPI call can carry.
    #[cfg(feature = "mpi")]
    #[error("limit exceeded: an MPI {operation} of {len} bytes: at most {max} bytes per operation")]
    MpiTooLarge {
        /// The operation.
        operation: &'static str,
        /// Its bytes.
        len: usize,
        /// The most bytes one MPI call carries.
        max: i32,
    },
    /// MPI initialized twice in one process.
    #[cfg(feature = "mpi")]
    #[error("invalid argument: MPI is already initialized in this process")]
    MpiAlreadyInitialized,
    /// An MPI library that gives less than `MPI_THREAD_SERIALIZED`.
    #[cfg(feature = "mpi")]
    #[error("invalid argument: the MPI library gives {threading:?} thread support; ckpt needs at least Serialized")]
    MpiThreading {
        /// The thread support given.
        threading: mpi::environment::Threading,
    },
    /// A timeout variable that is not a number.
    #[cfg(feature = "mpi")]
    #[error("invalid argument: {variable}={value:?}: expected a number of seconds")]
    TimeoutNotANumber {
        /// The environment variable.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// A timeout variable that is not a finite number of seconds above 0.
    #[cfg(feature = "mpi")]
    #[error("invalid argument: {variable}={value:?}: expected seconds above 0")]
    TimeoutNotPositive {
        /// The environment variable.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// A collective timeout with an MPI library that does not give `MPI_THREAD_MULTIPLE`.
    #[cfg(feature = "mpi")]
    #[error("invalid argument: a collective timeout needs MPI_THREAD_MULTIPLE, which this MPI library does not give")]
    TimeoutNeedsMultiple,
    /// The MPI watchdog thread could not be started.
    #[cfg(feature = "mpi")]
    #[error("invalid argument: cannot start the MPI watchdog thread: {source}")]
    Watchdog {
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The lock that serializes MPI calls is poisoned (a thread panicked inside MPI).
    #[cfg(feature = "mpi")]
    #[error("invalid argument: the MPI lock is poisoned")]
    LockPoisoned,
}

impl FormatError for Error {
    /// Who is at fault.
    fn fault(&self) -> Fault {
        match self {
            Error::BadRoot { .. }
            | Error::Aborted
            | Error::NoRanks
            | Error::RankPanicked { .. }
            | Error::OutOfStep { .. } => Fault::InvalidArgument,
            Error::TruncatedMessage => Fault::Malformed,
            #[cfg(feature = "mpi")]
            Error::MpiTooLarge { .. } => Fault::Limit,
            #[cfg(feature = "mpi")]
            Error::MpiAlreadyInitialized
            | Error::MpiThreading { .. }
            | Error::TimeoutNotANumber { .. }
            | Error::TimeoutNotPositive { .. }
            | Error::TimeoutNeedsMultiple
            | Error::Watchdog { .. }
            | Error::LockPoisoned => Fault::InvalidArgument,
        }
    }
}
