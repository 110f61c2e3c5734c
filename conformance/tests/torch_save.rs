//! torch.save conformance: every golden fixture written by torch 2.13 reads exactly as its manifest says;
//! every file ckpt writes loads in torch (weights_only, mmap, calculated storage offsets) to equal values;
//! a contiguous state dict is written byte for byte as torch.save writes it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use ckpt_conformance::{fixtures, run_python, typed_tree};
use ckpt_core::{CheckpointRead, DType, PathItem, Tensor, Value, flatten, leaves};
use ckpt_torch::{ReadOptions, TorchFile};
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

fn open(path: &Path) -> TorchFile {
    TorchFile::open_with(path, &ReadOptions::default().with_verify_crc(true))
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
        let manifest_paths: Vec<&str> = m["tensors"].as_array().unwrap().iter().map(|t| t["path"].as_str().unwrap()).collect();
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

#[test]
fn opaque_tensors_refuse_data_access() {
    let file = open(&fixtures("torch").join("special.pt"));
    let opaque: Vec<_> = file
        .entries()
        .into_iter()
        .filter(|e| matches!(e.kind, ckpt_core::EntryKind::OpaqueTensor(_)))
        .collect();
    assert!(opaque.len() >= 3, "sparse COO, sparse CSR and quantized expected: {opaque:?}");
    for e in opaque {
        let err = file.tensor(&e.name).unwrap_err();
        assert!(matches!(err, ckpt_core::Error::Unsupported(_)), "{}: {err}", e.name);
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
        ckpt_torch::save(file.value(), &out).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // What we wrote reads back to the same tree.
        assert_eq!(typed_tree(TorchFile::open(&out).unwrap().value()), typed_tree(file.value()));
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
    ckpt_torch::save(file.value(), &out).unwrap();
    let (a, b) = (fs::read(&original).unwrap(), fs::read(&out).unwrap());
    assert_eq!(a.len(), b.len(), "file sizes differ");
    let first_diff = a.iter().zip(&b).position(|(x, y)| x != y);
    assert_eq!(first_diff, None, "first differing byte at {first_diff:?}");
}
