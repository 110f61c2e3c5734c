//! What `ckpt.dcp.Reader` (a `torch.distributed.checkpoint.StorageReader`, `python/ckpt/dcp.py`) asks of a
//! checkpoint: DCP's metadata (a DCP checkpoint's own chunks; one chunk per tensor for every other format,
//! so that `dcp.load` reads any format ckpt reads, resharding included), and regions of tensors.

use ckpt::EntryKind;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::errors::{IntoPy, core_to_py};

/// The region `offsets .. offsets + sizes` of tensor `name`, read with the GIL released.
pub(crate) fn region(
    py: Python<'_>,
    ck: &ckpt::Checkpoint,
    shown: &std::path::Path,
    name: &str,
    offsets: &[usize],
    sizes: &[usize],
) -> PyResult<ckpt::Tensor> {
    if let Some(dcp) = ck.downcast_ref::<ckpt::distcp::DcpReader>() {
        let path = ck.path().to_path_buf();
        return py
            .detach(|| dcp.read_region(name, offsets, sizes))
            .map_err(|e| ckpt::Error::Format { path, source: e.into() })
            .py();
    }
    let t = py.detach(|| ck.tensor(name)).py()?;
    t.region(offsets, sizes).map_err(|e| core_to_py(e, shown))
}

/// `(entries, planner_data)` (see `Checkpoint.dcp_metadata`).
pub(crate) fn metadata<'py>(py: Python<'py>, ck: &ckpt::Checkpoint) -> PyResult<Bound<'py, PyTuple>> {
    let rows = PyList::empty(py);
    if let Some(dcp) = ck.downcast_ref::<ckpt::distcp::DcpReader>() {
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
                    ckpt::tensor::PathItem::Key(k) => path.append(k)?,
                    ckpt::tensor::PathItem::Index(i) => path.append(i)?,
                }
            }
            planner.set_item(fqn, PyTuple::new(py, path)?)?;
        }
        return (rows, planner).into_pyobject(py);
    }
    let entries = py.detach(|| ck.entries());
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

/// One copy of [`read_into`]: the box `offsets .. offsets + sizes` of tensor `name`, into the memory at
/// `address` with `strides` (elements of `element_size` bytes), all of which must lie in `bounds` (the
/// destination storage's first and one-past-last byte).
pub(crate) type Copy = (String, Vec<usize>, Vec<usize>, usize, Vec<usize>, usize, (usize, usize));

/// Copies each box into its destination (torch tensors' memory, `ckpt.dcp.Reader.read_data`), from the map
/// without an intermediate copy, in parallel, with the GIL released. The caller holds the destination
/// tensors for the call; boxes of one call go to disjoint destinations (DCP's load plans never overlap).
pub(crate) fn read_into(py: Python<'_>, ck: &ckpt::Checkpoint, copies: Vec<Copy>) -> PyResult<()> {
    use rayon::prelude::*;
    let path = ck.path().to_path_buf();
    let failed = |e: String| ckpt::Error::InvalidArgument { path: path.clone(), reason: e };
    let read = |name: &str, o: &[usize], s: &[usize]| -> ckpt::Result<ckpt::Tensor> {
        if let Some(dcp) = ck.downcast_ref::<ckpt::distcp::DcpReader>() {
            return dcp
                .read_region(name, o, s)
                .map_err(|e| ckpt::Error::Format { path: path.clone(), source: e.into() });
        }
        ck.tensor(name)?.region(o, s).map_err(|e| ckpt::Error::Format { path: path.clone(), source: e })
    };
    py.detach(|| {
        // A lazy copy (a URL) fetches each chunk this rank reads whole as part of one range per file first.
        if let Some(dcp) = ck.downcast_ref::<ckpt::distcp::DcpReader>() {
            let regions: Vec<(&str, &[usize], &[usize])> =
                copies.iter().map(|(name, o, s, ..)| (name.as_str(), &o[..], &s[..])).collect();
            dcp.prefetch_regions(&regions).map_err(|e| ckpt::Error::Format { path: path.clone(), source: e.into() })?;
        }
        copies.par_iter().try_for_each(|(name, offsets, sizes, address, strides, element_size, bounds)| {
            let t = read(name, offsets, sizes)?;
            if t.dtype().size() != *element_size || strides.len() != t.dim() {
                return Err(failed(format!(
                    "{name}: the destination has elements of {element_size} bytes and {} dimensions, the \
                     checkpoint {} ({}) and {}",
                    strides.len(),
                    t.dtype().size(),
                    t.dtype().torch_name(),
                    t.dim()
                )));
            }
            copy_box(&t, *address, strides, *bounds).map_err(|e| failed(format!("{name}: {e}")))
        })
    })
    .py()
}

/// Copies `t`'s elements into the strided destination at `address` (see [`read_into`]).
fn copy_box(t: &ckpt::Tensor, address: usize, strides: &[usize], bounds: (usize, usize)) -> Result<(), String> {
    let size = t.dtype().size();
    if t.numel() == 0 {
        return Ok(());
    }
    // The destination's last byte, checked inside its storage before anything is written.
    let span = t
        .shape()
        .iter()
        .zip(strides)
        .try_fold(0usize, |acc, (&d, &s)| (d - 1).checked_mul(s).and_then(|x| x.checked_add(acc)))
        .and_then(|last| last.checked_mul(size))
        .and_then(|b| b.checked_add(size))
        .ok_or("destination strides overflow")?;
    if address < bounds.0 || address.checked_add(span).is_none_or(|end| end > bounds.1) {
        return Err("the destination view lies outside its storage".into());
    }
    let contiguous;
    let (src, src_strides): (&[u8], Vec<usize>) = if crate::arrays::is_zero_copy(t) {
        let bytes = t.storage().as_bytes();
        let start = t.storage_offset() * size;
        (bytes.get(start..).ok_or("tensor outside its storage")?, t.strides().to_vec())
    } else {
        contiguous = t.data().map_err(|e| e.to_string())?;
        (&contiguous[..], ckpt::tensor::tensor::contiguous_strides(t.shape()))
    };
    let dims = t.shape();
    let n = dims.len();
    let (inner, src_in, dst_in) = match n {
        0 => (1, 1, 1),
        _ => (dims[n - 1], src_strides[n - 1], strides[n - 1]),
    };
    let outer: Vec<usize> = dims.iter().take(n.saturating_sub(1)).copied().collect();
    let mut index = vec![0usize; outer.len()];
    loop {
        let s0: usize = index.iter().zip(&src_strides).map(|(i, s)| i * s).sum::<usize>() * size;
        let d0: usize = index.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>() * size;
        if src_in == 1 && dst_in == 1 {
            let run = src.get(s0..s0 + inner * size).ok_or("tensor outside its storage")?;
            // SAFETY: the destination run lies inside `bounds` (checked above for the whole view), memory the
            // caller's torch tensor owns and keeps alive for the call; no other copy of this call writes it.
            unsafe { std::ptr::copy_nonoverlapping(run.as_ptr(), (address + d0) as *mut u8, run.len()) };
        } else {
            for j in 0..inner {
                let s = s0 + j * src_in * size;
                let e = src.get(s..s + size).ok_or("tensor outside its storage")?;
                // SAFETY: as above, one element inside the checked view.
                unsafe {
                    std::ptr::copy_nonoverlapping(e.as_ptr(), (address + d0 + j * dst_in * size) as *mut u8, size)
                };
            }
        }
        // Next outer index (row-major).
        let mut k = outer.len();
        loop {
            if k == 0 {
                return Ok(());
            }
            k -= 1;
            index[k] += 1;
            if index[k] < outer[k] {
                break;
            }
            index[k] = 0;
        }
    }
}
