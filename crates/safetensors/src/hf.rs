//! Hugging Face sharded safetensors checkpoints: `model-00001-of-0000N.safetensors` files and
//! `model.safetensors.index.json` (`{"metadata": {"total_size": ...}, "weight_map": {tensor: file}}`), or a
//! single `model.safetensors`, as `transformers`' `save_pretrained` and `huggingface_hub`'s
//! `save_torch_state_dict` write them.
//!
//! - [`HfReader`] opens such a directory (every shard memory-mapped, the index checked against the files)
//!   and lists its tensors, and the values ckpt recorded ([`crate::metadata`]).
//! - [`save`] (or [`save_entries`], entry by entry; [`save_rank`] over a process group) writes one, sharded exactly as `huggingface_hub.split_torch_state_dict_into_shards`
//!   shards (module [`shard`]), atomically (a staging directory beside the destination, then a rename).
//! - [`RankSave`] is one rank's part of a save whose plan and data travel by other means (a sharded
//!   training job's `dcp.save` through `ckpt.dcp.Writer(path, to="hf")`), planned by [`layout`].
//! - [`parse_size`] reads `--max-shard-size` values as `transformers` does (`5GB`, `500MB`, `2GiB`).
//!
//! torch's DCP `HuggingFaceStorageWriter` writes the same file names with `DCP_SHARDING_INFO` in every
//! file's `__metadata__` (and `shard-*` names per rank): that layout is a DCP checkpoint, `ckpt-distcp`'s.
//!
//! Open, read a tensor, save:
//!
//! ```
//! # let dir = tempfile::tempdir()?;
//! use ckpt_tensor::{CheckpointRead, PathItem, Tensor, Value};
//! let w = Value::Tensor(Tensor::from_slice(&[1.0f32; 64], &[8, 8])?);
//! let b = Value::Tensor(Tensor::from_slice(&[0.5f32; 8], &[8])?);
//! let (pw, pb) = ([PathItem::Key("w".into())], [PathItem::Key("b".into())]);
//! let options = ckpt_safetensors::hf::WriteOptions::default().with_max_shard_size(200);
//! ckpt_safetensors::hf::save_entries([("w", &pw[..], &w), ("b", &pb[..], &b)], &dir.path().join("model"), &options)?;
//! let ck = ckpt_safetensors::hf::HfReader::open(&dir.path().join("model"))?;   // 2 shards and the index
//! assert_eq!(ck.files().len(), 2);
//! assert_eq!(ck.tensor("b")?.to_vec::<f32>()?, vec![0.5; 8]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
pub mod rank_save;
mod read;
pub mod shard;
mod write;

pub use ckpt_io::SaveReport;
pub use error::{Error, Result};
pub use rank_save::{Layout, RankSave, layout};
pub use read::HfReader;
pub use shard::{DEFAULT_MAX_SHARD_SIZE, parse_size};
pub use write::{OBJECT_LAYOUT, WriteOptions, save, save_entries, save_entries_rank, save_rank};

/// The index file of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The file of a checkpoint in one shard.
pub const SINGLE_FILE: &str = "model.safetensors";

/// The files a Hugging Face model directory holds beside its weights, as `transformers` and
/// `huggingface_hub` write them (the model's and the generation's config, the tokenizer's files, the chat
/// template, the model card): a directory of these alone is a model waiting for its weights, which a save
/// of shards completes (the writers carry them into the new directory).
pub const MODEL_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "README.md",
];
