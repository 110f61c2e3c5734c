//! PyTorch-BigGraph conformance: the checkpoint torchbiggraph 1.0.0 trained (with snapshots whose absolute
//! links dangle, as after a move) reads exactly as its manifest says; hand-made variants read, bad files
//! fail with their own error; ckpt's TSV export equals `torchbiggraph_export_to_tsv`'s; and a version
//! written by ckpt loads in torchbiggraph to the expected values and training resumes from it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::{Path, PathBuf};

use ckpt_conformance::{fixtures, run_python, typed_tree};
use ckpt_pbg::{
    AttrValue, Config, EntityPartition, EntityStorage, Error, FileCheckpointStorage, Iteration, Metadata, Model,
    ModelParameter, OptimizerState, PbgReader, WriteOptions, export_safetensors, export_tsv, read_model_file,
    read_partition_file,
};
use ckpt_tensor::{CheckpointRead, DType, Tensor, Value, leaves};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

fn root() -> PathBuf {
    fixtures("pbg")
}

fn manifest() -> Json {
    let p = root().join("MANIFEST.json");
    serde_json::from_slice(&fs::read(&p).unwrap_or_else(|e| panic!("{}: {e} (run make_fixtures.py)", p.display())))
        .unwrap()
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Copies a directory tree, recreating symbolic links with their targets (dangling ones included).
fn copy_tree(src: &Path, dst: &Path) {
    fs::create_dir_all(dst).unwrap();
    for entry in fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        let ty = entry.file_type().unwrap();
        if ty.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&from).unwrap(), &to).unwrap();
        } else if ty.is_dir() {
            copy_tree(&from, &to);
        } else {
            fs::copy(&from, &to).unwrap();
        }
    }
}

/// The attribute as the manifest renders it.
fn attr_json(v: &AttrValue) -> Json {
    match v {
        AttrValue::Int(i) => serde_json::json!({"type": "int", "value": i}),
        AttrValue::Float(f) => serde_json::json!({"type": "float", "value": ckpt_conformance::float_hex(*f)}),
        AttrValue::Str(s) => serde_json::json!({"type": "str", "value": s}),
        AttrValue::Other(d) => serde_json::json!({"type": "other", "value": d}),
    }
}

fn check_attrs(name: &str, metadata: &Metadata, want: &Json) {
    let want = want.as_object().unwrap();
    let mut expected: Vec<(String, Json)> = Vec::new();
    for (k, v) in want {
        if k == "format_version" {
            continue;
        }
        // Byte strings (h5py 2.x style, fixed length) read as text.
        let v = if v["type"] == "bytes" { serde_json::json!({"type": "str", "value": v["value"]}) } else { v.clone() };
        expected.push((k.clone(), v));
    }
    let ours: Vec<(String, Json)> = metadata.attrs.iter().map(|(k, v)| (k.clone(), attr_json(v))).collect();
    assert_eq!(ours, expected, "{name}: attributes");
}

/// The manifest's dtype string of a dataset, for values read as `dtype`.
fn bytes_as(t: &Tensor, numpy: &str) -> Vec<u8> {
    let v = t.to_vec::<f32>().unwrap();
    match numpy {
        "<f4" => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ">f4" => v.iter().flat_map(|x| x.to_be_bytes()).collect(),
        "<f8" => v.iter().flat_map(|x| f64::from(*x).to_le_bytes()).collect(),
        other => panic!("unexpected dtype {other}"),
    }
}

fn check_blob(name: &str, blob: &OptimizerState, want: &Json) {
    assert_eq!(sha(blob.bytes().as_bytes()), want["sha256"].as_str().unwrap(), "{name}: blob bytes");
    let value = blob.decode_value().unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(typed_tree(&value), want["decoded"]["tree"], "{name}: decoded optimizer state");
    let ours: Vec<Json> = leaves(&value)
        .unwrap()
        .into_iter()
        .filter_map(|l| {
            let t = l.value.as_tensor()?;
            Some(serde_json::json!({"path": l.key, "dtype": t.dtype().torch_name(), "shape": t.shape(),
                "sha256": sha(&t.data().unwrap())}))
        })
        .collect();
    assert_eq!(Json::Array(ours), want["decoded"]["tensors"], "{name}: optimizer tensors");
    blob.decode().unwrap_or_else(|e| panic!("{name}: not a state dict: {e}"));
}

fn dataset<'a>(h5: &'a Json, path: &str) -> Option<&'a Json> {
    h5["datasets"].as_array().unwrap().iter().find(|d| d["path"] == path)
}

#[test]
fn every_fixture_file_reads_as_its_manifest_says() {
    let m = manifest();
    let mut checked = 0;
    for (rel, rec) in m["files"].as_object().unwrap() {
        let Some(h5) = rec.get("hdf5") else { continue };
        if !(rel.starts_with("ckpt/") || rel.starts_with("variants/")) {
            continue;
        }
        let path = root().join(rel);
        let is_model = rel.contains("/model.") || rel.ends_with("model_init.h5");
        if is_model {
            let model = read_model_file(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
            check_attrs(rel, &model.metadata, &h5["attrs"]);
            let want: Vec<&Json> = h5["datasets"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["path"].as_str().unwrap().starts_with("model/"))
                .collect();
            let params = model.parameters.as_deref().unwrap_or_default();
            assert_eq!(params.len(), want.len(), "{rel}: parameter count");
            assert_eq!(
                model.parameters.is_some(),
                h5["groups"].as_array().unwrap().iter().any(|g| g["path"] == "model")
            );
            for (p, w) in params.iter().zip(&want) {
                assert_eq!(format!("model/{}", p.public_name), w["path"].as_str().unwrap(), "{rel}: order");
                assert_eq!(p.tensor.dtype(), DType::F32);
                assert_eq!(Json::from(p.tensor.shape().to_vec()), w["shape"], "{rel}: {}", p.public_name);
                assert_eq!(sha(&p.tensor.data().unwrap()), w["sha256"].as_str().unwrap(), "{rel}: {}", p.public_name);
                assert_eq!(p.private_name, w["attrs"]["state_dict_key"]["value"].as_str().unwrap(), "{rel}");
                assert!(p.tensor.storage().is_mapped(), "{rel}: {} not a window of the map", p.public_name);
            }
            match (&model.optimizer, dataset(h5, "optimizer/state_dict")) {
                (Some(b), Some(w)) => check_blob(rel, b, w),
                (None, None) => {}
                _ => panic!("{rel}: optimizer presence"),
            }
        } else {
            let part = read_partition_file(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
            check_attrs(rel, &part.metadata, &h5["attrs"]);
            let w = dataset(h5, "embeddings").unwrap();
            assert_eq!(part.embeddings.dtype(), DType::F32, "{rel}");
            assert_eq!(Json::from(part.embeddings.shape().to_vec()), w["shape"], "{rel}: shape");
            let numpy = w["dtype"].as_str().unwrap();
            assert_eq!(sha(&bytes_as(&part.embeddings, numpy)), w["sha256"].as_str().unwrap(), "{rel}: values");
            if numpy == "<f4" && w["layout"] == "contiguous" && !part.is_empty() && !rel.contains("userblock") {
                assert!(part.embeddings.storage().is_mapped(), "{rel}: embeddings not a window of the map");
            }
            match (&part.optimizer, dataset(h5, "optimizer/state_dict")) {
                (Some(b), Some(w)) => check_blob(rel, b, w),
                (None, None) => {}
                _ => panic!("{rel}: optimizer presence"),
            }
        }
        checked += 1;
    }
    assert!(checked >= 16, "only {checked} files checked");
}

#[test]
fn committed_version_and_snapshots_read_with_dangling_absolute_links() {
    let ckpt = PbgReader::open(root().join("ckpt")).unwrap();
    assert_eq!(ckpt.version(), 4);
    let parts: Vec<(&str, u32, usize)> =
        ckpt.partitions().iter().map(|p| (p.entity.as_str(), p.partition, p.data.len())).collect();
    assert_eq!(parts, vec![("user_id", 0, 15), ("user_id", 1, 14), ("item", 0, 11)]);
    let entities = EntityStorage::new(root().join("data"));
    ckpt.check_counts(&entities).unwrap();
    let config = ckpt.config().unwrap();
    assert_eq!(config.relations().len(), 3);
    assert_eq!(ckpt.model_optimizer().unwrap().indices(), vec![0, 1, 2, 3, 4, 5]);
    for p in ckpt.partitions() {
        let sd = p.optimizer.as_ref().unwrap();
        assert_eq!(sd.sum(0).unwrap().shape(), &[p.data.len()]);
        assert_eq!(sd.lr(0), Some(0.05));
    }

    // The snapshots' links are absolute paths into a directory that no longer exists.
    for (epoch, version) in [(1u64, 2u64), (2, 4)] {
        let link = root().join(format!("ckpt/epoch_{epoch}/model.v{version}.h5"));
        assert!(fs::read_link(&link).unwrap().is_absolute() && !link.exists());
        let snap = PbgReader::open(root().join(format!("ckpt/epoch_{epoch}"))).unwrap();
        assert_eq!(snap.version(), version);
        assert!(snap.config().is_some(), "config from the files' config/json");
        let main = PbgReader::open_version(FileCheckpointStorage::new(root().join("ckpt")), version).unwrap();
        assert_eq!(snap.partitions().len(), 3);
        for (a, b) in snap.partitions().iter().zip(main.partitions()) {
            assert_eq!((&a.entity, a.partition, &a.data), (&b.entity, b.partition, &b.data));
        }
        assert_eq!(snap.model(), main.model());
    }

    // The generic reader agrees with the typed one.
    let entries = ckpt.entries();
    assert!(entries.iter().any(|e| e.name == "embeddings/user_id/1"));
    assert!(entries.iter().any(|e| e.name == "optimizer/model/param_groups.0.lr"));
    for e in &entries {
        if let Some(info) = e.tensor_info() {
            let t = ckpt.tensor(&e.name).unwrap();
            assert_eq!((t.dtype(), t.shape().to_vec()), (info.dtype, info.shape.clone()), "{}", e.name);
        } else {
            ckpt.value(&e.name).unwrap();
        }
    }
    assert_eq!(ckpt.tensor("model/relations/1/operator/rhs/real").unwrap().shape(), &[3]);
    assert!(ckpt.details().iter().any(|(k, v)| k == "version" && v == "4"));

    // verify: complete, no partial or stale files (v2 is kept by the epoch_1 snapshot), links resolved.
    let report = FileCheckpointStorage::new(root().join("ckpt")).verify(Some(&entities)).unwrap();
    assert!(report.is_ok() && report.problems.is_empty(), "{report:?}");
}

fn error_name(e: &Error) -> &'static str {
    match e {
        Error::NotHdf5 { .. } => "NotHdf5",
        Error::MissingDataset { .. } => "MissingDataset",
        Error::WrongDtype { .. } => "WrongDtype",
        Error::WrongRank { .. } => "WrongRank",
        Error::FormatVersion { .. } => "FormatVersion",
        Error::OptimizerBlob { .. } => "OptimizerBlob",
        Error::BadStorage { .. } => "BadStorage",
        Error::Truncated { .. } => "Truncated",
        Error::CouldNotLoad { .. } => "CouldNotLoad",
        Error::Hdf5 { .. } => "Hdf5",
        _ => "other",
    }
}

#[test]
fn bad_files_fail_with_their_own_error() {
    let m = manifest();
    let bad = m["bad"].as_object().unwrap();
    assert!(bad.len() >= 12);
    for (file, want) in bad {
        let path = root().join("bad").join(file);
        let err = match read_partition_file(&path) {
            Err(e) => e,
            Ok(p) => match p.optimizer.map(|o| o.decode()) {
                Some(Err(e)) => e,
                _ => panic!("{file}: read without error"),
            },
        };
        assert_eq!(error_name(&err), want.as_str().unwrap(), "{file}: {err}");
        assert!(!err.to_string().is_empty());
    }
    let missing = root().join("bad").join("no_such_file.h5");
    assert!(matches!(read_partition_file(&missing), Err(Error::CouldNotLoad { .. })));
    assert!(matches!(read_model_file(&root().join("bad/not_hdf5.h5")), Err(Error::NotHdf5 { .. })));
}

#[test]
fn counts_disagreeing_with_the_entity_path_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&root(), dir.path());
    let entities = EntityStorage::new(dir.path().join("data"));
    fs::write(entities.count_file("user_id", 1), "13\n").unwrap();
    let ckpt = PbgReader::open(dir.path().join("ckpt")).unwrap();
    match ckpt.check_counts(&entities) {
        Err(Error::CountMismatch { expected: 13, found: 14, partition: 1, .. }) => {}
        other => panic!("{other:?}"),
    }
    let report = ckpt.storage().verify(Some(&entities)).unwrap();
    assert!(!report.is_ok());
    assert!(
        matches!(report.problems.as_slice(), [p] if p.kind == ckpt_pbg::ProblemKind::Inconsistent && p.message.contains("13")),
        "{report:?}"
    );
}

#[test]
fn partial_and_missing_versions_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&root(), dir.path());
    let storage = FileCheckpointStorage::new(dir.path().join("ckpt"));
    let entities = EntityStorage::new(dir.path().join("data"));
    // An iteration that wrote a v5 partition and crashed before its commit.
    let p = storage.load_entity_partition(4, "item", 0).unwrap();
    storage.save_entity_partition(5, "item", 0, &p).unwrap();
    fs::remove_file(storage.entity_partition_file(4, "user_id", 1)).unwrap();
    fs::write(storage.path().join("model.v3.h5"), b"leaked").unwrap();
    let report = storage.verify(Some(&entities)).unwrap();
    let names = |kind| -> Vec<String> {
        report
            .of_kind(kind)
            .filter_map(|p| p.file.as_ref()?.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect()
    };
    use ckpt_pbg::ProblemKind;
    assert_eq!(names(ProblemKind::Unfinished), ["embeddings_item_0.v5.h5"]);
    assert_eq!(names(ProblemKind::Missing), ["embeddings_user_id_1.v4.h5"]);
    let missing: Vec<_> = report.of_kind(ProblemKind::Missing).filter_map(|p| p.entry.as_deref()).collect();
    assert_eq!(missing, ["user_id/1"]);
    assert_eq!(names(ProblemKind::Stale), ["model.v3.h5"]);
    assert!(!report.is_ok());
    // A missing partition of the committed version is PBG's "could not load".
    assert!(matches!(storage.load_entity_partition(4, "user_id", 1), Err(Error::CouldNotLoad { .. })));
}

#[test]
fn tsv_export_equals_torchbiggraph_export_to_tsv() {
    let ckpt = PbgReader::open(root().join("ckpt")).unwrap();
    let config = Config::read(&root().join("config.json")).unwrap();
    let entities = EntityStorage::new(root().join("data"));
    let dir = tempfile::tempdir().unwrap();
    let (e, r) = (dir.path().join("entities.tsv"), dir.path().join("relation_types.tsv"));
    export_tsv(&ckpt, &config, &entities, &e, &r).unwrap();
    assert_eq!(fs::read_to_string(&e).unwrap(), fs::read_to_string(root().join("export/entities.tsv")).unwrap());
    assert_eq!(fs::read_to_string(&r).unwrap(), fs::read_to_string(root().join("export/relation_types.tsv")).unwrap());
    // Like the original ("xt"), existing outputs are not overwritten.
    assert!(matches!(export_tsv(&ckpt, &config, &entities, &e, &r), Err(Error::AlreadyExists { .. })));
}

#[test]
fn safetensors_export_holds_every_tensor() {
    let ckpt = PbgReader::open(root().join("ckpt")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pbg.safetensors");
    export_safetensors(&ckpt, &out).unwrap();
    let st = ckpt_safetensors::read_file(&out).unwrap();
    let tensors = ckpt.tensors();
    assert_eq!(st.tensors.len(), tensors.len());
    for (name, t) in &tensors {
        assert_eq!(st.get(name).unwrap_or_else(|| panic!("{name} missing")), t, "{name}");
    }
    // ckpt's one safetensors convention: `format` = `pt`, the source format, the values in `ckpt.values`.
    let meta = st.metadata.as_ref().unwrap();
    assert_eq!((meta["format"].as_str(), meta["ckpt.source"].as_str()), ("pt", "pbg"));
    assert_eq!(st.value("version").unwrap(), Value::Int(4));
    assert!(st.value("config").unwrap().as_str().unwrap().contains("\"num_partitions\": 2"));
    assert!(st.value("optimizer/model/param_groups.0.lr").unwrap().as_f64().unwrap().to_string().starts_with("0.05"));
}

fn map_f32(t: &Tensor, f: impl Fn(f32) -> f32) -> Tensor {
    let v: Vec<f32> = t.to_vec::<f32>().unwrap().into_iter().map(f).collect();
    Tensor::from_slice(&v, t.shape()).unwrap()
}

/// Rust commits version 5 (changed embeddings, optimizer states and model) into a copy of the fixture;
/// torchbiggraph loads everything to the expected values, ckpt's exports agree with PBG, and
/// `torchbiggraph_train` resumes from version 5.
#[test]
fn rust_written_version_loads_in_torchbiggraph_and_training_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    copy_tree(&root(), work);
    let storage = FileCheckpointStorage::new(work.join("ckpt"));
    let old = PbgReader::open(storage.path()).unwrap();
    let config = old.config().unwrap().clone();

    let mut commit = storage.begin_commit().unwrap();
    assert_eq!((commit.previous(), commit.version()), (4, 5));
    // Training is over at version 4 (2 epochs x 2 chunks); the files are stamped as PBG would stamp the
    // next iteration of a 3-epoch run, which is how the resume below continues.
    let it = Iteration::from_index(4, 3, &config.edge_paths(), 2).unwrap();
    commit.set_next_metadata(Some(Metadata::for_iteration(config.text(), &it)));
    for p in old.partitions() {
        let mut sd = p.optimizer.clone().unwrap();
        let sum = map_f32(sd.sum(0).unwrap(), |x| x + 1.0);
        sd.set_sum(0, sum).unwrap();
        let mut data = EntityPartition::new(map_f32(&p.data.embeddings, |x| x * 2.0 + 0.25));
        data.optimizer = Some(OptimizerState::encode(&sd).unwrap());
        commit.partition(&p.entity, p.partition, data).unwrap();
    }
    let model = old.model().unwrap();
    let params = model
        .parameters
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| ModelParameter::new(&p.private_name, map_f32(&p.tensor, |x| x - 0.5)).unwrap())
        .collect();
    let mut sd = old.model_optimizer().unwrap().clone();
    for i in sd.indices() {
        let sum = map_f32(sd.sum(i).unwrap(), |x| x * 0.5);
        sd.set_sum(i, sum).unwrap();
    }
    commit.model(Model {
        parameters: Some(params),
        optimizer: Some(OptimizerState::encode(&sd).unwrap()),
        ..Model::default()
    });
    let report = commit.finish(&WriteOptions::default()).unwrap();
    assert_eq!(report.version, 5);
    assert_eq!(report.written.len(), 4);
    assert!(report.carried_over.is_empty());
    assert!(report.dropped.is_empty(), "v4 is linked from epoch_2 and must be kept: {report:?}");

    // Read back in Rust.
    let new = PbgReader::open(storage.path()).unwrap();
    assert_eq!(new.version(), 5);
    for (a, b) in new.partitions().iter().zip(old.partitions()) {
        assert_eq!(a.data.embeddings, map_f32(&b.data.embeddings, |x| x * 2.0 + 0.25));
        assert_eq!(a.data.metadata.iteration().unwrap(), it);
    }
    let entities = EntityStorage::new(work.join("data"));
    new.check_counts(&entities).unwrap();
    assert!(storage.verify(Some(&entities)).unwrap().is_ok());

    // Exports of version 5 for the checker, and version-0 init files.
    export_safetensors(&new, &work.join("export.safetensors")).unwrap();
    fs::create_dir(work.join("rust_export")).unwrap();
    export_tsv(
        &new,
        &config,
        &entities,
        &work.join("rust_export/entities.tsv"),
        &work.join("rust_export/relation_types.tsv"),
    )
    .unwrap();
    let init = FileCheckpointStorage::new(work.join("init"));
    init.prepare().unwrap();
    let first = new.partition("user_id", 0).unwrap();
    init.save_entity_partition(0, "user_id", 0, &EntityPartition::new(first.data.embeddings.clone())).unwrap();
    init.save_model(0, &Model::default()).unwrap();

    let out = run_python("pbg/check_roundtrip.py", &[&root(), work]);
    assert_eq!(out.lines().filter(|l| l.starts_with("ok: ")).count(), 7, "{out}");
}
