//! Writing GGUF files: [`save`] lays out a header (metadata and tensor infos) as gguf-py's `GGUFWriter` does,
//! then streams the tensors one at a time, each quantized as gguf-py's `gguf.quants.quantize` quantizes, into a
//! temporary file committed durably (`ckpt-io`: fsync and rename).

use std::io::Write;
use std::path::Path;

use ckpt_io::{Durability, FileOptions, SaveReport};
use ckpt_tensor::{DType, Result, Tensor};

use crate::header::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC};
use crate::metadata::{MetadataValue, write_string};
use crate::quantize::{can_quantize, quantize};
use crate::{GgmlType, GgufError};

/// How [`save`] writes.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WriteOptions {
    /// The type of the float tensors of two or more dimensions whose rows are whole blocks of it; the rest
    /// (1-D tensors such as norms and biases, rows of partial blocks) are written as F32, as llama.cpp's
    /// `convert_hf_to_gguf.py` keeps them. Integer tensors keep their type. `None` (the default): every
    /// tensor keeps its own type (F32, F16, BF16, F64, I8 to I64; other float dtypes as F32), losslessly.
    pub quant: Option<GgmlType>,
    /// The alignment of the tensor data (a power of two; `general.alignment` is written when it is not 32).
    pub alignment: u32,
    /// The metadata, in order (`general.architecture` first, as `GGUFWriter` writes it).
    pub metadata: Vec<(String, MetadataValue)>,
    /// How durably the file is committed.
    pub durability: Durability,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            quant: None,
            alignment: DEFAULT_ALIGNMENT as u32,
            metadata: Vec::new(),
            durability: Durability::default(),
        }
    }
}

impl WriteOptions {
    /// With the type of the tensors that can take it ([`WriteOptions::quant`]).
    pub fn with_quant(mut self, quant: GgmlType) -> Self {
        self.quant = Some(quant);
        self
    }

    /// With this metadata.
    pub fn with_metadata(mut self, metadata: Vec<(String, MetadataValue)>) -> Self {
        self.metadata = metadata;
        self
    }

    /// With this durability.
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// With this alignment.
    pub fn with_alignment(mut self, alignment: u32) -> Self {
        self.alignment = alignment;
        self
    }
}

/// The ggml type a tensor of `dtype` and `shape` (torch order) is written as under `quant`
/// ([`WriteOptions::quant`]).
///
/// # Errors
/// [`GgufError::UnwritableDtype`] for a dtype GGUF has no type for.
pub fn tensor_type(
    name: &str,
    dtype: DType,
    shape: &[usize],
    quant: Option<GgmlType>,
) -> std::result::Result<GgmlType, GgufError> {
    match dtype {
        DType::I8 => return Ok(GgmlType::I8),
        DType::I16 => return Ok(GgmlType::I16),
        DType::I32 => return Ok(GgmlType::I32),
        DType::I64 => return Ok(GgmlType::I64),
        d if d.is_floating_point() && !d.is_complex() => {}
        _ => return Err(GgufError::UnwritableDtype { name: name.to_owned(), dtype }),
    }
    let Some(quant) = quant else {
        return Ok(match dtype {
            DType::F16 => GgmlType::F16,
            DType::BF16 => GgmlType::BF16,
            DType::F64 => GgmlType::F64,
            _ => GgmlType::F32,
        });
    };
    let row = shape.last().copied().unwrap_or(1);
    if shape.len() >= 2 && row % quant.block_size() == 0 { Ok(quant) } else { Ok(GgmlType::F32) }
}

/// Writes `tensors` (names and tensors in torch order, written with GGUF's reversed dimensions) and the
/// options' metadata as a GGUF v3 file at `dst`, one tensor in memory at a time, committed durably.
///
/// # Errors
/// [`GgufError::NotQuantized`] for a `quant` ckpt does not write; [`GgufError::UnwritableDtype`];
/// [`GgufError::WriteAlignment`]; the commit's I/O errors.
pub fn save(tensors: &[(String, Tensor)], dst: impl AsRef<Path>, options: &WriteOptions) -> Result<SaveReport> {
    let dst = dst.as_ref();
    if let Some(quant) = options.quant.filter(|q| !can_quantize(*q)) {
        return Err(GgufError::NotQuantized { ggml_type: quant }.into());
    }
    if !options.alignment.is_power_of_two() {
        return Err(GgufError::WriteAlignment { alignment: options.alignment }.into());
    }
    let alignment = u64::from(options.alignment);
    let mut metadata: Vec<(String, MetadataValue)> =
        options.metadata.iter().filter(|(k, _)| k != ALIGNMENT_KEY).cloned().collect();
    if alignment != DEFAULT_ALIGNMENT {
        metadata.push((ALIGNMENT_KEY.to_owned(), MetadataValue::U32(options.alignment)));
    }
    let mut plan = Vec::with_capacity(tensors.len());
    let mut offset = 0u64;
    for (name, t) in tensors {
        let ggml_type = tensor_type(name, t.dtype(), t.shape(), options.quant)?;
        let n = t.numel() as u64;
        let n_bytes = n / ggml_type.block_size() as u64 * ggml_type.type_size() as u64;
        plan.push((name, t, ggml_type, offset, n_bytes));
        offset += n_bytes.div_ceil(alignment) * alignment;
    }
    let mut header = MAGIC.to_vec();
    header.extend(3u32.to_le_bytes());
    header.extend((plan.len() as u64).to_le_bytes());
    header.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in &metadata {
        write_string(&mut header, key);
        header.extend(value.value_type().code().to_le_bytes());
        value.write(&mut header);
    }
    for (name, t, ggml_type, offset, _) in &plan {
        write_string(&mut header, name);
        header.extend((t.shape().len() as u32).to_le_bytes());
        for d in t.shape().iter().rev() {
            header.extend((*d as u64).to_le_bytes());
        }
        header.extend(ggml_type.code().to_le_bytes());
        header.extend(offset.to_le_bytes());
    }
    pad(&mut header, alignment);
    let mut report = SaveReport::default();
    report.files.push(dst.to_path_buf());
    let file_options = FileOptions::default().with_durability(options.durability);
    ckpt_io::write_file(dst, &file_options, |w| -> Result<()> {
        let io = |e: std::io::Error| ckpt_tensor::Error::io(dst, e);
        w.write_all(&header).map_err(io)?;
        for (_, t, ggml_type, _, n_bytes) in &plan {
            let mut bytes = encode(t, *ggml_type)?;
            debug_assert_eq!(bytes.len() as u64, *n_bytes);
            pad(&mut bytes, alignment);
            w.write_all(&bytes).map_err(io)?;
            report.tensors += 1;
            report.bytes += n_bytes;
        }
        Ok(())
    })?;
    Ok(report)
}

/// Zero bytes to the next multiple of `alignment`.
fn pad(bytes: &mut Vec<u8>, alignment: u64) {
    let len = bytes.len() as u64;
    bytes.resize(len.div_ceil(alignment).saturating_mul(alignment) as usize, 0);
}

/// The bytes of `t` as `ggml_type`: integers and tensors kept in their own type as stored, floats as f32
/// values quantized.
fn encode(t: &Tensor, ggml_type: GgmlType) -> Result<Vec<u8>> {
    if ggml_type.plain_dtype() == Some(t.dtype()) {
        return Ok(t.to_contiguous()?.data()?.into_owned());
    }
    let f32s = if t.dtype() == DType::F32 { t.clone() } else { ckpt_tensor::cast::cast_float_lazy(t, DType::F32)? };
    let data = f32s.to_contiguous()?.data()?.into_owned();
    let values: Vec<f32> = data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let n_bytes = values.len() / ggml_type.block_size() * ggml_type.type_size();
    let mut out = vec![0u8; n_bytes];
    quantize(ggml_type, &values, &mut out)?;
    Ok(out)
}
