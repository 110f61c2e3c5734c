//! `torch.distributed.checkpoint` directories, through `ckpt-distcp`.

use std::path::Path;

use ckpt_core::{PathItem, Value};

use crate::Format;
use crate::adaptor::{Adaptor, Content, Leaf, Reader, Source};
use crate::convert::{ConvertOptions, ConvertSummary, DcpProfile};
use crate::error::{At, Cause, Error, Result};
use crate::verify::{Progress, VerifyReport};

pub(crate) struct Distcp;

impl Cause for ckpt_distcp::Error {
    fn at(self, path: &Path) -> Error {
        ckpt_core::Error::from(self).at(path)
    }
}

impl Adaptor for Distcp {
    fn format(&self) -> Format {
        Format::Distcp
    }

    fn open(&self, path: &Path) -> Result<Box<dyn Reader>> {
        Ok(Box::new(ckpt_distcp::DcpReader::open(path).at(path)?))
    }

    /// Every key with its path from `planner_data`; the state dict they nest into.
    fn read(&self, path: &Path) -> Result<Content> {
        let reader = ckpt_distcp::DcpReader::open(path).at(path)?;
        let keys: Vec<String> = reader.keys().map(str::to_owned).collect();
        let mut leaves = Vec::with_capacity(keys.len());
        for name in keys {
            let value = reader.read_value(&name).at(path)?;
            leaves.push(Leaf { path: reader.path_of(&name), name, value });
        }
        Content::from_leaves(leaves, path)
    }

    /// The source's state dict (a mapping) with DCP's flattening rules, from one process; with a world size
    /// `N > 1`, as `N` ranks holding every tensor of at least `N` rows `Shard(0)` would save it
    /// ([`ckpt_distcp::save_sharded`]). DCP cannot save sparse, quantized, nested or meta tensors (neither
    /// can torch's `dcp.save`): they are reported as dropped.
    fn write(&self, source: &Source<'_>, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
        let content = source.content()?;
        source.top_mapping(&content, Format::Distcp)?;
        let profile = match options.dcp_profile {
            DcpProfile::MaxCompat => ckpt_distcp::Profile::MaxCompat,
            DcpProfile::Torch213 => ckpt_distcp::Profile::Torch213,
        };
        let write = ckpt_distcp::WriteOptions::default().with_profile(profile);
        std::fs::create_dir_all(dst).at(dst)?;
        let mut s = ConvertSummary::default();
        let mut flat: Vec<(Vec<PathItem>, Value)> = Vec::new();
        for e in ckpt_core::flatten(&content.tree).at(dst)? {
            if matches!(e.value, Value::OpaqueTensor { .. }) {
                s.dropped.push(e.key);
            } else {
                flat.push((e.path, e.value.clone()));
            }
        }
        for (_, v) in &flat {
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
            kept = ckpt_core::unflatten(flat).at(dst)?;
            &kept
        };
        ckpt_distcp::save_sharded(tree, dst, options.world_size, &write).at(dst)?;
        Ok(s)
    }

    /// Tensor by tensor ([`ckpt_distcp::convert::dcp_to_torch_save`]).
    fn stream_to_torch_save(&self, src: &Path, dst: &Path) -> Option<Result<ConvertSummary>> {
        let streamed = || -> Result<ConvertSummary> {
            let report = ckpt_distcp::convert::dcp_to_torch_save(src, dst).at(src)?;
            let entries = ckpt_distcp::DcpReader::open(src).at(src)?.keys().count();
            Ok(ConvertSummary {
                tensors: report.tensors,
                bytes: report.tensor_bytes,
                values: entries.saturating_sub(report.tensors),
                dropped: report.skipped,
            })
        };
        Some(streamed())
    }

    /// [`ckpt_distcp::verify`]: chunks covering their tensors, items inside their files, CRCs, contents.
    fn verify(&self, path: &Path, report: &mut VerifyReport, _: Progress<'_>) -> Result<()> {
        let r = ckpt_distcp::verify(path).at(path)?;
        report.checked = r.items;
        report.bytes = r.bytes;
        report.problems.extend(r.problems.iter().map(ToString::to_string));
        Ok(())
    }

    /// Every tensor sharded on its first dimension as `Shard(0)`, each rank's box read from the items it
    /// overlaps ([`ckpt_distcp::reshard`]).
    fn reshard(&self, src: &Path, dst: &Path, world: usize) -> Result<()> {
        ckpt_distcp::reshard(src, dst, world, &ckpt_distcp::ReshardOptions::default()).map(|_| ()).at(src)
    }
}
