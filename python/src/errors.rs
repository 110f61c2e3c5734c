//! ckpt's errors as the Python package's exceptions: `ckpt.Error` and one subclass per fault (bad input,
//! limit, I/O, usage; `python/ckpt/_errors.py`), each with the fault, the path and the message with its
//! causes.

use std::path::Path;

use ckpt::Fault;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// The package's exception factory, `ckpt._errors.make(fault, message, path, errno)`.
static MAKE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The fault's name in Python (`Error.fault`).
fn fault_name(fault: Fault) -> &'static str {
    match fault {
        Fault::Malformed => "malformed",
        Fault::Unsupported => "unsupported",
        Fault::Limit => "limit",
        Fault::Io => "io",
        Fault::InvalidArgument => "usage",
        _ => "malformed",
    }
}

/// An error's message followed by each cause not already part of it (as the `ckpt` command prints it).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    ckpt::error_chain(e, "\n  caused by: ")
}

/// The operating system's error number of the first I/O error in `e`'s causes.
fn errno(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.raw_os_error();
        }
        source = s.source();
    }
    None
}

/// The path a facade error is about.
fn path_of(e: &ckpt::Error) -> Option<&Path> {
    match e {
        ckpt::Error::Io { path, .. }
        | ckpt::Error::UnknownFormat { path, .. }
        | ckpt::Error::FeatureDisabled { path, .. }
        | ckpt::Error::Format { path, .. }
        | ckpt::Error::InvalidArgument { path, .. }
        | ckpt::Error::AlreadyExists { path, .. }
        | ckpt::Error::LimitExceeded { path, .. } => Some(path),
        _ => None,
    }
}

/// The Python exception of `fault` with `message`, about `path`.
fn exception(fault: Fault, message: String, path: Option<&Path>, errno: Option<i32>) -> PyErr {
    Python::attach(|py| {
        let made = MAKE
            .get_or_try_init(py, || -> PyResult<Py<PyAny>> { Ok(py.import("ckpt._errors")?.getattr("make")?.unbind()) })
            .and_then(|make| make.bind(py).call1((fault_name(fault), message, path, errno)));
        match made {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        }
    })
}

/// A facade error as the package's exception.
pub(crate) fn to_py(e: ckpt::Error) -> PyErr {
    exception(e.fault(), chain(&e), path_of(&e), errno(&e))
}

/// A core error (a tensor operation, a conversion of a value) about `path`, as the package's exception.
pub(crate) fn core_to_py(e: ckpt::tensor::Error, path: &Path) -> PyErr {
    exception(e.fault(), format!("{}: {}", path.display(), chain(&e)), Some(path), errno(&e))
}

/// A usage error (`ckpt.UsageError`, also a `ValueError`) with `message`.
pub(crate) fn usage(message: impl Into<String>, path: Option<&Path>) -> PyErr {
    exception(Fault::InvalidArgument, message.into(), path, None)
}

/// `Result` of the facade into `PyResult`.
pub(crate) trait IntoPy<T> {
    /// The error as the package's exception.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for ckpt::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
