//! The process groups ckpt's multi-rank readers and writers run in: the [`Collective`] trait (rank, world
//! size, barrier, gather, broadcast), one process, threads, MPI, and hosting a job of `W` ranks on fewer
//! processes.
//!
//! - [`Collective`]: what a multi-rank save, load or reshard needs from its group, as `torch.distributed`
//!   provides it; every rank calls the same operations in the same order.
//! - [`SingleProcess`]: a group of one. [`ThreadGroup`]: `W` ranks as threads of one process (tests, and
//!   conversions that write every rank's files at once).
//! - [`host_ranks`] / [`hosted_ranks`]: run a job of `W` ranks on the processes of a group of any size
//!   (`mpirun -np 2` writing a 4-rank checkpoint), so the files are the bytes one process would write.
//! - `MpiCollective` (feature `mpi`): the processes of an MPI job (`mpirun`), through the `mpi` crate.
//!
//! ```
//! use ckpt_collective::{Collective, ThreadGroup};
//! let sums: Vec<u64> = std::thread::scope(|s| {
//!     let handles: Vec<_> = ThreadGroup::new(3)
//!         .into_iter()
//!         .map(|g| s.spawn(move || g.all_gather(vec![g.rank() as u8]).unwrap().iter().map(|b| u64::from(b[0])).sum()))
//!         .collect();
//!     handles.into_iter().map(|h| h.join().unwrap()).collect()
//! });
//! assert_eq!(sums, vec![3, 3, 3]);
//! ```
//!
//! # Feature flags
//! - `mpi`: `MpiCollective`, the processes of an MPI job (`mpirun`) as a [`Collective`] (needs an MPI
//!   library such as OpenMPI, and libclang, to build).

#![forbid(unsafe_code)]

mod error;
mod group;
mod hosted;
#[cfg(feature = "mpi")]
mod mpi_group;

pub use error::Error;
pub use group::{Collective, SingleProcess, ThreadGroup};
pub use hosted::{host_ranks, hosted_ranks};
#[cfg(feature = "mpi")]
pub use mpi_group::{MpiCollective, TIMEOUT_ENV as MPI_TIMEOUT_ENV, launched_by_mpi};
