//! What the operations take that adaptors see too: a conversion's options ([`ConvertOptions`]: the
//! target's layout, the selection, the limits, how the source is read) and a verification's depth; and
//! [`named`], the one table of every option by name and the one parser from `(name, text)` pairs to them, which
//! the `ckpt` tool and the Python package share (a format's options are named here, beside its variant).

use ckpt_io::Durability;
use std::path::PathBuf;

use crate::format::Format;
use crate::limits::ReadLimits;
use crate::select::Selection;
use crate::source::SourceOptions;

pub mod named;

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

/// Choices for a conversion ([`crate::convert`]): the target's number of ranks, what of the source is
/// converted and how it is read, and the options of the target format in that format's own variant of
/// [`TargetOptions`].
///
/// ```
/// use ckpt::{ConvertOptions, DcpProfile, TargetOptions};
/// let options = ConvertOptions::default()
///     .with_world_size(4)
///     .with_target(TargetOptions::Distcp { profile: DcpProfile::Torch213 });
/// assert_eq!(options.world_size, 4);
/// assert_eq!(options.target.format(), Some(ckpt::Format::Distcp));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConvertOptions {
    /// Number of ranks/shards/parts for distcp, hfai, recis and pbg targets (default 1); ignored by
    /// single-file targets (torch, safetensors).
    pub world_size: usize,
    /// The options of the target format (default: that format's defaults). A variant of another format than
    /// the conversion's target is refused ([`crate::Error::InvalidArgument`]).
    pub target: TargetOptions,
    /// Every target: which entries to convert, under which names, in which float dtype (default: all, as
    /// they are). See [`Selection`] (`ckpt convert --include/--exclude/--strip-prefix/--add-prefix/--dtype`).
    pub selection: Selection,
    /// The resource limits the source is read under (default [`ReadLimits::default`]).
    pub limits: ReadLimits,
    /// How the source is read: a DeepSpeed root's tag, Megatron's layers unstacked, a name map
    /// ([`SourceOptions`]).
    pub source: SourceOptions,
    /// Every target: how durably it is written (default: synced, checksummed, `O_DIRECT`;
    /// [`Durability`]), the target format's `WriteOptions::durability` (`ckpt convert --no-sync`,
    /// `--no-checksums`).
    pub durability: Durability,
    /// Replace whatever stands at the destination, whole (default `false`: a destination must be new, an
    /// empty directory, or a checkpoint of the target format, else the write is refused with
    /// [`crate::Error::DestinationTaken`]). Crash-safe: the old content is removed only after the new is
    /// committed, and nothing of it is kept (`ckpt convert --overwrite`).
    pub overwrite: bool,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            world_size: 1,
            target: TargetOptions::default(),
            selection: Selection::default(),
            limits: ReadLimits::default(),
            source: SourceOptions::default(),
            durability: Durability::default(),
            overwrite: false,
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

    /// Sets the options of the target format.
    #[must_use]
    pub fn with_target(mut self, target: TargetOptions) -> Self {
        self.target = target;
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

    /// Sets how durably the target is written ([`ConvertOptions::durability`]).
    ///
    /// ```
    /// use ckpt::{ConvertOptions, io::Durability};
    /// let scratch = ConvertOptions::default().with_durability(Durability::default().with_sync(false));
    /// assert!(!scratch.durability.sync && scratch.durability.checksums);
    /// ```
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
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

    /// Sets whether whatever stands at the destination is replaced whole ([`ConvertOptions::overwrite`]).
    #[must_use]
    pub fn with_overwrite(mut self, overwrite: bool) -> Self {
        self.overwrite = overwrite;
        self
    }
}

/// The options of one target format, in that format's variant, as `image`'s output formats carry theirs.
/// Formats without options of their own (torch, safetensors) take [`TargetOptions::Defaults`], as every
/// format does by default.
///
/// ```
/// use ckpt::{Format, TargetOptions};
/// let hf = TargetOptions::Hf { max_shard_size: Some(2 << 30) };
/// assert_eq!(hf.format(), Some(Format::Hf));
/// assert_eq!(TargetOptions::Defaults.format(), None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TargetOptions {
    /// The target format's defaults.
    #[default]
    Defaults,
    /// A `torch.distributed.checkpoint` target.
    Distcp {
        /// The `.metadata` layout (`ckpt convert --dcp-profile`).
        profile: DcpProfile,
    },
    /// An hfai target.
    Hfai {
        /// Tensors of more bytes than this are flattened and split over the parts (default: hfai's 256 MiB;
        /// `--hfai-large-size`).
        large_size: Option<u64>,
    },
    /// A RecIS target.
    Recis {
        /// Data files per shard (RecIS's `parallel`; default: the source's for a RecIS source, else 4, as
        /// RecIS's checkpoint manager; `--parallel`).
        parallel: Option<usize>,
        /// The id key space of every hash table (RecIS's `slice_size`; default: each table's own for a RecIS
        /// source, else RecIS's 65536; `--slice-size`).
        slice_size: Option<u32>,
    },
    /// A PyTorch-BigGraph target.
    Pbg {
        /// The training `config.json` that defines the layout (entity types and their partition counts,
        /// relations, dimension). Default: the source's own config (its `config` entry; `--pbg-config`).
        config: Option<PathBuf>,
    },
    /// A Hugging Face sharded target.
    Hf {
        /// The largest shard in bytes (default 5 GB, as transformers; `ckpt::hf::parse_size` reads `5GB`,
        /// `500MB`, `2GiB`; `--max-shard-size`).
        max_shard_size: Option<u64>,
    },
    /// A GGUF target.
    Gguf {
        /// The ggml type of the float tensors of two or more dimensions whose rows are whole blocks of it:
        /// `f32`, `f16`, `bf16`, `q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1` or `mxfp4` (`--quant`); default: every tensor in
        /// its own type.
        quant: Option<String>,
    },
}

impl TargetOptions {
    /// The options of a conversion to `to`, from those offered for every format, each with the name of the
    /// first of its options the caller set (`None`: all left to their defaults): `to`'s own, or
    /// [`TargetOptions::Defaults`] when none is offered. How the `ckpt` tool's flags and the Python
    /// package's keyword arguments become options ([`crate::named_options`]).
    ///
    /// ```
    /// use ckpt::{Format, TargetOptions};
    /// let offered = [(TargetOptions::Hfai { large_size: Some(16) }, Some("--hfai-large-size"))];
    /// assert_eq!(TargetOptions::pick(Format::Hfai, offered.clone()).unwrap(), offered[0].0.clone());
    /// let refused = TargetOptions::pick(Format::Distcp, offered).unwrap_err();
    /// assert!(matches!(refused, ckpt::Error::OptionNotApplicable { .. }));
    /// assert_eq!(
    ///     refused.to_string(),
    ///     "option --hfai-large-size does not apply: it is an option of hfai targets; this conversion writes distcp; leave it out"
    /// );
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::OptionNotApplicable`] naming an option set for another format than `to`.
    pub fn pick<'a>(
        to: Format,
        offered: impl IntoIterator<Item = (TargetOptions, Option<&'a str>)>,
    ) -> crate::error::Result<TargetOptions> {
        let mut chosen = TargetOptions::Defaults;
        for (options, given) in offered {
            match (options.format(), given) {
                (Some(f), _) if f == to => chosen = options,
                (Some(f), Some(name)) => {
                    return Err(crate::error::Error::OptionNotApplicable {
                        option: name.to_owned(),
                        reason: format!("it is an option of {f} targets; this conversion writes {to}"),
                    });
                }
                _ => {}
            }
        }
        Ok(chosen)
    }

    /// The format these options are for (`None` for [`TargetOptions::Defaults`], which fits every format).
    pub fn format(&self) -> Option<Format> {
        match self {
            TargetOptions::Defaults => None,
            TargetOptions::Distcp { .. } => Some(Format::Distcp),
            TargetOptions::Hfai { .. } => Some(Format::Hfai),
            TargetOptions::Recis { .. } => Some(Format::Recis),
            TargetOptions::Pbg { .. } => Some(Format::Pbg),
            TargetOptions::Hf { .. } => Some(Format::Hf),
            TargetOptions::Gguf { .. } => Some(Format::Gguf),
        }
    }
}

/// How much [`verify_with`](crate::verify_with) checks.
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
