//! Which store serves a URL: a table from scheme to builder, as PyTorch-BigGraph's `CHECKPOINT_STORAGES`
//! plugin registry maps URL schemes to storages. Built in: `s3`/`s3a` (S3 and S3-compatible servers),
//! `gs` (Google Cloud Storage), `az`/`azure`/`abfs`/`abfss`/`adl` (Azure Blob Storage), `http`/`https`
//! (reads of any HTTP server; S3-style `https://` URLs of a bucket can be registered as S3 by a caller).

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjectPath;
use object_store::{ClientConfigKey, ObjectStore};

use super::options::redact;
use super::{RemoteUrl, StorageError, StorageOptions};

/// Builds the store for a URL ([`BuiltStore`]).
pub type StoreBuilder = dyn Fn(&RemoteUrl, &StorageOptions) -> Result<BuiltStore, StorageError> + Send + Sync;

/// What a [`StoreBuilder`] makes.
#[derive(Clone)]
pub struct BuiltStore {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// The same store's multipart interface, where it has one (S3, GCS, Azure, in-memory): uploads whose
    /// parts are sent in any order, as streaming writers need (they send the first part, where a
    /// header's patches land, last). Without it a streamed file is sent in order.
    pub multipart: Option<Arc<dyn MultipartStore>>,
    /// The prefix the URL names inside the store.
    pub root: ObjectPath,
}

impl std::fmt::Debug for BuiltStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltStore")
            .field("store", &self.store.to_string())
            .field("multipart", &self.multipart.is_some())
            .field("root", &self.root)
            .finish()
    }
}

impl BuiltStore {
    /// A store with a multipart interface.
    pub fn with_multipart<S: ObjectStore + MultipartStore>(store: S, root: ObjectPath) -> BuiltStore {
        let store = Arc::new(store);
        BuiltStore { store: Arc::clone(&store) as Arc<dyn ObjectStore>, multipart: Some(store), root }
    }
}

/// Stores by URL scheme. [`registry`] is the process-wide one every [`Store::open`](super::Store::open)
/// consults; [`Registry::register`] adds or replaces a scheme (a private store, a test double).
pub struct Registry {
    builders: RwLock<BTreeMap<String, Arc<StoreBuilder>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("schemes", &self.schemes()).finish()
    }
}

/// The process-wide registry, with the built-in schemes.
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::with_builtins)
}

impl Registry {
    /// A registry without any scheme.
    pub fn empty() -> Registry {
        Registry { builders: RwLock::new(BTreeMap::new()) }
    }

    /// A registry with the built-in schemes (the module documentation lists them).
    pub fn with_builtins() -> Registry {
        let r = Registry::empty();
        for s in ["s3", "s3a"] {
            r.register(s, Arc::new(build_s3));
        }
        r.register("gs", Arc::new(build_gcs));
        for s in ["az", "azure", "abfs", "abfss", "adl"] {
            r.register(s, Arc::new(build_azure));
        }
        for s in ["http", "https"] {
            r.register(s, Arc::new(build_http));
        }
        r
    }

    /// Serves `scheme` (case-insensitive) with `builder`, replacing any earlier one.
    pub fn register(&self, scheme: &str, builder: Arc<StoreBuilder>) {
        if let Ok(mut b) = self.builders.write() {
            b.insert(scheme.to_ascii_lowercase(), builder);
        }
    }

    /// The schemes served, in order.
    pub fn schemes(&self) -> Vec<String> {
        self.builders.read().map(|b| b.keys().cloned().collect()).unwrap_or_default()
    }

    pub(crate) fn builder(&self, url: &RemoteUrl) -> Result<Arc<StoreBuilder>, StorageError> {
        let found = self.builders.read().ok().and_then(|b| b.get(url.scheme()).cloned());
        found.ok_or_else(|| StorageError::UnknownScheme {
            url: url.redacted(),
            scheme: url.scheme().to_owned(),
            known: self.schemes().join(", "),
        })
    }
}

/// `url` parsed, and the object path it names (after the bucket for cloud schemes, the whole path for
/// HTTP).
fn parse(url: &RemoteUrl) -> Result<(url::Url, ObjectPath), StorageError> {
    let invalid = |reason: String| StorageError::InvalidUrl { url: url.redacted(), reason };
    let parsed = url::Url::parse(url.as_given()).map_err(|e| invalid(e.to_string()))?;
    let path = match url.scheme() {
        "http" | "https" => parsed.path().to_owned(),
        _ => match object_store::ObjectStoreScheme::parse(&parsed) {
            Ok((_, path)) => path.to_string(),
            Err(e) => return Err(invalid(redact(&e.to_string(), &[]))),
        },
    };
    let root = ObjectPath::from_url_path(path.trim_matches('/')).map_err(|e| invalid(e.to_string()))?;
    Ok((parsed, root))
}

/// `humantime` text for a duration (`object_store` parses its timeouts so).
fn duration_text(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// The retry policy of `options`.
fn retry(options: &StorageOptions) -> object_store::RetryConfig {
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: options.initial_backoff,
            max_backoff: options.max_backoff,
            base: 2.0,
        },
        max_retries: options.max_retries,
        retry_timeout: options.retry_timeout,
    }
}

/// Applies `options.config` with `apply`, each key parsed as the store's key type `K`.
fn configure<B, K: FromStr>(
    url: &RemoteUrl,
    mut builder: B,
    options: &StorageOptions,
    client: impl Fn(ClientConfigKey) -> K,
    apply: impl Fn(B, K, String) -> B,
) -> Result<B, StorageError> {
    builder = apply(builder, client(ClientConfigKey::Timeout), duration_text(options.request_timeout));
    builder = apply(builder, client(ClientConfigKey::ConnectTimeout), duration_text(options.connect_timeout));
    for (key, value) in &options.config {
        let parsed = key.to_ascii_lowercase().parse::<K>().map_err(|_| StorageError::Option {
            url: url.redacted(),
            key: key.clone(),
            reason: "not a configuration key of this store".into(),
        })?;
        builder = apply(builder, parsed, value.clone());
    }
    Ok(builder)
}

/// `<scheme>://<bucket>` of a parsed cloud URL (without its user information, where credentials travel).
fn bucket_url(scheme: &str, parsed: &url::Url) -> String {
    format!("{scheme}://{}", parsed.host_str().unwrap_or_default())
}

fn config_error(url: &RemoteUrl, options: &StorageOptions, e: object_store::Error) -> StorageError {
    StorageError::Config { url: url.redacted(), message: redact(&e.to_string(), &options.secrets()) }
}

fn build_s3(url: &RemoteUrl, options: &StorageOptions) -> Result<BuiltStore, StorageError> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    let (parsed, root) = parse(url)?;
    let builder = AmazonS3Builder::from_env().with_url(bucket_url("s3", &parsed)).with_retry(retry(options));
    let builder = configure(url, builder, options, AmazonS3ConfigKey::Client, |b, k, v| b.with_config(k, v))?;
    let store = builder.build().map_err(|e| config_error(url, options, e))?;
    Ok(BuiltStore::with_multipart(store, root))
}

fn build_gcs(url: &RemoteUrl, options: &StorageOptions) -> Result<BuiltStore, StorageError> {
    use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
    let (parsed, root) = parse(url)?;
    let builder = GoogleCloudStorageBuilder::from_env().with_url(bucket_url("gs", &parsed)).with_retry(retry(options));
    let builder = configure(url, builder, options, GoogleConfigKey::Client, |b, k, v| b.with_config(k, v))?;
    let store = builder.build().map_err(|e| config_error(url, options, e))?;
    Ok(BuiltStore::with_multipart(store, root))
}

fn build_azure(url: &RemoteUrl, options: &StorageOptions) -> Result<BuiltStore, StorageError> {
    use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
    let (_, root) = parse(url)?;
    let builder = MicrosoftAzureBuilder::from_env().with_url(url.as_given()).with_retry(retry(options));
    let builder = configure(url, builder, options, AzureConfigKey::Client, |b, k, v| b.with_config(k, v))?;
    let store = builder.build().map_err(|e| config_error(url, options, e))?;
    Ok(BuiltStore::with_multipart(store, root))
}

fn build_http(url: &RemoteUrl, options: &StorageOptions) -> Result<BuiltStore, StorageError> {
    use object_store::http::HttpBuilder;
    let (parsed, root) = parse(url)?;
    let base = &parsed[..url::Position::BeforePath];
    let builder = HttpBuilder::new().with_url(base).with_retry(retry(options));
    let builder = configure(url, builder, options, |k| k, |b, k, v| b.with_config(k, v))?;
    let store = builder.build().map_err(|e| config_error(url, options, e))?;
    Ok(BuiltStore { store: Arc::new(store), multipart: None, root })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::super::Location;
    use super::*;

    fn url(s: &str) -> RemoteUrl {
        match Location::parse(s).unwrap() {
            Location::Remote(u) => u,
            Location::Local(_) => panic!(),
        }
    }

    #[test]
    fn schemes_and_prefixes() {
        let r = registry();
        assert!(r.schemes().contains(&"s3".to_owned()));
        assert!(matches!(
            r.open(&url("ftp://h/x"), &StorageOptions::default()),
            Err(StorageError::UnknownScheme { .. })
        ));
        let options = StorageOptions::default()
            .with("aws_region", "us-east-1")
            .with("aws_access_key_id", "AKIAEXAMPLE")
            .with("aws_secret_access_key", "wJalrXUtnFEMI");
        let store = r.open(&url("s3://bucket/runs/step%2010/"), &options).unwrap();
        assert_eq!(store.url_of("x"), "s3://bucket/runs/step%2010/x");
        let bad = StorageOptions::default().with("no_such_key", "v");
        let e = r.open(&url("s3://bucket/k"), &bad).unwrap_err();
        assert!(matches!(&e, StorageError::Option { key, .. } if key == "no_such_key"), "{e}");
        // HTTPS works (rustls with ring as its provider): a server that is no TLS server fails the handshake
        // as a connection error, after the retries.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for c in listener.incoming().flatten() {
                drop(c);
            }
        });
        let quick = StorageOptions::default()
            .with_max_retries(1)
            .with_backoff(Duration::from_millis(1), Duration::from_millis(2));
        let https = r.open(&url(&format!("https://127.0.0.1:{port}/m.pt")), &quick).unwrap();
        let e = https.head("").unwrap_err();
        assert!(matches!(e, StorageError::Connection { .. }), "{e:?}");
        let (_, root) = parse(&url("s3://bucket/runs/step%2010/a+b")).unwrap();
        assert_eq!(root.as_ref(), "runs/step 10/a+b");
    }
}
