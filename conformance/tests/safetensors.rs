//! ckpt's safetensors files with per-tensor checksums in the header (`ckpt.crc32c`, issue 12) load in the
//! Hugging Face `safetensors` library: every tensor and the metadata map as written.

#![allow(clippy::unwrap_used)]

use ckpt_conformance::run_python;
use ckpt_safetensors::{self as safetensors, CHECKSUMS_KEY, metadata};
use ckpt_tensor::{Tensor, Value};

#[test]
fn checksummed_safetensors_file_loads_in_python_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let w: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
    let sd = Value::dict([
        ("w", Value::Tensor(Tensor::from_slice(&w, &[4, 6]).unwrap())),
        ("b", Value::Tensor(Tensor::from_slice(&[7i64, -8, 9], &[3]).unwrap())),
        ("u", Value::Tensor(Tensor::from_slice(&[1u8, 255], &[2]).unwrap())),
    ]);
    metadata::save(&sd, &path, &metadata::WriteOptions::default()).unwrap();
    let written = safetensors::read_file(&path).unwrap();
    assert_eq!(safetensors::checksums(&written).unwrap().unwrap(), Vec::<String>::new());
    let recorded = written.metadata.clone().unwrap();
    assert_eq!(recorded[CHECKSUMS_KEY].len(), 8 * 3);

    let out = run_python("safetensors/check_checksummed.py", &[&path]);
    let doc: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let meta = doc["metadata"].as_object().unwrap();
    for (k, v) in &recorded {
        assert_eq!(meta[k].as_str(), Some(v.as_str()), "metadata {k}");
    }
    let t = &doc["tensors"];
    assert_eq!(t["w"]["dtype"], "torch.float32");
    assert_eq!(t["w"]["shape"], serde_json::json!([4, 6]));
    let got: Vec<f64> = t["w"]["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(got, w.iter().map(|&x| f64::from(x)).collect::<Vec<_>>());
    assert_eq!(t["b"]["dtype"], "torch.int64");
    assert_eq!(t["b"]["values"], serde_json::json!([7.0, -8.0, 9.0]));
    assert_eq!(t["u"]["dtype"], "torch.uint8");
    assert_eq!(t["u"]["values"], serde_json::json!([1.0, 255.0]));
}
