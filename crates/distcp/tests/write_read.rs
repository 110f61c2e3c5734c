//! Writer options, multi-rank saves and reads, resharding regions, conversions: written by ckpt, read back
//! by ckpt.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use ckpt_collective::{Collective, ThreadGroup};
use ckpt_distcp::{
    DcpReader, Durability, Error, Metadata, Profile, ReadOptions, ShardSpec, WriteOptions, convert, save, save_rank,
    save_report, shard_box, verify,
};
use ckpt_tensor::{CheckpointRead, DType, Tensor, Value};

fn f32s(n: usize, shape: &[usize]) -> Tensor {
    Tensor::from_slice(&(0..n).map(|i| i as f32).collect::<Vec<_>>(), shape).unwrap()
}

fn sample() -> Value {
    let grid = f32s(24, &[4, 6]);
    Value::dict([
        (
            "model",
            Value::dict([("w", Value::Tensor(f32s(12, &[3, 4]))), ("t", Value::Tensor(grid.transpose(0, 1).unwrap()))]),
        ),
        ("col", Value::Tensor(grid.narrow(1, 3, 1).unwrap())),
        ("scalar", Value::Tensor(Tensor::from_slice(&[2.5f64], &[]).unwrap())),
        ("empty", Value::Tensor(Tensor::zeros(DType::I32, &[0, 2]).unwrap())),
        (
            "opt",
            Value::dict([("lr", Value::Float(0.5)), ("names", Value::List(vec![Value::from("a"), Value::from("b")]))]),
        ),
        ("step", Value::Int(11)),
    ])
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

fn metadata(dir: &Path) -> Metadata {
    let p = dir.join(".metadata");
    Metadata::from_pickle(&fs::read(&p).unwrap(), &p).unwrap()
}

#[test]
fn every_option_round_trips() {
    let sd = sample();
    for (name, options) in [
        ("default", WriteOptions::default()),
        ("213", WriteOptions::default().with_profile(Profile::Torch213)),
        ("zstd", WriteOptions::default().with_zstd(3)),
        ("zstd-213", WriteOptions::default().with_profile(Profile::Torch213).with_zstd(1)),
        ("three-files", WriteOptions::default().with_thread_count(3)),
        ("per-item", WriteOptions::default().with_single_file_per_rank(false)),
        ("no-sync", WriteOptions::default().with_durability(Durability::default().with_sync(false))),
        ("no-checksums", WriteOptions::default().with_durability(Durability::default().with_checksums(false))),
    ] {
        let d = tempfile::tempdir().unwrap();
        let report = save(&sd, d.path(), &options).unwrap();
        let md = metadata(d.path());
        assert_eq!(save_report(&md, d.path()), report, "{name}: the report is what .metadata describes");
        assert!(report.files.iter().all(|f| f.exists()), "{name}: {:?}", report.files);
        assert_eq!(d.path().join(ckpt_io::MANIFEST_NAME).exists(), name != "no-checksums", "{name}");
        let r = DcpReader::open(d.path()).unwrap();
        assert_eq!(r.state_dict().unwrap(), sd, "{name}");
        assert!(verify(d.path()).unwrap().is_ok(), "{name}");
        assert!(!d.path().join(".metadata.tmp").exists(), "{name}");
        let transforms = md.storage_data.iter().all(|(_, s)| s.transform_descriptors == ["stream.zstd/1"]);
        assert_eq!(transforms, name.starts_with("zstd"), "{name}");
        const SUMS: &str = "ckpt.checksums.json";
        match name {
            "three-files" => {
                assert_eq!(files(d.path()), [".metadata", "__0_0.distcp", "__0_1.distcp", "__0_2.distcp", SUMS])
            }
            "per-item" => assert_eq!(files(d.path()).len(), 2 + md.storage_data.len()),
            "no-checksums" => assert_eq!(files(d.path()), [".metadata", "__0_0.distcp"], "{name}"),
            _ => assert_eq!(files(d.path()), [".metadata", "__0_0.distcp", SUMS], "{name}"),
        }
        // The checksum manifest covers every file but itself, one chunk per item, and verifies.
        if name != "no-checksums" {
            let sums = ckpt_io::Manifest::read(d.path()).unwrap().unwrap();
            assert_eq!(sums.files.len(), files(d.path()).len() - 1, "{name}");
            assert!(sums.verify_dir(d.path()).unwrap().is_empty(), "{name}");
            for (_, info) in &md.storage_data {
                let chunk = sums.chunk_at(&info.relative_path, info.offset).unwrap();
                assert_eq!(chunk.length, info.length, "{name}: one chunk per item");
            }
        }
        if name == "213" || name == "zstd-213" {
            assert_eq!(md.version.as_deref(), Some("1.0.0"));
            let sm = md.storage_meta.as_ref().unwrap();
            assert_eq!(sm.checkpoint_id, Value::Str(d.path().to_string_lossy().into_owned()));
            assert_eq!(sm.save_id.as_ref().unwrap().len(), 36);
            assert_eq!(r.writer_hint(), "torch 2.9-2.14");
        } else {
            assert!(md.storage_meta.is_none() && md.version.is_none());
            assert!(r.writer_hint().contains("maximum-compatibility"));
        }
        // the transposed tensor keeps its strides; the column view was cloned to its own storage
        let t = r.read_tensor("model.t").unwrap();
        assert_eq!(t.strides(), &[1, 6], "{name}");
        assert_eq!(r.read_chunk("col", 0).unwrap().storage().len(), 16, "{name}");
    }
}

#[test]
fn empty_buckets_and_empty_state_dicts() {
    let d = tempfile::tempdir().unwrap();
    let one = Value::dict([("w", Value::Tensor(f32s(4, &[4])))]);
    save(&one, d.path(), &WriteOptions::default().with_thread_count(3)).unwrap();
    let sizes: Vec<u64> = ["__0_0.distcp", "__0_1.distcp", "__0_2.distcp"]
        .iter()
        .map(|f| fs::metadata(d.path().join(f)).unwrap().len())
        .collect();
    assert!(sizes[0] > 0 && sizes[1] == 0 && sizes[2] == 0, "{sizes:?}");
    let d = tempfile::tempdir().unwrap();
    save(&Value::dict::<&str>([]), d.path(), &WriteOptions::default()).unwrap();
    assert_eq!(fs::metadata(d.path().join("__0_0.distcp")).unwrap().len(), 0);
    let r = DcpReader::open(d.path()).unwrap();
    assert_eq!(r.keys().count(), 0);
    assert_eq!(r.state_dict().unwrap(), Value::dict::<&str>([]));
}

#[test]
fn overwrite_and_unwritable_values() {
    let d = tempfile::tempdir().unwrap();
    save(&sample(), d.path(), &WriteOptions::default()).unwrap();
    let again = save(&sample(), d.path(), &WriteOptions::default().with_overwrite(false));
    assert!(matches!(again, Err(Error::AlreadyExists { .. })));
    let other = Value::dict([("x", Value::Int(1))]);
    save(&other, d.path(), &WriteOptions::default()).unwrap();
    assert_eq!(DcpReader::open(d.path()).unwrap().state_dict().unwrap(), other);

    let opaque = ckpt_tensor::Object {
        callable: Value::Global { module: "torch._utils".into(), name: "_rebuild_sparse_tensor".into() },
        args: Value::Tuple(vec![]),
        newobj: false,
        state: None,
        list_items: vec![],
        dict_items: vec![],
    };
    let bad = Value::dict([(
        "s",
        Value::OpaqueTensor { kind: ckpt_tensor::OpaqueTensorKind::Sparse, object: Box::new(opaque) },
    )]);
    let e = save(&bad, tempfile::tempdir().unwrap().path(), &WriteOptions::default()).unwrap_err();
    assert!(matches!(e, Error::Unwritable { key, .. } if key == "s"));
    let e = save(&sample(), tempfile::tempdir().unwrap().path(), &WriteOptions::default().with_thread_count(0))
        .unwrap_err();
    assert!(matches!(e, Error::Unwritable { .. }));
    let shards = HashMap::from([("step".to_string(), ShardSpec::new(&[4], &[0]))]);
    let e = save_rank(
        &sample(),
        &shards,
        tempfile::tempdir().unwrap().path(),
        &WriteOptions::default(),
        &ckpt_collective::SingleProcess,
    )
    .unwrap_err();
    assert!(matches!(e, Error::Unwritable { key, .. } if key == "step"));
}

/// Runs `f(rank_group)` on `world` threads and returns each rank's result.
fn ranks<T: Send>(world: usize, f: impl Fn(ThreadGroup) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ThreadGroup::new(world).into_iter().map(|g| s.spawn(|| f(g))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_failing_rank_fails_the_save_everywhere() {
    let d = tempfile::tempdir().unwrap();
    let results = ranks(3, |g| {
        let t = f32s(4, &[2, 2]);
        let sd = Value::dict([("w", Value::Tensor(t))]);
        // rank 1 claims a box outside the tensor
        let off = if g.rank() == 1 { [3, 0] } else { [2 * (g.rank() / 2), 0] };
        let shards = HashMap::from([("w".to_string(), ShardSpec::new(&[4, 2], &off))]);
        save_rank(&sd, &shards, d.path(), &WriteOptions::default(), &g)
    });
    assert!(matches!(&results[0], Err(Error::RankFailed { rank: 1, .. })));
    assert!(matches!(&results[1], Err(Error::Unwritable { .. })));
    assert!(matches!(&results[2], Err(Error::RankFailed { rank: 1, .. })));
    assert!(!d.path().join(".metadata").exists());
    // overlapping shards are refused by every rank, before anything is written
    let d = tempfile::tempdir().unwrap();
    let results = ranks(2, |g| {
        let sd = Value::dict([("w", Value::Tensor(f32s(6, &[3, 2])))]);
        let shards = HashMap::from([("w".to_string(), ShardSpec::new(&[5, 2], &[2 * g.rank(), 0]))]);
        save_rank(&sd, &shards, d.path(), &WriteOptions::default(), &g)
    });
    for r in results {
        assert!(matches!(r, Err(Error::OverlappingChunks { .. })));
    }
    assert!(files(d.path()).is_empty());
}

#[test]
fn replicated_items_are_written_once() {
    let d = tempfile::tempdir().unwrap();
    let mds = ranks(4, |g| {
        let sd = Value::dict([
            ("rep", Value::Tensor(f32s(8, &[8]))),
            ("big", Value::Tensor(f32s(64, &[64]))),
            ("cfg", Value::dict([("name", Value::from("x"))])),
        ]);
        save_rank(&sd, &HashMap::new(), d.path(), &WriteOptions::default(), &g).unwrap()
    });
    assert!(mds.iter().all(|r| *r == mds[0]), "every rank returns the whole checkpoint's report");
    assert_eq!((mds[0].tensors, mds[0].values, mds[0].files.len()), (2, 1, 4));
    let md = &metadata(d.path());
    assert_eq!(md.storage_data.len(), 3);
    // spread over ranks by accumulated bytes: big (256 B) to rank 0, rep to rank 1, cfg to rank 2
    let files: Vec<&str> = md.storage_data.iter().map(|(_, s)| s.relative_path.as_str()).collect();
    assert_eq!(files, ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]);
    let lowest = tempfile::tempdir().unwrap();
    let mds = ranks(2, |g| {
        let sd = Value::dict([("a", Value::Tensor(f32s(8, &[8]))), ("b", Value::Tensor(f32s(8, &[8])))]);
        let mut o = WriteOptions::default();
        o.dedup_to_lowest_rank = true;
        save_rank(&sd, &HashMap::new(), lowest.path(), &o, &g).unwrap()
    });
    assert_eq!(mds[0].files.len(), 2);
    assert!(metadata(lowest.path()).storage_data.iter().all(|(_, s)| s.relative_path == "__0_0.distcp"));
}

/// A small deterministic generator (xorshift) for the randomized resharding test.
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

#[test]
fn random_layouts_reshard_to_random_regions() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..24 {
        let ndim = 1 + rng.next(3);
        let shape: Vec<usize> = (0..ndim).map(|_| rng.next(7)).collect();
        let numel: usize = shape.iter().product();
        let world = 1 + rng.next(4);
        let dim = rng.next(ndim);
        let dtype_pick = rng.next(3);
        let full = match dtype_pick {
            0 => f32s(numel, &shape),
            1 => Tensor::from_slice(&(0..numel as i64).collect::<Vec<_>>(), &shape).unwrap(),
            _ => Tensor::from_slice(&(0..numel).map(|i| i as u8).collect::<Vec<_>>(), &shape).unwrap(),
        };
        let d = tempfile::tempdir().unwrap();
        let zstd = round % 5 == 0;
        ranks(world, |g| {
            let (off, len) = shard_box(&shape, dim, g.rank(), world);
            let local = full.region(&off, &len).unwrap();
            let sd = Value::dict([("x", Value::Tensor(local))]);
            let shards = HashMap::from([("x".to_string(), ShardSpec::new(&shape, &off))]);
            let mut o = WriteOptions::default().with_durability(Durability::default().with_sync(false));
            if zstd {
                o = o.with_zstd(1);
            }
            save_rank(&sd, &shards, d.path(), &o, &g).unwrap();
        });
        for mmap in [true, false] {
            let r = DcpReader::open_with(d.path(), &ReadOptions::default().with_mmap(mmap)).unwrap();
            let t = r.read_tensor("x").unwrap();
            let ctx = format!(
                "round {round}: {shape:?} world {world} dim {dim} {:?}",
                r.tensor_metadata("x").unwrap().chunks
            );
            assert_eq!(t.data().unwrap_or_else(|e| panic!("{ctx}: {t:?}: {e}")), full.data().unwrap(), "{ctx}");
            for _ in 0..6 {
                let off: Vec<usize> = shape.iter().map(|&s| rng.next(s + 1)).collect();
                let len: Vec<usize> = shape.iter().zip(&off).map(|(&s, &o)| rng.next(s - o + 1)).collect();
                let got = r.read_region("x", &off, &len).unwrap();
                let want = full.region(&off, &len).unwrap();
                assert_eq!(got.shape(), len.as_slice());
                if want.numel() > 0 {
                    // (ckpt-tensor's data() rejects empty views whose offset lies past their storage)
                    assert_eq!(got.data().unwrap(), want.data().unwrap(), "round {round}: {off:?} {len:?}");
                }
            }
        }
    }
}

#[test]
fn regions_inside_one_chunk_are_views_of_the_map() {
    let d = tempfile::tempdir().unwrap();
    let full = f32s(40, &[10, 4]);
    ranks(2, |g| {
        let (off, len) = shard_box(&[10, 4], 0, g.rank(), 2);
        let sd = Value::dict([("x", Value::Tensor(full.region(&off, &len).unwrap()))]);
        let shards = HashMap::from([("x".to_string(), ShardSpec::new(&[10, 4], &off))]);
        save_rank(&sd, &shards, d.path(), &WriteOptions::default(), &g).unwrap();
    });
    let r = DcpReader::open(d.path()).unwrap();
    let inside = r.read_region("x", &[6, 1], &[3, 2]).unwrap();
    assert!(inside.storage().is_mapped());
    assert_eq!(inside.to_vec::<f32>().unwrap(), vec![25.0, 26.0, 29.0, 30.0, 33.0, 34.0]);
    let across = r.read_region("x", &[4, 0], &[2, 4]).unwrap();
    assert!(!across.storage().is_mapped());
    assert_eq!(across.to_vec::<f32>().unwrap(), (16..24).map(|i| i as f32).collect::<Vec<_>>());
    let unmapped = DcpReader::open_with(d.path(), &ReadOptions::default().with_mmap(false)).unwrap();
    assert!(!unmapped.read_region("x", &[6, 1], &[3, 2]).unwrap().storage().is_mapped());
}

#[test]
fn checkpoint_read_trait() {
    let d = tempfile::tempdir().unwrap();
    save(&sample(), d.path(), &WriteOptions::default()).unwrap();
    let r = DcpReader::open(d.path()).unwrap();
    let entries = r.entries();
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["model.w", "model.t", "col", "scalar", "empty", "opt.lr", "opt.names", "step"]);
    let w = entries[0].tensor_info().unwrap();
    assert_eq!((w.dtype, w.shape.as_slice(), w.nbytes()), (DType::F32, &[3usize, 4][..], 48));
    assert!(entries[5].tensor_info().is_none());
    let details: HashMap<String, String> = r.details().into_iter().collect();
    assert_eq!(details["tensors"], "5");
    assert_eq!(details["objects"], "3");
    assert_eq!(details["data files"], "1");
    assert!(details["metadata"].contains("protocol 2"));
    assert_eq!(CheckpointRead::value(&r, "step").unwrap(), Value::Int(11));
    assert!(CheckpointRead::tensor(&r, "step").is_err());
    assert_eq!(r.format_name(), "distcp");
}

fn r_value(dir: &std::path::Path, key: &str) -> Value {
    DcpReader::open(dir).unwrap().read_value(key).unwrap()
}

#[test]
fn conversions() {
    let d = tempfile::tempdir().unwrap();
    let sd = sample();
    save(&sd, d.path(), &WriteOptions::default()).unwrap();
    let out = tempfile::tempdir().unwrap();

    let pt = out.path().join("model.pt");
    let report = convert::dcp_to_torch_save(d.path(), &pt, &ckpt_torch::WriteOptions::default()).unwrap();
    assert_eq!(report.tensors, 5);
    let back = ckpt_torch::load(&pt).unwrap();
    let flat = |v: &Value| -> Vec<(String, Vec<u8>)> {
        ckpt_tensor::flatten(v)
            .unwrap()
            .into_iter()
            .map(|e| {
                (
                    e.key,
                    e.value
                        .as_tensor()
                        .map(|t| t.data().unwrap().to_vec())
                        .unwrap_or_else(|| format!("{:?}", e.value).into_bytes()),
                )
            })
            .collect()
    };
    assert_eq!(flat(&back), flat(&sd));
    // back to DCP
    let again = out.path().join("again");
    convert::torch_save_to_dcp(&pt, &again, &WriteOptions::default()).unwrap();
    assert_eq!(flat(&DcpReader::open(&again).unwrap().state_dict().unwrap()), flat(&sd));

    // a value of any kind goes through the one torch writer
    let odd = tempfile::tempdir().unwrap();
    let with_set = Value::dict([("w", Value::Tensor(f32s(3, &[3]))), ("tags", Value::Set(vec![Value::from("a")]))]);
    save(&with_set, odd.path(), &WriteOptions::default()).unwrap();
    convert::dcp_to_torch_save(odd.path(), &out.path().join("odd.pt"), &ckpt_torch::WriteOptions::default()).unwrap();
    assert_eq!(ckpt_torch::load(&out.path().join("odd.pt")).unwrap(), with_set);

    let st = out.path().join("model.safetensors");
    let report = convert::dcp_to_safetensors(d.path(), &st, &ckpt_io::Durability::default()).unwrap();
    // ckpt's safetensors convention: every value is kept in `ckpt.values`, in its typed encoding.
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert_eq!(ckpt_safetensors::read_file(&st).unwrap().value("opt.names").unwrap(), r_value(d.path(), "opt.names"));
    let file = ckpt_safetensors::read_file(&st).unwrap();
    assert_eq!(file.metadata.as_ref().unwrap()["format"], "pt");
    assert_eq!(file.value("step").unwrap(), Value::Int(11));
    let r = DcpReader::open(d.path()).unwrap();
    for (name, t) in &file.tensors {
        assert_eq!(t.data().unwrap(), r.read_tensor(name).unwrap().data().unwrap(), "{name}");
    }

    let hf = out.path().join("hf");
    let report =
        convert::dcp_to_hf(d.path(), &hf, &ckpt_safetensors::hf::WriteOptions::default().with_max_shard_size(64))
            .unwrap();
    assert!(report.files.len() >= 3);
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(hf.join("model.safetensors.index.json")).unwrap()).unwrap();
    assert_eq!(index["metadata"]["total_size"], 48 + 96 + 16 + 8);
    let rh = DcpReader::open(&hf).unwrap();
    assert_eq!(rh.read_tensor("model.t").unwrap().data().unwrap(), r.read_tensor("model.t").unwrap().data().unwrap());

    let c = tempfile::tempdir().unwrap();
    save(
        &Value::dict([("z", Value::Tensor(Tensor::zeros(DType::C128, &[2]).unwrap()))]),
        c.path(),
        &WriteOptions::default(),
    )
    .unwrap();
    assert!(
        matches!(convert::dcp_to_safetensors(c.path(), &out.path().join("c.safetensors"), &Default::default()), Err(Error::Unwritable { key, .. }) if key == "z")
    );
}

#[test]
fn metadata_encodings_round_trip() {
    let d = tempfile::tempdir().unwrap();
    save(
        &sample(),
        d.path(),
        &WriteOptions::default().with_profile(Profile::Torch213).with_storage_meta("id", "/abs/ckpt"),
    )
    .unwrap();
    let md = metadata(d.path());
    let p = Path::new("x");
    let back = Metadata::from_pickle(&md.to_pickle(Profile::Torch213).unwrap(), p).unwrap();
    assert_eq!(back, md);
    let compat = Metadata::from_pickle(&md.to_pickle(Profile::MaxCompat).unwrap(), p).unwrap();
    assert!(compat.storage_meta.is_none() && compat.version.is_none());
    assert_eq!(compat.state_dict_metadata.len(), md.state_dict_metadata.len());
    assert!(compat.state_dict_metadata.iter().filter_map(|(_, m)| m.as_tensor()).all(|t| t.properties.legacy_class));
    assert_eq!(md.storage_meta.as_ref().unwrap().checkpoint_id, Value::from("/abs/ckpt"));
    // protocols 3 and 5 use the same opcodes (CPython 3.14 writes protocol 5)
    for (profile, proto) in [(Profile::MaxCompat, 3u8), (Profile::Torch213, 5)] {
        let mut bytes = md.to_pickle(profile).unwrap();
        bytes[1] = proto;
        let again = Metadata::from_pickle(&bytes, p).unwrap();
        assert_eq!(again.state_dict_metadata.len(), md.state_dict_metadata.len(), "protocol {proto}");
        assert_eq!(again.storage_data.len(), md.storage_data.len(), "protocol {proto}");
    }
}

/// `storage_meta.checkpoint_id` as CPython 3.11/3.12 (`PosixPath(*parts)`) and 3.13 (`pathlib._local
/// .PosixPath(str)`) pickle it, and unknown objects inside `storage_meta`, decode without error.
#[test]
fn storage_meta_paths_of_every_python() {
    use ckpt_pickle::{Object, Value as P};
    const MD: &str = "torch.distributed.checkpoint.metadata";
    let obj =
        |m: &str, n: &str, state: P| P::from(Object::new_obj(P::global(m, n), P::Tuple(vec![])).with_state(state));
    for (id, want) in [
        (
            P::from(Object::reduce(
                P::global("pathlib", "PosixPath"),
                P::Tuple(vec![P::str("/"), P::str("ck"), P::str("c215")]),
            )),
            Value::from("/ck/c215"),
        ),
        (
            P::from(Object::reduce(P::global("pathlib._local", "PosixPath"), P::Tuple(vec![P::str("/ck/c215")]))),
            Value::from("/ck/c215"),
        ),
        (P::str("s3://bucket/x"), Value::from("s3://bucket/x")),
    ] {
        let sm = obj(
            MD,
            "StorageMeta",
            P::Dict(vec![
                (P::str("checkpoint_id"), id),
                (P::str("save_id"), P::str("u")),
                (P::str("load_id"), P::None),
                (P::str("extra"), obj("some.module", "Thing", P::Dict(vec![]))),
            ]),
        );
        let root = obj(
            MD,
            "Metadata",
            P::Dict(vec![
                (P::str("state_dict_metadata"), P::Dict(vec![])),
                (P::str("planner_data"), P::Dict(vec![])),
                (P::str("storage_data"), P::Dict(vec![])),
                (P::str("storage_meta"), sm),
            ]),
        );
        for proto in [2, 4, 5] {
            let md = Metadata::from_pickle(&ckpt_pickle::encode(&root, proto).unwrap(), Path::new("m")).unwrap();
            assert_eq!(md.storage_meta.as_ref().unwrap().checkpoint_id, want);
        }
    }
}

/// `save_ranks` reports the failing rank's own error, not the "another rank failed" of the others, and
/// writes no `.metadata`.
#[test]
fn save_ranks_reports_the_root_cause() {
    use ckpt_distcp::{ShardSpec, save_ranks};
    let dir = tempfile::tempdir().unwrap();
    let ok = Tensor::from_slice(&[1.0f32; 5], &[5]).unwrap();
    let too_big = Tensor::from_slice(&[1.0f32; 20], &[20]).unwrap();
    let ranks = vec![
        (Value::dict([("w", Value::Tensor(ok))]), HashMap::from([("w".to_string(), ShardSpec::new(&[10], &[0]))])),
        (Value::dict([("w", Value::Tensor(too_big))]), HashMap::from([("w".to_string(), ShardSpec::new(&[10], &[5]))])),
    ];
    let err = save_ranks(&ranks, dir.path(), &WriteOptions::default()).unwrap_err();
    assert!(!matches!(err, ckpt_distcp::Error::RankFailed { .. }), "{err:?}");
    assert!(!dir.path().join(".metadata").exists());
    assert!(save_ranks(&[], dir.path(), &WriteOptions::default()).is_err());
}

/// Every entry of a state dict by flattened key, in key order: tensors as their row-major bytes.
fn entries(v: &Value) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = ckpt_tensor::flatten(v)
        .unwrap()
        .into_iter()
        .map(|e| {
            let bytes = match e.value.as_tensor() {
                Some(t) => t.data().unwrap().to_vec(),
                None => format!("{:?}", e.value).into_bytes(),
            };
            (e.key, bytes)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn save_sharded_splits_rows_and_replicates_the_rest() {
    let sd = sample();
    // 3 ranks: `model.w` (3 rows) and `model.t` (6 rows) are split, `col` (4 rows) too; `scalar` (0-d),
    // `empty` (0 rows < 3) and the values are replicated and written once.
    let dir = tempfile::tempdir().unwrap();
    ckpt_distcp::save_sharded(&sd, dir.path(), 3, &WriteOptions::default()).unwrap();
    let r = DcpReader::open(dir.path()).unwrap();
    let chunks = |k: &str| r.tensor_metadata(k).unwrap().chunks.len();
    assert_eq!((chunks("model.w"), chunks("model.t"), chunks("col")), (3, 3, 3)); // col: 2 + 2 + 0 rows
    assert_eq!((chunks("scalar"), chunks("empty")), (1, 1));
    assert_eq!(entries(&r.state_dict().unwrap()), entries(&sd));
    assert_eq!(files(dir.path()).iter().filter(|f| f.ends_with(".distcp")).count(), 3);
    // Each rank's part on its own is what it would save in a 3-rank job.
    let (local, shards) = ckpt_distcp::shard_state_dict(&sd, 2, 3).unwrap();
    let w = local.as_dict().unwrap().get("model").unwrap().as_dict().unwrap().get("w").unwrap();
    assert_eq!(w.as_tensor().unwrap().shape(), [1, 4]);
    assert_eq!(shards["model.w"], ShardSpec::new(&[3, 4], &[2, 0]));
    assert!(!shards.contains_key("scalar") && !shards.contains_key("empty"));
    assert!(matches!(ckpt_distcp::shard_state_dict(&sd, 3, 3), Err(Error::Unwritable { .. })));
}

#[test]
fn reshard_reads_each_rank_box_and_keeps_every_entry() {
    let src = tempfile::tempdir().unwrap();
    let sd = sample();
    ckpt_distcp::save_sharded(&sd, src.path(), 2, &WriteOptions::default()).unwrap();
    for world in [1, 3, 5] {
        let dst = tempfile::tempdir().unwrap();
        let out = dst.path().join("new");
        ckpt_distcp::reshard(src.path(), &out, world, &ckpt_distcp::ReshardOptions::default()).unwrap();
        let r = DcpReader::open(&out).unwrap();
        assert_eq!(entries(&r.state_dict().unwrap()), entries(&sd), "world {world}");
        // Every tensor with a first dimension is split over the ranks (6 rows in 2-row pieces over 5 ranks:
        // 3 ranks hold rows).
        let holding = (0..world).filter(|&rank| shard_box(&[6, 4], 0, rank, world).1[0] > 0).count();
        assert!(r.tensor_metadata("model.t").unwrap().chunks.len() >= holding, "world {world}");
        let (part, _) = DcpReader::open(src.path()).unwrap().shard_state(world - 1, world).unwrap();
        let t = part.as_dict().unwrap().get("model").unwrap().as_dict().unwrap().get("t").unwrap();
        let (_, sizes) = shard_box(&[6, 4], 0, world - 1, world);
        assert_eq!(t.as_tensor().unwrap().shape(), sizes);
    }
    let e = ckpt_distcp::reshard(src.path(), src.path().join("x"), 0, &ckpt_distcp::ReshardOptions::default());
    assert!(matches!(e, Err(Error::Unwritable { .. })));
    assert!(!src.path().join("x").exists());
}
