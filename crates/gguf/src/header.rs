//! The GGUF header: magic, version, counts, the metadata key-value pairs, and the tensor infos, parsed and
//! checked whole before any tensor is handed out.
//!
//! ```text
//! "GGUF" | version: u32 | tensor_count: u64 | kv_count: u64
//! kv_count x   ( key: string | value_type: u32 | value )
//! tensor_count x ( name: string | n_dims: u32 | ne: u64 x n_dims | ggml_type: u32 | offset: u64 )
//! padding to the alignment | tensor data (each tensor at data start + its offset)
//! ```
//!
//! Strings are a u64 length and UTF-8 bytes; everything is little-endian.

use std::collections::HashMap;

use crate::cursor::Cursor;
use crate::metadata::{MetadataValue, ValueType};
use crate::{GgmlType, GgufError};

/// Tensors with more dimensions than this are refused ([`GgufError::TooManyDims`]); ggml has 4.
pub const MAX_DIMS: u32 = 8;

/// The alignment of a file without `general.alignment` (ggml's `GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The key that sets the alignment of the tensor data.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// The magic bytes a GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";

/// A tensor as the header describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The name, as stored (`blk.0.attn_q.weight`).
    pub name: String,
    /// The ggml type.
    pub ggml_type: GgmlType,
    /// The dimensions as GGUF stores them, innermost first (`ne[0]` is the length of a row).
    pub dims: Vec<u64>,
    /// The offset of the data from the start of the data section.
    pub offset: u64,
    /// The bytes of the data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// The logical shape in torch order: the GGUF dimensions reversed (a matrix of `ne = [4096, 32000]` is
    /// `[32000, 4096]`), as gguf-py's numpy arrays and transformers have it.
    pub fn shape(&self) -> Vec<usize> {
        // Each dimension fits usize: their product was checked at parse.
        self.dims.iter().rev().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect()
    }

    /// The number of values.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// The whole header of a GGUF file, checked.
#[derive(Clone, Debug)]
pub struct Header {
    /// The version (2 or 3).
    pub version: u32,
    /// The metadata, in file order.
    pub metadata: Vec<(String, MetadataValue)>,
    /// The tensor infos, in file order.
    pub tensors: Vec<TensorInfo>,
    /// The alignment of the tensor data (`general.alignment`, 32 without it).
    pub alignment: u64,
    /// Where the data section starts: the end of the tensor infos, padded to the alignment.
    pub data_offset: u64,
}

/// The fewest bytes of a key-value pair (an empty key, its type, a one-byte value).
const MIN_KV_SIZE: u64 = 8 + 4 + 1;
/// The fewest bytes of a tensor info (an empty name, no dimensions, the type and the offset).
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 4 + 8;

impl Header {
    /// Parses and checks the header of the GGUF file `file`: every count against the bytes left, every tensor's
    /// type, shape, offset, alignment and extent, no two tensors overlapping, no name or key twice.
    pub fn parse(file: &[u8]) -> Result<Header, GgufError> {
        let mut cursor = Cursor::new(file);
        let magic = file.get(..4).unwrap_or(file);
        if magic != MAGIC {
            return Err(GgufError::NotGguf { found: magic.to_vec() });
        }
        cursor.take(4, "the magic")?;
        let version = cursor.u32("the version")?;
        if version & 0xFFFF == 0 && version != 0 {
            return Err(GgufError::BigEndian { version: version.swap_bytes() });
        }
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion { version });
        }
        let tensor_count = cursor.u64("the tensor count")?;
        let kv_count = cursor.u64("the metadata count")?;
        let kv_count = cursor.check_count("metadata", kv_count, MIN_KV_SIZE)?;
        let mut metadata = Vec::with_capacity(kv_count);
        let mut keys = HashMap::with_capacity(kv_count);
        for i in 0..kv_count {
            let key = cursor.string(&format!("metadata key {i}"))?;
            let code = cursor.u32(&format!("the value type of {key:?}"))?;
            let value_type =
                ValueType::from_code(code).ok_or_else(|| GgufError::UnknownValueType { key: key.clone(), code })?;
            let value = MetadataValue::read(&mut cursor, &key, value_type, 0)?;
            if keys.insert(key.clone(), ()).is_some() {
                return Err(GgufError::DuplicateKey { key });
            }
            metadata.push((key, value));
        }
        let alignment = match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some((_, MetadataValue::U32(a))) if a.is_power_of_two() => u64::from(*a),
            Some((_, other)) => {
                return Err(GgufError::BadAlignment { found: format!("{} {other}", other.value_type()) });
            }
        };
        let tensor_count = cursor.check_count("tensors", tensor_count, MIN_TENSOR_INFO_SIZE)?;
        let mut tensors = Vec::with_capacity(tensor_count);
        let mut names = HashMap::with_capacity(tensor_count);
        for i in 0..tensor_count {
            let info = read_tensor_info(&mut cursor, i, alignment)?;
            if names.insert(info.name.clone(), ()).is_some() {
                return Err(GgufError::DuplicateTensor { name: info.name });
            }
            tensors.push(info);
        }
        let end = cursor.position() as u64;
        let data_offset = end.div_ceil(alignment).saturating_mul(alignment);
        let header = Header { version, metadata, tensors, alignment, data_offset };
        header.check_extents(file.len() as u64)?;
        Ok(header)
    }

    /// Every tensor inside the file, and no two overlapping.
    fn check_extents(&self, file_len: u64) -> Result<(), GgufError> {
        let mut spans = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            let out_of_bounds =
                |start: u64, end: u64| GgufError::TensorOutOfBounds { tensor: t.name.clone(), start, end, file_len };
            let start = self.data_offset.checked_add(t.offset).ok_or_else(|| out_of_bounds(u64::MAX, u64::MAX))?;
            let end = start.checked_add(t.n_bytes).ok_or_else(|| out_of_bounds(start, u64::MAX))?;
            if end > file_len {
                return Err(out_of_bounds(start, end));
            }
            spans.push((start, end, t.name.as_str()));
        }
        spans.sort_unstable();
        for pair in spans.windows(2) {
            if let [(_, first_end, first), (second_start, second_end, second)] = pair {
                // Empty tensors take no bytes and overlap nothing.
                if second_start < first_end && second_end > second_start {
                    return Err(GgufError::OverlappingTensors {
                        first: (*first).to_owned(),
                        second: (*second).to_owned(),
                        second_start: *second_start,
                        first_end: *first_end,
                    });
                }
            }
        }
        Ok(())
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

fn read_tensor_info(cursor: &mut Cursor<'_>, index: usize, alignment: u64) -> Result<TensorInfo, GgufError> {
    let name = cursor.string(&format!("the name of tensor {index}"))?;
    let n_dims = cursor.u32(&format!("the dimension count of {name:?}"))?;
    if n_dims > MAX_DIMS {
        return Err(GgufError::TooManyDims { tensor: name, n_dims, limit: MAX_DIMS });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(cursor.u64(&format!("a dimension of {name:?}"))?);
    }
    let code = cursor.u32(&format!("the ggml type of {name:?}"))?;
    let ggml_type =
        GgmlType::from_code(code).ok_or_else(|| GgufError::UnknownGgmlType { tensor: name.clone(), code })?;
    let offset = cursor.u64(&format!("the offset of {name:?}"))?;
    let overflow = || GgufError::ShapeOverflow { tensor: name.clone(), dims: dims.clone() };
    let n_elements = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).ok_or_else(overflow)?;
    usize::try_from(n_elements).map_err(|_| overflow())?;
    let block_size = ggml_type.block_size() as u64;
    let row = dims.first().copied().unwrap_or(1);
    if row % block_size != 0 {
        return Err(GgufError::PartialBlock { tensor: name, ggml_type, row, block_size: ggml_type.block_size() });
    }
    let n_bytes = (n_elements / block_size).checked_mul(ggml_type.type_size() as u64).ok_or_else(overflow)?;
    usize::try_from(n_bytes).map_err(|_| overflow())?;
    if offset % alignment != 0 {
        return Err(GgufError::MisalignedOffset { tensor: name, offset, alignment });
    }
    Ok(TensorInfo { name, ggml_type, dims, offset, n_bytes })
}
