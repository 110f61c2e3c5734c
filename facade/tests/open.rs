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
    let dcp = ckpt::open(f.join("distcp/golden/d215")).unwrap();
    // Any path-like argument, as std::fs takes: a PathBuf by value, a &str, a String.
    let d215 = f.join("distcp/golden/d215");
    let text = d215.to_str().unwrap();
    assert_eq!(ckpt::open(text).unwrap().entries(), dcp.entries());
    let owned: String = text.into();
    assert_eq!(ckpt::open(owned).unwrap().format(), Format::Distcp);
    let direct = ckpt::distcp::DcpReader::open(text).unwrap();
    assert_eq!(ckpt::CheckpointRead::entries(&direct).len(), dcp.entries().len());
    assert!(dcp.downcast_ref::<ckpt::distcp::DcpReader>().is_some());
    assert!(dcp.downcast_ref::<ckpt::torch::TorchReader>().is_none());
    let pbg = ckpt::open(f.join("pbg/ckpt")).unwrap();
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
    ckpt::safetensors::write_file(&[("w".into(), t)], None, &path).unwrap();
    assert_eq!(check(&path, Format::Safetensors), 1);
}

#[test]
fn wrong_files_are_named() {
    let bad = fixtures().join("../bad");
    let e = ckpt::open(bad.join("git_lfs_pointer.pt")).err().unwrap().to_string();
    assert!(e.contains("git-LFS"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let e = ckpt::open(dir.path()).err().unwrap();
    assert!(matches!(e, ckpt::Error::UnknownFormat { .. }), "{e}");
}

/// The first error of type `E` in the chain of `e`.
fn cause<E: std::error::Error + 'static>(e: &ckpt::Error) -> Option<&E> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(found) = s.downcast_ref::<E>() {
            return Some(found);
        }
        source = s.source();
    }
    None
}

/// A `torch.save` file with 40 small tensors and a value nested 12 deep, converted to `to` (a world size of
/// 2 for the sharded formats) in `dir`.
fn sample(dir: &Path, to: Format) -> PathBuf {
    use ckpt::tensor::{Tensor, Value};
    let pt = dir.join("src.pt");
    if !pt.exists() {
        let mut nested = Value::Int(1);
        for _ in 0..12 {
            nested = Value::dict([("n", nested)]);
        }
        let tensors: Vec<(String, Value)> = (0..40)
            .map(|i| (format!("t{i}"), Value::Tensor(Tensor::from_slice(&[i as f32; 16], &[4, 4]).unwrap())))
            .collect();
        let sd = Value::dict([
            ("nested", nested),
            ("tensors", Value::dict(tensors.iter().map(|(k, v)| (k.as_str(), v.clone())))),
        ]);
        ckpt::torch::save(&sd, &pt, &ckpt::torch::WriteOptions::default()).unwrap();
    }
    if to == Format::Torch {
        return pt;
    }
    let dst = dir.join(format!("out.{to}"));
    ckpt::convert(&pt, None, &dst, to, &ckpt::ConvertOptions::default().with_world_size(2)).unwrap();
    dst
}

/// `ReadLimits::pickle`, per call: a file nested deeper than a lowered `max_depth` fails with the pickle
/// decoder's depth error (a limit), in this call only; the defaults load it.
#[test]
fn per_call_pickle_limits_are_enforced() {
    let dir = tempfile::tempdir().unwrap();
    for format in [Format::Torch, Format::Distcp, Format::Hfai] {
        let path = sample(dir.path(), format);
        let mut pickle = ckpt::pickle::Limits::BUILTIN;
        pickle.max_depth = 8;
        let tight = ckpt::ReadLimits::default().with_pickle(pickle);
        let e = ckpt::open_with(&path, &tight).err().unwrap_or_else(|| panic!("{format}: depth 8 accepted"));
        assert_eq!(e.fault(), ckpt::Fault::Limit, "{format}: {e}");
        assert!(e.to_string().contains("nesting deeper than 8"), "{format}: {e}");
        // Not a process default: the next call without limits loads it.
        assert!(ckpt::open(&path).is_ok(), "{format}");
        pickle.max_depth = 100;
        assert!(ckpt::open_with(&path, &ckpt::ReadLimits::default().with_pickle(pickle)).is_ok(), "{format}");
    }
}

/// `ReadLimits::max_header_bytes`: a safetensors header (a single file, hf shards) longer than the bound is
/// `Error::LimitExceeded` naming it, from `open_with`, `verify_with` and `convert`; raised, it loads.
#[test]
fn safetensors_header_limit_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    for format in [Format::Safetensors, Format::Hf] {
        let path = sample(dir.path(), format);
        let tight = ckpt::ReadLimits::default().with_max_header_bytes(64);
        let is_header_limit =
            |e: &ckpt::Error| matches!(e, ckpt::Error::LimitExceeded { limit: "max_header_bytes", max: 64, .. });
        let e = ckpt::open_with(&path, &tight).err().unwrap();
        assert!(is_header_limit(&e), "{format}: {e:?}");
        assert_eq!(e.fault(), ckpt::Fault::Limit);
        assert!(e.to_string().contains("safetensors header") && e.to_string().contains("max_header_bytes"), "{e}");
        let e = ckpt::verify_with(&path, &ckpt::VerifyOptions::deep().with_limits(tight)).unwrap_err();
        assert!(is_header_limit(&e), "{format}: {e:?}");
        let out = dir.path().join(format!("back_{format}.pt"));
        let options = ckpt::ConvertOptions::default().with_limits(tight);
        let e = ckpt::convert(&path, None, &out, Format::Torch, &options).unwrap_err();
        assert!(is_header_limit(&e), "{format}: {e:?}");
        let raised = ckpt::ReadLimits::default().with_max_header_bytes(1 << 20);
        let ck = ckpt::open_with(&path, &raised).unwrap();
        assert_eq!(ck.entries().len(), 40 + 1, "{format}");
        let options = ckpt::ConvertOptions::default().with_limits(raised);
        ckpt::convert(&path, None, &out, Format::Torch, &options).unwrap();
    }
}

/// `ReadLimits::max_data_header_bytes`: a RecIS data file whose header is longer than the bound is RecIS's
/// `HeaderTooLarge` (a limit), from `open_with` and `reshard_with`; raised, it loads.
#[test]
fn recis_data_header_limit_is_enforced() {
    use ckpt::tensor::{Tensor, Value};
    let dir = tempfile::tempdir().unwrap();
    // A hash table: its ids and embedding go to the serializer's data files.
    let path = dir.path().join("recis");
    let ids = Tensor::from_slice(&[3i64, 70_000, -5, 12], &[4]).unwrap();
    let emb = Tensor::from_slice(&[0.5f32; 8], &[4, 2]).unwrap();
    let sd = Value::dict([("tbl@id", Value::Tensor(ids)), ("tbl@embedding", Value::Tensor(emb))]);
    ckpt::recis::save(&sd, &path, &ckpt::recis::WriteOptions::default().with_world_size(2)).unwrap();
    let tight = ckpt::ReadLimits::default().with_max_data_header_bytes(32);
    let e = ckpt::open_with(&path, &tight).err().unwrap();
    assert!(
        matches!(cause::<ckpt::recis::Error>(&e), Some(ckpt::recis::Error::HeaderTooLarge { limit: 32, .. })),
        "{e:?}"
    );
    assert_eq!(e.fault(), ckpt::Fault::Limit);
    let e = ckpt::reshard_with(&path, dir.path().join("resharded"), 3, &tight).unwrap_err();
    assert!(matches!(cause::<ckpt::recis::Error>(&e), Some(ckpt::recis::Error::HeaderTooLarge { .. })), "{e:?}");
    let raised = ckpt::ReadLimits::default().with_max_data_header_bytes(1 << 20);
    assert!(!ckpt::open_with(&path, &raised).unwrap().entries().is_empty());
    ckpt::reshard_with(&path, dir.path().join("resharded"), 3, &raised).unwrap();
}

/// `ReadLimits::max_metadata_bytes`: a DCP `.metadata` larger than the bound is distcp's `MetadataTooLarge`
/// (a limit) before it is read, from `open_with`, `verify_with` (both depths) and `reshard_with`; raised,
/// it loads.
#[test]
fn dcp_metadata_limit_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path(), Format::Distcp);
    let tight = ckpt::ReadLimits::default().with_max_metadata_bytes(100);
    let too_large = |e: &ckpt::Error| {
        matches!(cause::<ckpt::distcp::Error>(e), Some(ckpt::distcp::Error::MetadataTooLarge { limit: 100, .. }))
    };
    let e = ckpt::open_with(&path, &tight).err().unwrap();
    assert!(too_large(&e), "{e:?}");
    assert_eq!(e.fault(), ckpt::Fault::Limit);
    for options in [ckpt::VerifyOptions::structure(), ckpt::VerifyOptions::deep()] {
        let e = ckpt::verify_with(&path, &options.with_limits(tight)).unwrap_err();
        assert!(too_large(&e), "{e:?}");
    }
    let e = ckpt::reshard_with(&path, dir.path().join("resharded"), 3, &tight).unwrap_err();
    assert!(too_large(&e), "{e:?}");
    let raised = ckpt::ReadLimits::default().with_max_metadata_bytes(1 << 24);
    assert_eq!(ckpt::open_with(&path, &raised).unwrap().entries().len(), 40 + 1);
    assert!(ckpt::verify_with(&path, &ckpt::VerifyOptions::deep().with_limits(raised)).unwrap().is_ok());
    ckpt::reshard_with(&path, dir.path().join("resharded"), 3, &raised).unwrap();
}

/// `ReadLimits::max_inflated_bytes`: a zstd-compressed DCP item that inflates past the bound is distcp's
/// `DecompressedTooLarge` (a limit) when read; raised, it reads.
#[test]
fn dcp_inflated_item_limit_is_enforced() {
    use ckpt::tensor::Value;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zstd");
    let sd = Value::dict([("blob", Value::Bytes(vec![7; 1 << 20]))]);
    ckpt::distcp::save(&sd, &path, &ckpt::distcp::WriteOptions::default().with_zstd(3)).unwrap();
    let tight = ckpt::ReadLimits::default().with_max_inflated_bytes(1 << 16);
    let e = ckpt::open_with(&path, &tight).unwrap().value("blob").unwrap_err();
    assert!(
        matches!(
            cause::<ckpt::distcp::Error>(&e),
            Some(ckpt::distcp::Error::DecompressedTooLarge { limit: 65536, .. })
        ),
        "{e:?}"
    );
    assert_eq!(e.fault(), ckpt::Fault::Limit);
    let report = ckpt::verify_with(&path, &ckpt::VerifyOptions::deep().with_limits(tight)).unwrap();
    assert!(report.problems.iter().any(|p| p.message.contains("decompresses to more than 65536 bytes")), "{report:?}");
    let raised = ckpt::ReadLimits::default().with_max_inflated_bytes(2 << 20);
    assert_eq!(ckpt::open_with(&path, &raised).unwrap().value("blob").unwrap(), Value::Bytes(vec![7; 1 << 20]));
}

/// `ReadLimits::pickle` reaches PyTorch-BigGraph's optimizer blobs (pickled `torch.save` data inside the
/// HDF5 files): a golden checkpoint with optimizer state fails under a tiny node limit, with the pickle
/// decoder's limit error, and opens with the defaults.
#[test]
fn per_call_pickle_limits_reach_pbg_optimizer_state() {
    let mut pickle = ckpt::pickle::Limits::BUILTIN;
    pickle.max_nodes = 2;
    let tight = ckpt::ReadLimits::default().with_pickle(pickle);
    let mut limited = 0;
    let variants = fixtures().join("pbg/variants");
    let mut dirs = vec![fixtures().join("pbg/ckpt")];
    if variants.is_dir() {
        dirs.extend(children(&variants, None).into_iter().filter(|d| ckpt::detect(d).ok() == Some(Format::Pbg)));
    }
    for dir in dirs {
        let ck = ckpt::open(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        if !ck.entries().iter().any(|e| e.name.starts_with("optimizer/")) {
            continue;
        }
        let e =
            ckpt::open_with(&dir, &tight).err().unwrap_or_else(|| panic!("{}: max_nodes 2 accepted", dir.display()));
        assert_eq!(e.fault(), ckpt::Fault::Limit, "{}: {e}", dir.display());
        assert!(e.to_string().contains("exceeds 2"), "{}: {e}", dir.display());
        limited += 1;
    }
    assert!(limited > 0, "no PBG fixture with optimizer state");
}

/// A DCP checkpoint with one data file gone: it still opens, every entry `.metadata` lists is listed (those
/// in the missing file marked, with the file named), the entries of the present file read, and reading one
/// of the missing file's entries fails naming the file. `ckpt inspect` and `ckpt cat` do the same.
#[test]
fn a_missing_dcp_data_file_spares_the_other_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d215");
    std::fs::create_dir(&dir).unwrap();
    for f in std::fs::read_dir(fixtures().join("distcp/golden/d215")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::remove_file(dir.join("__0_0.distcp")).unwrap();
    let ck = ckpt::open(&dir).unwrap();
    let report = ckpt::inspect(&ck, &ckpt::Selection::default());
    assert_eq!(report.entries.len(), 5);
    assert!(
        report.details.iter().any(|(k, v)| k == "missing data files" && v == "__0_0.distcp"),
        "{:?}",
        report.details
    );
    let (mut missing, mut read) = (0, 0);
    for e in &report.entries {
        let got = match &e.kind {
            ckpt::inspect::InspectedKind::Tensor { .. } => ck.tensor(&e.name).map(|_| ()),
            _ => ck.value(&e.name).map(|_| ()),
        };
        match &e.unreadable {
            Some(why) => {
                assert_eq!(why, "data file \"__0_0.distcp\" is missing");
                let err = got.unwrap_err().to_string();
                assert!(err.contains("__0_0.distcp") && err.contains("does not exist"), "{err}");
                missing += 1;
            }
            None => {
                got.unwrap();
                read += 1;
            }
        }
    }
    assert!(missing > 0 && read > 0, "{missing} unreadable, {read} read");
    let json = report.to_json();
    let marked = json["entries"].as_array().unwrap().iter().filter(|e| e.get("unreadable").is_some()).count();
    assert_eq!(marked, missing);

    let ckpt_bin = env!("CARGO_BIN_EXE_ckpt");
    let out = std::process::Command::new(ckpt_bin).arg("inspect").arg(&dir).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.matches("(unreadable: data file \"__0_0.distcp\" is missing)").count(), missing, "{text}");
    let readable = report.entries.iter().find(|e| e.unreadable.is_none()).unwrap();
    let out = std::process::Command::new(ckpt_bin).arg("cat").arg(&dir).arg(&readable.name).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
