//! What the operations take that adaptors see too: a conversion's options ([`ConvertOptions`]: the
//! target's layout, the selection, the limits, how the source is read) and a verification's depth.

use std::path::PathBuf;

use crate::limits::ReadLimits;
use crate::select::Selection;
use crate::source::SourceOptions;

/// The `.metadata` layout of distcp targets (`ckpt convert --dcp-profile`: `max-compat`, `torch213`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[non_exhaustive]
pub enum DcpProfile {
    /// Loads in every torch from 2.0 to 2.15 (the default).
    #[default]
    MaxCompat,
    /// torch 2.13's own layout, byte for byte.
    Torch213,
}

/// Choices for the target layout of [`convert`].
///
/// ```
/// let options = ckpt::ConvertOptions::default().with_world_size(4).with_dcp_profile(ckpt::DcpProfile::Torch213);
/// assert_eq!(options.world_size, 4);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConvertOptions {
    /// Number of ranks/shards/parts for distcp, hfai and recis targets (default 1); ignored by single-file
    /// targets (torch, safetensors).
    pub world_size: usize,
    /// The `.metadata` layout of distcp targets.
    pub dcp_profile: DcpProfile,
    /// hfai targets: tensors of more bytes than this are flattened and split over the parts (default: hfai's
    /// 256 MiB).
    pub hfai_large_size: Option<u64>,
    /// recis targets: data files per shard (RecIS's `parallel`; default: the source's for a RecIS source,
    /// else 4, as RecIS's checkpoint manager).
    pub recis_parallel: Option<usize>,
    /// recis targets: the id key space of every hash table (RecIS's `slice_size`; default: each table's own
    /// for a RecIS source, else RecIS's 65536).
    pub recis_slice_size: Option<u32>,
    /// pbg targets: the training `config.json` that defines the target layout (entity types and their
    /// partition counts, relations, dimension). Default: the source's own config (its `config` entry).
    pub pbg_config: Option<PathBuf>,
    /// hf targets: the largest shard in bytes (default 5 GB, as transformers; [`crate::hf::parse_size`] reads
    /// `5GB`, `500MB`, `2GiB`).
    pub hf_max_shard_size: Option<u64>,
    /// Every target: which entries to convert, under which names, in which float dtype (default: all, as
    /// they are). See [`Selection`] (`ckpt convert --include/--exclude/--strip-prefix/--add-prefix/--dtype`).
    pub selection: Selection,
    /// The resource limits the source is read under (default [`ReadLimits::default`]).
    pub limits: ReadLimits,
    /// How the source is read: a DeepSpeed root's tag, Megatron's layers unstacked, a name map
    /// ([`SourceOptions`]).
    pub source: SourceOptions,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            world_size: 1,
            dcp_profile: DcpProfile::default(),
            hfai_large_size: None,
            recis_parallel: None,
            recis_slice_size: None,
            pbg_config: None,
            hf_max_shard_size: None,
            selection: Selection::default(),
            limits: ReadLimits::default(),
            source: SourceOptions::default(),
        }
    }
}

impl ConvertOptions {
    /// Sets the number of ranks/shards/parts of the target.
    #[must_use]
    pub fn with_world_size(mut self, n: usize) -> Self {
        self.world_size = n;
        self
    }

    /// Sets the `.metadata` layout of distcp targets.
    #[must_use]
    pub fn with_dcp_profile(mut self, profile: DcpProfile) -> Self {
        self.dcp_profile = profile;
        self
    }

    /// Sets the size above which hfai targets split a tensor over the parts.
    #[must_use]
    pub fn with_hfai_large_size(mut self, bytes: u64) -> Self {
        self.hfai_large_size = Some(bytes);
        self
    }

    /// Sets the number of data files per shard of recis targets.
    #[must_use]
    pub fn with_recis_parallel(mut self, parallel: usize) -> Self {
        self.recis_parallel = Some(parallel);
        self
    }

    /// Sets the id key space (`slice_size`) of every hash table of recis targets.
    #[must_use]
    pub fn with_recis_slice_size(mut self, slice_size: u32) -> Self {
        self.recis_slice_size = Some(slice_size);
        self
    }

    /// Sets the largest shard of hf targets, in bytes.
    #[must_use]
    pub fn with_hf_max_shard_size(mut self, bytes: u64) -> Self {
        self.hf_max_shard_size = Some(bytes);
        self
    }

    /// Sets which entries to convert, under which names, in which float dtype.
    ///
    /// ```
    /// use ckpt::{ConvertOptions, DType, Selection};
    /// let only_model = Selection::default().with_include("model.*").with_strip_prefix("model.").with_dtype(DType::BF16);
    /// let options = ConvertOptions::default().with_selection(only_model);
    /// assert!(options.selection.keeps("model.fc.weight") && !options.selection.keeps("optimizer.state.0.step"));
    /// ```
    #[must_use]
    pub fn with_selection(mut self, selection: Selection) -> Self {
        self.selection = selection;
        self
    }

    /// Sets the resource limits the source is read under.
    #[must_use]
    pub fn with_limits(mut self, limits: ReadLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Sets how the source is read (a DeepSpeed root's tag, Megatron's layers unstacked, a name map).
    #[must_use]
    pub fn with_source(mut self, source: SourceOptions) -> Self {
        self.source = source;
        self
    }

    /// Sets the `config.json` that defines the layout of pbg targets.
    #[must_use]
    pub fn with_pbg_config(mut self, config: impl Into<PathBuf>) -> Self {
        self.pbg_config = Some(config.into());
        self
    }
}

/// How much [`verify_with`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Depth {
    /// The structure, without reading tensor data: every header and metadata parsed, every entry resolved
    /// (its storage or item present, inside its file, large enough for its dtype and shape), every file a
    /// checkpoint references present with the right size, and the checksum manifest consistent with the
    /// files it lists. Fast (reads headers only); misses changed bytes inside tensor data.
    Structure,
    /// [`Depth::Structure`], then every byte of every file read and every checksum the format has checked:
    /// ZIP CRC-32s of `torch.save` records (torch, DCP items, hfai parts, RecIS `.pt` files), ckpt's
    /// checksum manifest (`ckpt.checksums.json`, beside distcp, hfai, recis and pbg checkpoints), and the
    /// per-tensor checksums ckpt records in safetensors headers (single files and hf shards).
    #[default]
    Deep,
}
