//! Resharding a sharded checkpoint (distcp, hfai, RecIS) to another number of ranks, shards or parts.

use std::path::Path;
use std::sync::OnceLock;

use crate::error::At;
use crate::{EntryKind, Error, Format, Result};

/// What [`reshard`] did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReshardSummary {
    /// The format resharded.
    pub format: Format,
    /// The new number of ranks, shards or parts.
    pub world_size: usize,
    /// Tensor entries of the source.
    pub tensors: usize,
    /// Bytes of tensor data of the source.
    pub bytes: u64,
}

/// The formats [`reshard`] handles: those whose checkpoints split over ranks, shards or parts
/// ([`Format::is_sharded`]).
pub fn reshard_formats() -> &'static [Format] {
    static SHARDED: OnceLock<Vec<Format>> = OnceLock::new();
    SHARDED.get_or_init(|| Format::ALL.into_iter().filter(|f| f.is_sharded()).collect())
}

/// Rewrites the sharded checkpoint at `src` (format detected) in `dst` (new or empty) for `world_size`
/// ranks, in the format's own layout:
///
/// - distcp: every tensor sharded on its first dimension as `Shard(0)` over `world_size` ranks, each rank's
///   box read from the items it overlaps (scalars and non-tensor values replicated, written once);
/// - hfai: hfai's key split and `torch.chunk` chunking for `world_size` parts;
/// - recis: ids re-partitioned by RecIS's loader rule, `model.pt` and `extra.pt` copied; a directory with a
///   `checkpoint` list reshards its latest checkpoint.
///
/// # Errors
/// [`Error::InvalidArgument`] for other formats or a `world_size` of 0, [`Error::AlreadyExists`] for a
/// non-empty `dst`; the format's own errors.
pub fn reshard(src: &Path, dst: &Path, world_size: usize) -> Result<ReshardSummary> {
    let format = crate::detect(src)?;
    if !format.is_sharded() {
        let names: Vec<&str> = reshard_formats().iter().map(|f| f.name()).collect();
        return Err(Error::InvalidArgument {
            path: src.to_path_buf(),
            reason: format!("a {format} checkpoint has no shards to reshard; reshard works on {}", names.join(", ")),
        });
    }
    let adaptor = crate::formats::adaptor(format, src)?;
    if world_size == 0 {
        return Err(Error::InvalidArgument {
            path: dst.to_path_buf(),
            reason: "the world size must be at least 1".into(),
        });
    }
    if dst.exists() && std::fs::read_dir(dst).at(dst)?.next().is_some() {
        return Err(Error::AlreadyExists {
            path: dst.to_path_buf(),
            reason: "the destination exists and is not empty".into(),
        });
    }
    let (mut tensors, mut bytes) = (0, 0u64);
    for e in adaptor.checkpoint(src)?.entries() {
        if let EntryKind::Tensor(t) = &e.kind {
            tensors += 1;
            bytes += t.nbytes() as u64;
        }
    }
    adaptor.reshard(src, dst, world_size)?;
    Ok(ReshardSummary { format, world_size, tensors, bytes })
}
