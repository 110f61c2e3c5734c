//! Resharding a sharded checkpoint (distcp, hfai, RecIS) to another number of ranks, shards or parts.

use std::path::Path;
use std::sync::OnceLock;

use crate::adaptor::Adaptor;
use crate::error::At;
use crate::error::{Error, Result};
use crate::format::Format;
use crate::limits::ReadLimits;
use ckpt_tensor::EntryKind;

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
pub fn reshard(src: impl AsRef<Path>, dst: impl AsRef<Path>, world_size: usize) -> Result<ReshardSummary> {
    reshard_with(src, dst, world_size, &ReadLimits::default())
}

/// [`reshard`], reading the source under `limits` ([`ReadLimits`]).
///
/// # Errors
/// As [`reshard`].
pub fn reshard_with(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    world_size: usize,
    limits: &ReadLimits,
) -> Result<ReshardSummary> {
    let (src, dst) = (src.as_ref(), dst.as_ref());
    let (format, adaptor) = check(src, dst, world_size)?;
    let (tensors, bytes) = count(adaptor, src, limits)?;
    adaptor.reshard(src, dst, world_size, limits)?;
    Ok(ReshardSummary { format, world_size, tensors, bytes })
}

/// The format of `src` and its adaptor, when it is sharded.
pub(crate) fn check_format(src: &Path) -> Result<(Format, &'static dyn Adaptor)> {
    let format = crate::formats::detect(src)?;
    if !format.is_sharded() {
        let names: Vec<&str> = reshard_formats().iter().map(|f| f.name()).collect();
        return Err(Error::InvalidArgument {
            path: src.to_path_buf(),
            reason: format!(
                "a {format} checkpoint has no shards to reshard; reshard works on {} checkpoints (`convert` writes \
                 another layout)",
                names.join(", ")
            ),
        });
    }
    Ok((format, crate::formats::adaptor(format, src)?))
}

/// [`check_format`], then the world size and the destination (new or empty).
pub(crate) fn check(src: &Path, dst: &Path, world_size: usize) -> Result<(Format, &'static dyn Adaptor)> {
    let (format, adaptor) = check_format(src)?;
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
    Ok((format, adaptor))
}

/// Tensor entries of `src` and their bytes.
pub(crate) fn count(adaptor: &dyn Adaptor, src: &Path, limits: &ReadLimits) -> Result<(usize, u64)> {
    let (mut tensors, mut bytes) = (0, 0u64);
    for e in adaptor.checkpoint(src, limits)?.entries() {
        if let EntryKind::Tensor(t) = &e.kind {
            tensors += 1;
            bytes += t.nbytes() as u64;
        }
    }
    Ok((tensors, bytes))
}
