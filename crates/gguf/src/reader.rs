//! [`Reader`]: a GGUF file's header and its tensors, zero-copy over a memory map.

use std::collections::HashMap;
use std::path::Path;

use ckpt_tensor::{Buffer, DType, Result, Tensor};
use half::{bf16, f16};

use crate::dequantize::{can_dequantize, dequantize};
use crate::header::{Header, TensorInfo};
use crate::metadata::MetadataValue;
use crate::{GgmlType, GgufError};

/// A GGUF file, its header parsed and checked whole at open; tensors are windows of the map.
#[derive(Clone, Debug)]
pub struct Reader {
    buffer: Buffer,
    header: Header,
    by_name: HashMap<String, usize>,
}

impl Reader {
    /// Maps and opens the GGUF file at `path`.
    ///
    /// # Errors
    /// An I/O error naming the path; a [`GgufError`] for a file that is not valid GGUF.
    pub fn open(path: impl AsRef<Path>) -> Result<Reader> {
        Reader::from_buffer(Buffer::map_file(path.as_ref())?)
    }

    /// Opens a GGUF file held in `buffer`.
    ///
    /// # Errors
    /// A [`GgufError`] for bytes that are not a valid GGUF file.
    pub fn from_buffer(buffer: Buffer) -> Result<Reader> {
        let header = Header::parse(buffer.as_bytes())?;
        let by_name = header.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(Reader { buffer, header, by_name })
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// The metadata, in file order.
    pub fn metadata(&self) -> &[(String, MetadataValue)] {
        &self.header.metadata
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.header.get(key)
    }

    /// `general.architecture` (`"llama"`), if the file names one.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(MetadataValue::as_str)
    }

    /// The tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The info of the tensor `name`.
    ///
    /// # Errors
    /// [`GgufError::NoSuchTensor`].
    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        self.by_name
            .get(name)
            .and_then(|&i| self.header.tensors.get(i))
            .ok_or_else(|| GgufError::NoSuchTensor { name: name.to_owned() }.into())
    }

    /// The raw bytes of the tensor `name` (its blocks, for a quantized type), a window of the map.
    ///
    /// # Errors
    /// [`GgufError::NoSuchTensor`].
    pub fn raw(&self, name: &str) -> Result<Buffer> {
        let info = self.tensor_info(name)?;
        self.raw_of(info)
    }

    fn raw_of(&self, info: &TensorInfo) -> Result<Buffer> {
        // The extent was checked against the file at open.
        let start = self.header.data_offset.saturating_add(info.offset);
        let start = usize::try_from(start).map_err(|_| out_of_bounds(info, self.buffer.len()))?;
        let len = usize::try_from(info.n_bytes).map_err(|_| out_of_bounds(info, self.buffer.len()))?;
        self.buffer.slice_len(start, len)
    }

    /// The tensor `name` with its logical shape (torch order, [`TensorInfo::shape`]): a plain type (F32, F16,
    /// BF16, F64, I8 to I64) as its own dtype, a window of the map; a quantized type dequantized to f32.
    ///
    /// # Errors
    /// [`GgufError::NoSuchTensor`]; [`GgufError::NotDequantized`] for a type ckpt does not dequantize yet.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let info = self.tensor_info(name)?;
        match info.ggml_type.plain_dtype() {
            Some(dtype) => Tensor::from_buffer(dtype, &info.shape(), self.raw_of(info)?),
            None => self.dequantize(name, DType::F32),
        }
    }

    /// The values of the tensor `name` as f32, bit for bit as gguf-py's `gguf.quants.dequantize` (the integer
    /// types and F64 converted as Rust's `as` does; gguf-py does not dequantize them).
    ///
    /// # Errors
    /// [`GgufError::NoSuchTensor`]; [`GgufError::NotDequantized`] for a type ckpt does not dequantize yet.
    pub fn dequantize_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.tensor_info(name)?;
        let raw = self.raw_of(info)?;
        let n = usize::try_from(info.n_elements()).map_err(|_| out_of_bounds(info, self.buffer.len()))?;
        let mut out = Vec::new();
        out.try_reserve_exact(n).map_err(|_| ckpt_tensor::Error::AllocationFailed { bytes: n.saturating_mul(4) })?;
        out.resize(n, 0.0);
        dequantize(info.ggml_type, raw.as_bytes(), &mut out)?;
        Ok(out)
    }

    /// The tensor `name` dequantized to `dtype` (float32, or float16/bfloat16 rounded from the f32 values to
    /// nearest even), with its logical shape. The values are made when they are read, a range at a time
    /// (a writer streaming the tensor holds one piece of it, [`Buffer::deferred_ranged`]).
    ///
    /// # Errors
    /// [`GgufError::DequantizeDtype`] for another dtype; [`GgufError::NotDequantized`] for a type ckpt does not
    /// dequantize yet; [`GgufError::NoSuchTensor`].
    pub fn dequantize(&self, name: &str, dtype: DType) -> Result<Tensor> {
        let info = self.tensor_info(name)?;
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(GgufError::DequantizeDtype { dtype }.into());
        }
        if !can_dequantize(info.ggml_type) {
            return Err(GgufError::NotDequantized { ggml_type: info.ggml_type }.into());
        }
        let raw = self.raw_of(info)?;
        let n = usize::try_from(info.n_elements()).map_err(|_| out_of_bounds(info, self.buffer.len()))?;
        let (ggml_type, size) = (info.ggml_type, dtype.size());
        let len = n.checked_mul(size).ok_or_else(|| out_of_bounds(info, self.buffer.len()))?;
        let values = Buffer::deferred_ranged(len, move |offset, out| {
            fill_dequantized(ggml_type, raw.as_bytes(), dtype, offset, out).map_err(ckpt_tensor::Error::from)
        });
        Tensor::from_buffer(dtype, &info.shape(), values)
    }

    /// The whole file's bytes (the map).
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// The ggml type of the tensor `name`.
    ///
    /// # Errors
    /// [`GgufError::NoSuchTensor`].
    pub fn ggml_type(&self, name: &str) -> Result<GgmlType> {
        Ok(self.tensor_info(name)?.ggml_type)
    }
}

fn out_of_bounds(info: &TensorInfo, file_len: usize) -> ckpt_tensor::Error {
    GgufError::TensorOutOfBounds {
        tensor: info.name.clone(),
        start: info.offset,
        end: info.offset.saturating_add(info.n_bytes),
        file_len: file_len as u64,
    }
    .into()
}

/// Writes the bytes `offset..offset + out.len()` of the values of `blocks` (of `ggml_type`) as `dtype` into
/// `out`: the blocks those bytes fall in are dequantized, and the window copied.
fn fill_dequantized(
    ggml_type: GgmlType,
    blocks: &[u8],
    dtype: DType,
    offset: usize,
    out: &mut [u8],
) -> std::result::Result<(), GgufError> {
    let (block_size, type_size, size) = (ggml_type.block_size(), ggml_type.type_size(), dtype.size());
    let block_bytes = block_size * size;
    let first = offset / block_bytes;
    let end = offset.saturating_add(out.len()).div_ceil(block_bytes);
    let wrong_length = || GgufError::BlockLength {
        ggml_type,
        bytes: blocks.len(),
        values: offset.saturating_add(out.len()) / size,
        block_size,
        type_size,
    };
    let source = blocks.get(first * type_size..end * type_size).ok_or_else(wrong_length)?;
    let mut values = vec![0f32; (end - first) * block_size];
    dequantize(ggml_type, source, &mut values)?;
    let bytes: Vec<u8> = match dtype {
        DType::F16 => values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
        DType::BF16 => values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    };
    let skip = offset - first * block_bytes;
    let window = bytes.get(skip..skip + out.len()).ok_or_else(wrong_length)?;
    out.copy_from_slice(window);
    Ok(())
}
