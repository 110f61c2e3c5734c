//! `ckpt::open` detects and reads every golden fixture of every format, and every entry it lists reads
//! back with the dtype and shape it announced.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use ckpt::{EntryKind, Format};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance/fixtures")
}

/// Subdirectories (or files with `ext`) of `dir`, sorted.
fn children(dir: &Path, ext: Option<&str>) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| match ext {
            Some(x) => p.extension().is_some_and(|e| e == x),
            None => p.is_dir(),
        })
        .collect();
    v.sort();
    v
}

fn check(path: &Path, want: Format) -> usize {
    let detected = ckpt::detect(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(detected, want, "{}", path.display());
    let ck = ckpt::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(ck.format(), want);
    let entries = ck.entries();
    assert!(!entries.is_empty(), "{}: no entries", path.display());
    let mut tensors = 0;
    for e in &entries {
        match &e.kind {
            EntryKind::Tensor(info) => {
                let t = ck.tensor(&e.name).unwrap_or_else(|err| panic!("{} {}: {err}", path.display(), e.name));
                assert_eq!(
                    (t.dtype(), t.shape()),
                    (info.dtype, info.shape.as_slice()),
                    "{} {}",
                    path.display(),
                    e.name
                );
                assert_eq!(t.data().unwrap().len(), info.nbytes());
                tensors += 1;
            }
            EntryKind::OpaqueTensor(_) => assert!(ck.tensor(&e.name).is_err()),
            _ => {
                ck.value(&e.name).unwrap_or_else(|err| panic!("{} {}: {err}", path.display(), e.name));
            }
        }
    }
    tensors
}

#[test]
fn every_golden_fixture_opens() {
    let f = fixtures();
    let mut n = 0;
    for p in children(&f.join("torch"), Some("pt")) {
        n += check(&p, Format::Torch);
    }
    for dir in [f.join("distcp/golden"), f.join("distcp/torch213")] {
        for p in children(&dir, None) {
            n += check(&p, Format::Distcp);
        }
    }
    for p in children(&f.join("recis/golden"), None) {
        n += check(&p, Format::Recis);
    }
    n += check(&f.join("pbg/ckpt"), Format::Pbg);
    // Format-specific extras through the concrete types.
    let dcp = ckpt::open(&f.join("distcp/golden/d215")).unwrap();
    assert!(dcp.downcast_ref::<ckpt::distcp::DcpReader>().is_some());
    assert!(dcp.downcast_ref::<ckpt::torch::TorchReader>().is_none());
    let pbg = ckpt::open(&f.join("pbg/ckpt")).unwrap();
    assert_eq!(pbg.downcast_ref::<ckpt::pbg::PbgReader>().unwrap().version(), 4);
    for p in children(&f.join("hfai"), None) {
        n += check(&p.join("ckpt"), Format::Hfai);
    }
    assert!(n > 300, "only {n} tensors read");
}

#[test]
fn safetensors_written_by_core_opens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let t = ckpt::Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    ckpt::core::safetensors::write_file(&[("w".into(), t)], None, &path).unwrap();
    assert_eq!(check(&path, Format::Safetensors), 1);
}

#[test]
fn wrong_files_are_named() {
    let bad = fixtures().join("../bad");
    let e = ckpt::open(&bad.join("git_lfs_pointer.pt")).err().unwrap().to_string();
    assert!(e.contains("git-LFS"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let e = ckpt::open(dir.path()).err().unwrap();
    assert!(matches!(e, ckpt::Error::UnknownFormat { .. }), "{e}");
}
