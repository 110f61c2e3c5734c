//! Read, write and reshard RecIS checkpoints (`alibaba/RecIS`: the `recis.serialize` C++ `Saver`/`Loader`
//! and `recis.framework.checkpoint_manager`), byte-compatibly with RecIS.
//!
//! A RecIS checkpoint directory holds:
//!
//! | file | type | what |
//! |---|---|---|
//! | `model-XXXXXX-of-YYYYYY.safetensors` | [`DataFile`] | hash-table blocks (ids, embedding and optimizer slots) and sparse-side dense tensors |
//! | `index` | [`Index`] | block key → data file |
//! | `tensorkey.json` | [`TensorKey`] | part name → internal block name (`child@slot^begin@end@size`) |
//! | `torch_rank_weights_embs_table_multi_shard.json` | [`RankEntry`](torch_rank::RankEntry) | informational summary |
//! | `model.pt`, `extra.pt`, `io_state_<s>.pt`, `io_state_count` | [`read_model`](dense::read_model), [`write_model`](dense::write_model), ... | torch.save state, through `ckpt-torch` |
//!
//! and its parent directory a `checkpoint` list ([`CheckpointManager`]).
//!
//! * Reading: [`SparseCheckpoint`] (the serializer's part, validated as a whole before anything is handed
//!   out, tensors zero-copy) and [`RecisReader`] (the whole directory, a [`ckpt_tensor::CheckpointRead`]).
//!   A table comes back as a [`TableChild`](table::TableChild): ids plus one row per slot, with O(1) look-up by id.
//! * Writing: [`save_blocks`](writer::save_blocks) / [`save_tables`](writer::save_tables) (one call per rank through a [`ckpt_collective::Collective`]; shard 0
//!   merges), or [`write_shard_files`](writer::write_shard_files) + [`write_meta`](writer::write_meta). For the same blocks in the same order the data
//!   files, `index` and `tensorkey.json` are byte-identical to RecIS's.
//! * [`reshard`] / [`reshard_sparse`]: any shard count into any other, keeping id `x` in the shard whose slice holds
//!   `(x as u64) % slice_size` ([`IdPartition`](name::IdPartition) explains negative ids).
//! * [`CheckpointManager`]: `ckpt_<step>` directories, the `checkpoint` list, `max_keep` rotation read from
//!   disk, atomic commits. Every function taking a path to read accepts an output root for its latest
//!   checkpoint ([`checkpoint_dir`] has the rule).
//! * [`save`]: any state dict laid out as RecIS lays out a checkpoint (tables, `model.pt`, `extra.pt`);
//!   [`save_rank`] and [`reshard_rank`] do [`save`] and [`reshard`] one call per rank (each rank reads and
//!   writes only its shard's data files; rank 0 merges the metadata and commits);
//!   [`verify`]: the `torch.save` files' CRC-32s.
//!
//! Open, read a tensor, save:
//!
//! ```
//! # let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/fixtures/recis/golden/two_shard_adamw");
//! # let dir = tempfile::tempdir()?; let out = dir.path().join("out");
//! use ckpt_tensor::CheckpointRead;
//! let ck = ckpt_recis::RecisReader::open(&fixture)?;             // RecIS's own 2-shard checkpoint
//! let ids = ck.tensor("tbl@id")?;                                         // the table's ids, slices concatenated
//! ckpt_recis::save(&ck.state_dict()?, &out, &ckpt_recis::WriteOptions::default().with_world_size(3))?; // 3 shards
//! # assert_eq!(ckpt_recis::RecisReader::open(&out)?.sparse().child("tbl")?.len(), ids.numel());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ```
//! use ckpt_tensor::Tensor;
//! use ckpt_collective::SingleProcess;
//! use ckpt_recis::name::SliceInfo;
//! use ckpt_recis::table::TableChild;
//! use ckpt_recis::writer::save_tables;
//! use ckpt_recis::{HashTable, Slot, SparseCheckpoint, WriteOptions};
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
//! save_tables(&tables, &[step], dir.path(), &WriteOptions::default(), &SingleProcess).unwrap();
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

#![forbid(unsafe_code)]

pub mod data_file;
pub mod dense;
mod dtype;
mod error;
mod files;
mod index;
pub mod manager;
pub mod name;
mod options;
mod reader;
mod reshard;
mod sparse;
mod state_dict;
pub mod table;
mod tensorkey;
pub mod torch_rank;
mod verify;
pub mod writer;

pub use ckpt_io::Durability;
pub use ckpt_io::{Problem, ProblemKind, ReshardReport, SaveReport, VerifyReport};
pub use data_file::{DataFile, HeaderEntry};
pub use dense::{EXTRA_FILE, MODEL_FILE};
pub use error::{Error, IndexRule, NameRule, Result, SliceRule, SlotRule, TensorKeyRule};
pub use index::{INDEX_FILE, Index};
pub use manager::{CHECKPOINT_LIST, CheckpointManager, checkpoint_dir};
pub use name::{DEFAULT_SLICE_SIZE, Shard};
pub use options::MAX_HEADER_LEN;
pub use options::ReadOptions;
pub use reader::RecisReader;
pub use reshard::{ReshardOptions, load_shard, reshard, reshard_rank, reshard_sparse, write_sharded};
pub use sparse::{BlockRecord, SparseCheckpoint};
pub use state_dict::{save, save_rank};
pub use table::{HashTable, Slot};
pub use tensorkey::{TENSORKEY_FILE, TensorKey};
pub use verify::verify;
pub use writer::{OBJECT_LAYOUT, WriteOptions};
