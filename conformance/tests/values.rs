//! What users load (issue 11), against the files torch, numpy, safetensors and huggingface_hub wrote
//! (`conformance/fixtures/values/`, `make_values_fixtures.py`): numpy scalars and arrays read as numpy values
//! and tensors of their dtype, unsupported numpy dtypes named, a whole `torch.save(model)` listed as its
//! `model.state_dict()`, a Lightning checkpoint; and every one of them written back by ckpt loads in torch
//! as the original does (`check_values.py`: numpy types, dtypes, bits and memory order; module classes and
//! state dicts; `weights_only=True` with the same globals allowed).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use ckpt_conformance::{fixtures, float_hex, run_python};
use ckpt_tensor::{CheckpointRead, DType, EntryKind, Value};
use ckpt_torch::TorchReader;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

fn dir() -> PathBuf {
    fixtures("values")
}

fn manifest(name: &str) -> Json {
    serde_json::from_slice(&std::fs::read(dir().join(name)).unwrap()).unwrap()
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// dtype, shape and sha256 of a tensor's row-major bytes, as the manifests record them.
fn tensor_record(t: &ckpt_tensor::Tensor) -> (String, Vec<u64>, String) {
    let c = t.to_contiguous().unwrap();
    (t.dtype().torch_name().to_owned(), t.shape().iter().map(|d| *d as u64).collect(), sha(&c.data().unwrap()))
}

fn manifest_record(j: &Json) -> (String, Vec<u64>, String) {
    (
        j["dtype"].as_str().unwrap().to_owned(),
        j["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect(),
        j["sha256"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn committed_files_are_the_ones_the_generator_stamped() {
    let stamp = manifest("STAMP.json");
    let files = stamp["files"].as_object().unwrap();
    assert!(files.len() >= 9, "{files:?}");
    for (name, want) in files {
        assert_eq!(sha(&std::fs::read(dir().join(name)).unwrap()), want.as_str().unwrap(), "{name}");
    }
    let generator = ckpt_conformance::repo_root().join("conformance/python/make_values_fixtures.py");
    assert_eq!(sha(&std::fs::read(generator).unwrap()), stamp["generator_sha256"].as_str().unwrap());
}

#[test]
fn numpy_scalars_and_arrays_read_as_numpy_wrote_them() {
    let m = manifest("numpy.json");
    let r = TorchReader::open(dir().join("numpy.pt")).unwrap();
    let want = m["entries"].as_object().unwrap();
    let entries = r.entries();
    // serde_json keeps keys sorted; the order is checked against Python in the round trip below.
    let mut names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    names.sort_unstable();
    let mut want_names: Vec<&str> = want.keys().map(String::as_str).collect();
    want_names.sort_unstable();
    assert_eq!(names, want_names);
    let (mut scalars, mut arrays) = (0, 0);
    for e in &entries {
        let w = &want[&e.name];
        let v = r.get(&e.name).unwrap();
        match w["kind"].as_str().unwrap() {
            "tensor" => {
                let EntryKind::Tensor(_) = e.kind else { panic!("{}: {:?}", e.name, e.kind) };
                assert_eq!(tensor_record(&r.tensor(&e.name).unwrap()), manifest_record(w), "{}", e.name);
            }
            "numpy" if w["type"] == "numpy.ndarray" => {
                arrays += 1;
                let Value::Numpy(n) = v else { panic!("{}: {v:?}", e.name) };
                assert!(n.is_array());
                assert_eq!(n.type_name(), "numpy.ndarray");
                assert_eq!(n.dtype.torch_name(), w["dtype"].as_str().unwrap(), "{}", e.name);
                // Listed by inspect as a tensor of the numpy dtype, readable as one.
                let EntryKind::Tensor(info) = &e.kind else { panic!("{}: {:?}", e.name, e.kind) };
                assert_eq!(info.dtype, n.dtype);
                let t = r.tensor(&e.name).unwrap();
                assert_eq!(tensor_record(&t), manifest_record(w), "{}", e.name);
                // Fortran-ordered data keeps its column-major strides.
                let fortran = t.dim() > 1 && t.strides().first() < t.strides().last();
                assert_eq!(fortran, w["fortran"].as_bool().unwrap(), "{}", e.name);
            }
            "numpy" => {
                scalars += 1;
                let Value::Numpy(n) = v else { panic!("{}: {v:?}", e.name) };
                assert_eq!(
                    n.type_name(),
                    w["type"].as_str().unwrap().replace("numpy.bool_", "numpy.bool"),
                    "{}",
                    e.name
                );
                assert_eq!(n.dtype.torch_name(), w["dtype"].as_str().unwrap(), "{}", e.name);
                assert_eq!(n.module, "numpy._core.multiarray");
                let value = &w["value"];
                match &n.value {
                    Value::Float(f) => assert_eq!(float_hex(*f), value.as_str().unwrap(), "{}", e.name),
                    Value::Int(i) => assert_eq!(i.to_string(), value.as_str().unwrap(), "{}", e.name),
                    Value::BigInt(b) => assert_eq!(ckpt_tensor::value::bigint_decimal(b), value.as_str().unwrap()),
                    Value::Bool(b) => assert_eq!(Some(*b), value.as_bool(), "{}", e.name),
                    Value::Complex(re, im) => {
                        assert_eq!(
                            [float_hex(*re), float_hex(*im)],
                            [value[0].as_str().unwrap(), value[1].as_str().unwrap()]
                        )
                    }
                    other => panic!("{}: {other:?}", e.name),
                }
                assert!(matches!(e.kind, EntryKind::Value), "{}", e.name);
            }
            other => panic!("{other}"),
        }
    }
    assert_eq!((scalars, arrays), (7, 4));
    // Scalars read as the Python numbers they are.
    assert_eq!(r.get("best_acc").unwrap().as_f64(), Some(0.8125));
    assert_eq!(r.get("step").unwrap().as_int(), Some(1200));
    assert_eq!(ckpt_tensor::flatten::python_str(r.get("phase").unwrap()).unwrap(), "(1.5-0.25j)");
    assert_eq!(ckpt_tensor::flatten::python_str(r.get("lr").unwrap()).unwrap(), "0.5");
}

#[test]
fn numpy_values_read_from_the_legacy_stream() {
    let m = manifest("numpy_legacy.json");
    let r = TorchReader::open(dir().join("numpy_legacy.pt")).unwrap();
    assert_eq!(r.container(), ckpt_torch::Container::Legacy);
    let Value::Numpy(acc) = r.get("best_acc").unwrap() else { panic!("{:?}", r.value()) };
    assert_eq!(
        (acc.dtype, float_hex(acc.value.as_f64().unwrap())),
        (DType::F64, m["entries"]["best_acc"]["value"].as_str().unwrap().to_owned())
    );
    assert_eq!(tensor_record(&r.tensor("hist").unwrap()), manifest_record(&m["entries"]["hist"]));
}

#[test]
fn unsupported_numpy_dtypes_are_named() {
    let r = TorchReader::open(dir().join("numpy_unsupported.pt")).unwrap();
    for (name, named) in [("objects", "object dtype '|O8'"), ("records", "structured dtype '|V12'")] {
        let e = r.tensor(name).unwrap_err().to_string();
        assert!(e.contains(named) && e.contains(name), "{e}");
        // Kept as the pickled object, so that writing back gives the same numpy array.
        assert!(matches!(r.get(name).unwrap(), Value::Object(_)));
    }
    let Value::Numpy(ok) = r.get("ok").unwrap() else { panic!() };
    assert_eq!((ok.dtype, &ok.value), (DType::F64, &Value::Float(1.0)));
}

#[test]
fn a_whole_module_lists_its_state_dict_and_classes() {
    let m = manifest("module_whole.json");
    let r = TorchReader::open(dir().join("module_whole.pt")).unwrap();
    assert!(ckpt_torch::is_module(r.value()));
    let sd = m["state_dict"].as_object().unwrap();
    let names: Vec<String> = r.entries().into_iter().map(|e| e.name).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, sd.keys().cloned().collect::<Vec<_>>());
    // model.state_dict()'s order: each module's parameters, then its buffers, then its children.
    assert_eq!(
        names,
        [
            "0.weight",
            "0.bias",
            "1.weight",
            "1.bias",
            "1.running_mean",
            "1.running_var",
            "1.num_batches_tracked",
            "3.0.weight"
        ]
    );
    for n in &names {
        assert_eq!(tensor_record(&r.tensor(n).unwrap()), manifest_record(&sd[n]), "{n}");
    }
    let details = r.details();
    let classes = &details.iter().find(|(k, _)| k == "module classes").unwrap().1;
    for c in m["module_classes"].as_array().unwrap() {
        assert!(classes.contains(c.as_str().unwrap()), "{classes} lacks {c}");
    }
    assert_eq!(details.iter().find(|(k, _)| k == "module").unwrap().1, "torch.nn.modules.container.Sequential");
}

#[test]
fn a_lightning_checkpoint_lists_every_leaf() {
    let m = manifest("lightning.json");
    let r = TorchReader::open(dir().join("lightning.ckpt")).unwrap();
    let want = m["entries"].as_object().unwrap();
    let mut tensors = 0;
    for e in r.entries() {
        let w = &want[&e.name];
        assert!(!w.is_null(), "{} is not a leaf Python has", e.name);
        if w["kind"] == "tensor" {
            tensors += 1;
            assert_eq!(tensor_record(&r.tensor(&e.name).unwrap()), manifest_record(w), "{}", e.name);
        }
    }
    assert_eq!(r.entries().len(), want.len());
    assert!(tensors >= 20, "{tensors}");
}

/// ckpt's writer, given what ckpt read, gives a file torch loads as it loads the original.
#[test]
fn written_back_loads_in_torch_as_the_original() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["numpy.pt", "numpy_legacy.pt", "numpy_unsupported.pt", "module_whole.pt", "lightning.ckpt"] {
        let src = dir().join(name);
        let value = ckpt_torch::load(&src).unwrap();
        let out = tmp.path().join(Path::new(name).with_extension("pt"));
        ckpt_torch::save(&value, &out, &ckpt_torch::WriteOptions::default()).unwrap();
        let report = run_python("check_values.py", &[&src, &out]);
        assert!(report.contains("weights_only=False: equal"), "{name}: {report}");
        // torch's weights-only unpickler builds numpy values and modules once their globals are allowed.
        assert!(report.contains("weights_only=True with those globals: equal"), "{name}: {report}");
        // And ckpt reads its own output as it read the original.
        assert!(ckpt_torch::load(&out).unwrap().same(&value), "{name}");
    }
}
