//! The commit protocol, the file writers and their validation, without Python (the conformance suite
//! checks the same files against torchbiggraph).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::Path;

use ckpt_pbg::{
    AttrValue, EntityPartition, Error, FileCheckpointStorage, FileName, Metadata, Model, ModelParameter,
    OptimizerState, StateDict, VersionWrite, WriteOptions, read_model_file, read_partition_file, write_model_file,
    write_partition_file,
};
use ckpt_tensor::{DType, Tensor, Value};
use hdf5::plist::group_create::LinkCreationOrder;
use hdf5::types::TypeDescriptor;

fn embs(rows: usize, dim: usize, seed: f32) -> Tensor {
    let v: Vec<f32> = (0..rows * dim).map(|i| seed + i as f32 / 8.0).collect();
    Tensor::from_slice(&v, &[rows, dim]).unwrap()
}

fn partition(rows: usize, seed: f32) -> EntityPartition {
    let mut p = EntityPartition::new(embs(rows, 4, seed));
    let sum = Tensor::from_slice(&vec![seed; rows], &[rows]).unwrap();
    p.optimizer = Some(OptimizerState::encode(&StateDict::row_adagrad(sum, 0.1)).unwrap());
    p
}

fn names(storage: &FileCheckpointStorage) -> Vec<String> {
    storage.list().unwrap().into_iter().map(|(n, _)| n.to_string()).collect()
}

const CONFIG: &str = r#"{
    "entities": {"user": {"num_partitions": 2}, "item": {"num_partitions": 1}},
    "relations": [{"name": "r", "lhs": "user", "rhs": "item", "operator": "translation"}],
    "dimension": 4,
    "edge_paths": ["edges/a", "edges/b"],
    "num_epochs": 2,
    "num_edge_chunks": 3,
    "entity_path": "data",
    "checkpoint_path": "ckpt"
}"#;

#[test]
fn commits_write_then_commit_then_drop() {
    let dir = tempfile::tempdir().unwrap();
    let storage = FileCheckpointStorage::new(dir.path());
    storage.prepare().unwrap();
    storage.save_config(CONFIG).unwrap();

    // Version 1: everything.
    let mut c = storage.begin_commit().unwrap();
    assert_eq!(c.version(), 1);
    let meta = c.next_metadata().unwrap().clone();
    let it = meta.iteration().unwrap();
    assert_eq!((it.epoch_idx, it.edge_path_idx, it.edge_path.as_str(), it.edge_chunk_idx), (0, 0, "edges/a", 0));
    assert_eq!(meta.config_json(), Some(CONFIG));
    c.partition("user", 0, partition(3, 1.0)).unwrap();
    c.partition("user", 1, partition(2, 2.0)).unwrap();
    c.partition("item", 0, partition(4, 3.0)).unwrap();
    c.model(Model::default());
    let r = c.finish(&WriteOptions::default()).unwrap();
    assert_eq!((r.previous, r.version, r.written.len()), (0, 1, 4));
    assert_eq!(storage.load_version().unwrap(), 1);
    let p = storage.load_entity_partition(1, "user", 0).unwrap();
    assert_eq!(p.metadata, meta, "files without metadata get the iteration's");

    // A crashed attempt at version 2 left a partition of an entity type that no longer exists.
    storage.save_entity_partition(2, "gone", 0, &partition(1, 0.0)).unwrap();
    // Version 2: only user 1 changes; the rest is carried over; v1 is dropped.
    let mut c = storage.begin_commit().unwrap();
    assert_eq!(c.next_metadata().unwrap().iteration().unwrap().edge_chunk_idx, 1);
    c.partition("user", 1, partition(2, 9.0)).unwrap();
    let r = c.finish(&WriteOptions::default()).unwrap();
    assert_eq!(r.written.len(), 1);
    assert_eq!(r.carried_over.len(), 3);
    assert_eq!(r.dropped.len(), 4);
    assert_eq!(r.leftovers, vec![storage.entity_partition_file(2, "gone", 0)]);
    assert_eq!(
        names(&storage),
        vec![
            "embeddings_item_0.v2.h5",
            "embeddings_user_0.v2.h5",
            "embeddings_user_1.v2.h5",
            "model.v2.h5",
            "checkpoint_version.txt",
            "config.json"
        ]
    );
    assert_eq!(storage.load_entity_partition(2, "user", 1).unwrap().embeddings, embs(2, 4, 9.0));
    assert_eq!(storage.load_entity_partition(2, "user", 0).unwrap().embeddings, embs(3, 4, 1.0));

    // Version 3 with a snapshot, keeping v2 (as PBG keeps the checkpoint of a preserved epoch).
    let mut c = storage.begin_commit().unwrap();
    c.partition("item", 0, partition(4, 5.0)).unwrap();
    let r = c.finish(&WriteOptions::default().with_preserve_old(true).with_snapshot_epoch(Some(1))).unwrap();
    assert!(r.dropped.is_empty());
    let snap = r.snapshot.unwrap();
    let link = fs::read_link(snap.join("embeddings_item_0.v3.h5")).unwrap();
    assert_eq!(link, Path::new("../embeddings_item_0.v3.h5"), "relative links");
    assert_eq!(fs::read_to_string(snap.join("checkpoint_version.txt")).unwrap(), "3\n");
    let report = storage.verify(None).unwrap();
    let stale: Vec<_> = report.of_kind(ckpt_pbg::ProblemKind::Stale).filter_map(|p| p.file.as_ref()).collect();
    assert!(stale.iter().any(|f| f.to_string_lossy().contains(".v2.")), "{report:?}");

    // Version 4 drops v3's files except those the snapshot links to: here all of them.
    let r = storage.begin_commit().unwrap().finish(&WriteOptions::default()).unwrap();
    assert!(r.dropped.is_empty(), "{r:?}");
    assert_eq!(r.carried_over.len(), 4);
    // The snapshot still reads after moving the whole directory.
    let moved =
        dir.path().parent().unwrap().join(format!("{}-moved", dir.path().file_name().unwrap().to_string_lossy()));
    fs::rename(dir.path(), &moved).unwrap();
    let snap = FileCheckpointStorage::new(moved.join("epoch_1"));
    assert_eq!(snap.load_version().unwrap(), 3);
    assert_eq!(snap.load_entity_partition(3, "item", 0).unwrap().embeddings, embs(4, 4, 5.0));
    fs::remove_dir_all(&moved).unwrap();
}

#[test]
fn commit_refuses_a_version_committed_meanwhile_and_writes_in_place_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let storage = FileCheckpointStorage::new(dir.path());
    storage.prepare().unwrap();
    let a = storage.begin_commit().unwrap();
    // A second commit of ckpt's waits for no one: the lock names the holder.
    let e = storage.begin_commit().unwrap_err();
    assert!(
        matches!(&e, Error::Core(c) if matches!(c.format_error::<ckpt_io::CommitError>(), Some(ckpt_io::CommitError::Locked { .. }))),
        "{e}"
    );
    assert!(e.to_string().contains(&format!("pid {}", std::process::id())), "{e}");
    // A writer that takes no lock (PBG's own trainer) commits version 1 meanwhile: `a` refuses to commit.
    storage.save_version_in_place(1).unwrap();
    assert!(matches!(a.finish(&WriteOptions::default()), Err(Error::InvalidInput { .. })));
    assert_eq!(storage.load_version().unwrap(), 1);
    // The lock went with `a`; PBG's in-place version write on request.
    let mut b = storage.begin_commit().unwrap();
    b.partition("x", 0, partition(1, 0.0)).unwrap();
    b.finish(&WriteOptions::default().with_version_write(VersionWrite::InPlace)).unwrap();
    assert_eq!(fs::read_to_string(storage.version_file()).unwrap(), "2\n");
    assert_eq!(storage.load_version().unwrap(), 2);
}

#[test]
fn many_partitions_commit_in_parallel() {
    let dir = tempfile::tempdir().unwrap();
    let storage = FileCheckpointStorage::new(dir.path());
    storage.prepare().unwrap();
    let mut c = storage.begin_commit().unwrap();
    for p in 0..24u32 {
        c.partition("node", p, partition(100 + p as usize, p as f32)).unwrap();
    }
    c.finish(&WriteOptions::default()).unwrap();
    let ckpt = ckpt_pbg::PbgReader::open(dir.path()).unwrap();
    assert_eq!(ckpt.partitions().len(), 24);
    for (i, p) in ckpt.partitions().iter().enumerate() {
        assert_eq!(p.partition as usize, i);
        assert_eq!(p.data.embeddings, embs(100 + i, 4, i as f32));
        assert_eq!(p.optimizer.as_ref().unwrap().sum(0).unwrap().shape(), &[100 + i]);
        assert!(p.data.embeddings.storage().is_mapped());
    }
}

#[test]
fn files_carry_h5py_types_and_model_layout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.v1.h5");
    let mut meta = Metadata::new();
    meta.set("config/json", "{\"é\": 1}");
    meta.set("iteration/epoch_idx", 3i64);
    meta.attrs.push(("ratio".into(), AttrValue::Float(0.5)));
    let params = vec![
        ModelParameter::new("rhs_operators.1.real", Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()).unwrap(),
        ModelParameter::new("rhs_operators.1.imag", Tensor::from_slice(&[3.0f32, 4.0], &[2]).unwrap()).unwrap(),
        ModelParameter::new("rhs_operators.0.linear_transformation", embs(2, 2, 0.0)).unwrap(),
        ModelParameter::new("global_embs.emb_user", Tensor::from_slice(&[0.5f32; 2], &[2]).unwrap()).unwrap(),
    ];
    let opt = OptimizerState::encode_value(&Value::dict::<&str>([])).unwrap();
    let model = Model { parameters: Some(params.clone()), optimizer: Some(opt.clone()), metadata: meta.clone() };
    write_model_file(&path, &model).unwrap();

    let back = read_model_file(&path).unwrap();
    assert_eq!(back.metadata.attrs, {
        let mut sorted = meta.attrs.clone();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        sorted
    });
    let order: Vec<&str> = back.parameters.as_ref().unwrap().iter().map(|p| p.public_name.as_str()).collect();
    assert_eq!(
        order,
        vec![
            "entities/user/global_embedding",
            "relations/0/operator/rhs/linear_transformation",
            "relations/1/operator/rhs/imag",
            "relations/1/operator/rhs/real"
        ],
        "h5py visititems order"
    );
    for p in &params {
        assert_eq!(back.get(&p.public_name).unwrap(), p);
    }
    assert_eq!(back.optimizer.as_ref().unwrap().bytes().as_bytes(), opt.bytes().as_bytes());
    assert!(back.optimizer.unwrap().decode().is_ok(), "DummyOptimizer's {{}}");

    // The HDF5 objects, as h5py creates them for PBG.
    let f = hdf5::File::open(&path).unwrap();
    assert!(matches!(
        f.attr("format_version").unwrap().dtype().unwrap().to_descriptor().unwrap(),
        TypeDescriptor::Integer(_)
    ));
    assert_eq!(f.attr("format_version").unwrap().read_scalar::<i64>().unwrap(), 1);
    assert_eq!(f.attr("config/json").unwrap().dtype().unwrap().to_descriptor().unwrap(), TypeDescriptor::VarLenUnicode);
    let g = f.group("model").unwrap();
    assert_eq!(g.gcpl().unwrap().link_creation_order(), LinkCreationOrder::Indexed);
    assert_eq!(f.group("model/relations").unwrap().gcpl().unwrap().link_creation_order(), LinkCreationOrder::Indexed);
    let leaf_parent = f.group("model/relations/1/operator/rhs").unwrap();
    assert_eq!(leaf_parent.gcpl().unwrap().link_creation_order(), LinkCreationOrder::Untracked);
    let created: Vec<String> =
        g.member_names_by(hdf5::IndexType::CreationOrder, hdf5::IterationOrder::Increasing).unwrap();
    assert_eq!(created, vec!["relations", "entities"], "creation order tracked");
    let ds = f.dataset("model/relations/1/operator/rhs/real").unwrap();
    assert_eq!(
        ds.attr("state_dict_key").unwrap().read_scalar::<hdf5::types::VarLenUnicode>().unwrap().as_str(),
        "rhs_operators.1.real"
    );
    assert_eq!(ds.layout(), hdf5::dataset::Layout::Contiguous);
    assert!(f.dataset("optimizer/state_dict").unwrap().dtype().unwrap().to_descriptor().is_err(), "OPAQUE");
}

#[test]
fn model_names_outside_the_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.h5");
    // A name PBG's mapping does not cover: readable through its state_dict_key attribute.
    let p = ModelParameter {
        public_name: "custom/scale".into(),
        private_name: "scale".into(),
        tensor: Tensor::from_slice(&[2i64], &[1]).unwrap(),
    };
    write_model_file(&path, &Model { parameters: Some(vec![p.clone()]), ..Model::default() }).unwrap();
    assert_eq!(read_model_file(&path).unwrap().parameters.unwrap(), vec![p]);
    // ... and an error without it, as in PBG.
    let f = hdf5::File::create(&path).unwrap();
    f.new_attr::<i64>().create("format_version").unwrap().write_scalar(&1i64).unwrap();
    f.create_group("model").unwrap().new_dataset::<f32>().shape([2]).create("oops").unwrap();
    drop(f);
    assert!(matches!(read_model_file(&path), Err(Error::UnmappedParameter { .. })));
    // No model group at all: no state dict.
    let f = hdf5::File::create(&path).unwrap();
    f.new_attr::<i64>().create("format_version").unwrap().write_scalar(&1i64).unwrap();
    drop(f);
    assert_eq!(read_model_file(&path).unwrap().parameters, None);
}

#[test]
fn writers_reject_what_pbg_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.h5");
    let f64s = Tensor::zeros(DType::F64, &[2, 2]).unwrap();
    assert!(matches!(write_partition_file(&path, &EntityPartition::new(f64s)), Err(Error::InvalidInput { .. })));
    let flat = Tensor::zeros(DType::F32, &[4]).unwrap();
    assert!(matches!(write_partition_file(&path, &EntityPartition::new(flat)), Err(Error::InvalidInput { .. })));
    let storage = FileCheckpointStorage::new(dir.path());
    assert!(matches!(storage.save_entity_partition(1, "a/b", 0, &partition(1, 0.0)), Err(Error::InvalidName { .. })));
    let mut c = storage.begin_commit().unwrap();
    assert!(c.partition("", 0, partition(1, 0.0)).is_err());
    let mut p = partition(1, 0.0);
    p.metadata.set("bad", "nul\0inside");
    assert!(matches!(write_partition_file(&path, &p), Err(Error::InvalidInput { .. })));
    let a = ModelParameter::new("rhs_operators.0.x", Tensor::zeros(DType::F32, &[1]).unwrap()).unwrap();
    let clash = Model { parameters: Some(vec![a.clone(), a]), ..Model::default() };
    assert!(matches!(write_model_file(&path, &clash), Err(Error::InvalidInput { .. })));
    let bf16 = ModelParameter::new("rhs_operators.0.x", Tensor::zeros(DType::BF16, &[1]).unwrap()).unwrap();
    let model = Model { parameters: Some(vec![bf16]), ..Model::default() };
    assert!(matches!(write_model_file(&path, &model), Err(Error::InvalidInput { .. })));
}

#[test]
fn partitions_round_trip_including_empty_and_corrupt_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.h5");
    let empty = partition(0, 1.0);
    write_partition_file(&path, &empty).unwrap();
    let back = read_partition_file(&path).unwrap();
    assert_eq!(back.embeddings.shape(), &[0, 4]);
    assert_eq!(back.optimizer.unwrap().decode().unwrap().sum(0).unwrap().shape(), &[0]);

    let mut p = partition(3, 2.0);
    p.optimizer = Some(OptimizerState::from_bytes(b"PK\x03\x04garbage".to_vec()));
    write_partition_file(&path, &p).unwrap();
    let back = read_partition_file(&path).unwrap();
    assert_eq!(back.embeddings, p.embeddings);
    assert!(matches!(back.optimizer.unwrap().decode(), Err(Error::OptimizerBlob { .. })));
    assert!(FileName::parse("e.h5").is_none());
}

/// The entries of a checkpoint as another format keeps them: every entry of `ckpt_pbg::PbgReader`, by name.
fn entries_of(dir: &Path) -> Vec<(String, Value)> {
    use ckpt_tensor::CheckpointRead;
    let ck = ckpt_pbg::PbgReader::open(dir).unwrap();
    ck.entries().into_iter().map(|e| (e.name.clone(), ck.value(&e.name).unwrap())).collect()
}

/// A committed two-entity checkpoint written with `CONFIG` (users in 2 partitions of 3 and 2 rows).
fn small_checkpoint(dir: &Path) {
    let storage = FileCheckpointStorage::new(dir);
    storage.prepare().unwrap();
    storage.save_config(CONFIG).unwrap();
    let mut c = storage.begin_commit().unwrap();
    c.partition("user", 0, partition(3, 1.0)).unwrap();
    c.partition("user", 1, partition(2, 2.0)).unwrap();
    c.partition("item", 0, partition(4, 3.0)).unwrap();
    let op = ModelParameter::new("rhs_operators.0.translation", Tensor::zeros(DType::F32, &[4]).unwrap()).unwrap();
    c.model(Model { parameters: Some(vec![op]), ..Model::default() });
    c.finish(&WriteOptions::default()).unwrap();
}

#[test]
fn save_from_entries_repartitions_and_keeps_rows_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    small_checkpoint(&src);
    let entries = entries_of(&src);
    let rows = |dir: &Path, entity: &str| -> (Vec<usize>, Vec<f32>, Vec<f32>) {
        let ck = ckpt_pbg::PbgReader::open(dir).unwrap();
        let parts: Vec<_> = ck.partitions().iter().filter(|p| p.entity == entity).collect();
        let sizes = parts.iter().map(|p| p.data.len()).collect();
        let embs = parts.iter().flat_map(|p| p.data.embeddings.to_vec::<f32>().unwrap()).collect();
        let sums = parts.iter().flat_map(|p| p.optimizer.as_ref().unwrap().sum(0).unwrap().to_vec::<f32>().unwrap());
        (sizes, embs, sums.collect())
    };
    // The same layout: a copy, every entry used.
    let same = tmp.path().join("same");
    let report = ckpt_pbg::save(&entries, &same, &WriteOptions::default()).unwrap();
    assert_eq!(report.dropped.len(), 0);
    assert_eq!(ckpt_pbg::PbgReader::open(&same).unwrap().version(), 1);
    assert_eq!(report.tensors + report.values, entries.len(), "{report:?}");
    assert!(report.files.iter().all(|f| f.is_file()) && report.files.len() >= 4, "{report:?}");
    assert_eq!(rows(&same, "user"), rows(&src, "user"));
    // Users in 3 partitions: 5 rows cut 2 + 2 + 1, rows and optimizer sums in order.
    let config = ckpt_pbg::Config::parse(&CONFIG.replace("\"num_partitions\": 2", "\"num_partitions\": 3")).unwrap();
    let three = tmp.path().join("three");
    ckpt_pbg::save(&entries, &three, &WriteOptions::default().with_config(config)).unwrap();
    let (sizes, embs, sums) = rows(&three, "user");
    let (_, want_embs, want_sums) = rows(&src, "user");
    assert_eq!((sizes, embs, sums), (vec![2, 2, 1], want_embs, want_sums));
    // Names nested under `model` (an hfai checkpoint's), unknown names dropped.
    let mut nested: Vec<(String, Value)> = entries.iter().map(|(n, v)| (format!("model.{n}"), v.clone())).collect();
    nested.push(("epoch".into(), Value::Int(3)));
    let n = tmp.path().join("nested");
    let report = ckpt_pbg::save(&nested, &n, &WriteOptions::default()).unwrap();
    assert_eq!(report.dropped, ["epoch"]);
    assert_eq!(rows(&n, "user"), rows(&src, "user"));
    // The target already holds a checkpoint.
    assert!(matches!(ckpt_pbg::save(&entries, &same, &WriteOptions::default()), Err(Error::AlreadyExists { .. })));
}

#[test]
fn save_rebuilds_optimizer_state_from_tensors_only() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    small_checkpoint(&src);
    // Only the tensors, as a plain safetensors file keeps them, plus the config text.
    let mut entries: Vec<(String, Value)> =
        entries_of(&src).into_iter().filter(|(n, v)| v.as_tensor().is_some() || n == "config").collect();
    let dst = tmp.path().join("dst");
    ckpt_pbg::save(&entries, &dst, &WriteOptions::default()).unwrap();
    let ck = ckpt_pbg::PbgReader::open(&dst).unwrap();
    let lr = ck.config().unwrap().lr();
    for p in ck.partitions() {
        let sd = p.optimizer.as_ref().unwrap();
        assert_eq!(sd.lr(0), Some(lr), "RowAdagrad with the config's lr");
        assert_eq!(sd.sum(0).unwrap().shape(), [p.data.len()]);
    }
    // Without a config, or without anything PBG holds, or in another layout: refused before writing.
    entries.retain(|(n, _)| n != "config");
    let e = ckpt_pbg::save(&entries, tmp.path().join("a"), &WriteOptions::default()).unwrap_err();
    assert!(matches!(e, Error::NoConfig), "{e}");
    let none = [("w".to_owned(), Value::Int(1))];
    let e = ckpt_pbg::save(&none, tmp.path().join("b"), &WriteOptions::default()).unwrap_err();
    assert!(matches!(e, Error::NoEmbeddings), "{e}");
    let dim8 = ckpt_pbg::Config::parse(&CONFIG.replace("\"dimension\": 4", "\"dimension\": 8")).unwrap();
    let e = ckpt_pbg::save(&entries, tmp.path().join("c"), &WriteOptions::default().with_config(dim8)).unwrap_err();
    assert!(matches!(&e, Error::LayoutMismatch { reason } if reason.contains("[N, 8]")), "{e}");
    assert!(["a", "b", "c"].iter().all(|d| !tmp.path().join(d).exists()));
}

#[test]
fn config_paths_resolve_from_the_working_directory_then_where_training_ran() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    fs::create_dir_all(run.join("data")).unwrap();
    // CONFIG names `entity_path` "data" and `checkpoint_path` "ckpt".
    fs::write(run.join("config.json"), CONFIG).unwrap();
    small_checkpoint(&run.join("ckpt"));
    // A config file: paths against its directory (the working directory has no `data`).
    let from_file = ckpt_pbg::ConfigFile::locate(&run.join("config.json")).unwrap();
    assert_eq!(from_file.checkpoint_dir(), run.join("ckpt"));
    assert_eq!(from_file.entity_path(), Some(run.join("data")));
    // A checkpoint directory: its config.json, paths against the directory training ran in (its parent).
    let from_dir = ckpt_pbg::ConfigFile::locate(&run.join("ckpt")).unwrap();
    assert_eq!(from_dir.file(), run.join("ckpt/config.json"));
    assert_eq!(from_dir.checkpoint_dir(), run.join("ckpt"));
    assert_eq!(from_dir.entity_path(), Some(run.join("data")));
    // Absolute paths are taken as they are.
    let abs = tmp.path().join("elsewhere");
    assert_eq!(from_dir.resolve(abs.to_str().unwrap()), abs);
    assert!(matches!(ckpt_pbg::ConfigFile::locate(tmp.path()), Err(Error::CouldNotLoad { .. })));
}

/// `save` writes the checksum manifest (every file, read back once); a later commit keeps it current:
/// the new version's files added, the dropped version's removed; a flipped bit is caught.
#[test]
fn save_writes_a_checksum_manifest_that_commits_keep_current() {
    use ckpt_io::Manifest;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    small_checkpoint(&src);
    let dst = tmp.path().join("dst");
    ckpt_pbg::save(&entries_of(&src), &dst, &WriteOptions::default()).unwrap();
    let listed = |dir: &Path| Manifest::read(dir).unwrap().unwrap().files.keys().cloned().collect::<Vec<_>>();
    let files = |dir: &Path| {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".h5") || n == "config.json")
            .collect();
        v.sort();
        v
    };
    assert_eq!(listed(&dst), files(&dst));
    assert!(Manifest::read(&dst).unwrap().unwrap().verify_dir(&dst).unwrap().is_empty());

    let storage = FileCheckpointStorage::new(&dst);
    let mut c = storage.begin_commit().unwrap();
    c.partition("user", 0, partition(3, 7.0)).unwrap();
    c.finish(&WriteOptions::default()).unwrap();
    assert_eq!(storage.load_version().unwrap(), 2);
    assert_eq!(listed(&dst), files(&dst), "v2 files listed, v1 files gone from the manifest");
    assert!(listed(&dst).iter().all(|n| !n.contains(".v1.")), "{:?}", listed(&dst));
    let bad = Manifest::read(&dst).unwrap().unwrap().verify_dir(&dst).unwrap();
    assert!(bad.is_empty(), "{bad:?}");

    let f = dst.join("embeddings_user_0.v2.h5");
    let mut bytes = fs::read(&f).unwrap();
    let at = bytes.len() - 20;
    bytes[at] ^= 1;
    fs::write(&f, &bytes).unwrap();
    let bad = Manifest::read(&dst).unwrap().unwrap().verify_dir(&dst).unwrap();
    assert_eq!(bad.len(), 1, "{bad:?}");
}
