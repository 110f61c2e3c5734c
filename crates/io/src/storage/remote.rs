//! A blocking handle on one object-store prefix ([`Store`]): listing, ranged and coalesced parallel reads,
//! downloads and multipart uploads with bounded memory, conditional puts, deletes; every request counted.
//! `object_store` (arrow-rs) speaks the protocols; a process-wide tokio runtime drives it.

use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use futures_util::stream::{self, StreamExt, TryStreamExt};
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::options::redact;
use super::{Registry, RemoteUrl, StorageError, StorageOptions};

/// Gaps up to this size between two wanted ranges are fetched rather than split into two requests.
const COALESCE_GAP: u64 = 1 << 20;

/// Makes ring rustls's crypto provider for this process (HTTPS: the build has no other), unless the program
/// installed one: before any store's HTTP client is built.
fn install_tls_provider() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The runtime every [`Store`] blocks on: a few worker threads, started on first use.
fn runtime() -> Result<&'static tokio::runtime::Runtime, StorageError> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .thread_name("ckpt-storage")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|message| StorageError::Other {
            url: String::new(),
            message: format!("cannot start the I/O runtime: {message}"),
        })
}

/// Requests and bytes a [`Store`] moved, shared by its clones.
#[derive(Debug, Default)]
pub struct Stats {
    requests: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    objects_written: AtomicU64,
}

/// A copy of [`Stats`] at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Requests sent (a retry of one is not counted again; a list counts one per call).
    pub requests: u64,
    /// Bytes of object data received.
    pub bytes_read: u64,
    /// Bytes of object data sent.
    pub bytes_written: u64,
    /// Objects a streamed write ([`Store::upload`]) completed.
    pub objects_written: u64,
}

/// Requests and bytes of every [`Store`] of the process ([`totals`]).
static TOTALS: Stats = Stats {
    requests: AtomicU64::new(0),
    bytes_read: AtomicU64::new(0),
    bytes_written: AtomicU64::new(0),
    objects_written: AtomicU64::new(0),
};

/// Requests and bytes every [`Store`] of this process has moved so far (monotonic): what a command
/// reports for stores it did not open itself (a format's writer streaming to a URL opens its own).
pub fn totals() -> StatsSnapshot {
    TOTALS.snapshot()
}

impl Stats {
    fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        TOTALS.requests.fetch_add(1, Ordering::Relaxed);
    }

    fn read(&self, bytes: u64) {
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        TOTALS.bytes_read.fetch_add(bytes, Ordering::Relaxed);
    }

    fn wrote(&self, bytes: u64) {
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        TOTALS.bytes_written.fetch_add(bytes, Ordering::Relaxed);
    }

    fn completed(&self) {
        self.objects_written.fetch_add(1, Ordering::Relaxed);
        TOTALS.objects_written.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            requests: self.requests.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            objects_written: self.objects_written.load(Ordering::Relaxed),
        }
    }
}

/// One object under a [`Store`]'s prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Its name relative to the prefix (`__0_0.distcp`, `sub/x.bin`); empty for the prefix itself.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its entity tag, when the store gives one.
    pub etag: Option<String>,
}

/// How a [`Store::put`] treats an object that already exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutCondition {
    /// Replace it.
    Overwrite,
    /// Refuse ([`StorageError::Conflict`]) if it exists (`If-None-Match: *`).
    Create,
    /// Refuse unless it still has this entity tag (`If-Match`).
    Update(String),
}

/// A blocking handle on the objects under one URL prefix of one store. Cheap to clone; clones share the
/// connection pool and the [`Stats`].
#[derive(Clone)]
pub struct Store {
    runtime: &'static tokio::runtime::Runtime,
    inner: Arc<dyn ObjectStore>,
    multipart: Option<Arc<dyn MultipartStore>>,
    root: ObjectPath,
    url: RemoteUrl,
    options: StorageOptions,
    secrets: Arc<Vec<String>>,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("url", &self.url).field("store", &self.inner.to_string()).finish()
    }
}

impl Store {
    /// Opens the store that `url`'s scheme names in the global [registry](super::registry), configured by
    /// the environment and `options`.
    ///
    /// # Errors
    /// [`StorageError::UnknownScheme`], [`StorageError::Option`] or [`StorageError::Config`].
    pub fn open(url: &RemoteUrl, options: &StorageOptions) -> Result<Store, StorageError> {
        super::registry().open(url, options)
    }

    /// Wraps a store already built (a registry builder's result, or a test's in-memory store) with
    /// `root` as its prefix.
    ///
    /// # Errors
    /// [`StorageError::Other`] when the I/O runtime cannot start (no threads).
    pub fn from_parts(
        inner: Arc<dyn ObjectStore>,
        root: ObjectPath,
        url: RemoteUrl,
        options: &StorageOptions,
    ) -> Result<Store, StorageError> {
        Ok(Store {
            runtime: runtime()?,
            inner,
            multipart: None,
            root,
            url,
            secrets: Arc::new(options.secrets()),
            options: options.clone(),
            stats: Arc::new(Stats::default()),
        })
    }

    /// This store with its multipart interface (parts sent in any order; see [`BuiltStore::multipart`]).
    ///
    /// [`BuiltStore::multipart`]: super::BuiltStore::multipart
    #[must_use]
    pub fn with_multipart(self, multipart: Arc<dyn MultipartStore>) -> Store {
        Store { multipart: Some(multipart), ..self }
    }

    /// The URL of the prefix.
    pub fn url(&self) -> &RemoteUrl {
        &self.url
    }

    /// The options it was opened with.
    pub fn options(&self) -> &StorageOptions {
        &self.options
    }

    /// Requests and bytes moved so far.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// A handle on the prefix `name` under this one (`s3://b/ckpt` → `s3://b/ckpt/<name>`), sharing the
    /// connection pool and the stats.
    pub fn child(&self, name: &str) -> Store {
        Store { root: self.path(name), url: self.url.join(name), ..self.clone() }
    }

    fn path(&self, name: &str) -> ObjectPath {
        if name.is_empty() {
            return self.root.clone();
        }
        name.split('/').filter(|p| !p.is_empty()).fold(self.root.clone(), |p, part| p.join(part))
    }

    /// This handle with other transfer options (same store, connection pool and stats).
    pub fn with_options(&self, options: &StorageOptions) -> Store {
        Store { options: options.clone(), ..self.clone() }
    }

    /// The redacted URL of `name` under the prefix, for messages.
    pub fn url_of(&self, name: &str) -> String {
        if name.is_empty() { self.url.redacted() } else { self.url.join(name).redacted() }
    }

    /// Every object under the prefix (recursively), by name.
    ///
    /// # Errors
    /// The classified store error ([`StorageError::BucketMissing`], [`StorageError::Unauthenticated`], …).
    pub fn list(&self) -> Result<Vec<ObjectInfo>, StorageError> {
        self.stats.request();
        let prefix = (!self.root.as_ref().is_empty()).then_some(&self.root);
        let root = self.root.clone();
        let found: Vec<object_store::ObjectMeta> =
            self.block_on(self.inner.list(prefix).try_collect()).map_err(|e| self.classify("", e))?;
        let mut out: Vec<ObjectInfo> = found
            .into_iter()
            .filter_map(|m| {
                let name = match m.location.prefix_match(&root) {
                    Some(parts) => parts.map(|p| p.as_ref().to_owned()).collect::<Vec<_>>().join("/"),
                    None => return None,
                };
                Some(ObjectInfo { name, size: m.size, etag: m.e_tag })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The object `name` (empty: the prefix itself as an object), or `None` if there is none.
    ///
    /// # Errors
    /// The classified store error for anything but a missing object.
    pub fn head(&self, name: &str) -> Result<Option<ObjectInfo>, StorageError> {
        self.stats.request();
        match self.block_on(self.inner.head(&self.path(name))) {
            Ok(m) => Ok(Some(ObjectInfo { name: name.to_owned(), size: m.size, etag: m.e_tag })),
            Err(e) => match self.classify(name, e) {
                StorageError::NotFound { .. } => Ok(None),
                e => Err(e),
            },
        }
    }

    /// The bytes `range` of the object `name`.
    ///
    /// # Errors
    /// [`StorageError::Truncated`] when the object ends before `range` does; the classified store error.
    pub fn read(&self, name: &str, range: Range<u64>) -> Result<Bytes, StorageError> {
        Ok(self.read_ranges(name, std::slice::from_ref(&range))?.pop().unwrap_or_default())
    }

    /// The bytes of each of `ranges` of the object `name`: ranges closer than 1 MiB are fetched as one,
    /// long ones split at the part size, and up to [`StorageOptions::concurrency`] requests run at once.
    ///
    /// # Errors
    /// [`StorageError::Truncated`] when the object ends before a range does; the classified store error.
    pub fn read_ranges(&self, name: &str, ranges: &[Range<u64>]) -> Result<Vec<Bytes>, StorageError> {
        self.read_ranges_within(name, ranges, COALESCE_GAP)
    }

    /// [`Store::read_ranges`], fetching ranges closer than `gap` bytes as one.
    pub(crate) fn read_ranges_within(
        &self,
        name: &str,
        ranges: &[Range<u64>],
        gap: u64,
    ) -> Result<Vec<Bytes>, StorageError> {
        let fetches = plan_fetches(ranges, self.options.part_size as u64, gap);
        let path = self.path(name);
        let got: Vec<(Range<u64>, Bytes)> = self.block_on(
            stream::iter(fetches.into_iter().map(|r| {
                let path = path.clone();
                async move {
                    let bytes = self.get_range(&path, name, r.clone(), r.end).await?;
                    Ok((r, bytes))
                }
            }))
            .buffered(self.options.concurrency.max(1))
            .try_collect(),
        )?;
        ranges
            .iter()
            .map(|want| {
                if want.start >= want.end {
                    return Ok(Bytes::new());
                }
                // The fetched ranges are sorted and disjoint; `want` lies in one or spans several.
                let first = got.partition_point(|(r, _)| r.end <= want.start);
                let mut out = Vec::new();
                let mut at = want.start;
                for (r, bytes) in got.iter().skip(first) {
                    if at >= want.end || r.start > at {
                        break;
                    }
                    let from = usize::try_from(at - r.start).unwrap_or(usize::MAX);
                    let to = usize::try_from(want.end.min(r.end) - r.start).unwrap_or(usize::MAX);
                    let piece = bytes.slice(from.min(bytes.len())..to.min(bytes.len()));
                    if from == 0 && to == bytes.len() && want.start == r.start && want.end == r.end {
                        return Ok(piece);
                    }
                    at += piece.len() as u64;
                    out.extend_from_slice(&piece);
                }
                if at < want.end {
                    return Err(StorageError::Truncated { url: self.url_of(name), expected: want.end, found: at });
                }
                Ok(Bytes::from(out))
            })
            .collect()
    }

    /// Copies the object `name` (`size` bytes, as listed) into the local file `dst` with parallel ranged
    /// reads of the part size: memory stays within `concurrency × part_size`. Returns the bytes copied.
    ///
    /// # Errors
    /// [`StorageError::Local`] for the file; [`StorageError::Truncated`]; the classified store error.
    pub fn download(&self, name: &str, size: u64, dst: &Path) -> Result<u64, StorageError> {
        use std::os::unix::fs::FileExt;
        let local = |source| StorageError::Local { path: dst.to_path_buf(), source };
        let file = std::fs::File::create(dst).map_err(local)?;
        file.set_len(size).map_err(local)?;
        let part = self.options.part_size.max(1) as u64;
        let path = self.path(name);
        let parts = (0..size.div_ceil(part)).map(|i| i * part..((i + 1) * part).min(size));
        let file = &file;
        self.block_on(
            stream::iter(parts.map(|r| {
                let path = path.clone();
                async move {
                    let bytes = self.get_range(&path, name, r.clone(), size).await?;
                    file.write_all_at(&bytes, r.start).map_err(local)
                }
            }))
            .buffer_unordered(self.options.concurrency.max(1))
            .try_collect::<Vec<()>>(),
        )?;
        Ok(size)
    }

    /// One GET of `range` of the object at `path` (`name` for messages), counted; an object that ends
    /// before `range` does is [`StorageError::Truncated`], reported as expecting `expected` bytes.
    async fn get_range(
        &self,
        path: &ObjectPath,
        name: &str,
        range: Range<u64>,
        expected: u64,
    ) -> Result<Bytes, StorageError> {
        self.stats.request();
        let bytes = self.inner.get_range(path, range.clone()).await.map_err(|e| self.classify(name, e))?;
        self.stats.read(bytes.len() as u64);
        if (bytes.len() as u64) < range.end - range.start {
            return Err(StorageError::Truncated {
                url: self.url_of(name),
                expected,
                found: range.start + bytes.len() as u64,
            });
        }
        Ok(bytes)
    }

    /// Writes `data` as the object `name` in one request, under `condition`. Returns the new entity tag.
    ///
    /// # Errors
    /// [`StorageError::Conflict`] when `condition` fails; the classified store error.
    pub fn put(&self, name: &str, data: Bytes, condition: PutCondition) -> Result<Option<String>, StorageError> {
        let mode = match condition {
            PutCondition::Overwrite => PutMode::Overwrite,
            PutCondition::Create => PutMode::Create,
            PutCondition::Update(etag) => {
                PutMode::Update(object_store::UpdateVersion { e_tag: Some(etag), version: None })
            }
        };
        self.stats.request();
        let len = data.len() as u64;
        let result = self
            .block_on(self.inner.put_opts(&self.path(name), PutPayload::from_bytes(data), PutOptions::from(mode)))
            .map_err(|e| self.classify(name, e))?;
        self.stats.wrote(len);
        Ok(result.e_tag)
    }

    /// Uploads the local file `src` as the object `name`: one put up to the part size, a multipart upload
    /// above it, whose parts are read and sent `concurrency` at a time (memory stays within
    /// `concurrency × part_size`). A failed multipart upload is aborted, so nothing of it becomes visible.
    /// Returns the bytes sent.
    ///
    /// # Errors
    /// [`StorageError::Local`] for the file; the classified store error.
    pub fn upload_file(&self, name: &str, src: &Path) -> Result<u64, StorageError> {
        use std::os::unix::fs::FileExt;
        let local = |source| StorageError::Local { path: src.to_path_buf(), source };
        let file = std::fs::File::open(src).map_err(local)?;
        let size = file.metadata().map_err(local)?.len();
        let part = self.options.part_size.max(5 << 20) as u64;
        let read_part = |r: Range<u64>| -> Result<Bytes, StorageError> {
            let mut buf = vec![0u8; usize::try_from(r.end - r.start).unwrap_or(0)];
            file.read_exact_at(&mut buf, r.start).map_err(local)?;
            Ok(Bytes::from(buf))
        };
        if size <= part {
            return self.put(name, read_part(0..size)?, PutCondition::Overwrite).map(|_| size);
        }
        let path = self.path(name);
        self.stats.request();
        let mut upload = self.block_on(self.inner.put_multipart(&path)).map_err(|e| self.classify(name, e))?;
        let parts: Vec<Range<u64>> = (0..size.div_ceil(part)).map(|i| i * part..((i + 1) * part).min(size)).collect();
        // Parts are read in order (each read blocks only its own turn) and sent `concurrency` at a time.
        let sent: Result<(), StorageError> = self.block_on(async {
            let mut in_flight = futures_util::stream::FuturesOrdered::new();
            for r in parts {
                while in_flight.len() >= self.options.concurrency.max(1) {
                    if let Some(done) = in_flight.next().await {
                        done?;
                    }
                }
                let bytes = read_part(r)?;
                let len = bytes.len() as u64;
                self.stats.request();
                let fut = upload.put_part(PutPayload::from_bytes(bytes));
                let stats = &self.stats;
                in_flight.push_back(async move {
                    fut.await.map_err(|e| self.classify(name, e))?;
                    stats.wrote(len);
                    Ok::<(), StorageError>(())
                });
            }
            while let Some(done) = in_flight.next().await {
                done?;
            }
            Ok(())
        });
        if let Err(e) = sent {
            self.stats.request();
            let _ = self.block_on(upload.abort());
            return Err(e);
        }
        self.stats.request();
        match self.block_on(upload.complete()) {
            Ok(_) => Ok(size),
            Err(e) => {
                let _ = self.block_on(upload.abort());
                Err(self.classify(name, e))
            }
        }
    }

    /// Removes the object `name`; a missing one is not an error.
    ///
    /// # Errors
    /// The classified store error.
    pub fn delete(&self, name: &str) -> Result<(), StorageError> {
        self.stats.request();
        match self.block_on(self.inner.delete(&self.path(name))) {
            Ok(()) => Ok(()),
            Err(e) => match self.classify(name, e) {
                StorageError::NotFound { .. } => Ok(()),
                e => Err(e),
            },
        }
    }

    pub(crate) fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Maps a store error on the object `name` to the variant the caller can act on, with credentials
    /// removed from every message.
    pub(crate) fn classify(&self, name: &str, e: object_store::Error) -> StorageError {
        classify(&self.url_of(name), &self.secrets, e)
    }

    pub(crate) fn object_path(&self, name: &str) -> ObjectPath {
        self.path(name)
    }

    pub(crate) fn multipart_store(&self) -> Option<&Arc<dyn MultipartStore>> {
        self.multipart.as_ref()
    }

    pub(crate) fn runtime(&self) -> &'static tokio::runtime::Runtime {
        self.runtime
    }

    pub(crate) fn count_request(&self) {
        self.stats.request();
    }

    pub(crate) fn count_written(&self, bytes: u64) {
        self.stats.wrote(bytes);
    }

    pub(crate) fn count_completed(&self) {
        self.stats.completed();
    }
}

/// The requests that fetch `ranges`: sorted, merged where they overlap or lie closer than `gap` bytes
/// ([`COALESCE_GAP`] for [`Store::read_ranges`]), and cut at `part` bytes.
pub(crate) fn plan_fetches(ranges: &[Range<u64>], part: u64, gap: u64) -> Vec<Range<u64>> {
    let mut sorted: Vec<Range<u64>> = ranges.iter().filter(|r| r.start < r.end).cloned().collect();
    sorted.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match merged.last_mut() {
            Some(last) if r.start <= last.end.saturating_add(gap) => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    let part = part.max(1);
    merged
        .into_iter()
        .flat_map(|r| {
            let n = (r.end - r.start).div_ceil(part);
            (0..n).map(move |i| r.start + i * part..(r.start + (i + 1) * part).min(r.end))
        })
        .collect()
}

/// The error's text with its sources, credentials removed.
fn chain_text(e: &(dyn std::error::Error + 'static), secrets: &[String]) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    redact(&text, secrets)
}

/// The kind of the first HTTP error in `e`'s sources, if any.
fn http_kind(e: &(dyn std::error::Error + 'static)) -> Option<object_store::client::HttpErrorKind> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(h) = s.downcast_ref::<object_store::client::HttpError>() {
            return Some(h.kind());
        }
        source = s.source();
    }
    None
}

/// Maps an `object_store` error to a [`StorageError`] for the object at `url` (redacted).
pub(crate) fn classify(url: &str, secrets: &[String], e: object_store::Error) -> StorageError {
    use object_store::client::HttpErrorKind;
    let url = url.to_owned();
    let message = chain_text(&e, secrets);
    let has = |needle: &str| message.contains(needle);
    if has("NoSuchBucket") || has("bucket does not exist") || has("ContainerNotFound") {
        return StorageError::BucketMissing { url };
    }
    if has("InvalidAccessKeyId") || has("SignatureDoesNotMatch") || has("ExpiredToken") || has("InvalidToken") {
        return StorageError::Unauthenticated { url, message };
    }
    match e {
        object_store::Error::NotFound { .. } => return StorageError::NotFound { url },
        object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
            return StorageError::Conflict { url };
        }
        object_store::Error::Unauthenticated { .. } => return StorageError::Unauthenticated { url, message },
        object_store::Error::PermissionDenied { .. } => return StorageError::PermissionDenied { url, message },
        object_store::Error::NotSupported { .. } | object_store::Error::NotImplemented { .. } => {
            return StorageError::NotSupported { url, message };
        }
        object_store::Error::UnknownConfigurationKey { key, .. } => {
            return StorageError::Option { url, key, reason: "not a configuration key of this store".into() };
        }
        _ => {}
    }
    if has("SlowDown") || has("429 Too Many Requests") || has("status code: 429") {
        return StorageError::Throttled { url, message };
    }
    if has("status code: 5") {
        return StorageError::Server { url, message };
    }
    match http_kind(&e) {
        Some(HttpErrorKind::Timeout) => StorageError::Timeout { url, message },
        Some(HttpErrorKind::Connect | HttpErrorKind::Request | HttpErrorKind::Interrupted) => {
            StorageError::Connection { url, message }
        }
        _ if has("timed out") || has("deadline has elapsed") => StorageError::Timeout { url, message },
        _ => StorageError::Other { url, message },
    }
}

impl Registry {
    /// Builds the store for `url` with `options` (see [`Store::open`]).
    ///
    /// # Errors
    /// [`StorageError::UnknownScheme`], [`StorageError::Option`] or [`StorageError::Config`].
    pub fn open(&self, url: &RemoteUrl, options: &StorageOptions) -> Result<Store, StorageError> {
        let build = self.builder(url)?;
        install_tls_provider();
        let built = build(url, options)?;
        let store = Store::from_parts(built.store, built.root, url.clone(), options)?;
        Ok(match built.multipart {
            Some(m) => store.with_multipart(m),
            None => store,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    #[test]
    fn fetches_coalesce_and_split() {
        assert_eq!(plan_fetches(&[0..10, 20..30], 1 << 30, COALESCE_GAP), vec![0..30]);
        assert_eq!(plan_fetches(&[5 << 20..6 << 20, 0..10], 1 << 30, COALESCE_GAP), vec![0..10, 5 << 20..6 << 20]);
        assert_eq!(plan_fetches(std::slice::from_ref(&(0..25)), 10, COALESCE_GAP), vec![0..10, 10..20, 20..25]);
        assert_eq!(plan_fetches(std::slice::from_ref(&(3..3)), 10, COALESCE_GAP), Vec::<Range<u64>>::new());
        assert_eq!(plan_fetches(&[0..10, 20..30], 1 << 30, 4), vec![0..10, 20..30]);
        assert_eq!(plan_fetches(&[0..10, 10..30], 1 << 30, 0), vec![0..30]);
    }

    pub(crate) fn memory() -> Store {
        let url = match super::super::Location::parse("memory://test/root").unwrap() {
            super::super::Location::Remote(u) => u,
            super::super::Location::Local(_) => panic!(),
        };
        Store::from_parts(
            Arc::new(object_store::memory::InMemory::new()),
            ObjectPath::from("root"),
            url,
            &StorageOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn reads_writes_and_conditions_in_memory() {
        let store = memory();
        let data: Vec<u8> = (0..100u8).collect();
        store.put("a/b.bin", Bytes::from(data.clone()), PutCondition::Create).unwrap();
        assert!(matches!(
            store.put("a/b.bin", Bytes::from_static(b"x"), PutCondition::Create),
            Err(StorageError::Conflict { .. })
        ));
        let listed = store.list().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].name, "a/b.bin");
        let got = store.read_ranges("a/b.bin", &[10..20, 0..5, 30..30, 15..40]).unwrap();
        assert_eq!(&got[0][..], &data[10..20]);
        assert_eq!(&got[1][..], &data[0..5]);
        assert!(got[2].is_empty());
        assert_eq!(&got[3][..], &data[15..40]);
        assert!(matches!(store.read("a/b.bin", 90..120), Err(StorageError::Truncated { found: 100, .. })));
        assert!(store.head("nope").unwrap().is_none());
        assert!(matches!(store.read("nope", 0..1), Err(StorageError::NotFound { .. })));
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("x");
        store.download("a/b.bin", 100, &local).unwrap();
        assert_eq!(std::fs::read(&local).unwrap(), data);
        store.delete("a/b.bin").unwrap();
        store.delete("a/b.bin").unwrap();
        assert!(store.list().unwrap().is_empty());
        assert!(store.stats().requests >= 10);
    }

    #[test]
    fn multipart_uploads_round_trip() {
        let store = memory();
        let options = StorageOptions::default().with_part_size(5 << 20).with_concurrency(3);
        let store = Store { options, ..store };
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("big");
        let data: Vec<u8> = (0..(12u32 << 20) + 7).map(|i| (i % 251) as u8).collect();
        std::fs::write(&src, &data).unwrap();
        assert_eq!(store.upload_file("big", &src).unwrap(), data.len() as u64);
        let back = dir.path().join("back");
        store.download("big", data.len() as u64, &back).unwrap();
        assert!(std::fs::read(&back).unwrap() == data);
        let stats = store.stats();
        assert!(stats.bytes_written == data.len() as u64 && stats.bytes_read == data.len() as u64, "{stats:?}");
    }
}
