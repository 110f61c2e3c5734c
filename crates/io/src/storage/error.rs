//! Why a storage operation failed, one variant per cause a caller can act on. Messages name the redacted
//! URL and never a credential.

use ckpt_tensor::FormatError;
use std::path::PathBuf;

/// Why reading or writing object storage failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The text has a scheme but is not a usable URL.
    #[error("{url}: not a storage URL: {reason}")]
    InvalidUrl {
        /// The URL, redacted.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// No storage is registered for the URL's scheme.
    #[error("{url}: no storage is registered for the scheme `{scheme}://` (known: {known})")]
    UnknownScheme {
        /// The URL, redacted.
        url: String,
        /// Its scheme.
        scheme: String,
        /// The schemes the registry knows, comma separated.
        known: String,
    },
    /// This build of ckpt has no object storage (the `remote` feature of `ckpt-io` is off).
    #[error("{url}: this build has no object storage (build with the `remote` feature)")]
    NotBuilt {
        /// The URL, redacted.
        url: String,
    },
    /// A storage option is unknown to the URL's store, or its value is invalid.
    #[error("{url}: storage option `{key}`: {reason}")]
    Option {
        /// The URL, redacted.
        url: String,
        /// The option's key (its value is never shown).
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The store could not be configured (missing region, credentials that cannot be loaded, …).
    #[error("{url}: cannot configure the store: {message}")]
    Config {
        /// The URL, redacted.
        url: String,
        /// What the store said, with credentials removed.
        message: String,
    },
    /// The object does not exist.
    #[error("{url}: no such object")]
    NotFound {
        /// The object's URL, redacted.
        url: String,
    },
    /// The bucket (container) does not exist.
    #[error("{url}: the bucket does not exist")]
    BucketMissing {
        /// The URL, redacted.
        url: String,
    },
    /// The server refused the credentials (unknown key, bad signature, expired token).
    #[error("{url}: the server refused the credentials: {message}")]
    Unauthenticated {
        /// The URL, redacted.
        url: String,
        /// What the server said, with credentials removed.
        message: String,
    },
    /// The credentials are valid but may not do this.
    #[error("{url}: permission denied: {message}")]
    PermissionDenied {
        /// The URL, redacted.
        url: String,
        /// What the server said, with credentials removed.
        message: String,
    },
    /// A conditional write lost: the object exists (`If-None-Match`) or changed (`If-Match`) — another
    /// writer got there first.
    #[error("{url}: another writer changed this object first (conditional write refused)")]
    Conflict {
        /// The object's URL, redacted.
        url: String,
    },
    /// Another save holds the destination's lock object.
    #[error("{url}: another save to this destination is in progress ({holder}); if it died, remove {lock}")]
    Locked {
        /// The destination, redacted.
        url: String,
        /// Who holds the lock, as it recorded itself.
        holder: String,
        /// The lock object's URL, redacted.
        lock: String,
    },
    /// The server asked to slow down (503 SlowDown, 429) on every retry.
    #[error("{url}: the server kept throttling requests (gave up after retries): {message}")]
    Throttled {
        /// The URL, redacted.
        url: String,
        /// The last response, with credentials removed.
        message: String,
    },
    /// The server failed (5xx) on every retry.
    #[error("{url}: the server failed (gave up after retries): {message}")]
    Server {
        /// The URL, redacted.
        url: String,
        /// The last response, with credentials removed.
        message: String,
    },
    /// Requests timed out on every retry.
    #[error("{url}: the server did not answer in time (gave up after retries): {message}")]
    Timeout {
        /// The URL, redacted.
        url: String,
        /// What timed out.
        message: String,
    },
    /// The connection failed or broke (refused, reset, closed mid-transfer) on every retry.
    #[error("{url}: the connection to the server failed (gave up after retries): {message}")]
    Connection {
        /// The URL, redacted.
        url: String,
        /// What failed, with credentials removed.
        message: String,
    },
    /// An object is shorter than its checkpoint says (truncated on the server).
    #[error("{url}: truncated: {expected} bytes expected, the object holds {found}")]
    Truncated {
        /// The object's URL, redacted.
        url: String,
        /// Bytes the reader needed.
        expected: u64,
        /// Bytes the object holds.
        found: u64,
    },
    /// The store does not do what was asked (for example writes to an `http(s)://` URL).
    #[error("{url}: not supported by this store: {message}")]
    NotSupported {
        /// The URL, redacted.
        url: String,
        /// What is not supported.
        message: String,
    },
    /// Any other failure the store reported.
    #[error("{url}: {message}")]
    Other {
        /// The URL, redacted.
        url: String,
        /// What the store said, with credentials removed.
        message: String,
    },
    /// A local file of a staged transfer could not be read or written.
    #[error("{}: {source}", path.display())]
    Local {
        /// The local file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl StorageError {
    /// Whether retrying later may succeed (throttling, server failures, timeouts, broken connections).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StorageError::Throttled { .. }
                | StorageError::Server { .. }
                | StorageError::Timeout { .. }
                | StorageError::Connection { .. }
        )
    }
}

impl FormatError for StorageError {
    /// Who is at fault: the caller for a bad URL, option or scheme; the data for a truncated object; this
    /// build for a missing feature; the storage (I/O) for everything else.
    fn fault(&self) -> ckpt_tensor::Fault {
        use ckpt_tensor::Fault;
        match self {
            StorageError::InvalidUrl { .. } | StorageError::UnknownScheme { .. } | StorageError::Option { .. } => {
                Fault::InvalidArgument
            }
            StorageError::NotBuilt { .. } | StorageError::NotSupported { .. } => Fault::Unsupported,
            StorageError::Truncated { .. } => Fault::Malformed,
            StorageError::Config { .. }
            | StorageError::NotFound { .. }
            | StorageError::BucketMissing { .. }
            | StorageError::Unauthenticated { .. }
            | StorageError::PermissionDenied { .. }
            | StorageError::Conflict { .. }
            | StorageError::Locked { .. }
            | StorageError::Throttled { .. }
            | StorageError::Server { .. }
            | StorageError::Timeout { .. }
            | StorageError::Connection { .. }
            | StorageError::Other { .. }
            | StorageError::Local { .. } => Fault::Io,
        }
    }
}
