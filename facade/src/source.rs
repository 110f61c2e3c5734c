//! How a training checkpoint is read ([`SourceOptions`]): which save of a DeepSpeed checkpoint root, whether
//! Megatron's layer-stacked tensors are split per layer, and under which names a model's tensors appear.
//! Formats they do not apply to ignore them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ckpt_io::storage::RangeFill;

/// The fill hook of the partial local copy at one path ([`SourceOptions::with_fill`]). Equal when it is the
/// same hook for the same path.
#[derive(Debug, Clone)]
pub struct PathFill {
    /// The local path of the copy (as opened).
    pub path: PathBuf,
    /// What fills its bytes before they are read.
    pub fill: Arc<dyn RangeFill>,
}

impl PartialEq for PathFill {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path && Arc::ptr_eq(&self.fill, &other.fill)
    }
}

impl Eq for PathFill {}

/// A standard mapping of a training framework's tensor names onto a model family's Hugging Face names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[non_exhaustive]
pub enum NameMap {
    /// Megatron-Core GPT → Llama-style names (`model.layers.<i>.self_attn.q_proj.weight`, ...): `linear_qkv`
    /// split into `q_proj`/`k_proj`/`v_proj` by the head layout in `args` (`num_attention_heads`,
    /// `num_query_groups`, `kv_channels`), a gated `linear_fc1` into `gate_proj`/`up_proj`. Implies
    /// unstacked layers.
    Llama,
}

/// How a checkpoint is read: the tag of a DeepSpeed root, Megatron's layer-stacked tensors split per layer,
/// a name map. The default reads every checkpoint as it is.
///
/// ```
/// let source = ckpt::SourceOptions::default().with_tag("global_step2").with_unstack_layers(true);
/// assert_eq!(source.tag.as_deref(), Some("global_step2"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SourceOptions {
    /// deepspeed: the tag directory to read under a checkpoint root (default: the one `latest` names).
    pub tag: Option<String>,
    /// megatron: tensors stacked over layers (`decoder.layers.<name>` with a leading layer axis) as one
    /// entry per layer, `decoder.layers.<i>.<name>`.
    pub unstack_layers: bool,
    /// megatron: a mapping of the model's tensor names (and layouts) onto a Hugging Face model family's.
    pub name_map: Option<NameMap>,
    /// The checkpoint is opened to list its entries, from a partial copy (what an object store's listing
    /// fetch leaves: `ckpt::storage::Fetch::Index`): readers take on trust the parts they do not read
    /// (torch: each ZIP record's data offset from torch's layout rule, without its local header). Read no
    /// tensor data from such a checkpoint.
    pub listing_only: bool,
    /// Checkpoints that are partial local copies (a URL fetched with `ckpt::storage::Fetch::Lazy`), each
    /// with the hook that fills the bytes a reader is about to read: the readers of DCP (and Megatron),
    /// safetensors files, Hugging Face shards, `torch.save` files, hfai parts and RecIS directories read
    /// such a copy through it (when opened and when a conversion reads it), fetching only what each read
    /// needs. Other formats are never left partial.
    pub fills: Vec<PathFill>,
    /// deepspeed, megatron: a conversion reads the model's weights only (DeepSpeed's consolidated fp32 state
    /// dict, as `zero_to_fp32` writes it; Megatron's model tensors), not the optimizer state, the 16-bit
    /// module copies, the engine and client state or `common.pt`'s values: what a model loader (Hugging
    /// Face `transformers`) takes. Default: every entry the checkpoint lists. Listing is not affected.
    pub model_only: bool,
}

impl SourceOptions {
    /// Reads the tag `tag` of a DeepSpeed checkpoint root.
    #[must_use]
    pub fn with_tag(mut self, tag: &str) -> Self {
        self.tag = Some(tag.to_owned());
        self
    }

    /// Splits Megatron's layer-stacked tensors per layer.
    #[must_use]
    pub fn with_unstack_layers(mut self, on: bool) -> Self {
        self.unstack_layers = on;
        self
    }

    /// Opens the checkpoint to list its entries only ([`SourceOptions::listing_only`]).
    #[must_use]
    pub fn with_listing_only(mut self, on: bool) -> Self {
        self.listing_only = on;
        self
    }

    /// Reads the checkpoint at `path` (a partial local copy) through `fill` ([`SourceOptions::fills`]);
    /// `None` changes nothing (a local checkpoint, or a copy fetched whole).
    #[must_use]
    pub fn with_fill(mut self, path: &Path, fill: Option<Arc<dyn RangeFill>>) -> Self {
        if let Some(fill) = fill {
            self.fills.retain(|f| f.path != path);
            self.fills.push(PathFill { path: path.to_path_buf(), fill });
        }
        self
    }

    /// The fill hook of the checkpoint at `path`, if it is a partial copy.
    pub fn fill_for(&self, path: &Path) -> Option<Arc<dyn RangeFill>> {
        self.fills.iter().find(|f| f.path == path).map(|f| Arc::clone(&f.fill))
    }

    /// Converts a training checkpoint's model weights only ([`SourceOptions::model_only`]).
    #[must_use]
    pub fn with_model_only(mut self, on: bool) -> Self {
        self.model_only = on;
        self
    }

    /// Maps a Megatron model's names onto a Hugging Face model family's.
    #[must_use]
    pub fn with_name_map(mut self, map: NameMap) -> Self {
        self.name_map = Some(map);
        self
    }
}
