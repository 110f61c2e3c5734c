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
/// - distcp: every tensor sharded on its first dimension as `Shard(0)` over `world_size` ranks
///   ([`ckpt_distcp::shard_box`]), each rank's box read with [`ckpt_distcp::DcpReader::read_region`] and
///   written with [`ckpt_distcp::save_distributed`] (scalars and non-tensor values replicated, written once);
/// - hfai: [`ckpt_hfai::reshard`] (hfai's key split and `torch.chunk` chunking for `world_size` parts);
/// - recis: [`ckpt_recis::reshard`] (ids re-partitioned by RecIS's loader rule, `model.pt` and
///   `extra.pt` copied); a directory with a `checkpoint` list reshards its latest checkpoint.
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
        Format::Distcp => distcp(src, dst, world_size),
        #[cfg(feature = "hfai")]
        Format::Hfai => {
            ckpt_hfai::reshard(src, dst, world_size, &ckpt_hfai::ReshardOptions::default()).map(|_| ()).at(src)
        }
        #[cfg(feature = "recis")]
        Format::Recis => {
            let dir = recis_dir(src)?;
            ckpt_recis::reshard(&dir, dst, world_size, &ckpt_recis::ReshardOptions::default()).at(src)
        }
        #[allow(unreachable_patterns)]
        _ => Err(Error::FeatureDisabled { path: src.to_path_buf(), format, feature: format.feature() }),
    };
    done?;
    Ok(ReshardSummary { format, world_size, tensors, bytes })
}

/// The directory a RecIS checkpoint is in: `path`, or the latest one of its `checkpoint` list.
#[cfg(feature = "recis")]
pub(crate) fn recis_dir(path: &Path) -> Result<std::path::PathBuf> {
    if path.join("checkpoint").is_file() && !path.join("index").is_file() {
        let m = ckpt_recis::CheckpointManager::new(path);
        if let Some(id) = m.latest().at(path)? {
            return m.path_of(&id).at(path);
        }
    }
    Ok(path.to_path_buf())
}

/// DCP: one thread per new rank, each reading its `Shard(0)` box of every tensor and saving collectively.
#[cfg(feature = "distcp")]
fn distcp(src: &Path, dst: &Path, world: usize) -> Result<()> {
    use std::collections::HashMap;

    use ckpt_core::Value;
    use ckpt_distcp::{DcpReader, ShardSpec, StorageMetadata, WriteOptions, save_ranks, shard_box};

    let reader = DcpReader::open(src).at(src)?;
    let keys: Vec<String> = reader.keys().map(str::to_owned).collect();
    let rank_state = |rank: usize| -> Result<(Value, HashMap<String, ShardSpec>)> {
        let mut leaves = Vec::with_capacity(keys.len());
        let mut shards = HashMap::new();
        for key in &keys {
            let value = match reader.storage_metadata(key).at(src)? {
                StorageMetadata::Tensor(t) if !t.size.is_empty() => {
                    let (offsets, sizes) = shard_box(&t.size, 0, rank, world);
                    shards.insert(key.clone(), ShardSpec::new(&t.size, &offsets));
                    Value::Tensor(reader.read_region(key, &offsets, &sizes).at(src)?)
                }
                StorageMetadata::Tensor(_) => Value::Tensor(reader.read_tensor(key).at(src)?),
                StorageMetadata::Bytes => reader.read_value(key).at(src)?,
            };
            leaves.push((reader.path_of(key), value));
        }
        let sd = ckpt_core::unflatten(leaves).at(src)?;
        Ok((sd, shards))
    };
    // Every rank's state is read before anything is written: a read error leaves no partial checkpoint.
    let states = (0..world).map(rank_state).collect::<Result<Vec<_>>>()?;
    std::fs::create_dir_all(dst).at(dst)?;
    save_ranks(&states, dst, &WriteOptions::default()).map(|_| ()).at(dst)
}
