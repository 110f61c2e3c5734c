//! Resharding a sharded checkpoint (distcp, hfai, RecIS) to another number of ranks, shards or parts.

use std::path::Path;
use std::sync::OnceLock;

use crate::adaptor::Adaptor;
use crate::destination::{self, Plan};
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

/// How [`reshard_with_options`] reads its source and treats its destination.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ReshardOptions {
    /// The resource limits the source is read under (default [`ReadLimits::default`]).
    pub limits: ReadLimits,
    /// Replace whatever stands at the destination, whole (default `false`: the destination must be new,
    /// an empty directory or a checkpoint of the source's format, else [`Error::DestinationTaken`]).
    pub overwrite: bool,
}

impl ReshardOptions {
    /// Sets the resource limits the source is read under.
    #[must_use]
    pub fn with_limits(mut self, limits: ReadLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Sets whether whatever stands at the destination is replaced whole ([`ReshardOptions::overwrite`]).
    #[must_use]
    pub fn with_overwrite(mut self, overwrite: bool) -> Self {
        self.overwrite = overwrite;
        self
    }
}

/// Rewrites the sharded checkpoint at `src` (format detected) in `dst` for `world_size` ranks, in the
/// format's own layout:
///
/// - distcp: every tensor sharded on its first dimension as `Shard(0)` over `world_size` ranks, each rank's
///   box read from the items it overlaps (scalars and non-tensor values replicated, written once);
/// - hfai: hfai's key split and `torch.chunk` chunking for `world_size` parts;
/// - recis: ids re-partitioned by RecIS's loader rule, `model.pt` and `extra.pt` copied; a directory with a
///   `checkpoint` list reshards its latest checkpoint.
///
/// `dst` is new, an empty directory, or a checkpoint of the source's format, which is replaced whole
/// (crash-safe); anything else there is refused unless [`ReshardOptions::overwrite`] is set.
///
/// # Errors
/// [`Error::InvalidArgument`] for other formats or a `world_size` of 0, [`Error::DestinationTaken`] for
/// a destination holding something else; the format's own errors.
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
    reshard_with_options(src, dst, world_size, &ReshardOptions::default().with_limits(*limits))
}

/// [`reshard`] with its options: the read limits, and whether to replace what stands at `dst`.
///
/// # Errors
/// As [`reshard`].
pub fn reshard_with_options(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    world_size: usize,
    options: &ReshardOptions,
) -> Result<ReshardSummary> {
    let (src, dst) = (src.as_ref(), dst.as_ref());
    let (format, adaptor, plan) = check(src, dst, world_size, options.overwrite)?;
    let (tensors, bytes) = count(adaptor, src, &options.limits)?;
    let at = plan.path(dst);
    adaptor.reshard(src, at, world_size, &options.limits).inspect_err(|_| destination::abandon(&plan))?;
    destination::commit(&plan, dst, true).inspect_err(|_| destination::abandon(&plan))?;
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

/// [`check_format`], then the world size and the destination ([`destination::check`]: new, empty, or a
/// checkpoint of the format, or anything with `overwrite`).
pub(crate) fn check(
    src: &Path,
    dst: &Path,
    world_size: usize,
    overwrite: bool,
) -> Result<(Format, &'static dyn Adaptor, Plan)> {
    let (format, adaptor) = check_format(src)?;
    if world_size == 0 {
        return Err(Error::InvalidArgument {
            path: dst.to_path_buf(),
            reason: "the world size must be at least 1".into(),
        });
    }
    let plan = destination::check(dst, format, overwrite)?;
    Ok((format, adaptor, plan))
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
