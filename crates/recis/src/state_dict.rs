//! A state dict laid out as RecIS lays out a checkpoint directory, for [`save`]:
//!
//! * a *RecIS-shaped* mapping (every top-level key one of `sparse`, `model`, `extra`, `io_state_<s>`: how a
//!   RecIS checkpoint reads as one nested state dict): `sparse` is the serializer's part, `model` goes to
//!   `model.pt`, `extra` to `extra.pt`, and the io states are left out (they belong to the workers that
//!   wrote them);
//! * any other mapping: top-level tensors named `<table>@<slot>`, and the scalar state of RecIS's sparse
//!   optimizers (`sparse_adamw_step`, `sparse_adam_beta1`, ...), are the serializer's part; then, when the
//!   mapping has a `model` mapping (the usual `{"model": ..., "optimizer": ..., "epoch": ...}`), `model` goes
//!   to `model.pt` and every other item to `extra.pt`, else the whole mapping is the model state dict
//!   (`model.pt`).
//!
//! In the serializer's part, `<table>@id` (1-D int64 ids) and the `<table>@<slot>` tensors with one row per
//! id form hash table `<table>`; every other tensor is a dense block. Tables are split over
//! [`WriteOptions::shards`] shards by RecIS's loader rule ([`write_sharded`]) in id slices of
//! [`WriteOptions::slice_size`], each shard writing [`WriteOptions::parallel`] data files.

use std::path::Path;

use ckpt_collective::Collective;
use ckpt_io::DirCommit;
use ckpt_io::SaveReport;
use ckpt_tensor::{Dict, DictKind, Tensor, Value};

use crate::dense::{EXTRA_FILE, MODEL_FILE, write_torch_to};
use crate::error::{Error, Result};
use crate::name::Shard;
use crate::reshard::{ReshardOptions, write_shard_to, write_sharded_to};
use crate::table::{Slot, TableChild};
use crate::writer::{Target, WriteOptions, commit_local, commit_shards, from_commit, is_checkpoint_file};

/// Tensors by name.
type Named = Vec<(String, Tensor)>;

/// The top-level keys of a RecIS-shaped state dict.
fn recis_key(key: &str) -> bool {
    matches!(key, "sparse" | "model" | "extra")
        || key.strip_prefix("io_state_").is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `name` is the scalar state of one of RecIS's sparse optimizers (`sparse_adamw_step`,
/// `sparse_adam_beta1`, ...), which RecIS saves as dense blocks of the serializer (specs/recis.md §11).
fn sparse_optimizer_state(name: &str) -> bool {
    ["sparse_adamw_", "sparse_adam_", "sparse_adagrad_", "sparse_row_wise_adagrad_"].iter().any(|p| name.starts_with(p))
}

/// A RecIS checkpoint's parts, taken from a source.
#[derive(Default)]
struct Parts {
    /// The serializer's tensors, by RecIS name.
    sparse: Named,
    model: Option<Value>,
    extra: Option<Value>,
    /// Top-level keys of the source left out (io states).
    dropped_keys: Vec<String>,
}

fn unsupported(reason: String) -> Error {
    Error::StateDict { reason }
}

fn split(top: &Dict) -> Result<Parts> {
    let mut parts = Parts::default();
    let keys: Vec<Option<&str>> = top.items.iter().map(|(k, _)| k.as_str()).collect();
    let shaped = !top.items.is_empty()
        && keys.iter().all(|k| k.is_some_and(recis_key))
        && keys.iter().any(|k| matches!(k, Some("sparse" | "model")));
    if shaped {
        for (k, v) in &top.items {
            match k.as_str().unwrap_or_default() {
                "sparse" => {
                    let d = v.as_dict().ok_or_else(|| {
                        unsupported(format!("`sparse` must map RecIS tensor names to tensors, got {}", v.type_name()))
                    })?;
                    for (name, t) in &d.items {
                        let (Some(name), Some(t)) = (name.as_str(), t.as_tensor()) else {
                            return Err(unsupported(format!(
                                "`sparse` must map RecIS tensor names to tensors; item {name:?} is a {}",
                                t.type_name()
                            )));
                        };
                        parts.sparse.push((name.to_owned(), t.clone()));
                    }
                }
                "model" => parts.model = Some(v.clone()),
                "extra" => parts.extra = Some(v.clone()),
                other => parts.dropped_keys.push(other.to_owned()),
            }
        }
        return Ok(parts);
    }
    let mut rest = Dict::new(top.kind);
    for (k, v) in &top.items {
        match (k.as_str(), v.as_tensor()) {
            (Some(name), Some(t)) if name.contains('@') || sparse_optimizer_state(name) => {
                parts.sparse.push((name.to_owned(), t.clone()));
            }
            _ => rest.items.push((k.clone(), v.clone())),
        }
    }
    match rest.get("model") {
        Some(Value::Dict(model)) => {
            parts.model = Some(Value::Dict(model.clone()));
            let mut extra = Dict::new(DictKind::Dict);
            extra.items = rest.items.into_iter().filter(|(k, _)| k.as_str() != Some("model")).collect();
            if !extra.items.is_empty() {
                parts.extra = Some(Value::Dict(extra));
            }
        }
        _ if !rest.items.is_empty() => parts.model = Some(Value::Dict(rest)),
        _ => {}
    }
    Ok(parts)
}

/// The hash tables (children in order of their `@id` tensors) and dense blocks of the serializer's part.
fn tables(sparse: &[(String, Tensor)]) -> Result<(Vec<TableChild>, Named)> {
    let mut children: Vec<(String, Tensor, Vec<Slot>)> = Vec::new();
    for (name, t) in sparse {
        if let Some(child) = name.strip_suffix("@id").filter(|c| !c.contains('@')) {
            children.push((child.to_owned(), t.clone(), Vec::new()));
        }
    }
    let mut dense = Vec::new();
    for (name, t) in sparse {
        let Some((child, slot)) = name.split_once('@') else {
            dense.push((name.clone(), t.clone()));
            continue;
        };
        if slot == "id" {
            continue;
        }
        let Some((_, _, slots)) = children.iter_mut().find(|(c, _, _)| c == child) else {
            return Err(unsupported(format!(
                "{name:?} is a slot of hash table {child:?}, but the source has no ids `{child}@id` for it"
            )));
        };
        let recis = |e: Error| unsupported(format!("{name:?}: {e}"));
        slots.push(Slot::new(slot, t.clone()).map_err(recis)?);
    }
    let children = children
        .into_iter()
        .map(|(child, ids, mut slots)| {
            // RecIS's slot order: `embedding` first (a safetensors source lists names sorted).
            slots.sort_by_key(|s| s.name() != "embedding");
            TableChild::from_tensors(child.clone(), ids, slots)
                .map_err(|e| unsupported(format!("hash table {child:?}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((children, dense))
}

/// Writes `state_dict` (a mapping) as the RecIS checkpoint directory `dir` (the module documentation has the
/// rules): `model.pt` and `extra.pt`, then the serializer's part of [`WriteOptions::world_size`](crate::WriteOptions::world_size) shards, whose
/// `index`, written last and even when it holds nothing, is what marks the directory as a complete RecIS
/// checkpoint (as RecIS's saver does). The directory is committed whole (staged beside `dir`, swapped in;
/// files of an existing `dir` that are not RecIS's are carried over), with `ckpt.checksums.json`.
///
/// ```
/// use ckpt_tensor::{Tensor, Value};
/// use ckpt_tensor::CheckpointRead;
/// # let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/fixtures/recis/golden/two_shard_adamw");
/// let dir = tempfile::tempdir().unwrap();
/// let ids = Tensor::from_slice(&[3i64, 70_000, -5], &[3]).unwrap();
/// let emb = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2]).unwrap();
/// let w = Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
/// let sd = Value::dict([
///     ("tbl@id", Value::Tensor(ids)),
///     ("tbl@embedding", Value::Tensor(emb)),
///     ("dense.w", Value::Tensor(w.clone())),
/// ]);
/// ckpt_recis::save(&sd, dir.path(), &ckpt_recis::WriteOptions::default().with_world_size(2)).unwrap();
/// let ck = ckpt_recis::RecisReader::open(dir.path()).unwrap();
/// assert_eq!(ck.sparse().shard_num(), Some(2));
/// assert_eq!(ck.sparse().child("tbl").unwrap().len(), 3);
/// assert_eq!(ck.tensor("dense.w").unwrap(), w); // model.pt
/// ```
///
/// # Errors
/// [`Error::StateDict`] when `state_dict` is not a mapping or its tables are inconsistent (slots without
/// ids, row counts that differ from the ids', ids that are not 1-D int64); [`Error::ZeroShards`] for 0
/// shards; the writers' errors.
pub fn save(state_dict: &Value, dir: impl AsRef<Path>, options: &WriteOptions) -> Result<SaveReport> {
    let dir = dir.as_ref();
    let top = state_dict.as_dict().ok_or_else(|| {
        unsupported(format!("RecIS checkpoints hold a mapping; the top level is a {}", state_dict.type_name()))
    })?;
    let parts = split(top)?;
    let (children, dense) = tables(&parts.sparse)?;
    if options.world_size == 0 {
        return Err(Error::ZeroShards { action: "writing" });
    }
    // One directory commit: staged beside `dir`, swapped in whole.
    let tables: Vec<(TableChild, u32)> = children.into_iter().map(|c| (c, options.slice_size)).collect();
    let reshard = ReshardOptions::default().with_write(options.clone());
    commit_local(dir, options, is_checkpoint_file, |target| {
        if let Some(model) = &parts.model {
            write_torch_to(target, MODEL_FILE, model)?;
        }
        if let Some(extra) = &parts.extra {
            write_torch_to(target, EXTRA_FILE, extra)?;
        }
        // The serializer's part last, and even when it holds nothing, as RecIS's saver does: its `index`,
        // written after everything else, is what marks the directory as a complete RecIS checkpoint.
        write_sharded_to(target, &tables, &dense, options.world_size, &reshard)
    })?;
    Ok(report(top, dir, parts.dropped_keys))
}

/// The report of a save of the mapping `top` in `dir` that left out the keys `dropped`: the committed
/// checkpoint's files, and the tensors and values of the keys written.
fn report(top: &Dict, dir: &Path, dropped: Vec<String>) -> SaveReport {
    let mut report = SaveReport::default();
    for (k, v) in &top.items {
        if !k.as_str().is_some_and(|k| dropped.iter().any(|d| d == k)) {
            report.count(v);
        }
    }
    report.dropped = dropped;
    report.with_files(ckpt_io::owned_files(dir, is_checkpoint_file))
}

/// [`save`] as one rank of a job of `collective.world_size()` ranks (the shard count; [`WriteOptions::world_size`](crate::WriteOptions::world_size)
/// is ignored), one call per rank with the same `state_dict` (threads, processes under MPI,
/// [`ckpt_collective::host_ranks`]): rank `r` writes shard `r`'s data files (of every table the ids of its slice,
/// whose rows alone it reads and copies) into the staging directory beside `dir`; rank 0 also writes
/// `model.pt`, `extra.pt` and the dense blocks, then, once every rank's files are durable, merges every
/// shard's metadata into `index` (last), `tensorkey.json` and the torch-rank JSON and commits the directory
/// whole. The files are those of [`save`] with as many shards, byte for byte. Every rank returns the same
/// verdict: a failure on any rank is an error on every rank, none is left waiting.
///
/// ```
/// use ckpt_tensor::{Tensor, Value};
/// use ckpt_collective::ThreadGroup;
/// let dir = tempfile::tempdir().unwrap();
/// let ids = Tensor::from_slice(&[3i64, 70_000, -5], &[3]).unwrap();
/// let emb = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2]).unwrap();
/// let sd = Value::dict([("tbl@id", Value::Tensor(ids)), ("tbl@embedding", Value::Tensor(emb))]);
/// let (one, two) = (dir.path().join("one"), dir.path().join("two"));
/// let options = ckpt_recis::WriteOptions::default().with_world_size(2);
/// ckpt_recis::save(&sd, &one, &options).unwrap();
/// std::thread::scope(|s| {
///     for g in ThreadGroup::new(2) {
///         let (sd, two, options) = (&sd, &two, &options);
///         s.spawn(move || ckpt_recis::save_rank(sd, two, options, &g).unwrap());
///     }
/// });
/// let ck = ckpt_recis::RecisReader::open(&two).unwrap();
/// assert_eq!(ck.sparse().shard_num(), Some(2));
/// assert_eq!(ck.sparse().child("tbl").unwrap().len(), 3);
/// for f in std::fs::read_dir(&one).unwrap() {
///     let name = f.unwrap().file_name();
///     assert_eq!(std::fs::read(one.join(&name)).unwrap(), std::fs::read(two.join(&name)).unwrap(), "{name:?}");
/// }
/// ```
///
/// # Errors
/// As [`save`]; [`Error::ShardFailed`] naming the rank that failed on the others.
pub fn save_rank(
    state_dict: &Value,
    dir: impl AsRef<Path>,
    options: &WriteOptions,
    group: &dyn Collective,
) -> Result<SaveReport> {
    let dir = dir.as_ref();
    let group: &dyn Collective = &group;
    let rank = group.rank();
    let planned = state_dict
        .as_dict()
        .ok_or_else(|| {
            unsupported(format!("RecIS checkpoints hold a mapping; the top level is a {}", state_dict.type_name()))
        })
        .and_then(split)
        .and_then(|parts| {
            let (children, dense) = tables(&parts.sparse)?;
            Ok((parts, children, dense))
        });
    let commit = DirCommit::begin(dir, group, &options.dir_options(is_checkpoint_file)).map_err(from_commit)?;
    let target = Target::Staged(&commit);
    let mut dropped = Vec::new();
    let local = planned.and_then(|(parts, children, dense)| {
        dropped = parts.dropped_keys;
        let shard = Shard::new(rank, group.world_size())?;
        if rank == 0 {
            if let Some(model) = &parts.model {
                write_torch_to(target, MODEL_FILE, model)?;
            }
            if let Some(extra) = &parts.extra {
                write_torch_to(target, EXTRA_FILE, extra)?;
            }
        }
        let tables: Vec<(TableChild, u32)> = children.into_iter().map(|c| (c, options.slice_size)).collect();
        let reshard = ReshardOptions::default().with_write(options.clone());
        write_shard_to(target, &tables, &dense, shard, &reshard)
    });
    commit_shards(commit, group, local, options)?;
    let empty = Dict::new(DictKind::Dict);
    Ok(report(state_dict.as_dict().unwrap_or(&empty), dir, dropped))
}
