//! GGUF files (issue 42, `conformance/fixtures/gguf/`, written by gguf-py's `GGUFWriter`): each is detected as
//! format `gguf`, lists its metadata as values and its tensors in torch-order shapes, verifies deep, converts to
//! safetensors, hf and torch with the values gguf-py's `gguf.quants.dequantize` gives (checked by gguf-py and
//! the real loaders) and diffs equal to its conversions; the tool inspects (metadata, ggml types), cats a
//! value and a tensor, and converts with `--dtype`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use ckpt::{ConvertOptions, DiffOptions, EntryKind, Format, convert};
use ckpt_conformance::{fixtures, run_python};

const FILES: [&str; 4] = ["metadata.gguf", "quants.gguf", "aligned64.gguf", "v2.gguf"];

fn gguf_fixture(name: &str) -> PathBuf {
    fixtures("gguf").join(name)
}

#[test]
fn every_fixture_opens_as_gguf_with_its_metadata_and_tensors() {
    for file in FILES {
        let path = gguf_fixture(file);
        assert_eq!(ckpt::detect(&path).unwrap(), Format::Gguf, "{file}");
        let ck = ckpt::open(&path).unwrap();
        let reader = ck.downcast_ref::<ckpt::gguf::Reader>().unwrap();
        let entries = ck.entries();
        assert_eq!(entries.len(), reader.metadata().len() + reader.tensors().len(), "{file}");
        for (e, (key, _)) in entries.iter().zip(reader.metadata()) {
            assert_eq!(&e.name, key);
            assert_eq!(e.kind, EntryKind::Value);
        }
        for (e, t) in entries.iter().skip(reader.metadata().len()).zip(reader.tensors()) {
            assert_eq!(e.name, t.name);
            let info = e.tensor_info().unwrap();
            assert_eq!(info.shape, t.shape(), "{file} {}", t.name);
            let tensor = ck.tensor(&e.name).unwrap();
            assert_eq!(tensor.dtype(), info.dtype);
            let want: Vec<u8> = reader.dequantize_f32(&t.name).unwrap().iter().flat_map(|v| v.to_le_bytes()).collect();
            let got = ckpt::tensor::cast::cast_float_lazy(&tensor, ckpt::DType::F32).unwrap_or(tensor.clone());
            if t.ggml_type.plain_dtype().is_none_or(|d| d.is_floating_point() && d != ckpt::DType::F64) {
                assert_eq!(&*got.data().unwrap(), want.as_slice(), "{file} {}", t.name);
            }
        }
        assert_eq!(ck.value("general.architecture").unwrap(), ckpt::Value::Str(reader.architecture().unwrap().into()));
    }
}

#[test]
fn every_fixture_verifies_deep_converts_and_diffs_equal() {
    let tmp = tempfile::tempdir().unwrap();
    for file in FILES {
        let src = gguf_fixture(file);
        let report = ckpt::verify(&src).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(report.is_ok(), "{file}: {:?}", report.problems);
        let n = ckpt::open(&src).unwrap().downcast_ref::<ckpt::gguf::Reader>().unwrap().tensors().len();
        for (to, name) in [(Format::Safetensors, "x.safetensors"), (Format::Torch, "x.pt"), (Format::Hf, "hf")] {
            let dst = tmp.path().join(format!("{file}.{name}"));
            let summary = convert(&src, None, &dst, to, &ConvertOptions::default()).unwrap();
            assert_eq!(summary.tensors, n, "{file} --to {to}");
            let d = ckpt::diff(&src, &dst, &DiffOptions::default().with_atol(0.0).with_rtol(0.0)).unwrap();
            if to == Format::Torch {
                // torch.save's entries name a list's items (`tokenizer.ggml.tokens.0`): the metadata arrays
                // are the GGUF side's layout keys whole, items on the torch side. Every tensor is equal.
                let keys: Vec<String> = ckpt::open(&src)
                    .unwrap()
                    .downcast_ref::<ckpt::gguf::Reader>()
                    .unwrap()
                    .metadata()
                    .iter()
                    .map(|(k, _)| format!("{k}."))
                    .collect();
                assert!(d.only_a.is_empty() && d.kind_changes.is_empty() && d.values_differ.is_empty(), "{d:?}");
                assert!(d.only_b.iter().all(|n| keys.iter().any(|k| n.starts_with(k.as_str()))), "{d:?}");
                assert_eq!(d.tensors.len(), n);
                assert!(d.tensors.iter().all(|t| t.mismatched == 0 && t.dtype.0 == t.dtype.1), "{d:?}");
            } else {
                assert!(d.is_equal(), "{file} vs {to}: {d:?}");
            }
            // gguf-py and the real loaders agree (torch.load once: it is slow to import).
            if to == Format::Safetensors || (to == Format::Torch && file == "quants.gguf") {
                let out = run_python("gguf/check_converted.py", &[&src, &dst]);
                assert!(out.contains(&format!("{n} tensors equal")), "{file} --to {to}: {out}");
            }
        }
    }
}

fn ckpt_tool(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ckpt"));
    for a in args {
        cmd.arg(a);
    }
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn the_tool_inspects_cats_verifies_and_converts() {
    let path = gguf_fixture("metadata.gguf");
    let (code, out) = ckpt_tool(&[&"inspect", &path]);
    assert_eq!(code, 0, "{out}");
    for line in
        ["architecture: llama", "context length: 4096", "vocabulary: 100 tokens", "tensor f16.3d: F16 ne [4, 3, 2]"]
    {
        assert!(out.contains(line), "{line}?\n{out}");
    }
    assert!(out.contains("tokenizer.ggml.tokens: [STRING; 100] [\"tok0\""), "long arrays summarized:\n{out}");
    assert!(out.contains("f16.3d") && out.contains("[2, 3, 4]"), "torch-order shape:\n{out}");
    let (code, out) = ckpt_tool(&[&"cat", &path, &"llama.context_length"]);
    assert_eq!((code, out.trim()), (0, "4096"));
    let quants = gguf_fixture("quants.gguf");
    let (code, out) = ckpt_tool(&[&"inspect", &quants]);
    assert!(code == 0 && out.contains("tensor q4_k: Q4_K ne [512, 2]"), "{out}");
    let (code, out) = ckpt_tool(&[&"cat", &quants, &"q8_0"]);
    assert!(code == 0 && out.starts_with("[["), "{out}");
    let (code, out) = ckpt_tool(&[&"verify", &"--deep", &quants]);
    assert_eq!(code, 0, "{out}");
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("q.safetensors");
    let (code, out) = ckpt_tool(&[&"convert", &quants, &dst, &"--to", &"safetensors", &"--dtype", &"bfloat16"]);
    assert_eq!(code, 0, "{out}");
    let st = ckpt::open(&dst).unwrap();
    let reader = ckpt::gguf::Reader::open(&quants).unwrap();
    for t in reader.tensors() {
        let want = reader.dequantize(&t.name, ckpt::DType::BF16).unwrap();
        let got = st.tensor(&t.name).unwrap();
        assert_eq!(got.dtype(), ckpt::DType::BF16);
        assert_eq!(&*got.data().unwrap(), &*want.data().unwrap(), "{}", t.name);
    }
    let (code, out) =
        ckpt_tool(&[&"convert", &dst, &tmp.path().join("bad.gguf"), &"--to", &"gguf", &"--quant", &"q4_k"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("q4_k: GGUF targets take"), "{out}");
}

#[test]
fn converts_to_gguf_as_gguf_py_quantizes() {
    let tmp = tempfile::tempdir().unwrap();
    for file in ["metadata.gguf", "quants.gguf"] {
        let src = gguf_fixture(file);
        // The source's values as float32 (quantized tensors dequantized as gguf-py does): what gguf-py quantizes.
        let values = tmp.path().join(format!("{file}.safetensors"));
        convert(&src, None, &values, Format::Safetensors, &ConvertOptions::default()).unwrap();
        for quant in ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4"] {
            let dst = tmp.path().join(format!("{file}.{quant}.gguf"));
            let (code, out) = ckpt_tool(&[&"convert", &src, &dst, &"--to", &"gguf", &"--quant", &quant]);
            assert_eq!(code, 0, "{file} {quant}: {out}");
            // One gguf-py run per file for the quantized types (each checks every tensor's blocks).
            if quant == "f32" || quant == "q4_1" || quant == "mxfp4" {
                let printed = run_python("gguf/check_written.py", &[&values, &dst, &src]);
                assert!(printed.contains("tensors equal"), "{file} {quant}: {printed}");
            }
            // Laid out as llama.cpp loads it (verify reports any other layout).
            let report = ckpt::verify(&dst).unwrap();
            assert!(report.is_ok(), "{file} {quant}: {:?}", report.problems);
            let back = ckpt::open(&dst).unwrap();
            let reader = back.downcast_ref::<ckpt::gguf::Reader>().unwrap();
            let source = ckpt::gguf::Reader::open(&src).unwrap();
            assert_eq!(reader.metadata(), source.metadata(), "{file} {quant}: the metadata carried over");
        }
        // Without --quant: every tensor in its own type (quantized ones as their f32 values), diffing equal.
        let dst = tmp.path().join(format!("{file}.plain.gguf"));
        let (code, out) = ckpt_tool(&[&"convert", &src, &dst, &"--to", &"gguf"]);
        assert_eq!(code, 0, "{file}: {out}");
        let written = ckpt::gguf::Reader::open(&dst).unwrap();
        for t in ckpt::gguf::Reader::open(&src).unwrap().tensors() {
            let want = if t.ggml_type.is_lossless() { t.ggml_type } else { ckpt::gguf::GgmlType::F32 };
            assert_eq!(written.ggml_type(&t.name).unwrap(), want, "{file} {}", t.name);
        }
        let d = ckpt::diff(&src, &dst, &DiffOptions::default().with_atol(0.0).with_rtol(0.0)).unwrap();
        assert!(d.is_equal(), "{file}: {d:?}");
    }
}

#[test]
fn verify_reports_a_layout_llama_cpp_refuses() {
    // quants.gguf with its last tensor (nvfp4: 2 dims) moved 32 bytes on, into 32 appended bytes: a gap that
    // ckpt and gguf-py read through, and llama.cpp refuses.
    let mut bytes = std::fs::read(gguf_fixture("quants.gguf")).unwrap();
    let name = b"\x05\x00\x00\x00\x00\x00\x00\x00nvfp4";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len() + 4 + 2 * 8 + 4;
    let offset = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    bytes[at..at + 8].copy_from_slice(&(offset + 32).to_le_bytes());
    bytes.extend([0u8; 32]);
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("gap.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let report = ckpt::verify(&path).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    let problem = &report.problems[0];
    assert_eq!(problem.kind, ckpt::ProblemKind::Inconsistent);
    assert!(problem.message.contains("llama.cpp refuses"), "{problem:?}");
    assert_eq!(ckpt::open(&path).unwrap().tensor("nvfp4").unwrap().shape(), &[2, 128]);
}
