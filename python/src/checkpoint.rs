//! An open checkpoint of any format (`ckpt.open`): entries before any data, then tensors and values read
//! lazily, tensors as numpy arrays over the map or torch tensors. A checkpoint at a URL is fetched whole into
//! a temporary directory, which the object keeps as long as it lives.

use std::path::PathBuf;

use ckpt::{EntryKind, Format};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::errors::{About, IntoPy, usage};
use crate::ops::read_options;
use crate::remote::{fetched, shown, storage_options};
use crate::values::{Framework, ToPy};

/// An open checkpoint (the native half of `ckpt.Checkpoint`).
#[pyclass(frozen, module = "ckpt._ckpt")]
pub(crate) struct Checkpoint {
    inner: ckpt::Checkpoint,
    /// The path, or the URL without credentials, it was opened from.
    shown: PathBuf,
    /// A URL's objects fetched into a temporary directory, which `inner` reads (dropped after it).
    _source: ckpt::storage::Source,
}

impl Checkpoint {
    /// The tensor `name`, read with the GIL released.
    pub(crate) fn read_tensor(&self, py: Python<'_>, name: &str) -> PyResult<ckpt::Tensor> {
        py.detach(|| self.inner.tensor(name)).py()
    }

    fn to_py<'py>(framework: &str, torch: Option<Bound<'py, PyAny>>) -> PyResult<ToPy<'py>> {
        Ok(ToPy::new(Framework::parse(framework)?, torch))
    }
}

/// Opens the checkpoint at `path` (`format`: its format's name, detected when `None`) under `limits`, with the
/// GIL released; at a URL, its objects are fetched first (as `ckpt cat` does), with `storage_options`.
#[pyfunction]
#[pyo3(signature = (path, format = None, limits = None, storage_options = None, lazy = false))]
pub(crate) fn open(
    py: Python<'_>,
    path: PathBuf,
    format: Option<&str>,
    limits: Option<&Bound<'_, PyDict>>,
    storage_options: Option<&Bound<'_, PyDict>>,
    lazy: bool,
) -> PyResult<Checkpoint> {
    let (limits, read) = read_options(limits)?;
    let storage = self::storage_options(storage_options)?;
    let shown = shown(&path);
    let format = format.map(|f| f.parse::<Format>().map_err(|e| usage(e.to_string(), Some(&shown)))).transpose()?;
    let (inner, source) = py
        .detach(|| -> Result<_, About> {
            if lazy {
                // A URL's bytes fetched as they are read (a local path reads as it is).
                let source = fetched(&path, &storage, ckpt::storage::Fetch::Lazy)?;
                let fill = read.clone().with_fill(source.path(), source.fill());
                let inner = ckpt::open_source(source.path(), format, &limits, &fill)?;
                return Ok((inner, source));
            }
            let source = fetched(&path, &storage, ckpt::storage::Fetch::Whole)?;
            let inner = ckpt::open_source(source.path(), format, &limits, &read)?;
            Ok((inner, source))
        })
        .py()?;
    Ok(Checkpoint { inner, shown, _source: source })
}

#[pymethods]
impl Checkpoint {
    /// For a checkpoint at a URL, what fetching moved until now: `(objects, bytes, requests)` (a lazy copy
    /// counts every fill its reads made); `None` for a local path.
    #[getter]
    fn fetched(&self) -> Option<(usize, u64, u64)> {
        self._source.transfer().map(|t| (t.objects, t.bytes, t.requests))
    }

    /// The format's name (`torch`, `safetensors`, `distcp`, `hf`, `hfai`, `pbg`, `recis`).
    #[getter]
    fn format(&self) -> &'static str {
        self.inner.format().name()
    }

    /// The path it was opened from; for a URL, the URL without user information and query.
    #[getter]
    fn path(&self) -> std::ffi::OsString {
        self.shown.clone().into_os_string()
    }

    /// The local path read: the path it was opened from, or where a URL's objects were fetched.
    #[getter]
    fn local_path(&self) -> PathBuf {
        self.inner.path().to_path_buf()
    }

    /// Every entry as `(name, kind, dtype, shape, nbytes)`: kind `tensor`, `composite` (quantized, sparse,
    /// nested), `opaque` or `value`; dtype, shape and nbytes `None` but for tensors and composites.
    fn entries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let entries = py.detach(|| self.inner.entries());
        let rows = entries.into_iter().map(|e| -> PyResult<Bound<'py, PyTuple>> {
            match e.kind {
                EntryKind::Tensor(info) => {
                    let nbytes = info.nbytes();
                    let shape = PyTuple::new(py, &info.shape)?;
                    (e.name, "tensor", info.dtype.torch_name(), shape, nbytes).into_pyobject(py)
                }
                // A quantized, sparse or nested tensor: its dtype and dense shape, its size the components'
                // bytes (its layout and components: `value(name)`).
                EntryKind::Composite(c) => {
                    let nbytes = c.components.iter().map(|(_, t)| t.nbytes()).sum::<usize>();
                    let shape = PyTuple::new(py, &c.shape)?;
                    (e.name, "composite", c.dtype.torch_name(), shape, nbytes).into_pyobject(py)
                }
                EntryKind::OpaqueTensor(kind) => {
                    let kind = format!("{kind:?}").to_lowercase();
                    (e.name, "opaque", kind, py.None(), py.None()).into_pyobject(py)
                }
                _ => (e.name, "value", py.None(), py.None(), py.None()).into_pyobject(py),
            }
        });
        PyList::new(py, rows.collect::<PyResult<Vec<_>>>()?)
    }

    /// The format's details (`(name, value)` pairs: container, version, writer, ...).
    fn details(&self) -> Vec<(String, String)> {
        self.inner.reader().details()
    }

    /// The tensor entry `name`.
    #[pyo3(signature = (name, framework = "np", torch = None))]
    fn tensor<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        framework: &str,
        torch: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let to = Self::to_py(framework, torch)?;
        let t = self.read_tensor(py, name)?;
        to.tensor(py, &t)
    }

    /// The entry `name`, a tensor or any other value, as a Python object.
    #[pyo3(signature = (name, framework = "np", torch = None))]
    fn value<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        framework: &str,
        torch: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let to = Self::to_py(framework, torch)?;
        let v = py.detach(|| self.inner.value(name)).py()?;
        to.value(py, &v)
    }

    /// The region `offsets .. offsets + sizes` of the tensor `name` (global coordinates): for a DCP checkpoint
    /// read from the items that overlap it (a view of one item, zero copy, when one holds it all), else a view
    /// of the tensor.
    #[pyo3(signature = (name, offsets, sizes, framework = "np", torch = None))]
    fn region<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        offsets: Vec<usize>,
        sizes: Vec<usize>,
        framework: &str,
        torch: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let to = Self::to_py(framework, torch)?;
        let t = crate::dcp::region(py, &self.inner, &self.shown, name, &offsets, &sizes)?;
        to.tensor(py, &t)
    }

    /// The bytes `torch.save` writes for the value `name` (how `ckpt.dcp.Reader` hands a non-tensor entry to
    /// DCP's planner, which `torch.load`s it).
    fn value_bytes<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let path = self.shown.clone();
        let bytes = py
            .detach(|| -> ckpt::Result<Vec<u8>> {
                let v = self.inner.value(name)?;
                ckpt::torch::save_to_writer(&v, Vec::new(), "archive", &ckpt::torch::WriteOptions::default())
                    .map_err(|e| ckpt::Error::Format { path: path.clone(), source: e.into() })
            })
            .py()?;
        Ok(pyo3::types::PyBytes::new(py, &bytes))
    }

    /// What `ckpt.dcp.Reader.read_metadata` builds torch's `Metadata` from: every entry as `(fqn, "tensor",
    /// dtype, size, chunks)` (chunks as `(offsets, sizes)`: a DCP checkpoint's own, one whole chunk for other
    /// formats) or `(fqn, "bytes", None, None, None)`, and DCP's `planner_data` (fqn → path) when there is one.
    fn dcp_metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        crate::dcp::metadata(py, &self.inner)
    }

    /// Copies boxes of tensors into torch tensors' memory (`ckpt.dcp.Reader.read_data`): each
    /// `(name, offsets, sizes, address, strides, element_size, (storage_start, storage_end))`.
    fn read_into(&self, py: Python<'_>, copies: Vec<crate::dcp::Copy>) -> PyResult<()> {
        crate::dcp::read_into(py, &self.inner, copies)
    }

    fn __repr__(&self) -> String {
        format!("<ckpt.Checkpoint {} {}>", self.inner.format().name(), self.shown.display())
    }
}
