//! A source checkpoint as leaves (entry name, path, value) and, where the format has one, its nested tree.

use std::path::Path;

use ckpt_core::{PathItem, Value, unflatten};

use crate::error::At;
use crate::{Error, Format, Result};

/// One entry of a source: its name (as [`crate::Checkpoint::entries`] names it), its path in the nested
/// state dict, and its value (tensors are views, usually of a memory map).
#[derive(Debug, Clone)]
pub(crate) struct Leaf {
    pub name: String,
    pub path: Vec<PathItem>,
    pub value: Value,
}

/// A source's content.
pub(crate) struct Content {
    /// The nested value the format holds (torch, hfai), or the state dict rebuilt from the leaves' paths.
    pub tree: Value,
    /// Every entry, in the source's order.
    pub leaves: Vec<Leaf>,
}

/// Leaves of every value in `tree` (each mapping, list and tuple descended into), as torch and hfai name
/// their entries.
fn tree_leaves(tree: &Value, path: &Path) -> Result<Vec<Leaf>> {
    Ok(ckpt_core::leaves(tree)
        .at(path)?
        .into_iter()
        .map(|l| Leaf { name: l.key, path: l.path, value: l.value.clone() })
        .collect())
}

/// Reads the content of `src` as format `from`.
pub(crate) fn read(src: &Path, from: Format) -> Result<Content> {
    match from {
        #[cfg(feature = "torch")]
        Format::Torch => {
            let tree = ckpt_torch::TorchReader::open(src).at(src)?.into_value();
            Ok(Content { leaves: tree_leaves(&tree, src)?, tree })
        }
        #[cfg(feature = "hfai")]
        Format::Hfai => {
            let tree = ckpt_hfai::load(src).at(src)?;
            Ok(Content { leaves: tree_leaves(&tree, src)?, tree })
        }
        #[cfg(feature = "distcp")]
        Format::Distcp => {
            let reader = ckpt_distcp::DcpReader::open(src).at(src)?;
            let keys: Vec<String> = reader.keys().map(str::to_owned).collect();
            let mut leaves = Vec::with_capacity(keys.len());
            for name in keys {
                let value = reader.read_value(&name).at(src)?;
                leaves.push(Leaf { path: reader.path_of(&name), name, value });
            }
            Ok(Content { tree: rebuild(&leaves, src)?, leaves })
        }
        #[cfg(feature = "safetensors")]
        Format::Safetensors => {
            let file = ckpt_core::safetensors::read_file(src).at(src)?;
            let records = crate::safetensors_records::Records::of(&file);
            let mut leaves: Vec<Leaf> = Vec::with_capacity(file.tensors.len() + records.values.len());
            for (name, t) in &file.tensors {
                leaves.push(Leaf { path: records.path_of(name), name: name.clone(), value: Value::Tensor(t.clone()) });
            }
            for (name, value) in &records.values {
                leaves.push(Leaf { path: records.path_of(name), name: name.clone(), value: value.clone() });
            }
            Ok(Content { tree: rebuild(&leaves, src)?, leaves })
        }
        #[cfg(feature = "recis")]
        Format::Recis => {
            let ck = crate::open_as(src, from)?;
            let recis = ck.downcast_ref::<ckpt_recis::RecisReader>().ok_or_else(|| Error::InvalidArgument {
                path: src.to_path_buf(),
                reason: "not a RecIS checkpoint directory".into(),
            })?;
            recis_content(recis, src)
        }
        _ => {
            // pbg, recis and any other reader: the generic interface, one leaf per entry.
            let ck = crate::open_as(src, from)?;
            let mut leaves = Vec::new();
            for e in ck.entries() {
                let value = match e.kind {
                    ckpt_core::EntryKind::Tensor(_) => Value::Tensor(ck.tensor(&e.name)?),
                    _ => ck.value(&e.name)?,
                };
                leaves.push(Leaf { path: vec![PathItem::Key(e.name.clone())], name: e.name, value });
            }
            Ok(Content { tree: rebuild(&leaves, src)?, leaves })
        }
    }
}

/// The nested state dict of `leaves` (DCP's `set_element`); a flat `dict` when the paths do not nest
/// consistently (a path crossing a leaf, a first step that is an index).
fn rebuild(leaves: &[Leaf], _src: &Path) -> Result<Value> {
    let nested = unflatten(leaves.iter().map(|l| (l.path.clone(), l.value.clone())));
    Ok(match nested {
        Ok(v) => v,
        Err(_) => unflatten(leaves.iter().map(|l| (vec![PathItem::Key(l.name.clone())], l.value.clone()))).at(_src)?,
    })
}

/// A RecIS checkpoint as a nested state dict: `{"sparse": {name: tensor}, "model": <model.pt>, "extra":
/// <extra.pt>, "io_state_<s>": <io_state_<s>.pt>}` (parts that are absent are left out). `sparse` holds the
/// serializer's tensors under RecIS's names (`tbl@id`, `tbl@embedding`, dense names). Leaf names are those
/// of [`ckpt_recis::Checkpoint`]'s entries.
#[cfg(feature = "recis")]
fn recis_content(ck: &ckpt_recis::RecisReader, src: &Path) -> Result<Content> {
    use ckpt_core::{Dict, DictKind};
    let sparse = ck.sparse();
    let mut tree = Dict::new(DictKind::Dict);
    let mut leaves = Vec::new();
    let names: Vec<String> = sparse.tensor_names().into_iter().map(str::to_owned).collect();
    if !names.is_empty() {
        let mut part = Dict::new(DictKind::Dict);
        for name in names {
            let value = Value::Tensor(sparse.read_tensor(&name).at(src)?);
            part.insert(name.clone(), value.clone());
            leaves.push(Leaf { path: vec![PathItem::Key("sparse".into()), PathItem::Key(name.clone())], name, value });
        }
        tree.insert("sparse", Value::Dict(part));
    }
    let mut parts: Vec<(String, String, &Value)> = Vec::new();
    if let Some(m) = ck.model() {
        parts.push(("model".into(), String::new(), m));
    }
    if let Some(e) = ck.extra() {
        parts.push(("extra".into(), "extra/".into(), e));
    }
    for (s, v) in ck.io_states() {
        parts.push((format!("io_state_{s}"), format!("io_state_{s}/"), v));
    }
    for (key, prefix, value) in parts {
        for l in ckpt_core::leaves(value).at(src)? {
            let mut path = vec![PathItem::Key(key.clone())];
            path.extend(l.path);
            leaves.push(Leaf { name: format!("{prefix}{}", l.key), path, value: l.value.clone() });
        }
        tree.insert(key, value.clone());
    }
    Ok(Content { tree: Value::Dict(tree), leaves })
}
