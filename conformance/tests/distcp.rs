//! DCP conformance: every golden checkpoint written by torch 2.0.1 … 2.15.0 reads to the values its README
//! gives; fresh torch 2.13 checkpoints (single process, 2 and 3 ranks) read as their manifests say;
//! checkpoints written by ckpt load in torch 2.13 (`dcp.load`, `dcp_to_torch_save`) to equal values; the
//! torch 2.13 profile reproduces torch 2.13's own files byte for byte; regions reshard 3 ranks into 2.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use ckpt_conformance::{fixtures, run_python, typed_tree};
use ckpt_distcp::{
    DcpReader, Metadata, MetadataSource, Profile, ShardSpec, StorageMetadata, WriteOptions, save, save_rank, shard_box,
    verify,
};
use ckpt_tensor::{CheckpointRead, DType, PathItem, Tensor, Value};
use serde_json::Value as Json;

fn golden(case: &str) -> PathBuf {
    fixtures("distcp").join("golden").join(case)
}

fn open(dir: &Path) -> DcpReader {
    DcpReader::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Row-major bytes of a tensor, hex.
fn hex_of(t: &Tensor) -> String {
    hex::encode(t.data().unwrap())
}

fn check_tensor(r: &DcpReader, key: &str, dtype: DType, shape: &[usize], hex: &str) {
    let t = r.read_tensor(key).unwrap_or_else(|e| panic!("{}: {key}: {e}", r.dir().display()));
    let ctx = format!("{}: {key}", r.dir().display());
    assert_eq!(t.dtype(), dtype, "{ctx}");
    assert_eq!(t.shape(), shape, "{ctx}");
    assert_eq!(hex_of(&t), hex.replace(' ', ""), "{ctx}");
    let info = r.entries().into_iter().find(|e| e.name == key).unwrap();
    let ti = info.tensor_info().unwrap();
    assert_eq!((ti.dtype, ti.shape.as_slice()), (dtype, shape), "{ctx}: entry");
}

const W_HEX: &str =
    "00000000 0000803f 00000040 00004040 00008040 0000a040 0000c040 0000e040 00000041 00001041 00002041 00003041";

/// The mixed state dict of golden README section 1, as every c* case must return it.
fn check_mixed(case: &str, legacy_keys: bool) {
    let r = open(&golden(case));
    check_tensor(&r, "model.w", DType::F32, &[3, 4], W_HEX);
    check_tensor(&r, "model.b", DType::BF16, &[4], "803f803f803f803f");
    check_tensor(&r, "opt.state.0.exp_avg", DType::F32, &[2, 2], &"00000000".repeat(4));
    check_tensor(&r, "lst.0", DType::I64, &[3], "0100000000000000 0200000000000000 0300000000000000");
    check_tensor(&r, "lst.1", DType::F32, &[], "0000a040");
    check_tensor(&r, "tt", DType::F16, &[3, 2], "0000 0042 003c 0044 0040 0045");
    check_tensor(&r, "view", DType::I32, &[3], "02000000 03000000 04000000");
    check_tensor(&r, "scalar", DType::F64, &[], "0000000000000c40");
    check_tensor(&r, "empty", DType::F32, &[0, 3], "");
    check_tensor(&r, "flag", DType::Bool, &[2], "0100");
    // tt is stored transposed: the zero-copy read keeps its strides and storage.
    let tt = r.read_tensor("tt").unwrap();
    assert_eq!(tt.strides(), &[1, 3], "{case}: tt strides");
    assert_eq!(hex::encode(tt.storage().as_bytes()), "0000003c004000420044".to_owned() + "0045", "{case}: tt storage");
    if !matches!(r.metadata().storage_data[0].1.transform_descriptors.as_slice(), [_]) {
        assert!(tt.storage().is_mapped(), "{case}: tt is not a window of the file map");
    }
    assert_eq!(r.read_value("step").unwrap(), Value::Int(7));
    assert_eq!(r.read_value("opt.lr").unwrap(), Value::Float(0.1));
    assert_eq!(r.read_value("opt.betas").unwrap(), Value::List(vec![Value::Float(0.9), Value::Float(0.999)]));
    let hp = Value::dict([("name", Value::from("adam"))]);
    if legacy_keys {
        assert_eq!(r.read_value("opt.hp").unwrap(), hp, "{case}");
        assert!(r.storage_metadata("opt.hp.name").is_err());
    } else {
        assert_eq!(r.read_value("opt.hp.name").unwrap(), Value::from("adam"), "{case}");
    }
    assert_eq!(r.path_of("opt.state.0.exp_avg"), vec![key("opt"), key("state"), key("0"), key("exp_avg")]);
    assert_eq!(r.path_of("lst.1"), vec![key("lst"), PathItem::Index(1)]);

    // The nested state dict through planner_data.
    let sd = r.state_dict().unwrap();
    let Value::Dict(top) = &sd else { panic!("{case}: not a dict") };
    let names: Vec<&str> = top.items.iter().map(|(k, _)| k.as_str().unwrap()).collect();
    assert_eq!(names, ["model", "step", "opt", "lst", "tt", "view", "scalar", "empty", "flag"], "{case}");
    let opt = top.get("opt").unwrap().as_dict().unwrap();
    assert_eq!(opt.get("hp").unwrap(), &hp, "{case}");
    let state = opt.get("state").unwrap().as_dict().unwrap();
    assert!(state.get("0").unwrap().as_dict().unwrap().get("exp_avg").unwrap().as_tensor().is_some(), "{case}");
    let lst = top.get("lst").unwrap().as_sequence().unwrap();
    assert_eq!(lst.len(), 2);
    assert_eq!(hex_of(lst[1].as_tensor().unwrap()), "0000a040");
    assert!(verify(golden(case)).unwrap().is_ok(), "{case}: verify");
}

fn key(s: &str) -> PathItem {
    PathItem::Key(s.to_owned())
}

#[test]
fn golden_mixed_state_dicts() {
    for (case, legacy) in [
        ("c201", true),
        ("c222", true),
        ("c241", false),
        ("c291", false),
        ("c215", false),
        ("c215_zstd", false),
        ("c215_multi", false),
        ("c215_perfile", false),
    ] {
        check_mixed(case, legacy);
    }
    let hint = |c: &str| open(&golden(c)).writer_hint();
    assert!(hint("c201").starts_with("torch 2.0-2.2"));
    assert!(hint("c222").starts_with("torch 2.0-2.2"));
    assert_eq!(hint("c241"), "torch 2.4-2.6");
    assert_eq!(hint("c291"), "torch 2.9-2.14");
    assert_eq!(hint("c215"), "torch 2.15+");
}

#[test]
fn golden_metadata_fields() {
    let md = |c: &str| open(&golden(c)).metadata().clone();
    let c201 = md("c201");
    assert!(c201.storage_meta.is_none() && c201.version.is_none());
    let props = |m: &Metadata, k: &str| m.get(k).unwrap().as_tensor().unwrap().properties.clone();
    assert!(props(&c201, "model.w").legacy_class);
    let c241 = md("c241");
    let sm = c241.storage_meta.as_ref().unwrap();
    assert_eq!(sm.checkpoint_id, Value::from("c241"));
    assert_eq!(sm.save_id.as_deref(), Some("4eb5f022-f93c-4be9-9def-3a629d8359b9"));
    assert_eq!((sm.load_id.as_ref(), sm.modules.as_ref()), (None, None));
    assert!(!props(&c241, "model.w").legacy_class);
    let c215 = md("c215");
    assert_eq!(c215.version.as_deref(), Some("1.0.0"));
    assert_eq!(c215.storage_meta.as_ref().unwrap().modules, Some(vec![]));
    assert_eq!(props(&c215, "model.w").strides, Some(vec![4, 1]));
    assert_eq!(props(&c215, "scalar").strides, Some(vec![]));
    // c215 item layout: BYTE_IO first, then tensors, concatenated without padding.
    let offsets: Vec<(String, u64, u64)> =
        c215.storage_data.iter().map(|(i, s)| (i.fqn.clone(), s.offset, s.length)).collect();
    let want = [0, 1261, 2522, 3783, 5044, 6621, 8198, 9775, 11352, 12929, 14506, 16083, 17660, 19173];
    assert_eq!(offsets.iter().map(|o| o.1).collect::<Vec<_>>(), want);
    assert_eq!(offsets[0].0, "step");
    assert_eq!(offsets[13], ("flag".to_owned(), 19173, 1577));
    let zstd = md("c215_zstd");
    let (ix, s) = &zstd.storage_data[4];
    assert_eq!((ix.fqn.as_str(), s.offset, s.length), ("model.w", 1859, 663));
    assert_eq!(s.transform_descriptors, ["stream.zstd/1"]);
    let multi = md("c215_multi");
    let find = |m: &Metadata, k: &str| m.storage_data.iter().find(|(i, _)| i.fqn == k).unwrap().1.clone();
    let e = find(&multi, "empty");
    assert_eq!((e.relative_path.as_str(), e.offset, e.length), ("__0_2.distcp", 9146, 1513));
    let perfile = md("c215_perfile");
    assert_eq!(find(&perfile, "opt.hp.name").relative_path, "__0_6.distcp");
    let c291 = md("c291");
    assert_eq!(props(&c291, "model.w").strides, None);
    assert_eq!(c291.storage_meta.as_ref().unwrap().save_id.as_deref(), Some("52bbd23c-aa0d-4d30-a381-351a66a8eb63"));
}

/// Golden README section 2: two-rank DTensor saves (uneven Shard(0), Shard(1), Replicate, an empty shard).
#[test]
fn golden_two_rank_dtensor() {
    for case in ["d222", "d241", "d215", "d215e"] {
        let r = open(&golden(case));
        let f = |n: i32| -> String { (0..n).map(|i| hex::encode((i as f32).to_le_bytes())).collect() };
        if case == "d215e" {
            check_tensor(&r, "row", DType::F32, &[1, 4], &f(4));
            let row = r.tensor_metadata("row").unwrap();
            assert_eq!(row.chunks[1].offsets, [1, 0]);
            assert_eq!(row.chunks[1].sizes, [0, 4]);
            assert_eq!(r.read_chunk("row", 1).unwrap().shape(), &[0, 4]);
        } else {
            check_tensor(&r, "row", DType::F32, &[5, 4], &f(20));
            // a region across the two ranks' chunks, and one inside rank 1's (zero copy)
            let mid = r.read_region("row", &[2, 1], &[2, 2]).unwrap();
            assert_eq!(mid.to_vec::<f32>().unwrap(), vec![9.0, 10.0, 13.0, 14.0], "{case}");
            let inside = r.read_region("row", &[3, 0], &[2, 4]).unwrap();
            assert!(inside.storage().is_mapped(), "{case}: region inside one chunk is not a view");
        }
        check_tensor(&r, "col", DType::F32, &[3, 6], &f(18));
        let col0 = r.read_chunk("col", 0).unwrap();
        assert_eq!(col0.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0, 6.0, 7.0, 8.0, 12.0, 13.0, 14.0]);
        check_tensor(&r, "rep_dt", DType::F32, &[2, 2], &hex::encode([0x00, 0x00, 0x80, 0x3f]).repeat(4));
        let plain = r.read_tensor("plain").unwrap().to_vec::<f32>().unwrap();
        if case == "d222" {
            assert_eq!(plain, vec![0.0; 3]);
            assert_eq!(r.read_value("obj").unwrap(), Value::dict([("rank", Value::Int(0))]));
        } else {
            assert_eq!(plain, vec![1.0; 3]);
            assert_eq!(r.read_value("obj.rank").unwrap(), Value::Int(1));
            assert_eq!(r.path_of("obj.rank"), vec![key("obj"), key("rank")]);
        }
        assert!(verify(golden(case)).unwrap().is_ok(), "{case}");
    }
}

#[test]
fn golden_hf_and_rank_local_layouts() {
    let r = open(&golden("hf215"));
    assert_eq!(r.source(), &MetadataSource::HfSafetensors);
    check_tensor(&r, "model.w", DType::F32, &[2, 3], "00000000 0000803f 00000040 00004040 00008040 0000a040");
    check_tensor(&r, "model.b", DType::BF16, &[3], "803f803f803f");
    assert!(r.read_tensor("model.w").unwrap().storage().is_mapped());
    assert!(verify(golden("hf215")).unwrap().is_ok());

    let r = open(&golden("nc215"));
    assert_eq!(r.source(), &MetadataSource::PerRank { ranks: vec![0] });
    check_tensor(&r, "a", DType::F32, &[2], "0000803f0000803f");
    assert_eq!(r.state_dict().unwrap(), Value::dict([("a", Value::Tensor(r.read_tensor("a").unwrap()))]));
}

#[test]
fn golden_crafted_profile_cases() {
    for case in ["k_aligned", "k_plain"] {
        let r = open(&golden(case));
        check_tensor(&r, "model.w", DType::F32, &[2, 3], "0000803f 00000040 00004040 00008040 0000a040 0000c040");
        assert_eq!(r.read_value("step").unwrap(), Value::Int(42));
    }
    for case in ["k_newkeys", "k_legacykeys"] {
        let sd = open(&golden(case)).state_dict().unwrap();
        let want = Value::dict([("opt", Value::dict([("hp", Value::dict([("name", Value::from("adam"))]))]))]);
        assert_eq!(sd, want, "{case}");
    }
    // Our maximum-compatibility encoder writes the reference emitter's bytes exactly.
    for case in ["k_aligned", "k_plain", "k_newkeys", "k_legacykeys"] {
        let path = golden(case).join(".metadata");
        let bytes = fs::read(&path).unwrap();
        let md = Metadata::from_pickle(&bytes, &path).unwrap();
        assert_eq!(md.to_pickle(Profile::MaxCompat).unwrap(), bytes, "{case}: re-encoded .metadata differs");
    }
}

// ------------------------------------------------------------------------------------------------
// Fresh torch 2.13 fixtures (conformance/python/distcp/make_fixtures.py)

fn t213(case: &str) -> PathBuf {
    fixtures("distcp").join("torch213").join(case)
}

fn manifest(case: &str) -> Json {
    let p = fixtures("distcp").join("torch213").join(format!("{case}.json"));
    serde_json::from_slice(&fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

fn dims(j: &Json) -> Vec<usize> {
    j.as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect()
}

const T213_CASES: [&str; 10] =
    ["s_mixed", "s_dtypes", "s_optim", "s_multi", "s_perfile", "hf", "m2", "m3", "nc2", "hf2"];

#[test]
fn torch213_fixtures_read_as_their_manifests_say() {
    for case in T213_CASES {
        let m = manifest(case);
        let r = open(&t213(case));
        let entries = m["entries"].as_array().unwrap();
        let keys: Vec<&str> = r.keys().collect();
        let want: Vec<&str> = entries.iter().map(|e| e["key"].as_str().unwrap()).collect();
        let mut sorted_keys = keys.clone();
        let mut sorted_want = want.clone();
        sorted_keys.sort_unstable();
        sorted_want.sort_unstable();
        assert_eq!(sorted_keys, sorted_want, "{case}: keys");
        if m["world_size"] == 1 && !case.starts_with("hf") {
            assert_eq!(keys, want, "{case}: key order");
        }
        for e in entries {
            let key = e["key"].as_str().unwrap();
            let ctx = format!("{case}: {key}");
            if e["kind"] == "tensor" {
                let t = r.read_tensor(key).unwrap_or_else(|err| panic!("{ctx}: {err}"));
                assert_eq!(t.dtype(), DType::from_torch_name(e["dtype"].as_str().unwrap()).unwrap(), "{ctx}");
                assert_eq!(t.shape(), dims(&e["shape"]).as_slice(), "{ctx}");
                assert_eq!(sha256_hex(&t.data().unwrap()), e["sha256"].as_str().unwrap(), "{ctx}: values");
                if let Some(chunks) = e["chunks"].as_array() {
                    let md = r.tensor_metadata(key).unwrap();
                    let mut got: Vec<(Vec<usize>, Vec<usize>)> =
                        md.chunks.iter().map(|c| (c.offsets.clone(), c.sizes.clone())).collect();
                    if case.starts_with("hf") {
                        got.sort(); // the manifest lists HF chunks sorted (torch orders them by directory listing)
                    }
                    let want: Vec<(Vec<usize>, Vec<usize>)> =
                        chunks.iter().map(|c| (dims(&c["offsets"]), dims(&c["sizes"]))).collect();
                    assert_eq!(got, want, "{ctx}: chunks");
                }
            } else {
                let v = r.read_value(key).unwrap_or_else(|err| panic!("{ctx}: {err}"));
                assert_eq!(typed_tree(&v), e["tree"], "{ctx}: value");
            }
        }
        if let Some(pd) = m["planner_data"].as_object() {
            let got: HashMap<String, Vec<PathItem>> = r.metadata().planner_data.clone().unwrap().into_iter().collect();
            assert_eq!(got.len(), pd.len(), "{case}: planner_data");
            for (k, path) in pd {
                let want: Vec<PathItem> = path
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| match p {
                        Json::String(s) => PathItem::Key(s.clone()),
                        n => PathItem::Index(n.as_u64().unwrap() as usize),
                    })
                    .collect();
                assert_eq!(got[k], want, "{case}: planner_data[{k}]");
            }
        }
        for (name, digest) in m["files"].as_object().unwrap() {
            if let Some(d) = digest.as_str() {
                assert_eq!(sha256_hex(&fs::read(t213(case).join(name)).unwrap()), d, "{case}/{name}");
            }
        }
        let report = verify(t213(case)).unwrap();
        assert!(report.is_ok(), "{case}: {:?}", report.problems);
    }
}

fn save_id_of(dir: &Path) -> String {
    open(dir).metadata().storage_meta.as_ref().unwrap().save_id.clone().unwrap()
}

fn files_of(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

/// The files of a checkpoint ckpt wrote, less `ckpt.checksums.json` (torch writes none and ignores it),
/// after checking that the manifest covers the others and verifies.
fn data_files_of(dir: &Path) -> Vec<String> {
    let sums = ckpt_io::Manifest::read(dir).unwrap().expect("ckpt writes a checksum manifest");
    assert!(sums.verify_dir(dir).unwrap().is_empty(), "{}: checksums", dir.display());
    let files: Vec<String> = files_of(dir).into_iter().filter(|f| f != ckpt_io::MANIFEST_NAME).collect();
    assert_eq!(
        sums.files.keys().cloned().collect::<Vec<_>>(),
        files,
        "{}: the manifest lists every file",
        dir.display()
    );
    files
}

/// The torch 2.13 profile writes what torch 2.13 writes: a state dict read back from a torch-written
/// checkpoint and saved again gives the same files, byte for byte (`.metadata` included, with the same
/// save id and checkpoint id).
#[test]
fn torch213_profile_reproduces_torch_bytes() {
    let out = tempfile::tempdir().unwrap();
    for (case, options) in [
        ("s_mixed", WriteOptions::default()),
        ("s_dtypes", WriteOptions::default()),
        ("s_optim", WriteOptions::default()),
        ("s_perfile", WriteOptions::default().with_single_file_per_rank(false)),
        ("s_multi", WriteOptions::default().with_thread_count(3)),
    ] {
        let src = t213(case);
        let sd = open(&src).state_dict().unwrap();
        let dst = out.path().join(case);
        let options = options.with_profile(Profile::Torch213).with_storage_meta(&save_id_of(&src), case);
        save(&sd, &dst, &options).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(data_files_of(&dst), files_of(&src), "{case}: files");
        for name in files_of(&src) {
            let (a, b) = (fs::read(src.join(&name)).unwrap(), fs::read(dst.join(&name)).unwrap());
            if case == "s_multi" && name == ".metadata" {
                // torch orders storage_data by writer-thread completion; compare as sets.
                let mut ma = Metadata::from_pickle(&a, &src).unwrap();
                let mut mb = Metadata::from_pickle(&b, &dst).unwrap();
                let key =
                    |e: &(ckpt_distcp::MetadataIndex, ckpt_distcp::StorageInfo)| (e.0.fqn.clone(), e.0.offset.clone());
                ma.storage_data.sort_by_key(key);
                mb.storage_data.sort_by_key(key);
                assert_eq!(ma, mb, "{case}: .metadata");
                continue;
            }
            assert!(
                a == b,
                "{case}/{name}: {} bytes written, torch wrote {}; first difference at {:?}",
                b.len(),
                a.len(),
                a.iter().zip(&b).position(|(x, y)| x != y)
            );
        }
    }
}

/// Rank `rank`'s state dict for the multi-rank fixture cases, built from the global values the generator
/// uses (read back from the torch-written checkpoint) and its placements.
fn rank_state(case: &str, full: &DcpReader, rank: usize, world: usize) -> (Value, HashMap<String, ShardSpec>) {
    let m = manifest(case);
    let placements = m["options"]["placements"].as_object().unwrap();
    let mut shards = HashMap::new();
    let mut leaves = Vec::new();
    // The state dict's own order is the planner_data order (a ChainMap over identical mappings).
    let order: Vec<String> = full.metadata().planner_data.as_ref().unwrap().iter().map(|(k, _)| k.clone()).collect();
    for key in order.iter().map(String::as_str) {
        let path = full.path_of(key);
        let v = match full.storage_metadata(key).unwrap() {
            StorageMetadata::Tensor(md) => {
                let t = full.read_tensor(key).unwrap();
                match placements.get(key).and_then(Json::as_str) {
                    Some(p) if p.starts_with('S') => {
                        let dim: usize = p[1..].parse().unwrap();
                        let (off, len) = shard_box(&md.size, dim, rank, world);
                        shards.insert(key.to_owned(), ShardSpec::new(&md.size, &off));
                        Value::Tensor(t.region(&off, &len).unwrap().to_contiguous().unwrap())
                    }
                    Some(_) => Value::Tensor(t),
                    // per-rank values: plain tensors filled with the rank (+0.5 in m3)
                    None => {
                        let fill = if case == "m3" { rank as f32 + 0.5 } else { rank as f32 };
                        Value::Tensor(Tensor::from_slice(&vec![fill; t.numel()], t.shape()).unwrap())
                    }
                }
            }
            StorageMetadata::Bytes => match key {
                "obj.rank" => Value::Int(rank as i64),
                "obj.ids" => Value::List(vec![Value::Int(rank as i64), Value::Int(rank as i64 + 1)]),
                _ => full.read_value(key).unwrap(),
            },
        };
        leaves.push((path, v));
    }
    (ckpt_tensor::unflatten(leaves).unwrap(), shards)
}

fn save_ranks(case: &str, world: usize, dst: &Path, options: &WriteOptions) -> Metadata {
    let full = open(&t213(case));
    let states: Vec<_> = (0..world).map(|r| rank_state(case, &full, r, world)).collect();
    let mut out = Vec::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = ckpt_collective::ThreadGroup::new(world)
            .into_iter()
            .zip(&states)
            .map(|(g, (sd, shards))| s.spawn(move || save_rank(sd, shards, dst, options, &g)))
            .collect();
        for h in handles {
            out.push(h.join().unwrap().unwrap());
        }
    });
    for m in &out[1..] {
        assert_eq!(m, &out[0], "{case}: ranks disagree on the report");
    }
    let metadata = open(dst).metadata().clone();
    assert_eq!(ckpt_distcp::save_report(&metadata, dst), out[0], "{case}: the report is what .metadata describes");
    metadata
}

/// Multi-rank saves plan like torch 2.13 (which rank keeps a replicated item, chunk numbering, key order,
/// planner_data order) and write the same data files byte for byte.
#[test]
fn multi_rank_writer_matches_torch_213() {
    let out = tempfile::tempdir().unwrap();
    for (case, world) in [("m2", 2), ("m3", 3)] {
        let src = t213(case);
        let dst = out.path().join(case);
        let options =
            WriteOptions::default().with_profile(Profile::Torch213).with_storage_meta(&save_id_of(&src), case);
        let written = save_ranks(case, world, &dst, &options);
        let theirs = open(&src).metadata().clone();
        assert_eq!(written, theirs, "{case}: metadata differs from torch's");
        assert_eq!(open(&dst).metadata(), &theirs, "{case}: .metadata read back differs");
        assert_eq!(data_files_of(&dst), files_of(&src), "{case}: files");
        for name in files_of(&src).into_iter().filter(|n| n.ends_with(".distcp")) {
            assert!(fs::read(src.join(&name)).unwrap() == fs::read(dst.join(&name)).unwrap(), "{case}/{name} differs");
        }
    }
}

/// A job with 2 ranks loads its shards of a checkpoint saved by 3 ranks (torch-written and ckpt-written):
/// each region is read from the chunks that overlap it.
#[test]
fn three_ranks_reshard_into_two() {
    let out = tempfile::tempdir().unwrap();
    let ours = out.path().join("m3");
    save_ranks("m3", 3, &ours, &WriteOptions::default());
    for dir in [t213("m3"), ours] {
        let r = open(&dir);
        for key in ["row", "col", "emp", "layer.w", "rep"] {
            let md = r.tensor_metadata(key).unwrap();
            let full = r.read_tensor(key).unwrap();
            for dim in 0..md.size.len() {
                let mut pieces = Vec::new();
                for rank in 0..2 {
                    let (off, len) = shard_box(&md.size, dim, rank, 2);
                    let region = r.read_region(key, &off, &len).unwrap();
                    let want = full.region(&off, &len).unwrap();
                    assert_eq!(region.shape(), len.as_slice(), "{key} dim {dim} rank {rank}");
                    assert_eq!(region.data().unwrap(), want.data().unwrap(), "{key} dim {dim} rank {rank}");
                    pieces.push(region);
                }
                assert_eq!(pieces.iter().map(Tensor::numel).sum::<usize>(), full.numel());
            }
        }
        // row: [7, 4] saved as 3+3+1 rows; the 2-rank job reads 4+3 rows.
        let r1 = r.read_region("row", &[4, 0], &[3, 4]).unwrap();
        assert_eq!(r1.to_vec::<f32>().unwrap(), (16..28).map(|i| i as f32).collect::<Vec<_>>());
    }
}

// ------------------------------------------------------------------------------------------------
// Round trips through torch 2.13 (one Python process for all jobs)

/// Deterministic bytes for a tensor of `dtype` and `shape` (bools 0/1).
fn det_tensor(dtype: DType, shape: &[usize], k: u8) -> Tensor {
    let n: usize = shape.iter().product::<usize>() * dtype.size();
    let bytes: Vec<u8> = (0..n)
        .map(|i| {
            let b = (i as u8).wrapping_mul(37).wrapping_add(k.wrapping_mul(11));
            if dtype == DType::Bool { b & 1 } else { b & 0x3f } // small exponents: no NaN/inf surprises
        })
        .collect();
    Tensor::from_buffer(dtype, shape, ckpt_tensor::Buffer::copy_from(&bytes).unwrap()).unwrap()
}

fn f32s(v: impl IntoIterator<Item = f32>, shape: &[usize]) -> Tensor {
    Tensor::from_slice(&v.into_iter().collect::<Vec<_>>(), shape).unwrap()
}

fn rich_state_dict() -> Value {
    let dtypes = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::C32,
        DType::C64,
        DType::C128,
        DType::F8E4M3Fn,
        DType::F8E5M2,
        DType::F8E4M3Fnuz,
        DType::F8E5M2Fnuz,
        DType::F8E8M0Fnu,
    ];
    let by_dtype: Vec<(String, Value)> = dtypes
        .iter()
        .enumerate()
        .map(|(i, &d)| (d.torch_name().to_owned(), Value::Tensor(det_tensor(d, &[2, 3], i as u8))))
        .collect();
    let grid = f32s((0..24).map(|i| i as f32), &[4, 6]);
    let ints = Tensor::from_slice(&(0..10).collect::<Vec<i32>>(), &[10]).unwrap();
    Value::dict([
        (
            "model",
            Value::dict([
                ("w", Value::Tensor(f32s((0..12).map(|i| i as f32), &[3, 4]))),
                ("emb_t", Value::Tensor(det_tensor(DType::F16, &[5, 3], 1).transpose(0, 1).unwrap())),
                ("big", Value::Tensor(f32s((0..300 * 70).map(|i| (i % 97) as f32 - 48.0), &[300, 70]))),
            ]),
        ),
        ("dtypes", Value::dict(by_dtype)),
        (
            "opt",
            Value::dict([
                ("lr", Value::Float(0.1)),
                ("betas", Value::Tuple(vec![Value::Float(0.9), Value::Float(0.999)])),
                (
                    "state",
                    Value::dict([(
                        "0",
                        Value::dict([
                            ("exp_avg", Value::Tensor(Tensor::zeros(DType::F32, &[2, 2]).unwrap())),
                            ("step", Value::Tensor(f32s([3.0], &[]))),
                        ]),
                    )]),
                ),
                (
                    "hp",
                    Value::dict([
                        ("name", Value::from("adam")),
                        ("amsgrad", Value::Bool(false)),
                        ("eps", Value::Float(1e-8)),
                        ("sched", Value::None),
                    ]),
                ),
                ("params", Value::List(vec![Value::Int(0), Value::Int(1)])),
            ]),
        ),
        ("lst", Value::List(vec![Value::Tensor(det_tensor(DType::I64, &[3], 5)), Value::Tensor(f32s([5.0], &[]))])),
        ("view", Value::Tensor(ints.narrow(0, 2, 3).unwrap())),
        ("col", Value::Tensor(grid.narrow(1, 2, 1).unwrap())),
        ("empty", Value::Tensor(Tensor::zeros(DType::F32, &[0, 3]).unwrap())),
        ("step", Value::Int(7)),
        ("name", Value::from("run-1")),
    ])
}

/// The 3-rank state dict as global values, and its placements (`S<dim>` or replicated).
fn sharded_global() -> (Value, Vec<(&'static str, Option<usize>)>) {
    let sd = Value::dict([
        ("row", Value::Tensor(f32s((0..28).map(|i| i as f32), &[7, 4]))),
        ("col", Value::Tensor(det_tensor(DType::BF16, &[4, 5], 2))),
        ("emp", Value::Tensor(f32s((0..6).map(|i| i as f32), &[2, 3]))),
        (
            "layer",
            Value::dict([
                ("w", Value::Tensor(det_tensor(DType::F16, &[6, 2], 3))),
                ("b", Value::Tensor(f32s([1.0, 2.0, 3.0], &[3]))),
            ]),
        ),
        ("rep", Value::Tensor(det_tensor(DType::I64, &[3], 4))),
        ("obj", Value::dict([("name", Value::from("m")), ("ids", Value::List(vec![Value::Int(1), Value::Int(2)]))])),
        ("step", Value::Int(3)),
    ]);
    (
        sd,
        vec![
            ("row", Some(0)),
            ("col", Some(1)),
            ("emp", Some(0)),
            ("layer.w", Some(0)),
            ("layer.b", None),
            ("rep", None),
        ],
    )
}

fn save_sharded(dir: &Path, world: usize, options: &WriteOptions) {
    let (global, placements) = sharded_global();
    let flat = ckpt_tensor::flatten(&global).unwrap();
    let states: Vec<(Value, HashMap<String, ShardSpec>)> = (0..world)
        .map(|rank| {
            let mut shards = HashMap::new();
            let leaves = flat.iter().map(|e| {
                let v = match (e.value.as_tensor(), placements.iter().find(|(k, _)| *k == e.key).and_then(|p| p.1)) {
                    (Some(t), Some(dim)) => {
                        let (off, len) = shard_box(t.shape(), dim, rank, world);
                        shards.insert(e.key.clone(), ShardSpec::new(t.shape(), &off));
                        Value::Tensor(t.region(&off, &len).unwrap())
                    }
                    _ => e.value.clone(),
                };
                (e.path.clone(), v)
            });
            let sd = ckpt_tensor::unflatten(leaves.collect::<Vec<_>>()).unwrap();
            (sd, shards)
        })
        .collect();
    std::thread::scope(|s| {
        let hs: Vec<_> = ckpt_collective::ThreadGroup::new(world)
            .into_iter()
            .zip(&states)
            .map(|(g, (sd, shards))| s.spawn(move || save_rank(sd, shards, dir, options, &g).unwrap()))
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
}

/// Equal flattened leaves, in any order (a multi-rank save orders keys by the global plan).
fn assert_same_leaves(a: &Value, b: &Value, ctx: &str) {
    let leaves = |v: &Value| {
        let mut l: Vec<(String, Value)> =
            ckpt_tensor::flatten(v).unwrap().into_iter().map(|e| (e.key, e.value.clone())).collect();
        l.sort_by(|x, y| x.0.cmp(&y.0));
        l
    };
    assert_eq!(leaves(a), leaves(b), "{ctx}");
}

#[test]
fn python_round_trips() {
    use ckpt_distcp::convert;
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let mut jobs = Vec::new();
    let mut job = |j: Json| jobs.push(j);
    let s = |p: &Path| p.to_string_lossy().into_owned();

    let rich = rich_state_dict();
    let rich_pt = t.join("rich.pt");
    ckpt_torch::save(&rich, &rich_pt, &ckpt_torch::WriteOptions::default()).unwrap();
    for (name, options) in [
        ("rich-maxcompat", WriteOptions::default()),
        ("rich-213", WriteOptions::default().with_profile(Profile::Torch213)),
        ("rich-maxcompat-3files", WriteOptions::default().with_thread_count(3)),
        ("rich-213-perfile", WriteOptions::default().with_profile(Profile::Torch213).with_single_file_per_rank(false)),
    ] {
        let dir = t.join(name);
        save(&rich, &dir, &options).unwrap();
        assert!(verify(&dir).unwrap().is_ok(), "{name}");
        job(serde_json::json!({"kind": "dcp", "name": name, "dir": s(&dir), "expected": s(&rich_pt)}));
    }

    let (global, _) = sharded_global();
    let global_pt = t.join("global.pt");
    ckpt_torch::save(&global, &global_pt, &ckpt_torch::WriteOptions::default()).unwrap();
    for (name, options) in [
        ("multi3-maxcompat", WriteOptions::default()),
        ("multi3-213", WriteOptions::default().with_profile(Profile::Torch213)),
    ] {
        let dir = t.join(name);
        save_sharded(&dir, 3, &options);
        let r = open(&dir);
        assert_eq!(r.tensor_metadata("emp").unwrap().chunks[2].sizes, [0, 3], "{name}: the empty shard");
        assert_same_leaves(&r.state_dict().unwrap(), &global, name);
        job(serde_json::json!({"kind": "dcp", "name": name, "dir": s(&dir), "expected": s(&global_pt)}));
    }

    // torch.save -> DCP (ckpt's torch_save_to_dcp), loaded by torch.
    let from_pt = t.join("from-pt");
    convert::torch_save_to_dcp(&rich_pt, &from_pt, &WriteOptions::default()).unwrap();
    job(serde_json::json!({"kind": "dcp", "name": "torch_save_to_dcp", "dir": s(&from_pt), "expected": s(&rich_pt)}));

    // DCP -> torch.save / safetensors / HF shards (ckpt's conversions of torch-written checkpoints).
    for case in ["s_mixed", "s_optim", "s_dtypes", "m3"] {
        let out = t.join(format!("{case}.pt"));
        convert::dcp_to_torch_save(&t213(case), &out, &ckpt_torch::WriteOptions::default()).unwrap();
        job(
            serde_json::json!({"kind": "pt_equals_dcp", "name": format!("dcp_to_torch_save {case}"), "pt": s(&out), "dir": s(&t213(case))}),
        );
    }
    for case in ["s_mixed", "m3"] {
        let out = t.join(format!("{case}.safetensors"));
        let report = convert::dcp_to_safetensors(&t213(case), &out, &ckpt_io::Durability::default()).unwrap();
        // Lossless: every value goes into `ckpt.values`; only a value holding tensors would be skipped.
        let src = open(&t213(case));
        let values: Vec<String> =
            src.entries().into_iter().filter(|e| e.tensor_info().is_none()).map(|e| e.name).collect();
        assert!(!values.is_empty(), "{case}: the case has values to keep");
        for k in &report.skipped {
            assert!(holds_tensor(&src.read_value(k).unwrap()), "{case}: {k} skipped though it holds no tensor");
        }
        let kept = ckpt_safetensors::SafetensorsReader::open(&out).unwrap().leaves();
        for k in values.iter().filter(|k| !report.skipped.contains(k)) {
            assert!(
                kept.iter().any(|(name, _, v)| name == k && v.same(&src.read_value(k).unwrap())),
                "{case}: {k} not kept"
            );
        }
        job(
            serde_json::json!({"kind": "safetensors_equals_dcp", "name": format!("dcp_to_safetensors {case}"), "files": [s(&out)], "dir": s(&t213(case))}),
        );
        let hf = t.join(format!("{case}-hf"));
        let report = convert::dcp_to_hf(
            &t213(case),
            &hf,
            &ckpt_safetensors::hf::WriteOptions::default().with_max_shard_size(100),
        )
        .unwrap();
        assert!(report.files.len() > 2, "{case}: several shards expected");
        let shards: Vec<String> =
            report.files.iter().filter(|f| f.extension().is_some_and(|e| e == "safetensors")).map(|f| s(f)).collect();
        job(
            serde_json::json!({"kind": "safetensors_equals_dcp", "name": format!("dcp_to_hf {case}"), "files": shards, "dir": s(&t213(case))}),
        );
        // torch's HuggingFaceStorageReader loads our HF output; our reader does too.
        let flat: Vec<(String, Value)> = open(&t213(case))
            .entries()
            .into_iter()
            .filter(|e| e.tensor_info().is_some())
            .map(|e| (e.name.clone(), Value::Tensor(open(&t213(case)).read_tensor(&e.name).unwrap())))
            .collect();
        let flat_pt = t.join(format!("{case}-flat.pt"));
        ckpt_torch::save(&Value::dict(flat.clone()), &flat_pt, &ckpt_torch::WriteOptions::default()).unwrap();
        job(
            serde_json::json!({"kind": "hf_load", "name": format!("HuggingFaceStorageReader {case}"), "dir": s(&hf), "expected": s(&flat_pt)}),
        );
        let back = open(&hf);
        for (k, v) in &flat {
            assert_eq!(&Value::Tensor(back.read_tensor(k).unwrap()), v, "{case}: {k} through our HF reader");
        }
    }

    let jobs_path = t.join("jobs.json");
    fs::write(&jobs_path, serde_json::to_vec_pretty(&jobs).unwrap()).unwrap();
    let out = run_python("distcp/check_load.py", &[&jobs_path]);
    println!("{out}");
    assert!(out.contains(&format!("{n}/{n} jobs passed", n = jobs.len())), "{out}");
}

/// Whether a value holds a tensor anywhere inside it.
fn holds_tensor(v: &Value) -> bool {
    match v {
        Value::List(items) | Value::Tuple(items) => items.iter().any(holds_tensor),
        Value::Dict(d) => d.items.iter().any(|(k, v)| holds_tensor(k) || holds_tensor(v)),
        other => other.is_tensor_like(),
    }
}
