//! Crash safety of the durable commit path (issue 12 point 2, issue 15): a save in a child process is
//! killed at every failpoint of the protocol and at random instants, into a new destination and over an
//! existing checkpoint, for torch, safetensors and distcp (also with the three-rename fallback swap).
//! Afterwards the destination is the old checkpoint or the new one, whole, and the next save cleans up.
//! Plus two processes saving to one destination: the second gets the lock error, readers see the old one;
//! and a reader opened before a swap never mixes generations. Fault injection is in `faults.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use ckpt_conformance::crash::{self, Matrix, Row};

fn child() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_crash_child"))
}

fn seed() -> u64 {
    let s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("timed-kill seed {s}");
    s
}

fn check(rows: &[Row]) {
    let mut bad = Vec::new();
    for r in rows {
        let ok = crash::row_ok(r);
        println!(
            "{:12} {:9} {:28} {:10} found {:8} cleaned {} {}",
            r.format,
            r.mode,
            r.kill,
            format!("{:?}", r.ended),
            format!("{:?}", r.found),
            r.cleaned,
            if ok { "ok" } else { "FAIL" }
        );
        if !ok {
            bad.push(format!("{} {} {}", r.format, r.mode, r.kill));
        }
    }
    assert!(bad.is_empty(), "crash matrix failures: {bad:?}");
    // Every failpoint kill really killed the child (the points were counted on an identical save).
    assert!(rows.iter().filter(|r| r.kill.starts_with('#')).all(|r| r.ended == crash::Ended::Killed));
}

fn matrix(format: &str, env: &[(&str, &str)]) {
    let scratch = tempfile::tempdir().unwrap();
    let m = Matrix {
        child: child(),
        format: format.into(),
        mib: 24,
        timed_kills: 6,
        env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
    };
    let rows = m.run(&scratch.path().join("s"), seed());
    assert!(rows.len() > 20, "{format}: only {} kills", rows.len());
    check(&rows);
}

#[test]
fn torch_survives_every_kill() {
    matrix("torch", &[]);
}

#[test]
fn safetensors_survives_every_kill() {
    matrix("safetensors", &[]);
}

#[test]
fn distcp_survives_every_kill() {
    matrix("distcp", &[]);
}

#[test]
fn hfai_survives_every_kill() {
    matrix("hfai", &[]);
}

#[test]
fn recis_survives_every_kill() {
    matrix("recis", &[]);
}

/// New: `ckpt_pbg::save` staged and swapped in whole; overwrite: a PBG commit of the next version, whose
/// version file is the commit point.
#[test]
fn pbg_survives_every_kill() {
    matrix("pbg", &[]);
}

/// Without `RENAME_EXCHANGE` a kill between the two renames leaves no destination for a moment; the next
/// save's recovery (what `row.cleaned` runs) rolls it forward, so the check runs after `recover`.
#[test]
fn distcp_fallback_swap_recovers_every_kill() {
    let scratch = tempfile::tempdir().unwrap();
    let m = Matrix {
        child: child(),
        format: "distcp".into(),
        mib: 8,
        timed_kills: 2,
        env: vec![("CKPT_COMMIT_NO_EXCHANGE".into(), "1".into())],
    };
    let s = scratch.path().join("s");
    let (points, _) = m.points(&s, true);
    assert!(points.iter().any(|p| p == "dir.half_swapped"), "{points:?}");
    let rows = crash::concurrently(points.len(), |i| {
        let p = &points[i];
        let case_dir = s.join(format!("kill{}", i + 1));
        let dst = case_dir.join("dst");
        std::fs::create_dir_all(&case_dir).unwrap();
        crash::save("distcp", &dst, 1, m.mib).unwrap();
        let status = Command::new(child())
            .args(["distcp", dst.to_str().unwrap(), "2", "8"])
            .env("CKPT_COMMIT_NO_EXCHANGE", "1")
            .env("CKPT_FAILPOINT", (i + 1).to_string())
            .status()
            .unwrap();
        assert!(!status.success(), "#{} {p}", i + 1);
        let missing = std::fs::symlink_metadata(&dst).is_err();
        ckpt_io::recover(&dst).unwrap();
        let found = crash::read_generation("distcp", &dst, m.mib, &[1, 2]);
        println!(
            "distcp-fallback overwrite #{} {p:20} destination missing before recovery: {missing}; after: {found:?}",
            i + 1
        );
        assert!(matches!(found, Ok(Some(1 | 2))), "#{} {p}: {found:?}", i + 1);
        assert_eq!(missing, p == "dir.half_swapped", "only the half-swapped window lacks a destination");
        assert!(crash::leftovers(&dst).is_empty(), "#{} {p}: {:?}", i + 1, crash::leftovers(&dst));
        std::fs::remove_dir_all(&case_dir).unwrap();
        p.clone()
    });
    assert_eq!(rows.len(), points.len());
}

/// Waits until every thread of `pid` is stopped (`T` in `/proc/<pid>/task/<tid>/stat`): the failpoint's
/// `stop` action sends `SIGSTOP` to the thread that hit it, which stops the whole process from there. No
/// sleep decides anything: the writer is known to be paused at its failpoint, holding the lock, before the
/// second writer and the reader run (a writer that ends instead of pausing fails the test at once).
fn wait_stopped(child: &mut std::process::Child) {
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let tasks: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path().join("stat")).collect::<Vec<_>>())
            .unwrap_or_default()
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect();
        // Field 3, after the parenthesised command name: T = stopped.
        let stopped = |stat: &String| stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'));
        if !tasks.is_empty() && tasks.iter().all(stopped) {
            return;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the first writer ended ({status}) instead of pausing at its failpoint");
        }
        assert!(Instant::now() < deadline, "the first writer never reached its pause point");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn two_writers(format: &str, pause_at: &str, dst_name: &str) {
    let scratch = tempfile::tempdir().unwrap();
    let dst = scratch.path().join(dst_name);
    crash::save(format, &dst, 1, 4).unwrap();
    // Writer A pauses half-way (SIGSTOP at a failpoint), holding the lock.
    let mut a = Command::new(child())
        .args([format, dst.to_str().unwrap(), "2", "4"])
        .env("CKPT_FAILPOINT", pause_at)
        .env("CKPT_FAILPOINT_ACTION", "stop")
        .spawn()
        .unwrap();
    wait_stopped(&mut a);
    // Writer B, another process, gets the lock error naming the destination and A.
    let b = Command::new(child()).args([format, dst.to_str().unwrap(), "3", "4"]).output().unwrap();
    assert!(!b.status.success());
    let msg = String::from_utf8_lossy(&b.stderr);
    assert!(msg.contains("another save to this destination is in progress"), "{msg}");
    assert!(msg.contains(&dst.display().to_string()), "{msg}");
    assert!(msg.contains(&format!("pid {}", a.id())), "names the holder: {msg}");
    // A reader of the checkpoint being written sees the old one.
    assert_eq!(crash::read_generation(format, &dst, 4, &[1, 2, 3]), Ok(Some(1)));
    // A goes on and commits; then B can save.
    assert_eq!(unsafe { libc::kill(a.id() as i32, libc::SIGCONT) }, 0);
    assert!(a.wait().unwrap().success());
    assert_eq!(crash::read_generation(format, &dst, 4, &[1, 2, 3]), Ok(Some(2)));
    let b = Command::new(child()).args([format, dst.to_str().unwrap(), "3", "4"]).status().unwrap();
    assert!(b.success());
    assert_eq!(crash::read_generation(format, &dst, 4, &[3]), Ok(Some(3)));
    assert!(crash::leftovers(&dst).is_empty(), "{:?}", crash::leftovers(&dst));
}

#[test]
fn second_writer_gets_the_lock_error_and_readers_see_the_old_checkpoint() {
    let cases = [
        ("torch", "file.synced", "m.pt"),
        ("safetensors", "file.write", "m.safetensors"),
        ("distcp", "dir.staged", "ck"),
        ("hfai", "dir.staged", "ck"),
        ("recis", "dir.staged", "ck"),
        ("pbg", "pbg.written", "ck"),
    ];
    crash::concurrently(cases.len(), |i| two_writers(cases[i].0, cases[i].1, cases[i].2));
}

#[test]
fn checksum_manifest_catches_a_flipped_bit() {
    let scratch = tempfile::tempdir().unwrap();
    let dst = scratch.path().join("ck");
    crash::save("distcp", &dst, 1, 2).unwrap();
    let sums = ckpt_io::Manifest::read(&dst).unwrap().unwrap();
    assert!(sums.verify_dir(&dst).unwrap().is_empty());
    let f = dst.join("__1_0.distcp");
    let mut bytes = std::fs::read(&f).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(&f, &bytes).unwrap();
    let bad = sums.verify_dir(&dst).unwrap();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].to_string().starts_with("__1_0.distcp: bytes "), "{}", bad[0]);
}

/// A reader opened before a commit swaps a new checkpoint in reads the one it opened, or fails on files
/// that went with it: never a mix of two generations. `DcpReader` opens its data files lazily, by the paths
/// `.metadata` gives, in the directory it pinned when it opened.
#[test]
fn a_reader_never_mixes_generations_across_a_swap() {
    let scratch = tempfile::tempdir().unwrap();
    let dst = scratch.path().join("ck");
    crash::save("distcp", &dst, 1, 2).unwrap();
    let reader = ckpt_distcp::DcpReader::open(&dst).unwrap();
    // One data file opened (mapped) before the swap.
    let small = reader.read_tensor("small").unwrap();
    assert_eq!(small, crash::tensors(1, 2)[1].1);
    crash::save("distcp", &dst, 2, 2).unwrap();
    ckpt_io::wait_for_releases();
    // The new checkpoint is whole for a new reader.
    assert_eq!(crash::read_generation("distcp", &dst, 2, &[1, 2]), Ok(Some(2)));
    // The old reader: generation 1, or the files it had not opened are missing (the old directory is
    // gone), never generation 2's data under generation 1's metadata.
    match reader.state_dict() {
        Ok(v) => assert!(v == crash::state_dict(1, 2), "a mix of generations"),
        Err(e) => assert!(e.to_string().contains("__"), "names the missing data file: {e}"),
    }
    assert_eq!(reader.read_tensor("small").unwrap(), crash::tensors(1, 2)[1].1, "files already open stay readable");
}

/// Readers racing saves that swap generations 1 and 2 in and out of one path: every read is one whole
/// generation, or an error (a file of the generation the reader opened is gone), never a mix. hfai and
/// RecIS readers open their files by path and read again when the directory was swapped meanwhile; the DCP
/// reader reads in the directory it pinned.
#[test]
fn readers_racing_saves_never_mix_generations() {
    for format in ["hfai", "recis", "distcp"] {
        let scratch = tempfile::tempdir().unwrap();
        let dst = scratch.path().join("ck");
        crash::save(format, &dst, 1, 1).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        let (mut whole, mut errors) = (0, 0);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..12u32 {
                    crash::save(format, &dst, 1 + i % 2, 1).unwrap();
                }
                done.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                match crash::reader_generation(format, &dst, 1, &[1, 2]) {
                    Ok(Some(_)) => whole += 1,
                    Ok(None) => panic!("{format}: a reader saw a mix of generations"),
                    Err(e) => {
                        assert!(!e.contains("a mix"), "{format}: {e}");
                        errors += 1;
                    }
                }
            }
        });
        println!("{format}: {whole} whole reads, {errors} reads failed cleanly while saves swapped");
        assert!(whole > 0, "{format}: no read completed");
    }
}
