//! A source checkpoint as leaves (entry name, path, value) and, where the format has one, its nested tree.

use std::path::Path;

use ckpt_core::{PathItem, Value, unflatten};

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

/// `__metadata__` key of safetensors files that records each tensor's path.
#[cfg(feature = "safetensors")]
pub(crate) const PATHS_KEY: &str = "ckpt.paths";

fn core_err(path: &Path) -> impl Fn(ckpt_core::Error) -> Error + '_ {
    move |source| Error::Core { path: path.to_path_buf(), source }
}

/// Leaves of every value in `tree` (each mapping, list and tuple descended into), as torch and hfai name
/// their entries.
fn tree_leaves(tree: &Value, path: &Path) -> Result<Vec<Leaf>> {
    Ok(ckpt_core::leaves(tree)
        .map_err(core_err(path))?
        .into_iter()
        .map(|l| Leaf { name: l.key, path: l.path, value: l.value.clone() })
        .collect())
}

/// Reads the content of `src` as format `from`.
pub(crate) fn read(src: &Path, from: Format) -> Result<Content> {
    match from {
        #[cfg(feature = "torch")]
        Format::Torch => {
            let tree = ckpt_torch::TorchFile::open(src)?.into_value();
            Ok(Content { leaves: tree_leaves(&tree, src)?, tree })
        }
        #[cfg(feature = "hfai")]
        Format::Hfai => {
            let tree = ckpt_hfai::load(src)
                .map_err(|source| Error::Hfai { path: src.to_path_buf(), source: Box::new(source) })?;
            Ok(Content { leaves: tree_leaves(&tree, src)?, tree })
        }
        #[cfg(feature = "distcp")]
        Format::Distcp => {
            let err = |source| Error::Distcp { path: src.to_path_buf(), source: Box::new(source) };
            let reader = ckpt_distcp::DcpReader::open(src).map_err(err)?;
            let keys: Vec<String> = reader.keys().map(str::to_owned).collect();
            let mut leaves = Vec::with_capacity(keys.len());
            for name in keys {
                let value = reader.read_value(&name).map_err(err)?;
                leaves.push(Leaf { path: reader.path_of(&name), name, value });
            }
            Ok(Content { tree: rebuild(&leaves, src)?, leaves })
        }
        #[cfg(feature = "safetensors")]
        Format::Safetensors => {
            let file = ckpt_core::safetensors::read_file(src).map_err(core_err(src))?;
            let paths = file.metadata.as_ref().and_then(|m| m.get(PATHS_KEY)).and_then(|p| parse_paths(p));
            let leaves: Vec<Leaf> = file
                .tensors
                .into_iter()
                .map(|(name, t)| {
                    let path = paths
                        .as_ref()
                        .and_then(|p| p.get(&name).cloned())
                        .unwrap_or_else(|| vec![PathItem::Key(name.clone())]);
                    Leaf { name, path, value: Value::Tensor(t) }
                })
                .collect();
            Ok(Content { tree: rebuild(&leaves, src)?, leaves })
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
        Err(_) => unflatten(leaves.iter().map(|l| (vec![PathItem::Key(l.name.clone())], l.value.clone())))
            .map_err(core_err(_src))?,
    })
}

/// Parses `ckpt.paths` (`{"name": ["model", 0, "w"], ...}`); `None` when it is not that shape (a foreign
/// or damaged record is ignored, and the file converts flat).
#[cfg(feature = "safetensors")]
fn parse_paths(text: &str) -> Option<std::collections::HashMap<String, Vec<PathItem>>> {
    let json: serde_json::Value = serde_json::from_str(text).ok()?;
    let mut out = std::collections::HashMap::new();
    for (name, steps) in json.as_object()? {
        let steps = steps.as_array()?;
        let mut path = Vec::with_capacity(steps.len());
        for s in steps {
            path.push(match s {
                serde_json::Value::String(k) => PathItem::Key(k.clone()),
                serde_json::Value::Number(n) => PathItem::Index(usize::try_from(n.as_u64()?).ok()?),
                _ => return None,
            });
        }
        if path.is_empty() {
            return None;
        }
        out.insert(name.clone(), path);
    }
    Some(out)
}

/// The `ckpt.paths` record of `leaves`, or `None` when every path is just the name (nothing to record).
#[cfg(feature = "safetensors")]
pub(crate) fn paths_record(leaves: &[&Leaf]) -> Option<String> {
    if leaves.iter().all(|l| matches!(l.path.as_slice(), [PathItem::Key(k)] if *k == l.name)) {
        return None;
    }
    let map: serde_json::Map<String, serde_json::Value> = leaves
        .iter()
        .map(|l| {
            let steps = l
                .path
                .iter()
                .map(|p| match p {
                    PathItem::Key(k) => serde_json::Value::String(k.clone()),
                    PathItem::Index(i) => serde_json::Value::from(*i),
                })
                .collect();
            (l.name.clone(), serde_json::Value::Array(steps))
        })
        .collect();
    Some(serde_json::Value::Object(map).to_string())
}
