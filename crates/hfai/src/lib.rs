//! Read, write and reshard the sharded checkpoints of hfai (High-Flyer AI)'s `hfai.checkpoint.dist_ckpt`:
//! a directory of `PART_{rank:03d}.pt` `torch.save` files, one per rank, with large tensors chunked across
//! them.
//!
//! - [`HfaiReader`] / [`load`]: read a directory (parts mapped and checked in parallel) and merge the
//!   parts exactly as hfai's `load` does; tensors whole in one part stay windows of its memory map.
//! - [`save`] (one process writes all parts) and [`save_rank`] (each rank of a [`ckpt_collective::Collective`]
//!   writes its own): hfai's layout, key-to-rank split and `torch.chunk` chunking, committed as a whole
//!   directory with a completion check, which hfai does not have.
//! - [`reshard`]: N parts to M parts offline, copying only chunks that span stored chunks.
//! - [`verify`]: every part's record CRC-32s; [`SaveState::from_state_dict`]: a training checkpoint's
//!   mapping laid out as hfai's `save` takes it.
//!
//! Open, read a tensor, save:
//!
//! ```
//! # let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/fixtures/hfai/single_n3/ckpt");
//! # let dir = tempfile::tempdir()?; let out = dir.path().join("out");
//! use ckpt_tensor::CheckpointRead;
//! let ck = ckpt_hfai::HfaiReader::open(&fixture)?;               // 3 parts, merged as hfai's load
//! let bias = ck.tensor("model.module.encoder.layers.1.norm2.bias")?;
//! ckpt_hfai::save(&ck.save_state(), &out, &ckpt_hfai::WriteOptions::default().with_world_size(2))?; // 2 parts
//! # assert_eq!(ckpt_hfai::HfaiReader::open(&out)?.tensor("model.module.encoder.layers.1.norm2.bias")?, bias);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ```
//! use ckpt_tensor::{Dict, DictKind, Tensor, Value};
//! use ckpt_hfai::{HfaiReader, ModelState, SaveState, WriteOptions};
//!
//! let mut sd = Dict::new(DictKind::OrderedDict);
//! sd.insert("embed.weight", Tensor::from_slice(&[0.5f32; 1024], &[64, 16]).unwrap());
//! sd.insert("head.bias", Tensor::from_slice(&[0.0f32; 4], &[4]).unwrap());
//! let state = SaveState::default().with_model(ModelState::new(sd)).with_other("epoch", Value::Int(7));
//!
//! let dir = tempfile::tempdir().unwrap();
//! let opts = WriteOptions::default().with_world_size(3).with_large_size(1024); // 4 KiB embed.weight is chunked
//! ckpt_hfai::save(&state, dir.path(), &opts).unwrap();
//!
//! let ckpt = HfaiReader::open(dir.path()).unwrap();
//! assert_eq!(ckpt.world_size(), 3);
//! let w = ckpt.model().unwrap().get("embed.weight").unwrap().as_tensor().unwrap();
//! assert_eq!(w.shape(), &[64, 16]);
//! assert_eq!(ckpt.other("epoch"), Some(&Value::Int(7)));
//!
//! let two = tempfile::tempdir().unwrap();
//! ckpt_hfai::reshard(dir.path(), two.path(), 2, &Default::default()).unwrap();
//! assert_eq!(HfaiReader::open(two.path()).unwrap().world_size(), 2);
//! ```
//!
//! # Format
//! Each part holds `{"__nshards__": n, "__version__": "2.0.0", "model": [(params, large_params), ...],
//! "optimizer": [(state_dict, large_tensors), ...]}` and, in part 0, the `others` items. Small model
//! entries and optimizer state entries are spread over the parts by a greedy byte-size partition; tensors of
//! more than 256 MiB are flattened and every part holds its `torch.chunk` piece with the stored
//! `torch.Size`; model buffers are whole in part 0. Checkpoints without `__version__` (hfai 1.0.0) are
//! rejected with a clear error.
//!
//! # Differences from hfai
//! - Ties in the partition are broken deterministically (equal sizes: later key first, as numpy's
//!   small-array argsort does); hfai's order for ties can vary with numpy version and CPU. Loaders do not
//!   care where a key lives.
//! - The directory is committed whole ([`ckpt_io::DirCommit`]): every rank writes its part into
//!   `.<dir>.ckpt-staging` beside the destination, each part `fdatasync`'d; once all ranks are done, rank 0
//!   checks every part there (length and tail CRC against what its rank reported), writes the checksum
//!   manifest `ckpt.checksums.json` (a CRC-32 of every record of every part, which hfai's loader ignores)
//!   and swaps the staging directory with the destination (`renameat2(RENAME_EXCHANGE)`), then fsyncs the
//!   parent. A crash at any instant leaves the previous checkpoint or the new one, whole; parts of an
//!   earlier save with more ranks disappear with the old directory; other files in the destination are
//!   carried over; a second save to the same destination gets a lock error naming the holder. hfai writes
//!   its parts in place.
//! - Errors instead of assertion failures, each naming the part and the rule broken; a tensor too small
//!   for `torch.chunk` to give every rank a piece is refused up front on every rank ([`Error::TooFewChunks`])
//!   where hfai raises `IndexError` on the last ranks only and leaves the others waiting.
//! - `others` keys `__nshards__` and `__version__` are refused (hfai would silently overwrite its header).

#![forbid(unsafe_code)]

mod chunked;
mod commit;
mod contents;
mod error;
mod fingerprint;
mod part;
mod part_name;
mod partition;
mod reader;
mod reshard;
mod verify;
mod writer;

pub use ckpt_io::Durability;
pub use ckpt_io::{Problem, ProblemKind, ReshardReport, SaveReport, VerifyReport};
pub use ckpt_torch::ReadOptions;
pub use error::{Error, Result};
pub use part::VERSION;
pub use part_name::part_file_name;
pub use partition::{assign, chunk_ranges, count_size};
pub use reader::{HfaiReader, PartChunk, RankShare, load};
pub use reshard::{ReshardOptions, reshard, reshard_rank};
pub use verify::verify;
pub use writer::{
    LARGE_SIZE, ModelState, OBJECT_LAYOUT, Resolve, SaveState, WriteOptions, save, save_rank, save_rank_resolved,
};
