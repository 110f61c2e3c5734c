//! The `.metadata` file: DCP's `Metadata` dataclass and everything it holds, as typed Rust values, with a
//! decoder for every layout torch 2.0 to 2.15 writes and an encoder for two writer profiles.
//!
//! One decoder builds the [`Metadata`] as the pickle machine runs the pickle, each DCP object into its
//! struct when its state is set (`__setstate__`), the three objects of every chunk read straight from their
//! bytes (a large job's 400,000 chunks in about 1.8 µs each), holding only what is still open.
//!
//! The types are here; [`Metadata::from_pickle`] is in the decoder's module, [`Metadata::to_pickle`] in the
//! encoder's (they use the types, the types do not use them).
//!
//! | Python class | Rust type |
//! |---|---|
//! | `torch.distributed.checkpoint.metadata.Metadata` | [`Metadata`] |
//! | `…metadata.TensorStorageMetadata` | [`TensorStorageMetadata`] |
//! | `…metadata.BytesStorageMetadata` | [`StorageMetadata::Bytes`] |
//! | `…metadata.ChunkStorageMetadata` | [`ChunkStorageMetadata`] |
//! | `…metadata.TensorProperties` (2.3+) or `torch.distributed._shard.sharded_tensor.metadata.TensorProperties` (2.0-2.2) | [`TensorProperties`] |
//! | `…metadata.MetadataIndex` | [`MetadataIndex`] |
//! | `torch.distributed.checkpoint.filesystem._StorageInfo` | [`StorageInfo`] |
//! | `…metadata.StorageMeta` (2.4+) | [`StorageMeta`] |

mod decode;
mod encode;

use ckpt_tensor::{DType, PathItem, Value};

pub use encode::Profile;

/// Module of the DCP metadata classes.
pub(crate) const METADATA_MODULE: &str = "torch.distributed.checkpoint.metadata";
/// Module of `TensorProperties` / `MEM_FORMAT_ENCODING` in torch 2.0-2.2 (still present in later releases).
pub(crate) const LEGACY_PROPERTIES_MODULE: &str = "torch.distributed._shard.sharded_tensor.metadata";
/// Module of `_StorageInfo`.
pub(crate) const FILESYSTEM_MODULE: &str = "torch.distributed.checkpoint.filesystem";
/// The only stream transform torch defines (2.7+).
pub const ZSTD_TRANSFORM: &str = "stream.zstd/1";
/// `CURRENT_DCP_VERSION` (torch 2.9+).
pub const DCP_VERSION: &str = "1.0.0";

/// `planner_data`: flattened key → path into the nested state dict, in the file's order.
pub type PlannerData = Vec<(String, Vec<PathItem>)>;

/// The decoded `.metadata`: what every key is, where its items are, and how keys nest.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Metadata {
    /// Flattened key → what it stores, in the file's order.
    pub state_dict_metadata: Vec<(String, StorageMetadata)>,
    /// Flattened key → path into the nested state dict (`('model', 'w')`, list indices as ints). `None` when
    /// the checkpoint was saved with `flatten_state_dict=False` (or by the Hugging Face writer). Entries
    /// whose value is not a tuple of str/int (custom planners) are left out.
    pub planner_data: Option<PlannerData>,
    /// One entry per item written: which (key, chunk) it is and where its bytes are, in the file's order.
    pub storage_data: Vec<(MetadataIndex, StorageInfo)>,
    /// Provenance written by torch 2.4+ (`None` when absent).
    pub storage_meta: Option<StorageMeta>,
    /// `"1.0.0"` from torch 2.9 on; `None` before.
    pub version: Option<String>,
}

/// What a flattened key stores.
#[derive(Debug, Clone, PartialEq)]
pub enum StorageMetadata {
    /// A tensor, stored as one or more chunks.
    Tensor(TensorStorageMetadata),
    /// Any other value (BYTE_IO): one `torch.save` item holding the pickled object.
    Bytes,
}

impl StorageMetadata {
    /// The tensor metadata, if this is a tensor.
    pub fn as_tensor(&self) -> Option<&TensorStorageMetadata> {
        match self {
            StorageMetadata::Tensor(t) => Some(t),
            StorageMetadata::Bytes => None,
        }
    }
}

/// `TensorStorageMetadata`: a tensor's properties, global shape and chunks.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorStorageMetadata {
    /// Dtype and friends.
    pub properties: TensorProperties,
    /// Global shape.
    pub size: Vec<usize>,
    /// The stored chunks, in global coordinates (`chunks[i]` is `MetadataIndex.index == i`).
    pub chunks: Vec<ChunkStorageMetadata>,
}

impl TensorStorageMetadata {
    /// Number of elements of the whole tensor, or `None` on overflow.
    pub fn numel(&self) -> Option<usize> {
        ckpt_tensor::checked_numel(&self.size)
    }

    /// Bytes of the whole tensor, or `None` on overflow.
    pub fn nbytes(&self) -> Option<usize> {
        self.numel()?.checked_mul(self.properties.dtype.size())
    }
}

/// `ChunkStorageMetadata`: one stored box of a tensor, `offsets .. offsets + sizes` per dimension. A chunk
/// may be empty (a size of 0, with an offset up to the dimension's length).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChunkStorageMetadata {
    /// Global offset of the box in each dimension.
    pub offsets: Vec<usize>,
    /// Extent of the box in each dimension.
    pub sizes: Vec<usize>,
}

impl ChunkStorageMetadata {
    /// Number of elements, or `None` on overflow.
    pub fn numel(&self) -> Option<usize> {
        ckpt_tensor::checked_numel(&self.sizes)
    }
}

/// Memory format recorded in `TensorProperties` (`_MEM_FORMAT_ENCODING`). Writers always record
/// contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MemoryFormat {
    /// `torch.contiguous_format` (0).
    #[default]
    Contiguous,
    /// `torch.channels_last` (1).
    ChannelsLast,
    /// `torch.preserve_format` (2).
    Preserve,
}

impl MemoryFormat {
    /// The enum value torch pickles.
    pub fn code(self) -> i64 {
        match self {
            MemoryFormat::Contiguous => 0,
            MemoryFormat::ChannelsLast => 1,
            MemoryFormat::Preserve => 2,
        }
    }

    /// The format for an enum value.
    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            0 => Some(MemoryFormat::Contiguous),
            1 => Some(MemoryFormat::ChannelsLast),
            2 => Some(MemoryFormat::Preserve),
            _ => None,
        }
    }
}

/// `TensorProperties`: dtype, layout, flags and (torch 2.15+) the local chunk's strides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorProperties {
    /// Element type.
    pub dtype: DType,
    /// Layout name without `torch.` (`strided`).
    pub layout: String,
    /// `requires_grad` of the saved tensor.
    pub requires_grad: bool,
    /// Memory format.
    pub memory_format: MemoryFormat,
    /// `pin_memory` of the saved tensor.
    pub pin_memory: bool,
    /// Strides of the first chunk saved (torch 2.15's sixth tuple element); `None` before 2.15.
    pub strides: Option<Vec<usize>>,
    /// Whether the pickle used the torch 2.0-2.2 class `torch.distributed._shard.sharded_tensor.metadata
    /// .TensorProperties` (decode only; encoders choose by [`Profile`]).
    pub legacy_class: bool,
}

impl TensorProperties {
    /// Properties of a plain dense CPU tensor of `dtype`, as torch records them.
    pub fn new(dtype: DType) -> Self {
        TensorProperties {
            dtype,
            layout: "strided".into(),
            requires_grad: false,
            memory_format: MemoryFormat::Contiguous,
            pin_memory: false,
            strides: None,
            legacy_class: false,
        }
    }
}

/// `MetadataIndex`: names one item: a key, and for a tensor chunk its global offsets. `index` is a hint
/// (the chunk's position); torch compares and hashes on `(fqn, offset)` only.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MetadataIndex {
    /// Flattened key.
    pub fqn: String,
    /// Chunk offsets for a tensor item; `None` for a BYTE_IO item.
    pub offset: Option<Vec<usize>>,
    /// Position of the chunk in `TensorStorageMetadata.chunks`, if recorded.
    pub index: Option<usize>,
}

impl MetadataIndex {
    /// Whether two indexes name the same item (`fqn` and `offset`; `index` is a hint).
    pub fn same_item(&self, other: &MetadataIndex) -> bool {
        self.fqn == other.fqn && self.offset == other.offset
    }
}

/// `_StorageInfo`: where an item's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StorageInfo {
    /// Data file, relative to the checkpoint directory (`__0_0.distcp`).
    pub relative_path: String,
    /// Offset of the item in the file.
    pub offset: u64,
    /// Length of the item in the file (of the transformed bytes when transforms apply).
    pub length: u64,
    /// Stream transforms applied to the item, in the order the reader undoes them (`["stream.zstd/1"]`).
    pub transform_descriptors: Vec<String>,
}

/// `StorageMeta` (torch 2.4+): provenance of a save. Readers ignore it.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageMeta {
    /// The path the checkpoint was saved under, as given to `dcp.save` (a `pathlib.PosixPath` is decoded
    /// to its string); never used to locate data.
    pub checkpoint_id: Value,
    /// Random uuid4 of the save.
    pub save_id: Option<String>,
    /// Always `None` on disk.
    pub load_id: Option<String>,
    /// `modules` (torch 2.7+), `None` when absent.
    pub modules: Option<Vec<String>>,
}

impl Metadata {
    /// What `key` stores.
    pub fn get(&self, key: &str) -> Option<&StorageMetadata> {
        self.state_dict_metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The path of `key` in the nested state dict: `planner_data[key]`, or the key itself as a single step
    /// when there is no planner data for it (torch's `_EmptyStateDictLoadPlanner` does the same).
    pub fn path_of(&self, key: &str) -> Vec<PathItem> {
        self.planner_data
            .as_ref()
            .and_then(|p| p.iter().find(|(k, _)| k == key))
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| vec![PathItem::Key(key.to_owned())])
    }
}
