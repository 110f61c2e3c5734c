//! [`MpiCollective`]: the processes of an MPI job (`mpirun -np K ...`) as a [`Collective`], through the
//! `mpi` crate (rsmpi) and the system's MPI library (OpenMPI, MPICH).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mpi::Count;
use mpi::datatype::PartitionMut;
use mpi::environment::{Threading, Universe};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::{CommunicatorCollectives, Root};

use crate::group::Collective;
use ckpt_tensor::Result;

use crate::error::Error;

/// The environment variable that sets [`MpiCollective::init`]'s watchdog: seconds one collective operation
/// may wait before the job is aborted.
pub const TIMEOUT_ENV: &str = "CKPT_MPI_TIMEOUT";

/// Whether this process was started by an MPI launcher (`mpirun`, `mpiexec`, `srun` with PMI): one of the
/// variables OpenMPI, MPICH/PMI or PMIx set is present.
pub fn launched_by_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"].iter().any(|v| std::env::var_os(v).is_some())
}

/// The world communicator of an MPI job as a [`Collective`]: rank and size of `MPI_COMM_WORLD`, and the
/// collective operations as `MPI_Allgatherv`, `MPI_Gatherv`, `MPI_Bcast` and `MPI_Barrier` on byte buffers
/// of any length (sizes travel first).
///
/// MPI is initialized with `MPI_THREAD_MULTIPLE` (at least `MPI_THREAD_SERIALIZED` is required): calls from
/// the threads of one process are serialized by a lock, so one process may host several ranks of a bigger
/// job ([`crate::host_ranks`]). Dropping it finalizes MPI; create it once, on the main thread, and keep it
/// until the end of `main`.
///
/// # When a rank fails
/// ckpt's multi-rank writers exchange every rank's outcome before each commit step, so a rank that fails
/// makes every rank return an error, naming it. What no exchange can catch, a rank that stops taking part
/// (a crash, a hang, a bug), ends the job instead of hanging it:
///
/// - [`MpiCollective::abort`] prints the rank's message and calls `MPI_Abort`: mpirun kills every rank and
///   exits with an error. Call it when a rank cannot go on with the collective protocol.
/// - with a watchdog ([`MpiCollective::with_timeout`], or `CKPT_MPI_TIMEOUT=<seconds>` read by
///   [`MpiCollective::init`]) a rank that waits longer than that in one operation aborts the job, naming the
///   operation. This needs `MPI_THREAD_MULTIPLE`.
/// - a rank that dies is noticed by mpirun, which ends the job.
///
/// ```no_run
/// use ckpt_collective::{Collective, MpiCollective};
/// let mpi = MpiCollective::init()?;
/// let all = mpi.all_gather(format!("hello from {}", mpi.rank()).into_bytes())?;
/// assert_eq!(all.len(), mpi.world_size());
/// # Ok::<(), ckpt_tensor::Error>(())
/// ```
pub struct MpiCollective {
    _universe: Universe,
    rank: usize,
    size: usize,
    threading: Threading,
    lock: Mutex<()>,
    watchdog: Option<Watchdog>,
}

struct Watchdog {
    /// Milliseconds since `epoch` at which the current operation started, plus one; 0 when idle.
    since: Arc<AtomicU64>,
    epoch: Instant,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for MpiCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiCollective")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("threading", &self.threading)
            .field("watchdog", &self.watchdog.is_some())
            .finish()
    }
}

fn world() -> SimpleCommunicator {
    SimpleCommunicator::world()
}

fn too_big(operation: &'static str, len: usize) -> ckpt_tensor::Error {
    Error::MpiTooLarge { operation, len, max: Count::MAX }.into()
}

fn count_of(len: usize, what: &'static str) -> Result<Count> {
    Count::try_from(len).map_err(|_| too_big(what, len))
}

/// Counts and displacements of a receive buffer holding parts of `lens` bytes one after another.
fn layout(lens: &[u64], what: &'static str) -> Result<(Vec<Count>, Vec<Count>, usize)> {
    let (mut counts, mut displs, mut total) = (Vec::with_capacity(lens.len()), Vec::with_capacity(lens.len()), 0);
    for &len in lens {
        let len = usize::try_from(len).map_err(|_| too_big(what, usize::MAX))?;
        displs.push(count_of(total, what)?);
        counts.push(count_of(len, what)?);
        total = total.checked_add(len).ok_or_else(|| too_big(what, usize::MAX))?;
    }
    count_of(total, what)?;
    Ok((counts, displs, total))
}

fn split(buf: &[u8], lens: &[u64]) -> Vec<Vec<u8>> {
    let mut at = 0usize;
    lens.iter()
        .map(|&len| {
            let end = at.saturating_add(usize::try_from(len).unwrap_or(usize::MAX)).min(buf.len());
            let part = buf.get(at..end).unwrap_or_default().to_vec();
            at = end;
            part
        })
        .collect()
}

impl MpiCollective {
    /// Initializes MPI and returns the world communicator. Reads [`TIMEOUT_ENV`] (seconds) for a watchdog.
    ///
    /// # Errors
    /// [`Error::MpiAlreadyInitialized`] when MPI was already initialized in this process,
    /// [`Error::MpiThreading`] when the MPI library cannot give at least `MPI_THREAD_SERIALIZED`,
    /// [`Error::TimeoutNotANumber`] or [`Error::TimeoutNotPositive`] when `CKPT_MPI_TIMEOUT` is not a number
    /// of seconds above 0.
    pub fn init() -> Result<MpiCollective> {
        let (universe, threading) =
            mpi::initialize_with_threading(Threading::Multiple).ok_or(Error::MpiAlreadyInitialized)?;
        if threading < Threading::Serialized {
            return Err(Error::MpiThreading { threading }.into());
        }
        let w = universe.world();
        let (rank, size) = (usize::try_from(w.rank()).unwrap_or(0), usize::try_from(w.size()).unwrap_or(1));
        let mpi = MpiCollective { _universe: universe, rank, size, threading, lock: Mutex::new(()), watchdog: None };
        match std::env::var(TIMEOUT_ENV) {
            Ok(s) if !s.trim().is_empty() => {
                let secs: f64 = s
                    .trim()
                    .parse()
                    .map_err(|_| Error::TimeoutNotANumber { variable: TIMEOUT_ENV, value: s.clone() })?;
                if !(secs > 0.0 && secs.is_finite()) {
                    return Err(Error::TimeoutNotPositive { variable: TIMEOUT_ENV, value: s }.into());
                }
                mpi.with_timeout(Duration::from_secs_f64(secs))
            }
            _ => Ok(mpi),
        }
    }

    /// This communicator with a watchdog: when one collective operation of this rank waits longer than
    /// `timeout` (a rank that never arrives), the job is aborted with a message naming this rank.
    ///
    /// # Errors
    /// [`Error::TimeoutNeedsMultiple`] when the MPI library does not give `MPI_THREAD_MULTIPLE` (the watchdog
    /// calls `MPI_Abort` while another thread waits inside MPI).
    pub fn with_timeout(mut self, timeout: Duration) -> Result<MpiCollective> {
        if self.threading != Threading::Multiple {
            return Err(Error::TimeoutNeedsMultiple.into());
        }
        let since = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let epoch = Instant::now();
        let (s, st, rank) = (Arc::clone(&since), Arc::clone(&stop), self.rank);
        let handle = std::thread::Builder::new()
            .name("ckpt-mpi-watchdog".into())
            .spawn(move || {
                let tick = (timeout / 10).clamp(Duration::from_millis(10), Duration::from_millis(500));
                while !st.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    let started = s.load(Ordering::Relaxed);
                    if started == 0 {
                        continue;
                    }
                    let waited = (epoch.elapsed().as_millis() as u64).saturating_sub(started - 1);
                    if Duration::from_millis(waited) > timeout {
                        abort_job(
                            rank,
                            &format!(
                                "waited {:.1} s in a collective operation (timeout {:.1} s): another rank failed \
                                 or hangs",
                                waited as f64 / 1000.0,
                                timeout.as_secs_f64()
                            ),
                        );
                    }
                }
            })
            .map_err(|source| Error::Watchdog { source })?;
        self.watchdog = Some(Watchdog { since, epoch, stop, handle: Some(handle) });
        Ok(self)
    }

    /// The thread support the MPI library gave.
    pub fn threading(&self) -> Threading {
        self.threading
    }

    /// Ends the whole job: prints `rank <r> aborts the MPI job: <message>` on standard error and calls
    /// `MPI_Abort` (mpirun then kills every rank and exits with an error).
    pub fn abort(&self, message: &str) -> ! {
        abort_job(self.rank, message)
    }

    /// Runs one MPI operation: serialized with the process's other threads, watched by the watchdog.
    fn op<T>(&self, f: impl FnOnce(&SimpleCommunicator) -> Result<T>) -> Result<T> {
        let _guard = self.lock.lock().map_err(|_| Error::LockPoisoned)?;
        if let Some(w) = &self.watchdog {
            w.since.store(w.epoch.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
        }
        let r = f(&world());
        if let Some(w) = &self.watchdog {
            w.since.store(0, Ordering::Relaxed);
        }
        r
    }
}

fn abort_job(rank: usize, message: &str) -> ! {
    eprintln!("ckpt: rank {rank} aborts the MPI job: {message}");
    world().abort(1)
}

impl Drop for MpiCollective {
    fn drop(&mut self) {
        if let Some(w) = &mut self.watchdog {
            w.stop.store(true, Ordering::Relaxed);
            if let Some(h) = w.handle.take() {
                let _ = h.join();
            }
        }
    }
}

impl Collective for MpiCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn barrier(&self) -> Result<()> {
        self.op(|w| {
            w.barrier();
            Ok(())
        })
    }

    fn all_gather(&self, data: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        self.op(|w| {
            let mut lens = vec![0u64; self.size];
            w.all_gather_into(&(data.len() as u64), &mut lens[..]);
            let (counts, displs, total) = layout(&lens, "all-gather")?;
            let mut buf = vec![0u8; total.max(1)];
            {
                let mut part = PartitionMut::new(&mut buf[..total.max(1)], counts, displs);
                w.all_gather_varcount_into(&data[..], &mut part);
            }
            Ok(split(&buf, &lens))
        })
    }

    fn gather(&self, data: Vec<u8>, root: usize) -> Result<Option<Vec<Vec<u8>>>> {
        let root_rank = self.root(root)?;
        self.op(|w| {
            let root = w.process_at_rank(root_rank);
            if self.rank == root_rank as usize {
                let mut lens = vec![0u64; self.size];
                root.gather_into_root(&(data.len() as u64), &mut lens[..]);
                let (counts, displs, total) = layout(&lens, "gather")?;
                let mut buf = vec![0u8; total.max(1)];
                {
                    let mut part = PartitionMut::new(&mut buf[..total.max(1)], counts, displs);
                    root.gather_varcount_into_root(&data[..], &mut part);
                }
                Ok(Some(split(&buf, &lens)))
            } else {
                root.gather_into(&(data.len() as u64));
                root.gather_varcount_into(&data[..]);
                Ok(None)
            }
        })
    }

    fn broadcast(&self, data: Vec<u8>, root: usize) -> Result<Vec<u8>> {
        let root_rank = self.root(root)?;
        self.op(|w| {
            let root = w.process_at_rank(root_rank);
            let mut len = data.len() as u64;
            root.broadcast_into(&mut len);
            let len = usize::try_from(len).map_err(|_| too_big("broadcast", usize::MAX))?;
            count_of(len, "broadcast")?;
            if len == 0 {
                return Ok(Vec::new());
            }
            let mut buf = if self.rank == root_rank as usize { data } else { vec![0u8; len] };
            root.broadcast_into(&mut buf[..]);
            Ok(buf)
        })
    }
}

impl MpiCollective {
    fn root(&self, root: usize) -> Result<mpi::topology::Rank> {
        if root >= self.size {
            return Err(Error::BadRoot { root, ranks: self.size }.into());
        }
        mpi::topology::Rank::try_from(root).map_err(|_| Error::BadRoot { root, ranks: self.size }.into())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn layouts_are_checked() {
        let (c, d, t) = layout(&[3, 0, 5], "x").unwrap();
        assert_eq!((c, d, t), (vec![3, 0, 5], vec![0, 3, 3], 8));
        assert!(layout(&[u64::from(u32::MAX), 1], "x").is_err());
        assert_eq!(split(&[1, 2, 3, 4], &[1, 0, 3]), vec![vec![1], vec![], vec![2, 3, 4]]);
    }
}
