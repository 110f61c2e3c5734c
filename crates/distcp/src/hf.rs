//! The Hugging Face safetensors storage layout of DCP (`HuggingFaceStorageWriter`, torch 2.7+): sharded
//! `model-0000x-of-0000n.safetensors` files (or per-rank `shard-…` files) whose `__metadata__` carries
//! `DCP_SHARDING_INFO = {fqn: {"saved_offsets": [...]}}`, plus `model.safetensors.index.json`. There is no
//! `.metadata` pickle: the reader builds the [`Metadata`] from the safetensors headers, as torch's
//! `HuggingFaceStorageReader` does (global size = the largest `offset + shape` over a key's chunks; a
//! missing sharding entry means offset 0).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ckpt_tensor::Buffer;

use crate::error::{Error, Result};
use crate::item::safe_join;
use crate::metadata::{
    ChunkStorageMetadata, Metadata, MetadataIndex, StorageInfo, StorageMetadata, TensorProperties,
    TensorStorageMetadata,
};

/// Name of the index file.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// `__metadata__` key with the chunk offsets.
pub const SHARDING_INFO_KEY: &str = "DCP_SHARDING_INFO";

/// Whether `dir` looks like the Hugging Face layout (an index file or any `.safetensors` file).
pub(crate) fn detect(dir: &Path) -> bool {
    dir.join(INDEX_FILE).is_file() || !safetensors_files(dir).unwrap_or_default().is_empty()
}

fn safetensors_files(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let e = e.map_err(|e| Error::io(dir, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") && e.path().is_file() {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::BadSafetensors { path: path.to_path_buf(), reason: reason.into() }
}

/// The files the layout consists of: the index's `weight_map` files in first-appearance order, or every
/// `*.safetensors` file of the directory (sorted) when there is no index.
fn layout_files(dir: &Path) -> Result<Vec<String>> {
    let index = dir.join(INDEX_FILE);
    if !index.is_file() {
        return safetensors_files(dir);
    }
    let text = std::fs::read(&index).map_err(|e| Error::io(&index, e))?;
    let json: serde_json::Value =
        serde_json::from_slice(&text).map_err(|source| Error::IndexJson { path: index.clone(), source })?;
    let map = json
        .get("weight_map")
        .and_then(serde_json::Value::as_object)
        .ok_or_else(|| bad(&index, "no \"weight_map\" object"))?;
    let mut files: Vec<String> = Vec::new();
    for (key, file) in map {
        let file = file.as_str().ok_or_else(|| bad(&index, format!("weight_map[{key:?}] is not a string")))?;
        if !files.iter().any(|f| f == file) {
            files.push(file.to_owned());
        }
    }
    Ok(files)
}

/// Builds the metadata of a Hugging Face layout directory from its safetensors headers.
pub(crate) fn metadata(dir: &Path) -> Result<(Metadata, Vec<PathBuf>)> {
    let files = layout_files(dir)?;
    let mut tensors: Vec<(String, TensorStorageMetadata)> = Vec::new();
    let mut position: HashMap<String, usize> = HashMap::new();
    let mut storage_data = Vec::new();
    let mut paths = Vec::new();
    for file in &files {
        let path = safe_join(dir, file).ok_or_else(|| Error::UnsafePath { key: String::new(), file: file.clone() })?;
        if !path.is_file() {
            return Err(Error::MissingFile { key: String::new(), file: file.clone() });
        }
        let buffer = Buffer::map_file(&path)?;
        let st = ckpt_safetensors::read(&buffer)
            .map_err(|source| Error::UnreadableSafetensors { path: path.clone(), source })?;
        let sharding: HashMap<String, Vec<usize>> = match st.metadata.as_ref().and_then(|m| m.get(SHARDING_INFO_KEY)) {
            None => HashMap::new(),
            Some(text) => parse_sharding(text).map_err(|reason| bad(&path, reason))?,
        };
        for (name, t) in &st.tensors {
            let offsets = match sharding.get(name) {
                Some(o) if o.len() == t.dim() => o.clone(),
                Some(o) => {
                    return Err(bad(
                        &path,
                        format!("{name}: saved_offsets {o:?} do not match its {} dimensions", t.dim()),
                    ));
                }
                None => vec![0; t.dim()],
            };
            let chunk = ChunkStorageMetadata { offsets: offsets.clone(), sizes: t.shape().to_vec() };
            let end: Vec<usize> = offsets.iter().zip(t.shape()).map(|(o, s)| o.saturating_add(*s)).collect();
            let index = match position.get(name) {
                Some(&p) => {
                    let md = &mut tensors[p].1;
                    if md.properties.dtype != t.dtype() {
                        return Err(bad(
                            &path,
                            format!("{name} is {} here and {} in another file", t.dtype(), md.properties.dtype),
                        ));
                    }
                    for (s, e) in md.size.iter_mut().zip(&end) {
                        *s = (*s).max(*e);
                    }
                    md.chunks.push(chunk);
                    md.chunks.len() - 1
                }
                None => {
                    position.insert(name.clone(), tensors.len());
                    tensors.push((
                        name.clone(),
                        TensorStorageMetadata {
                            properties: TensorProperties::new(t.dtype()),
                            size: end,
                            chunks: vec![chunk],
                        },
                    ));
                    0
                }
            };
            storage_data.push((
                MetadataIndex { fqn: name.clone(), offset: Some(offsets), index: Some(index) },
                StorageInfo {
                    relative_path: file.clone(),
                    offset: t.storage().offset_in_backing() as u64,
                    length: t.nbytes() as u64,
                    transform_descriptors: Vec::new(),
                },
            ));
        }
        paths.push(path);
    }
    let state_dict_metadata = tensors.into_iter().map(|(k, t)| (k, StorageMetadata::Tensor(t))).collect();
    Ok((Metadata { state_dict_metadata, planner_data: None, storage_data, storage_meta: None, version: None }, paths))
}

/// Parses `DCP_SHARDING_INFO`: `{"fqn": {"saved_offsets": [0, 0]}, ...}`.
fn parse_sharding(text: &str) -> std::result::Result<HashMap<String, Vec<usize>>, String> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("{SHARDING_INFO_KEY} is not JSON: {e}"))?;
    let obj = json.as_object().ok_or_else(|| format!("{SHARDING_INFO_KEY} is not an object"))?;
    let mut out = HashMap::new();
    for (k, v) in obj {
        let offs = v
            .get("saved_offsets")
            .and_then(serde_json::Value::as_array)
            .ok_or_else(|| format!("{SHARDING_INFO_KEY}[{k:?}] has no saved_offsets list"))?;
        let offs = offs
            .iter()
            .map(|o| o.as_u64().and_then(|o| usize::try_from(o).ok()))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| format!("{SHARDING_INFO_KEY}[{k:?}].saved_offsets holds a non-integer"))?;
        out.insert(k.clone(), offs);
    }
    Ok(out)
}
