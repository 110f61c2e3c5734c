//! Checkpoints at object-storage URLs (`s3://`, `gs://`, `az://`, `http(s)://`) for every call that takes a
//! path, through the facade's `ckpt::place` as the `ckpt` command reads and writes them, with Python's
//! objects converted and errors naming the place: a URL source is fetched into a temporary directory that lives as long as the value this
//! module returns ([`ckpt::storage::Source`]); a URL target is the path every format's writer takes, which
//! streams each file straight to its object and commits with the format's commit points last
//! ([`ckpt::storage::target`]). The `storage_options` keyword argument holds what the
//! command's `--storage-option KEY=VALUE` gives: the store's configuration keys and ckpt's own (`max_retries`,
//! `retry_timeout`, `concurrency`, `part_size`). Values are never shown, in errors or anywhere else.

use std::path::{Path, PathBuf};

use ckpt::storage::{Fetch, Location, Source, StorageOptions, Target};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{About, usage};

/// The storage options in `options` (`{key: value}`, both `str`), each read as the `ckpt` command reads
/// `--storage-option KEY=VALUE` ([`ckpt::place::storage_options`]); the defaults when `None`. A key unknown to
/// a URL's store is refused when that store is opened (`ckpt.UsageError`).
pub(crate) fn storage_options(options: Option<&Bound<'_, PyDict>>) -> PyResult<StorageOptions> {
    let mut pairs = Vec::new();
    for (k, v) in options.map(|o| o.iter()).into_iter().flatten() {
        let key: String = k.extract().map_err(|_| usage("storage_options: every key must be a str", None))?;
        if key.contains('=') {
            return Err(usage(format!("storage option `{key}`: a key has no `=`"), None));
        }
        let value: String =
            v.extract().map_err(|_| usage(format!("storage option `{key}`: the value must be a str"), None))?;
        pairs.push(format!("{key}={value}"));
    }
    ckpt::place::storage_options(pairs.iter().map(String::as_str)).map_err(|e| usage(e.to_string(), None))
}

/// A path argument as a place ([`ckpt::place::place`]).
pub(crate) fn place(path: &Path) -> Result<Location, About> {
    Ok(ckpt::place::place(path)?)
}

/// What messages and `Checkpoint.path` show of `path` ([`ckpt::place::shown`]).
pub(crate) fn shown(path: &Path) -> PathBuf {
    ckpt::place::shown(path)
}

/// The checkpoint at `path` ready to read ([`ckpt::place::fetched`]), an error naming the place.
pub(crate) fn fetched(path: &Path, options: &StorageOptions, what: Fetch) -> Result<Source, About> {
    let location = place(path)?;
    ckpt::place::fetched(path, options, what).map_err(|e| About::at(e, &location))
}

/// Where to write `path` ([`ckpt::place::target`]), an error naming the place.
pub(crate) fn target(path: &Path, options: &StorageOptions) -> Result<Target, About> {
    let location = place(path)?;
    ckpt::place::target(path, options).map_err(|e| About::at(e, &location))
}

/// Ends a write to `target` (nothing left to do: the writer committed it).
pub(crate) fn published(target: Target) -> Result<(), About> {
    let location = target.location().clone();
    target.publish().map(|_| ()).map_err(|e| About::at(e, &location))
}
