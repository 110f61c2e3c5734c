//! Where checkpoints live: local paths and object stores by URL (`s3://`, `gs://`, `az://`, `http(s)://`),
//! behind one seam.
//!
//! - [`Location`]: a path or a URL, told apart by the scheme: a URL is never taken for a relative path.
//! - [`StorageOptions`]: the store's configuration keys (over each cloud's standard environment variables:
//!   `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ALLOW_HTTP`,
//!   `GOOGLE_*`, `AZURE_*`), retries with backoff, timeouts, parallel requests, part size. Credentials never
//!   reach a message: URLs are shown without user information or query, option values never, and store
//!   errors have every secret value replaced.
//! - [`Registry`] (feature `remote`): the store for each scheme, as PyTorch-BigGraph's plugin registry.
//! - [`Store`] (feature `remote`): a blocking handle on one prefix: list, head, ranged reads (coalesced,
//!   parallel), downloads and multipart uploads (parallel, memory within `concurrency × part_size`),
//!   conditional puts (`If-None-Match` / `If-Match`), deletes; requests and bytes counted ([`Stats`]).
//! - [`RangeFill`]: the hook a reader of a partial local copy calls before it reads a byte range;
//!   [`SparseMirror`] (feature `remote`) implements it over a [`Store`]: lazy, ranged, coalesced and parallel
//!   reads into sparse local files, each byte fetched once.
//! - [`read_small_file`], [`remove_tree`]: what a format does by path outside a commit (a list read, a
//!   checkpoint rotated out), on a local path or a URL.
//! - [`StorageError`]: one variant per cause (missing bucket, refused credentials, conflict, throttled,
//!   server failure, timeout, broken connection, truncated object, …), retried with backoff first where
//!   retrying is right.
//!
//! Local paths keep the commit path of this crate unchanged (mmap reads, `O_DIRECT` pipelined writes,
//! `RENAME_EXCHANGE` swaps, locks). How a checkpoint commits on an object store, where nothing can be
//! renamed, is [`remote_commit`]'s subject.

mod by_path;
mod error;
mod fill;
mod location;
#[cfg(feature = "remote")]
mod mirror;
mod options;
#[cfg(feature = "remote")]
mod registry;
#[cfg(feature = "remote")]
mod remote;
#[cfg(feature = "remote")]
pub mod remote_commit;
#[cfg(feature = "remote")]
mod upload;

pub use by_path::{read_small_file, remove_tree};
pub use error::StorageError;
pub use fill::RangeFill;
pub use location::{Location, RemoteUrl};
#[cfg(feature = "remote")]
pub use mirror::SparseMirror;
pub use options::{OptionSyntax, StorageOptions};
#[cfg(feature = "remote")]
pub use registry::{BuiltStore, Registry, StoreBuilder, registry};
#[cfg(feature = "remote")]
pub use remote::{ObjectInfo, PutCondition, Stats, StatsSnapshot, Store, totals};
#[cfg(feature = "remote")]
pub use upload::ObjectUpload;

/// Why a URL destination is refused by a build without the `remote` feature.
#[cfg(not(feature = "remote"))]
pub(crate) const NO_REMOTE: &str =
    "an object-store URL, and this build of ckpt-io has no object storage (its `remote` feature is off)";

/// The object-store URL a path given to a commit spells (`s3://bucket/ckpt` as a `Path`), if it is one:
/// the commits of this crate take URLs where they take paths, so that every format's `save` writes to
/// object storage through them.
///
/// # Errors
/// [`CommitError::Refused`](crate::CommitError::Refused) for a URL that cannot be read.
pub(crate) fn url_of_path(path: &std::path::Path) -> Result<Option<RemoteUrl>, crate::CommitError> {
    let Some(text) = path.to_str().filter(|t| t.contains("://")) else { return Ok(None) };
    match Location::parse(text) {
        Ok(Location::Remote(url)) => Ok(Some(url)),
        Ok(Location::Local(_)) => Ok(None),
        Err(e) => Err(crate::CommitError::Refused { path: path.to_path_buf(), reason: e.to_string() }),
    }
}

/// How a directory format lies on an object store: the names it owns under a checkpoint prefix (what a
/// new save replaces and removes) and its commit points, the objects written last, in order
/// ([`remote_commit`]'s table). Each directory format crate exports its own (`OBJECT_LAYOUT`).
#[derive(Debug, Clone, Copy)]
pub struct ObjectLayout {
    /// The format's name (`distcp`, `hf`, …), for messages.
    pub format: &'static str,
    /// Whether an object name under the prefix belongs to the format.
    pub owned: fn(&str) -> bool,
    /// The objects written last, in this order; a checkpoint without any of them is unfinished.
    pub commit_points: &'static [&'static str],
}
