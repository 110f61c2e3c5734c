//! Checkpoints at object-storage URLs (`s3://`, `gs://`, `az://`, `http(s)://`) for every call that takes a
//! path, as the `ckpt` command reads and writes them (facade/src/bin/ckpt.rs: `place`, `fetched`, `target`,
//! `published`): a URL source is fetched into a temporary directory that lives as long as the value this
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
/// `--storage-option KEY=VALUE` ([`StorageOptions::with_pair`]); the defaults when `None`. A key unknown to
/// a URL's store is refused when that store is opened (`ckpt.UsageError`).
pub(crate) fn storage_options(options: Option<&Bound<'_, PyDict>>) -> PyResult<StorageOptions> {
    let mut out = StorageOptions::default();
    let Some(options) = options else { return Ok(out) };
    for (k, v) in options.iter() {
        let key: String = k.extract().map_err(|_| usage("storage_options: every key must be a str", None))?;
        if key.contains('=') {
            return Err(usage(format!("storage option `{key}`: a key has no `=`"), None));
        }
        let value: String =
            v.extract().map_err(|_| usage(format!("storage option `{key}`: the value must be a str"), None))?;
        out = out.with_pair(&format!("{key}={value}")).map_err(|e| usage(e.to_string(), None))?;
    }
    Ok(out)
}

/// A path argument as a place: a URL when it has a scheme, else a local path (the command's `place`).
pub(crate) fn place(path: &Path) -> Result<Location, About> {
    match path.to_str() {
        Some(text) => Ok(Location::parse(text)?),
        None => Ok(Location::Local(path.to_path_buf())),
    }
}

/// What messages and `Checkpoint.path` show of `path`: the path, or the URL without user information and
/// query (where credentials travel).
pub(crate) fn shown(path: &Path) -> PathBuf {
    match place(path) {
        Ok(Location::Remote(url)) => PathBuf::from(url.redacted()),
        _ => path.to_path_buf(),
    }
}

/// The checkpoint at `path` ready to read: a local path as it is, a URL's objects fetched (`what`: all of
/// them, or what listing needs) into a temporary directory that lives as long as the [`Source`].
pub(crate) fn fetched(path: &Path, options: &StorageOptions, what: Fetch) -> Result<Source, About> {
    let location = place(path)?;
    ckpt::storage::fetch_with(&location, options, what).map_err(|e| About::at(e, &location))
}

/// Where to write `path`: a local path as it is; a URL, which the writers stream to (opening its store
/// with `options`).
pub(crate) fn target(path: &Path, options: &StorageOptions) -> Result<Target, About> {
    let location = place(path)?;
    ckpt::storage::target(&location, options).map_err(|e| About::at(e, &location))
}

/// Ends a write to `target` (nothing left to do: the writer committed it).
pub(crate) fn published(target: Target) -> Result<(), About> {
    let location = target.location().clone();
    target.publish().map(|_| ()).map_err(|e| About::at(e, &location))
}
