//! Reading a Hugging Face sharded checkpoint.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::metadata::Records;
use crate::{ReadOptions, SafetensorsReader, read_file_with};
use ckpt_tensor::{CheckpointRead, Entry, PathItem, Tensor, Value};

use crate::hf::error::{Error, Result};

/// A Hugging Face sharded checkpoint, read: every shard memory-mapped, tensors in shard order, the index's
/// `weight_map` checked against the files, and the values ckpt recorded.
#[derive(Debug, Clone)]
pub struct HfReader {
    dir: PathBuf,
    files: Vec<PathBuf>,
    tensors: Vec<(String, Tensor)>,
    total_size: Option<u64>,
    records: Records,
}

impl HfReader {
    /// Opens the directory `dir`: the shards its `model.safetensors.index.json` names (in the order they
    /// first appear in `weight_map`), or its `model.safetensors`.
    ///
    /// # Errors
    /// [`Error::Malformed`] for an index that is not transformers' (no `weight_map`, a file outside the
    /// directory, a tensor missing from its file or in two files); the shards' safetensors errors; I/O.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(dir, &ReadOptions::default())
    }

    /// [`HfReader::open`] as `options` say: with a fill hook ([`ReadOptions::fill`]), the directory is a
    /// partial local copy whose index and shard headers are present, and each shard's tensors are filled
    /// (under the shard's file name) as they are read.
    ///
    /// # Errors
    /// As [`HfReader::open`].
    pub fn open_with(dir: impl AsRef<Path>, options: &ReadOptions) -> Result<Self> {
        let dir = dir.as_ref();
        let index_path = dir.join(crate::hf::INDEX_FILE);
        let bad = |reason: String| Error::Malformed { path: index_path.clone(), reason };
        let (names, weight_map, total_size) = if index_path.is_file() {
            let text = std::fs::read(&index_path).map_err(|e| Error::io(&index_path, e))?;
            let json: serde_json::Value = serde_json::from_slice(&text)
                .map_err(|source| Error::IndexJson { path: index_path.clone(), source })?;
            let map = json
                .get("weight_map")
                .and_then(serde_json::Value::as_object)
                .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
            let mut names: Vec<String> = Vec::new();
            let mut weight_map = HashMap::new();
            for (tensor, file) in map {
                let file = file.as_str().ok_or_else(|| bad(format!("weight_map[{tensor:?}] is not a string")))?;
                let plain = Path::new(file).components().count() == 1 && !file.starts_with('.') && !file.is_empty();
                if !plain {
                    return Err(bad(format!("weight_map[{tensor:?}] = {file:?} is not a file of the directory")));
                }
                if !names.iter().any(|n| n == file) {
                    names.push(file.to_owned());
                }
                weight_map.insert(tensor.clone(), file.to_owned());
            }
            let total = json.pointer("/metadata/total_size").and_then(serde_json::Value::as_u64);
            (names, Some(weight_map), total)
        } else if dir.join(crate::hf::SINGLE_FILE).is_file() {
            (vec![crate::hf::SINGLE_FILE.to_owned()], None, None)
        } else {
            return Err(Error::Malformed {
                path: dir.to_path_buf(),
                reason: format!("neither {} nor {}", crate::hf::INDEX_FILE, crate::hf::SINGLE_FILE),
            });
        };
        let mut files = Vec::with_capacity(names.len());
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        let mut metadata: HashMap<String, String> = HashMap::new();
        let mut seen = HashSet::new();
        for name in &names {
            let path = dir.join(name);
            let shard: SafetensorsReader = read_file_with(&path, options)?;
            for (tensor, _) in &shard.tensors {
                if !seen.insert(tensor.clone()) {
                    return Err(bad(format!("tensor {tensor:?} is in two files")));
                }
                if let Some(map) = &weight_map {
                    if map.get(tensor) != Some(name) {
                        return Err(bad(format!("{name} holds {tensor:?}, which weight_map does not put there")));
                    }
                }
            }
            // ckpt's records are in one shard (the first); other keys of every shard are kept.
            for (k, v) in shard.metadata.into_iter().flatten() {
                metadata.entry(k).or_insert(v);
            }
            tensors.extend(shard.tensors);
            files.push(path);
        }
        if let Some(map) = &weight_map {
            if let Some(missing) = map.keys().find(|t| !seen.contains(*t)) {
                return Err(bad(format!("{missing:?} is in weight_map but in no file")));
            }
        }
        let records = Records::read(Some(&metadata), &tensors);
        Ok(HfReader { dir: dir.to_path_buf(), files, tensors, total_size, records })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The shard files, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The index's `metadata.total_size`, when there is an index.
    pub fn total_size(&self) -> Option<u64> {
        self.total_size
    }

    /// Every tensor stored in the shards, in shard order (tensors values hold included).
    pub fn stored_tensors(&self) -> &[(String, Tensor)] {
        &self.tensors
    }

    /// Every entry as (name, path in the nested state dict, value), in the source's order when ckpt
    /// recorded it.
    pub fn leaves(&self) -> Vec<(String, Vec<PathItem>, Value)> {
        self.records.leaves(&self.tensors)
    }
}

impl CheckpointRead for HfReader {
    fn format_name(&self) -> &'static str {
        "hf"
    }

    fn entries(&self) -> Vec<Entry> {
        self.records.entry_list(&self.tensors)
    }

    fn details(&self) -> Vec<(String, String)> {
        let mut d = vec![("shards".to_owned(), self.files.len().to_string())];
        if let Some(total) = self.total_size {
            d.push(("total_size".into(), total.to_string()));
        }
        d
    }

    fn tensor(&self, name: &str) -> ckpt_tensor::Result<Tensor> {
        self.records.tensor(&self.tensors, name)
    }

    fn value(&self, name: &str) -> ckpt_tensor::Result<Value> {
        self.records.value(&self.tensors, name)
    }
}
