//! Read, write and reshard RecIS checkpoints (`alibaba/RecIS`: the `recis.serialize` C++ `Saver`/`Loader`
//! and `recis.framework.checkpoint_manager`), byte-compatibly with RecIS.
//!
//! A RecIS checkpoint directory holds:
//!
//! | file | module | what |
//! |---|---|---|
//! | `model-XXXXXX-of-YYYYYY.safetensors` | [`data_file`] | hash-table blocks (ids, embedding and optimizer slots) and sparse-side dense tensors |
//! | `index` | [`index`] | block key → data file |
//! | `tensorkey.json` | [`tensorkey`] | part name → internal block name (`child@slot^begin@end@size`) |
//! | `torch_rank_weights_embs_table_multi_shard.json` | [`torch_rank`] | informational summary |
//! | `model.pt`, `extra.pt`, `io_state_<s>.pt`, `io_state_count` | [`dense`] | torch.save state, through `ckpt-torch` |
//!
//! and its parent directory a `checkpoint` list ([`CheckpointManager`]).
//!
//! * Reading: [`SparseCheckpoint`] (the serializer's part, validated as a whole before anything is handed
//!   out, tensors zero-copy) and [`Checkpoint`] (the whole directory, a [`ckpt_core::CheckpointRead`]).
//!   A table comes back as a [`TableChild`]: ids plus one row per slot, with O(1) look-up by id.
//! * Writing: [`save`] / [`save_tables`] (one call per rank through a [`ckpt_core::Collective`]; shard 0
//!   merges), or [`write_shard_files`] + [`write_meta`]. For the same blocks in the same order the data
//!   files, `index` and `tensorkey.json` are byte-identical to RecIS's.
//! * [`reshard()`]: any shard count into any other, keeping id `x` in the shard whose slice holds
//!   `(x as u64) % slice_size` ([`IdPartition`] explains negative ids).
//! * [`CheckpointManager`]: `ckpt_<step>` directories, the `checkpoint` list, `max_keep` rotation read from
//!   disk, atomic commits.
//!
//! ```
//! use ckpt_core::{SingleProcess, Tensor};
//! use ckpt_recis::{HashTable, SaveOptions, SliceInfo, Slot, SparseCheckpoint, TableChild, save_tables};
//! let dir = tempfile::tempdir().unwrap();
//! let emb = Tensor::from_slice(&[5.0f32, 5.5, 1.0, 1.5], &[2, 2]).unwrap();
//! let adam = Tensor::from_slice(&[0.1f32, 0.1, 0.2, 0.2], &[2, 2]).unwrap();
//! let tbl = TableChild::new(
//!     "tbl",
//!     vec![5, 1],
//!     vec![Slot::new("embedding", emb).unwrap(), Slot::new("sparse_adamw_exp_avg", adam).unwrap()],
//! )
//! .unwrap();
//! let tables = [HashTable::single(SliceInfo::full(65536).unwrap(), tbl)];
//! let step = ("sparse_adamw_step".to_string(), Tensor::from_slice(&[42i64], &[1]).unwrap());
//! save_tables(dir.path(), &SingleProcess, &tables, &[step], &SaveOptions::default()).unwrap();
//!
//! let ckpt = SparseCheckpoint::open(dir.path()).unwrap();
//! assert_eq!(ckpt.tensor_names(), ["tbl@id", "tbl@embedding", "tbl@sparse_adamw_exp_avg", "sparse_adamw_step"]);
//! let t = ckpt.child("tbl").unwrap();
//! let k = t.position(1).unwrap().unwrap();
//! assert_eq!(t.slot("embedding").unwrap().row(k).unwrap().to_vec::<f32>().unwrap(), [1.0, 1.5]);
//! ```
//!
//! # Safety on hostile input
//! Every length, offset and count read from a file is checked before it is used: header lengths against
//! the file (and a 100 MB cap), offsets against dtype × shape and the data region (blocks must tile it),
//! file names in `index` must be plain names inside the directory, row counts against id counts. Errors say
//! which file and block broke which rule ([`Error`]).

pub mod checkpoint;
pub mod data_file;
pub mod dense;
pub mod dtype;
mod error;
pub mod index;
pub mod manager;
pub mod name;
pub mod reader;
pub mod reshard;
pub mod table;
pub mod tensorkey;
pub mod torch_rank;
pub mod writer;

pub use checkpoint::Checkpoint;
pub use data_file::DataFile;
pub use error::{Error, Result};
pub use index::Index;
pub use manager::{CheckpointManager, ShardState, checkpoint_id, checkpoint_step};
pub use name::{BlockSlice, DEFAULT_SLICE_SIZE, IdPartition, Shard, SliceInfo, gen_slice};
pub use reader::{BlockRecord, SparseCheckpoint};
pub use reshard::{ReshardOptions, load_shard, reshard, reshard_dir, write_sharded};
pub use table::{HashTable, Slot, TableChild, coalesce};
pub use tensorkey::TensorKey;
pub use writer::{
    Block, SaveOptions, ShardMeta, save, save_tables, shard_blocks, table_blocks, write_meta, write_shard_files,
};
