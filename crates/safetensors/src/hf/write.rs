//! Writing a Hugging Face sharded checkpoint.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use crate::metadata::{self, FORMAT_KEY, FORMAT_PT};
use ckpt_io::SaveReport;
use ckpt_io::{CommitError, DirCommit, DirOptions, Durability};
use ckpt_tensor::{PathItem, Tensor, Value};
use serde_json::Value as Json;

use crate::hf::error::Result;
use crate::hf::shard::{self, DEFAULT_MAX_SHARD_SIZE};

/// Options of [`save`], [`save_rank`] and [`save_entries`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteOptions {
    /// The largest shard, in bytes of tensor data (default 5 GB, [`DEFAULT_MAX_SHARD_SIZE`]); a larger tensor
    /// gets a shard of its own.
    pub max_shard_size: u64,
    /// The format the checkpoint is converted from (`ckpt.source`), when known.
    pub source: Option<String>,
    /// How durably the shards are written. With [`Durability::checksums`] (the default) the CRC32C of every
    /// tensor is recorded in its shard's header ([`crate::write_file_checksummed`]), so that `ckpt verify
    /// --deep` detects a changed byte of tensor data; `transformers` and every safetensors reader load the
    /// shards either way. The shards carry their own checksums, so no `ckpt.checksums.json` is written.
    pub durability: Durability,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions { max_shard_size: DEFAULT_MAX_SHARD_SIZE, source: None, durability: Durability::default() }
    }
}

impl WriteOptions {
    /// These options with `durability` ([`WriteOptions::durability`]).
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets the largest shard, in bytes.
    #[must_use]
    pub fn with_max_shard_size(mut self, bytes: u64) -> Self {
        self.max_shard_size = bytes;
        self
    }

    /// Records `source` as the format converted from.
    #[must_use]
    pub fn with_source(mut self, source: &str) -> Self {
        self.source = Some(source.to_owned());
        self
    }
}

/// Writes the state dict `value` as a Hugging Face sharded checkpoint in the directory `dst`:
/// [`save_entries`] of its leaves (every mapping, list and tuple descended into, names joined with `.`).
///
/// ```
/// use ckpt_tensor::{CheckpointRead, Tensor, Value};
/// let dir = tempfile::tempdir().unwrap();
/// let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32; 4], &[4]).unwrap())), ("step", Value::Int(3))]);
/// let report = ckpt_safetensors::hf::save(&sd, dir.path(), &Default::default()).unwrap();
/// assert_eq!((report.tensors, report.values, report.files.len()), (1, 1, 1));
/// assert_eq!(ckpt_safetensors::hf::HfReader::open(dir.path()).unwrap().tensor("w").unwrap().numel(), 4);
/// ```
///
/// # Errors
/// As [`save_entries`]; [`ckpt_tensor::Error`] for keys that cannot name a leaf.
pub fn save(value: &Value, dst: impl AsRef<Path>, options: &WriteOptions) -> Result<SaveReport> {
    save_rank(value, dst, options, &ckpt_collective::SingleProcess)
}

/// [`save`] split over the processes of `group`, every process calling it with the same state dict
/// ([`save_entries_rank`]).
///
/// # Errors
/// As [`save_entries_rank`].
pub fn save_rank(
    value: &Value,
    dst: impl AsRef<Path>,
    options: &WriteOptions,
    group: &dyn ckpt_collective::Collective,
) -> Result<SaveReport> {
    let leaves = ckpt_tensor::leaves(value)?;
    save_entries_rank(
        leaves.iter().map(|l| (l.key.as_str(), l.path.as_slice(), l.value)),
        dst.as_ref(),
        options,
        group,
        &|t| Ok(t.clone()),
    )
}

/// Writes `entries` (name, path in the nested state dict, value) as a Hugging Face sharded checkpoint in the
/// directory `dst`: shards filled in the entries' order as `huggingface_hub` fills them ([`crate::hf::shard`]),
/// each a safetensors file with `format = "pt"`, and `model.safetensors.index.json` (`metadata.total_size`,
/// `weight_map` of every tensor, keys sorted and indented as `transformers` writes it) when there is more
/// than one shard.
///
/// Everything that is not a plain tensor is kept with ckpt's safetensors convention
/// ([`crate::metadata`]): `ckpt.source`, `ckpt.paths` and `ckpt.values` go into the first
/// shard's `__metadata__` (`model-00001-of-0000N.safetensors`, or `model.safetensors`); the tensors values
/// hold are tensors of the checkpoint (in whichever shard the filling puts them, listed in the index),
/// so other loaders see every tensor and ckpt rebuilds every value.
///
/// The write streams each tensor from its memory into its shard and commits the directory atomically
/// through [`ckpt_io::DirCommit`]: staged beside `dst`, synced, swapped in whole. The format owns
/// the `*.safetensors` files and the index of an existing `dst`; other files there (a `config.json`, the
/// tokenizer) are carried into the new directory.
///
/// # Errors
/// The commit's errors (a destination that is a file, a full disk, a concurrent save); errors of the
/// tensors' data.
pub fn save_entries<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a [PathItem], &'a Value)>,
    dst: &Path,
    options: &WriteOptions,
) -> Result<SaveReport> {
    save_entries_rank(entries, dst, options, &ckpt_collective::SingleProcess, &|t| Ok(t.clone()))
}

/// [`save_entries`] split over the processes of `group`, every process calling it with the same entries:
/// the shards are planned from the tensors' sizes on every process, process `p` of `K` writes shards `p,
/// p + K, ...` (each tensor of its shards passed through `resolve` first, so that entries given as outlines
/// are read only by the process that writes them), and process 0 writes the index once every shard is
/// durable and commits the directory. The files are those of [`save_entries`]; every process returns the
/// same report, or an error (a process's failure reaches every process).
///
/// ```
/// use ckpt_tensor::{PathItem, Tensor, Value};
/// use ckpt_collective::ThreadGroup;
/// let dir = tempfile::tempdir().unwrap();
/// let (a, b) = (Value::Tensor(Tensor::from_slice(&[1.0f32; 4], &[4]).unwrap()), Value::Int(3));
/// let entries = [("a", &[PathItem::Key("a".into())][..], &a), ("b", &[PathItem::Key("b".into())][..], &b)];
/// let options = ckpt_safetensors::hf::WriteOptions::default().with_max_shard_size(8);
/// std::thread::scope(|s| {
///     for g in ThreadGroup::new(2) {
///         let (entries, dst, options) = (&entries, dir.path(), &options);
///         s.spawn(move || ckpt_safetensors::hf::save_entries_rank(entries.iter().copied(), dst, options, &g, &|t| Ok(t.clone())).unwrap());
///     }
/// });
/// assert!(dir.path().join("model.safetensors").exists());
/// ```
///
/// # Errors
/// As [`save_entries`]; `resolve`'s errors; [`ckpt_io::CommitError::RankFailed`] (inside
/// [`crate::hf::Error`]) when another process failed.
pub fn save_entries_rank<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a [PathItem], &'a Value)>,
    dst: &Path,
    options: &WriteOptions,
    group: &dyn ckpt_collective::Collective,
    resolve: &(dyn Fn(&ckpt_tensor::Tensor) -> ckpt_tensor::Result<ckpt_tensor::Tensor> + Sync),
) -> Result<SaveReport> {
    let plan = layout(entries, options)?;
    let n = plan.shards.len();
    let commit = DirCommit::begin(dst, group, &dir_options(options)).map_err(ckpt_tensor::Error::from)?;
    let mut names: Vec<String> = (0..n).map(|i| shard_file_name(&commit, i, n)).collect();
    let Layout { tensors, shards, records, report: prepared } = &plan;
    let (process, processes) = (group.rank(), group.world_size().max(1));
    let written = (|| -> Result<()> {
        for ((i, members), file) in shards.iter().enumerate().zip(&names).filter(|((i, _), _)| i % processes == process)
        {
            let shard_tensors: Vec<(String, ckpt_tensor::Tensor)> = members
                .iter()
                .filter_map(|&k| tensors.get(k))
                .map(|(name, t)| Ok((name.clone(), resolve(t)?)))
                .collect::<ckpt_tensor::Result<_>>()?;
            let meta =
                if i == 0 { records.clone() } else { HashMap::from([(FORMAT_KEY.to_owned(), FORMAT_PT.to_owned())]) };
            let mut staged = commit.create_file(file).map_err(ckpt_tensor::Error::from)?;
            let path = staged.path().to_path_buf();
            if options.durability.checksums {
                crate::write_checksummed_to(&shard_tensors, Some(meta), staged.writer(), &path)?;
            } else {
                crate::write_to(&shard_tensors, Some(meta), staged.writer(), &path)?;
            }
            staged.finish().map_err(ckpt_tensor::Error::from)?;
        }
        Ok(())
    })();
    // Every process learns every outcome in the commit: a failed one passes its error, and gets it back.
    let own = written.as_ref().map(|&()| ()).map_err(ckpt_io::RankFailure::from);
    let index = (n > 1).then(|| index_json(plan.total_size(), &plan.weight_map(&names)));
    let committed = commit.commit(group, own, |c| {
        if let Some(text) = &index {
            let mut f = c.create_file(crate::hf::INDEX_FILE)?;
            let path = f.path().to_path_buf();
            f.writer().write_all(text.as_bytes()).map_err(|e| CommitError::from_io(&path, e))?;
            f.finish()?;
        }
        Ok(())
    });
    written?;
    committed.map_err(ckpt_tensor::Error::from)?;
    if index.is_some() {
        names.push(crate::hf::INDEX_FILE.to_owned());
    }
    let mut report = prepared.clone().with_files(names.into_iter().map(|f| dst.join(f)).collect());
    report.bytes = plan.total_size();
    Ok(report)
}

/// The name of shard `i` of `n` in `commit`: `huggingface_hub`'s ([`shard::file_name`]), unless that would
/// replace an object the destination on an object store already holds; then the save's id goes before the
/// extension (`model-00001-of-00002.<id>.safetensors`, named by the index as any name is), so that the
/// previous checkpoint stays whole and loadable until the new index replaces its own. A single shard has no
/// index to name it: `model.safetensors` is one object, replaced whole when its upload completes.
pub(crate) fn shard_file_name(commit: &DirCommit, i: usize, n: usize) -> String {
    let file = shard::file_name(i, n);
    match commit.save_id() {
        Some(id) if n > 1 && commit.replaces(&file) => {
            let stem = file.strip_suffix(".safetensors").unwrap_or(&file);
            format!("{stem}.{id}.safetensors")
        }
        _ => file,
    }
}

/// The names of a destination that belong to the format: shards, the index, the checksum manifest.
fn owned(name: &str) -> bool {
    name.ends_with(".safetensors") || name == crate::hf::INDEX_FILE || name == ckpt_io::MANIFEST_NAME
}

/// How Hugging Face shards lie on an object store: the shards, and `model.safetensors.index.json`
/// written last (a single shard without index is its own commit). A shard whose name the previous
/// checkpoint holds takes the save's id instead (see `shard_file_name`), so the previous checkpoint stays
/// whole until the new index replaces its own.
pub const OBJECT_LAYOUT: ckpt_io::storage::ObjectLayout =
    ckpt_io::storage::ObjectLayout { format: "hf", owned, commit_points: &[crate::hf::INDEX_FILE] };

/// The index as `transformers` writes it: `json.dumps(index, indent=2, sort_keys=True) + "\n"` (non-ASCII
/// characters escaped, as Python's `ensure_ascii`).
pub(crate) fn index_json(total_size: u64, weight_map: &[(&str, String)]) -> String {
    let mut sorted: Vec<&(&str, String)> = weight_map.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let map: serde_json::Map<String, Json> =
        sorted.into_iter().map(|(k, f)| ((*k).to_owned(), Json::String(f.clone()))).collect();
    let mut meta = serde_json::Map::new();
    meta.insert("total_size".into(), Json::from(total_size));
    let mut index = serde_json::Map::new();
    index.insert("metadata".into(), Json::Object(meta));
    index.insert("weight_map".into(), Json::Object(map));
    let text = serde_json::to_string_pretty(&Json::Object(index)).unwrap_or_default();
    let mut out = String::with_capacity(text.len() + 1);
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out.push('\n');
    out
}

/// The planned files of a save: every tensor the shards hold and which shard holds it, and the first shard's
/// `__metadata__` (ckpt's records of paths and values, [`crate::metadata`]).
#[derive(Debug, Clone)]
pub struct Layout {
    /// Every tensor the files hold, in the entries' order: its name and the tensor as given (an outline
    /// stays an outline), or a tensor a value holds.
    pub tensors: Vec<(String, Tensor)>,
    /// The indices into [`Layout::tensors`] of each shard, shards in file order (at least one shard).
    pub shards: Vec<Vec<usize>>,
    /// The first shard's `__metadata__`.
    pub records: HashMap<String, String>,
    /// What the save holds: tensors, values, bytes, entries that cannot be stored.
    pub report: SaveReport,
}

impl Layout {
    /// The `(name, file)` pairs of the index, for `names`, the files of the shards in order.
    pub fn weight_map<'a>(&'a self, names: &'a [String]) -> Vec<(&'a str, String)> {
        let mut out = Vec::with_capacity(self.tensors.len());
        for (members, file) in self.shards.iter().zip(names) {
            for &k in members {
                if let Some((name, _)) = self.tensors.get(k) {
                    out.push((name.as_str(), file.clone()));
                }
            }
        }
        out
    }

    /// Bytes of tensor data in all shards.
    pub fn total_size(&self) -> u64 {
        self.tensors.iter().map(|(_, t)| t.nbytes() as u64).sum()
    }
}

/// The shards of `entries` (name, path in the nested state dict, value) as [`crate::hf::save_entries`] plans
/// them with `options`: every tensor in the entries' order, plain tensors under their names, other values
/// recorded in the first shard's `__metadata__` with the tensors they hold; shards filled as `huggingface_hub`
/// fills them. The tensors may be outlines: only their dtypes and shapes are read.
///
/// # Errors
/// A duplicate entry name.
pub fn layout<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a [PathItem], &'a Value)>,
    options: &WriteOptions,
) -> Result<Layout> {
    let mut st_options = metadata::WriteOptions::default().with_durability(options.durability);
    if let Some(s) = &options.source {
        st_options = st_options.with_source(s);
    }
    let (tensors, records, report) = metadata::prepare(entries, &st_options)?;
    let sizes: Vec<u64> = tensors.iter().map(|(_, t)| t.nbytes() as u64).collect();
    let mut shards = shard::plan(&sizes, options.max_shard_size);
    if shards.is_empty() {
        shards.push(Vec::new()); // no tensor: one file with the records
    }
    Ok(Layout { tensors, shards, records, report })
}

/// The commit's options: the shards carry their own checksums (CRC32C in each header), so no manifest.
pub(crate) fn dir_options(options: &WriteOptions) -> DirOptions {
    DirOptions::default().with_durability(options.durability.with_checksums(false)).with_layout(OBJECT_LAYOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_is_python_json() {
        let text = index_json(30, &[("b", "model-00002-of-00002.safetensors".into()), ("\u{e9}", "x".into())]);
        assert_eq!(
            text,
            "{\n  \"metadata\": {\n    \"total_size\": 30\n  },\n  \"weight_map\": {\n    \"b\": \"model-00002-of-00002.safetensors\",\n    \"\\u00e9\": \"x\"\n  }\n}\n"
        );
    }
}
