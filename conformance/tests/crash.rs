//! Crash safety of the durable commit path (issue 12 point 2, issue 15): a save in a child process is
//! killed at every failpoint of the protocol and at random instants, into a new destination and over an
//! existing checkpoint, for torch, safetensors and distcp (also with the three-rename fallback swap).
//! Afterwards the destination is the old checkpoint or the new one, whole, and the next save cleans up.
//! Plus two processes saving to one destination: the second gets the lock error, readers see the old one.

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
    let mut rows = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let dst = s.join("dst");
        let _ = std::fs::remove_dir_all(&s);
        std::fs::create_dir_all(&s).unwrap();
        crash::save("distcp", &dst, 1, m.mib).unwrap();
        let status = Command::new(child())
            .args(["distcp", dst.to_str().unwrap(), "2", "8"])
            .env("CKPT_COMMIT_NO_EXCHANGE", "1")
            .env("CKPT_FAILPOINT", (i + 1).to_string())
            .status()
            .unwrap();
        assert!(!status.success(), "#{} {p}", i + 1);
        let missing = std::fs::symlink_metadata(&dst).is_err();
        ckpt_core::commit::recover(&dst).unwrap();
        let found = crash::read_generation("distcp", &dst, m.mib, &[1, 2]);
        println!(
            "distcp-fallback overwrite #{} {p:20} destination missing before recovery: {missing}; after: {found:?}",
            i + 1
        );
        assert!(matches!(found, Ok(Some(1 | 2))), "#{} {p}: {found:?}", i + 1);
        assert_eq!(missing, p == "dir.half_swapped", "only the half-swapped window lacks a destination");
        assert!(crash::leftovers(&dst).is_empty(), "#{} {p}: {:?}", i + 1, crash::leftovers(&dst));
        rows.push(p.clone());
    }
    assert_eq!(rows.len(), points.len());
}

fn wait_stopped(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Field 3, after the parenthesised command name: T = stopped.
        if stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T')) {
            return;
        }
        assert!(Instant::now() < deadline, "the first writer never reached its pause point");
        std::thread::sleep(Duration::from_millis(20));
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
    wait_stopped(a.id());
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
    two_writers("torch", "file.synced", "m.pt");
    two_writers("safetensors", "file.write", "m.safetensors");
    two_writers("distcp", "dir.staged", "ck");
}

#[test]
fn checksum_manifest_catches_a_flipped_bit() {
    let scratch = tempfile::tempdir().unwrap();
    let dst = scratch.path().join("ck");
    crash::save("distcp", &dst, 1, 2).unwrap();
    let sums = ckpt_core::commit::Manifest::read(&dst).unwrap().unwrap();
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

/// Disk full (here: the file size limit, `EFBIG`, which the commit reports like `ENOSPC`): a specific error
/// naming the destination, the previous checkpoint intact, nothing left behind.
#[test]
fn disk_full_is_a_specific_error_and_loses_nothing() {
    for (format, name) in [("torch", "m.pt"), ("safetensors", "m.safetensors"), ("distcp", "ck")] {
        let scratch = tempfile::tempdir().unwrap();
        let dst = scratch.path().join(name);
        crash::save(format, &dst, 1, 4).unwrap();
        let out = Command::new(child())
            .args([format, dst.to_str().unwrap(), "2", "16"])
            .env("CKPT_TEST_FSIZE_LIMIT", (6u64 << 20).to_string())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{format}");
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(msg.contains("not enough space to save"), "{format}: {msg}");
        assert!(msg.contains(&dst.display().to_string()), "{format}: names the destination: {msg}");
        assert_eq!(crash::read_generation(format, &dst, 4, &[1]), Ok(Some(1)), "{format}");
        assert!(crash::leftovers(&dst).is_empty(), "{format}: {:?}", crash::leftovers(&dst));
    }
}
