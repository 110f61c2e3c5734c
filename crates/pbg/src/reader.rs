//! A whole checkpoint at one version, read: every entity partition, the model, the decoded optimizer
//! states and the config, behind [`ckpt_tensor::CheckpointRead`].

use std::path::Path;

use ckpt_tensor::{CheckpointRead, Entry, EntryKind, Tensor, TensorInfo, Value, entry_kind, leaves};
use rayon::prelude::*;

use crate::config::Config;
use crate::entity_path::EntityStorage;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::names::FileName;
use crate::optimizer::StateDict;
use crate::partition::EntityPartition;
use crate::storage::FileCheckpointStorage;
use crate::verify::with_path;

/// Options for opening a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadOptions {
    /// The version to open (default: the committed one, `checkpoint_version.txt`). Older versions are on
    /// disk when they were preserved.
    pub version: Option<u64>,
    /// Limits of the pickle decoder for the optimizer blobs (default: [`ckpt_pickle::Limits::default`]).
    pub limits: ckpt_pickle::Limits,
}

impl ReadOptions {
    /// These options decoding the optimizer blobs under `limits`.
    #[must_use]
    pub fn with_limits(mut self, limits: ckpt_pickle::Limits) -> Self {
        self.limits = limits;
        self
    }

    /// These options opening `version`.
    #[must_use]
    pub fn with_version(mut self, version: u64) -> Self {
        self.version = Some(version);
        self
    }
}

/// One entity partition of a [`PbgReader`].
#[derive(Debug, Clone)]
pub struct PartitionEntry {
    /// Entity type.
    pub entity: String,
    /// Partition index.
    pub partition: u32,
    /// The file's contents (embeddings are a window of the file's map).
    pub data: EntityPartition,
    /// The decoded `RowAdagrad` state, if the file has one.
    pub optimizer: Option<StateDict>,
}

/// A checkpoint at one version, with everything validated up front.
///
/// Opening maps every file of the version (in parallel), validates each header, and decodes the
/// optimizer blobs; tensor data is not read until used (the embeddings are windows of the maps).
///
/// Entry names: `embeddings/<entity>/<part>` (float32 `[N, D]`), `model/<public name>`
/// (`model/relations/0/operator/rhs/real`), `optimizer/embeddings/<entity>/<part>/<key>` and
/// `optimizer/model/<key>` (keys of the decoded state dict, dotted: `state.0.sum`, `param_groups.0.lr`),
/// `config` (the config text, when known) and `version` (the checkpoint version, an int).
#[derive(Debug, Clone)]
pub struct PbgReader {
    storage: FileCheckpointStorage,
    version: u64,
    config: Option<Config>,
    partitions: Vec<PartitionEntry>,
    model: Option<Model>,
    model_optimizer: Option<StateDict>,
}

impl PbgReader {
    /// Opens the committed version of the checkpoint directory `dir` (or of a snapshot `dir/epoch_<k>`).
    ///
    /// # Errors
    /// The first error of any file of the version (each names its file); [`Error::Io`].
    pub fn open(dir: impl AsRef<Path>) -> Result<PbgReader> {
        let dir = dir.as_ref();
        Self::open_with(dir, &ReadOptions::default())
    }

    /// Opens the checkpoint directory `dir` at the version `options` asks for (default: the committed one).
    ///
    /// # Errors
    /// As [`PbgReader::open`].
    pub fn open_with(dir: impl AsRef<Path>, options: &ReadOptions) -> Result<PbgReader> {
        let dir = dir.as_ref();
        let storage = FileCheckpointStorage::new(dir);
        let version = match options.version {
            Some(v) => v,
            None => storage.load_version()?,
        };
        Self::open_version_with(storage, version, &options.limits)
    }

    /// Opens `version` of a storage.
    ///
    /// # Errors
    /// As [`PbgReader::open`].
    pub fn open_version(storage: FileCheckpointStorage, version: u64) -> Result<PbgReader> {
        Self::open_version_with(storage, version, &ckpt_pickle::Limits::default())
    }

    /// [`PbgReader::open_version`], decoding the optimizer blobs under `limits`.
    ///
    /// # Errors
    /// As [`PbgReader::open`].
    pub fn open_version_with(
        storage: FileCheckpointStorage,
        version: u64,
        limits: &ckpt_pickle::Limits,
    ) -> Result<PbgReader> {
        let files: Vec<FileName> =
            storage.list()?.into_iter().map(|(n, _)| n).filter(|n| n.version() == Some(version)).collect();
        // The config: config.json, else (snapshots have none) the model's or a partition's config/json.
        let mut config = match storage.read_config() {
            Ok(c) => Some(c),
            Err(Error::CouldNotLoad { .. }) => None,
            Err(e) => return Err(e),
        };
        let parts: Vec<(String, u32)> = files
            .iter()
            .filter_map(|n| match n {
                FileName::Embeddings { entity, partition, .. } => Some((entity.clone(), *partition)),
                _ => None,
            })
            .collect();
        let mut partitions: Vec<PartitionEntry> = parts
            .par_iter()
            .map(|(entity, partition)| {
                let data = storage.load_entity_partition(version, entity, *partition)?;
                let optimizer = match &data.optimizer {
                    Some(o) => Some(
                        o.decode_with(limits)
                            .map_err(|e| with_path(e, storage.entity_partition_file(version, entity, *partition)))?,
                    ),
                    None => None,
                };
                Ok(PartitionEntry { entity: entity.clone(), partition: *partition, data, optimizer })
            })
            .collect::<Result<_>>()?;
        let model =
            if files.contains(&FileName::Model { version }) { Some(storage.load_model(version)?) } else { None };
        let model_optimizer = match model.as_ref().and_then(|m| m.optimizer.as_ref()) {
            Some(o) => Some(o.decode_with(limits).map_err(|e| with_path(e, storage.model_file(version)))?),
            None => None,
        };
        if config.is_none() {
            let text = model
                .as_ref()
                .and_then(|m| m.metadata.config_json())
                .or_else(|| partitions.iter().find_map(|p| p.data.metadata.config_json()));
            config = text.and_then(|t| Config::parse(t).ok());
        }
        let order = |entity: &str| -> usize {
            config.as_ref().and_then(|c| c.entities().iter().position(|e| e.name == entity)).unwrap_or(usize::MAX)
        };
        partitions.sort_by(|a, b| {
            (order(&a.entity), &a.entity, a.partition).cmp(&(order(&b.entity), &b.entity, b.partition))
        });
        Ok(PbgReader { storage, version, config, partitions, model, model_optimizer })
    }

    /// The storage it was read from.
    pub fn storage(&self) -> &FileCheckpointStorage {
        &self.storage
    }

    /// The version read.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The config (`config.json`, or the `config/json` attribute of the files).
    pub fn config(&self) -> Option<&Config> {
        self.config.as_ref()
    }

    /// The entity partitions, in the config's entity order, then by partition.
    pub fn partitions(&self) -> &[PartitionEntry] {
        &self.partitions
    }

    /// One entity partition.
    pub fn partition(&self, entity: &str, partition: u32) -> Option<&PartitionEntry> {
        self.partitions.iter().find(|p| p.entity == entity && p.partition == partition)
    }

    /// The model file's contents, if the version has one.
    pub fn model(&self) -> Option<&Model> {
        self.model.as_ref()
    }

    /// The model's decoded `Adagrad` state.
    pub fn model_optimizer(&self) -> Option<&StateDict> {
        self.model_optimizer.as_ref()
    }

    /// Checks every partition's row count against `entity_count_<entity>_<part>.txt` (a missing count file
    /// is an error too: PBG could not have trained the partition), and the dimension against the config.
    ///
    /// # Errors
    /// [`Error::CountMismatch`], [`Error::DimensionMismatch`], [`Error::CouldNotLoad`], [`Error::BadEntityFile`].
    pub fn check_counts(&self, entities: &EntityStorage) -> Result<()> {
        for p in &self.partitions {
            let expected = entities.load_count(&p.entity, p.partition)?;
            let path = self.storage.entity_partition_file(self.version, &p.entity, p.partition);
            if expected != p.data.len() as u64 {
                return Err(Error::CountMismatch {
                    path,
                    count_file: entities.count_file(&p.entity, p.partition),
                    entity: p.entity.clone(),
                    partition: p.partition,
                    expected,
                    found: p.data.len() as u64,
                });
            }
            if let Some(c) = &self.config {
                let dim = c.entity_dimension(&p.entity);
                if !p.data.is_empty() && dim != p.data.dimension() as u64 {
                    return Err(Error::DimensionMismatch {
                        path,
                        entity: p.entity.clone(),
                        expected: dim,
                        found: p.data.dimension() as u64,
                    });
                }
            }
        }
        Ok(())
    }

    /// Every entry with its value, in entry order: what [`crate::save`] takes to write this checkpoint again.
    pub fn entry_values(&self) -> Vec<(String, Value)> {
        let mut out: Vec<(String, Value)> = self
            .all()
            .into_iter()
            .map(|(name, item)| {
                let value = match item {
                    Item::Tensor(t) => Value::Tensor(t.clone()),
                    Item::Value(v) => v.clone(),
                };
                (name, value)
            })
            .collect();
        if let Some(c) = &self.config {
            out.push(("config".into(), Value::Str(c.text().to_owned())));
        }
        if let Ok(v) = i64::try_from(self.version) {
            out.push(("version".into(), Value::Int(v)));
        }
        out
    }

    /// Every tensor under its entry name, in entry order.
    pub fn tensors(&self) -> Vec<(String, Tensor)> {
        self.all()
            .into_iter()
            .filter_map(|(name, v)| match v {
                Item::Tensor(t) => Some((name, t.clone())),
                Item::Value(v) => v.as_tensor().map(|t| (name, t.clone())),
            })
            .collect()
    }

    /// Every entry with its item.
    fn all(&self) -> Vec<(String, Item<'_>)> {
        let mut out = Vec::new();
        for p in &self.partitions {
            out.push((format!("embeddings/{}/{}", p.entity, p.partition), Item::Tensor(&p.data.embeddings)));
        }
        if let Some(params) = self.model.as_ref().and_then(|m| m.parameters.as_ref()) {
            for p in params {
                out.push((format!("model/{}", p.public_name), Item::Tensor(&p.tensor)));
            }
        }
        for p in &self.partitions {
            if let Some(sd) = &p.optimizer {
                push_leaves(&mut out, &format!("optimizer/embeddings/{}/{}", p.entity, p.partition), sd.value());
            }
        }
        if let Some(sd) = &self.model_optimizer {
            push_leaves(&mut out, "optimizer/model", sd.value());
        }
        out
    }
}

enum Item<'a> {
    Tensor(&'a Tensor),
    Value(&'a Value),
}

fn push_leaves<'a>(out: &mut Vec<(String, Item<'a>)>, prefix: &str, value: &'a Value) {
    if let Ok(ls) = leaves(value) {
        for l in ls {
            out.push((format!("{prefix}/{}", l.key), Item::Value(l.value)));
        }
    }
}

impl CheckpointRead for PbgReader {
    fn format_name(&self) -> &'static str {
        "pbg"
    }

    fn entries(&self) -> Vec<Entry> {
        let mut out: Vec<Entry> = self
            .all()
            .into_iter()
            .map(|(name, item)| {
                let kind = match item {
                    Item::Tensor(t) => EntryKind::Tensor(TensorInfo { dtype: t.dtype(), shape: t.shape().to_vec() }),
                    Item::Value(v) => entry_kind(v),
                };
                Entry { name, kind }
            })
            .collect();
        if self.config.is_some() {
            out.push(Entry { name: "config".into(), kind: EntryKind::Value });
        }
        out.push(Entry { name: "version".into(), kind: EntryKind::Value });
        out
    }

    fn details(&self) -> Vec<(String, String)> {
        let mut d = vec![
            ("directory".to_owned(), self.storage.path().display().to_string()),
            ("version".to_owned(), self.version.to_string()),
            ("entity partitions".to_owned(), self.partitions.len().to_string()),
        ];
        let mut entities: Vec<(&str, usize, usize)> = Vec::new();
        for p in &self.partitions {
            match entities.iter_mut().find(|(e, _, _)| *e == p.entity) {
                Some(slot) => {
                    slot.1 += 1;
                    slot.2 += p.data.len();
                }
                None => entities.push((&p.entity, 1, p.data.len())),
            }
        }
        for (e, parts, rows) in entities {
            d.push((format!("entity {e}"), format!("{parts} partition(s), {rows} embeddings")));
        }
        match &self.model {
            Some(m) => {
                let n = m.parameters.as_ref().map_or(0, Vec::len);
                d.push(("model parameters".to_owned(), n.to_string()));
            }
            None => d.push(("model".to_owned(), "absent".to_owned())),
        }
        if let Ok(epochs) = self.storage.snapshots() {
            if !epochs.is_empty() {
                let list: Vec<String> = epochs.iter().map(u64::to_string).collect();
                d.push(("snapshots (epochs)".to_owned(), list.join(", ")));
            }
        }
        if let Some(c) = &self.config {
            d.push(("dimension".to_owned(), c.dimension().to_string()));
            let ops: Vec<String> = c.relations().iter().map(|r| format!("{}:{}", r.name, r.operator)).collect();
            d.push(("relations".to_owned(), ops.join(", ")));
        }
        d
    }

    fn tensor(&self, name: &str) -> ckpt_tensor::Result<Tensor> {
        for (n, item) in self.all() {
            if n == name {
                return match item {
                    Item::Tensor(t) => Ok(t.clone()),
                    Item::Value(v) => v
                        .as_tensor()
                        .cloned()
                        .ok_or_else(|| Error::NoSuchEntry(format!("{name} (not a tensor)")).into()),
                };
            }
        }
        Err(Error::NoSuchEntry(name.to_owned()).into())
    }

    fn value(&self, name: &str) -> ckpt_tensor::Result<Value> {
        if name == "config" {
            if let Some(c) = &self.config {
                return Ok(Value::Str(c.text().to_owned()));
            }
        }
        if name == "version" {
            return i64::try_from(self.version)
                .map(Value::Int)
                .map_err(|_| Error::NoSuchEntry(format!("version {} beyond i64", self.version)).into());
        }
        for (n, item) in self.all() {
            if n == name {
                return Ok(match item {
                    Item::Tensor(t) => Value::Tensor(t.clone()),
                    Item::Value(v) => v.clone(),
                });
            }
        }
        Err(Error::NoSuchEntry(name.to_owned()).into())
    }
}
