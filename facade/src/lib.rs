//! ckpt: read, write, inspect and convert PyTorch training checkpoints outside Python.
//!
//! One tensor model ([`tensor`]), one durable commit path ([`io`]), process groups ([`collective`]) and one
//! safetensors codec ([`safetensors`]) under one crate per format, each behind a cargo feature:
//!
//! | feature | crate | format |
//! |---|---|---|
//! | `torch` (default) | [`torch`] (`ckpt-torch`) | `torch.save` files, ZIP and legacy |
//! | `safetensors` (default) | [`safetensors`] (`ckpt-safetensors`) | `.safetensors` files (detection and conversion; the crate is always there) |
//! | `distcp` | `distcp` (`ckpt-distcp`) | `torch.distributed.checkpoint` directories |
//! | `hfai` | `hfai` (`ckpt-hfai`) | hfai `PART_*.pt` directories |
//! | `pbg` | `pbg` (`ckpt-pbg`) | PyTorch-BigGraph HDF5 checkpoints |
//! | `recis` | `recis` (`ckpt-recis`) | RecIS sparse/dense checkpoints |
//! | `hf` | `hf` (`ckpt-safetensors`' [`safetensors::hf`]) | Hugging Face sharded safetensors directories |
//! | `deepspeed` | `deepspeed` (`ckpt-deepspeed`) | DeepSpeed ZeRO 1-3 and universal checkpoints (read) |
//! | `megatron` | `distcp` (`ckpt-distcp`, its `megatron` profile) | Megatron-Core `torch_dist` checkpoints (read) |
//! | `pickle` (default) | [`torch`] (`ckpt-torch`) | plain pickles of models and tensors, `pickle.dump` (read) |
//! | `package` (default) | [`torch`] (`ckpt-torch`'s `package`) | torch.package archives, `PackageExporter` (read) |
//! | `gguf` | `gguf` (`ckpt-gguf`) | GGUF files of llama.cpp and ggml, quantized tensors dequantized; written with `--quant` |
//! | `tch` | `ckpt-tensor/tch` | `tch::Tensor` conversions |
//! | `cli` | — | the `ckpt` command-line tool |
//! | `mpi` | `ckpt-collective/mpi` | `collective::MpiCollective`: the `ckpt` tool splits `convert`/`reshard` over `mpirun`'s processes |
//!
//! [`open`] detects the format of a file or directory and returns one [`Checkpoint`] interface: entries with
//! dtype and shape before any data is read, then lazy tensor reads.
//!
//! ```
//! use ckpt::tensor::{Tensor, Value};
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("m.pt");
//! let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()))]);
//! ckpt::torch::save(&sd, &path, &ckpt::torch::WriteOptions::default()).unwrap();
//! let ck = ckpt::open(&path).unwrap();
//! assert_eq!(ck.format().name(), "torch");
//! assert_eq!(ck.entries()[0].name, "w");
//! assert_eq!(ck.tensor("w").unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
//! ```
//!
//! # Security
//! Checkpoints are untrusted input. No reader executes pickle code; every size read from a file is checked
//! before it is used; a panic on malformed input is a bug.
//!
//! # Errors
//! [`Error`] says what went wrong and where, [`Error::fault`] who is at fault (the file, the library, a
//! limit, the operating system, the caller), and a format crate's own error stays the source, for
//! `downcast_ref::<ckpt::torch::Error>()` and the like.
//!
//! # Layout
//! The facade glues; what a format is lives in its crate. `format.rs` says what each [`Format`] is and how
//! it is recognised; `formats.rs` is the registry of the adaptors (`formats/<format>.rs`, one per format,
//! behind its feature, with that format's `ckpt convert` flags) through which [`open`], [`convert`],
//! [`verify`], [`reshard`] and [`inspect()`] reach the format crate. The modules import downward only, in
//! the layers `src/lib.rs` lists (`tests/layers.rs` checks it).
//!
//! # One grammar across the format crates
//! The same names mean the same thing in every format crate (paths are `impl AsRef<Path>` throughout):
//!
//! | what | name | torch | distcp | hfai | pbg | recis | deepspeed | safetensors, hf |
//! |---|---|---|---|---|---|---|---|---|
//! | open a checkpoint | `<F>Reader::open(path)`, `open_with(path, &ReadOptions)` | yes | yes | yes | yes | yes | yes | `SafetensorsReader::open`, `hf::HfReader::open` |
//! | write one | `save(state, dst, &WriteOptions) -> SaveReport` | yes | yes | yes (`SaveState`) | yes (entries by name) | yes | reads only | `metadata::save`, `hf::save` |
//! | one rank's part of a save | `save_rank(state, dst, &WriteOptions, group: &dyn Collective) -> SaveReport` | one file | yes (+ shard specs) | yes | yes | yes | — | `hf::save_rank` |
//! | another rank count | `reshard(src, dst, world_size, &ReshardOptions) -> ReshardReport`, `reshard_rank(src, dst, &ReshardOptions, group)` | — | `reshard` | yes | — | yes | — | — |
//! | check one | `verify(path) -> VerifyReport`, `verify_with(path, &ReadOptions)` where reading has options | yes | yes (`verify_with`) | yes | `FileCheckpointStorage::verify` | yes | — | facade |
//! | what writers take | a state dict ([`Value`]) whose tensors are [`Tensor`]s; any library's tensor enters through [`tensor::TensorView`] ([`tensor::state_dict_of_views`]) | yes | yes | yes (`SaveState::from_state_dict`) | yes (its entries) | yes | — | yes |
//! | how durably | `WriteOptions::durability: Durability { sync, checksums, direct_io }` ([`io::Durability`]) | yes | yes | yes | yes | yes | — | yes |
//! | rank counts | `world_size` | — | yes | yes | — | yes | (`world`, read) | — |
//! | `_with` | the same operation with its options struct (`open_with(path, &ReadOptions)`, `verify_with(path, &VerifyOptions)`); `_with_progress` adds a progress callback; `_rank` is one rank of a [`collective::Collective`]; `_in` spreads ranks over its processes | | | | | | | |
//!
//! The reports have one shape each, in [`io`]: [`io::SaveReport`] (files, tensors, bytes, values,
//! dropped), [`VerifyReport`] with structured [`Problem`]s (a [`ProblemKind`] per rule, the file and entry,
//! the format's message; [`Severity`] from the kind), and [`io::ReshardReport`]. The facade's
//! [`verify`] returns the same [`VerifyReport`]; its [`ConvertOptions::durability`] reaches every target's
//! writer.
//!
//! # Many processes
//! [`convert_in`] and [`reshard_in`] split a conversion or reshard over the processes of a
//! [`collective::Collective`] (an MPI job through `collective::MpiCollective` with feature `mpi`, threads, one process):
//! the `W` ranks of the target are hosted round-robin by the `K` processes ([`collective::host_ranks`]), each
//! writes its ranks' files (distcp ranks, hfai parts, hf shards, RecIS shards, PyTorch-BigGraph partition
//! files), and rank 0 writes the metadata last. The files equal a one-process run's.

#![forbid(unsafe_code)]

// Modules in layers, each importing only from the layers above it in this list (tests/layers.rs checks it):
// 0 format, suggest; 1 error; 2 limits, select, source, display, outline; 3 checkpoint; 4 options, report;
// 5 agree; 6 adaptor; 7 formats (the registry and formats/<format>.rs); 8 open, destination; 9 convert, diff,
// inspect, reshard, storage, verify; 10 ranks, progress, place. Only this file re-exports, and no module imports through it.
mod format;

mod error;

pub mod display;
pub mod limits;
pub mod outline;
pub mod select;
mod source;
pub mod suggest;

mod checkpoint;

mod options;
mod report;

mod agree;

mod adaptor;

mod formats;

pub mod destination;
mod open;

mod convert;
pub mod diff;
pub mod inspect;
mod reshard;
#[cfg(feature = "remote")]
pub mod storage;
mod verify;

#[cfg(feature = "remote")]
pub mod place;
#[cfg(feature = "cli")]
pub mod progress;
mod ranks;

pub use checkpoint::Checkpoint;
pub use ckpt_tensor::{CheckpointRead, DType, Entry, EntryKind, Fault, Tensor, TensorInfo, Value};
pub use convert::{convert, output_estimate, save, state_dict};
pub use destination::{Standing, standing};
pub use diff::{DiffError, DiffOptions, DiffReport, diff, diff_with_progress};
pub use error::{Error, Result};
pub use format::{Format, UnknownFormatName, looks_like, unsupported_reason};
#[cfg(feature = "cli")]
pub use formats::TargetArgs;
pub use formats::crates::*;
pub use formats::detect;
pub use inspect::{InspectReport, inspect};
pub use limits::ReadLimits;
pub use open::{open, open_as, open_as_with, open_source, open_with};
pub use options::named as named_options;
pub use options::{ConvertOptions, DcpProfile, Depth, TargetOptions};
pub use ranks::{convert_in, reshard_in, reshard_in_with, reshard_in_with_options};
pub use report::{ConvertSummary, Problem, ProblemKind, Progress, Severity, VerifyReport, error_chain};
pub use reshard::{ReshardOptions, ReshardSummary, reshard, reshard_formats, reshard_with, reshard_with_options};
pub use select::Selection;
pub use source::{NameMap, PathFill, SourceOptions};
pub use verify::{VerifyOptions, verify, verify_with, verify_with_progress};

/// The repository README's Rust examples, compiled and run as doctests (`cargo test --doc -p ckpt --features
/// full`) so they cannot drift from the API. `facade/README.md` is a link to it, which `cargo package`
/// packages as a file, so the packaged crate has its README and these doctests too.
#[cfg(all(doctest, feature = "full"))]
#[doc = include_str!("../README.md")]
mod readme {}
