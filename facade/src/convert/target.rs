//! Writing a source's content in each target format.

use std::path::Path;

#[allow(unused_imports)]
use ckpt_core::{Dict, DictKind, PathItem, Tensor, Value};

use super::source::{self, Content, Leaf};
use super::{ConvertOptions, ConvertSummary};
use crate::error::At;
use crate::{Error, Format, Result};

#[cfg(feature = "pbg")]
mod pbg;
#[cfg(feature = "recis")]
mod recis;

/// The summary of a target that writes every one of `leaves`.
fn count<'a>(leaves: impl IntoIterator<Item = &'a Leaf>) -> ConvertSummary {
    let mut s = ConvertSummary::default();
    for l in leaves {
        match l.value.as_tensor() {
            Some(t) => {
                s.tensors += 1;
                s.bytes += t.nbytes() as u64;
            }
            None => s.values += 1,
        }
    }
    s
}

/// Writes `src` (format `from`) as `to` at `dst`.
pub(super) fn write(
    src: &Path,
    from: Format,
    dst: &Path,
    to: Format,
    options: &ConvertOptions,
) -> Result<ConvertSummary> {
    match to {
        #[cfg(feature = "distcp")]
        Format::Torch if from == Format::Distcp => {
            let report = ckpt_distcp::convert::dcp_to_torch_save(src, dst).at(src)?;
            let reader = ckpt_distcp::DcpReader::open(src).at(src)?;
            let entries = reader.keys().count();
            Ok(ConvertSummary {
                tensors: report.tensors,
                bytes: report.tensor_bytes,
                values: entries.saturating_sub(report.tensors),
                dropped: report.skipped,
            })
        }
        #[cfg(feature = "torch")]
        Format::Torch => {
            let content = source::read(src, from)?;
            ckpt_torch::save(&content.tree, dst, &ckpt_torch::WriteOptions::default()).at(dst)?;
            Ok(count(&content.leaves))
        }
        #[cfg(feature = "safetensors")]
        Format::Safetensors => safetensors(&source::read(src, from)?, from, dst),
        #[cfg(feature = "distcp")]
        Format::Distcp => distcp(&source::read(src, from)?, from, dst, options),
        #[cfg(feature = "hfai")]
        Format::Hfai => hfai(&source::read(src, from)?, from, dst, options),
        #[cfg(feature = "recis")]
        Format::Recis => recis::write(src, from, dst, options),
        #[cfg(feature = "pbg")]
        Format::Pbg => pbg::write(&source::read(src, from)?, from, dst, options),
        // Reached only in builds without some format's feature.
        #[allow(unreachable_patterns)]
        _ => {
            let _ = options;
            Err(Error::FeatureDisabled { path: dst.to_path_buf(), format: to, feature: to.feature() })
        }
    }
}

#[cfg(feature = "safetensors")]
fn safetensors(content: &Content, from: Format, dst: &Path) -> Result<ConvertSummary> {
    use crate::safetensors_records::{PATHS_KEY, VALUES_KEY, paths_record, value_to_json, values_record};
    let mut s = ConvertSummary::default();
    let mut kept: Vec<&Leaf> = Vec::new();
    let mut tensors = Vec::new();
    let mut values = Vec::new();
    for l in &content.leaves {
        match l.value.as_tensor() {
            Some(t) if t.dtype().to_safetensors().is_ok() => {
                s.tensors += 1;
                s.bytes += t.nbytes() as u64;
                tensors.push((l.name.clone(), t.clone()));
                kept.push(l);
            }
            None => match value_to_json(&l.value) {
                Some(json) => {
                    s.values += 1;
                    values.push((l.name.clone(), json));
                    kept.push(l);
                }
                None => s.dropped.push(l.name.clone()),
            },
            Some(_) => s.dropped.push(l.name.clone()),
        }
    }
    let mut meta = std::collections::HashMap::from([
        ("format".to_owned(), "pt".to_owned()),
        ("ckpt.source".to_owned(), from.name().to_owned()),
    ]);
    if let Some(paths) = paths_record(kept.iter().map(|l| (l.name.as_str(), l.path.as_slice()))) {
        meta.insert(PATHS_KEY.to_owned(), paths);
    }
    if let Some(values) = values_record(values) {
        meta.insert(VALUES_KEY.to_owned(), values);
    }
    ckpt_core::safetensors::write_file(&tensors, Some(meta), dst).at(dst)?;
    Ok(s)
}

/// The top-level mapping of a state dict, or the reason the target needs one.
#[cfg(any(feature = "distcp", feature = "hfai", feature = "recis", feature = "pbg"))]
fn top_mapping(content: &Content, from: Format, to: Format) -> Result<&Dict> {
    content.tree.as_dict().ok_or_else(|| Error::UnsupportedConversion {
        from,
        to,
        reason: format!("{to} checkpoints hold a mapping; the source's top level is a {}", content.tree.type_name()),
    })
}

#[cfg(feature = "distcp")]
fn distcp(content: &Content, from: Format, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
    use std::collections::HashMap;

    use ckpt_distcp::{Profile, ShardSpec, WriteOptions, shard_box};

    top_mapping(content, from, Format::Distcp)?;
    let profile = match options.dcp_profile {
        super::DcpProfile::MaxCompat => Profile::MaxCompat,
        super::DcpProfile::Torch213 => Profile::Torch213,
    };
    let write = WriteOptions::default().with_profile(profile);
    std::fs::create_dir_all(dst).at(dst)?;
    let mut s = ConvertSummary::default();
    // DCP cannot save sparse, quantized, nested or meta tensors (neither can torch's `dcp.save`): they are
    // reported as dropped.
    let mut flat: Vec<(String, Vec<PathItem>, Value)> = Vec::new();
    for e in ckpt_core::flatten(&content.tree).at(dst)? {
        if matches!(e.value, Value::OpaqueTensor { .. }) {
            s.dropped.push(e.key);
        } else {
            flat.push((e.key, e.path, e.value.clone()));
        }
    }
    for (_, _, v) in &flat {
        match v.as_tensor() {
            Some(t) => {
                s.tensors += 1;
                s.bytes += t.nbytes() as u64;
            }
            None => s.values += 1,
        }
    }
    let world = options.world_size;
    if world == 1 {
        let kept;
        let tree = if s.dropped.is_empty() {
            &content.tree
        } else {
            kept = ckpt_core::unflatten(flat.iter().map(|(_, p, v)| (p.clone(), v.clone()))).at(dst)?;
            &kept
        };
        ckpt_distcp::save(tree, dst, &write).at(dst)?;
        return Ok(s);
    }
    // Tensors with at least `world` rows are split on dimension 0; everything else is replicated.
    let sharded = |v: &Value| v.as_tensor().filter(|t| t.shape().first().is_some_and(|&rows| rows >= world)).cloned();
    let shards: HashMap<&str, Vec<usize>> =
        flat.iter().filter_map(|(k, _, v)| sharded(v).map(|t| (k.as_str(), t.shape().to_vec()))).collect();
    let rank_state = |rank: usize| -> Result<(Value, HashMap<String, ShardSpec>)> {
        let mut specs = HashMap::new();
        let mut leaves = Vec::with_capacity(flat.len());
        for (k, path, v) in &flat {
            let value = match (shards.get(k.as_str()), v.as_tensor()) {
                (Some(global), Some(t)) => {
                    let (off, len) = shard_box(global, 0, rank, world);
                    let (start, rows) = (off.first().copied().unwrap_or(0), len.first().copied().unwrap_or(0));
                    specs.insert(k.clone(), ShardSpec::new(global, &off));
                    Value::Tensor(t.narrow(0, start, rows).at(dst)?.with_requires_grad(t.requires_grad()))
                }
                _ => v.clone(),
            };
            leaves.push((path.clone(), value));
        }
        Ok((ckpt_core::unflatten(leaves).at(dst)?, specs))
    };
    // Rank states are views (narrowed tensors): building them all first costs no tensor data, and a failure
    // leaves nothing written.
    let ranks = (0..world).map(rank_state).collect::<Result<Vec<_>>>()?;
    ckpt_distcp::save_ranks(&ranks, dst, &write).at(dst)?;
    Ok(s)
}

#[cfg(feature = "hfai")]
fn hfai(content: &Content, from: Format, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
    use ckpt_hfai::{ModelState, SaveState, WriteOptions};

    let top = top_mapping(content, from, Format::Hfai)?;
    let as_optimizer = |v: &Value| {
        v.as_dict()
            .is_some_and(|d| d.get("state").is_some_and(|s| s.as_dict().is_some()) && d.get("param_groups").is_some())
    };
    let models: Vec<&Dict> = match top.get("model") {
        Some(Value::Dict(d)) => vec![d],
        Some(Value::List(items)) if !items.is_empty() => {
            let dicts: Vec<&Dict> = items.iter().filter_map(Value::as_dict).collect();
            if dicts.len() == items.len() { dicts } else { Vec::new() }
        }
        _ => Vec::new(),
    };
    let mut state = SaveState::default();
    let mut dropped_top = None;
    if models.is_empty() {
        let mut model = top.clone();
        model.kind = DictKind::OrderedDict;
        state = state.with_model(ModelState::new(model));
    } else {
        for m in models {
            state = state.with_model(ModelState::new(m.clone()));
        }
        for (k, v) in &top.items {
            match k.as_str() {
                // hfai's own header: written again by the writer.
                Some("model" | "__nshards__" | "__version__") => {}
                Some("optimizer") if as_optimizer(v) => state = state.with_optimizer(v.clone()),
                Some("optimizer") if v.as_sequence().is_some_and(|s| s.iter().all(as_optimizer)) => {
                    for o in v.as_sequence().unwrap_or_default() {
                        state = state.with_optimizer(o.clone());
                    }
                }
                // Not an optimizer state dict (a safetensors file keeps tensors only, so `param_groups` is
                // gone), and the key is hfai's: reported as dropped.
                Some("optimizer") => dropped_top = Some("optimizer"),
                _ => state = state.with_other(k.clone(), v.clone()),
            }
        }
    }
    let mut write = WriteOptions::default().with_nshards(options.world_size);
    if let Some(large) = options.hfai_large_size {
        write = write.with_large_size(large);
    }
    ckpt_hfai::save(&state, dst, &write).at(dst)?;
    let (lost, kept): (Vec<&Leaf>, Vec<&Leaf>) = content
        .leaves
        .iter()
        .partition(|l| dropped_top.is_some_and(|k| matches!(l.path.first(), Some(PathItem::Key(p)) if p == k)));
    let mut s = count(kept);
    s.dropped = lost.into_iter().map(|l| l.name.clone()).collect();
    Ok(s)
}
