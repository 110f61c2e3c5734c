//! An open checkpoint of any format: the format crate's reader behind the generic interface, still
//! downcastable to its concrete type.

use std::any::Any;
use std::path::{Path, PathBuf};

use ckpt_tensor::{CheckpointRead, Entry, Tensor, Value};

use crate::error::{At, Result};
use crate::format::Format;

/// A format's reader, type-erased but downcastable to the format crate's concrete type.
pub(crate) trait Reader: CheckpointRead + Send + Sync {
    /// The concrete reader.
    fn as_any(&self) -> &dyn Any;
}

impl<T: CheckpointRead + Send + Sync + 'static> Reader for T {
    fn as_any(&self) -> &dyn Any {
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

    /// Why the entry `name` cannot be read, where that is known without reading it (a data file of a
    /// directory format that is missing); `None` otherwise ([`CheckpointRead::unreadable`]).
    pub fn unreadable(&self, name: &str) -> Option<String> {
        self.inner.unreadable(name)
    }

    /// Reads the tensor entry `name`.
    ///
    /// # Errors
    /// [`Error::Format`](crate::Error::Format) naming the path.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        self.inner.tensor(name).at(&self.path).map_err(|e| self.missing(name).unwrap_or(e))
    }

    /// Reads the non-tensor entry `name`.
    ///
    /// # Errors
    /// [`Error::Format`](crate::Error::Format) naming the path.
    pub fn value(&self, name: &str) -> Result<Value> {
        self.inner.value(name).at(&self.path).map_err(|e| self.missing(name).unwrap_or(e))
    }

    /// The names of the entries under `prefix` (`state_dict` holds `state_dict.model.w`, ...), in the
    /// checkpoint's order; empty when `prefix` is an entry itself or no entry is under it.
    pub fn entries_under(&self, prefix: &str) -> Vec<String> {
        let entries = self.entries();
        if entries.iter().any(|e| e.name == prefix) {
            return Vec::new();
        }
        let dotted = format!("{prefix}.");
        entries.into_iter().filter(|e| e.name.starts_with(&dotted)).map(|e| e.name).collect()
    }

    /// [`Error::NoEntry`](crate::Error::NoEntry) for `name` when the checkpoint lists no such entry, with the
    /// names near it ([`crate::suggest::did_you_mean`]) and the entries under it when it is a prefix of
    /// some; `None` when it is an entry.
    pub fn missing(&self, name: &str) -> Option<crate::error::Error> {
        let entries = self.entries();
        if entries.iter().any(|e| e.name == name) {
            return None;
        }
        // The entries' names and the prefixes they are under (`state_dic`: did you mean `state_dict`).
        let mut names: Vec<&str> = Vec::new();
        for e in &entries {
            let dots = e.name.match_indices('.').map(|(i, _)| i);
            for prefix in dots.filter_map(|i| e.name.get(..i)).chain([e.name.as_str()]) {
                if !names.contains(&prefix) {
                    names.push(prefix);
                }
            }
        }
        let near = crate::suggest::did_you_mean(name, names, 3).into_iter().map(str::to_owned).collect();
        Some(crate::error::Error::NoEntry {
            path: self.path.clone(),
            name: name.to_owned(),
            did_you_mean: near,
            under: self.entries_under(name).len(),
        })
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
