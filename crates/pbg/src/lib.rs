//! Read and write PyTorch-BigGraph HDF5 checkpoints (FileCheckpointStorage), with its commit protocol.
//!
//! A PBG checkpoint directory holds, per committed version `V` (`checkpoint_version.txt`), one HDF5 file
//! per entity partition (`embeddings_<entity>_<part>.v<V>.h5`: float32 `embeddings [N, D]` and the
//! `RowAdagrad` state), one model file (`model.v<V>.h5`: relation operators and global embeddings under
//! public names, the model's `Adagrad` state), `config.json`, `training_stats.json`, and `epoch_<k>/`
//! snapshots made of links. This crate reads and writes all of it so that torchbiggraph 1.0.0 loads what it
//! writes and resumes training from it.
//!
//! - [`FileCheckpointStorage`]: the original's storage operations, one for one (version file, partitions,
//!   model, config, stats, snapshots), with snapshot links that still resolve after a move.
//! - [`Commit`]: write version `V+1`, commit, snapshot, drop `V` — PBG's protocol, crash-safe, parallel.
//! - [`FileCheckpointStorage::verify`]: partial versions, missing or invalid partitions, counts.
//! - [`PbgReader`]: a whole version read (zero copy over memory maps) behind [`ckpt_tensor::CheckpointRead`].
//! - [`OptimizerState`] / [`StateDict`]: the `optimizer/state_dict` blobs, decoded and re-encoded through
//!   ckpt-torch.
//! - [`save`]: a new checkpoint from entries named as [`PbgReader`] names them (what another format keeps
//!   of a PBG checkpoint), re-partitioned to the config's layout, optimizer state rebuilt where only its
//!   tensors were kept.
//! - [`ConfigFile`]: a config and where the paths it names resolve.
//! - [`export_tsv`] (as `torchbiggraph_export_to_tsv`) and [`export_safetensors`].
//!
//! Open, read a tensor, save:
//!
//! ```
//! # let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/fixtures/pbg/ckpt");
//! # let dir = tempfile::tempdir()?; let out = dir.path().join("out");
//! use ckpt_tensor::CheckpointRead;
//! let ck = ckpt_pbg::PbgReader::open(&fixture)?;                 // the committed version, memory-mapped
//! let users = ck.tensor("embeddings/user_id/0")?;                         // float32 [N, D]
//! ckpt_pbg::save(&ck.entry_values(), &out, &ckpt_pbg::WriteOptions::default())?; // torchbiggraph resumes from it
//! # assert_eq!(ckpt_pbg::PbgReader::open(&out)?.tensor("embeddings/user_id/0")?, users);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ```
//! use ckpt_tensor::Tensor;
//! use ckpt_pbg::{PbgReader, WriteOptions, EntityPartition, FileCheckpointStorage, Model, ModelParameter,
//!     StateDict, OptimizerState};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let storage = FileCheckpointStorage::new(dir.path());
//! storage.prepare().unwrap();
//! let mut commit = storage.begin_commit().unwrap();
//! let embs = Tensor::from_slice(&[0.5f32; 6], &[3, 2]).unwrap();
//! let sum = Tensor::from_slice(&[0.0f32; 3], &[3]).unwrap();
//! let mut part = EntityPartition::new(embs);
//! part.optimizer = Some(OptimizerState::encode(&StateDict::row_adagrad(sum, 0.1)).unwrap());
//! commit.partition("user", 0, part).unwrap();
//! let real = Tensor::from_slice(&[1.0f32], &[1]).unwrap();
//! let param = ModelParameter::new("rhs_operators.0.real", real).unwrap();
//! commit.model(Model { parameters: Some(vec![param]), ..Model::default() });
//! commit.finish(&WriteOptions::default()).unwrap();
//!
//! let ckpt = PbgReader::open(dir.path()).unwrap();
//! assert_eq!(ckpt.version(), 1);
//! assert_eq!(ckpt.partition("user", 0).unwrap().data.len(), 3);
//! assert!(ckpt.model().unwrap().get("relations/0/operator/rhs/real").is_some());
//! ```
//!
//! # HDF5
//! Files go through the `hdf5-metno` crate and the system libhdf5 (found with pkg-config). Reading hands
//! out contiguous datasets as windows of a memory map, after validating every header; other layouts are
//! read through libhdf5 with conversion. Writing lets libhdf5 lay out the structure, then streams tensor
//! bytes to their offsets with positioned writes, outside libhdf5's global lock, so files are written in
//! parallel. Little-endian hosts only.
//!
//! # Safety on hostile input
//! Every file is checked for the HDF5 signature before libhdf5 sees it; dataset types, ranks and storage
//! extents are validated before any data is handed out; sizes are checked against the file; optimizer
//! blobs are decoded by ckpt-torch's safe unpickler. libhdf5 itself parses the file's structure: its own
//! robustness against crafted files is that of the system library.

mod commit;
pub mod config;
mod entity_path;
mod error;
pub mod export;
pub mod h5;
pub mod metadata;
pub mod model;
pub mod names;
mod optimizer;
pub mod partition;
mod reader;
mod save;
mod storage;
mod verify;

pub use ckpt_io::Durability;
pub use ckpt_io::{Problem, ProblemKind, SaveReport, VerifyReport};
pub use commit::{Commit, CommitReport, VersionWrite, WriteOptions};
pub use config::{Config, ConfigFile, EntityConfig, RelationConfig};
pub use entity_path::EntityStorage;
pub use error::{Error, Result};
pub use export::{export_safetensors, export_tsv};
pub use metadata::{AttrValue, Iteration, Metadata};
pub use model::{Model, ModelParameter, read_model_file, write_model_file};
pub use names::FileName;
pub use optimizer::{OptimizerState, StateDict};
pub use partition::{EntityPartition, read_partition_file, write_partition_file};
pub use reader::{PartitionEntry, PbgReader, ReadOptions};
pub use save::{OBJECT_LAYOUT, save, save_rank};
pub use storage::{FileCheckpointStorage, is_checkpoint_dir};
