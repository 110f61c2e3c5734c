//! Collective operations between the ranks of a multi-rank writer, as a trait: one process, threads in
//! tests, or MPI across machines all implement it.

use std::sync::{Arc, Condvar, Mutex};

use ckpt_tensor::Result;

use crate::error::Error;

/// What multi-rank readers and writers need from a process group.
///
/// Every rank calls the same operations in the same order (as with `torch.distributed`); the operations
/// block until all ranks arrive.
pub trait Collective: Send + Sync {
    /// This rank, `0..world_size()`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Blocks until every rank has called `barrier`.
    ///
    /// # Errors
    /// If the group is broken (a rank failed).
    fn barrier(&self) -> Result<()> {
        self.all_gather(Vec::new()).map(|_| ())
    }
    /// Every rank contributes bytes; every rank receives all contributions in rank order.
    ///
    /// # Errors
    /// If the group is broken.
    fn all_gather(&self, data: Vec<u8>) -> Result<Vec<Vec<u8>>>;
    /// Like [`Collective::all_gather`], but only `root` receives the contributions.
    ///
    /// # Errors
    /// If the group is broken.
    fn gather(&self, data: Vec<u8>, root: usize) -> Result<Option<Vec<Vec<u8>>>> {
        let all = self.all_gather(data)?;
        Ok((self.rank() == root).then_some(all))
    }
    /// `root`'s bytes, delivered to every rank (others pass anything, ignored).
    ///
    /// # Errors
    /// If the group is broken or `root` is not a rank.
    fn broadcast(&self, data: Vec<u8>, root: usize) -> Result<Vec<u8>> {
        let payload = if self.rank() == root { data } else { Vec::new() };
        let mut all = self.all_gather(payload)?;
        if root >= all.len() {
            return Err(Error::BadRoot { root, ranks: all.len() }.into());
        }
        Ok(all.swap_remove(root))
    }
}

/// A borrowed group is a group: a generic `&C` (even `C = dyn Collective`) passes where the commit takes
/// `&dyn Collective`.
impl<C: Collective + ?Sized> Collective for &C {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn world_size(&self) -> usize {
        (**self).world_size()
    }
    fn barrier(&self) -> Result<()> {
        (**self).barrier()
    }
    fn all_gather(&self, data: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        (**self).all_gather(data)
    }
    fn gather(&self, data: Vec<u8>, root: usize) -> Result<Option<Vec<Vec<u8>>>> {
        (**self).gather(data, root)
    }
    fn broadcast(&self, data: Vec<u8>, root: usize) -> Result<Vec<u8>> {
        (**self).broadcast(data, root)
    }
}

/// The group of one: rank 0 of 1.
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleProcess;

impl Collective for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_gather(&self, data: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        Ok(vec![data])
    }
}

#[derive(Default)]
struct Round {
    generation: u64,
    slots: Vec<Option<Vec<u8>>>,
    arrived: usize,
    result: Option<Arc<Vec<Vec<u8>>>>,
    departed: usize,
    poisoned: bool,
}

struct Shared {
    world: usize,
    round: Mutex<Round>,
    cv: Condvar,
}

/// One rank of a group of threads in one process (for tests, and for writing N ranks' files from one
/// process in parallel).
///
/// ```
/// use ckpt_collective::{Collective, ThreadGroup};
/// let ranks = ThreadGroup::new(3);
/// let handles: Vec<_> = ranks
///     .into_iter()
///     .map(|r| std::thread::spawn(move || r.all_gather(vec![r.rank() as u8]).unwrap()))
///     .collect();
/// for h in handles {
///     assert_eq!(h.join().unwrap(), vec![vec![0], vec![1], vec![2]]);
/// }
/// ```
pub struct ThreadGroup {
    rank: usize,
    shared: Arc<Shared>,
}

impl ThreadGroup {
    /// `world_size` connected ranks; hand one to each thread.
    pub fn new(world_size: usize) -> Vec<ThreadGroup> {
        let shared = Arc::new(Shared {
            world: world_size,
            round: Mutex::new(Round { slots: vec![None; world_size], ..Round::default() }),
            cv: Condvar::new(),
        });
        (0..world_size).map(|rank| ThreadGroup { rank, shared: Arc::clone(&shared) }).collect()
    }

    /// Marks the group broken: every rank blocked in (or later entering) a collective gets an error. Call it
    /// when a rank fails, so the others do not wait forever.
    pub fn abort(&self) {
        if let Ok(mut r) = self.shared.round.lock() {
            r.poisoned = true;
        }
        self.shared.cv.notify_all();
    }
}

fn broken() -> ckpt_tensor::Error {
    Error::Aborted.into()
}

impl Collective for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn all_gather(&self, data: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        let sh = &self.shared;
        let mut r = sh.round.lock().map_err(|_| broken())?;
        // Wait until the previous round has been fully collected.
        while r.result.is_some() && !r.poisoned {
            r = sh.cv.wait(r).map_err(|_| broken())?;
        }
        if r.poisoned {
            return Err(broken());
        }
        let my_generation = r.generation;
        if let Some(slot) = r.slots.get_mut(self.rank) {
            *slot = Some(data);
        }
        r.arrived += 1;
        if r.arrived == sh.world {
            let all: Vec<Vec<u8>> = r.slots.iter_mut().map(|s| s.take().unwrap_or_default()).collect();
            r.result = Some(Arc::new(all));
            r.arrived = 0;
            sh.cv.notify_all();
        } else {
            while (r.result.is_none() || r.generation != my_generation) && !r.poisoned {
                r = sh.cv.wait(r).map_err(|_| broken())?;
            }
            if r.poisoned {
                return Err(broken());
            }
        }
        let out = r.result.as_ref().map(|a| a.as_ref().clone()).unwrap_or_default();
        r.departed += 1;
        if r.departed == sh.world {
            r.departed = 0;
            r.result = None;
            r.generation += 1;
            sh.cv.notify_all();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Every operation of a borrowed group, even of an unsized `dyn Collective`, reaches the group itself.
    #[test]
    fn borrowed_group_forwards_every_operation() {
        fn as_dyn<C: Collective + ?Sized>(c: &C) -> Vec<Vec<u8>> {
            let borrowed: &dyn Collective = &c;
            assert_eq!((borrowed.rank(), borrowed.world_size()), (c.rank(), c.world_size()));
            borrowed.barrier().unwrap();
            let root = borrowed.broadcast(vec![b'r', c.rank() as u8], 1).unwrap();
            assert_eq!(root, vec![b'r', 1]);
            let gathered = borrowed.gather(vec![c.rank() as u8], 0).unwrap();
            assert_eq!(gathered.is_some(), c.rank() == 0);
            borrowed.all_gather(vec![c.rank() as u8 * 10]).unwrap()
        }
        let handles: Vec<_> = ThreadGroup::new(3)
            .into_iter()
            .map(|g| {
                std::thread::spawn(move || {
                    let unsized_group: &dyn Collective = &g;
                    as_dyn(unsized_group)
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), vec![vec![0], vec![10], vec![20]]);
        }
    }

    #[test]
    fn many_rounds() {
        let handles: Vec<_> = ThreadGroup::new(4)
            .into_iter()
            .map(|g| {
                std::thread::spawn(move || {
                    for round in 0..200u8 {
                        let all = g.all_gather(vec![g.rank() as u8, round]).unwrap();
                        assert_eq!(all.len(), 4);
                        for (i, v) in all.iter().enumerate() {
                            assert_eq!(v, &vec![i as u8, round]);
                        }
                        g.barrier().unwrap();
                        let b = g.broadcast(vec![round; 3], 2).unwrap();
                        assert_eq!(b, vec![round; 3]);
                        let gathered = g.gather(vec![1], 0).unwrap();
                        assert_eq!(gathered.is_some(), g.rank() == 0);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn abort_unblocks() {
        let mut ranks = ThreadGroup::new(2);
        let r1 = ranks.pop().unwrap();
        let r0 = ranks.pop().unwrap();
        let h = std::thread::spawn(move || r0.barrier());
        std::thread::sleep(std::time::Duration::from_millis(20));
        r1.abort();
        assert!(h.join().unwrap().is_err());
        assert!(r1.barrier().is_err());
        assert_eq!(SingleProcess.all_gather(vec![5]).unwrap(), vec![vec![5]]);
    }
}
