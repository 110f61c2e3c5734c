//! Conversions between DCP and single files, as crate API for the users of this crate alone: DCP to one
//! `torch.save` file and back (what `torch.distributed.checkpoint.format_utils`'s `dcp_to_torch_save` /
//! `torch_save_to_dcp` do), and DCP to one safetensors file or to Hugging Face sharded safetensors with an
//! index. Each is one call of the target format's writer with its write options (`ckpt_torch::save`,
//! [`crate::save`], `ckpt_safetensors::write_file_with`, `ckpt_safetensors::hf::save_entries`), the path
//! every conversion of the `ckpt` facade takes; there is no writer of their own beside them. The DCP source
//! is read lazily: a tensor stored in several items is assembled when the writer writes it and dropped
//! after, so memory stays at about the largest tensor plus a constant.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ckpt_tensor::{DType, Value};

use crate::error::{Error, Result};
use crate::metadata::{Metadata, StorageMetadata};
use crate::reader::{DcpReader, ReadOptions};
use crate::writer::WriteOptions;

/// What a conversion wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConvertReport {
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub tensor_bytes: u64,
    /// Keys that could not go into the output (non-tensor values, for safetensors outputs).
    pub skipped: Vec<String>,
    /// Files written.
    pub files: Vec<PathBuf>,
}

/// The reader of the streaming conversions: items are windows of memory maps (page cache, not heap), so a
/// tensor split over several items is assembled once, when it is written (`Buffer::deferred`), and nothing
/// else of it is held.
fn streaming_reader(dir: &Path) -> Result<DcpReader> {
    DcpReader::open_with(dir, &ReadOptions::default())
}

// ---------------------------------------------------------------------------------------------------------
// DCP -> torch.save

/// Converts the DCP checkpoint in `dir` into one `torch.save` file at `out` holding the nested state dict
/// (what `dcp_to_torch_save(dir, out)` writes; int dict keys come back as strings), through the torch
/// writer with `options` (`ckpt_torch::save`). Non-tensor values are read first (they are small); each
/// tensor is read when the writer writes it.
///
/// # Errors
/// Read errors naming key and file; the torch writer's errors ([`Error::Torch`]).
pub fn dcp_to_torch_save(dir: &Path, out: &Path, options: &ckpt_torch::WriteOptions) -> Result<ConvertReport> {
    let reader = streaming_reader(dir)?;
    let state_dict = reader.state_dict()?;
    ckpt_torch::save(&state_dict, out, options)?;
    let tensors = reader.metadata().state_dict_metadata.iter().filter(|(_, m)| m.as_tensor().is_some()).count();
    Ok(ConvertReport {
        tensors,
        tensor_bytes: u64::try_from(reader.tensor_bytes()).unwrap_or(u64::MAX),
        skipped: Vec::new(),
        files: vec![out.to_path_buf()],
    })
}

// ---------------------------------------------------------------------------------------------------------
// torch.save -> DCP

/// Converts one `torch.save` file into a DCP checkpoint (what `torch_save_to_dcp(pt, dir)` does: an
/// ordinary single-rank save of the loaded object, which must be a mapping). Streams: the file is mapped
/// to read its object tree, but each tensor's storage is read from the file just before its item is
/// written and dropped after, so memory stays at about one storage plus a constant.
///
/// # Errors
/// The torch reader's errors; the writer's errors.
pub fn torch_save_to_dcp(pt: &Path, dir: &Path, options: &WriteOptions) -> Result<Metadata> {
    let value = ckpt_torch::load(pt)?;
    let file = std::fs::File::open(pt).map_err(|e| Error::io(pt, e))?;
    let source = |t: &ckpt_tensor::Tensor| -> Result<Option<ckpt_tensor::Tensor>> {
        let storage = t.storage();
        if !storage.is_mapped() {
            return Ok(None);
        }
        let mut buf = ckpt_tensor::AlignedBytes::zeroed(storage.len())?;
        crate::item::read_exact_at(&file, buf.as_mut_bytes(), storage.offset_in_backing() as u64)
            .map_err(|e| Error::io(pt, e))?;
        let owned = ckpt_tensor::Buffer::from_owner(buf);
        let t2 = ckpt_tensor::Tensor::from_parts(t.dtype(), t.shape(), t.strides(), t.storage_offset(), owned)?
            .with_requires_grad(t.requires_grad())
            .with_lazy_bits(t.is_conj(), t.is_neg())?;
        Ok(Some(t2))
    };
    crate::writer::save_with_source(&value, &HashMap::new(), dir, options, &ckpt_collective::SingleProcess, &source)
}

// ---------------------------------------------------------------------------------------------------------
// DCP -> safetensors

/// A tensor entry of the checkpoint: key, dtype, bytes.
#[derive(Debug, Clone)]
struct TensorEntry {
    key: String,
    dtype: DType,
    bytes: u64,
}

/// Tensor keys of the checkpoint with dtype, shape and bytes; non-tensor keys separately.
fn tensor_list(reader: &DcpReader) -> Result<(Vec<TensorEntry>, Vec<String>)> {
    let mut tensors = Vec::new();
    let mut skipped = Vec::new();
    for (k, m) in &reader.metadata().state_dict_metadata {
        match m {
            StorageMetadata::Tensor(t) => {
                let bytes = t.nbytes().ok_or_else(|| Error::unwritable(k, "tensor size overflows"))?;
                tensors.push(TensorEntry { key: k.clone(), dtype: t.properties.dtype, bytes: bytes as u64 });
            }
            StorageMetadata::Bytes => skipped.push(k.clone()),
        }
    }
    Ok((tensors, skipped))
}

/// Converts the DCP checkpoint in `dir` into one safetensors file at `out` through the safetensors writer
/// with `durability` (`ckpt_safetensors::write_file_with`: its per-tensor checksums when it asks for them),
/// tensors under their flattened keys in checkpoint order, with ckpt's safetensors convention
/// ([`ckpt_safetensors::metadata`]: `format` = `pt`, `ckpt.source` = `distcp`, the nested paths from
/// `planner_data` in `ckpt.paths`, the non-tensor values in `ckpt.values`, in its lossless typed encoding).
/// A value holding tensors (a tuple of tensors) is listed in [`ConvertReport::skipped`] (the facade's
/// `ckpt::convert` keeps those too).
///
/// # Errors
/// [`Error::Unwritable`] for dtypes safetensors lacks (complex32/128, quantized, float4); read and I/O
/// errors.
pub fn dcp_to_safetensors(dir: &Path, out: &Path, durability: &ckpt_io::Durability) -> Result<ConvertReport> {
    let reader = streaming_reader(dir)?;
    let (entries, values) = tensor_list(&reader)?;
    let mut metadata = ckpt_safetensors::metadata::Metadata::new("distcp");
    let mut skipped = Vec::new();
    for key in &values {
        if metadata.value(key, &reader.read_value(key)?) {
            metadata.path(key, &reader.path_of(key));
        } else {
            skipped.push(key.clone());
        }
    }
    let mut tensors = Vec::with_capacity(entries.len());
    for t in &entries {
        if t.dtype.safetensors_code().is_none() {
            return Err(Error::unwritable(&t.key, format!("safetensors cannot hold {}", t.dtype)));
        }
        metadata.path(&t.key, &reader.path_of(&t.key));
        // As the reader gives it: a window of a map, or assembled from its items when the writer writes it.
        tensors.push((t.key.clone(), reader.read_tensor(&t.key)?));
    }
    ckpt_safetensors::write_file_with(&tensors, Some(metadata.into_map()), out, durability).map_err(Error::Core)?;
    let tensor_bytes = entries.iter().map(|t| t.bytes).sum();
    Ok(ConvertReport { tensors: entries.len(), tensor_bytes, skipped, files: vec![out.to_path_buf()] })
}

/// Converts the DCP checkpoint in `dir` into Hugging Face sharded safetensors in `out_dir`, through the
/// one Hugging Face writer with `options` (`ckpt_safetensors::hf::save_entries`; its source is `distcp`):
/// `model-0000i-of-0000n.safetensors` files of at most `options`' maximum shard size of tensor data each, filled in checkpoint order as `huggingface_hub` fills
/// them (a bigger tensor gets a file of its own), plus `model.safetensors.index.json` when there is more
/// than one; the directory committed whole. The `__metadata__` follows ckpt's safetensors convention
/// (`format`, `ckpt.source` = `distcp`, `ckpt.paths`); non-tensor values are listed in
/// [`ConvertReport::skipped`]. Streams shard by shard.
///
/// # Errors
/// As [`dcp_to_safetensors`].
pub fn dcp_to_hf(dir: &Path, out_dir: &Path, options: &ckpt_safetensors::hf::WriteOptions) -> Result<ConvertReport> {
    let reader = streaming_reader(dir)?;
    let (tensors, skipped) = tensor_list(&reader)?;
    // Each tensor as the reader gives it: windows of the maps, a tensor split over items assembled only
    // when its shard is written.
    let entries = tensors
        .iter()
        .map(|t| Ok((t.key.as_str(), reader.path_of(&t.key), Value::Tensor(reader.read_tensor(&t.key)?))))
        .collect::<Result<Vec<_>>>()?;
    let options = options.clone().with_source("distcp");
    let report = ckpt_safetensors::hf::save_entries(
        entries.iter().map(|(key, path, value)| (*key, path.as_slice(), value)),
        out_dir,
        &options,
    )
    .map_err(|e| Error::Core(e.into()))?;
    Ok(ConvertReport { tensors: report.tensors, tensor_bytes: report.bytes, skipped, files: report.files })
}
