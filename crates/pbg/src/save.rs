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

use ckpt_core::{Dict, DictKind, Tensor, Value};

use crate::commit::WriteOptions;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::model::{Model, ModelParameter, public_to_private};
use crate::names::CONFIG_FILE;
use crate::optimizer::{OptimizerState, StateDict};
use crate::partition::EntityPartition;
use crate::storage::FileCheckpointStorage;

/// What [`save`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SaveReport {
    /// The version committed (the `version` entry, default 1).
    pub version: u64,
    /// The names of the entries left out: not PBG names, or not of the kind their name needs.
    pub dropped: Vec<String>,
}

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

/// `tensors` concatenated on dimension 0 (all of one dtype and row shape).
fn concat(tensors: &[&Tensor]) -> Result<Tensor> {
    let Some(first) = tensors.first() else {
        return Err(Error::InvalidInput { what: "embeddings".into(), reason: "concatenating no tensors".into() });
    };
    let mut shape = first.shape().to_vec();
    let mut bytes = Vec::new();
    let mut n = 0;
    for t in tensors {
        if t.dtype() != first.dtype() || t.shape().get(1..) != first.shape().get(1..) {
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
        n += t.shape().first().copied().unwrap_or(0);
        bytes.extend_from_slice(&t.data()?);
    }
    if let Some(d0) = shape.first_mut() {
        *d0 = n;
    }
    Ok(Tensor::from_buffer(first.dtype(), &shape, ckpt_core::Buffer::from_vec(bytes))?)
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

/// Writes a new PBG checkpoint in `dst` (which must not hold one) from `entries` named as [`PbgReader`](crate::PbgReader) names
/// them (the module documentation has the table), in the config's layout, re-partitioning entities whose
/// partition count differs and rebuilding optimizer state dicts of which only the tensors were kept. The
/// config is written first, then version `V` in one commit (`options`' snapshot and version-file choices
/// apply; there is no older version to carry over or preserve).
///
/// ```
/// # let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/fixtures/pbg/ckpt");
/// use ckpt_core::CheckpointRead;
/// use ckpt_pbg::{PbgReader, WriteOptions};
/// let src = PbgReader::open(fixture.as_ref()).unwrap();
/// // Every entry by name, as any other format keeps them; user_id re-partitioned from 2 partitions into 3.
/// let entries: Vec<_> = src.entries().into_iter().map(|e| (e.name.clone(), src.value(&e.name).unwrap())).collect();
/// let text = src.config().unwrap().text().replace("\"num_partitions\": 2", "\"num_partitions\": 3");
/// let options = WriteOptions::default().with_config(ckpt_pbg::Config::parse(&text).unwrap());
/// let dir = tempfile::tempdir().unwrap();
/// let report = ckpt_pbg::save(&entries, dir.path(), &options).unwrap();
/// assert_eq!((report.version, report.dropped.len()), (src.version(), 0));
/// let out = PbgReader::open(dir.path()).unwrap();
/// assert_eq!(out.partitions().iter().filter(|p| p.entity == "user_id").count(), 3);
/// ```
///
/// # Errors
/// [`Error::NoEmbeddings`] when no entry is an entity partition or a model parameter; [`Error::NoConfig`]
/// without a config; [`Error::LayoutMismatch`] when the entries do not fit the config's layout;
/// [`Error::AlreadyExists`] when `dst` holds a checkpoint (its version file); the storage's errors.
pub fn save(entries: &[(String, Value)], dst: &Path, options: &WriteOptions) -> Result<SaveReport> {
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

    // Entity partitions in the config's layout.
    let mut partitions: Vec<(String, u32, EntityPartition)> = Vec::new();
    for e in config.entities() {
        let Some(parts) = source.embeddings.get(&e.name) else {
            return Err(layout(format!("the entries have no embeddings of entity type {:?}", e.name)));
        };
        let dim = config.entity_dimension(&e.name);
        for (p, t) in parts {
            if t.dtype() != ckpt_core::DType::F32 || t.dim() != 2 || t.shape().get(1).map(|&d| d as u64) != Some(dim) {
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
                let mut part = EntityPartition::new(t.clone());
                if let Some(o) = opt(p) {
                    let state = match rebuild_state_dict(o) {
                        Some(v) => StateDict::from_value(v)?,
                        None => match leaf_tensor(o, "state.0.sum") {
                            Some(sum) => StateDict::row_adagrad(sum.clone(), lr_of(p)),
                            None => {
                                return Err(layout(format!(
                                    "optimizer/embeddings/{}/{p} has no `state.0.sum`",
                                    e.name
                                )));
                            }
                        },
                    };
                    part.optimizer = Some(OptimizerState::encode(&state)?);
                }
                partitions.push((e.name.clone(), p, part));
            }
        } else {
            let all: Vec<&Tensor> = parts.values().collect();
            let embeddings = concat(&all)?;
            let sums: Option<Vec<&Tensor>> =
                (0..src_count as u32).map(|p| opt(p).and_then(|o| leaf_tensor(o, "state.0.sum"))).collect();
            let sums = match sums {
                Some(s) => Some(concat(&s)?),
                None => None,
            };
            let n = embeddings.shape().first().copied().unwrap_or(0);
            for (p, (start, len)) in ranges(n, want).into_iter().enumerate() {
                let p = u32::try_from(p).map_err(|_| layout(format!("{want} partitions")))?;
                let mut part = EntityPartition::new(rows(&embeddings, start, len)?);
                if let Some(sum) = &sums {
                    let state = StateDict::row_adagrad(rows(sum, start, len)?, lr_of(0));
                    part.optimizer = Some(OptimizerState::encode(&state)?);
                }
                partitions.push((e.name.clone(), p, part));
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

    // Write: config first (the commit derives the files' metadata from it), then version V in one commit.
    let storage = FileCheckpointStorage::new(dst);
    if storage.version_file().exists() {
        return Err(Error::AlreadyExists { path: storage.version_file() });
    }
    storage.prepare()?;
    storage.save_config(config.text())?;
    let version = source.version.unwrap_or(1).max(1);
    if version > 1 {
        storage.save_version(version - 1)?;
    }
    let mut commit = storage.begin_commit()?;
    for (entity, p, part) in partitions {
        commit.partition(&entity, p, part)?;
    }
    if let Some(m) = model {
        commit.model(m);
    }
    // A new directory: there is no older version to carry over or preserve.
    let options = WriteOptions { carry_over: false, preserve_old: false, config: None, ..options.clone() };
    commit.finish(&options)?;

    Ok(SaveReport { version, dropped: source.dropped })
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
