//! Resharding a sharded checkpoint (distcp, hfai, RecIS) to another number of ranks, shards or parts.

use std::path::Path;

use crate::error::At;
use crate::{Error, Format, Result};

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

/// The formats [`reshard`] handles.
pub fn reshard_formats() -> &'static [Format] {
    &[Format::Distcp, Format::Hfai, Format::Recis]
}

/// Rewrites the sharded checkpoint at `src` (format detected) in `dst` (new or empty) for `world_size`
/// ranks, in the format's own layout:
///
/// - distcp: [`ckpt_distcp::reshard`] (every tensor sharded on its first dimension as `Shard(0)` over
///   `world_size` ranks, each rank's box read from the items it overlaps; scalars and non-tensor values
///   replicated, written once);
/// - hfai: [`ckpt_hfai::reshard`] (hfai's key split and `torch.chunk` chunking for `world_size` parts);
/// - recis: [`ckpt_recis::reshard`] (ids re-partitioned by RecIS's loader rule, `model.pt` and
///   `extra.pt` copied); a directory with a `checkpoint` list reshards its latest checkpoint
///   ([`ckpt_recis::checkpoint_dir`]).
///
/// # Errors
/// [`Error::InvalidArgument`] for other formats or a `world_size` of 0, [`Error::AlreadyExists`] for a
/// non-empty `dst`; the format's own errors.
pub fn reshard(src: &Path, dst: &Path, world_size: usize) -> Result<ReshardSummary> {
    let format = crate::detect(src)?;
    let invalid = |path: &Path, reason: String| Error::InvalidArgument { path: path.to_path_buf(), reason };
    if !reshard_formats().contains(&format) {
        let names: Vec<&str> = reshard_formats().iter().map(|f| f.name()).collect();
        return Err(invalid(
            src,
            format!("a {format} checkpoint has no shards to reshard; reshard works on {}", names.join(", ")),
        ));
    }
    if !format.reading_enabled() {
        return Err(Error::FeatureDisabled { path: src.to_path_buf(), format, feature: format.feature() });
    }
    if world_size == 0 {
        return Err(invalid(dst, "the world size must be at least 1".into()));
    }
    if dst.exists() {
        let mut it = std::fs::read_dir(dst).at(dst)?;
        if it.next().is_some() {
            return Err(Error::AlreadyExists {
                path: dst.to_path_buf(),
                reason: "the destination exists and is not empty".into(),
            });
        }
    }
    let (tensors, bytes) = {
        let ck = crate::open_as(src, format)?;
        let mut n = 0;
        let mut b = 0u64;
        for e in ck.entries() {
            if let crate::EntryKind::Tensor(t) = &e.kind {
                n += 1;
                b += t.nbytes() as u64;
            }
        }
        (n, b)
    };
    let done: Result<()> = match format {
        #[cfg(feature = "distcp")]
        Format::Distcp => {
            ckpt_distcp::reshard(src, dst, world_size, &ckpt_distcp::ReshardOptions::default()).map(|_| ()).at(src)
        }
        #[cfg(feature = "hfai")]
        Format::Hfai => {
            ckpt_hfai::reshard(src, dst, world_size, &ckpt_hfai::ReshardOptions::default()).map(|_| ()).at(src)
        }
        #[cfg(feature = "recis")]
        Format::Recis => ckpt_recis::reshard(src, dst, world_size, &ckpt_recis::ReshardOptions::default()).at(src),
        #[allow(unreachable_patterns)]
        _ => Err(Error::FeatureDisabled { path: src.to_path_buf(), format, feature: format.feature() }),
    };
    done?;
    Ok(ReshardSummary { format, world_size, tensors, bytes })
}
