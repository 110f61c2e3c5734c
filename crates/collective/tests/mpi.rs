//! `MpiCollective` across real processes: each test runs itself under `mpirun` (OpenMPI; `mpirun` must be on
//! the `PATH`, a missing one fails the test) and checks what every rank printed.
//!
//! Inside mpirun (`CKPT_MPI_CHILD` set) a test body is the rank's program; outside it is the launcher.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ckpt_collective::{Collective, MpiCollective, host_ranks};
use ckpt_io::{CommitError, DirCommit, DirOptions};

const CHILD: &str = "CKPT_MPI_CHILD";

struct Run {
    code: Option<i32>,
    out: String,
}

/// Runs this test binary's test `name` under `mpirun -np <np>`, killing it after `limit` (a hang fails).
fn mpirun(name: &str, np: usize, env: &[(&str, &str)], limit: Duration) -> Run {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", &np.to_string()])
        .arg(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start mpirun (install openmpi-bin): {e}"));
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            // SIGTERM lets mpirun take its ranks down with it.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(3));
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "mpirun -np {np} {name} hung: killed after {limit:?}\n{}{}",
                t_out.join().unwrap(),
                t_err.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = t_out.join().unwrap() + &t_err.join().unwrap();
    Run { code: status.code(), out }
}

fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

#[test]
fn collectives_across_processes() {
    if is_child() {
        let mpi = MpiCollective::init().unwrap();
        let (rank, size) = (mpi.rank(), mpi.world_size());
        assert_eq!(size, 4);
        for round in 0..50usize {
            // Lengths differ per rank, including empty contributions.
            let mine = vec![rank as u8; (rank * 7 + round) % 5];
            let all = mpi.all_gather(mine).unwrap();
            for (r, v) in all.iter().enumerate() {
                assert_eq!(v, &vec![r as u8; (r * 7 + round) % 5]);
            }
            let root = round % size;
            let g = mpi.gather(vec![rank as u8, round as u8], root).unwrap();
            match g {
                Some(g) => {
                    assert_eq!(rank, root);
                    assert_eq!(g, (0..size).map(|r| vec![r as u8, round as u8]).collect::<Vec<_>>());
                }
                None => assert_ne!(rank, root),
            }
            let b = mpi.broadcast(if rank == root { vec![9; round] } else { Vec::new() }, root).unwrap();
            assert_eq!(b, vec![9; round]);
            mpi.barrier().unwrap();
        }
        // One megabyte per rank.
        let big = mpi.all_gather(vec![rank as u8; 1 << 20]).unwrap();
        assert!(big.iter().enumerate().all(|(r, v)| v.len() == 1 << 20 && v.iter().all(|&b| b == r as u8)));
        assert!(mpi.broadcast(Vec::new(), 4).is_err());
        // Jobs of 5 and 3 ranks hosted by these 4 processes.
        for world in [5usize, 3] {
            let out = host_ranks(&mpi, world, |g| {
                let all = g.all_gather(vec![g.rank() as u8]).unwrap();
                (g.world_size(), all)
            })
            .unwrap();
            let expected: Vec<usize> = (rank..world).step_by(4).collect();
            assert_eq!(out.iter().map(|(r, _)| *r).collect::<Vec<_>>(), expected);
            for (_, (w, all)) in out {
                assert_eq!(w, world);
                assert_eq!(all, (0..world).map(|r| vec![r as u8]).collect::<Vec<_>>());
            }
        }
        println!("rank {rank}: collectives ok");
        return;
    }
    let run = mpirun("collectives_across_processes", 4, &[], Duration::from_secs(120));
    assert_eq!(run.code, Some(0), "{}", run.out);
    for r in 0..4 {
        assert!(run.out.contains(&format!("rank {r}: collectives ok")), "{}", run.out);
    }
}

/// A rank that fails to write makes every rank's commit return an error naming it; nobody hangs.
#[test]
fn failing_rank_fails_every_rank() {
    if is_child() {
        let mpi = MpiCollective::init().unwrap();
        let dir = std::env::var("CKPT_MPI_TEST_DIR").unwrap();
        let target = std::path::Path::new(&dir).join("ckpt");
        let commit = DirCommit::begin(&target, &mpi, &DirOptions::default()).unwrap();
        let own = if mpi.rank() == 2 {
            Err(ckpt_io::RankFailure::new("no space left on the device (injected)"))
        } else {
            let mut f = commit.create_file(&format!("part{}", mpi.rank())).unwrap();
            std::io::Write::write_all(f.writer(), b"data").unwrap();
            f.finish().map(|_| ()).map_err(ckpt_io::RankFailure::from)
        };
        match commit.commit(&mpi, own, |_| Ok(())) {
            Err(CommitError::RankFailed { rank, message }) => {
                println!("rank {}: failed because rank {rank} failed: {message}", mpi.rank());
            }
            other => println!("rank {}: unexpected {other:?}", mpi.rank()),
        }
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run = mpirun(
        "failing_rank_fails_every_rank",
        4,
        &[("CKPT_MPI_TEST_DIR", tmp.path().to_str().unwrap())],
        Duration::from_secs(120),
    );
    assert_eq!(run.code, Some(0), "{}", run.out);
    for r in 0..4 {
        let line = format!("rank {r}: failed because rank 2 failed: no space left on the device (injected)");
        assert!(run.out.contains(&line), "{line}\n{}", run.out);
    }
    assert!(!tmp.path().join("ckpt").exists(), "nothing is published");
    assert!(!tmp.path().join(".ckpt.ckpt-staging").exists(), "the staging directory is removed");
}

/// `abort` ends the whole job at once with the rank's message, even while the others wait in a barrier.
#[test]
fn abort_ends_the_job_with_the_message() {
    if is_child() {
        let mpi = MpiCollective::init().unwrap();
        if mpi.rank() == 1 {
            mpi.abort("the disk vanished (injected)");
        }
        let _ = mpi.barrier();
        println!("rank {}: passed the barrier", mpi.rank());
        return;
    }
    let run = mpirun("abort_ends_the_job_with_the_message", 3, &[], Duration::from_secs(60));
    assert_ne!(run.code, Some(0), "{}", run.out);
    assert!(run.out.contains("rank 1 aborts the MPI job: the disk vanished (injected)"), "{}", run.out);
    assert!(!run.out.contains("passed the barrier"), "{}", run.out);
}

/// With `CKPT_MPI_TIMEOUT`, a rank that never arrives makes the waiting ranks abort the job.
#[test]
fn watchdog_aborts_a_hung_job() {
    if is_child() {
        let mpi = MpiCollective::init().unwrap();
        if mpi.rank() == 0 {
            std::thread::sleep(Duration::from_secs(600)); // hangs; killed with the job
        }
        let _ = mpi.barrier();
        println!("rank {}: passed the barrier", mpi.rank());
        return;
    }
    let start = Instant::now();
    let run = mpirun("watchdog_aborts_a_hung_job", 3, &[("CKPT_MPI_TIMEOUT", "2")], Duration::from_secs(90));
    assert_ne!(run.code, Some(0), "{}", run.out);
    assert!(run.out.contains("aborts the MPI job: waited"), "{}", run.out);
    assert!(run.out.contains("another rank failed or hangs"), "{}", run.out);
    assert!(start.elapsed() < Duration::from_secs(60), "{:?}", start.elapsed());
}
