//! A GGUF file as a checkpoint ([`CheckpointRead`]): its metadata as values and its tensors, each under its
//! name in the file.

use ckpt_tensor::{CheckpointRead, DType, Entry, EntryKind, Result, Tensor, TensorInfo, Value};

use crate::metadata::{MetadataValue, summarize};
use crate::{GgufError, Reader};

/// Metadata values longer than this are summarized in [`CheckpointRead::details`].
const DETAIL_WIDTH: usize = 96;

impl CheckpointRead for Reader {
    fn format_name(&self) -> &'static str {
        "gguf"
    }

    /// Every metadata key (a value), then every tensor: a plain type as its own dtype, a quantized type as
    /// float32 (its values dequantized when read), in the logical shape (torch order).
    fn entries(&self) -> Vec<Entry> {
        let values = self.metadata().iter().map(|(key, _)| Entry { name: key.clone(), kind: EntryKind::Value });
        let tensors = self.tensors().iter().map(|t| Entry {
            name: t.name.clone(),
            kind: EntryKind::Tensor(TensorInfo {
                dtype: t.ggml_type.plain_dtype().unwrap_or(DType::F32),
                shape: t.shape(),
            }),
        });
        values.chain(tensors).collect()
    }

    /// The version, the alignment, the architecture, context length and vocabulary size when the file has
    /// them, every metadata value (long arrays summarized), and each tensor's ggml type and dimensions as
    /// GGUF stores them (innermost first).
    fn details(&self) -> Vec<(String, String)> {
        let mut out = vec![
            ("version".to_owned(), self.version().to_string()),
            ("alignment".to_owned(), self.header().alignment.to_string()),
        ];
        if let Some(arch) = self.architecture() {
            out.push(("architecture".to_owned(), arch.to_owned()));
            if let Some(n) = self.get(&format!("{arch}.context_length")).and_then(MetadataValue::as_u64) {
                out.push(("context length".to_owned(), n.to_string()));
            }
        }
        if let Some(tokens) = self.get("tokenizer.ggml.tokens").and_then(MetadataValue::as_array) {
            out.push(("vocabulary".to_owned(), format!("{} tokens", tokens.len())));
        }
        for (key, value) in self.metadata() {
            out.push((key.clone(), summarize(value, DETAIL_WIDTH)));
        }
        for t in self.tensors() {
            out.push((format!("tensor {}", t.name), format!("{} ne {:?}", t.ggml_type, t.dims)));
        }
        out
    }

    fn tensor(&self, name: &str) -> Result<Tensor> {
        Reader::tensor(self, name)
    }

    /// A metadata value as Python holds it (integers, floats, bools, strings, lists); a tensor's name gives
    /// the tensor.
    fn value(&self, name: &str) -> Result<Value> {
        if let Some(value) = self.get(name) {
            return Ok(python_value(value));
        }
        if self.tensor_info(name).is_ok() {
            return Ok(Value::Tensor(Reader::tensor(self, name)?));
        }
        Err(GgufError::NoSuchEntry { name: name.to_owned() }.into())
    }
}

/// A metadata value as the Python value gguf-py's reader gives (`int`, `float`, `bool`, `str`, `list`).
pub fn python_value(value: &MetadataValue) -> Value {
    match value {
        MetadataValue::U8(v) => Value::Int((*v).into()),
        MetadataValue::I8(v) => Value::Int((*v).into()),
        MetadataValue::U16(v) => Value::Int((*v).into()),
        MetadataValue::I16(v) => Value::Int((*v).into()),
        MetadataValue::U32(v) => Value::Int((*v).into()),
        MetadataValue::I32(v) => Value::Int((*v).into()),
        MetadataValue::I64(v) => Value::Int(*v),
        MetadataValue::U64(v) => match i64::try_from(*v) {
            Ok(v) => Value::Int(v),
            // Beyond i64: Python's int, as little-endian two's complement of minimal length (a zero byte
            // keeps it positive).
            Err(_) => {
                let mut bytes = v.to_le_bytes().to_vec();
                bytes.push(0);
                Value::BigInt(bytes)
            }
        },
        MetadataValue::F32(v) => Value::Float((*v).into()),
        MetadataValue::F64(v) => Value::Float(*v),
        MetadataValue::Bool(v) => Value::Bool(*v),
        MetadataValue::String(v) => Value::Str(v.clone()),
        MetadataValue::Array(_, items) => Value::List(items.iter().map(python_value).collect()),
    }
}
