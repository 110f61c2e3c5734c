//! torch.save conformance: every golden fixture written by torch 2.13 reads exactly as its manifest says;
//! every file ckpt writes loads in torch (weights_only, mmap, calculated storage offsets) to equal values;
//! a contiguous state dict is written byte for byte as torch.save writes it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use ckpt_conformance::{fixtures, run_python, typed_tree};
use ckpt_tensor::{CheckpointRead, DType, PathItem, Tensor, Value, flatten, leaves};
use ckpt_torch::{ReadOptions, TorchReader};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

fn manifests() -> Vec<(PathBuf, Json)> {
    let dir = fixtures("torch");
    let mut out: Vec<(PathBuf, Json)> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json") && p.file_name().is_some_and(|n| n != "STAMP.json"))
        .map(|p| {
            let j: Json = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
            (dir.join(j["file"].as_str().unwrap()), j)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 15, "expected the torch fixtures in {}, found {}", dir.display(), out.len());
    out
}

fn open(path: &Path) -> TorchReader {
    TorchReader::open_with(path, &ReadOptions::default().with_verify_crc(true))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn sha256(t: &Tensor) -> String {
    hex::encode(Sha256::digest(t.data().unwrap()))
}

/// The tensor inside a leaf and whether it is a parameter.
fn leaf_tensor(v: &Value) -> Option<(&Tensor, &'static str)> {
    match v {
        Value::Tensor(t) => Some((t, "tensor")),
        Value::Parameter { tensor, .. } => Some((tensor, "parameter")),
        Value::TensorWithState { tensor, .. } => leaf_tensor(tensor),
        _ => None,
    }
}

#[test]
fn every_fixture_reads_as_its_manifest_says() {
    let mut checked_tensors = 0;
    for (path, m) in manifests() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let file = open(&path);
        let value = file.value();

        // 1. The whole object tree: container kinds, keys, scalars, attributes.
        assert_eq!(typed_tree(value), m["tree"], "{name}: typed tree differs");

        // 2. Every tensor: dtype, shape, strides, offset, flags, bytes; storage sharing by key.
        let all = leaves(value).unwrap();
        let by_path: HashMap<&str, &Value> = all.iter().map(|e| (e.key.as_str(), e.value)).collect();
        let mut storage_of_key: HashMap<String, Tensor> = HashMap::new();
        for t in m["tensors"].as_array().unwrap() {
            let p = t["path"].as_str().unwrap();
            let leaf = by_path.get(p).unwrap_or_else(|| panic!("{name}: no leaf {p}"));
            let (tensor, kind) = leaf_tensor(leaf).unwrap_or_else(|| panic!("{name}: {p} is not a tensor"));
            let ctx = format!("{name}: {p}");
            assert_eq!(tensor.dtype(), DType::from_torch_name(t["dtype"].as_str().unwrap()).unwrap(), "{ctx}");
            let dims = |k: &str| -> Vec<usize> {
                t[k].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect()
            };
            assert_eq!(tensor.shape(), dims("shape").as_slice(), "{ctx} shape");
            assert_eq!(tensor.strides(), dims("stride").as_slice(), "{ctx} stride");
            assert_eq!(tensor.storage_offset() as u64, t["storage_offset"].as_u64().unwrap(), "{ctx} offset");
            assert_eq!(tensor.requires_grad(), t["requires_grad"].as_bool().unwrap(), "{ctx} requires_grad");
            assert_eq!(kind, t["kind"].as_str().unwrap(), "{ctx} kind");
            assert_eq!(tensor.numel() as u64, t["numel"].as_u64().unwrap(), "{ctx} numel");
            assert_eq!(tensor.storage().len() as u64, t["storage_nbytes"].as_u64().unwrap(), "{ctx} storage");
            assert_eq!(sha256(tensor), t["sha256"].as_str().unwrap(), "{ctx} data");
            assert_eq!(tensor.is_conj(), t["conj"].as_bool().unwrap_or(false), "{ctx} conj bit");
            assert_eq!(tensor.is_neg(), t["neg"].as_bool().unwrap_or(false), "{ctx} neg bit");
            if let Some(raw) = t["raw_sha256"].as_str() {
                assert_eq!(hex::encode(Sha256::digest(tensor.stored_data().unwrap())), raw, "{ctx} stored bytes");
            }
            if let Some(key) = t["storage_key"].as_str() {
                match storage_of_key.get(key) {
                    Some(other) => assert!(tensor.shares_storage_with(other), "{ctx}: storage {key} not shared"),
                    None => {
                        for (k, other) in &storage_of_key {
                            assert!(!tensor.shares_storage_with(other), "{ctx}: shares storage with key {k}");
                        }
                        storage_of_key.insert(key.to_owned(), tensor.clone());
                    }
                }
            }
            if file.container() == ckpt_torch::Container::Zip && tensor.nbytes() > 0 {
                assert!(tensor.storage().is_mapped(), "{ctx}: not a window of the file map");
            }
            checked_tensors += 1;
        }
        let manifest_paths: Vec<&str> =
            m["tensors"].as_array().unwrap().iter().map(|t| t["path"].as_str().unwrap()).collect();
        let our_paths: Vec<&str> =
            all.iter().filter(|e| leaf_tensor(e.value).is_some()).map(|e| e.key.as_str()).collect();
        assert_eq!(our_paths, manifest_paths, "{name}: tensor list differs");

        // 3. DCP flattening agrees with torch's own flatten_state_dict.
        if let Some(keys) = m["dcp_flatten"]["keys"].as_array() {
            let flat = flatten(value).unwrap_or_else(|e| panic!("{name}: flatten: {e}"));
            let ours: Vec<&str> = flat.iter().map(|e| e.key.as_str()).collect();
            let theirs: Vec<&str> = keys.iter().map(|k| k.as_str().unwrap()).collect();
            assert_eq!(ours, theirs, "{name}: flatten keys");
            for e in &flat {
                let want = &m["dcp_flatten"]["mapping"][&e.key];
                let got: Vec<Json> = e
                    .path
                    .iter()
                    .map(|p| match p {
                        PathItem::Key(k) => Json::String(k.clone()),
                        PathItem::Index(i) => Json::from(*i as u64),
                    })
                    .collect();
                assert_eq!(&Json::Array(got), want, "{name}: path of {}", e.key);
            }
        }

        // 4. Entries through the generic reader agree with the tree.
        for e in file.entries() {
            if let Some(info) = e.tensor_info() {
                let t = file.tensor(&e.name).unwrap();
                assert_eq!((t.dtype(), t.shape().to_vec()), (info.dtype, info.shape.clone()));
            }
        }
    }
    assert!(checked_tensors > 100, "only {checked_tensors} tensors checked");
}

/// Sparse and quantized tensors are composite entries, not dense tensors: asked for as one, the error says
/// so (and is unsupported, not damage); the meta tensor stays opaque.
#[test]
fn composite_and_opaque_tensors_refuse_dense_access() {
    let file = open(&fixtures("torch").join("special.pt"));
    let kinds = |f: fn(&ckpt_tensor::EntryKind) -> bool| -> Vec<_> {
        file.entries().into_iter().filter(|e| f(&e.kind)).collect()
    };
    let composite = kinds(|k| matches!(k, ckpt_tensor::EntryKind::Composite(_)));
    assert_eq!(composite.len(), 4, "sparse COO, sparse CSR, per-tensor and per-channel quantized: {composite:?}");
    let opaque = kinds(|k| matches!(k, ckpt_tensor::EntryKind::OpaqueTensor(_)));
    assert_eq!(opaque.len(), 1, "the meta tensor: {opaque:?}");
    for e in composite.iter().chain(&opaque) {
        let err = file.tensor(&e.name).unwrap_err();
        assert_eq!(err.fault(), ckpt_tensor::Fault::Unsupported, "{}: {err}", e.name);
    }
}

/// Rust reads every fixture and writes it back; real torch loads each output with weights_only=True,
/// with mmap=True, and with calculated storage offsets, and compares with the original.
#[test]
fn rust_written_files_load_in_torch() {
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<PathBuf> = vec![PathBuf::from("--pairs")];
    for (path, _) in manifests() {
        let out = dir.path().join(path.file_name().unwrap());
        let file = open(&path);
        ckpt_torch::save(file.value(), &out, &ckpt_torch::WriteOptions::default())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // What we wrote reads back to the same tree.
        assert_eq!(typed_tree(TorchReader::open(&out).unwrap().value()), typed_tree(file.value()));
        args.push(path);
        args.push(out);
    }
    let refs: Vec<&Path> = args.iter().map(PathBuf::as_path).collect();
    run_python("check_roundtrip.py", &refs);
}

/// For a state dict of contiguous tensors, ckpt's file equals torch.save's byte for byte.
#[test]
fn contiguous_state_dict_is_byte_identical() {
    let original = fixtures("torch").join("contiguous_sd.pt");
    let file = open(&original);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("contiguous_sd.pt");
    ckpt_torch::save(file.value(), &out, &ckpt_torch::WriteOptions::default()).unwrap();
    let (a, b) = (fs::read(&original).unwrap(), fs::read(&out).unwrap());
    assert_eq!(a.len(), b.len(), "file sizes differ");
    let first_diff = a.iter().zip(&b).position(|(x, y)| x != y);
    assert_eq!(first_diff, None, "first differing byte at {first_diff:?}");
}

/// The same byte-identity check for the OrderedDict target (0-dim, bfloat16, empty tensor: a 0-byte record
/// without a data descriptor).
#[test]
fn contiguous_ordered_dict_is_byte_identical() {
    let original = fixtures("torch").join("contiguous_odict.pt");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("contiguous_odict.pt");
    ckpt_torch::save(open(&original).value(), &out, &ckpt_torch::WriteOptions::default()).unwrap();
    assert!(fs::read(&original).unwrap() == fs::read(&out).unwrap(), "contiguous_odict.pt differs from torch.save's");
}

fn arange_bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 37 % 251) as u8).collect()
}

/// A value built in Rust (not read from torch) with every writable dtype, views sharing storages, lazy
/// bits, parameters and every container kind.
fn rust_built_value() -> Value {
    use ckpt_tensor::{Buffer, Dict, DictKind};
    let mut dtypes = Dict::new(DictKind::Dict);
    for d in DType::ALL {
        if matches!(d, DType::QInt8 | DType::QUInt8 | DType::QInt32 | DType::QUInt4x2 | DType::QUInt2x4) {
            continue; // quantized dtypes exist only inside quantized tensors
        }
        if !d.in_torch() {
            continue; // safetensors' float6: torch has no dtype for it (the writer refuses it, tests/dtypes.rs)
        }
        let mut bytes = arange_bytes(6 * d.size());
        if d == DType::Bool {
            bytes.iter_mut().for_each(|b| *b &= 1);
        }
        let t = Tensor::from_buffer(d, &[2, 3], Buffer::from_vec(bytes)).unwrap();
        dtypes.insert(d.torch_name(), Value::Tensor(t));
    }
    let base = Tensor::from_slice(&(0..24).map(|i| i as f32 * 0.5 - 3.0).collect::<Vec<_>>(), &[4, 6]).unwrap();
    let expanded = Tensor::from_parts(DType::F32, &[3, 6], &[0, 1], 6, base.storage().clone()).unwrap();
    let u16s = Tensor::from_slice(&(0..8u16).collect::<Vec<_>>(), &[8]).unwrap();
    let cplx = Tensor::from_buffer(DType::C64, &[3], Buffer::from_vec(arange_bytes(24))).unwrap();
    let mut od = Dict::new(DictKind::OrderedDict);
    od.insert("w", Value::Tensor(base.clone()));
    od.attrs =
        Some(Box::new(Value::dict([("_metadata", Value::dict([("", Value::dict([("version", Value::Int(1))]))]))])));
    let mut int_keys = Dict::new(DictKind::Dict);
    int_keys.insert(Value::Int(0), Value::Str("zero".into()));
    int_keys.insert(Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 1]), Value::Float(-0.0));
    Value::dict([
        ("dtypes", Value::Dict(dtypes)),
        ("base", Value::Tensor(base.clone())),
        ("t", Value::Tensor(base.transpose(0, 1).unwrap())),
        ("slice", Value::Tensor(base.narrow(1, 2, 3).unwrap().narrow(0, 1, 2).unwrap())),
        ("expanded", Value::Tensor(expanded)),
        ("u16_view", Value::Tensor(u16s.narrow(0, 3, 4).unwrap())),
        ("scalar", Value::Tensor(Tensor::from_slice(&[7i64], &[]).unwrap())),
        ("empty", Value::Tensor(Tensor::zeros(DType::F16, &[2, 0, 3]).unwrap())),
        ("conj", Value::Tensor(cplx.clone().with_lazy_bits(true, false).unwrap())),
        ("cplx", Value::Tensor(cplx)),
        ("neg", Value::Tensor(base.narrow(0, 0, 1).unwrap().with_lazy_bits(false, true).unwrap())),
        ("param", Value::Parameter { tensor: base.clone().with_requires_grad(true), state: None }),
        (
            "param_state",
            Value::Parameter {
                tensor: Tensor::from_slice(&[1.0f64, 2.0], &[2]).unwrap(),
                state: Some(Box::new(Value::dict([("tag", Value::Str("x".into()))]))),
            },
        ),
        ("od", Value::Dict(od)),
        ("int_keys", Value::Dict(int_keys)),
        (
            "scalars",
            Value::List(vec![
                Value::None,
                Value::Bool(true),
                Value::Int(-(1 << 40)),
                Value::BigInt(vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x00, 0xf0]),
                Value::Float(f64::NAN),
                Value::Float(1e-300),
                Value::Complex(1.5, -2.0),
                Value::Str("héllo ✓".into()),
                Value::Bytes(b"\x00\xffbytes".to_vec()),
                Value::Bytes(Vec::new()),
                Value::ByteArray(b"ba".to_vec()),
                Value::Tuple(vec![Value::Int(1), Value::Tuple(vec![]), Value::List(vec![])]),
                Value::Set(vec![Value::Int(1), Value::Int(2), Value::Int(3)]),
                Value::Size(vec![2, 3]),
                Value::DType(DType::BF16),
                Value::Device { kind: "cuda".into(), index: Some(1) },
                Value::Device { kind: "cpu".into(), index: None },
            ]),
        ),
    ])
}

/// Tensor records without `storage_key` (keys are assigned per file), and the sharing classes by key.
fn tensor_records(tensors: &Json) -> (Vec<Json>, Vec<Vec<String>>) {
    let mut records = Vec::new();
    let mut classes: HashMap<String, Vec<String>> = HashMap::new();
    for t in tensors.as_array().unwrap() {
        let mut t = t.clone();
        let key = t["storage_key"].as_str().map(str::to_owned);
        let path = t["path"].as_str().unwrap().to_owned();
        t.as_object_mut().unwrap().remove("storage_key");
        records.push(t);
        if let Some(k) = key {
            classes.entry(k).or_default().push(path);
        }
    }
    let mut classes: Vec<Vec<String>> = classes.into_values().collect();
    classes.sort();
    (records, classes)
}

/// The manifest-style record of each tensor ckpt holds.
fn our_records(v: &Value) -> Json {
    let mut keys: Vec<Tensor> = Vec::new();
    let list: Vec<Json> = leaves(v)
        .unwrap()
        .into_iter()
        .filter_map(|e| leaf_tensor(e.value).map(|(t, kind)| (e.key, t, kind)))
        .map(|(path, t, kind)| {
            let key = match keys.iter().position(|k| k.storage().same_storage(t.storage())) {
                Some(i) => i,
                None => {
                    keys.push(t.clone());
                    keys.len() - 1
                }
            };
            let mut j = serde_json::json!({
                "path": path, "dtype": t.dtype().torch_name(), "shape": t.shape(), "stride": t.strides(),
                "storage_offset": t.storage_offset(), "requires_grad": t.requires_grad(), "kind": kind,
                "numel": t.numel(), "storage_nbytes": t.storage().len(), "sha256": sha256(t),
                "storage_key": key.to_string(),
            });
            if t.is_conj() {
                j["conj"] = Json::Bool(true);
            }
            if t.is_neg() {
                j["neg"] = Json::Bool(true);
            }
            if t.is_conj() || t.is_neg() {
                j["raw_sha256"] = Json::String(hex::encode(Sha256::digest(t.stored_data().unwrap())));
            }
            j
        })
        .collect();
    Json::Array(list)
}

/// Values built in Rust load in torch (weights_only, mmap) to exactly what ckpt says it wrote.
#[test]
fn rust_built_values_load_in_torch() {
    let value = rust_built_value();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("built.pt");
    ckpt_torch::save(&value, &out, &ckpt_torch::WriteOptions::default()).unwrap();
    let report: Json = serde_json::from_str(&run_python("check_loads.py", &[out.as_path()])).unwrap();
    let file = &report["files"][0];
    assert_eq!(file["ok"], Json::Bool(true), "torch could not load it: {file}");
    assert_eq!(file["tree"], typed_tree(&value), "torch sees another object tree");
    let (theirs, their_classes) = tensor_records(&file["tensors"]);
    let (ours, our_classes) = tensor_records(&our_records(&value));
    assert_eq!(theirs.len(), ours.len());
    for (a, b) in theirs.iter().zip(&ours) {
        assert_eq!(a, b, "tensor record differs");
    }
    assert_eq!(their_classes, our_classes, "storage sharing differs");
    // And ckpt reads its own file back to the same value.
    assert_eq!(typed_tree(TorchReader::open(&out).unwrap().value()), typed_tree(&value));
}
