//! Writing a new checkpoint from its entries, named as [`PbgReader`](crate::PbgReader) names them — what any other format keeps of
//! a PBG checkpoint converted to it.
//!
//! | entry | becomes |
//! |---|---|
//! | `embeddings/<entity>/<partition>` (float32 `[N, D]`) | `embeddings_<entity>_<partition>.v<V>.h5` |
//! | `model/<public name>` | a parameter of `model.v<V>.h5` (`relations/0/operator/rhs/real`) |
//! | `optimizer/embeddings/<entity>/<partition>/<key>` | that partition's `RowAdagrad` state |
//! | `optimizer/model/<key>` | the model's `Adagrad` state |
//! | `config` | `config.json` |
//! | `version` | `V` (default 1) |
//!
//! A name may carry a `model.` prefix (a PBG checkpoint nested under `model`, as an hfai checkpoint holds
//! it); it is taken off. Optimizer keys are the dotted keys of the state dict (`state.0.sum`,
//! `param_groups.0.lr`); when only the tensors were kept (a safetensors file keeps no `param_groups` unless
//! ckpt wrote it), the state dict is rebuilt as PBG's trainer writes it, with the config's `lr`.
//!
//! The layout (entity types, partition counts, dimension, relations) is the config's: the `config` entry, or
//! [`WriteOptions::config`]. An entity whose partition count in the config differs from the entries' is
//! re-partitioned: its partitions are concatenated in order and cut into the config's count of consecutive
//! ranges (the first `N % P` one row longer), optimizer sums alike. PBG maps rows to entities through the
//! files under the config's `entity_path` (`entity_count_*`, `entity_names_*`), which are not part of a
//! checkpoint: they must be made for the new layout too.

use std::collections::BTreeMap;
use std::path::Path;

use ckpt_collective::{Collective, SingleProcess};
use ckpt_io::SaveReport;
use ckpt_io::{CommitError, DirCommit, DirOptions, MANIFEST_NAME};
use ckpt_tensor::{Dict, DictKind, Tensor, Value};

use crate::commit::WriteOptions;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::model::{Model, ModelParameter, public_to_private};
use crate::names::{CONFIG_FILE, FileName};
use crate::optimizer::{OptimizerState, StateDict};
use crate::partition::EntityPartition;
use crate::storage::FileCheckpointStorage;

/// What the entries hold, under PBG's names.
#[derive(Default)]
struct Source {
    /// entity → partition → embeddings.
    embeddings: BTreeMap<String, BTreeMap<u32, Tensor>>,
    /// Model parameters by public name, in source order.
    parameters: Vec<(String, Tensor)>,
    /// (entity, partition) → optimizer leaves (dotted key, value).
    partition_optimizers: BTreeMap<(String, u32), Vec<(String, Value)>>,
    model_optimizer: Vec<(String, Value)>,
    config: Option<String>,
    version: Option<u64>,
    /// The names of the entries left out.
    dropped: Vec<String>,
}

/// `name` without a `model.` prefix (a PBG checkpoint nested under `model`), when what follows is a PBG name.
fn pbg_name(name: &str) -> &str {
    match name.strip_prefix("model.") {
        Some(rest)
            if ["embeddings/", "model/", "optimizer/"].iter().any(|p| rest.starts_with(p))
                || rest == "config"
                || rest == "version" =>
        {
            rest
        }
        _ => name,
    }
}

/// `<entity>/<partition>` and what follows it.
fn entity_partition(rest: &str) -> Option<(&str, u32, Option<&str>)> {
    let (entity, rest) = rest.split_once('/')?;
    let (part, tail) = match rest.split_once('/') {
        Some((p, tail)) => (p, Some(tail)),
        None => (rest, None),
    };
    if entity.is_empty() || part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((entity, part.parse().ok()?, tail))
}

fn classify(entries: &[(String, Value)]) -> Source {
    let mut s = Source::default();
    for (full_name, value) in entries {
        let name = pbg_name(full_name);
        let tensor = value.as_tensor();
        let used = if name == "config" {
            s.config = value.as_str().map(str::to_owned);
            s.config.is_some()
        } else if name == "version" {
            s.version = value.as_int().and_then(|v| u64::try_from(v).ok());
            s.version.is_some()
        } else if let Some(rest) = name.strip_prefix("embeddings/") {
            match (entity_partition(rest), tensor) {
                (Some((entity, part, None)), Some(t)) => {
                    s.embeddings.entry(entity.to_owned()).or_default().insert(part, t.clone());
                    true
                }
                _ => false,
            }
        } else if let Some(public) = name.strip_prefix("model/") {
            match tensor {
                Some(t) => {
                    s.parameters.push((public.to_owned(), t.clone()));
                    true
                }
                None => false,
            }
        } else if let Some(key) = name.strip_prefix("optimizer/model/") {
            s.model_optimizer.push((key.to_owned(), value.clone()));
            true
        } else if let Some(rest) = name.strip_prefix("optimizer/embeddings/") {
            match entity_partition(rest) {
                Some((entity, part, Some(key))) => {
                    s.partition_optimizers
                        .entry((entity.to_owned(), part))
                        .or_default()
                        .push((key.to_owned(), value.clone()));
                    true
                }
                _ => false,
            }
        } else {
            false
        };
        if !used {
            s.dropped.push(full_name.clone());
        }
    }
    s
}

/// Sets dotted `steps` (`state.0.sum`, `param_groups.0.params.1`) in `node`: under the top-level `state`,
/// all-digit steps are int keys of a dict (torch's per-parameter state); elsewhere they are list indices.
/// `None` when the steps do not fit what is already there (an index past the end of a list, a step into a
/// leaf).
fn set_dotted(node: &mut Value, steps: &[&str], top: bool, under_state: bool, value: Value) -> Option<()> {
    let (step, rest) = steps.split_first()?;
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let fresh = || match rest.first() {
        Some(next) if numeric(next) && !(top && *step == "state") => Value::List(Vec::new()),
        _ => Value::Dict(Dict::new(DictKind::Dict)),
    };
    let child = match node {
        Value::Dict(d) => {
            let key = if under_state { Value::Int(step.parse().ok()?) } else { Value::Str((*step).to_owned()) };
            let pos = match d.items.iter().position(|(k, _)| *k == key) {
                Some(p) => p,
                None => {
                    d.items.push((key, fresh()));
                    d.items.len() - 1
                }
            };
            &mut d.items.get_mut(pos)?.1
        }
        Value::List(items) => {
            let i: usize = step.parse().ok().filter(|_| numeric(step))?;
            if i == items.len() {
                items.push(fresh());
            }
            items.get_mut(i)?
        }
        _ => return None,
    };
    if rest.is_empty() {
        *child = value;
        return Some(());
    }
    set_dotted(child, rest, false, top && *step == "state", value)
}

fn set_key(root: &mut Value, key: &str, value: Value) -> Option<()> {
    let steps: Vec<&str> = key.split('.').collect();
    set_dotted(root, &steps, true, false, value)
}

/// The optimizer state dict of dotted `leaves`, when they hold its `param_groups`; `None` otherwise.
fn rebuild_state_dict(leaves: &[(String, Value)]) -> Option<Value> {
    if !leaves.iter().any(|(k, _)| k.starts_with("param_groups.")) {
        return None;
    }
    let mut root = Value::Dict(Dict::new(DictKind::Dict));
    for (k, v) in leaves {
        set_key(&mut root, k, v.clone())?;
    }
    Some(root)
}

/// The tensor at dotted `key` of `leaves`.
fn leaf_tensor<'a>(leaves: &'a [(String, Value)], key: &str) -> Option<&'a Tensor> {
    leaves.iter().find(|(k, _)| k == key).and_then(|(_, v)| v.as_tensor())
}

fn leaf_f64(leaves: &[(String, Value)], key: &str) -> Option<f64> {
    leaves.iter().find(|(k, _)| k == key).and_then(|(_, v)| v.as_f64())
}

/// The model's `Adagrad` state as torch 2.13 saves it, from per-parameter `state.<i>.<key>` leaves.
fn model_adagrad(leaves: &[(String, Value)], lr: f64) -> Option<Value> {
    let mut root = Value::Dict(Dict::new(DictKind::Dict));
    for (k, v) in leaves {
        if k.starts_with("state.") {
            set_key(&mut root, k, v.clone())?;
        }
    }
    let Value::Dict(mut root) = root else {
        return None;
    };
    let mut params: Vec<i64> = root
        .get("state")
        .and_then(Value::as_dict)
        .map(|d| d.items.iter().filter_map(|(k, _)| k.as_int()).collect())
        .unwrap_or_default();
    params.sort_unstable();
    let group = Value::dict([
        ("lr", Value::Float(lr)),
        ("lr_decay", Value::Int(0)),
        ("eps", Value::Float(1e-10)),
        ("weight_decay", Value::Int(0)),
        ("initial_accumulator_value", Value::Int(0)),
        ("foreach", Value::None),
        ("maximize", Value::Bool(false)),
        ("differentiable", Value::Bool(false)),
        ("fused", Value::None),
        ("params", Value::List(params.into_iter().map(Value::Int).collect())),
    ]);
    if root.get("state").is_none() {
        root.insert("state", Value::Dict(Dict::new(DictKind::Dict)));
    }
    root.insert("param_groups", Value::List(vec![group]));
    Some(Value::Dict(root))
}

/// Rows `[start, start + len)` of `t` (dimension 0) as a contiguous tensor.
fn rows(t: &Tensor, start: usize, len: usize) -> Result<Tensor> {
    Ok(t.narrow(0, start, len).and_then(|v| v.to_contiguous())?)
}

/// Whether `tensors` can be concatenated on dimension 0: at least one, all of one dtype and row shape.
fn check_concat(tensors: &[Tensor]) -> Result<()> {
    let Some(first) = tensors.first() else {
        return Err(Error::InvalidInput { what: "embeddings".into(), reason: "concatenating no tensors".into() });
    };
    for t in tensors {
        if t.dtype() != first.dtype() || t.shape().get(1..) != first.shape().get(1..) || t.dim() == 0 {
            return Err(Error::InvalidInput {
                what: "embeddings".into(),
                reason: format!(
                    "cannot concatenate {} {:?} with {} {:?}",
                    first.dtype(),
                    first.shape(),
                    t.dtype(),
                    t.shape()
                ),
            });
        }
    }
    Ok(())
}

/// The `(start, len)` row ranges of `n` rows cut into `parts` consecutive ranges, the first `n % parts`
/// one longer.
fn ranges(n: usize, parts: usize) -> Vec<(usize, usize)> {
    let (base, rem) = (n / parts, n % parts);
    let mut start = 0;
    (0..parts)
        .map(|p| {
            let len = base + usize::from(p < rem);
            let r = (start, len);
            start += len;
            r
        })
        .collect()
}

/// Names of a PBG checkpoint directory that [`save`] writes (the files of a version, the version file,
/// `config.json`, snapshots) or the checksum manifest: anything else in an existing destination is carried
/// into the new one.
fn is_pbg_file(name: &str) -> bool {
    FileName::parse(name).is_some() || name == CONFIG_FILE || name == MANIFEST_NAME
}

/// How a PBG checkpoint lies on an object store: its files, and `checkpoint_version.txt` written last
/// (PBG's own commit point).
pub const OBJECT_LAYOUT: ckpt_io::storage::ObjectLayout =
    ckpt_io::storage::ObjectLayout { format: "pbg", owned: is_pbg_file, commit_points: &[crate::names::VERSION_FILE] };

fn commit_error(e: CommitError) -> Error {
    Error::Core(e.into())
}

/// Writes a new PBG checkpoint in `dst` (which must not hold one) from `entries` named as [`PbgReader`](crate::PbgReader) names
/// them (the module documentation has the table), in the config's layout, re-partitioning entities whose
/// partition count differs and rebuilding optimizer state dicts of which only the tensors were kept. The
/// config is written first, then version `V` in one commit (`options`' snapshot and version-file choices
/// apply; there is no older version to carry over or preserve). The directory is written beside `dst`
/// (`.<dst>.ckpt-staging`) and swapped in whole ([`ckpt_io::DirCommit`]), with the checksum
/// manifest `ckpt.checksums.json` (a CRC-32 per 8 MiB of every HDF5 file and the config, which PBG
/// ignores): a crash leaves no
/// checkpoint or the whole new one, never a half-written one; files of an existing `dst` that are not PBG's
/// are carried over.
///
/// ```
/// # let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/fixtures/pbg/ckpt");
/// use ckpt_tensor::CheckpointRead;
/// use ckpt_pbg::{PbgReader, WriteOptions};
/// let src = PbgReader::open(&fixture).unwrap();
/// // Every entry by name, as any other format keeps them; user_id re-partitioned from 2 partitions into 3.
/// let entries: Vec<_> = src.entries().into_iter().map(|e| (e.name.clone(), src.value(&e.name).unwrap())).collect();
/// let text = src.config().unwrap().text().replace("\"num_partitions\": 2", "\"num_partitions\": 3");
/// let options = WriteOptions::default().with_config(ckpt_pbg::Config::parse(&text).unwrap());
/// let dir = tempfile::tempdir().unwrap();
/// let report = ckpt_pbg::save(&entries, dir.path(), &options).unwrap();
/// assert_eq!(report.dropped.len(), 0);
/// assert!(report.files.iter().any(|f| f.ends_with("checkpoint_version.txt")));
/// let out = PbgReader::open(dir.path()).unwrap();
/// assert_eq!(out.partitions().iter().filter(|p| p.entity == "user_id").count(), 3);
/// ```
///
/// # Errors
/// [`Error::NoEmbeddings`] when no entry is an entity partition or a model parameter; [`Error::NoConfig`]
/// without a config; [`Error::LayoutMismatch`] when the entries do not fit the config's layout;
/// [`Error::AlreadyExists`] when `dst` holds a checkpoint (its version file); the storage's errors; the
/// commit's (`Error::Core` holding a `ckpt_io::CommitError`: another save to `dst` in progress, a full disk).
pub fn save(entries: &[(String, Value)], dst: impl AsRef<Path>, options: &WriteOptions) -> Result<SaveReport> {
    let dst = dst.as_ref();
    let dropped = write_plan(plan(entries, dst, options)?, dst, options)?;
    Ok(report(entries, dropped, dst))
}

/// The report of a save of `entries` that left out `dropped` in the committed directory `dst`.
fn report(entries: &[(String, Value)], dropped: Vec<String>, dst: &Path) -> SaveReport {
    let mut report = SaveReport::default();
    for (name, value) in entries {
        if !dropped.contains(name) {
            report.count(value);
        }
    }
    report.dropped = dropped;
    report.with_files(ckpt_io::owned_files(dst, is_pbg_file))
}

/// The layout of a save of `entries` (see [`save`]), nothing read or written yet.
fn plan(entries: &[(String, Value)], dst: &Path, options: &WriteOptions) -> Result<Plan> {
    let source = classify(entries);
    if source.embeddings.is_empty() && source.parameters.is_empty() {
        return Err(Error::NoEmbeddings);
    }
    let parsed;
    let config = match (&options.config, &source.config) {
        (Some(config), _) => config,
        (None, Some(text)) => {
            parsed = Config::parse(text).map_err(|e| match e {
                Error::BadConfig { reason, .. } => Error::BadConfig { path: dst.join(CONFIG_FILE), reason },
                Error::ConfigJson { source, .. } => Error::ConfigJson { path: dst.join(CONFIG_FILE), source },
                e => e,
            })?;
            &parsed
        }
        (None, None) => return Err(Error::NoConfig),
    };
    let layout = |reason: String| Error::LayoutMismatch { reason };
    for entity in source.embeddings.keys() {
        if config.entity(entity).is_none() {
            return Err(layout(format!(
                "the entries have embeddings of entity type {entity:?}, which the config lacks"
            )));
        }
    }

    // Entity partitions in the config's layout, each made (its rows read) only by whoever writes it.
    let mut partitions: Vec<PlannedPartition> = Vec::new();
    for e in config.entities() {
        let Some(parts) = source.embeddings.get(&e.name) else {
            return Err(layout(format!("the entries have no embeddings of entity type {:?}", e.name)));
        };
        let dim = config.entity_dimension(&e.name);
        for (p, t) in parts {
            if t.dtype() != ckpt_tensor::DType::F32 || t.dim() != 2 || t.shape().get(1).map(|&d| d as u64) != Some(dim)
            {
                return Err(layout(format!(
                    "embeddings/{}/{p} is {} {:?}; the config wants float32 [N, {dim}]",
                    e.name,
                    t.dtype(),
                    t.shape()
                )));
            }
        }
        let src_count = parts.len();
        if parts.keys().copied().ne(0..src_count as u32) {
            return Err(layout(format!(
                "the entries' partitions of {:?} are {:?}, not 0..{src_count}",
                e.name,
                parts.keys().collect::<Vec<_>>()
            )));
        }
        let want = usize::try_from(e.num_partitions).unwrap_or(usize::MAX);
        let opt = |p: u32| source.partition_optimizers.get(&(e.name.clone(), p));
        let lr_of = |p: u32| opt(p).and_then(|o| leaf_f64(o, "param_groups.0.lr")).unwrap_or_else(|| config.lr());
        if want == src_count {
            for (&p, t) in parts {
                let optimizer = match opt(p) {
                    Some(o) => Some(match rebuild_state_dict(o) {
                        Some(v) => PlannedOptimizer::StateDict(v),
                        None => match leaf_tensor(o, "state.0.sum") {
                            Some(sum) => PlannedOptimizer::RowAdagrad(vec![sum.clone()], lr_of(p)),
                            None => {
                                return Err(layout(format!(
                                    "optimizer/embeddings/{}/{p} has no `state.0.sum`",
                                    e.name
                                )));
                            }
                        },
                    }),
                    None => None,
                };
                let rows = t.shape().first().copied().unwrap_or(0);
                partitions.push(PlannedPartition {
                    entity: e.name.clone(),
                    partition: p,
                    embeddings: vec![t.clone()],
                    rows: (0, rows),
                    optimizer,
                });
            }
        } else {
            let all: Vec<Tensor> = parts.values().cloned().collect();
            check_concat(&all)?;
            let sums: Option<Vec<Tensor>> =
                (0..src_count as u32).map(|p| opt(p).and_then(|o| leaf_tensor(o, "state.0.sum")).cloned()).collect();
            if let Some(sums) = &sums {
                check_concat(sums)?;
            }
            let n = all.iter().map(|t| t.shape().first().copied().unwrap_or(0)).sum();
            for (p, (start, len)) in ranges(n, want).into_iter().enumerate() {
                let p = u32::try_from(p).map_err(|_| layout(format!("{want} partitions")))?;
                partitions.push(PlannedPartition {
                    entity: e.name.clone(),
                    partition: p,
                    embeddings: all.clone(),
                    rows: (start, len),
                    optimizer: sums.clone().map(|s| PlannedOptimizer::RowAdagrad(s, lr_of(0))),
                });
            }
        }
    }

    // The model.
    let model = if source.parameters.is_empty() && source.model_optimizer.is_empty() {
        None
    } else {
        let parameters = source
            .parameters
            .iter()
            .map(|(public, t)| {
                let private = public_to_private(public)
                    .ok_or_else(|| layout(format!("model/{public} is not a PyTorch-BigGraph parameter name")))?;
                ModelParameter::new(&private, t.clone())
            })
            .collect::<Result<Vec<_>>>()?;
        let optimizer = if source.model_optimizer.is_empty() {
            None
        } else {
            let value = match rebuild_state_dict(&source.model_optimizer) {
                Some(v) => Some(v),
                None => model_adagrad(&source.model_optimizer, config.lr()),
            };
            let value = value.ok_or_else(|| layout("the model's optimizer entries do not form a state dict".into()))?;
            let state = StateDict::from_value(value)?;
            Some(OptimizerState::encode(&state)?)
        };
        Some(Model { parameters: Some(parameters), optimizer, ..Model::default() })
    };

    Ok(Plan {
        config: config.clone(),
        version: source.version.unwrap_or(1).max(1),
        partitions,
        model,
        dropped: source.dropped,
    })
}

/// Writes `plan` into a staging directory beside `dst`, swapped in whole (`DirCommit`): config first (the
/// commit derives the files' metadata from it), then version V in one PBG commit.
fn write_plan(plan: Plan, dst: &Path, options: &WriteOptions) -> Result<Vec<String>> {
    let Plan { config, version, partitions, model, dropped } = plan;
    if FileCheckpointStorage::new(dst).version_file().exists() {
        return Err(Error::AlreadyExists { path: FileCheckpointStorage::new(dst).version_file() });
    }
    let staged = DirCommit::begin(dst, &SingleProcess, &dir_options(options)).map_err(commit_error)?;
    // Checked again under the lock: another save may have committed since.
    if FileCheckpointStorage::new(dst).version_file().exists() {
        return Err(Error::AlreadyExists { path: FileCheckpointStorage::new(dst).version_file() });
    }
    let storage = FileCheckpointStorage::new(staged.staging());
    storage.prepare()?;
    storage.save_config(config.text())?;
    if version > 1 {
        storage.save_version(version - 1)?;
    }
    let mut commit = storage.begin_commit_unlocked()?;
    for planned in &partitions {
        commit.partition(&planned.entity, planned.partition, planned.make()?)?;
    }
    if let Some(m) = model {
        commit.model(m);
    }
    // A new directory: there is no older version to carry over or preserve.
    let options = WriteOptions { carry_over: false, preserve_old: false, config: None, ..options.clone() };
    commit.finish(&options)?;
    // The checksum manifest (libhdf5 writes by path: each file is read back once).
    let listing = std::fs::read_dir(staged.staging()).map_err(|e| Error::io(staged.staging(), e))?;
    for entry in listing {
        let entry = entry.map_err(|e| Error::io(staged.staging(), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().is_ok_and(|t| t.is_file()) && crate::commit::in_manifest(&name) {
            staged.record_file(&name).map_err(commit_error)?;
        }
    }
    staged.commit(&SingleProcess, Ok(()), |_| Ok(())).map_err(commit_error)?;
    Ok(dropped)
}

/// [`save`] as one rank of a job (threads, processes under MPI, [`ckpt_collective::host_ranks`]), one call per
/// rank with the same `entries`: the files of the new version are dealt round robin, the `i`-th entity
/// partition file (in the config's entity order, partitions in order) to rank `i % world_size`, which alone
/// reads its rows from `entries` (a re-partitioned file reads only the source rows it holds) and writes it
/// into the staging directory beside `dst`; rank 0 also writes `config.json` and the model file, then, once
/// every rank's files are durable, the version file (the commit point, and a snapshot if `options` asks)
/// and commits the directory whole, with the checksum manifest. The files are [`save`]'s, byte for byte.
/// Every rank returns the same verdict: a failure on any rank is an error on every rank, none is left
/// waiting.
///
/// ```
/// # let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/fixtures/pbg/ckpt");
/// use ckpt_tensor::CheckpointRead;
/// use ckpt_collective::ThreadGroup;
/// use ckpt_pbg::{PbgReader, WriteOptions};
/// let src = PbgReader::open(&fixture).unwrap();
/// let entries: Vec<_> = src.entries().into_iter().map(|e| (e.name.clone(), src.value(&e.name).unwrap())).collect();
/// let dir = tempfile::tempdir().unwrap();
/// let (one, two) = (dir.path().join("one"), dir.path().join("two"));
/// ckpt_pbg::save(&entries, &one, &WriteOptions::default()).unwrap();
/// std::thread::scope(|s| {
///     for g in ThreadGroup::new(2) {
///         let (entries, two) = (&entries, &two);
///         s.spawn(move || ckpt_pbg::save_rank(entries, two, &WriteOptions::default(), &g).unwrap());
///     }
/// });
/// assert_eq!(PbgReader::open(&two).unwrap().partitions().len(), src.partitions().len());
/// for f in std::fs::read_dir(&one).unwrap() {
///     let name = f.unwrap().file_name();
///     assert_eq!(std::fs::read(one.join(&name)).unwrap(), std::fs::read(two.join(&name)).unwrap(), "{name:?}");
/// }
/// ```
///
/// # Errors
/// As [`save`]; on the other ranks `Error::Core` holding `ckpt_io::CommitError::RankFailed` naming the rank that
/// failed.
pub fn save_rank(
    entries: &[(String, Value)],
    dst: impl AsRef<Path>,
    options: &WriteOptions,
    group: &dyn Collective,
) -> Result<SaveReport> {
    let dst = dst.as_ref();
    let group: &dyn Collective = &group;
    let (rank, world) = (group.rank(), group.world_size());
    let planned = plan(entries, dst, options);
    let staged = DirCommit::begin(dst, group, &dir_options(options)).map_err(commit_error)?;
    let storage = FileCheckpointStorage::new(staged.staging());
    let mut report = None;
    let local = planned.and_then(|plan| {
        let Plan { config, version, partitions, model, dropped } = plan;
        let metadata = crate::commit::next_metadata(config.text(), version - 1);
        let with_metadata = |m: &mut crate::metadata::Metadata| {
            if let (true, Some(meta)) = (m.attrs.is_empty(), &metadata) {
                *m = meta.clone();
            }
        };
        if rank == 0 {
            // Under the commit's lock: another save may have committed.
            if FileCheckpointStorage::new(dst).version_file().exists() {
                return Err(Error::AlreadyExists { path: FileCheckpointStorage::new(dst).version_file() });
            }
            storage.prepare()?;
            storage.save_config(config.text())?;
            if version > 1 {
                storage.save_version(version - 1)?;
            }
        }
        for planned in partitions.iter().skip(rank).step_by(world.max(1)) {
            let mut part = planned.make()?;
            with_metadata(&mut part.metadata);
            let path = storage.write_entity_partition(version, &planned.entity, planned.partition, &part)?;
            record(&staged, &path)?;
        }
        if rank == 0 {
            if let Some(mut m) = model {
                with_metadata(&mut m.metadata);
                record(&staged, &storage.write_model(version, &m)?)?;
            }
            record(&staged, &storage.config_file())?;
        }
        crate::storage::dir_sync(storage.path())?;
        report = Some(dropped);
        Ok(version)
    });
    let own = match &local {
        Ok(_) => Ok(()),
        // As its message (a RankFailure): it crosses the process group as bytes (the other ranks report it as a
        // rank failure); this rank returns its own error, source intact.
        Err(e) => Err(ckpt_io::RankFailure::from(e)),
    };
    let mut failure = None;
    let committed = staged.commit(group, own, |c| {
        let finalize = || -> Result<()> {
            let storage = FileCheckpointStorage::new(c.staging());
            let version = *local
                .as_ref()
                .map_err(|_| Error::InvalidInput { what: "the save".into(), reason: "rank 0 failed".into() })?;
            match options.version_write {
                crate::commit::VersionWrite::Rename => storage.save_version(version)?,
                crate::commit::VersionWrite::InPlace => storage.save_version_in_place(version)?,
            }
            if let Some(epoch) = options.snapshot_epoch {
                crate::commit::snapshot_version(&storage, version, epoch)?;
            }
            Ok(())
        };
        finalize().map_err(|e| {
            // The commit's `Refused` takes text; the error itself, source intact, is kept in `failure` and returned.
            let reason = e.to_string();
            failure = Some(e);
            CommitError::Refused { path: c.target().to_path_buf(), reason }
        })
    });
    let version = local?;
    committed.map_err(|e| failure.unwrap_or_else(|| commit_error(e)))?;
    let dropped =
        report.ok_or_else(|| Error::InvalidInput { what: format!("version {version}"), reason: "no report".into() })?;
    Ok(self::report(entries, dropped, dst))
}

/// Records the checksums of the staged file at `path` for the manifest.
fn record(staged: &DirCommit, path: &Path) -> Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    staged.record_file(&name).map(|_| ()).map_err(commit_error)
}

/// The directory commit of a save: PBG's files owned, the checksum manifest written.
fn dir_options(options: &WriteOptions) -> DirOptions {
    DirOptions::default().with_durability(options.durability).with_layout(OBJECT_LAYOUT)
}

/// A save laid out: the config, the version, the entity partitions (not read yet), the model, what is left
/// out.
struct Plan {
    config: Config,
    version: u64,
    partitions: Vec<PlannedPartition>,
    model: Option<Model>,
    dropped: Vec<String>,
}

/// An entity partition of the new checkpoint: rows `rows` (start, count) of its source partitions
/// concatenated, and its optimizer state.
struct PlannedPartition {
    entity: String,
    partition: u32,
    embeddings: Vec<Tensor>,
    rows: (usize, usize),
    optimizer: Option<PlannedOptimizer>,
}

/// The `RowAdagrad` state of a planned partition.
enum PlannedOptimizer {
    /// A whole state dict the source kept.
    StateDict(Value),
    /// Rebuilt from the sums (the same rows of these tensors concatenated) and the learning rate.
    RowAdagrad(Vec<Tensor>, f64),
}

impl PlannedPartition {
    /// The partition, its rows read from the source: a view of the source tensor when it is one source
    /// partition whole, else only the rows it holds, copied.
    fn make(&self) -> Result<EntityPartition> {
        let (start, len) = self.rows;
        let mut part = EntityPartition::new(rows_of(&self.embeddings, start, len)?);
        part.optimizer = match &self.optimizer {
            None => None,
            Some(PlannedOptimizer::StateDict(v)) => Some(OptimizerState::encode(&StateDict::from_value(v.clone())?)?),
            Some(PlannedOptimizer::RowAdagrad(sums, lr)) => {
                Some(OptimizerState::encode(&StateDict::row_adagrad(rows_of(sums, start, len)?, *lr))?)
            }
        };
        Ok(part)
    }
}

/// Rows `[start, start + len)` of `tensors` concatenated on dimension 0: the tensor itself when it is one
/// tensor whole, else those rows alone, copied into one contiguous tensor.
fn rows_of(tensors: &[Tensor], start: usize, len: usize) -> Result<Tensor> {
    if let [only] = tensors {
        if start == 0 && only.shape().first() == Some(&len) {
            return Ok(only.clone());
        }
    }
    let Some(first) = tensors.first() else {
        return Err(Error::InvalidInput { what: "embeddings".into(), reason: "concatenating no tensors".into() });
    };
    let mut shape = first.shape().to_vec();
    let mut bytes = Vec::new();
    let mut offset = 0;
    for t in tensors {
        let n = t.shape().first().copied().unwrap_or(0);
        let (from, to) = (start.max(offset), (start + len).min(offset + n));
        if from < to {
            bytes.extend_from_slice(&rows(t, from - offset, to - from)?.data()?);
        }
        offset += n;
    }
    if offset < start + len {
        return Err(Error::InvalidInput {
            what: "embeddings".into(),
            reason: format!("rows {start}..{} of {offset} rows", start + len),
        });
    }
    if let Some(d0) = shape.first_mut() {
        *d0 = len;
    }
    Ok(Tensor::from_buffer(first.dtype(), &shape, ckpt_tensor::Buffer::from_vec(bytes))?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn dotted_keys_rebuild_an_optimizer_state_dict() {
        let sum = Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let leaves = vec![
            ("state.0.step".to_owned(), Value::Int(3)),
            ("state.0.sum".to_owned(), Value::Tensor(sum.clone())),
            ("param_groups.0.lr".to_owned(), Value::Float(0.1)),
            ("param_groups.0.params.0".to_owned(), Value::Int(0)),
            ("param_groups.0.params.1".to_owned(), Value::Int(1)),
        ];
        let v = rebuild_state_dict(&leaves).unwrap();
        let sd = StateDict::from_value(v.clone()).unwrap();
        assert_eq!(sd.sum(0), Some(&sum));
        assert_eq!(sd.lr(0), Some(0.1));
        let group = &v.as_dict().unwrap().get("param_groups").unwrap().as_sequence().unwrap()[0];
        assert_eq!(group.as_dict().unwrap().get("params"), Some(&Value::List(vec![Value::Int(0), Value::Int(1)])));
        // Without param_groups: not a state dict on its own.
        assert!(rebuild_state_dict(&leaves[..2]).is_none());
    }

    #[test]
    fn model_adagrad_has_torch_2_13_param_group() {
        let t = Tensor::from_slice(&[0.0f32], &[1]).unwrap();
        let leaves = vec![
            ("state.1.sum".to_owned(), Value::Tensor(t.clone())),
            ("state.0.sum".to_owned(), Value::Tensor(t.clone())),
        ];
        let sd = StateDict::from_value(model_adagrad(&leaves, 0.5).unwrap()).unwrap();
        assert_eq!(sd.lr(0), Some(0.5));
        let v = sd.value().as_dict().unwrap();
        let group = v.get("param_groups").unwrap().as_sequence().unwrap()[0].as_dict().unwrap();
        assert_eq!(group.get("params"), Some(&Value::List(vec![Value::Int(0), Value::Int(1)])));
        assert_eq!(group.get("eps"), Some(&Value::Float(1e-10)));
    }

    /// A partition's rows come from the source partitions they lie in, and only those are copied; a whole
    /// source partition is the source tensor itself (a view, nothing read).
    #[test]
    fn rows_of_takes_only_the_rows_asked() {
        let a = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2]).unwrap();
        let b = Tensor::from_slice(&[6.0f32, 7.0, 8.0, 9.0], &[2, 2]).unwrap();
        let both = [a.clone(), b.clone()];
        assert_eq!(rows_of(&both, 2, 2).unwrap().to_vec::<f32>().unwrap(), [4.0, 5.0, 6.0, 7.0]);
        assert_eq!(rows_of(&both, 3, 2).unwrap().to_vec::<f32>().unwrap(), [6.0, 7.0, 8.0, 9.0]);
        assert_eq!(rows_of(&both, 1, 0).unwrap().shape(), [0, 2]);
        let whole = rows_of(std::slice::from_ref(&a), 0, 3).unwrap();
        assert_eq!(whole.storage().storage_id(), a.storage().storage_id());
        assert!(rows_of(&both, 4, 2).is_err());
        assert!(rows_of(&[], 0, 0).is_err());
        assert!(check_concat(&[a, Tensor::from_slice(&[1.0f32; 3], &[1, 3]).unwrap()]).is_err());
    }

    #[test]
    fn ranges_cut_like_gen_slice() {
        assert_eq!(ranges(5, 2), [(0, 3), (3, 2)]);
        assert_eq!(ranges(2, 3), [(0, 1), (1, 1), (2, 0)]);
        assert_eq!(pbg_name("model.embeddings/user/0"), "embeddings/user/0");
        assert_eq!(pbg_name("model.w"), "model.w");
        assert_eq!(entity_partition("user/3/state.0.sum"), Some(("user", 3, Some("state.0.sum"))));
        assert_eq!(entity_partition("user/x"), None);
    }
}
