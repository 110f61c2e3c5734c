//! What `ckpt.dcp.Reader` (a `torch.distributed.checkpoint.StorageReader`, `python/ckpt/dcp.py`) asks of a
//! checkpoint: DCP's metadata (a DCP checkpoint's own chunks; one chunk per tensor for every other format,
//! so that `dcp.load` reads any format ckpt reads, resharding included), and regions of tensors.

use ckpt::EntryKind;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::checkpoint::{Checkpoint, core_err};
use crate::errors::IntoPy;

/// The region `offsets .. offsets + sizes` of tensor `name`, read with the GIL released.
pub(crate) fn region(
    py: Python<'_>,
    ck: &Checkpoint,
    name: &str,
    offsets: &[usize],
    sizes: &[usize],
) -> PyResult<ckpt::Tensor> {
    if let Some(dcp) = ck.inner().downcast_ref::<ckpt::distcp::DcpReader>() {
        let path = ck.inner().path().to_path_buf();
        return py
            .detach(|| dcp.read_region(name, offsets, sizes))
            .map_err(|e| ckpt::Error::Format { path, source: e.into() })
            .py();
    }
    let t = ck.read_tensor(py, name)?;
    t.region(offsets, sizes).map_err(|e| core_err(ck, e))
}

/// `(entries, planner_data)` (see `Checkpoint.dcp_metadata`).
pub(crate) fn metadata<'py>(py: Python<'py>, ck: &Checkpoint) -> PyResult<Bound<'py, PyTuple>> {
    let rows = PyList::empty(py);
    if let Some(dcp) = ck.inner().downcast_ref::<ckpt::distcp::DcpReader>() {
        let md = dcp.metadata();
        for (fqn, storage) in &md.state_dict_metadata {
            match storage.as_tensor() {
                Some(t) => {
                    let chunks = PyList::empty(py);
                    for c in &t.chunks {
                        chunks.append((PyTuple::new(py, &c.offsets)?, PyTuple::new(py, &c.sizes)?))?;
                    }
                    rows.append((fqn, "tensor", t.properties.dtype.torch_name(), PyTuple::new(py, &t.size)?, chunks))?;
                }
                None => rows.append((fqn, "bytes", py.None(), py.None(), py.None()))?,
            }
        }
        let planner = PyDict::new(py);
        for fqn in dcp.keys() {
            let path = PyList::empty(py);
            for item in dcp.path_of(fqn) {
                match item {
                    ckpt::core::PathItem::Key(k) => path.append(k)?,
                    ckpt::core::PathItem::Index(i) => path.append(i)?,
                }
            }
            planner.set_item(fqn, PyTuple::new(py, path)?)?;
        }
        return (rows, planner).into_pyobject(py);
    }
    let entries = py.detach(|| ck.inner().entries());
    for e in entries {
        match e.kind {
            EntryKind::Tensor(info) => {
                let zeros = vec![0usize; info.shape.len()];
                let chunks = PyList::new(py, [(PyTuple::new(py, &zeros)?, PyTuple::new(py, &info.shape)?)])?;
                rows.append((e.name, "tensor", info.dtype.torch_name(), PyTuple::new(py, &info.shape)?, chunks))?;
            }
            _ => rows.append((e.name, "bytes", py.None(), py.None(), py.None()))?,
        }
    }
    (rows, py.None()).into_pyobject(py)
}
