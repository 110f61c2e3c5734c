//! ckpt: read, write, inspect and convert PyTorch training checkpoints outside Python.
//!
//! One tensor model ([`core`]) under one crate per format, each behind a cargo feature:
//!
//! | feature | crate | format |
//! |---|---|---|
//! | `torch` (default) | [`torch`] (`ckpt-torch`) | `torch.save` files, ZIP and legacy |
//! | `safetensors` (default) | [`core::safetensors`] | `.safetensors` files |
//! | `distcp` | `distcp` (`ckpt-distcp`) | `torch.distributed.checkpoint` directories |
//! | `hfai` | `hfai` (`ckpt-hfai`) | hfai `PART_*.pt` directories |
//! | `pbg` | `pbg` (`ckpt-pbg`) | PyTorch-BigGraph HDF5 checkpoints |
//! | `recis` | `recis` (`ckpt-recis`) | RecIS sparse/dense checkpoints |
//! | `tch` | `ckpt-core/tch` | `tch::Tensor` conversions |
//! | `cli` | — | the `ckpt` command-line tool |
//!
//! [`open`] detects the format of a file or directory and returns one [`Checkpoint`] interface: entries with
//! dtype and shape before any data is read, then lazy tensor reads.
//!
//! ```
//! use ckpt::core::{Tensor, Value};
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("m.pt");
//! let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()))]);
//! ckpt::torch::save(&sd, &path, &ckpt::torch::WriteOptions::default()).unwrap();
//! let ck = ckpt::open(&path).unwrap();
//! assert_eq!(ck.format(), ckpt::Format::Torch);
//! assert_eq!(ck.entries()[0].name, "w");
//! assert_eq!(ck.tensor("w").unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
//! ```
//!
//! # Security
//! Checkpoints are untrusted input. No reader executes pickle code; every size read from a file is checked
//! before it is used; a panic on malformed input is a bug.

mod convert;
mod diff;
mod error;
mod format;
mod reshard;
#[cfg(feature = "safetensors")]
mod safetensors_records;
mod verify;

use std::path::{Path, PathBuf};

use error::At;

pub use ckpt_core as core;
pub use ckpt_core::{CheckpointRead, DType, Entry, EntryKind, Tensor, TensorInfo, Value};
#[cfg(feature = "distcp")]
pub use ckpt_distcp as distcp;
#[cfg(feature = "hfai")]
pub use ckpt_hfai as hfai;
#[cfg(feature = "pbg")]
pub use ckpt_pbg as pbg;
#[cfg(feature = "recis")]
pub use ckpt_recis as recis;
#[cfg(feature = "torch")]
pub use ckpt_torch as torch;
pub use convert::{ConvertOptions, ConvertSummary, DcpProfile, convert, unsupported_reason};
pub use diff::{DiffOptions, DiffReport, TensorDiff, diff, diff_with_progress};
pub use error::{Error, Result};
pub use format::{Format, detect};
pub use reshard::{ReshardSummary, reshard, reshard_formats};
pub use verify::{Progress, VerifyReport, verify, verify_with_progress};

#[cfg(feature = "torch")]
impl error::Cause for ckpt_torch::Error {
    fn at(self, path: &Path) -> Error {
        error::Cause::at(ckpt_core::Error::from(self), path)
    }
}

#[cfg(feature = "distcp")]
impl error::Cause for ckpt_distcp::Error {
    fn at(self, path: &Path) -> Error {
        error::Cause::at(ckpt_core::Error::from(self), path)
    }
}

#[cfg(feature = "hfai")]
impl error::Cause for ckpt_hfai::Error {
    fn at(self, path: &Path) -> Error {
        error::Cause::at(ckpt_core::Error::from(self), path)
    }
}

#[cfg(feature = "pbg")]
impl error::Cause for ckpt_pbg::Error {
    fn at(self, path: &Path) -> Error {
        error::Cause::at(ckpt_core::Error::from(self), path)
    }
}

#[cfg(feature = "recis")]
impl error::Cause for ckpt_recis::Error {
    fn at(self, path: &Path) -> Error {
        error::Cause::at(ckpt_core::Error::from(self), path)
    }
}

/// A format's reader, type-erased but downcastable to the format crate's concrete type.
trait Reader: CheckpointRead + Send + Sync {
    fn as_any(&self) -> &dyn std::any::Any;
}

impl<T: CheckpointRead + Send + Sync + 'static> Reader for T {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// An open checkpoint of any format.
pub struct Checkpoint {
    format: Format,
    path: PathBuf,
    inner: Box<dyn Reader>,
}

impl Checkpoint {
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

/// A safetensors file as a [`CheckpointRead`]: its tensors, and the values ckpt recorded in `ckpt.values`
/// (see `safetensors_records`).
#[cfg(feature = "safetensors")]
struct SafetensorsReader {
    file: ckpt_core::safetensors::SafetensorsFile,
    values: Vec<(String, Value)>,
}

#[cfg(feature = "safetensors")]
impl SafetensorsReader {
    fn new(file: ckpt_core::safetensors::SafetensorsFile) -> Self {
        let values = safetensors_records::Records::of(&file).values;
        SafetensorsReader { file, values }
    }
}

#[cfg(feature = "safetensors")]
impl CheckpointRead for SafetensorsReader {
    fn format_name(&self) -> &'static str {
        "safetensors"
    }
    fn entries(&self) -> Vec<Entry> {
        let tensors = self.file.tensors.iter().map(|(n, t)| Entry {
            name: n.clone(),
            kind: EntryKind::Tensor(TensorInfo { dtype: t.dtype(), shape: t.shape().to_vec() }),
        });
        let values = self.values.iter().map(|(n, v)| Entry { name: n.clone(), kind: ckpt_core::entry_kind(v) });
        tensors.chain(values).collect()
    }
    fn tensor(&self, name: &str) -> ckpt_core::Result<Tensor> {
        self.file
            .get(name)
            .cloned()
            .ok_or_else(|| ckpt_core::Error::InvalidArgument(format!("no tensor named {name:?}")))
    }
    fn value(&self, name: &str) -> ckpt_core::Result<Value> {
        if let Some(t) = self.file.get(name) {
            return Ok(Value::Tensor(t.clone()));
        }
        self.values
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| ckpt_core::Error::InvalidArgument(format!("no entry named {name:?}")))
    }
}

/// Opens a checkpoint of any enabled format, detecting it from the path's contents.
///
/// # Errors
/// [`Error::UnknownFormat`], [`Error::FeatureDisabled`] naming the feature to enable, or the format's own
/// error.
pub fn open(path: &Path) -> Result<Checkpoint> {
    let format = detect(path)?;
    open_as(path, format)
}

/// Opens a checkpoint as the given format.
///
/// # Errors
/// As [`open`].
pub fn open_as(path: &Path, format: Format) -> Result<Checkpoint> {
    let disabled = || Error::FeatureDisabled { path: path.to_path_buf(), format, feature: format.feature() };
    let inner: Box<dyn Reader> = match format {
        #[cfg(feature = "torch")]
        Format::Torch => Box::new(ckpt_torch::TorchReader::open(path).at(path)?),
        #[cfg(feature = "safetensors")]
        Format::Safetensors => Box::new(SafetensorsReader::new(ckpt_core::safetensors::read_file(path).at(path)?)),
        #[cfg(feature = "distcp")]
        Format::Distcp => Box::new(ckpt_distcp::DcpReader::open(path).at(path)?),
        #[cfg(feature = "hfai")]
        Format::Hfai => Box::new(ckpt_hfai::HfaiReader::open(path).at(path)?),
        #[cfg(feature = "pbg")]
        Format::Pbg => Box::new(ckpt_pbg::PbgReader::open(path).at(path)?),
        #[cfg(feature = "recis")]
        Format::Recis => Box::new(ckpt_recis::RecisReader::open(path).at(path)?),
        // Reached only in builds without some format's feature.
        #[allow(unreachable_patterns)]
        _ => return Err(disabled()),
    };
    Ok(Checkpoint { format, path: path.to_path_buf(), inner })
}
