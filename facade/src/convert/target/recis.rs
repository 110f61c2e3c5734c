//! Writing a source as a RecIS checkpoint directory: [`ckpt_recis::save`] on the source's state dict (the
//! crate documents the layout), or, from a RecIS source without a new `slice_size`, [`ckpt_recis::reshard`]
//! on the files themselves.

use std::path::Path;

use ckpt_core::PathItem;

use super::super::source::{self, Leaf};
use super::super::{ConvertOptions, ConvertSummary};
use super::{count, top_mapping};
use crate::error::At;
use crate::{Error, Format, Result};

pub(super) fn write(src: &Path, from: Format, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
    if from == Format::Recis && options.recis_slice_size.is_none() {
        // Re-sharded from the files themselves, without reading the content into a state dict.
        return reshard(src, dst, options);
    }
    let content = &source::read(src, from)?;
    top_mapping(content, from, Format::Recis)?;
    let mut write = ckpt_recis::WriteOptions::default().with_shards(options.world_size);
    if let Some(parallel) = options.recis_parallel {
        write = write.with_parallel(parallel);
    }
    if let Some(size) = options.recis_slice_size {
        write = write.with_slice_size(size);
    }
    let report = match ckpt_recis::save(&content.tree, dst, &write) {
        Ok(r) => r,
        Err(ckpt_recis::Error::StateDict { reason }) => {
            return Err(Error::UnsupportedConversion { from, to: Format::Recis, reason });
        }
        Err(e) => return Err(e).at(dst),
    };
    let dropped_top = |l: &Leaf| matches!(l.path.first(), Some(PathItem::Key(k)) if report.dropped.contains(k));
    let (lost, kept): (Vec<&Leaf>, Vec<&Leaf>) = content.leaves.iter().partition(|l| dropped_top(l));
    let mut s = count(kept);
    s.dropped = lost.into_iter().map(|l| l.name.clone()).collect();
    Ok(s)
}

/// RecIS to RecIS: the sparse part re-sharded with each table's own `slice_size`, `model.pt` and `extra.pt`
/// copied ([`ckpt_recis::reshard`]).
fn reshard(src: &Path, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
    let before = ckpt_recis::RecisReader::open(src).at(src)?;
    let parallel = match options.recis_parallel {
        Some(p) => p,
        None => before.sparse().parallel().unwrap_or(ckpt_recis::WriteOptions::default().parallel),
    };
    let write = ckpt_recis::WriteOptions::default().with_parallel(parallel);
    let reshard = ckpt_recis::ReshardOptions::default().with_write(write);
    ckpt_recis::reshard(src, dst, options.world_size, &reshard).at(dst)?;
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
    use ckpt_core::CheckpointRead;
    s.dropped =
        before.entries().into_iter().filter(|e| !kept.iter().any(|k| k.name == e.name)).map(|e| e.name).collect();
    Ok(s)
}
