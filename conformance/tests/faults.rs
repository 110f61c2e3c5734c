//! Fault injection (issue 12 point 3), in every format the crash harness writes: each fault gets a specific
//! error naming what failed, and the previous checkpoint stays whole.
//!
//! - disk full: the file size limit (`RLIMIT_FSIZE`, `EFBIG`), which the commit reports like `ENOSPC`;
//! - a read-only destination directory, and a permission error on one part of a multi-file checkpoint:
//!   in a child running as uid 65534 (the tests run as root, which file permissions do not stop);
//! - a file truncated after a save; a file removed while a reader has the checkpoint open.
//!
//! A flipped bit is the integrity tests' (`crash.rs`, the facade's `integrity.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ckpt_conformance::crash;

const NOBODY: &str = "65534";

fn child() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_crash_child"));
    c.env_remove("CKPT_FAILPOINT").env_remove("CKPT_FAILPOINT_LOG").env_remove("CKPT_FAILPOINT_ACTION");
    c
}

fn run(format: &str, dst: &Path, generation: u32, mib: usize, env: &[(&str, &str)]) -> Output {
    let mut c = child();
    c.arg(format).arg(dst).arg(generation.to_string()).arg(mib.to_string());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// The name each format's checkpoint gets.
fn dst_name(format: &str) -> &'static str {
    match format {
        "torch" => "m.pt",
        "safetensors" => "m.safetensors",
        _ => "ck",
    }
}

/// A scratch directory every user may enter (the tests run as root; the children may not).
fn open_scratch() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn chmod_all(path: &Path, file: u32, dir: u32) {
    let m = fs::symlink_metadata(path).unwrap();
    if m.is_dir() {
        for e in fs::read_dir(path).unwrap() {
            chmod_all(&e.unwrap().path(), file, dir);
        }
        fs::set_permissions(path, fs::Permissions::from_mode(dir)).unwrap();
    } else {
        fs::set_permissions(path, fs::Permissions::from_mode(file)).unwrap();
    }
}

#[test]
fn disk_full_is_a_specific_error_in_every_format_and_loses_nothing() {
    for &format in crash::FORMATS {
        let scratch = open_scratch();
        let dst = scratch.path().join(dst_name(format));
        crash::save(format, &dst, 1, 4).unwrap();
        let out = run(format, &dst, 2, 16, &[("CKPT_TEST_FSIZE_LIMIT", &(6u64 << 20).to_string())]);
        assert!(!out.status.success(), "{format}");
        let msg = String::from_utf8_lossy(&out.stderr);
        // The commit's DiskFull; libhdf5 (pbg) reports the failed write with the OS error (EFBIG).
        let specific = msg.contains("not enough space to save") || (format == "pbg" && msg.contains("File too large"));
        assert!(specific, "{format}: {msg}");
        assert!(msg.contains(&dst.display().to_string()), "{format}: names the destination: {msg}");
        assert_eq!(crash::read_generation(format, &dst, 4, &[1]), Ok(Some(1)), "{format}");
        assert!(crash::leftovers(&dst).is_empty(), "{format}: {:?}", crash::leftovers(&dst));
    }
}

#[test]
fn a_read_only_destination_directory_is_a_permission_error_and_loses_nothing() {
    for &format in crash::FORMATS {
        let scratch = open_scratch();
        let parent = scratch.path().join("ro");
        fs::create_dir(&parent).unwrap();
        let dst = parent.join(dst_name(format));
        crash::save(format, &dst, 1, 1).unwrap();
        // Readable by everyone, writable by no one but root.
        chmod_all(&parent, 0o444, 0o555);
        let out = run(format, &dst, 2, 1, &[("CKPT_TEST_UID", NOBODY)]);
        chmod_all(&parent, 0o644, 0o755);
        assert!(!out.status.success(), "{format}");
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(msg.contains("permission denied"), "{format}: {msg}");
        assert!(msg.contains(&dst.display().to_string()), "{format}: names the destination: {msg}");
        assert_eq!(crash::read_generation(format, &dst, 1, &[1]), Ok(Some(1)), "{format}");
        assert!(crash::leftovers(&dst).is_empty(), "{format}: {:?}", crash::leftovers(&dst));
    }
}

/// One file of each multi-file format that holds tensor data.
fn one_part(format: &str, dst: &Path) -> PathBuf {
    let mut names: Vec<String> =
        fs::read_dir(dst).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    let pick = |pred: &dyn Fn(&str) -> bool| dst.join(names.iter().find(|n| pred(n)).unwrap());
    match format {
        "distcp" => pick(&|n| n.ends_with(".distcp")),
        "hfai" => pick(&|n| n == "PART_001.pt"),
        "recis" => pick(&|n| n.ends_with(".safetensors")),
        "pbg" => pick(&|n| n.starts_with("embeddings_user")),
        other => panic!("{other} is one file"),
    }
}

const MULTI_FILE: &[&str] = &["distcp", "hfai", "recis", "pbg"];

#[test]
fn a_permission_error_on_one_part_names_that_part() {
    for &format in MULTI_FILE {
        let scratch = open_scratch();
        let dst = scratch.path().join(dst_name(format));
        crash::save(format, &dst, 1, 1).unwrap();
        chmod_all(&dst, 0o644, 0o755);
        let part = one_part(format, &dst);
        fs::set_permissions(&part, fs::Permissions::from_mode(0o000)).unwrap();
        let out = run(&format!("read:{format}"), &dst, 1, 1, &[("CKPT_TEST_UID", NOBODY)]);
        assert!(!out.status.success(), "{format}: {}", String::from_utf8_lossy(&out.stdout));
        let msg = String::from_utf8_lossy(&out.stderr);
        let name = part.file_name().unwrap().to_string_lossy().into_owned();
        assert!(msg.contains(&name), "{format}: names {name}: {msg}");
        assert!(msg.to_lowercase().contains("permission denied"), "{format}: {msg}");
        // Readable again, the checkpoint is whole.
        fs::set_permissions(&part, fs::Permissions::from_mode(0o644)).unwrap();
        let out = run(&format!("read:{format}"), &dst, 1, 1, &[("CKPT_TEST_UID", NOBODY)]);
        assert!(out.status.success(), "{format}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn a_file_truncated_after_a_save_is_a_specific_error() {
    for &format in crash::FORMATS {
        let scratch = open_scratch();
        let dst = scratch.path().join(dst_name(format));
        crash::save(format, &dst, 1, 1).unwrap();
        let file = if MULTI_FILE.contains(&format) { one_part(format, &dst) } else { dst.clone() };
        let len = fs::metadata(&file).unwrap().len();
        fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(len / 2).unwrap();
        let e = crash::read_generation(format, &dst, 1, &[1]).unwrap_err();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        assert!(e.contains(&name), "{format}: names {name}: {e}");
        assert!(!e.contains("a mix"), "{format}: a specific error, not a wrong value: {e}");
        println!("{format}: truncated {name}: {e}");
    }
}

/// Removing a data file under an open `DcpReader`: files it already opened stay readable (the kernel
/// keeps them), a file it had not opened is `MissingFile`, naming the file and the entry.
#[test]
fn a_file_removed_while_being_read_is_a_specific_error() {
    let scratch = open_scratch();
    let dst = scratch.path().join("ck");
    crash::save("distcp", &dst, 1, 1).unwrap();
    let reader = ckpt_distcp::DcpReader::open(&dst).unwrap();
    let small = reader.read_tensor("small").unwrap();
    // Remove every data file: the one `small` came from is open already, the others are not.
    for e in fs::read_dir(&dst).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "distcp") {
            fs::remove_file(p).unwrap();
        }
    }
    assert_eq!(reader.read_tensor("small").unwrap(), small, "an open file stays readable");
    let e = reader.read_tensor("big").unwrap_err();
    assert!(matches!(e, ckpt_distcp::Error::MissingFile { .. }), "{e}");
    assert!(e.to_string().contains(".distcp") && e.to_string().contains("big"), "{e}");
}
