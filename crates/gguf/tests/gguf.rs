//! ckpt-gguf against files written by gguf-py's `GGUFWriter` (conformance/fixtures/gguf, made by
//! conformance/python/gguf/make_fixtures.py): every metadata value, tensor info and tensor as gguf-py's
//! `GGUFReader` and `gguf.quants.dequantize` read them, and one test per rule a hostile file breaks.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ckpt_tensor::FormatError;
use std::path::PathBuf;

use ckpt_gguf::{GgmlType, GgufError, MetadataValue, Reader, ValueType, summarize};
use ckpt_tensor::{Buffer, DType, Fault};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conformance/fixtures/gguf")
}

fn manifest() -> Json {
    let text = std::fs::read_to_string(fixtures().join("manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Asserts that `value` is what gguf-py read: `types` is GGUFReader's type chain (an array's element type
/// after it), floats are the exact decimal of their value.
fn assert_value(key: &str, value: &MetadataValue, types: &[Json], expected: &Json) {
    let name = types.first().and_then(Json::as_str).unwrap();
    assert_eq!(value.value_type().name(), name, "{key}");
    match value {
        MetadataValue::Array(element_type, items) => {
            assert_eq!(element_type.name(), types[1].as_str().unwrap(), "{key}");
            let expected = expected.as_array().unwrap();
            assert_eq!(items.len(), expected.len(), "{key}");
            for (item, want) in items.iter().zip(expected) {
                assert_value(key, item, &types[1..], want);
            }
        }
        MetadataValue::F32(v) => {
            let want: f64 = expected.as_str().unwrap().parse().unwrap();
            assert_eq!(f64::from(*v).to_bits(), want.to_bits(), "{key}");
        }
        MetadataValue::F64(v) => {
            let want: f64 = expected.as_str().unwrap().parse().unwrap();
            assert_eq!(v.to_bits(), want.to_bits(), "{key}");
        }
        MetadataValue::String(s) => assert_eq!(Some(s.as_str()), expected.as_str(), "{key}"),
        MetadataValue::Bool(b) => assert_eq!(Some(*b), expected.as_bool(), "{key}"),
        MetadataValue::I8(_) | MetadataValue::I16(_) | MetadataValue::I32(_) | MetadataValue::I64(_) => {
            assert_eq!(Json::from(value.to_string().parse::<i64>().unwrap()), *expected, "{key}");
        }
        _ => assert_eq!(value.as_u64(), expected.as_u64(), "{key}"),
    }
}

#[test]
fn reads_every_fixture_as_gguf_py_does() {
    let manifest = manifest();
    let files = manifest["files"].as_object().unwrap();
    assert_eq!(files.len(), 4);
    let mut dequantized_types = Vec::new();
    for (file, want) in files {
        let reader = Reader::open(fixtures().join(file)).unwrap();
        assert_eq!(u64::from(reader.version()), want["version"].as_u64().unwrap(), "{file}");
        assert_eq!(reader.header().alignment, want["alignment"].as_u64().unwrap(), "{file}");
        assert_eq!(reader.header().data_offset, want["data_offset"].as_u64().unwrap(), "{file}");
        assert_eq!(sha256(reader.buffer().as_bytes()), want["sha256"].as_str().unwrap(), "{file}");

        let metadata = want["metadata"].as_array().unwrap();
        assert_eq!(reader.metadata().len(), metadata.len(), "{file}");
        for ((key, value), want) in reader.metadata().iter().zip(metadata) {
            assert_eq!(key, want["key"].as_str().unwrap(), "{file}");
            assert_value(key, value, want["types"].as_array().unwrap(), &want["value"]);
        }

        let tensors = want["tensors"].as_array().unwrap();
        assert_eq!(reader.tensors().len(), tensors.len(), "{file}");
        for (info, want) in reader.tensors().iter().zip(tensors) {
            let name = want["name"].as_str().unwrap();
            assert_eq!(info.name, name, "{file}");
            assert_eq!(info.ggml_type.name(), want["type"].as_str().unwrap(), "{file} {name}");
            let dims: Vec<u64> = want["dims"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
            // gguf-py's tensor.shape is GGUF's order, innermost first.
            assert_eq!(info.dims, dims, "{file} {name}");
            let shape: Vec<usize> =
                want["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            assert_eq!(info.shape(), shape, "{file} {name}: the torch-order shape");
            assert_eq!(reader.header().data_offset + info.offset, want["offset"].as_u64().unwrap(), "{name}");
            assert_eq!(info.n_bytes, want["n_bytes"].as_u64().unwrap(), "{file} {name}");
            let raw = reader.raw(name).unwrap();
            assert!(raw.is_mapped(), "{name}: zero-copy");
            assert_eq!(sha256(raw.as_bytes()), want["raw_sha256"].as_str().unwrap(), "{file} {name}");

            let tensor = reader.tensor(name).unwrap();
            assert_eq!(tensor.shape(), shape.as_slice(), "{file} {name}");
            match info.ggml_type.plain_dtype() {
                Some(dtype) => {
                    assert_eq!(tensor.dtype(), dtype, "{name}");
                    assert!(tensor.storage().is_mapped(), "{name}: plain tensors are windows of the map");
                }
                None => assert_eq!(tensor.dtype(), DType::F32, "{name}"),
            }
            if let Some(digest) = want.get("f32_sha256") {
                let values = reader.dequantize_f32(name).unwrap();
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                assert_eq!(sha256(&bytes), digest.as_str().unwrap(), "{file} {name}: f32 values differ from gguf-py's");
                dequantized_types.push(info.ggml_type);
            }
        }
    }
    for ggml_type in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
    ] {
        assert!(dequantized_types.contains(&ggml_type), "no fixture checks {ggml_type}");
    }
}

#[test]
fn dequantizes_to_f16_and_bf16_through_f32() {
    let reader = Reader::open(fixtures().join("quants.gguf")).unwrap();
    let f32s = reader.dequantize_f32("q4_k").unwrap();
    let f16s = reader.dequantize("q4_k", DType::F16).unwrap();
    assert_eq!(f16s.shape(), &[2, 512]);
    let want: Vec<u8> = f32s.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
    assert_eq!(f16s.storage().as_bytes(), want.as_slice());
    let bf16s = reader.dequantize("q4_k", DType::BF16).unwrap();
    let want: Vec<u8> = f32s.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect();
    assert_eq!(bf16s.storage().as_bytes(), want.as_slice());
    // Values are made a window at a time: any window is the same bytes as the whole.
    let lazy = reader.tensor("q4_k").unwrap();
    let whole: Vec<u8> = f32s.iter().flat_map(|v| v.to_le_bytes()).collect();
    for (start, end) in [(0, 4), (3, 1029), (1020, 2052), (4090, 4096), (0, 4096)] {
        let window = lazy.storage().slice(start..end).unwrap();
        assert_eq!(&*window.bytes().unwrap(), &whole[start..end], "{start}..{end}");
    }
    assert!(lazy.storage().is_deferred());
    let refused = reader.dequantize("q4_k", DType::I32).unwrap_err();
    assert!(matches!(refused.format_error::<GgufError>(), Some(GgufError::DequantizeDtype { .. })));
    // Integer tensors convert as `as` does.
    let metadata = Reader::open(fixtures().join("metadata.gguf")).unwrap();
    let ints = metadata.tensor("i16").unwrap();
    let want: Vec<f32> =
        ints.storage().as_bytes().chunks(2).map(|b| f32::from(i16::from_le_bytes([b[0], b[1]]))).collect();
    assert_eq!(metadata.dequantize_f32("i16").unwrap(), want);
}

#[test]
fn metadata_accessors_and_summaries() {
    let reader = Reader::open(fixtures().join("metadata.gguf")).unwrap();
    assert_eq!(reader.architecture(), Some("llama"));
    assert_eq!(reader.get("llama.context_length").and_then(MetadataValue::as_u64), Some(4096));
    let tokens = reader.get("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.as_array().unwrap().len(), 100);
    let short = summarize(tokens, 40);
    assert!(short.starts_with("[STRING; 100] [\"tok0\", \"tok1\""), "{short}");
    assert!(short.len() < 80, "{short}");
    assert_eq!(summarize(&MetadataValue::U8(3), 10), "3");
}

// ---- hostile files: one test per rule -------------------------------------------------------------------

/// A GGUF file laid out by hand: header fields, metadata and tensor infos as given, then the data.
struct Craft {
    version: u32,
    kvs: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
    alignment: usize,
}

impl Craft {
    fn new() -> Self {
        Craft { version: 3, kvs: Vec::new(), n_kv: 0, infos: Vec::new(), n_tensors: 0, data: Vec::new(), alignment: 32 }
    }

    fn string(out: &mut Vec<u8>, s: &[u8]) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s);
    }

    fn kv(mut self, key: &str, value_type: u32, value: &[u8]) -> Self {
        Craft::string(&mut self.kvs, key.as_bytes());
        self.kvs.extend(value_type.to_le_bytes());
        self.kvs.extend(value);
        self.n_kv += 1;
        self
    }

    fn tensor(mut self, name: &str, dims: &[u64], ggml_type: u32, offset: u64) -> Self {
        Craft::string(&mut self.infos, name.as_bytes());
        self.infos.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(ggml_type.to_le_bytes());
        self.infos.extend(offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }

    fn data(mut self, len: usize) -> Self {
        self.data = (0..len).map(|i| i as u8).collect();
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kvs);
        out.extend(&self.infos);
        while out.len() % self.alignment != 0 {
            out.push(0);
        }
        out.extend(&self.data);
        out
    }
}

fn open_bytes(bytes: Vec<u8>) -> ckpt_tensor::Result<Reader> {
    Reader::from_buffer(Buffer::from_vec(bytes))
}

/// The GgufError a file is refused with (its fault kept by the core error).
fn refusal(bytes: Vec<u8>) -> GgufError {
    let e = open_bytes(bytes).unwrap_err();
    let fault = e.fault();
    let gguf = into_gguf(e);
    assert_eq!(gguf.fault(), fault);
    gguf
}

fn into_gguf(e: ckpt_tensor::Error) -> GgufError {
    match e {
        ckpt_tensor::Error::Format { source, .. } => *source.downcast::<GgufError>().unwrap(),
        other => panic!("not a format error: {other}"),
    }
}

const F32: u32 = 0;
const STRING: u32 = 8;
const ARRAY: u32 = 9;
const UINT32: u32 = 4;

#[test]
fn a_valid_craft_opens() {
    let r = open_bytes(Craft::new().kv("k", UINT32, &7u32.to_le_bytes()).tensor("t", &[4], F32, 0).data(16).bytes())
        .unwrap();
    assert_eq!(r.tensor("t").unwrap().shape(), &[4]);
}

#[test]
fn refuses_what_is_not_gguf() {
    assert!(matches!(refusal(b"PK\x03\x04rest".to_vec()), GgufError::NotGguf { .. }));
    assert!(matches!(refusal(b"GG".to_vec()), GgufError::NotGguf { .. }));
    let mut big = Craft::new().bytes();
    big[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(matches!(refusal(big), GgufError::BigEndian { version: 3 }));
    let mut v1 = Craft::new();
    v1.version = 1;
    assert!(matches!(refusal(v1.bytes()), GgufError::UnsupportedVersion { version: 1 }));
}

#[test]
fn every_prefix_of_a_fixture_is_refused_without_panic() {
    let bytes = std::fs::read(fixtures().join("metadata.gguf")).unwrap();
    // The file ends with padding after the last tensor's data; every shorter prefix is refused.
    let reader = Reader::open(fixtures().join("metadata.gguf")).unwrap();
    let last = reader.tensors().iter().map(|t| t.offset + t.n_bytes).max().unwrap();
    let data_end = (reader.header().data_offset + last) as usize;
    for len in 0..data_end {
        let e = open_bytes(bytes[..len].to_vec()).unwrap_err();
        assert_eq!(e.fault(), Fault::Malformed, "prefix {len}: {e}");
    }
    let data_offset = reader.header().data_offset as usize;
    assert!(matches!(refusal(bytes[..data_offset - 40].to_vec()), GgufError::Truncated { .. }));
    assert!(matches!(refusal(bytes[..data_end - 1].to_vec()), GgufError::TensorOutOfBounds { .. }));
}

#[test]
fn refuses_absurd_counts() {
    let mut c = Craft::new();
    c.n_kv = u64::MAX;
    assert!(matches!(refusal(c.bytes()), GgufError::CountTooLarge { .. }));
    let mut c = Craft::new();
    c.n_tensors = 1 << 40;
    assert!(matches!(refusal(c.bytes()), GgufError::CountTooLarge { .. }));
    let mut array = UINT32.to_le_bytes().to_vec();
    array.extend((1u64 << 60).to_le_bytes());
    assert!(matches!(refusal(Craft::new().kv("a", ARRAY, &array).bytes()), GgufError::CountTooLarge { .. }));
    let mut string = (1u64 << 62).to_le_bytes().to_vec();
    string.extend(b"abc");
    assert!(matches!(refusal(Craft::new().kv("s", STRING, &string).bytes()), GgufError::Truncated { .. }));
}

#[test]
fn refuses_bad_metadata() {
    assert!(matches!(refusal(Craft::new().kv("k", 13, &[0; 8]).bytes()), GgufError::UnknownValueType { code: 13, .. }));
    let mut nested = Vec::new();
    for _ in 0..20 {
        nested.extend(ARRAY.to_le_bytes());
        nested.extend(1u64.to_le_bytes());
    }
    nested.extend(UINT32.to_le_bytes());
    nested.extend(0u64.to_le_bytes());
    assert!(matches!(refusal(Craft::new().kv("n", ARRAY, &nested).bytes()), GgufError::NestingTooDeep { .. }));
    let mut bad_utf8 = 2u64.to_le_bytes().to_vec();
    bad_utf8.extend([0xFF, 0xFE]);
    assert!(matches!(refusal(Craft::new().kv("s", STRING, &bad_utf8).bytes()), GgufError::NotUtf8 { .. }));
    let twice = Craft::new().kv("k", UINT32, &[0; 4]).kv("k", UINT32, &[0; 4]);
    assert!(matches!(refusal(twice.bytes()), GgufError::DuplicateKey { .. }));
    let not_power = Craft::new().kv("general.alignment", UINT32, &48u32.to_le_bytes());
    assert!(matches!(refusal(not_power.bytes()), GgufError::BadAlignment { .. }));
    let wrong_type = Craft::new().kv("general.alignment", 10, &32u64.to_le_bytes());
    assert!(matches!(refusal(wrong_type.bytes()), GgufError::BadAlignment { .. }));
    // An empty array keeps its element type.
    let mut empty = STRING.to_le_bytes().to_vec();
    empty.extend(0u64.to_le_bytes());
    let r = open_bytes(Craft::new().kv("e", ARRAY, &empty).bytes()).unwrap();
    assert_eq!(r.get("e"), Some(&MetadataValue::Array(ValueType::String, Vec::new())));
}

#[test]
fn refuses_bad_tensor_infos() {
    let many = Craft::new().tensor("t", &[1; 9], F32, 0).data(4);
    assert!(matches!(refusal(many.bytes()), GgufError::TooManyDims { n_dims: 9, .. }));
    let unknown = Craft::new().tensor("t", &[4], 4, 0).data(16);
    assert!(matches!(refusal(unknown.bytes()), GgufError::UnknownGgmlType { code: 4, .. }));
    let huge = Craft::new().tensor("t", &[u64::MAX / 2, 4], F32, 0).data(16);
    assert!(matches!(refusal(huge.bytes()), GgufError::ShapeOverflow { .. }));
    let partial = Craft::new().tensor("t", &[33], GgmlType::Q8_0.code(), 0).data(68);
    assert!(matches!(refusal(partial.bytes()), GgufError::PartialBlock { row: 33, .. }));
    let misaligned = Craft::new().tensor("t", &[4], F32, 4).data(32);
    assert!(matches!(refusal(misaligned.bytes()), GgufError::MisalignedOffset { offset: 4, .. }));
    let beyond = Craft::new().tensor("t", &[1 << 40], F32, 0).data(16);
    assert!(matches!(refusal(beyond.bytes()), GgufError::TensorOutOfBounds { .. }));
    let overlap = Craft::new().tensor("a", &[16], F32, 0).tensor("b", &[4], F32, 32).data(64);
    assert!(matches!(refusal(overlap.bytes()), GgufError::OverlappingTensors { .. }));
    let twice = Craft::new().tensor("a", &[4], F32, 0).tensor("a", &[4], F32, 32).data(64);
    assert!(matches!(refusal(twice.bytes()), GgufError::DuplicateTensor { .. }));
}

#[test]
fn refuses_requests_it_cannot_serve() {
    let iq = Craft::new().tensor("t", &[256], GgmlType::IQ2_XXS.code(), 0).data(66);
    let r = open_bytes(iq.bytes()).unwrap();
    assert_eq!(r.raw("t").unwrap().len(), 66, "raw blocks of a type ckpt does not dequantize read");
    let e = into_gguf(r.tensor("t").unwrap_err());
    assert!(matches!(e, GgufError::NotDequantized { ggml_type: GgmlType::IQ2_XXS }));
    assert_eq!(e.fault(), Fault::Unsupported);
    let e = into_gguf(r.tensor("missing").unwrap_err());
    assert!(matches!(e, GgufError::NoSuchTensor { .. }));
    let mut out = [0f32; 31];
    let e = ckpt_gguf::dequantize(GgmlType::Q4_0, &[0; 18], &mut out).unwrap_err();
    assert!(matches!(e, GgufError::BlockLength { .. }));
}
