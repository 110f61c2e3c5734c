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
    use ckpt_distcp::{Profile, WriteOptions};

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
    let kept;
    let tree = if s.dropped.is_empty() {
        &content.tree
    } else {
        kept = ckpt_core::unflatten(flat.iter().map(|(_, p, v)| (p.clone(), v.clone()))).at(dst)?;
        &kept
    };
    ckpt_distcp::save_sharded(tree, dst, options.world_size, &write).at(dst)?;
    Ok(s)
}

#[cfg(feature = "hfai")]
fn hfai(content: &Content, from: Format, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
    use ckpt_hfai::{SaveState, WriteOptions};

    let top = top_mapping(content, from, Format::Hfai)?;
    let (state, dropped_keys) = SaveState::from_state_dict(top);
    let mut write = WriteOptions::default().with_nshards(options.world_size);
    if let Some(large) = options.hfai_large_size {
        write = write.with_large_size(large);
    }
    ckpt_hfai::save(&state, dst, &write).at(dst)?;
    let (lost, kept): (Vec<&Leaf>, Vec<&Leaf>) = content
        .leaves
        .iter()
        .partition(|l| matches!(l.path.first(), Some(PathItem::Key(p)) if dropped_keys.contains(p)));
    let mut s = count(kept);
    s.dropped = lost.into_iter().map(|l| l.name.clone()).collect();
    Ok(s)
}
