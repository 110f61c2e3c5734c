//! What the extension calls in Python: the package `ckpt` hands its helpers over when it is imported
//! (`_ckpt._hand_over(...)` in `ckpt/__init__.py`), so that the extension imports no module of its own
//! package (each of which would import the package, and so the extension, back).
//!
//! Python imports a module's package first: `ckpt._ckpt` is never loaded without `ckpt/__init__.py` running,
//! and that hands the helpers over before anything reaches the extension's functions.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// The package's helpers.
struct Helpers {
    /// `ckpt._values`: the classes of values only torch or an unknown class can be, and `parts`.
    values: Py<PyModule>,
    /// `ckpt._errors.make`: the package's exception of a fault.
    make_error: Py<PyAny>,
    /// `ckpt._dtypes.numpy_dtypes`: the numpy dtypes of torch dtype names.
    numpy_dtypes: Py<PyAny>,
}

static HELPERS: PyOnceLock<Helpers> = PyOnceLock::new();

/// Takes the package's helpers (`ckpt/__init__.py` calls it once; a second call keeps the first helpers).
#[pyfunction]
#[pyo3(name = "_hand_over")]
pub(crate) fn hand_over(
    py: Python<'_>,
    values: Bound<'_, PyModule>,
    make_error: Bound<'_, PyAny>,
    numpy_dtypes: Bound<'_, PyAny>,
) -> PyResult<()> {
    let helpers =
        Helpers { values: values.unbind(), make_error: make_error.unbind(), numpy_dtypes: numpy_dtypes.unbind() };
    let _ = HELPERS.set(py, helpers);
    Ok(())
}

fn helpers(py: Python<'_>) -> PyResult<&Helpers> {
    HELPERS.get(py).ok_or_else(|| {
        pyo3::exceptions::PyImportError::new_err(
            "ckpt._ckpt: the package ckpt has not handed its Python helpers over; import ckpt, not the extension alone",
        )
    })
}

/// `ckpt._values`.
pub(crate) fn values<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyModule>> {
    Ok(helpers(py)?.values.bind(py).clone())
}

/// `ckpt._errors.make`.
pub(crate) fn make_error<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
    Ok(helpers(py)?.make_error.bind(py).clone())
}

/// `ckpt._dtypes.numpy_dtypes`.
pub(crate) fn numpy_dtypes<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
    Ok(helpers(py)?.numpy_dtypes.bind(py).clone())
}
