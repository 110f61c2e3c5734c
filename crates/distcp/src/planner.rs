//! Save planning, as torch's `DefaultSavePlanner` does it: each rank flattens its state dict into write
//! items (tensor chunks in global coordinates, and BYTE_IO objects); the coordinator's global plan
//! deduplicates items several ranks hold, numbers the chunks and builds `state_dict_metadata` and
//! `planner_data`; each rank then splits its items into data files.

use std::collections::{HashMap, HashSet};

use ckpt_tensor::{DType, PathItem, Tensor, Value, flatten};
use serde_json::{Value as Json, json};

use crate::chunks;
use crate::error::{Error, Result};
use crate::metadata::{
    ChunkStorageMetadata, Metadata, MetadataIndex, StorageMetadata, TensorProperties, TensorStorageMetadata,
};

/// Where a rank's local tensor sits in a bigger, sharded tensor (DTensor `Shard`, FSDP flat params,
/// ShardedTensor): the global shape and the offsets of the local tensor in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSpec {
    /// Shape of the whole tensor.
    pub global_shape: Vec<usize>,
    /// Offsets of this rank's local tensor in the whole tensor.
    pub offsets: Vec<usize>,
}

impl ShardSpec {
    /// The spec of the box `offsets` of a `global_shape` tensor.
    pub fn new(global_shape: &[usize], offsets: &[usize]) -> Self {
        ShardSpec { global_shape: global_shape.to_vec(), offsets: offsets.to_vec() }
    }
}

/// One write item of a rank: what the planner knows about it (shared with the other ranks).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ItemDesc {
    pub fqn: String,
    /// `Some` for a tensor chunk.
    pub tensor: Option<TensorDesc>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TensorDesc {
    pub offsets: Vec<usize>,
    pub sizes: Vec<usize>,
    pub size: Vec<usize>,
    pub dtype: DType,
    pub requires_grad: bool,
}

impl ItemDesc {
    /// torch's `MetadataIndex(fqn, offset)` identity.
    fn identity(&self) -> (String, Option<Vec<usize>>) {
        (self.fqn.clone(), self.tensor.as_ref().map(|t| t.offsets.clone()))
    }

    /// `WriteItem.tensor_storage_size()` (and `_item_size`): bytes of the whole tensor the item is a chunk of
    /// (torch uses `tensor_data.size`, the global shape), `None` for an object.
    pub(crate) fn storage_size(&self) -> Option<u64> {
        self.tensor.as_ref().map(|t| t.size.iter().fold(t.dtype.size() as u64, |a, &s| a.saturating_mul(s as u64)))
    }
}

/// A rank's local plan: its items (in flatten order) and its flatten mapping.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LocalPlan {
    pub items: Vec<ItemDesc>,
    pub planner_data: Vec<(String, Vec<PathItem>)>,
}

/// The data to write for a local item.
pub(crate) enum Payload<'a> {
    Tensor(&'a Tensor),
    Object(&'a Value),
}

/// Flattens a rank's state dict into its local plan and the payload of every item.
pub(crate) fn local_plan<'a>(
    state_dict: &'a Value,
    shards: &HashMap<String, ShardSpec>,
) -> Result<(LocalPlan, Vec<Payload<'a>>)> {
    let flat = flatten(state_dict)?;
    let mut items = Vec::with_capacity(flat.len());
    let mut payloads = Vec::with_capacity(flat.len());
    let mut planner_data = Vec::with_capacity(flat.len());
    let mut used = HashSet::new();
    for e in flat {
        planner_data.push((e.key.clone(), e.path.clone()));
        if e.value.is_tensor_like() {
            let t = e.value.as_tensor().ok_or_else(|| {
                Error::unwritable(&e.key, "sparse, quantized, nested and meta tensors cannot be saved by DCP")
            })?;
            if !t.dtype().in_torch() {
                return Err(Error::unwritable(
                    &e.key,
                    format!(
                        "torch has no dtype for {} (safetensors' {}): keep it in safetensors, or leave it out",
                        t.dtype(),
                        t.dtype().safetensors_code().unwrap_or("F6")
                    ),
                ));
            }
            let (size, offsets) = match shards.get(&e.key) {
                Some(spec) => {
                    used.insert(e.key.clone());
                    let fits = spec.global_shape.len() == t.dim()
                        && spec.offsets.len() == t.dim()
                        && spec
                            .offsets
                            .iter()
                            .zip(t.shape())
                            .zip(&spec.global_shape)
                            .all(|((&o, &l), &g)| o.checked_add(l).is_some_and(|end| end <= g));
                    if !fits {
                        return Err(Error::unwritable(
                            &e.key,
                            format!(
                                "local tensor of shape {:?} at offsets {:?} does not fit the global shape {:?}",
                                t.shape(),
                                spec.offsets,
                                spec.global_shape
                            ),
                        ));
                    }
                    (spec.global_shape.clone(), spec.offsets.clone())
                }
                None => (t.shape().to_vec(), vec![0; t.dim()]),
            };
            items.push(ItemDesc {
                fqn: e.key,
                tensor: Some(TensorDesc {
                    offsets,
                    sizes: t.shape().to_vec(),
                    size,
                    dtype: t.dtype(),
                    requires_grad: t.requires_grad(),
                }),
            });
            payloads.push(Payload::Tensor(t));
        } else {
            items.push(ItemDesc { fqn: e.key, tensor: None });
            payloads.push(Payload::Object(e.value));
        }
    }
    if let Some(k) = shards.keys().find(|k| !used.contains(*k)) {
        return Err(Error::unwritable(k, "a shard spec names a key that is not a tensor of the state dict"));
    }
    Ok((LocalPlan { items, planner_data }, payloads))
}

/// The global plan: which items each rank writes (with its chunk index), and the metadata without
/// `storage_data`.
#[derive(Debug)]
pub(crate) struct GlobalPlan {
    /// Per rank, per local item: `None` if deduplicated away, else the chunk index (`MetadataIndex.index`)
    /// for tensors or `Some(None)` for objects.
    pub assignment: Vec<Vec<Option<Option<usize>>>>,
    pub metadata: Metadata,
}

/// torch's `dedup_save_plans`: an item held by several ranks is kept by the rank with the smallest
/// accumulated storage size so far (ties: lowest rank; objects count 1, an empty tensor 1), or by the
/// lowest rank with `lowest`. Then `create_default_global_save_plan` + `planner_data` from a `ChainMap`.
pub(crate) fn global_plan(plans: &[LocalPlan], lowest: bool) -> Result<GlobalPlan> {
    // Items in first-appearance order over the plans, with the plans holding each.
    let mut order: Vec<(String, Option<Vec<usize>>)> = Vec::new();
    let mut holders: HashMap<(String, Option<Vec<usize>>), Vec<usize>> = HashMap::new();
    let mut sizes: HashMap<(String, Option<Vec<usize>>), u64> = HashMap::new();
    for (r, plan) in plans.iter().enumerate() {
        for it in &plan.items {
            let id = it.identity();
            let h = holders.entry(id.clone()).or_insert_with(|| {
                order.push(id.clone());
                Vec::new()
            });
            if !h.contains(&r) {
                h.push(r);
            }
            sizes.insert(id, it.storage_size().filter(|&s| s > 0).unwrap_or(1));
        }
    }
    let mut plan_size = vec![0u64; plans.len()];
    let mut owner: HashMap<(String, Option<Vec<usize>>), usize> = HashMap::with_capacity(order.len());
    for id in &order {
        let h = &holders[id];
        let chosen = if lowest {
            h.iter().copied().min().unwrap_or(0)
        } else {
            // `min(set, key=size)`: a set of small ints iterates in ascending order, so ties go low.
            let mut sorted = h.clone();
            sorted.sort_unstable();
            let c = sorted.iter().copied().min_by_key(|&r| plan_size[r]).unwrap_or(0);
            plan_size[c] = plan_size[c].saturating_add(sizes[id]);
            c
        };
        owner.insert(id.clone(), chosen);
    }

    let mut sdm: Vec<(String, StorageMetadata)> = Vec::new();
    let mut pos: HashMap<String, usize> = HashMap::new();
    let mut assignment = Vec::with_capacity(plans.len());
    for (r, plan) in plans.iter().enumerate() {
        let mut mine = Vec::with_capacity(plan.items.len());
        let mut seen_here = HashSet::new();
        for it in &plan.items {
            let id = it.identity();
            if owner.get(&id) != Some(&r) || !seen_here.insert(id) {
                mine.push(None);
                continue;
            }
            match &it.tensor {
                Some(t) => {
                    let p = match pos.get(&it.fqn) {
                        Some(&p) => p,
                        None => {
                            pos.insert(it.fqn.clone(), sdm.len());
                            let mut properties = TensorProperties::new(t.dtype);
                            properties.requires_grad = t.requires_grad;
                            sdm.push((
                                it.fqn.clone(),
                                StorageMetadata::Tensor(TensorStorageMetadata {
                                    properties,
                                    size: t.size.clone(),
                                    chunks: Vec::new(),
                                }),
                            ));
                            sdm.len() - 1
                        }
                    };
                    let StorageMetadata::Tensor(md) = &mut sdm[p].1 else {
                        return Err(Error::unwritable(&it.fqn, "is a tensor on one rank and another value on another"));
                    };
                    if md.size != t.size || md.properties.dtype != t.dtype {
                        return Err(Error::unwritable(
                            &it.fqn,
                            format!(
                                "ranks disagree on the tensor: {} {:?} and {} {:?}",
                                md.properties.dtype, md.size, t.dtype, t.size
                            ),
                        ));
                    }
                    md.chunks.push(ChunkStorageMetadata { offsets: t.offsets.clone(), sizes: t.sizes.clone() });
                    mine.push(Some(Some(md.chunks.len() - 1)));
                }
                None => {
                    if pos.contains_key(&it.fqn) {
                        return Err(Error::unwritable(&it.fqn, "is a tensor on one rank and another value on another"));
                    }
                    pos.insert(it.fqn.clone(), sdm.len());
                    sdm.push((it.fqn.clone(), StorageMetadata::Bytes));
                    mine.push(Some(None));
                }
            }
        }
        assignment.push(mine);
    }
    // `_validate_global_plan`: chunks inside, not overlapping, covering.
    for (k, md) in &sdm {
        if let StorageMetadata::Tensor(t) = md {
            chunks::check_chunks(k, &t.size, &t.chunks)?;
        }
    }
    // dict(ChainMap(*mappings)): keys of the last rank first, values from the first rank that has them.
    let mut keys: Vec<&str> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for plan in plans.iter().rev() {
        for (k, _) in &plan.planner_data {
            if seen.insert(k) {
                keys.push(k);
            }
        }
    }
    let mut first: HashMap<&str, &Vec<PathItem>> = HashMap::new();
    for plan in plans {
        for (k, path) in &plan.planner_data {
            first.entry(k.as_str()).or_insert(path);
        }
    }
    let planner_data =
        keys.into_iter().filter_map(|k| first.get(k).map(|path| (k.to_owned(), (*path).clone()))).collect();
    Ok(GlobalPlan {
        assignment,
        metadata: Metadata {
            state_dict_metadata: sdm,
            planner_data: Some(planner_data),
            storage_data: Vec::new(),
            storage_meta: None,
            version: None,
        },
    })
}

/// torch's `_split_by_size_and_type`: objects dealt round-robin, tensors (largest first) each to the
/// lightest bucket. `items` are `(position, storage size or None for objects)` in plan order.
pub(crate) fn split_buckets(bins: usize, items: &[(usize, Option<u64>)]) -> Vec<Vec<usize>> {
    if bins <= 1 {
        return vec![items.iter().map(|(i, _)| *i).collect()];
    }
    let mut buckets = vec![Vec::new(); bins];
    let mut load = vec![0u64; bins];
    for (n, (i, _)) in items.iter().filter(|(_, s)| s.is_none()).enumerate() {
        buckets[n % bins].push(*i);
    }
    let mut tensors: Vec<(usize, u64)> = items.iter().filter_map(|(i, s)| s.map(|s| (*i, s))).collect();
    tensors.sort_by_key(|&(_, s)| std::cmp::Reverse(s)); // stable, like list.sort(reverse=True)
    for (i, s) in tensors {
        let b = (0..bins).min_by_key(|&b| load[b]).unwrap_or(0);
        buckets[b].push(i);
        load[b] = load[b].saturating_add(s);
    }
    buckets
}

// ---------------------------------------------------------------------------------------------------------
// Wire format of the plans and results exchanged between ranks (JSON).

fn path_json(path: &[PathItem]) -> Json {
    Json::Array(
        path.iter()
            .map(|p| match p {
                PathItem::Key(k) => json!(k),
                PathItem::Index(i) => json!(i),
            })
            .collect(),
    )
}

fn json_path(j: &Json) -> Option<Vec<PathItem>> {
    j.as_array()?
        .iter()
        .map(|p| match p {
            Json::String(s) => Some(PathItem::Key(s.clone())),
            Json::Number(n) => n.as_u64().and_then(|n| usize::try_from(n).ok()).map(PathItem::Index),
            _ => None,
        })
        .collect()
}

fn dims(j: &Json) -> Option<Vec<usize>> {
    j.as_array()?.iter().map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok())).collect()
}

pub(crate) fn plan_to_json(plan: &LocalPlan) -> Json {
    let items: Vec<Json> = plan
        .items
        .iter()
        .map(|it| match &it.tensor {
            Some(t) => json!({
                "fqn": it.fqn, "offsets": t.offsets, "sizes": t.sizes, "size": t.size,
                "dtype": t.dtype.torch_name(), "requires_grad": t.requires_grad,
            }),
            None => json!({"fqn": it.fqn}),
        })
        .collect();
    let planner: Vec<Json> = plan.planner_data.iter().map(|(k, p)| json!([k, path_json(p)])).collect();
    json!({"items": items, "planner_data": planner})
}

pub(crate) fn plan_from_json(j: &Json) -> Option<LocalPlan> {
    let items = j
        .get("items")?
        .as_array()?
        .iter()
        .map(|it| {
            let fqn = it.get("fqn")?.as_str()?.to_owned();
            let tensor = match it.get("dtype") {
                None => None,
                Some(d) => Some(TensorDesc {
                    offsets: dims(it.get("offsets")?)?,
                    sizes: dims(it.get("sizes")?)?,
                    size: dims(it.get("size")?)?,
                    dtype: DType::from_torch_name(d.as_str()?)?,
                    requires_grad: it.get("requires_grad")?.as_bool()?,
                }),
            };
            Some(ItemDesc { fqn, tensor })
        })
        .collect::<Option<Vec<_>>>()?;
    let planner_data = j
        .get("planner_data")?
        .as_array()?
        .iter()
        .map(|e| Some((e.get(0)?.as_str()?.to_owned(), json_path(e.get(1)?)?)))
        .collect::<Option<Vec<_>>>()?;
    Some(LocalPlan { items, planner_data })
}

pub(crate) fn results_to_json(results: &[(MetadataIndex, crate::metadata::StorageInfo)]) -> Json {
    Json::Array(
        results
            .iter()
            .map(|(ix, s)| {
                json!({
                    "fqn": ix.fqn, "offset": ix.offset, "index": ix.index,
                    "relative_path": s.relative_path, "at": s.offset, "length": s.length,
                    "transforms": s.transform_descriptors,
                })
            })
            .collect(),
    )
}

pub(crate) fn results_from_json(j: &Json) -> Option<Vec<(MetadataIndex, crate::metadata::StorageInfo)>> {
    j.as_array()?
        .iter()
        .map(|r| {
            let offset = match r.get("offset")? {
                Json::Null => None,
                o => Some(dims(o)?),
            };
            let index = match r.get("index")? {
                Json::Null => None,
                i => Some(usize::try_from(i.as_u64()?).ok()?),
            };
            Some((
                MetadataIndex { fqn: r.get("fqn")?.as_str()?.to_owned(), offset, index },
                crate::metadata::StorageInfo {
                    relative_path: r.get("relative_path")?.as_str()?.to_owned(),
                    offset: r.get("at")?.as_u64()?,
                    length: r.get("length")?.as_u64()?,
                    transform_descriptors: r
                        .get("transforms")?
                        .as_array()?
                        .iter()
                        .map(|t| t.as_str().map(str::to_owned))
                        .collect::<Option<_>>()?,
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn tensor(fqn: &str, offsets: &[usize], sizes: &[usize], size: &[usize]) -> ItemDesc {
        ItemDesc {
            fqn: fqn.into(),
            tensor: Some(TensorDesc {
                offsets: offsets.to_vec(),
                sizes: sizes.to_vec(),
                size: size.to_vec(),
                dtype: DType::F32,
                requires_grad: false,
            }),
        }
    }

    fn object(fqn: &str) -> ItemDesc {
        ItemDesc { fqn: fqn.into(), tensor: None }
    }

    fn plan(items: Vec<ItemDesc>) -> LocalPlan {
        let planner_data =
            items.iter().map(|i| (i.fqn.clone(), vec![PathItem::Key(i.fqn.clone())])).collect::<Vec<_>>();
        LocalPlan { items, planner_data }
    }

    /// The d241 / d215 golden layout: replicated items go to rank 1, the one with fewer bytes so far.
    #[test]
    fn dedup_by_accumulated_size() {
        let r0 = plan(vec![
            tensor("row", &[0, 0], &[3, 4], &[5, 4]),
            tensor("col", &[0, 0], &[3, 3], &[3, 6]),
            tensor("rep_dt", &[0, 0], &[2, 2], &[2, 2]),
            tensor("plain", &[0], &[3], &[3]),
            object("obj.rank"),
        ]);
        let r1 = plan(vec![
            tensor("row", &[3, 0], &[2, 4], &[5, 4]),
            tensor("col", &[0, 3], &[3, 3], &[3, 6]),
            tensor("rep_dt", &[0, 0], &[2, 2], &[2, 2]),
            tensor("plain", &[0], &[3], &[3]),
            object("obj.rank"),
        ]);
        let g = global_plan(&[r0.clone(), r1.clone()], false).unwrap();
        assert_eq!(g.assignment[0], vec![Some(Some(0)), Some(Some(0)), None, None, None]);
        assert_eq!(g.assignment[1], vec![Some(Some(1)), Some(Some(1)), Some(Some(0)), Some(Some(0)), Some(None)]);
        let keys: Vec<&str> = g.metadata.state_dict_metadata.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["row", "col", "rep_dt", "plain", "obj.rank"]);
        let low = global_plan(&[r0, r1], true).unwrap();
        assert_eq!(low.assignment[1], vec![Some(Some(1)), Some(Some(1)), None, None, None]);
    }

    #[test]
    fn buckets_like_torch() {
        // c215_multi: sizes of model.w, model.b, step, opt.lr, opt.betas, exp_avg, opt.hp.name, lst.0, lst.1,
        // tt, view, scalar, empty, flag.
        let items = [
            (0, Some(48)),
            (1, Some(8)),
            (2, None),
            (3, None),
            (4, None),
            (5, Some(16)),
            (6, None),
            (7, Some(24)),
            (8, Some(4)),
            (9, Some(12)),
            (10, Some(12)),
            (11, Some(8)),
            (12, Some(0)),
            (13, Some(2)),
        ];
        let b = split_buckets(3, &items);
        assert_eq!(b[0], vec![2, 6, 0]);
        assert_eq!(b[1], vec![3, 7, 10, 11]);
        assert_eq!(b[2], vec![4, 5, 9, 1, 8, 13, 12]);
    }

    #[test]
    fn wire_round_trip() {
        let p = plan(vec![tensor("a.b", &[1, 0], &[2, 2], &[3, 2]), object("c")]);
        assert_eq!(plan_from_json(&plan_to_json(&p)).unwrap(), p);
    }

    #[test]
    fn disagreeing_ranks_fail() {
        let r0 = plan(vec![tensor("w", &[0], &[2], &[4])]);
        let r1 = plan(vec![tensor("w", &[1], &[2], &[4])]);
        assert!(matches!(global_plan(&[r0, r1], false), Err(Error::OverlappingChunks { .. })));
        let r0 = plan(vec![tensor("w", &[0], &[2], &[4])]);
        let r1 = plan(vec![tensor("w", &[2], &[2], &[5])]);
        assert!(matches!(global_plan(&[r0, r1], false), Err(Error::Unwritable { .. })));
    }
}
