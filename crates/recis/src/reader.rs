//! One checkpoint directory as a whole: the serializer's sparse part plus `model.pt`, `extra.pt` and the
//! io states, behind ckpt-tensor's [`CheckpointRead`].

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ckpt_tensor::flatten::LeafIndex;
use ckpt_tensor::{CheckpointRead, Dict, DictKind, Entry, EntryKind, Tensor, TensorInfo, Value, entry_kind, leaves};

use crate::dense::{EXTRA_FILE, IO_STATE_COUNT_FILE, MODEL_FILE, read_io_state_count};
use crate::error::{Error, Result};
use crate::index::INDEX_FILE;
use crate::manager::{CHECKPOINT_LIST, CheckpointManager, checkpoint_dir};
use crate::options::ReadOptions;
use crate::sparse::SparseCheckpoint;

/// A RecIS checkpoint directory (`<output_dir>/<ckpt_id>/`), opened.
///
/// Entry names, for [`CheckpointRead`]:
/// * the serializer's tensors under their internal names, as RecIS's `CheckpointReader` lists them:
///   `child@slot` (slices concatenated, `child@id` row-aligned with every slot) and dense names;
/// * `model.pt`'s leaves under their state-dict keys (the model's dense parameters and buffers);
/// * `extra.pt`'s leaves under `extra/<key>`, and shard s's io state under `io_state_<s>/<key>`.
#[derive(Debug, Clone)]
pub struct RecisReader {
    dir: PathBuf,
    sparse: SparseCheckpoint,
    model: Option<Value>,
    extra: Option<Value>,
    io_states: Vec<(usize, Value)>,
    io_state_count: Option<usize>,
    /// Leaves by name of each torch-file part (in [`Checkpoint::torch_parts`] order), built on the first
    /// look-up (reading every entry stays linear).
    leaf_index: OnceLock<Vec<Option<LeafIndex>>>,
}

impl RecisReader {
    /// Opens a checkpoint directory: the sparse part (if it has an `index`), `model.pt`, `extra.pt` and
    /// every `io_state_<s>.pt`. An output root with a `checkpoint` list opens its latest checkpoint
    /// ([`checkpoint_dir`](crate::checkpoint_dir) has the rule).
    ///
    /// # Errors
    /// [`Error::MissingFile`] if the directory has none of `index`, `model.pt`, `extra.pt`; the errors of
    /// [`crate::checkpoint_dir`], of [`SparseCheckpoint::open`] and of the torch reader.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Self::open_with(path, &ReadOptions::default())
    }

    /// [`RecisReader::open`] with `options`: how the `torch.save` files are read (CRC verification, pickle
    /// limits), the largest data-file header accepted, and, for a partial local copy, the fill hook every
    /// file is read through ([`ReadOptions::fill`]; files named to it by their path relative to `path`).
    ///
    /// # Errors
    /// As [`RecisReader::open`]; a failed fill of what opening reads (data-file headers, the `.pt` files'
    /// records but their tensors') is an error.
    pub fn open_with(path: impl AsRef<Path>, options: &ReadOptions) -> Result<Self> {
        let path = path.as_ref();
        let dir = &checkpoint_dir(path)?;
        let options = &options.for_dir(path, dir);
        // The files are opened one by one, by path: a save swapping a new checkpoint in meanwhile could
        // hand this reader files of two generations. The directory is pinned first and checked after; if
        // the path names another directory by then, everything is read again (up to three times).
        for _ in 0..3 {
            let pinned = ckpt_io::PinnedDir::open(dir).ok();
            let opened = Self::open_once(dir, options);
            if pinned.as_ref().is_none_or(|p| !p.is_replaced()) {
                return opened;
            }
        }
        Err(Error::io(dir, std::io::Error::other("replaced by other saves three times while being read")))
    }

    fn open_once(dir: &Path, options: &ReadOptions) -> Result<Self> {
        let has = |f: &str| dir.join(f).is_file();
        if !has(INDEX_FILE) && !has(MODEL_FILE) && !has(EXTRA_FILE) {
            return Err(Error::MissingFile {
                path: dir.join(INDEX_FILE),
                what: "a RecIS checkpoint directory has an `index`, a `model.pt` or an `extra.pt`",
            });
        }
        let sparse =
            if has(INDEX_FILE) { SparseCheckpoint::open_with(dir, options)? } else { SparseCheckpoint::empty(dir) };
        let model = crate::dense::read_torch(&dir.join(MODEL_FILE), &options.torch_for(MODEL_FILE))?;
        let extra = crate::dense::read_torch(&dir.join(EXTRA_FILE), &options.torch_for(EXTRA_FILE))?;
        let mut io_states = Vec::new();
        let listing = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
        for entry in listing {
            let entry = entry.map_err(|e| Error::io(dir, e))?;
            let name = entry.file_name();
            let Some((name, shard)) = name.to_str().and_then(|n| {
                let shard = n
                    .strip_prefix("io_state_")?
                    .strip_suffix(".pt")
                    .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))?
                    .parse::<usize>()
                    .ok()?;
                Some((n, shard))
            }) else {
                continue;
            };
            let value = ckpt_torch::TorchReader::open_with(entry.path(), &options.torch_for(name))?.into_value();
            io_states.push((shard, value));
        }
        io_states.sort_by_key(|(s, _)| *s);
        let io_state_count = if has(IO_STATE_COUNT_FILE) { read_io_state_count(dir)? } else { None };
        Ok(RecisReader {
            dir: dir.into(),
            sparse,
            model,
            extra,
            io_states,
            io_state_count,
            leaf_index: OnceLock::new(),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The serializer's part: hash tables and sparse-side dense tensors.
    pub fn sparse(&self) -> &SparseCheckpoint {
        &self.sparse
    }

    /// `model.pt`'s state dict, if saved.
    pub fn model(&self) -> Option<&Value> {
        self.model.as_ref()
    }

    /// `extra.pt`'s contents, if saved.
    pub fn extra(&self) -> Option<&Value> {
        self.extra.as_ref()
    }

    /// Shard `shard`'s io state, if saved.
    pub fn io_state(&self, shard: usize) -> Option<&Value> {
        self.io_states.iter().find(|(s, _)| *s == shard).map(|(_, v)| v)
    }

    /// Every saved io state, by shard, in shard order.
    pub fn io_states(&self) -> &[(usize, Value)] {
        &self.io_states
    }

    /// The shard count in `io_state_count`, if saved.
    pub fn io_state_count(&self) -> Option<usize> {
        self.io_state_count
    }

    /// The checkpoint as one nested state dict: `{"sparse": {<tensor name>: tensor}, "model": <model.pt>,
    /// "extra": <extra.pt>, "io_state_<s>": <io_state_<s>.pt>}`, parts the directory lacks left out.
    /// `sparse` holds the serializer's tensors under their names (`tbl@id`, `tbl@embedding`, dense names), read
    /// whole. This is the RecIS-shaped state dict [`crate::save`] writes back as a checkpoint.
    ///
    /// # Errors
    /// As [`SparseCheckpoint::read_tensor`].
    pub fn state_dict(&self) -> Result<Value> {
        let mut tree = Dict::new(DictKind::Dict);
        let names = self.sparse.tensor_names();
        if !names.is_empty() {
            let mut part = Dict::new(DictKind::Dict);
            for name in names {
                part.insert(name, Value::Tensor(self.sparse.read_tensor(name)?));
            }
            tree.insert("sparse", Value::Dict(part));
        }
        if let Some(m) = &self.model {
            tree.insert("model", m.clone());
        }
        if let Some(e) = &self.extra {
            tree.insert("extra", e.clone());
        }
        for (s, v) in &self.io_states {
            tree.insert(format!("io_state_{s}"), v.clone());
        }
        Ok(Value::Dict(tree))
    }

    /// The torch-file parts, each with the prefix of its entry names.
    fn torch_parts(&self) -> Vec<(String, &Value)> {
        let mut out = Vec::new();
        if let Some(m) = &self.model {
            out.push((String::new(), m));
        }
        if let Some(e) = &self.extra {
            out.push(("extra/".to_owned(), e));
        }
        for (s, v) in &self.io_states {
            out.push((format!("io_state_{s}/"), v));
        }
        out
    }

    fn torch_leaf(&self, name: &str) -> Option<Value> {
        let parts = self.torch_parts();
        let indexes = self.leaf_index.get_or_init(|| parts.iter().map(|(_, v)| LeafIndex::new(v).ok()).collect());
        for ((prefix, v), index) in parts.iter().zip(indexes) {
            let Some(rest) = name.strip_prefix(prefix.as_str()) else {
                continue;
            };
            if let Some(leaf) = index.as_ref().and_then(|i| i.get(v, rest)) {
                return Some(leaf.clone());
            }
        }
        None
    }
}

impl CheckpointRead for RecisReader {
    fn format_name(&self) -> &'static str {
        "recis"
    }

    fn entries(&self) -> Vec<Entry> {
        let mut out = Vec::new();
        for name in self.sparse.tensor_names() {
            if let Some((dtype, shape)) = self.sparse.tensor_info(name) {
                out.push(Entry { name: name.into(), kind: EntryKind::Tensor(TensorInfo { dtype, shape }) });
            }
        }
        for (prefix, v) in self.torch_parts() {
            if let Ok(all) = leaves(v) {
                out.extend(
                    all.into_iter().map(|l| Entry { name: format!("{prefix}{}", l.key), kind: entry_kind(l.value) }),
                );
            }
        }
        out
    }

    fn details(&self) -> Vec<(String, String)> {
        let s = &self.sparse;
        let mut d = vec![
            ("data files".to_owned(), s.data_files().len().to_string()),
            ("blocks".to_owned(), s.blocks().len().to_string()),
            ("tables".to_owned(), s.children().join(", ")),
        ];
        if let Some(n) = s.shard_num() {
            d.push(("shards".into(), n.to_string()));
        }
        if let Some(p) = s.parallel() {
            d.push(("parallel".into(), p.to_string()));
        }
        for c in s.children() {
            if let Ok(size) = s.slice_size(c) {
                d.push((format!("slice_size {c}"), size.to_string()));
            }
        }
        let files: Vec<&str> = [(MODEL_FILE, self.model.is_some()), (EXTRA_FILE, self.extra.is_some())]
            .iter()
            .filter(|(_, present)| *present)
            .map(|(f, _)| *f)
            .collect();
        d.push(("dense files".into(), files.join(", ")));
        if let Some(n) = self.io_state_count {
            d.push(("io_state_count".into(), n.to_string()));
        }
        d
    }

    fn tensor(&self, name: &str) -> ckpt_tensor::Result<Tensor> {
        if self.sparse.tensor_info(name).is_some() {
            return Ok(self.sparse.read_tensor(name)?);
        }
        match self.torch_leaf(name) {
            Some(v) => v.as_tensor().cloned().ok_or_else(|| Error::NotATensor { name: name.to_owned() }.into()),
            None => Err(Error::NotFound { what: "entry", name: name.into() }.into()),
        }
    }

    fn value(&self, name: &str) -> ckpt_tensor::Result<Value> {
        if self.sparse.tensor_info(name).is_some() {
            return Ok(Value::Tensor(self.sparse.read_tensor(name)?));
        }
        self.torch_leaf(name).ok_or_else(|| Error::NotFound { what: "entry", name: name.into() }.into())
    }
}

// Opening a managed checkpoint is reading it: the manager's readers are made here.
impl CheckpointManager {
    /// Opens checkpoint `id` (listed or not, as RecIS's `load(ckpt_id=…)`).
    ///
    /// # Errors
    /// [`Error::BadCheckpointId`], and the errors of [`RecisReader::open`].
    pub fn open(&self, id: &str) -> Result<RecisReader> {
        RecisReader::open(&self.path_of(id)?)
    }

    /// Opens the latest listed checkpoint.
    ///
    /// # Errors
    /// [`Error::NoCheckpoint`] when none is listed; as [`CheckpointManager::open`].
    pub fn open_latest(&self) -> Result<RecisReader> {
        let id = self.latest()?.ok_or_else(|| Error::NoCheckpoint { path: self.root().join(CHECKPOINT_LIST) })?;
        self.open(&id)
    }
}
