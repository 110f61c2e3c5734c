//! A command's path argument as a place, and what the `ckpt` tool and the Python package do with it alike:
//! a path or URL parsed ([`place`]; what messages show of it, [`shown`]), a source fetched ([`fetched`]), a
//! target opened for writing ([`target`], published by [`ckpt::storage::Target::publish`](crate::storage::Target::publish)),
//! and the storage options given as `KEY=VALUE` text ([`storage_options`]: ckpt's own keys `max_retries`,
//! `retry_timeout`, `concurrency`, `part_size`, and the store's). Values are never shown.

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::storage::{Fetch, Location, Source, StorageOptions, Target};

/// A path argument as a place: a URL when it has a scheme, else a local path (a path that is not UTF-8 is
/// always local).
///
/// ```
/// use std::path::Path;
/// assert!(ckpt::place::place(Path::new("model.pt")).unwrap().is_local());
/// assert!(!ckpt::place::place(Path::new("s3://bucket/run/step-1")).unwrap().is_local());
/// ```
///
/// # Errors
/// [`crate::Error::Storage`] for a URL that does not parse.
pub fn place(path: &Path) -> Result<Location> {
    match path.to_str() {
        Some(text) => Ok(Location::parse(text)?),
        None => Ok(Location::Local(path.to_path_buf())),
    }
}

/// What messages show of `path`: the path, or the URL without user information and query (where
/// credentials travel).
pub fn shown(path: &Path) -> PathBuf {
    match place(path) {
        Ok(Location::Remote(url)) => PathBuf::from(url.redacted()),
        _ => path.to_path_buf(),
    }
}

/// The checkpoint at `path` ready to read: a local path as it is, a URL's objects fetched (`what`: all of
/// them, what listing needs, or as they are read) into a temporary directory that lives as long as the
/// [`Source`].
///
/// # Errors
/// As [`place`] and [`crate::storage::fetch_with`].
pub fn fetched(path: &Path, options: &StorageOptions, what: Fetch) -> Result<Source> {
    crate::storage::fetch_with(&place(path)?, options, what)
}

/// Where to write `path`: a local path as it is; a URL, which the writers stream to (opening its store
/// with `options`).
///
/// # Errors
/// As [`place`].
pub fn target(path: &Path, options: &StorageOptions) -> Result<Target> {
    crate::storage::target(&place(path)?, options)
}

/// The storage options of `pairs`, each `KEY=VALUE` as the `ckpt` tool's `--storage-option` gives it and
/// the Python package's `storage_options` dict holds it ([`StorageOptions::with_pair`]); the defaults for
/// none. A key unknown to a URL's store is refused when that store is opened.
///
/// ```
/// let o = ckpt::place::storage_options(["max_retries=2", "aws_region=eu-west-1"]).unwrap();
/// assert_eq!(o.max_retries, 2);
/// assert!(ckpt::place::storage_options(["max_retries=many"]).is_err());
/// ```
///
/// # Errors
/// [`crate::Error::StorageOption`] for a pair that is not `KEY=VALUE`, or a value of ckpt's own keys it
/// cannot read (the message names the key, never the value).
pub fn storage_options<'a>(pairs: impl IntoIterator<Item = &'a str>) -> Result<StorageOptions> {
    let mut options = StorageOptions::default();
    for pair in pairs {
        options = options.with_pair(pair)?;
    }
    Ok(options)
}
