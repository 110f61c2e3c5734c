//! Writing a source as a RecIS checkpoint directory.
//!
//! The source's top-level mapping is laid out as RecIS lays out a checkpoint:
//!
//! * a *RecIS-shaped* source (every top-level key one of `sparse`, `model`, `extra`, `io_state_<s>`, as
//!   [`super::super::source`] reads a RecIS checkpoint, and as a torch file or safetensors file converted
//!   from one holds it): `sparse` is the serializer's part, `model` goes to `model.pt`, `extra` to
//!   `extra.pt`;
//! * any other mapping: top-level tensors named `<table>@<slot>`, and the scalar state of RecIS's sparse
//!   optimizers (`sparse_adamw_step`, `sparse_adam_beta1`, ...), are the serializer's part; then, when the
//!   mapping has a `model` mapping (the usual `{"model": ..., "optimizer": ..., "epoch": ...}`), `model` goes
//!   to `model.pt` and every other item to `extra.pt`, else the whole mapping is the model state dict
//!   (`model.pt`).
//!
//! In the serializer's part, `<table>@id` (1-D int64 ids) and the `<table>@<slot>` tensors with one row per
//! id form hash table `<table>`; every other tensor is a dense block. Tables are split over
//! [`ConvertOptions::world_size`] shards by RecIS's loader rule ([`ckpt_recis::write_sharded`]) in ids
//! slices of [`ConvertOptions::recis_slice_size`], each shard writing
//! [`ConvertOptions::recis_parallel`] data files. Io states belong to the workers that wrote them and are
//! listed as dropped.

use std::path::Path;

use ckpt_core::{Dict, DictKind, PathItem, Tensor, Value};
use ckpt_recis::{DEFAULT_SLICE_SIZE, ReshardOptions, Slot, TableChild, WriteOptions};

use super::super::source::{self, Leaf};
use super::super::{ConvertOptions, ConvertSummary};
use super::{count, top_mapping};
use crate::error::At;
use crate::{Error, Format, Result};

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

fn unsupported(from: Format, reason: String) -> Error {
    Error::UnsupportedConversion { from, to: Format::Recis, reason }
}

fn split(top: &Dict, from: Format) -> Result<Parts> {
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
                        unsupported(
                            from,
                            format!("`sparse` must map RecIS tensor names to tensors, got {}", v.type_name()),
                        )
                    })?;
                    for (name, t) in &d.items {
                        let (Some(name), Some(t)) = (name.as_str(), t.as_tensor()) else {
                            return Err(unsupported(
                                from,
                                format!(
                                    "`sparse` must map RecIS tensor names to tensors; item {name:?} is a {}",
                                    t.type_name()
                                ),
                            ));
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
fn tables(sparse: &[(String, Tensor)], from: Format) -> Result<(Vec<TableChild>, Named)> {
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
            return Err(unsupported(
                from,
                format!("{name:?} is a slot of hash table {child:?}, but the source has no ids `{child}@id` for it"),
            ));
        };
        let recis = |e: ckpt_recis::Error| unsupported(from, format!("{name:?}: {e}"));
        slots.push(Slot::new(slot, t.clone()).map_err(recis)?);
    }
    let children = children
        .into_iter()
        .map(|(child, ids, mut slots)| {
            // RecIS's slot order: `embedding` first (a safetensors source lists names sorted).
            slots.sort_by_key(|s| s.name() != "embedding");
            TableChild::from_tensors(child.clone(), ids, slots)
                .map_err(|e| unsupported(from, format!("hash table {child:?}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((children, dense))
}

pub(super) fn write(src: &Path, from: Format, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
    if from == Format::Recis && options.recis_slice_size.is_none() {
        // Re-sharded from the files themselves, without reading the content into a state dict.
        return reshard(src, dst, options);
    }
    let content = &source::read(src, from)?;
    let top = top_mapping(content, from, Format::Recis)?;
    let parts = split(top, from)?;
    let (children, dense) = tables(&parts.sparse, from)?;
    std::fs::create_dir_all(dst).at(dst)?;
    if let Some(model) = &parts.model {
        ckpt_recis::write_model(dst, model).at(dst)?;
    }
    if let Some(extra) = &parts.extra {
        ckpt_recis::write_extra(dst, extra).at(dst)?;
    }
    // The serializer's part last, and even when it holds nothing, as RecIS's saver does: its `index`, written
    // after everything else, is what marks the directory as a complete RecIS checkpoint.
    let size = options.recis_slice_size.unwrap_or(DEFAULT_SLICE_SIZE);
    let tables: Vec<(TableChild, u32)> = children.into_iter().map(|c| (c, size)).collect();
    let save =
        WriteOptions::default().with_parallel(options.recis_parallel.unwrap_or(WriteOptions::default().parallel));
    let reshard = ReshardOptions::default().with_write(save);
    ckpt_recis::write_sharded(dst, &tables, &dense, options.world_size, &reshard).at(dst)?;
    let dropped_top = |l: &Leaf| matches!(l.path.first(), Some(PathItem::Key(k)) if parts.dropped_keys.contains(k));
    let (lost, kept): (Vec<&Leaf>, Vec<&Leaf>) = content.leaves.iter().partition(|l| dropped_top(l));
    let mut s = count(kept);
    s.dropped = lost.into_iter().map(|l| l.name.clone()).collect();
    Ok(s)
}

/// RecIS to RecIS: the sparse part re-sharded with each table's own `slice_size`, `model.pt` and `extra.pt`
/// copied ([`ckpt_recis::reshard`]).
fn reshard(src: &Path, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
    // A `checkpoint` list: the latest checkpoint, as RecIS's manager loads it.
    let dir = if src.join("checkpoint").is_file() && !src.join("index").is_file() {
        let manager = ckpt_recis::CheckpointManager::new(src);
        let id = manager
            .latest()
            .at(src)?
            .ok_or_else(|| ckpt_recis::Error::NoCheckpoint { path: src.join("checkpoint") })
            .at(src)?;
        manager.path_of(&id).at(src)?
    } else {
        src.to_path_buf()
    };
    let before = crate::open_as(&dir, Format::Recis)?;
    let parallel = match options.recis_parallel {
        Some(p) => p,
        None => before
            .downcast_ref::<ckpt_recis::RecisReader>()
            .and_then(|c| c.sparse().parallel())
            .unwrap_or(WriteOptions::default().parallel),
    };
    let reshard = ReshardOptions::default().with_write(WriteOptions::default().with_parallel(parallel));
    ckpt_recis::reshard(&dir, dst, options.world_size, &reshard).at(dst)?;
    let kept = crate::open_as(dst, Format::Recis)?.entries();
    let mut s = ConvertSummary::default();
    for e in &kept {
        match e.tensor_info() {
            Some(t) => {
                s.tensors += 1;
                s.bytes += t.nbytes() as u64;
            }
            None => s.values += 1,
        }
    }
    s.dropped =
        before.entries().into_iter().filter(|e| !kept.iter().any(|k| k.name == e.name)).map(|e| e.name).collect();
    Ok(s)
}
