//! GGUF files ckpt writes, checked by gguf-py (conformance/python/gguf/check_written.py): `GGUFReader` reads
//! them with the metadata written, and each tensor's blocks are the bytes `gguf.quants.quantize` makes of the
//! same float32 values, for every type ckpt writes; ckpt reads them back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use ckpt_gguf::{GgmlType, MetadataValue, Reader, ValueType, WriteOptions, save};
use ckpt_tensor::{DType, Tensor};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run_check(source: &Path, written: &Path, metadata: &Path) -> String {
    let python = root().join(".venv/bin/python");
    let script = root().join("conformance/python/gguf/check_written.py");
    let out = Command::new(&python).arg(&script).args([source, written, metadata]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// Deterministic values with the cases quantizers round at: a zero block, halves (Q8_0 rounds them away from
/// zero), a negative and a positive outlier, values equal in magnitude.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    let mut out: Vec<f32> = (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect();
    for v in out.iter_mut().take(32) {
        *v = 0.0;
    }
    for (i, v) in out.iter_mut().enumerate().skip(32).take(32) {
        *v = (i as f32 - 48.0) / 2.0 * (127.0 / 16.0) / 127.0 * 2.0;
    }
    if n > 100 {
        out[70] = -30.0;
        out[100] = 30.0;
        out[96] = -30.0;
    }
    out
}

#[test]
fn every_written_type_is_what_gguf_py_quantizes() {
    let tmp = tempfile::tempdir().unwrap();
    let source = vec![
        ("token_embd.weight".to_owned(), Tensor::from_slice(&values(6 * 64, 1), &[6, 64]).unwrap()),
        ("blk.0.attn_q.weight".to_owned(), Tensor::from_slice(&values(4 * 96, 2), &[4, 96]).unwrap()),
        ("blk.0.attn_norm.weight".to_owned(), Tensor::from_slice(&values(64, 3), &[64]).unwrap()),
        ("odd_rows".to_owned(), Tensor::from_slice(&values(3 * 20, 4), &[3, 20]).unwrap()),
        ("ids".to_owned(), Tensor::from_slice(&[1i32, -2, 3], &[3]).unwrap()),
        (
            "half".to_owned(),
            ckpt_tensor::cast::cast_float_lazy(&Tensor::from_slice(&values(2 * 32, 5), &[2, 32]).unwrap(), DType::BF16)
                .unwrap(),
        ),
    ];
    let src = tmp.path().join("source.safetensors");
    // The source as gguf-py sees it: float32 (bf16 widened exactly), integers as they are.
    let widened: Vec<(String, Tensor)> = source
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                if t.dtype() == DType::BF16 {
                    ckpt_tensor::cast::cast_float_lazy(t, DType::F32).unwrap()
                } else {
                    t.clone()
                },
            )
        })
        .collect();
    ckpt_safetensors::write_file(&widened, None, &src).unwrap();
    let metadata = vec![
        ("general.architecture".to_owned(), MetadataValue::String("llama".into())),
        ("llama.context_length".to_owned(), MetadataValue::U32(128)),
        ("general.name".to_owned(), MetadataValue::String("tiny ✓".into())),
        ("test.f32".to_owned(), MetadataValue::F32(0.5)),
        ("test.bool".to_owned(), MetadataValue::Bool(true)),
        (
            "tokenizer.ggml.tokens".to_owned(),
            MetadataValue::Array(
                ValueType::String,
                vec![MetadataValue::String("a".into()), MetadataValue::String("b".into())],
            ),
        ),
    ];
    let json = tmp.path().join("metadata.json");
    std::fs::write(
        &json,
        r#"{"general.architecture": "llama", "llama.context_length": 128, "general.name": "tiny ✓", "test.f32": 0.5, "test.bool": true, "tokenizer.ggml.tokens": ["a", "b"]}"#,
    )
    .unwrap();
    for quant in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::MXFP4,
    ] {
        let out = tmp.path().join(format!("{quant}.gguf"));
        let options = WriteOptions::default().with_quant(quant).with_metadata(metadata.clone());
        let report = save(&source, &out, &options).unwrap();
        assert_eq!(report.tensors, source.len());
        let printed = run_check(&src, &out, &json);
        assert!(printed.contains(&format!("{} tensors equal", source.len())), "{quant}: {printed}");
        // ckpt reads it back: the metadata as written, 2-D float tensors of whole blocks in `quant`.
        let back = Reader::open(&out).unwrap();
        assert_eq!(back.metadata(), metadata.as_slice());
        assert_eq!(back.ggml_type("blk.0.attn_q.weight").unwrap(), quant);
        assert_eq!(back.ggml_type("blk.0.attn_norm.weight").unwrap(), GgmlType::F32, "1-D stays F32");
        assert_eq!(back.ggml_type("ids").unwrap(), GgmlType::I32);
        assert_eq!(back.tensor("blk.0.attn_q.weight").unwrap().shape(), &[4, 96]);
        if quant == GgmlType::F32 {
            assert_eq!(back.tensor("token_embd.weight").unwrap().data().unwrap(), source[0].1.data().unwrap());
        }
    }
}

#[test]
fn without_quant_every_tensor_keeps_its_type() {
    let tmp = tempfile::tempdir().unwrap();
    let bf16 =
        ckpt_tensor::cast::cast_float_lazy(&Tensor::from_slice(&values(64, 9), &[64]).unwrap(), DType::BF16).unwrap();
    let source = vec![
        ("f32".to_owned(), Tensor::from_slice(&values(2 * 32, 7), &[2, 32]).unwrap()),
        ("f64".to_owned(), Tensor::from_slice(&[1.5f64, -2.25, 1e300], &[3]).unwrap()),
        ("bf16".to_owned(), bf16.clone()),
        ("i64".to_owned(), Tensor::from_slice(&[i64::MIN, 0, i64::MAX], &[3]).unwrap()),
    ];
    let out = tmp.path().join("plain.gguf");
    save(&source, &out, &WriteOptions::default()).unwrap();
    let back = Reader::open(&out).unwrap();
    for ((name, t), ggml_type) in source.iter().zip([GgmlType::F32, GgmlType::F64, GgmlType::BF16, GgmlType::I64]) {
        assert_eq!(back.ggml_type(name).unwrap(), ggml_type, "{name}");
        let got = back.tensor(name).unwrap();
        assert_eq!((got.dtype(), got.shape()), (t.dtype(), t.shape()), "{name}");
        assert_eq!(got.data().unwrap(), t.to_contiguous().unwrap().data().unwrap(), "{name}: lossless");
    }
}

#[test]
fn refuses_what_it_cannot_write() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x.gguf");
    let t = vec![("b".to_owned(), Tensor::from_slice(&[1u8, 0], &[2]).unwrap())];
    let e = save(&t, &out, &WriteOptions::default()).unwrap_err();
    assert!(matches!(e.format_error::<ckpt_gguf::GgufError>(), Some(ckpt_gguf::GgufError::UnwritableDtype { .. })));
    let f = vec![("f".to_owned(), Tensor::from_slice(&[1f32; 32], &[1, 32]).unwrap())];
    let e = save(&f, &out, &WriteOptions::default().with_quant(GgmlType::Q4_K)).unwrap_err();
    assert!(matches!(e.format_error::<ckpt_gguf::GgufError>(), Some(ckpt_gguf::GgufError::NotQuantized { .. })));
    let e = save(&f, &out, &WriteOptions::default().with_alignment(48)).unwrap_err();
    assert!(matches!(e.format_error::<ckpt_gguf::GgufError>(), Some(ckpt_gguf::GgufError::WriteAlignment { .. })));
    assert!(!out.exists(), "nothing is left at the destination");
}
