//! ckpt's errors as the Python package's exceptions: `ckpt.Error` and one subclass per fault (bad input,
//! limit, I/O, usage; `python/ckpt/_errors.py`), each with the fault, the path and the message with its
//! causes. A storage error (a URL's object or bucket missing, credentials refused, ...) is about the URL,
//! redacted ([`About`]); a missing object or bucket raises `ckpt.NotFoundError`, a `FileNotFoundError`.

use std::path::{Path, PathBuf};

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

/// `ENOENT`, the same number on Linux, macOS and Windows.
const ENOENT: i32 = 2;

/// The operating system's error number of the first I/O error in `e`'s causes; `ENOENT` for an object or
/// bucket that does not exist (so that it raises `ckpt.NotFoundError`, as a missing file does).
fn errno(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    use ckpt::storage::StorageError;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.raw_os_error();
        }
        if let Some(storage) = s.downcast_ref::<StorageError>() {
            return storage_errno(storage);
        }
        source = s.source();
    }
    None
}

/// A storage error's error number: `ENOENT` for a missing object or bucket, a local file's error's.
fn storage_errno(e: &ckpt::storage::StorageError) -> Option<i32> {
    use ckpt::storage::StorageError;
    match e {
        StorageError::NotFound { .. } | StorageError::BucketMissing { .. } => Some(ENOENT),
        StorageError::Local { source, .. } => source.raw_os_error(),
        _ => None,
    }
}

/// [`errno`] of a facade error (whose storage errors are transparent: not among its causes).
fn errno_of(e: &ckpt::Error) -> Option<i32> {
    match e {
        ckpt::Error::Storage(s) => storage_errno(s),
        other => errno(other),
    }
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
        | ckpt::Error::LimitExceeded { path, .. }
        | ckpt::Error::EmptySelection { path, .. }
        | ckpt::Error::DestinationTaken { path, .. }
        | ckpt::Error::NotACheckpoint { path, .. }
        | ckpt::Error::SpecialFile { path, .. }
        | ckpt::Error::NoEntry { path, .. } => Some(path),
        _ => None,
    }
}

/// The Python exception of `fault` with `message`, about `path`.
fn exception(fault: Fault, message: String, path: Option<&Path>, errno: Option<i32>) -> PyErr {
    Python::attach(|py| {
        let made = MAKE
            .get_or_try_init(py, || -> PyResult<Py<PyAny>> { Ok(crate::helpers::make_error(py)?.unbind()) })
            // The path as a str (`pathlib.Path` would fold a URL's `//`).
            .and_then(|make| make.bind(py).call1((fault_name(fault), message, path.map(Path::as_os_str), errno)));
        match made {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        }
    })
}

/// A facade error as the package's exception.
pub(crate) fn to_py(e: ckpt::Error) -> PyErr {
    exception(e.fault(), chain(&e), path_of(&e), errno_of(&e))
}

/// A facade error and what it is about when it names no path itself: the local path or the URL (redacted:
/// no user information, no query) a storage operation was reading or writing.
#[derive(Debug)]
pub(crate) struct About {
    /// Boxed: a facade error is large, and this is the error of every fallible step of a call.
    error: Box<ckpt::Error>,
    about: Option<PathBuf>,
}

impl About {
    /// `error`, about `location`.
    pub(crate) fn at(error: ckpt::Error, location: &ckpt::storage::Location) -> About {
        About { error: Box::new(error), about: Some(PathBuf::from(location.to_string())) }
    }
}

impl From<ckpt::Error> for About {
    fn from(error: ckpt::Error) -> About {
        About { error: Box::new(error), about: None }
    }
}

impl From<ckpt::storage::StorageError> for About {
    fn from(error: ckpt::storage::StorageError) -> About {
        About { error: Box::new(error.into()), about: None }
    }
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

impl<T> IntoPy<T> for Result<T, About> {
    fn py(self) -> PyResult<T> {
        self.map_err(|About { error, about }| {
            let error = *error;
            let path = path_of(&error).map(Path::to_path_buf).or(about);
            exception(error.fault(), chain(&error), path.as_deref(), errno_of(&error))
        })
    }
}
