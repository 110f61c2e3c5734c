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
//! The facade glues; what a format is lives in its crate. `formats.rs` is the registry: every [`Format`],
//! how it is recognised, and the adaptor (`formats/<format>.rs`, one per format, behind its feature) through
//! which [`open`], [`convert`], [`verify`] and [`reshard`] reach the format crate.
//!
//! # Many processes
//! [`convert_in`] and [`reshard_in`] split a conversion or reshard over the processes of a
//! [`collective::Collective`] (an MPI job through `collective::MpiCollective` with feature `mpi`, threads, one process):
//! the `W` ranks of the target are hosted round-robin by the `K` processes ([`collective::host_ranks`]), each
//! writes its ranks' files (distcp ranks, hfai parts, hf shards, RecIS shards, PyTorch-BigGraph partition
//! files), and rank 0 writes the metadata last. The files equal a one-process run's.

mod adaptor;
mod convert;
mod diff;
pub mod display;
mod error;
mod formats;
mod limits;
pub mod outline;
#[cfg(feature = "cli")]
pub mod progress;
mod ranks;
mod reshard;
pub mod select;
mod source;
mod verify;

use std::path::{Path, PathBuf};

pub use ckpt_tensor::{CheckpointRead, DType, Entry, EntryKind, Fault, Tensor, TensorInfo, Value};
pub use convert::{ConvertOptions, ConvertSummary, DcpProfile, convert, output_estimate, save, state_dict};
pub use diff::{DiffOptions, DiffReport, TensorDiff, diff, diff_with_progress};
pub use error::{Error, Result};
pub use formats::crates::*;
pub use formats::{Format, UnknownFormatName, detect, unsupported_reason};
pub use limits::{
    DEFAULT_MAX_DATA_HEADER_BYTES, DEFAULT_MAX_HEADER_BYTES, DEFAULT_MAX_INFLATED_BYTES, DEFAULT_MAX_METADATA_BYTES,
    ReadLimits,
};
pub use ranks::{convert_in, reshard_in, reshard_in_with};
pub use reshard::{ReshardSummary, reshard, reshard_formats, reshard_with};
pub use select::Selection;
pub use source::{NameMap, SourceOptions};
pub use verify::{Depth, Progress, VerifyOptions, VerifyReport, verify, verify_with, verify_with_progress};

use adaptor::Reader;
use error::At;

/// The repository README's Rust examples, compiled and run as doctests (`cargo test --doc -p ckpt --features
/// full`) so they cannot drift from the API. `facade/README.md` is a link to it, which `cargo package`
/// packages as a file, so the packaged crate has its README and these doctests too.
#[cfg(all(doctest, feature = "full"))]
#[doc = include_str!("../README.md")]
mod readme {}

/// An open checkpoint of any format.
pub struct Checkpoint {
    format: Format,
    path: PathBuf,
    inner: Box<dyn Reader>,
}

impl Checkpoint {
    pub(crate) fn new(format: Format, path: &Path, inner: Box<dyn Reader>) -> Self {
        Checkpoint { format, path: path.to_path_buf(), inner }
    }

    /// The detected format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every entry with its metadata, before any tensor data is read.
    pub fn entries(&self) -> Vec<Entry> {
        self.inner.entries()
    }

    /// Reads the tensor entry `name`.
    ///
    /// # Errors
    /// [`Error::Format`] naming the path.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        self.inner.tensor(name).at(&self.path)
    }

    /// Reads the non-tensor entry `name`.
    ///
    /// # Errors
    /// [`Error::Format`] naming the path.
    pub fn value(&self, name: &str) -> Result<Value> {
        self.inner.value(name).at(&self.path)
    }

    /// The format's reader behind the generic interface.
    pub fn reader(&self) -> &dyn CheckpointRead {
        self.inner.as_ref()
    }

    /// The format crate's own reader, for format-specific extras: `ckpt::torch::TorchReader`,
    /// `ckpt::distcp::DcpReader`, `ckpt::hfai::HfaiReader`, `ckpt::pbg::PbgReader`,
    /// `ckpt::recis::RecisReader`; `None` when the checkpoint is of another format.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("m.pt");
    /// # ckpt::torch::save(&ckpt::Value::dict([("step", ckpt::Value::Int(3))]), &path, &ckpt::torch::WriteOptions::default()).unwrap();
    /// let ck = ckpt::open(&path).unwrap();
    /// let file = ck.downcast_ref::<ckpt::torch::TorchReader>().unwrap();
    /// assert_eq!(file.prefix(), Some("m"));
    /// ```
    pub fn downcast_ref<T: 'static>(&self) -> Option<&T> {
        self.inner.as_any().downcast_ref::<T>()
    }
}

/// Opens a checkpoint of any enabled format, detecting it from the path's contents. The path is anything
/// that names one (`&str`, `String`, `&Path`, `PathBuf`), as in `std::fs`:
///
/// ```no_run
/// let ck = ckpt::open("model.pt")?;
/// for e in ck.entries() {
///     println!("{} {:?}", e.name, e.kind);
/// }
/// # Ok::<(), ckpt::Error>(())
/// ```
///
/// # Errors
/// [`Error::UnknownFormat`], [`Error::FeatureDisabled`] naming the feature to enable, or the format's own
/// error.
pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
    open_with(path, &ReadLimits::default())
}

/// [`open`] under the resource `limits` of this call ([`ReadLimits`]: the pickle decoder's, header and
/// metadata sizes, inflated sizes), instead of the defaults.
///
/// # Errors
/// As [`open`]; a limit exceeded is an error of [`Fault::Limit`] naming it.
pub fn open_with(path: impl AsRef<Path>, limits: &ReadLimits) -> Result<Checkpoint> {
    let path = path.as_ref();
    let format = detect(path)?;
    open_as_with(path, format, limits)
}

/// Opens a checkpoint as the given format.
///
/// # Errors
/// As [`open`].
pub fn open_as(path: impl AsRef<Path>, format: Format) -> Result<Checkpoint> {
    let path = path.as_ref();
    open_as_with(path, format, &ReadLimits::default())
}

/// [`open_as`] under the resource `limits` of this call.
///
/// # Errors
/// As [`open_with`].
pub fn open_as_with(path: impl AsRef<Path>, format: Format, limits: &ReadLimits) -> Result<Checkpoint> {
    let path = path.as_ref();
    open_source(path, Some(format), limits, &SourceOptions::default())
}

/// Opens a checkpoint (of `format`, or detected) under `limits`, read as `source` says: a DeepSpeed root's
/// tag, Megatron's layers unstacked, a name map ([`SourceOptions`]; formats they do not apply to ignore them).
///
/// # Errors
/// As [`open_with`].
pub fn open_source(
    path: impl AsRef<Path>,
    format: Option<Format>,
    limits: &ReadLimits,
    source: &SourceOptions,
) -> Result<Checkpoint> {
    let path = path.as_ref();
    let format = match format {
        Some(f) => f,
        None => detect(path)?,
    };
    let inner = formats::adaptor(format, path)?.open_source(path, limits, source)?;
    Ok(Checkpoint::new(format, path, inner))
}
