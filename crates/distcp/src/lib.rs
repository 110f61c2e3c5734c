//! Read and write PyTorch Distributed Checkpoint (`torch.distributed.checkpoint`, "DCP") directories, as
//! written by torch 2.0 to 2.15, with lazy, resharding-aware reads and a writer whose default output loads in
//! every one of those releases.
//!
//! A DCP checkpoint is a directory: a `.metadata` pickle (the [`Metadata`] dataclass) and data files
//! `__{rank}_{n}.distcp` that concatenate `torch.save` archives ("items"), one per tensor chunk or
//! non-tensor value. This crate reads every layout torch has written:
//!
//! - `.metadata` pickles of protocols 2 to 5; `TensorProperties` at both module paths, as 5- or 6-tuples;
//!   `storage_meta`, `version`, `planner_data`; `MetadataIndex` / `_StorageInfo` with and without optional
//!   fields; unknown classes where a DCP class belongs are errors ([`Error::UnexpectedClass`]);
//! - items anywhere in any data file, zstd-transformed items (`stream.zstd/1`), one file per item or
//!   several per rank;
//! - per-rank `__{rank}.metadata` files without a global `.metadata` (`use_collectives=False`), merged;
//! - the Hugging Face safetensors layout (`model.safetensors.index.json`, `DCP_SHARDING_INFO`).
//!
//! [`DcpReader`] reads only the metadata when opening (and validates it whole), lists entries with dtype
//! and shape, and reads a tensor, or any *region* of it, by mapping only the items that overlap: a region
//! inside one chunk is a zero-copy view; otherwise chunks (including empty ones) are assembled. This is
//! how a job with a different number of ranks loads its own shard ([`shard_box`]). [`DcpReader::state_dict`]
//! rebuilds the nested state dict through `planner_data`.
//!
//! [`save`] / [`save_rank`] write checkpoints like `FileSystemWriter`, in the maximum-compatibility
//! [`Profile`] by default (loads in torch 2.0 to 2.15) or torch 2.13's own layout; one file per rank or
//! per item, several files per rank, zstd items; multi-rank saves coordinate through
//! [`ckpt_collective::Collective`] and write replicated items once. [`reshard`] and [`save_sharded`] write a
//! checkpoint for another world size, tensors split on their first dimension (`Shard(0)`). [`verify`] checks a checkpoint end to end;
//! [`convert`] turns checkpoints into `torch.save`, safetensors and Hugging Face shards and back, each one call
//! of the target format's writer with its write options, reading the checkpoint lazily.
//!
//! Open, read a tensor, save:
//!
//! ```
//! # let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/fixtures/distcp/golden/d215");
//! # let dir = tempfile::tempdir()?; let out = dir.path().join("out");
//! use ckpt_tensor::CheckpointRead;
//! let ck = ckpt_distcp::DcpReader::open(&fixture)?;             // torch 2.15's 2 ranks; `.metadata` only
//! let row = ck.tensor("row")?;                                          // assembled from both ranks' items
//! ckpt_distcp::save(&ck.state_dict()?, &out, &ckpt_distcp::WriteOptions::default())?; // loads in torch 2.0-2.15
//! # assert_eq!(ckpt_distcp::DcpReader::open(&out)?.tensor("row")?, row);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Compatibility, as tested
//! - Reading: the golden checkpoints of torch 2.0.1, 2.2.2, 2.4.1, 2.9.1 and 2.15.0 and fresh torch 2.13
//!   ones (1, 2 and 3 ranks, every dtype, `use_collectives=False`, Hugging Face layouts) read to the values
//!   torch wrote (`conformance/tests/distcp.rs`).
//! - Writing: [`Profile::Torch213`] reproduces torch 2.13's files byte for byte for single-process saves
//!   (`.metadata` included), and its multi-rank plans (deduplication, chunk numbering, key order);
//!   both profiles load with `dcp.load` and `dcp_to_torch_save` in torch 2.13 in the test suite, and the
//!   default profile was loaded by torch 2.0.1 and 2.4.1 as well (`examples/write_samples.rs`).
//!
//! Format reference: `shared/specs/distcp.md`.
//!
//! # Safety on hostile input
//! `.metadata` is decoded by `ckpt-pickle`, which never imports or calls anything; only the DCP classes are
//! accepted where DCP objects belong. Data file paths must stay inside the checkpoint directory; every
//! offset, length, chunk box and decompressed size is checked before use.

#![forbid(unsafe_code)]

mod chunks;
pub mod convert;
mod error;
pub mod hf;
mod item;
pub mod megatron;
pub mod metadata;
mod planner;
mod rank_save;
mod reader;
mod reshard;
mod verify;
mod writer;

pub use chunks::{shard_box, shard_range};
pub use ckpt_io::Durability;
pub use ckpt_io::{Problem, ProblemKind, ReshardReport, SaveReport, VerifyReport};
pub use error::{Error, Result};
pub use metadata::{
    ChunkStorageMetadata, MemoryFormat, Metadata, MetadataIndex, PlannerData, Profile, StorageInfo, StorageMeta,
    StorageMetadata, TensorProperties, TensorStorageMetadata,
};
pub use planner::ShardSpec;
pub use rank_save::{ItemData, RankItem, RankSave};
pub use reader::{DEFAULT_MAX_METADATA_BYTES, DcpReader, MetadataSource, ReadOptions};
pub use reshard::{RankState, ReshardOptions, reshard, save_sharded, shard_state_dict};
pub use verify::{verify, verify_structure, verify_structure_with, verify_with};
pub use writer::{OBJECT_LAYOUT, WriteOptions, save, save_rank, save_ranks, save_report};
