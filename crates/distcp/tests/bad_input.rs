//! Bad input: every rule of the reader and the verifier fails with its own error, naming the key and the
//! file; nothing panics.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ckpt_tensor::FormatError;
use std::fs;
use std::path::Path;

use ckpt_distcp::{
    DcpReader, Error, Metadata, ProblemKind, Profile, ReadOptions, StorageMetadata, WriteOptions, save, verify,
};
use ckpt_pickle::{Object, Value as P};
use ckpt_tensor::{CheckpointRead, DType, Tensor, Value};

const MD: &str = "torch.distributed.checkpoint.metadata";

fn sample(dir: &Path) {
    let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let v = Tensor::from_slice(&[1i64, 2, 3, 4], &[4]).unwrap();
    let sd = Value::dict([
        ("model", Value::dict([("w", Value::Tensor(w)), ("v", Value::Tensor(v))])),
        ("step", Value::Int(3)),
    ]);
    save(&sd, dir, &WriteOptions::default()).unwrap();
}

fn metadata(dir: &Path) -> Metadata {
    let p = dir.join(".metadata");
    Metadata::from_pickle(&fs::read(&p).unwrap(), &p).unwrap()
}

fn rewrite(dir: &Path, f: impl FnOnce(&mut Metadata)) {
    let mut md = metadata(dir);
    f(&mut md);
    fs::write(dir.join(".metadata"), md.to_pickle(Profile::MaxCompat).unwrap()).unwrap();
}

fn tensor_md<'a>(md: &'a mut Metadata, key: &str) -> &'a mut ckpt_distcp::TensorStorageMetadata {
    match &mut md.state_dict_metadata.iter_mut().find(|(k, _)| k == key).unwrap().1 {
        StorageMetadata::Tensor(t) => t,
        StorageMetadata::Bytes => panic!("{key} is not a tensor"),
    }
}

fn open_err(dir: &Path) -> Error {
    DcpReader::open(dir).expect_err("the reader accepted bad input")
}

#[test]
fn truncated_metadata() {
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    let bytes = fs::read(d.path().join(".metadata")).unwrap();
    for cut in [0, 1, 2, 10, bytes.len() / 2, bytes.len() - 1] {
        fs::write(d.path().join(".metadata"), &bytes[..cut]).unwrap();
        match open_err(d.path()) {
            Error::MetadataPickle { path, .. } => assert!(path.ends_with(".metadata")),
            e => panic!("cut at {cut}: {e}"),
        }
    }
    // every prefix fails cleanly (no panic, no success)
    let path = d.path().join(".metadata");
    for cut in 0..bytes.len() {
        assert!(Metadata::from_pickle(&bytes[..cut], &path).is_err(), "prefix of {cut} bytes accepted");
    }
}

#[test]
fn item_past_end_of_file() {
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    rewrite(d.path(), |md| md.storage_data[1].1.length += 1_000_000);
    match open_err(d.path()) {
        Error::ItemOutOfFile { key, file, .. } => {
            assert_eq!(file, "__0_0.distcp");
            assert!(key == "model.w" || key == "model.v" || key == "step");
        }
        e => panic!("{e}"),
    }
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    rewrite(d.path(), |md| md.storage_data[0].1.offset = i64::MAX as u64 - 2);
    assert!(matches!(open_err(d.path()), Error::ItemOutOfFile { .. }));
}

#[test]
fn overlapping_and_missing_chunks() {
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    rewrite(d.path(), |md| {
        let t = tensor_md(md, "model.v");
        t.size = vec![6];
        t.chunks[0].offsets = vec![0];
        let mut second = t.chunks[0].clone();
        second.offsets = vec![2];
        t.chunks.push(second);
    });
    match open_err(d.path()) {
        Error::OverlappingChunks { key, a, b, .. } => assert_eq!((key.as_str(), a, b), ("model.v", 0, 1)),
        e => panic!("{e}"),
    }
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    rewrite(d.path(), |md| tensor_md(md, "model.v").size = vec![8]);
    match open_err(d.path()) {
        Error::IncompleteCoverage { key, covered, total } => {
            assert_eq!((key.as_str(), covered, total), ("model.v", 4, 8));
        }
        e => panic!("{e}"),
    }
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    rewrite(d.path(), |md| tensor_md(md, "model.v").chunks[0].sizes = vec![5]);
    assert!(matches!(open_err(d.path()), Error::ChunkOutOfBounds { chunk: 0, .. }));
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    rewrite(d.path(), |md| tensor_md(md, "model.w").chunks[0].offsets = vec![0]);
    assert!(matches!(open_err(d.path()), Error::ChunkRank { expected: 2, found: 1, .. }));
    // a chunk whose item is gone
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    rewrite(d.path(), |md| md.storage_data.retain(|(i, _)| i.fqn != "model.w"));
    match open_err(d.path()) {
        Error::MissingItem { key, offsets } => assert_eq!((key.as_str(), offsets), ("model.w", Some(vec![0, 0]))),
        e => panic!("{e}"),
    }
}

#[test]
fn paths_escaping_the_directory() {
    for bad in ["../__0_0.distcp", "/etc/passwd", "sub/../../x", ""] {
        let d = tempfile::tempdir().unwrap();
        sample(d.path());
        rewrite(d.path(), |md| md.storage_data[0].1.relative_path = bad.to_owned());
        match open_err(d.path()) {
            Error::UnsafePath { file, .. } => assert_eq!(file, bad),
            e => panic!("{bad:?}: {e}"),
        }
    }
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    rewrite(d.path(), |md| md.storage_data[0].1.relative_path = "__9_9.distcp".into());
    // A data file that does not exist is not a bad path: the checkpoint opens, lists it as missing, and only
    // the entries whose items it holds fail to read, naming it.
    let key = metadata(d.path()).storage_data[0].0.fqn.clone();
    let r = DcpReader::open(d.path()).unwrap();
    assert_eq!(r.missing_files().collect::<Vec<_>>(), ["__9_9.distcp"]);
    assert_eq!(r.unreadable(&key).as_deref(), Some("data file \"__9_9.distcp\" is missing"));
    assert!(matches!(r.read_value(&key), Err(Error::MissingFile { file, .. }) if file == "__9_9.distcp"));
}

fn obj(module: &str, name: &str, state: Option<P>) -> P {
    let o = Object::new_obj(P::global(module, name), P::Tuple(vec![]));
    P::from(match state {
        Some(s) => o.with_state(s),
        None => o,
    })
}

fn metadata_pickle(sdm: Vec<(P, P)>, storage_data: Vec<(P, P)>) -> Vec<u8> {
    let root = obj(
        MD,
        "Metadata",
        Some(P::Dict(vec![
            (P::str("state_dict_metadata"), P::Dict(sdm)),
            (P::str("planner_data"), P::None),
            (P::str("storage_data"), P::Dict(storage_data)),
        ])),
    );
    ckpt_pickle::encode(&root, 4).unwrap()
}

#[test]
fn unknown_class_where_a_dcp_class_belongs() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join(".metadata");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (metadata_pickle(vec![(P::str("x"), obj("os", "system", None))], vec![]), "state_dict_metadata[\"x\"]"),
        (ckpt_pickle::encode(&obj("builtins", "eval", Some(P::Dict(vec![]))), 2).unwrap(), "the pickled object"),
        (
            metadata_pickle(
                vec![],
                vec![(obj("evil", "MetadataIndex", Some(P::Dict(vec![]))), obj(MD, "BytesStorageMetadata", None))],
            ),
            "storage_data key #0",
        ),
        (
            metadata_pickle(
                vec![(
                    P::str("w"),
                    obj(
                        MD,
                        "TensorStorageMetadata",
                        Some(P::Dict(vec![
                            (P::str("properties"), obj("subprocess", "Popen", Some(P::Tuple(vec![])))),
                            (P::str("size"), P::Tuple(vec![])),
                            (P::str("chunks"), P::List(vec![])),
                        ])),
                    ),
                )],
                vec![],
            ),
            "state_dict_metadata[\"w\"].properties",
        ),
    ];
    for (bytes, where_) in cases {
        fs::write(&path, &bytes).unwrap();
        match open_err(d.path()) {
            Error::UnexpectedClass { context, found, .. } => {
                assert_eq!(context, where_);
                assert!(found.starts_with("an object of class") || found.starts_with("the global"), "{found}");
            }
            e => panic!("{where_}: {e}"),
        }
    }
    // malformed fields and unknown dtypes
    let w_props = |dtype: P| {
        obj(
            MD,
            "TensorProperties",
            Some(P::Tuple(vec![
                dtype,
                P::from(Object::reduce(
                    P::global("torch.serialization", "_get_layout"),
                    P::Tuple(vec![P::str("torch.strided")]),
                )),
                P::Bool(false),
                P::from(Object::reduce(P::global(MD, "_MEM_FORMAT_ENCODING"), P::Tuple(vec![P::Int(0)]))),
                P::Bool(false),
            ])),
        )
    };
    let tsm = |props: P, size: P| {
        obj(
            MD,
            "TensorStorageMetadata",
            Some(P::Dict(vec![
                (P::str("properties"), props),
                (P::str("size"), size),
                (P::str("chunks"), P::List(vec![])),
            ])),
        )
    };
    fs::write(
        &path,
        metadata_pickle(vec![(P::str("w"), tsm(w_props(P::global("torch", "float99")), P::Tuple(vec![])))], vec![]),
    )
    .unwrap();
    assert!(matches!(open_err(d.path()), Error::UnknownDType { name, .. } if name == "float99"));
    let size = P::Tuple(vec![P::Int(-1)]);
    fs::write(&path, metadata_pickle(vec![(P::str("w"), tsm(w_props(P::global("torch", "float32")), size))], vec![]))
        .unwrap();
    assert!(matches!(open_err(d.path()), Error::BadField { context, .. } if context.ends_with(".size")));
    let no_storage = obj(MD, "Metadata", Some(P::Dict(vec![(P::str("state_dict_metadata"), P::Dict(vec![]))])));
    fs::write(&path, ckpt_pickle::encode(&no_storage, 2).unwrap()).unwrap();
    assert!(matches!(open_err(d.path()), Error::MissingField { field: "storage_data", .. }));
    fs::write(&path, b"\x80\x04garbage").unwrap();
    assert!(matches!(open_err(d.path()), Error::MetadataPickle { .. }));
}

#[test]
fn bad_items() {
    // corrupt item bytes: open succeeds (metadata is fine), the read names key and file
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    let md = metadata(d.path());
    let (ix, info) = md.storage_data.iter().find(|(i, _)| i.fqn == "model.w").unwrap();
    let data = d.path().join(&info.relative_path);
    let mut bytes = fs::read(&data).unwrap();
    let at = info.offset as usize;
    bytes[at..at + 4].copy_from_slice(b"JUNK");
    fs::write(&data, &bytes).unwrap();
    let r = DcpReader::open(d.path()).unwrap();
    match r.read_tensor(&ix.fqn).unwrap_err() {
        Error::BadItem { key, file, .. } => assert_eq!((key.as_str(), file.as_str()), ("model.w", "__0_0.distcp")),
        e => panic!("{e}"),
    }
    assert_eq!(r.read_value("step").unwrap(), Value::Int(3), "other items stay readable");
    let report = verify(d.path()).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    let p = &report.problems[0];
    assert_eq!((p.kind, p.entry.as_deref()), (ProblemKind::Unreadable, Some("model.w")), "{p}");
    assert_eq!(p.file.as_deref(), Some(&*d.path().join("__0_0.distcp")));
}

#[test]
fn crc_mismatch_is_found_by_verify() {
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    let md = metadata(d.path());
    let (_, info) = md.storage_data.iter().find(|(i, _)| i.fqn == "model.v").unwrap();
    let data = d.path().join(&info.relative_path);
    let mut bytes = fs::read(&data).unwrap();
    // the last byte of the tensor's data record: 4 (int64 little-endian, high byte 0) — flip it
    let item = &bytes[info.offset as usize..(info.offset + info.length) as usize];
    let needle = [4u8, 0, 0, 0, 0, 0, 0, 0];
    let pos = item.windows(8).position(|w| w == needle).unwrap() + info.offset as usize;
    bytes[pos] = 9;
    fs::write(&data, &bytes).unwrap();
    // torch ignores CRCs, and so does the default read
    let r = DcpReader::open(d.path()).unwrap();
    assert_eq!(r.read_tensor("model.v").unwrap().to_vec::<i64>().unwrap(), vec![1, 2, 3, 9]);
    let strict = DcpReader::open_with(d.path(), &ReadOptions::default().with_verify_crc(true)).unwrap();
    assert!(matches!(strict.read_tensor("model.v"), Err(Error::BadItem { .. })));
    let report = verify(d.path()).unwrap();
    assert!(
        matches!(report.problems.as_slice(), [p] if p.kind == ProblemKind::ChecksumMismatch && p.entry.as_deref() == Some("model.v")),
        "{:?}",
        report.problems
    );
}

#[test]
fn item_disagreeing_with_its_chunk() {
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    rewrite(d.path(), |md| {
        let t = tensor_md(md, "model.v");
        t.size = vec![2, 2];
        t.chunks[0].offsets = vec![0, 0];
        t.chunks[0].sizes = vec![2, 2];
        for (ix, _) in &mut md.storage_data {
            if ix.fqn == "model.v" {
                ix.offset = Some(vec![0, 0]);
            }
        }
    });
    let r = DcpReader::open(d.path()).unwrap();
    match r.read_tensor("model.v").unwrap_err() {
        Error::ChunkShapeMismatch { expected, found, .. } => assert_eq!((expected, found), (vec![2, 2], vec![4])),
        e => panic!("{e}"),
    }
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    rewrite(d.path(), |md| tensor_md(md, "model.w").properties.dtype = DType::I32);
    assert!(matches!(
        DcpReader::open(d.path()).unwrap().read_tensor("model.w"),
        Err(Error::DTypeMismatch { expected: DType::I32, found: DType::F32, .. })
    ));
    // an object item where a tensor belongs
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    rewrite(d.path(), |md| {
        let step = md.storage_data.iter().find(|(i, _)| i.fqn == "step").unwrap().1.clone();
        for (ix, info) in &mut md.storage_data {
            if ix.fqn == "model.v" {
                *info = step.clone();
            }
        }
    });
    assert!(matches!(
        DcpReader::open(d.path()).unwrap().read_tensor("model.v"),
        Err(Error::ItemNotTensor { found, .. }) if found == "int"
    ));
}

#[test]
fn transforms() {
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    rewrite(d.path(), |md| md.storage_data[0].1.transform_descriptors = vec!["stream.lz4/1".into()]);
    let r = DcpReader::open(d.path()).unwrap();
    let key = r.metadata().storage_data[0].0.fqn.clone();
    assert!(
        matches!(r.read_value(&key), Err(Error::UnknownTransform { descriptor, .. }) if descriptor == "stream.lz4/1")
    );
    // not zstd data
    rewrite(d.path(), |md| md.storage_data[0].1.transform_descriptors = vec!["stream.zstd/1".into()]);
    assert!(matches!(DcpReader::open(d.path()).unwrap().read_value(&key), Err(Error::Zstd { .. })));
    // a zstd item that inflates past the limit
    let d = tempfile::tempdir().unwrap();
    let sd = Value::dict([("blob", Value::Bytes(vec![0; 1 << 20]))]);
    save(&sd, d.path(), &WriteOptions::default().with_zstd(3)).unwrap();
    let mut small = ReadOptions::default();
    small.max_object_bytes = 1 << 16;
    let r = DcpReader::open_with(d.path(), &small).unwrap();
    assert!(matches!(r.read_value("blob"), Err(Error::DecompressedTooLarge { limit: 65536, .. })));
    assert_eq!(
        DcpReader::open(d.path()).unwrap().read_value("blob").unwrap(),
        sd.as_dict().unwrap().get("blob").unwrap().clone()
    );
}

#[test]
fn not_a_checkpoint_and_bad_requests() {
    let d = tempfile::tempdir().unwrap();
    assert!(matches!(open_err(d.path()), Error::NotACheckpoint { .. }));
    assert!(matches!(open_err(&d.path().join("missing")), Error::Io { .. }));
    sample(d.path());
    let r = DcpReader::open(d.path()).unwrap();
    assert!(matches!(r.read_tensor("nope"), Err(Error::NoSuchEntry(_))));
    assert!(matches!(r.read_tensor("step"), Err(Error::NotATensor(_))));
    assert!(matches!(r.read_region("model.w", &[1, 0], &[2, 3]), Err(Error::RegionOutOfBounds { .. })));
    assert!(matches!(r.read_region("model.w", &[0], &[1]), Err(Error::RegionOutOfBounds { .. })));
    assert!(matches!(r.read_chunk("model.w", 5), Err(Error::NoSuchEntry(_))));
}

#[test]
fn verify_reports_every_problem() {
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    rewrite(d.path(), |md| {
        tensor_md(md, "model.v").size = vec![9];
        tensor_md(md, "model.w").chunks[0].sizes = vec![3, 3];
        md.storage_data.iter_mut().find(|(i, _)| i.fqn == "step").unwrap().1.relative_path = "../step".into();
    });
    let report = verify(d.path()).unwrap();
    let kinds: Vec<String> = report.problems.iter().map(|p| format!("{p}")).collect();
    assert_eq!(report.problems.len(), 3, "{kinds:#?}");
    let at = |kind: ProblemKind, key: &str, words: &str| {
        report.problems.iter().any(|p| p.kind == kind && p.entry.as_deref() == Some(key) && p.message.contains(words))
    };
    assert!(at(ProblemKind::Inconsistent, "step", "escapes"), "{kinds:#?}");
    assert!(at(ProblemKind::Inconsistent, "model.v", "cover"), "{kinds:#?}");
    assert!(at(ProblemKind::Inconsistent, "model.w", "outside"), "{kinds:#?}");
    assert!(kinds.iter().all(|k| k.contains("model.") || k.contains("step")), "messages name the key");
}

#[test]
fn per_rank_metadata_conflicts() {
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    let md = metadata(d.path());
    let mut other = md.clone();
    tensor_md(&mut other, "model.w").size = vec![4, 3];
    fs::remove_file(d.path().join(".metadata")).unwrap();
    fs::write(d.path().join("__0.metadata"), md.to_pickle(Profile::MaxCompat).unwrap()).unwrap();
    fs::write(d.path().join("__1.metadata"), other.to_pickle(Profile::MaxCompat).unwrap()).unwrap();
    assert!(matches!(open_err(d.path()), Error::MergeConflict { key, .. } if key == "model.w"));
    // identical rank files merge into one view
    fs::write(d.path().join("__1.metadata"), md.to_pickle(Profile::Torch213).unwrap()).unwrap();
    let r = DcpReader::open(d.path()).unwrap();
    assert_eq!(r.tensor_metadata("model.w").unwrap().chunks.len(), 1);
    assert_eq!(r.read_value("step").unwrap(), Value::Int(3));
}

/// `ReadOptions::max_metadata_bytes`: a `.metadata` over it is `MetadataTooLarge` (a limit) before it is read,
/// from opening and verifying; at its size, it opens.
#[test]
fn metadata_size_limit() {
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    let len = fs::metadata(d.path().join(".metadata")).unwrap().len();
    let tight = ReadOptions::default().with_max_metadata_bytes(len - 1);
    let e = DcpReader::open_with(d.path(), &tight).unwrap_err();
    assert!(matches!(&e, Error::MetadataTooLarge { len: l, limit, .. } if *l == len && *limit == len - 1), "{e}");
    assert_eq!(e.fault(), ckpt_tensor::Fault::Limit);
    assert!(matches!(ckpt_distcp::verify_structure_with(d.path(), &tight), Err(Error::MetadataTooLarge { .. })));
    assert!(matches!(ckpt_distcp::verify_with(d.path(), &tight), Err(Error::MetadataTooLarge { .. })));
    let exact = ReadOptions::default().with_max_metadata_bytes(len);
    assert!(DcpReader::open_with(d.path(), &exact).is_ok());
    assert!(ckpt_distcp::verify_with(d.path(), &exact).unwrap().problems.is_empty());
}
