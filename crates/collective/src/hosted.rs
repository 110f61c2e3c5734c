//! Running the ranks of a job of `W` ranks on the `K` processes of a smaller (or larger) group: process `p`
//! hosts ranks `p`, `p + K`, `p + 2K`, ... in threads, and the threads of all processes together form one
//! group of `W` ranks ([`host_ranks`]).
//!
//! This is how `mpirun -np 2 ckpt reshard SRC DST --world-size 4` writes a 4-rank checkpoint with two
//! processes: the format writers run once per rank of the 4-rank job, exactly as in one process with a
//! [`ThreadGroup`](crate::ThreadGroup), so the files are the same bytes.

use std::sync::Mutex;

use crate::group::{Collective, ThreadGroup};
use ckpt_tensor::Result;

use crate::error::Error;

/// Tag of an outer message: one collective operation of the hosted ranks.
const OP: u8 = 0;
/// Tag of an outer message: this process has finished (or hosts no rank).
const DONE: u8 = 1;

/// The ranks process `process` of `processes` hosts in a job of `world` ranks: `process`,
/// `process + processes`, ... (round-robin, so every process hosts `world / processes` ranks or one more).
///
/// ```
/// assert_eq!(ckpt_collective::hosted_ranks(1, 2, 5), [1, 3]);
/// assert_eq!(ckpt_collective::hosted_ranks(3, 4, 2), Vec::<usize>::new());
/// ```
pub fn hosted_ranks(process: usize, processes: usize, world: usize) -> Vec<usize> {
    if processes == 0 {
        return Vec::new();
    }
    (process..world).step_by(processes).collect()
}

/// Runs `f` once for every rank of a job of `world` ranks that this process hosts ([`hosted_ranks`] of
/// `outer`'s rank and size), each in its own thread with a [`Collective`] of `world` ranks spanning every
/// process of `outer`. Returns each hosted rank with its result, in rank order.
///
/// Every process of `outer` must call it (with the same `world`); a process that hosts no rank takes part
/// in the exchanges until the others are done. `f` must run the same collective operations on every rank
/// (as any multi-rank writer does). With [`SingleProcess`](crate::SingleProcess) as `outer` this is a
/// [`ThreadGroup`] of `world` threads.
///
/// ```
/// use ckpt_collective::{Collective, SingleProcess, host_ranks};
/// let out = host_ranks(&SingleProcess, 3, |g| g.all_gather(vec![g.rank() as u8]).unwrap()).unwrap();
/// assert_eq!(out.len(), 3);
/// assert_eq!(out[2], (2, vec![vec![0], vec![1], vec![2]]));
/// ```
///
/// # Errors
/// [`Error::NoRanks`] for a `world` of 0, [`Error::RankPanicked`] for a panicking rank (the process's other ranks are then
/// released with errors; the other processes are not: under MPI, abort the job); errors of `outer`.
pub fn host_ranks<R, F>(outer: &dyn Collective, world: usize, f: F) -> Result<Vec<(usize, R)>>
where
    R: Send,
    F: Fn(&dyn Collective) -> R + Sync,
{
    if world == 0 {
        return Err(Error::NoRanks.into());
    }
    let (process, processes) = (outer.rank(), outer.world_size());
    let mine = hosted_ranks(process, processes, world);
    if mine.is_empty() {
        // Take part in every exchange of the others until they are done.
        loop {
            let round = outer.all_gather(vec![DONE])?;
            if round.iter().all(|m| m.first() == Some(&DONE)) {
                return Ok(Vec::new());
            }
        }
    }
    let locals = ThreadGroup::new(mine.len());
    let failed = Mutex::new(None);
    let results: Vec<Option<(usize, R)>> = std::thread::scope(|s| {
        let handles: Vec<_> = locals
            .into_iter()
            .zip(&mine)
            .map(|(local, &rank)| {
                let (f, failed) = (&f, &failed);
                s.spawn(move || {
                    let member = HostedRank { rank, world, processes, local, outer };
                    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&member))) {
                        Ok(r) => Some((rank, r)),
                        Err(_) => {
                            if let Ok(mut m) = failed.lock() {
                                m.get_or_insert(rank);
                            }
                            member.local.abort();
                            None
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().ok().flatten()).collect()
    });
    if let Some(rank) = failed.lock().ok().and_then(|m| *m) {
        return Err(Error::RankPanicked { rank, world }.into());
    }
    // Release the processes that host no rank: one last round, every process says it is done.
    if processes > world {
        outer.all_gather(vec![DONE])?;
    }
    Ok(results.into_iter().flatten().collect())
}

/// One rank of a job of `world` ranks hosted by a process of an outer group ([`host_ranks`]).
struct HostedRank<'o> {
    rank: usize,
    world: usize,
    processes: usize,
    local: ThreadGroup,
    outer: &'o dyn Collective,
}

impl Collective for HostedRank<'_> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_gather(&self, data: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        // The process's ranks meet first; its lowest rank exchanges their contributions with the other
        // processes and hands the whole round to the others.
        let local = self.local.all_gather(data)?;
        let whole = if self.local.rank() == 0 {
            let mut msg = vec![OP];
            encode(&local, &mut msg);
            let rounds = self.outer.all_gather(msg)?;
            let mut all = vec![Vec::new(); self.world];
            for (process, m) in rounds.iter().enumerate() {
                match m.split_first() {
                    Some((&OP, body)) => {
                        for (i, part) in decode(body)?.into_iter().enumerate() {
                            let rank = process + i * self.processes;
                            match all.get_mut(rank) {
                                Some(slot) => *slot = part,
                                None => return Err(malformed(process)),
                            }
                        }
                    }
                    Some((&DONE, _)) if hosted_ranks(process, self.processes, self.world).is_empty() => {}
                    _ => return Err(malformed(process)),
                }
            }
            let mut bytes = Vec::new();
            encode(&all, &mut bytes);
            bytes
        } else {
            Vec::new()
        };
        decode(&self.local.broadcast(whole, 0)?)
    }
}

fn malformed(process: usize) -> ckpt_tensor::Error {
    Error::OutOfStep { process }.into()
}

fn encode(parts: &[Vec<u8>], out: &mut Vec<u8>) {
    out.extend_from_slice(&(parts.len() as u64).to_le_bytes());
    for p in parts {
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
        out.extend_from_slice(p);
    }
}

fn decode(mut bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
    let bad = || ckpt_tensor::Error::from(Error::TruncatedMessage);
    let take = |n: usize, bytes: &mut &[u8]| -> Result<Vec<u8>> {
        if bytes.len() < n {
            return Err(bad());
        }
        let (head, rest) = bytes.split_at(n);
        *bytes = rest;
        Ok(head.to_vec())
    };
    let word = |v: Vec<u8>| -> Result<usize> {
        let arr: [u8; 8] = v.try_into().map_err(|_| bad())?;
        usize::try_from(u64::from_le_bytes(arr)).map_err(|_| bad())
    };
    let count = word(take(8, &mut bytes)?)?;
    if count > bytes.len() / 8 + 1 {
        return Err(bad());
    }
    let mut parts = Vec::with_capacity(count);
    for _ in 0..count {
        let len = word(take(8, &mut bytes)?)?;
        parts.push(take(len, &mut bytes)?);
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    /// Every hosting of a 5-rank job (1 to 7 processes, threads standing in for processes) sees the same
    /// exchanges as 5 ranks of one group.
    #[test]
    fn processes_host_a_job() {
        for processes in 1..=7 {
            let outer = ThreadGroup::new(processes);
            let results: Vec<Vec<(usize, Vec<Vec<u8>>)>> = std::thread::scope(|s| {
                let hs: Vec<_> = outer
                    .into_iter()
                    .map(|o| {
                        s.spawn(move || {
                            host_ranks(&o, 5, |g| {
                                let mut last = Vec::new();
                                for round in 0..20u8 {
                                    last = g.all_gather(vec![g.rank() as u8; usize::from(round % 3)]).unwrap();
                                    let b = g.broadcast(vec![round, g.rank() as u8], 3).unwrap();
                                    assert_eq!(b, vec![round, 3]);
                                    let got = g.gather(vec![1], 0).unwrap();
                                    assert_eq!(got.is_some(), g.rank() == 0);
                                }
                                last
                            })
                            .unwrap()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let mut ranks: Vec<usize> = results.iter().flatten().map(|(r, _)| *r).collect();
            ranks.sort_unstable();
            assert_eq!(ranks, [0, 1, 2, 3, 4], "{processes} processes");
            for (_, last) in results.iter().flatten() {
                assert_eq!(last, &(0..5u8).map(|r| vec![r; 1]).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn truncated_messages_and_bad_worlds_are_errors() {
        assert!(decode(&[1, 0]).is_err());
        assert!(decode(&[1, 0, 0, 0, 0, 0, 0, 0, 9]).is_err());
        let mut m = Vec::new();
        encode(&[vec![1, 2], vec![]], &mut m);
        assert_eq!(decode(&m).unwrap(), vec![vec![1, 2], vec![]]);
        assert!(host_ranks(&crate::SingleProcess, 0, |_| ()).is_err());
        let e = host_ranks(&crate::SingleProcess, 2, |g| {
            if g.rank() == 1 {
                panic!("injected");
            }
            g.barrier()
        });
        assert!(e.unwrap_err().to_string().contains("rank 1 of 2 panicked"));
    }
}
