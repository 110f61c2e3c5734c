//! numpy arrays over ckpt's tensors without copying: an array's memory is the tensor's storage (a window of
//! the checkpoint's memory map, usually), kept alive by the array's base object, a [`MappedBytes`].
//!
//! Every array is read-only, whatever the format: arrays over ckpt's storage because the map is the file
//! (storage read from a file is shared by every view of it and by later reads), and arrays whose bytes were
//! made for the call (a DCP chunk assembled, a DeepSpeed partition joined, a deferred storage gathered, a
//! conjugate resolved) so that a reader's arrays behave the same in every format; `np.array(a)` or
//! `a.copy()` gives a writable one.

use std::ffi::{c_int, c_void};

use ckpt::tensor::{Buffer, DType, Tensor};
use numpy::npyffi::{self, NpyTypes, PY_ARRAY_API, npy_intp};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;

/// The memory behind numpy arrays that ckpt made: a tensor's storage (a window of a memory map, or memory
/// ckpt owns). The base object of those arrays; it keeps the map open while an array lives.
#[pyclass(frozen, module = "ckpt._ckpt")]
pub(crate) struct MappedBytes {
    buf: Buffer,
}

#[pymethods]
impl MappedBytes {
    /// Whether the bytes are a window of a memory-mapped file.
    #[getter]
    fn mapped(&self) -> bool {
        self.buf.is_mapped()
    }

    /// The address of the first byte (for tests of zero copy: it lies inside the file's map).
    #[getter]
    fn address(&self) -> usize {
        self.buf.as_bytes().as_ptr() as usize
    }

    /// The number of bytes.
    fn __len__(&self) -> usize {
        self.buf.len()
    }

    /// Where the window starts inside what it windows: the file's byte offset, for a mapped file.
    #[getter]
    fn offset(&self) -> usize {
        self.buf.offset_in_backing()
    }
}

/// The numpy dtype of every ckpt dtype, made by `ckpt._dtypes.numpy_dtypes()` (ml_dtypes' types for
/// bfloat16 and the float8 family when it is installed, else raw unsigned integers of the same width whose
/// dtype names the real one in its metadata), in [`DType::ALL`]'s order.
static DTYPES: PyOnceLock<Vec<Py<PyAny>>> = PyOnceLock::new();

/// The numpy dtype object of `dtype`.
pub(crate) fn numpy_dtype<'py>(py: Python<'py>, dtype: DType) -> PyResult<Bound<'py, PyAny>> {
    let table = DTYPES.get_or_try_init(py, || -> PyResult<Vec<Py<PyAny>>> {
        let names: Vec<&str> = DType::ALL.iter().map(|d| d.torch_name()).collect();
        crate::helpers::numpy_dtypes(py)?.call1((names,))?.extract()
    })?;
    let i = DType::ALL.iter().position(|d| *d == dtype).unwrap_or(0);
    table.get(i).map(|d| d.bind(py).clone()).ok_or_else(|| crate::errors::usage("no numpy dtype", None))
}

/// Whether the array over `t` is made without copying: the tensor's elements are stored as they are
/// (no lazy conjugation or negation) in memory that exists (not made on demand).
pub(crate) fn is_zero_copy(t: &Tensor) -> bool {
    !t.is_conj() && !t.is_neg() && !t.storage().is_deferred()
}

/// The numpy array of `t`, read-only in every case: over its storage when [`is_zero_copy`]; else over a
/// fresh row-major copy of its elements (the same promise whatever the format: `np.array(a)` or `a.copy()`
/// gives a writable one). `writable` asks for a writable array instead (a fresh copy). A `float4_e2m1fn_x2` tensor comes back one value a byte as ml_dtypes'
/// `float4_e2m1fn` when ml_dtypes has it (a fresh array whose last dimension is twice the tensor's: the
/// low nibble of each byte first, as torch and safetensors pack them); else as its packed bytes.
pub(crate) fn array<'py>(py: Python<'py>, t: &Tensor, writable: bool) -> PyResult<Bound<'py, PyAny>> {
    if t.dtype() == DType::F4E2M1FnX2 {
        let dtype = numpy_dtype(py, t.dtype())?;
        if dtype.getattr("name")?.extract::<String>()? == "float4_e2m1fn" {
            let packed = py.detach(|| t.data().map(|d| d.into_owned())).map_err(to_err)?;
            let values: Vec<u8> = packed.iter().flat_map(|b| [b & 0x0F, b >> 4]).collect();
            let mut shape = t.shape().to_vec();
            match shape.last_mut() {
                Some(last) => *last *= 2,
                None => shape.push(2),
            }
            return new_array(py, Buffer::from_vec(values), &shape, 1, dtype, writable);
        }
    }
    array_as_stored(py, t, writable)
}

/// [`array`] with every dtype's elements as stored (a packed float4 tensor as its bytes, in the packed
/// shape), for the torch tensors of `framework="pt"`.
fn array_as_stored<'py>(py: Python<'py>, t: &Tensor, writable: bool) -> PyResult<Bound<'py, PyAny>> {
    let size = t.dtype().size();
    let (buf, shape, strides, start, fresh): (Buffer, Vec<usize>, Vec<usize>, usize, bool) =
        if is_zero_copy(t) && !writable {
            let strides = t.strides().iter().map(|s| s * size).collect();
            (t.storage().clone(), t.shape().to_vec(), strides, t.storage_offset() * size, false)
        } else {
            let data = py.detach(|| t.data().map(|d| d.into_owned())).map_err(to_err)?;
            let strides = ckpt::tensor::tensor::contiguous_strides(t.shape()).iter().map(|s| s * size).collect();
            (Buffer::from_vec(data), t.shape().to_vec(), strides, 0, true)
        };
    // Every element addressed lies inside the storage: `Tensor` checks its view against its storage when it
    // is made (`required_storage_elements`), and a fresh copy is exactly its elements.
    let dtype = numpy_dtype(py, t.dtype())?;
    array_over(py, buf, &shape, &strides, start, fresh && writable, dtype)
}

/// A fresh row-major array of `shape` over `buf`, memory made for it (elements of `size` bytes: exactly
/// `buf`'s bytes); writable when asked.
fn new_array<'py>(
    py: Python<'py>,
    buf: Buffer,
    shape: &[usize],
    size: usize,
    dtype: Bound<'py, PyAny>,
    writable: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let strides: Vec<usize> = ckpt::tensor::tensor::contiguous_strides(shape).iter().map(|s| s * size).collect();
    array_over(py, buf, shape, &strides, 0, writable, dtype)
}

/// The array of `dtype`, `shape` and byte `strides` whose first element is `start` bytes into `buf`; every
/// element it addresses must lie inside `buf`. Writable when `writable` (only for fresh memory nothing else
/// references).
fn array_over<'py>(
    py: Python<'py>,
    buf: Buffer,
    shape: &[usize],
    strides: &[usize],
    start: usize,
    writable: bool,
    dtype: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let holder = Bound::new(py, MappedBytes { buf })?;
    let base = holder.borrow().buf.as_bytes().as_ptr();
    let mut dims: Vec<npy_intp> = shape.iter().map(|&d| d as npy_intp).collect();
    let mut byte_strides: Vec<npy_intp> = strides.iter().map(|&s| s as npy_intp).collect();
    let flags: c_int = if writable { npyffi::NPY_ARRAY_WRITEABLE } else { 0 };
    // SAFETY: `data` points `start` bytes into the holder's buffer, and every element of the view (`dims`,
    // `byte_strides`, the dtype's size) lies inside it (this function's contract, which its callers keep). The holder becomes the array's base (one
    // reference handed over), so the buffer lives as long as the array. The descriptor reference that
    // `PyArray_NewFromDescr` steals is a new one (`into_ptr`). Read-only arrays are never written through;
    // writable ones own fresh memory that nothing else references.
    unsafe {
        let data = base.add(start) as *mut c_void;
        let ptr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, NpyTypes::PyArray_Type),
            dtype.into_ptr() as *mut npyffi::PyArray_Descr,
            dims.len() as c_int,
            dims.as_mut_ptr(),
            byte_strides.as_mut_ptr(),
            data,
            flags,
            std::ptr::null_mut(),
        );
        if ptr.is_null() {
            return Err(PyErr::fetch(py));
        }
        let array = Bound::from_owned_ptr(py, ptr);
        if PY_ARRAY_API.PyArray_SetBaseObject(py, ptr as *mut npyffi::PyArrayObject, holder.into_ptr()) != 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(array)
    }
}

/// A core error of making an array.
fn to_err(e: ckpt::tensor::Error) -> PyErr {
    crate::errors::core_to_py(e, std::path::Path::new("<tensor>"))
}

/// What `ckpt._torch.tensor` needs to make a torch tensor of `t` without copying where it can: the numpy
/// array ([`array`]), the dtype's torch name, and, when the array is a window of a memory map, the byte
/// offset of its first element in the mapped file with its shape and strides in elements (`None` else).
pub(crate) fn torch_parts<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyTuple>> {
    let arr = array_as_stored(py, t, false)?;
    let mapped = is_zero_copy(t) && t.storage().is_mapped();
    let offset = mapped.then(|| t.storage().offset_in_backing() + t.storage_offset() * t.dtype().size());
    (arr, t.dtype().torch_name(), offset, t.shape().to_vec(), t.strides().to_vec(), t.requires_grad()).into_pyobject(py)
}
